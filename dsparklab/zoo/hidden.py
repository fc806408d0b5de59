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
from typing import Any

import torch

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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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

    Returns
    -------
    aux : torch.Tensor
        ``[B, T, len(layer_ids) * H]``, the layers concatenated in ``layer_ids`` order.
    last : torch.Tensor
        ``[B, T, H]``, the final decoder layer's output before the final norm.
    logits : torch.Tensor
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
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    aux = torch.cat([captured[i] for i in layer_ids], dim=-1)
    return aux, captured[num_layers], out.logits
