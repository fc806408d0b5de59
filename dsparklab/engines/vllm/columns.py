r"""The recorder's ``steps`` and ``positions`` rows, built as columns.

The recorder's flush thread turns staged slots into rows under the interpreter lock the
engine's thread needs between its torch calls, so what it does per row in Python, the
engine pays for (docs/vllm-plugin.md, "What it costs"). So a slot's drafts are kept as the
arrays they came in (:class:`DraftBlock`: the ids, the float fields' block, the flip), a
verified draft is one record (:class:`VerifiedDrafts`), a steps row one tuple
(:class:`StepRecords`), and a flush turn's records become one arrow table per table at
once: a few numpy and arrow calls per turn, not a dictionary per row.

For a draft of :math:`k` tokens :math:`d_0 \dots d_{k-1}` of which the verifier accepted
:math:`a` and then emitted token :math:`e`, position :math:`i`'s row has
``accepted`` :math:`= [i < a]` and ``target_token`` :math:`= d_i` for :math:`i < a`,
:math:`e` for :math:`i = a`, null for :math:`i > a` (the target's choice is unknown past
the first rejection). A tap field "not computed" (NaN, or the flip's
:data:`~dsparklab.engines.vllm.core.FLIP_UNSET`) is null.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dsparklab.engines.vllm.core import FLIP_UNSET, FLOAT_FIELDS
from dsparklab.engines.vllm.step_cost import StepCost
from dsparklab.store.schema import POSITIONS_SCHEMA, STEPS_SCHEMA


@dataclass(frozen=True)
class DraftBlock:
    """The drafts one engine step proposed for its batch rows, copied out of the host slot
    (which later steps reuse): ``tokens`` ``[R, k]`` target-vocabulary ids, ``floats``
    ``[len(FLOAT_FIELDS), R, k]`` and ``flip`` ``[R, k]`` the tap fields, "not computed"
    (NaN, :data:`~dsparklab.engines.vllm.core.FLIP_UNSET`) where a field was not staged."""

    tokens: np.ndarray
    floats: np.ndarray
    flip: np.ndarray

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray], num_reqs: int, k: int) -> DraftBlock:
        """The block of a slot's arrays (``draft_tokens``, the tap fields: a DSpark slot's
        float fields as its one ``floats`` block), first ``num_reqs`` rows, ``k`` positions."""
        shape = (num_reqs, k)
        if "floats" in arrays:  # one copy for every float field
            floats = arrays["floats"][:, :num_reqs, :k].copy()
        else:
            floats = np.full((len(FLOAT_FIELDS), *shape), np.nan, dtype=np.float32)
            for i, name in enumerate(FLOAT_FIELDS):
                if name in arrays:
                    floats[i] = arrays[name][:num_reqs, :k]
        flip = arrays.get("markov_flip")
        return cls(
            tokens=arrays["draft_tokens"][:num_reqs, :k].astype(np.int64),
            floats=floats,
            flip=(
                flip[:num_reqs, :k].copy()
                if flip is not None
                else np.full(shape, FLIP_UNSET, dtype=np.int8)
            ),
        )

    @property
    def width(self) -> int:
        return int(self.tokens.shape[1])


def tap_column(name: str, values: np.ndarray) -> pa.Array:
    """A tap field's values as its ``positions`` column: "not computed" (NaN, or the
    flip's -1) null, the flip a bool."""
    if name == "markov_flip":
        return pa.array(values != 0, mask=values == FLIP_UNSET)
    return pa.array(values, type=pa.float32(), mask=np.isnan(values))


class VerifiedDrafts:
    """Verified drafts waiting to be written, one record each (:meth:`add`), turned into
    ``positions`` rows all at once (:meth:`take_table`), in the order they were added."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._request_ids: list[str] = []
        self._steps: list[int] = []
        self._blocks: list[DraftBlock] = []
        self._rows: list[int] = []
        self._accepted: list[int] = []
        self._emitted: list[int] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self, request_id: str, step: int, block: DraftBlock, row: int, accepted: int, emitted: int
    ) -> None:
        """Request ``request_id``'s draft in batch row ``row`` of ``block``, verified at its
        step ``step``: ``accepted`` tokens accepted, then token ``emitted``."""
        self._request_ids.append(request_id)
        self._steps.append(step)
        self._blocks.append(block)
        self._rows.append(row)
        self._accepted.append(accepted)
        self._emitted.append(emitted)

    def take_table(self) -> pa.Table:
        """The ``positions`` rows of every draft added since the last call (then forgotten),
        one table in :data:`~dsparklab.store.schema.POSITIONS_SCHEMA`."""
        widths = np.array([block.width for block in self._blocks], dtype=np.int64)
        groups = [np.flatnonzero(widths == k) for k in np.unique(widths)]
        tables = [self._same_width(group) for group in groups]
        self._clear()
        if not tables:
            return POSITIONS_SCHEMA.empty_table()
        if len(tables) == 1:
            return tables[0]
        # drafts of several widths (vLLM's draft length per batch size): back in order
        order = np.argsort(np.concatenate([np.repeat(g, widths[g]) for g in groups]), kind="stable")
        return pa.concat_tables(tables).take(pa.array(order))

    def _same_width(self, drafts: np.ndarray) -> pa.Table:
        """The rows of the drafts numbered ``drafts``, all of one width."""
        blocks: dict[int, tuple[int, DraftBlock]] = {}  # id -> (first row in the stack, block)
        start = 0
        for index in drafts:
            block = self._blocks[index]
            if id(block) not in blocks:
                blocks[id(block)] = (start, block)
                start += len(block.tokens)
        stacked = [block for _, block in blocks.values()]
        rows = np.array(
            [blocks[id(self._blocks[i])][0] + self._rows[i] for i in drafts], dtype=np.int64
        )
        k = stacked[0].width
        position = np.arange(k, dtype=np.int32)
        accepted = np.array(self._accepted, dtype=np.int64)[drafts, None]
        emitted = np.array(self._emitted, dtype=np.int64)[drafts, None]
        tokens = np.concatenate([block.tokens for block in stacked])[rows]
        is_accepted = position < accepted
        target = np.where(is_accepted, tokens, emitted)
        request_ids = np.array(self._request_ids, dtype=object)[drafts]
        columns: dict[str, pa.Array] = {
            "request_id": pa.array(np.repeat(request_ids, k), type=pa.string()),
            "step": pa.array(np.repeat(np.array(self._steps, dtype=np.int32)[drafts], k)),
            "position": pa.array(np.tile(position, len(drafts))),
            "draft_token": pa.array(tokens.ravel()),
            "target_token": pa.array(target.ravel(), mask=(position > accepted).ravel()),
            "accepted": pa.array(is_accepted.ravel()),
        }
        floats = np.concatenate([block.floats for block in stacked], axis=1)[:, rows]
        for i, name in enumerate(FLOAT_FIELDS):
            columns[name] = tap_column(name, floats[i].ravel())
        flip = np.concatenate([block.flip for block in stacked])[rows]
        columns["markov_flip"] = tap_column("markov_flip", flip.ravel())
        return pa.Table.from_arrays(
            [columns[f.name] for f in POSITIONS_SCHEMA], schema=POSITIONS_SCHEMA
        )


# A steps record's values, in this order (the rest of the schema: the dataset, one per run,
# and ``emitted``, null: the front end cuts the output at max_tokens and stop tokens, out of
# the worker's sight, and the collector fills it from the response)
STEP_RECORD: tuple[str, ...] = (
    "request_id",
    "prompt_id",
    "step",
    "context_len",
    "num_drafted",
    "num_verified",
    "accepted_len",
    # the engine step that verified this block (docs/vllm-plugin.md, "Step costs"); other:
    # null where the runner does not mark its forward and sampler (V1: inside verify)
    "batch_size",
    "draft_time_s",
    "verify_time_s",
    "other_time_s",
)


class StepRecords:
    """``steps`` rows waiting to be written, a tuple each (:meth:`add`), turned into one
    table at once (:meth:`take_table`), in the order added."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self._records: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self._records)

    def add(
        self,
        request_id: str,
        prompt_id: str,
        step: int,
        context_len: int,
        drafted: int,
        verified: int,
        accepted: int,
        cost: StepCost,
    ) -> None:
        """Step ``step`` of request ``request_id``; its cost columns are the request's
        share of the engine step ``cost`` (:class:`StepCost`)."""
        self._records.append(
            (
                request_id,
                prompt_id,
                step,
                context_len,
                drafted,
                verified,
                accepted,
                cost.batch_size,
                cost.draft_share_s,
                cost.verify_share_s,
                cost.other_share_s,
            )
        )

    def take_table(self) -> pa.Table:
        """The rows added since the last call (then forgotten), in
        :data:`~dsparklab.store.schema.STEPS_SCHEMA`."""
        records, self._records = self._records, []
        count = len(records)
        values: dict[str, Any] = dict(zip(STEP_RECORD, zip(*records, strict=True), strict=False))
        values["dataset"] = [self.dataset] * count
        arrays = [
            pa.array(values[f.name], type=f.type) if f.name in values else pa.nulls(count, f.type)
            for f in STEPS_SCHEMA
        ]
        return pa.Table.from_arrays(arrays, schema=STEPS_SCHEMA)


__all__ = ["STEP_RECORD", "DraftBlock", "StepRecords", "VerifiedDrafts", "tap_column"]
