"""The drafters' training set and how it is cut into batches.

:class:`DraftData` holds sequences and the target's hidden states over them;
:func:`pack_batch` packs some of its rows into one speculators batch; :class:`BatchStream`
says which rows step ``k`` trains on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DraftData:
    """The drafters' training set: sequences and the target's hidden states over them."""

    input_ids: torch.Tensor | list[torch.Tensor]  # [N, T], or N ragged [T_i]
    aux: torch.Tensor | list[torch.Tensor]  # [N, T, len(layer_ids) * H]
    last: torch.Tensor | list[torch.Tensor]  # [N, T, H]
    layer_ids: tuple[int, ...]
    prefix_len: int
    # Per sequence, the first position whose token is a training target (chat answers
    # start after the prompt); None: every position.
    loss_start: list[int] | None = None


def pack_batch(
    data: DraftData, rows: Sequence[int], *, shift: bool, mask_head: int = 0, mask_tail: int = 0
) -> dict[str, torch.Tensor]:
    """Pack sequences into one [1, total] batch with document ids and per-doc positions.

    Hidden states stored in bf16 (the smol tier's) are widened to float32 here.
    ``shift`` applies speculators' Eagle3 ``shift_batch`` per sequence (token t+1 with
    hidden t, positions from 1). ``mask_head``/``mask_tail`` zero the loss mask on each
    document's first/last positions so no target or block crosses a document boundary.
    """
    ids, aux, last, docs, pos, mask = [], [], [], [], [], []
    for doc, row in enumerate(rows):
        x, h, y = data.input_ids[row], data.aux[row].float(), data.last[row].float()
        if shift:
            x, h, y = x[1:], h[:-1], y[1:]
            p = torch.arange(1, len(x) + 1)
        else:
            p = torch.arange(len(x))
        m = torch.ones(len(x), dtype=torch.long)
        # The last prompt token is the first anchor of an answer, hence the -1.
        head = max(mask_head, data.loss_start[row] - 1 if data.loss_start else 0)
        if head:
            m[:head] = 0
        if mask_tail:
            m[-mask_tail:] = 0
        ids.append(x)
        aux.append(h)
        last.append(y)
        docs.append(torch.full((len(x),), doc, dtype=torch.long))
        pos.append(p)
        mask.append(m)
    return {
        "input_ids": torch.cat(ids).unsqueeze(0),
        "hidden_states": torch.cat(aux).unsqueeze(0),
        "verifier_last_hidden_states": torch.cat(last).unsqueeze(0),
        "document_ids": torch.cat(docs).unsqueeze(0),
        "position_ids": torch.cat(pos).unsqueeze(0),
        "loss_mask": torch.cat(mask).unsqueeze(0),
    }


def select_layers(data: DraftData, wanted: Sequence[int]) -> DraftData:
    """The draft data restricted to some aux layers (in the order given)."""
    if tuple(wanted) == data.layer_ids:
        return data
    if not isinstance(data.aux, torch.Tensor):
        raise ValueError("layer selection needs padded [N, T, F] draft data, not ragged lists")
    hidden = data.aux.shape[-1] // len(data.layer_ids)
    chunks = [
        data.aux[..., data.layer_ids.index(i) * hidden : (data.layer_ids.index(i) + 1) * hidden]
        for i in wanted
    ]
    aux = torch.cat(chunks, dim=-1)
    return DraftData(data.input_ids, aux, data.last, tuple(wanted), data.prefix_len)


class BatchStream:
    """The rows of step ``k``: passes over the data, the first in data order, later ones
    in seeded permutations, ``per_step`` rows a step. A pure function of ``k``, so a
    resumed run draws the batches it would have drawn."""

    def __init__(self, data: DraftData, per_step: int, seed: int):
        self.num = len(data.input_ids)
        self.per_step = min(per_step, self.num)
        self.seed = seed
        starts = data.loss_start or [0] * self.num
        answer = [len(ids) - start for ids, start in zip(data.input_ids, starts, strict=True)]
        self._cum_answer = np.cumsum(answer)

    def rows(self, step: int) -> list[int]:
        first = step * self.per_step
        out = []
        for k in range(first, first + self.per_step):
            epoch, index = divmod(k, self.num)
            order = (
                np.arange(self.num)
                if epoch == 0
                else np.random.default_rng([self.seed, epoch]).permutation(self.num)
            )
            out.append(int(order[index]))
        return out

    def answer_tokens_seen(self, steps_done: int) -> int:
        """Distinct answer tokens in the rows of the first ``steps_done`` steps."""
        rows = min(steps_done * self.per_step, self.num)
        return int(self._cum_answer[rows - 1]) if rows else 0
