"""Target hidden states in the layout the drafters consume.

Convention (the one vLLM and ``speculators`` data generation use): auxiliary layer id
``i`` is the residual stream *entering* decoder layer ``i`` (``i = 0`` is the embedding
output), i.e. Hugging Face's ``hidden_states[i]``; the "last" hidden state is the output
of the final decoder layer *before* the final norm. A checkpoint's
``aux_hidden_state_layer_ids = [1, 2, 3]`` are vLLM DSpark ``target_layer_ids [0, 1, 2]``
(outputs of layers 0, 1, 2).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)


def _decoder(model: Any) -> Any:
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise TypeError(f"expected a causal LM with .model.layers and .model.norm, got {model!r}")
    return inner


@torch.no_grad()
def capture_hidden_states(
    model: Any,
    input_ids: torch.Tensor,  # [B, T]
    layer_ids: Sequence[int],
    *,
    attention_mask: torch.Tensor | None = None,  # [B, T]
    with_logits: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run the target once and return its auxiliary and last hidden states and logits.

    Parameters
    ----------
    model : transformers causal LM
        A Llama/Qwen-style model (``model.model.layers``, ``model.model.norm``).
    input_ids : torch.Tensor
        ``[B, T]`` token ids.
    layer_ids : sequence of int
        Auxiliary layer ids in ``[0, num_layers]`` (see the module docstring).
    attention_mask : torch.Tensor, optional
        ``[B, T]`` padding mask.
    with_logits : bool
        False runs the decoder alone (no LM head; about a fifth of a small model's
        cost) and returns None for the logits.

    Returns
    -------
    aux : torch.Tensor
        ``[B, T, len(layer_ids) * H]``, the layers concatenated in ``layer_ids`` order.
    last : torch.Tensor
        ``[B, T, H]``, the final decoder layer's output before the final norm.
    logits : torch.Tensor or None
        ``[B, T, V]``.
    """
    decoder = _decoder(model)
    num_layers = len(decoder.layers)
    if not layer_ids or min(layer_ids) < 0 or max(layer_ids) > num_layers:
        raise ValueError(f"layer_ids must lie in [0, {num_layers}], got {list(layer_ids)}")
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def pre_hook(index: int):
        def hook(_module: Any, args: tuple, kwargs: dict) -> None:
            captured[index] = args[0] if args else kwargs["hidden_states"]

        return hook

    def norm_hook(_module: Any, args: tuple) -> None:
        captured[num_layers] = args[0]

    try:
        for index, layer in enumerate(decoder.layers):
            handles.append(layer.register_forward_pre_hook(pre_hook(index), with_kwargs=True))
        handles.append(decoder.norm.register_forward_pre_hook(norm_hook))
        run = model if with_logits else decoder
        out = run(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    aux = torch.cat([captured[i] for i in layer_ids], dim=-1)
    return aux, captured[num_layers], out.logits if with_logits else None


# --- on-disk store: one set of memory-mapped arrays per chunk of sequences -------------


@dataclass(frozen=True)
class HiddenChunk:
    """Hidden states of a chunk of sequences, memory-mapped from ``<stem>.{aux,last,offsets}.npy``.

    bf16 values are stored as their uint16 bit patterns (numpy has no bfloat16); sequence
    ``k`` spans rows ``offsets[k]:offsets[k+1]``. Opened copy-on-write, so processes share
    the page cache and nothing writes back.
    """

    aux: np.ndarray  # [T_total, L * H] uint16 (bf16 bits)
    last: np.ndarray  # [T_total, H] uint16
    offsets: np.ndarray  # [N + 1] int64

    def sequence(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux, last)`` of sequence ``k`` as bf16 tensors viewing the mapped file."""
        a, b = int(self.offsets[k]), int(self.offsets[k + 1])
        return _bf16(self.aux[a:b]), _bf16(self.last[a:b])

    def __len__(self) -> int:
        return len(self.offsets) - 1


def _bf16(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array).view(torch.bfloat16)


def hidden_chunk_exists(stem: Path) -> bool:
    return all(Path(f"{stem}.{part}.npy").is_file() for part in ("aux", "last", "offsets"))


@torch.no_grad()
def write_hidden_chunk(
    model: Any, sequences: Sequence[Sequence[int]], layer_ids: Sequence[int], stem: Path
) -> HiddenChunk:
    """Capture the target's hidden states over each sequence (one at a time, no padding)
    and store them under ``stem``; the offsets file is written last, so a chunk without
    it is incomplete and is redone."""
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in sequences])
    hidden = model.config.hidden_size
    stem.parent.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for part, width in (("aux", len(layer_ids) * hidden), ("last", hidden)):
        tmp = Path(f"{stem}.{part}.tmp.npy")
        arrays[part] = (
            tmp,
            np.lib.format.open_memmap(tmp, "w+", np.uint16, (int(offsets[-1]), width)),
        )
    for k, ids in enumerate(tqdm(sequences, desc=f"hidden {stem.name}", unit="seq")):
        aux, last, _ = capture_hidden_states(
            model, torch.tensor([list(ids)]), layer_ids, with_logits=False
        )
        a, b = offsets[k], offsets[k + 1]
        arrays["aux"][1][a:b] = aux[0].to(torch.bfloat16).view(torch.uint16).numpy()
        arrays["last"][1][a:b] = last[0].to(torch.bfloat16).view(torch.uint16).numpy()
    for part, (tmp, array) in arrays.items():
        array.flush()
        del array
        tmp.replace(f"{stem}.{part}.npy")
    tmp_offsets = Path(f"{stem}.offsets.tmp.npy")
    np.save(tmp_offsets, offsets)
    tmp_offsets.replace(f"{stem}.offsets.npy")
    return open_hidden_chunk(stem)


def open_hidden_chunk(stem: Path) -> HiddenChunk:
    """The chunk stored under ``stem`` (see :func:`write_hidden_chunk`)."""
    return HiddenChunk(
        np.load(f"{stem}.aux.npy", mmap_mode="c"),
        np.load(f"{stem}.last.npy", mmap_mode="c"),
        np.load(f"{stem}.offsets.npy"),
    )
