"""Speculators-format drafter checkpoints that vLLM and the reference engine both load.

A new drafter starts from the target's embedding and LM head (:func:`new_drafter`);
:func:`save_drafter` writes it with the verifier path relative to the checkpoint and the
architecture name vLLM reads; :func:`rewrite_checkpoint` edits the saved tensors (drop the
target's shared ones, add a draft vocabulary).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsparklab.zoo.training.loop import count_params
from dsparklab.zoo.training.report import StageReport


@dataclass(frozen=True)
class VocabMapping:
    """A draft vocabulary: ``d2t`` offsets ``[V_draft]`` and ``t2d`` mask ``[V_target]``."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.d2t.shape[0])


def verifier_config(target_dir: Path) -> Any:
    """speculators' ``VerifierConfig`` of the target checkpoint."""
    from speculators.config import VerifierConfig

    return VerifierConfig.from_pretrained(str(target_dir.resolve()))


def draft_layer_kwargs(target_cfg: Any, num_layers: int) -> dict[str, Any]:
    """The draft decoder layers' transformers config: the target's shapes, ``num_layers``."""
    return {
        "vocab_size": target_cfg.vocab_size,
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": target_cfg.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": target_cfg.head_dim,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_parameters": dict(target_cfg.rope_parameters),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": target_cfg.bos_token_id,
        "eos_token_id": target_cfg.eos_token_id,
        "pad_token_id": target_cfg.pad_token_id,
    }


def new_drafter(
    model_class: Any, config: Any, seed: int, vocab: VocabMapping | None, report: StageReport
) -> Any:
    """A seeded speculators drafter with the target's embedding/LM head (and draft vocab)."""
    torch.manual_seed(seed)
    model = model_class(config)
    if vocab is not None:
        model.load_vocab_mappings(vocab.t2d, vocab.d2t)
    model.load_verifier_weights()
    model.float()
    report.params = count_params(model)
    report.trainable_params = count_params(model, trainable_only=True)
    return model


def save_drafter(model: Any, out: Path, target_dir: Path, architectures: list[str]) -> None:
    """save_pretrained with the verifier path written relative to the drafter dir.

    ``save_pretrained`` stamps the Python class name into ``architectures`` and copies
    speculators' config source (``config.py`` + ``auto_map``); the saved config gets the
    architecture name vLLM reads instead, and no copied source.
    """
    verifier = model.config.speculators_config.verifier
    absolute = verifier.name_or_path
    verifier.name_or_path = os.path.relpath(target_dir.resolve(), out.resolve())
    try:
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
    finally:
        verifier.name_or_path = absolute
    config_path = out / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["architectures"] = architectures
    config.pop("auto_map", None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "config.py").unlink(missing_ok=True)


def with_draft_vocabulary(model: Any, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Make a reduced-vocabulary checkpoint's tensors self-contained and bf16.

    vLLM cannot share the target's full lm_head with a draft-vocabulary drafter, so the
    sliced lm_head, ``d2t`` and ``t2d`` are written; float tensors are stored in bf16
    (loaders upcast).
    """
    tensors = dict(tensors)
    tensors.setdefault("lm_head.weight", model.lm_head.weight.detach().clone())
    tensors["d2t"] = model.d2t.detach().clone()
    tensors["t2d"] = model.t2d.detach().clone()
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}


def rewrite_checkpoint(
    path: Path, edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> None:
    """Replace a safetensors file by ``edit`` of its tensors, atomically."""
    from safetensors.torch import load_file, save_file

    tmp = path.with_suffix(".tmp")
    save_file(edit(load_file(path)), tmp, metadata={"format": "pt"})
    tmp.replace(path)
