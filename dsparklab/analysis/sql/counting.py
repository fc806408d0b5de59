"""The counting stage: counter tables counted by an SQL engine, from a store or from frames.

:func:`aggregate_store` is the one I/O entry point of the analysis layer. It selects runs
by their run.json (status and run-column filters), renders the metric's query
(:mod:`dsparklab.analysis.sql.queries`: one text, run as is by DuckDB and by Spark) and
returns its counter table. :func:`count_frames` runs the same texts by DuckDB over frames
in memory, so rows read with ``read_trace`` count exactly as the store they came from.
Finish either with the usual ``compute_*`` function (the bootstraps resample the per-request
rows of ``per_request=True``)::

    counts = aggregate_store("runs/", metric="acceptance", by=("method", "n"))
    heatmap = compute_acceptance_by_position(counts, by=("method", "n"), n_boot=0)

DuckDB (the default) runs in process and spills to disk past its memory limit; Spark
(``engine="spark"``, pyspark from the ``spark`` extra) runs wherever the active Spark
configuration points, from ``local[2]`` to a cluster (docs/howto-trace-a-fleet.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    NO_CONFIDENCE,
    UNIT_COLUMNS,
    as_columns,
    require_columns,
    require_values,
    run_key_text,
    with_run_ids,
)
from dsparklab.analysis.layouts import (
    ACCEPTANCE_COUNTERS,
    CALIBRATION_COUNTERS,
    DEFAULT_LEVELS,
    MATCH_COLUMNS,
    STEP_MATCH_COLUMNS,
    STEP_TIME_COUNTERS,
    match_columns,
)
from dsparklab.analysis.sql.engines import ENGINES, Engine, FramesEngine, open_engine
from dsparklab.analysis.sql.queries import (
    BIN_EDGES,
    COUNTERS,
    ROW_COLUMNS,
    SCORE_ROWS,
    UNVERIFIED_STEPS,
    render,
)
from dsparklab.errors import DSparkLabError, TraceSchemaError, UnknownMethodError
from dsparklab.store.catalog import Catalog, catalog_of
from dsparklab.store.location import Location
from dsparklab.store.schema import RUN_COLUMNS, STATUSES

METRICS = ("acceptance", "calibration", "step_times")
SOURCES = ("steps", "positions")
# Key columns of a calibration table after the group keys.
CALIBRATION_KEYS = ("score", "position", "bin", "bin_lo", "bin_hi", "level", "accepted")


def select_runs(
    root: Location | Path | str | Catalog,
    *,
    filters: Mapping[str, Any] | None = None,
    statuses: Iterable[str] = STATUSES,
) -> tuple[pd.DataFrame, bool]:
    """The runs below ``root`` (or of a catalog) whose status is in ``statuses`` and whose
    run columns match ``filters`` (``{column: value or list}``), one row each (``list_runs``
    columns), and whether that is every run there."""
    catalog = catalog_of(root)
    if catalog.runs.empty:
        return catalog.runs, True
    runs = catalog.with_status(statuses)
    runs = runs[catalog.matching(filters or {}, runs)]
    return runs.reset_index(drop=True), len(runs) == len(catalog.runs)


def _check(
    metric: str,
    source: str,
    by: tuple[str, ...],
    filters: Mapping[str, Any],
    scores: tuple[str, ...],
    engine: str,
) -> None:
    if metric not in METRICS:
        raise UnknownMethodError(f"unknown metric {metric!r}; valid metrics are {sorted(METRICS)}")
    if source not in SOURCES:
        raise UnknownMethodError(f"unknown source {source!r}; valid sources are {sorted(SOURCES)}")
    if engine not in ENGINES:
        raise UnknownMethodError(f"unknown engine {engine!r}; valid engines are {sorted(ENGINES)}")
    for name in scores:
        if name not in SCORE_ROWS:
            raise UnknownMethodError(
                f"unknown calibration score {name!r}; valid scores are {sorted(SCORE_ROWS)}"
            )
    for name in by:
        if name in BIN_EDGES:
            if metric != "acceptance" or source != "steps":
                raise DSparkLabError(
                    f"aggregate_store groups by {name!r} only for acceptance counted from "
                    "the steps (metric='acceptance', source='steps')"
                )
        elif name in STEP_MATCH_COLUMNS:
            if metric != "step_times":
                raise DSparkLabError(
                    f"aggregate_store groups by the step column {name!r} only for step "
                    "times (metric='step_times')"
                )
        elif name not in RUN_COLUMNS and name not in ROW_COLUMNS:
            raise DSparkLabError(
                f"aggregate_store cannot group by {name!r}; use run columns "
                f"{list(RUN_COLUMNS)}, {list(ROW_COLUMNS)} or the bins {list(BIN_EDGES)}, "
                "or read the rows with read_trace"
            )
    for name in filters:
        if name not in RUN_COLUMNS:
            raise DSparkLabError(
                f"aggregate_store filters runs only; {name!r} is not a run column "
                f"{list(RUN_COLUMNS)}"
            )


def metric_keys(
    metric: str,
    by: Iterable[str],
    *,
    per_request: bool = True,
    match: Iterable[str] = MATCH_COLUMNS,
) -> list[str]:
    """The key columns of ``metric``'s table: ``by`` [+ method, n, ``match`` for step
    times] [+ run_id, request_id with ``per_request``]."""
    keys = list(as_columns(by))
    if metric == "step_times":
        keys = list(dict.fromkeys([*keys, "method", "n", *as_columns(match)]))
    if per_request:
        keys += [c for c in UNIT_COLUMNS if c not in keys]
    return keys


def empty_counts(
    metric: str,
    by: str | Iterable[str] = ("run_id",),
    *,
    per_request: bool = True,
    match: Iterable[str] = MATCH_COLUMNS,
) -> pd.DataFrame:
    """``metric``'s counter table with no rows: what :func:`aggregate_store` returns for
    a selection without runs."""
    keys, counters = _layout(metric, metric_keys(metric, by, per_request=per_request, match=match))
    return pd.DataFrame(columns=[*keys, *counters])


def _layout(metric: str, keys: list[str]) -> tuple[list[str], list[str]]:
    """(sort keys, counter columns) of ``metric``'s table."""
    if metric == "acceptance":
        return [*keys, "position"], list(ACCEPTANCE_COUNTERS)
    if metric == "calibration":
        return [*keys, *CALIBRATION_KEYS], list(CALIBRATION_COUNTERS)
    return list(keys), list(STEP_TIME_COUNTERS)


def _typed(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The counter tables' dtypes, whichever engine counted (SQL results carry the
    engines' own)."""
    ints = {"position", "bin", *ACCEPTANCE_COUNTERS, "count", "n_steps", "n"}
    # NULL where context_len (the bins) or batch_size is
    bins = {name for name in (*BIN_EDGES, *STEP_MATCH_COLUMNS) if name in frame}
    frame = frame.astype({name: "Int64" for name in bins})
    floats = {"bin_lo", "bin_hi", "level", "sum_score", "sum_score_sq", "temperature"}
    floats |= set(STEP_TIME_COUNTERS) - {"n_steps"}
    out = {}
    for name in frame.columns:
        column = frame[name]
        if name in ints and not column.isna().any():
            out[name] = column.astype(np.int64)
        elif name in floats:
            out[name] = column.astype(np.float64)
        elif name == "accepted":
            out[name] = column.astype(bool)
        else:
            out[name] = column
    return pd.DataFrame(out)


def aggregate_store(
    root: Location | Path | str | Catalog,
    *,
    metric: str = "acceptance",
    by: str | Iterable[str] = ("run_id",),
    filters: Mapping[str, Any] | None = None,
    statuses: Iterable[str] = STATUSES,
    per_request: bool = True,
    source: str = "steps",
    scores: Iterable[str] = ("confidence", "prefix_confidence"),
    n_bins: int = 10,
    levels: int | None = DEFAULT_LEVELS,
    match: Iterable[str] = MATCH_COLUMNS,
    engine: str = "duckdb",
    threads: int | None = None,
    memory_limit: str | None = None,
) -> pd.DataFrame:
    """Counters of ``metric`` over every run below ``root``, counted by an SQL engine.

    Parameters
    ----------
    root
        A store (a local directory or ``s3://bucket/prefix``, either layout; Spark: the
        table layout) or one run, or the catalog of one (listed once by the caller).
    metric
        ``"acceptance"`` (per position: drafted, reached, accepted), ``"calibration"``
        (per score, position, bin, level and label: rows and score sums) or
        ``"step_times"`` (per method, n and baseline match key: steps, tokens and time
        sums, for speedup and attribution).
    by
        Run columns (run_id, method, n, dataset, ...) and ``request_id`` / ``prompt_id``;
        ``("dataset", "prompt_id")`` gives the per-prompt counts a regression diff compares.
        Step times also group by the steps' ``batch_size`` (for
        ``fitted_cost_table(by=["batch_size"])``, which pairs each size with the
        baseline's steps of that size across loads).
    filters
        ``{run column: value or list}``: runs that do not match are never read.
    statuses
        Run statuses to include.
    per_request
        Keep (run_id, request_id) in the keys, so bootstrap intervals can be drawn (the
        default, as for every counter; False sums over requests, a smaller table).
    source
        Acceptance only: ``"steps"`` counts from the steps table (one row per step, see
        the Notes), ``"positions"`` from the position rows, each joined to its step. Both
        give the same counters on a trace that passes ``dsparklab validate``.
    scores, n_bins, levels
        Calibration only: the scores (``confidence``, ``prefix_confidence``), the number
        of equal-width bins and the AUROC level grid (the same defaults: ``levels``
        a 1000-cell grid, AUROC ties within 0.001; None counts exact scores).
    match
        Step times only: the run columns pairing a method run with its baseline.
    engine
        ``"duckdb"`` (embedded) or ``"spark"`` (``SparkSession.builder.getOrCreate()``:
        master and settings from Spark's own configuration).
    threads, memory_limit
        DuckDB's worker threads (default: the CPU count) and memory limit (e.g. ``"3GB"``;
        default: DuckDB's, 80 % of RAM), past which it spills to disk; Spark sizes itself
        from its own configuration.

    Returns
    -------
    pandas.DataFrame
        The counter table, summed over runs that share the keys, sorted by them. Runs
        without the table's rows (target-only baselines for positions, runs imported as
        counters or totals) contribute nothing here; the acceptance functions count those
        from their counters.

    Notes
    -----
    Acceptance, per position :math:`i` (:math:`D, V, A` a step's drafted, verified and
    accepted counts): drafted :math:`\\#\\{D > i\\}`, reached :math:`R_i = \\#\\{A \\ge i
    \\wedge \\min(V, D) > i\\}`, accepted :math:`A_i = \\#\\{A > i\\}`; from positions, a row
    is reached when :math:`i \\le A` and :math:`i < V`. Calibration bins a score :math:`s`
    (:math:`c_i`, or :math:`\\prod_{j \\le i} c_j` multiplied left to right in float64) at
    :math:`\\min(\\lfloor s B \\rfloor, B - 1)` and counts rows, :math:`\\sum s` and
    :math:`\\sum s^2` per bin, level and label. Step times sum :math:`e_k`, :math:`d_k +
    u_k + o_k`, :math:`d_k` and :math:`u_k` per group.
    """
    by = as_columns(by)
    scores = tuple(scores)
    filters = dict(filters or {})
    _check(metric, source, by, filters, scores, engine)
    keys = metric_keys(metric, by, per_request=per_request, match=match)
    catalog = catalog_of(root)
    runs, every_run = select_runs(catalog, filters=filters, statuses=statuses)
    if runs.empty:
        return empty_counts(metric, by, per_request=per_request, match=match)
    n_positions = int(max(runs["n"].max(), 1))
    with open_engine(
        engine,
        catalog,
        runs,
        counter_tables(metric, source),
        every_run=every_run,
        statuses=statuses,
        threads=threads,
        memory_limit=memory_limit,
    ) as session:
        table = count_in(
            session,
            metric,
            keys,
            n_positions=n_positions,
            source=source,
            scores=scores,
            n_bins=n_bins,
            levels=levels,
        )
    if table is None:
        return empty_counts(metric, by, per_request=per_request, match=match)
    return table


def counter_tables(metric: str, source: str = "steps") -> tuple[str, ...]:
    """The relations ``metric``'s queries read (``source``: acceptance's rows)."""
    if metric == "acceptance":
        return COUNTERS["acceptance_steps" if source == "steps" else "acceptance"].tables
    return COUNTERS[metric].tables


def count_in(
    session: Engine,
    metric: str,
    keys: list[str],
    *,
    n_positions: int,
    source: str = "steps",
    scores: Iterable[str] = ("confidence", "prefix_confidence"),
    n_bins: int = 10,
    levels: int | None = DEFAULT_LEVELS,
) -> pd.DataFrame | None:
    """``metric``'s counter table over the relations ``session`` holds, keyed by ``keys``
    (:func:`metric_keys`), typed and sorted as the in-memory tables; None when no row
    counts."""
    # rows from positions: without adaptive verification, reached needs no steps join
    from_positions = metric == "calibration" or source == "positions"
    all_verified = from_positions and int(session.query(UNVERIFIED_STEPS)["n"].iloc[0]) == 0
    if metric == "acceptance":
        counter = "acceptance_steps" if source == "steps" else "acceptance"
        texts = [render(counter, keys=keys, n_positions=n_positions, all_verified=all_verified)]
    elif metric == "step_times":
        texts = [render("step_times", keys=keys)]
    else:  # one query per calibration score, stacked
        texts = [
            render(
                "calibration",
                keys=keys,
                n_positions=n_positions,
                score=name,
                n_bins=n_bins,
                levels=levels,
                all_verified=all_verified,
            )
            for name in scores
        ]
    pieces = [p for p in (session.query(text) for text in texts) if len(p)]
    if not pieces:
        return None
    sort_keys, counters = _layout(metric, keys)
    table = _typed(pd.concat(pieces, ignore_index=True), metric)
    table = table[[*sort_keys, *counters]]
    return table.sort_values(sort_keys, kind="stable", na_position="last").reset_index(drop=True)


# Columns each counter needs from a frame built in memory (a store's tables always hold them).
# Steps beside positions say which rows were verified (num_verified < num_drafted: adaptive
# verification) and how many were accepted.
FRAME_COLUMNS: dict[str, tuple[str, ...]] = {
    "positions": ("request_id", "step", "position", "accepted"),
    "steps": ("request_id", "step", "num_drafted", "num_verified", "accepted_len"),
    "acceptance_steps": ("request_id", "num_drafted", "num_verified", "accepted_len"),
    "step_times": ("request_id", "emitted", "verify_time_s"),
}


RUN_KEY_SEP = "\x1f"  # joins a run_id to the run columns that tell its parts apart


def split_runs(
    frames: Mapping[str, pd.DataFrame], names: Iterable[str]
) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """Rows of one ``run_id`` that disagree on a run column (runs of two roots sharing a
    run_id, a frame edited by hand) are the separate runs they are: each combination gets
    a run key of its own (``run_id`` + the disagreeing values), and the map back to the
    run_id the counts are reported under. Frames whose runs agree come back unchanged."""
    given = dict(frames)
    columns = [c for c in names if c != "run_id" and any(c in f for f in given.values())]
    seen = pd.concat(
        [f[["run_id", *[c for c in columns if c in f]]].drop_duplicates() for f in given.values()],
        ignore_index=True,
    )
    varying = [c for c in columns if (seen.groupby("run_id")[c].nunique() > 1).any()]
    if not varying:
        return given, {}
    for table, frame in given.items():
        missing = [c for c in varying if c not in frame]
        if missing:
            raise DSparkLabError(
                f"the {table} rows lack {missing[0]}, which tells apart the runs that share a "
                "run_id: give each run its own run_id"
            )
    split = dict(frames)
    back: dict[str, str] = {}
    for table, frame in given.items():
        key = (
            frame["run_id"].astype(str)
            + RUN_KEY_SEP
            + run_key_text(frame, varying, sep=RUN_KEY_SEP)
        )
        back.update(zip(key, frame["run_id"].astype(str), strict=True))
        split[table] = frame.assign(run_id=key)
    return split, back


def frame_runs(frames: Iterable[pd.DataFrame], columns: Iterable[str]) -> pd.DataFrame:
    """The ``runs`` relation of frames in memory (their runs told apart by
    :func:`split_runs`): one row per ``run_id`` with the value each of ``columns`` (the run
    columns counted by, and grouping columns of the frames' own) takes in the frames; the
    other run columns null."""
    names = ["run_id", *columns]
    parts = [f[[c for c in names if c in f.columns]].drop_duplicates() for f in frames]
    runs = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["run_id"])
    runs = runs.groupby("run_id", sort=True, dropna=False).first().reset_index()
    for name in RUN_COLUMNS:
        if name not in runs.columns:
            runs[name] = None
        elif name not in ("n", "temperature", "concurrency"):
            runs[name] = runs[name].map(lambda v: None if pd.isna(v) else str(v))
    return runs


def _widest(frames: Mapping[str, pd.DataFrame | None]) -> int:
    """P, the widest window the rows drafted: positions ``0..P-1`` are counted."""
    widths = [1]
    positions, steps = frames.get("positions"), frames.get("steps")
    if positions is not None and len(positions):
        widths.append(int(positions["position"].max()) + 1)
    if steps is not None and "num_drafted" in steps and steps["num_drafted"].notna().any():
        widths.append(int(steps["num_drafted"].max()))
    return max(widths)


def count_frames(
    metric: str = "acceptance",
    *,
    positions: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    per_request: bool = True,
    scores: Iterable[str] = ("confidence", "prefix_confidence"),
    n_bins: int = 10,
    levels: int | None = DEFAULT_LEVELS,
    match: Iterable[str] = MATCH_COLUMNS,
    threads: int | None = None,
) -> pd.DataFrame:
    """Counters of ``metric`` over frames in memory: :func:`aggregate_store`'s query texts,
    run by DuckDB over the frames instead of a store.

    Parameters
    ----------
    metric
        ``"acceptance"``, ``"calibration"`` or ``"step_times"``, as in
        :func:`aggregate_store`.
    positions, steps
        Rows of the positions and steps tables (``read_trace``); a frame without
        ``run_id`` is one run, and its run columns (method, n, dataset, ...) are read off
        its rows. Acceptance is counted from ``positions`` when given (``steps`` then adds
        ``prompt_id`` and adaptive verification), else from ``steps``; calibration needs
        ``positions``, step times ``steps``.
    by, per_request, scores, n_bins, levels, match
        As in :func:`aggregate_store`.

    Returns
    -------
    pandas.DataFrame
        The counter table :func:`aggregate_store` returns for a store holding these rows.
        Its formulas are :func:`aggregate_store`'s.
    """
    by = as_columns(by)
    scores = tuple(scores)
    source = "positions" if positions is not None else "steps"
    counter = "acceptance_steps" if metric == "acceptance" and source == "steps" else metric
    # a grouping column the store does not know (a run set's label...) is one value per run
    known = (*RUN_COLUMNS, *ROW_COLUMNS, *BIN_EDGES, *STEP_MATCH_COLUMNS)
    extra = [name for name in by if name not in known]
    _check(metric, source, tuple(k for k in by if k not in extra), {}, scores, "duckdb")
    tables = [t for t in counter_tables(metric, source) if t != "runs"]
    rows = {"positions": positions, "steps": steps}
    present = [t for t in tables if rows[t] is not None]
    frames = dict(zip(present, with_run_ids(*(rows[t] for t in present)), strict=True))
    if not frames:
        raise DSparkLabError(f"counting {metric} needs the {' and '.join(tables)} rows")
    if metric == "step_times":
        match = match_columns(next(iter(frames.values())), match)
    keys = metric_keys(metric, by, per_request=per_request, match=match)
    # only the run columns counted by matter: the runs relation holds those (others null)
    run_keys = [k for k in keys if (k in RUN_COLUMNS and k != "run_id") or k in extra]
    frames, run_ids = split_runs(frames, run_keys)
    given = list(frames.values())
    for name in by:
        if (name in RUN_COLUMNS or name in extra) and not any(name in f for f in given):
            require_columns(given[0], [name], what=f"counting {metric} by {name}")
    if metric == "calibration":
        require_values(given[0], "confidence", what="calibration", why=NO_CONFIDENCE)
    from_steps = [k for k in keys if k in ("prompt_id", *STEP_MATCH_COLUMNS)]
    from_steps += ["context_len"] if any(k in BIN_EDGES for k in keys) else []
    if from_steps and "steps" not in frames:
        raise TraceSchemaError(
            f"counting {metric} by {from_steps} needs the steps table: pass steps= "
            "(read it with dsparklab.store.read_trace)"
        )
    for name, frame in frames.items():
        wanted = FRAME_COLUMNS[counter if name == "steps" and counter in FRAME_COLUMNS else name]
        step_keys = from_steps if name == "steps" else []
        require_columns(frame, [*wanted, *step_keys], what=f"counting {metric}")
    relations = {t: frames.get(t) for t in tables}
    runs = frame_runs(given, run_keys)
    with FramesEngine(runs, relations, extra=extra, threads=threads) as session:
        table = count_in(
            session,
            metric,
            keys,
            n_positions=_widest(relations),
            source=source,
            scores=scores,
            n_bins=n_bins,
            levels=levels,
        )
    if table is not None and run_ids and "run_id" in table:
        table["run_id"] = table["run_id"].map(run_ids)  # each run's parts under its run_id
    if table is None:
        return empty_counts(metric, by, per_request=per_request, match=match)
    return table
