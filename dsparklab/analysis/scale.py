"""Counters straight from a trace store on disk, for stores too big for a DataFrame.

:func:`aggregate_store` is the one I/O entry point of the analysis layer: it reads only
the columns a metric needs, run by run, with pyarrow (request ids stay dictionary-coded,
never materialised as Python strings), computes the counters with the same numpy kernels
as the in-memory path, and returns the same counter table that :func:`count_acceptance` /
:func:`count_calibration` return. Acceptance is counted from the steps table by default
(:func:`count_acceptance_from_steps`: one row per step, no (request, step) join);
calibration needs the position rows and each row's step. Finish with the usual
``compute_*`` function::

    counts = aggregate_store("runs/", metric="acceptance", by=("method", "n"))
    heatmap = compute_acceptance_by_position(counts, by=("method", "n"), n_boot=0)

Peak memory is about 40 bytes per position row of the largest run being processed (a few
runs at a time), plus that run's steps when grouping by prompt or when it verified
adaptively, whatever the store's size.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dsparklab.analysis._frames import UNIT_COLUMNS, as_columns
from dsparklab.analysis._kernels import (
    lookup_rows,
    prefix_product,
    reached_mask,
    step_codes,
)
from dsparklab.analysis.acceptance import (
    ACCEPTANCE_COUNTERS,
    acceptance_cells,
    step_acceptance_cells,
)
from dsparklab.analysis.calibration import CALIBRATION_COUNTERS, score_cells
from dsparklab.errors import DSparkLabError, UnknownMethodError
from dsparklab.store.location import Location
from dsparklab.store.reader import find_runs, read_parts, read_run_json, run_columns
from dsparklab.store.schema import RUN_COLUMNS, STATUSES

# Row-level grouping columns the store path supports besides the run columns.
ROW_COLUMNS = ("request_id", "prompt_id")
METRIC_COLUMNS = {
    "acceptance": ("request_id", "step", "position", "accepted"),
    "calibration": ("request_id", "step", "position", "accepted", "confidence"),
}


class _Codes:
    """Integer codes ``[N]`` of one key column, with the values they stand for."""

    def __init__(self, codes: np.ndarray, values: np.ndarray) -> None:
        self.codes = codes
        self.values = values


def _dictionary_codes(column: pa.ChunkedArray) -> _Codes:
    """Codes of a dictionary-read string column (one dictionary across chunks)."""
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    chunks = [c for c in column.chunks if len(c)]
    if not chunks:
        return _Codes(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))
    table = pa.table({"c": pa.chunked_array(chunks, type=column.type)}).unify_dictionaries()
    chunks = table.column("c").chunks
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks])
    return _Codes(codes.astype(np.int64), np.asarray(chunks[0].dictionary.to_pylist(), object))


def _numpy(table: pa.Table, name: str, dtype: Any) -> np.ndarray:
    return table.column(name).to_numpy().astype(dtype, copy=False)


class _RunRows:
    """The per-row quantities of one run that every metric needs."""

    def __init__(self, run_dir: Location, columns: tuple[str, ...], want_prompt: bool) -> None:
        positions = read_parts(run_dir, "positions", columns, read_dictionary=["request_id"])
        self.n_rows = positions.num_rows
        self.request = _dictionary_codes(positions.column("request_id"))
        self.step = positions.column("step").to_numpy()  # int32, zero-copy when one chunk
        self.position = positions.column("position").to_numpy()
        self.accepted = _numpy(positions, "accepted", bool)
        self.confidence = (
            positions.column("confidence").to_numpy().astype(np.float64)
            if "confidence" in columns
            else None
        )
        del positions
        self.step_code, self.n_steps = step_codes(self.request.codes, self.step)
        self.limit: np.ndarray | None = None
        self.prompt: _Codes | None = None
        self.reached = np.zeros(0, dtype=bool)
        if self.n_rows == 0:  # e.g. a target-only baseline run
            return
        self.limit, self.prompt = self._from_steps(run_dir, want_prompt)
        self.reached, _ = reached_mask(
            self.step_code, self.n_steps, self.position, self.accepted, self.limit
        )

    def _from_steps(
        self, run_dir: Location, want_prompt: bool
    ) -> tuple[np.ndarray | None, _Codes | None]:
        """Verified limit per row (only for adaptive runs) and prompt codes (if wanted)."""
        counts = read_parts(run_dir, "steps", ["num_drafted", "num_verified"])
        adaptive = counts.num_rows > 0 and bool(
            pc.any(pc.less(counts.column("num_verified"), counts.column("num_drafted"))).as_py()
        )
        if not adaptive and not want_prompt:
            return None, None
        columns = ["request_id", "step", "num_verified", *(["prompt_id"] if want_prompt else [])]
        steps = read_parts(run_dir, "steps", columns, read_dictionary=["request_id", "prompt_id"])
        s_request = _dictionary_codes(steps.column("request_id"))
        # positions' request codes in the steps' dictionary
        mapping = pc.index_in(
            pa.array(self.request.values, pa.string()),
            value_set=pa.array(s_request.values, pa.string()),
        )
        mapping = np.asarray(mapping.to_numpy(zero_copy_only=False), dtype=np.float64)
        mapping = np.nan_to_num(mapping, nan=-1).astype(np.int64)
        s_step = _numpy(steps, "step", np.int64)
        width = int(max(s_step.max(initial=0), self.step.max(initial=0))) + 1
        row = lookup_rows(
            s_request.codes * width + s_step,
            np.where(
                mapping[self.request.codes] >= 0,
                mapping[self.request.codes] * width + self.step,
                -1,
            ),
        )
        found = row >= 0
        limit = None
        if adaptive:
            verified = _numpy(steps, "num_verified", np.float64)
            limit = np.where(found, verified[np.maximum(row, 0)], np.inf)
        prompt = None
        if want_prompt:
            p = _dictionary_codes(steps.column("prompt_id"))
            values = np.append(p.values, np.array([None], dtype=object))  # last: no steps row
            prompt = _Codes(np.where(found, p.codes[np.maximum(row, 0)], len(p.values)), values)
        return limit, prompt

    def key(self, name: str) -> _Codes:
        if name == "request_id":
            return self.request
        if name == "prompt_id" and self.prompt is not None:
            return self.prompt
        raise DSparkLabError(f"no row-level key {name!r}")


def _decoded(keys: list[str], rows: _RunRows, cells: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {name: rows.key(name).values[code] for name, code in zip(keys, cells, strict=False)}


def _acceptance(rows: _RunRows, row_keys: list[str], spec: Mapping[str, Any]) -> list[dict]:
    keys = [rows.key(k) for k in row_keys]
    n_pos = int(rows.position.max()) + 1 if rows.n_rows else 1
    cells, columns = acceptance_cells(
        [k.codes for k in keys] + [rows.position],
        [len(k.values) for k in keys] + [n_pos],
        rows.reached,
        rows.accepted,
    )
    return [{**_decoded(row_keys, rows, cells), "position": cells[-1], **columns}]


def _acceptance_from_steps(run_dir: Location, row_keys: list[str]) -> list[dict]:
    """Acceptance counters of one run from its steps table (see count_acceptance_from_steps)."""
    columns = ["num_drafted", "num_verified", "accepted_len", *row_keys]
    steps = read_parts(run_dir, "steps", columns, read_dictionary=row_keys)
    if steps.num_rows == 0:
        return []
    keys = [_dictionary_codes(steps.column(k)) for k in row_keys]
    cells, counters = step_acceptance_cells(
        [k.codes for k in keys],
        [len(k.values) for k in keys],
        *(steps.column(c).to_numpy() for c in ("num_drafted", "num_verified", "accepted_len")),
    )
    decoded = {name: k.values[c] for name, k, c in zip(row_keys, keys, cells, strict=False)}
    return [{**decoded, "position": cells[-1], **counters}]


def _confidence(rows: _RunRows) -> np.ndarray:
    if rows.confidence is None:
        raise DSparkLabError("the confidence column was not read for this metric")
    return rows.confidence


def _confidence_score(rows: _RunRows) -> tuple[np.ndarray, np.ndarray]:
    score = _confidence(rows)
    return score, rows.reached & ~np.isnan(score)


def _prefix_score(rows: _RunRows) -> tuple[np.ndarray, np.ndarray]:
    score = prefix_product(rows.step_code, rows.n_steps, rows.position, _confidence(rows))
    keep = ~np.isnan(score)
    if rows.limit is not None:
        keep &= rows.position < rows.limit
    return score, keep


# score name -> (score [N], rows kept [N]) on the store path (see calibration.SCORES)
STORE_SCORES: dict[str, Callable[[_RunRows], tuple[np.ndarray, np.ndarray]]] = {
    "confidence": _confidence_score,
    "prefix_confidence": _prefix_score,
}


def _calibration(rows: _RunRows, row_keys: list[str], spec: Mapping[str, Any]) -> list[dict]:
    out = []
    keys = [rows.key(k) for k in row_keys]
    n_pos = int(rows.position.max()) + 1 if rows.n_rows else 1
    for name in spec["scores"]:
        score, keep = STORE_SCORES[name](rows)
        cells, columns = score_cells(
            [k.codes[keep] for k in keys] + [rows.position[keep]],
            [len(k.values) for k in keys] + [n_pos],
            score[keep],
            rows.accepted[keep],
            spec["n_bins"],
            spec["levels"],
        )
        out.append(
            {**_decoded(row_keys, rows, cells), "score": name, "position": cells[-1], **columns}
        )
    return out


# metric -> per-run counter function
METRICS: dict[str, Callable[[_RunRows, list[str], Mapping[str, Any]], list[dict]]] = {
    "acceptance": _acceptance,
    "calibration": _calibration,
}


def _matches(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, (list, tuple, set, frozenset)):
        return value in wanted
    return bool(value == wanted)


def aggregate_store(
    root: Location | Path | str,
    *,
    metric: str = "acceptance",
    by: str | Iterable[str] = ("run_id",),
    filters: Mapping[str, Any] | None = None,
    statuses: Iterable[str] = STATUSES,
    per_request: bool = False,
    source: str = "steps",
    scores: Iterable[str] = ("confidence", "prefix_confidence"),
    n_bins: int = 10,
    levels: int | None = 1000,
    threads: int | None = None,
) -> pd.DataFrame:
    """Counters of ``metric`` over every run below ``root``, grouped without loading rows.

    Parameters
    ----------
    root
        A run directory or a directory of runs.
    metric
        ``"acceptance"`` (the table of :func:`count_acceptance`) or ``"calibration"``
        (that of :func:`count_calibration`).
    by
        Run columns (run_id, method, n, dataset, ...) and ``request_id`` / ``prompt_id``.
    filters
        ``{run column: value or list}``: runs that do not match are never opened.
    statuses
        Run statuses to include.
    per_request
        Keep (run_id, request_id) in the keys, so bootstrap intervals can be drawn.
    source
        Acceptance only: ``"steps"`` counts from the steps table (one row per step, see
        :func:`count_acceptance_from_steps`), ``"positions"`` from the position rows with
        the per-row kernel of :func:`count_acceptance`. Both give the same counters on a
        trace that passes ``dsparklab validate``.
    scores, n_bins, levels
        Calibration only; as in :func:`count_calibration`. ``levels`` defaults to a
        1000-cell grid here (AUROC ties within 0.001), None counts exact scores.
    threads
        Runs processed concurrently (default: the CPU count, at most 4).

    Returns
    -------
    pandas.DataFrame
        The counter table, summed over runs that share the ``by`` values.
    """
    if source not in ("steps", "positions"):
        raise UnknownMethodError(
            f"unknown source {source!r}; valid sources are ['positions', 'steps']"
        )
    if metric not in METRICS:
        raise UnknownMethodError(f"unknown metric {metric!r}; valid metrics are {sorted(METRICS)}")
    by = as_columns(by)
    scores = tuple(scores)
    for name in scores:
        if name not in STORE_SCORES:
            raise UnknownMethodError(
                f"unknown calibration score {name!r}; valid scores are {sorted(STORE_SCORES)}"
            )
    for name in by:
        if name not in RUN_COLUMNS and name not in ROW_COLUMNS:
            raise DSparkLabError(
                f"aggregate_store cannot group by {name!r}; use run columns "
                f"{list(RUN_COLUMNS)} or {list(ROW_COLUMNS)}, or read the rows with read_trace"
            )
    filters = dict(filters or {})
    for name in filters:
        if name not in RUN_COLUMNS:
            raise DSparkLabError(
                f"aggregate_store filters runs only; {name!r} is not a run column "
                f"{list(RUN_COLUMNS)}"
            )
    keys = list(by)
    if per_request:
        keys += [c for c in UNIT_COLUMNS if c not in keys]
    row_keys = [k for k in keys if k in ROW_COLUMNS]
    spec = {"scores": scores, "n_bins": n_bins, "levels": levels}
    columns = METRIC_COLUMNS[metric]
    statuses = set(statuses)

    jobs = []
    for run_dir in find_runs(root):
        meta = read_run_json(run_dir)
        constants = run_columns(meta)
        if meta["status"] in statuses and all(
            _matches(constants[k], v) for k, v in filters.items()
        ):
            jobs.append((run_dir, constants))

    def one(job: tuple[Location, dict[str, Any]]) -> list[dict[str, Any]]:
        run_dir, constants = job
        if metric == "acceptance" and source == "steps":
            parts = _acceptance_from_steps(run_dir, row_keys)
        else:
            rows = _RunRows(run_dir, columns, "prompt_id" in row_keys)
            parts = METRICS[metric](rows, row_keys, spec) if rows.n_rows else []
        run_keys = {k: constants[k] for k in keys if k not in ROW_COLUMNS}
        return [{**part, **run_keys} for part in parts]

    workers = threads or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pieces = [p for result in pool.map(one, jobs) for p in result]
    if metric == "acceptance":
        group = [*keys, "position"]
        counters = list(ACCEPTANCE_COUNTERS)
    else:
        group = [*keys, "score", "position", "bin", "bin_lo", "bin_hi", "level", "accepted"]
        counters = list(CALIBRATION_COUNTERS)
    if not pieces:
        return pd.DataFrame(columns=[*group, *counters])
    merged = _stack(pieces, [*group, *counters])
    return merged.groupby(group, sort=True, dropna=False)[counters].sum().reset_index()


def _stack(pieces: list[dict[str, Any]], names: list[str]) -> pd.DataFrame:
    """One frame from per-run pieces: arrays (one length per piece) or per-piece scalars."""
    lengths = [len(piece["position"]) for piece in pieces]
    data = {}
    for name in names:
        values = [piece[name] for piece in pieces]
        if isinstance(values[0], np.ndarray):
            data[name] = np.concatenate(values)
        else:  # a run-level constant: repeat it over the piece's cells
            data[name] = pd.Series(values).repeat(lengths).to_numpy()
    return pd.DataFrame(data)
