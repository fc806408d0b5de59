"""The runs a notebook reads: where they are, which are selected, and their tables.

- :func:`resolve_runs`, :func:`load_runs`, :func:`load_any_runs` (runs of any granularity:
  imported and live ones too) find the inputs: an empty ``RUNS`` parameter means
  ``$DSPARKLAB_RUNS`` (set by ``dsparklab lab`` and ``dsparklab report``), else
  ``runs/demo``; the shipped traces are ``$DSPARKLAB_SHIPPED``, else ``data/traces``.
  Relative paths are taken from the working directory, never from where the package is
  installed. Complete runs are read unless asked; the others are named (``left_out``).
- :func:`count_runs` (``Runs.acceptance_counts``, ``Runs.step_time_counts``) counts the
  selected runs with DuckDB over every request they hold, for the headline numbers; the
  frames ``load_runs`` returns hold a sample of prompts past :func:`max_rows`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsparklab.errors import (
    ConfigError,
    MissingInputError,
    TraceSchemaError,
)
from dsparklab.store.catalog import Catalog
from dsparklab.store.location import S3_SCHEME, Location

logger = logging.getLogger(__name__)

RUNS_ENV = "DSPARKLAB_RUNS"
SHIPPED_ENV = "DSPARKLAB_SHIPPED"
DEFAULT_RUNS = Path("runs/demo")
SHIPPED_TRACES = Path("data/traces")
"""Traces committed with the repository (``data/traces/smol``: the smol tier's runs), from
the working directory; ``$DSPARKLAB_SHIPPED`` names them elsewhere."""
BASELINE_METHOD = "none"


# -- inputs -------------------------------------------------------------------------
def resolve_runs(runs: str | Path | Location = "") -> Location:
    """The runs: ``runs`` if given, else ``$DSPARKLAB_RUNS``, else ``runs/demo``; a directory
    or ``s3://bucket/prefix``.

    A relative path is taken from the working directory (``dsparklab lab`` and
    ``dsparklab report`` hand the notebooks absolute paths).
    """
    from dsparklab.store import find_runs

    text = str(runs) or os.environ.get(RUNS_ENV, "")
    if text.startswith(S3_SCHEME):
        location = Location.of(text)
        find_runs(location)  # says in one line when the bucket holds none (or refuses)
        return location
    path = Path(text) if text else DEFAULT_RUNS
    if not path.exists():
        raise TraceSchemaError(
            f"no runs at {path}: pass RUNS (a directory of run directories), set "
            f"${RUNS_ENV}, or make the demo runs with `make demo`",
            path=path,
        )
    return Location.of(path.resolve())


def shipped_traces() -> Path | None:
    """The shipped traces: ``$DSPARKLAB_SHIPPED`` when set (empty: none), else
    :data:`SHIPPED_TRACES` when that directory exists; None when there are none."""
    text = os.environ.get(SHIPPED_ENV)
    if text is not None:
        if not text:
            return None
        path = Path(text)
        if not path.is_dir():
            raise TraceSchemaError(
                f"no shipped traces at {path} (${SHIPPED_ENV}); unset it or name a directory "
                "of runs",
                path=path,
            )
        return path.resolve()
    return SHIPPED_TRACES.resolve() if SHIPPED_TRACES.is_dir() else None


RunsInput = str | Path | Location | Catalog


def open_catalog(runs: RunsInput, *, shipped: bool = False) -> Catalog:
    """The catalog of ``runs`` resolved (:func:`resolve_runs`), then of the shipped traces
    when ``shipped`` (and not already in); a catalog passed in is used as it is."""
    if isinstance(runs, Catalog):
        return runs
    roots = [resolve_runs(runs)]
    traces = shipped_traces() if shipped else None
    if traces is not None and not within(roots[0], traces):
        roots.append(Location.of(traces))
    return Catalog.of(*roots)


def within(root: Location, directory: Path) -> bool:
    """Whether ``root`` is ``directory`` or below it (an object store never is)."""
    return root.is_local and Path(root.path).is_relative_to(directory)


@dataclass(frozen=True)
class Runs:
    """The tables a notebook works on: positions of the method runs, steps with baselines.

    ``dataset`` holds the dataset name, or ``<tier>/<dataset>`` when the runs span
    several zoo tiers (see :func:`load_runs`); ``raw_dataset`` always the plain name.
    """

    catalog: Catalog  # every run found (selected or not), each run.json read once
    positions: pd.DataFrame
    steps: pd.DataFrame
    runs: pd.DataFrame
    # runs of the selection left out for their status (list_runs columns): named, not read
    left_out: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def root(self) -> Location:
        """The runs' root (the shipped traces, when read, come after it in the catalog)."""
        return self.catalog.roots[0]

    @property
    def rows_note(self) -> str:
        """Which requests the token-level tables (``positions``, ``steps``) hold, in one
        line; empty when they hold every request of every run. Counted numbers
        (:meth:`acceptance_counts`, :meth:`step_time_counts`) always take every request."""
        method_runs = self.runs[self.runs["method"] != BASELINE_METHOD]
        share = method_runs["sample"].astype(float)
        if method_runs.empty or (share >= 1.0).all():
            return ""
        low, high = float(share.min()), float(share.max())
        shares = f"{low:.0%}" if f"{low:.0%}" == f"{high:.0%}" else f"{low:.0%} to {high:.0%}"
        return (
            f"The rows below hold {shares} of each run's requests (the same prompts in every "
            f"run; recorded as a sample, or read within the row budget ${MAX_ROWS_ENV}); "
            "counted sections use every request recorded."
        )

    def dataset_labels(self, datasets: Sequence[str] = ()) -> list[str]:
        """The ``dataset`` labels present for these plain dataset names (empty: all), in
        tier order (largest model first)."""
        table = self.runs
        if datasets:
            table = table[table["raw_dataset"].isin(list(datasets))]
        ordered = table.sort_values(["tier", "raw_dataset"], key=_tier_order)
        return list(dict.fromkeys(ordered["dataset"]))

    def only_datasets(self, datasets: Collection[str]) -> Runs:
        """These runs restricted to the ``dataset`` labels given."""
        wanted = list(datasets)
        return Runs(
            catalog=self.catalog,
            positions=self.positions[self.positions["dataset"].isin(wanted)],
            steps=self.steps[self.steps["dataset"].isin(wanted)],
            runs=self.runs[self.runs["dataset"].isin(wanted)].reset_index(drop=True),
            left_out=self.left_out,
        )

    def acceptance_counts(self, *, by: Sequence[str] = ()) -> pd.DataFrame:
        """Per-request acceptance counters of the method runs over every request they
        hold, sampled or not (:func:`count_runs`): what the acceptance functions take in
        place of ``positions``. ``by``: a bin of the step's context or output depth
        (``context_bin``, ``depth_bin``) kept among the keys."""
        method_runs = self.runs[self.runs["method"] != BASELINE_METHOD]
        return count_runs(self.catalog, method_runs, "acceptance", by=by)

    def acceptance_by_bin(
        self, column: str, *, n_boot: int = 1000
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Acceptance by position and the acceptance length per bin of ``column``
        (``depth_bin`` or ``context_bin``), method, window n and dataset, with bootstrap
        intervals over requests, counted over every request (:meth:`acceptance_counts`)."""
        from dsparklab.analysis import compute_acceptance_by_position, compute_acceptance_length

        counts = self.acceptance_counts(by=(column,))
        keys = ("method", "n", "dataset", column)
        by_position = compute_acceptance_by_position(counts, by=keys, n_boot=n_boot)
        return by_position, compute_acceptance_length(counts, by=keys, n_boot=n_boot)

    def calibration_counts(self, *, by: Sequence[str] = ()) -> pd.DataFrame:
        """Calibration counters of the method runs per run over every request they hold
        (:func:`count_runs`): what the calibration functions take in place of
        ``positions``. Summed over requests: calibration draws no interval over them."""
        method_runs = self.runs[self.runs["method"] != BASELINE_METHOD]
        counts = count_runs(self.catalog, method_runs, "calibration", by=by, per_request=False)
        if counts.empty:  # no method run recorded a confidence: a section says so
            methods = ", ".join(sorted(map(str, method_runs["method"].unique()))) or "no method"
            raise MissingInputError(
                f"calibration needs confidence, which the runs of {methods} lack "
                "(only DSpark drafters with a confidence head record one)"
            )
        return counts

    def step_time_counts(self, *, by: Sequence[str] = ()) -> pd.DataFrame:
        """Per-request step-time counters of every run, baselines included
        (:func:`count_runs`): what the speedup functions take in place of ``steps``."""
        return count_runs(self.catalog, self.runs, "step_times", by=by)

    @property
    def largest_n(self) -> int:
        """The largest window among the method runs."""
        return int(self.positions["n"].max())

    def summary(self) -> pd.DataFrame:
        """The runs in one line per (tier, engine, dataset, method): windows and status;
        the runs left out for their status on lines of their own."""
        left_out = self.left_out.assign(status=lambda t: t["status"] + " (left out)")
        table = pd.concat([self.runs, left_out], ignore_index=True)
        table = table.assign(n=table["n"].astype(int))
        return (
            table.groupby(["tier", "engine", "dataset", "method"], sort=True)
            .agg(
                n=("n", lambda ns: " ".join(map(str, sorted(set(ns))))),
                runs=("run_id", "size"),
                status=("status", lambda st: ", ".join(sorted(set(map(str, st))))),
            )
            .reset_index()
        )


# the run statuses the lab reads unless asked for others (a partial run biases every rate);
# $DSPARKLAB_STATUSES (``dsparklab report --statuses``) names others: a live fleet's runs
# read as running while their servers serve
READ_STATUSES: tuple[str, ...] = ("complete",)
STATUSES_ENV = "DSPARKLAB_STATUSES"


def read_statuses(text: str | None = None) -> tuple[str, ...]:
    """The statuses the lab reads: those ``text`` names (a comma list, e.g. a command's
    ``--statuses``), else ``$DSPARKLAB_STATUSES``'s, else :data:`READ_STATUSES`."""
    from dsparklab.store.schema import STATUSES

    where = "--statuses" if text else STATUSES_ENV
    text = text or os.environ.get(STATUSES_ENV, "")
    wanted = tuple(s.strip() for s in text.split(",") if s.strip()) or READ_STATUSES
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown:
        raise ConfigError(
            f"{where}={text!r}: unknown status {unknown[0]!r}; expected some of "
            f"{', '.join(STATUSES)}"
        )
    return wanted


# Figures list the realistic tier first.
TIER_ORDER = {"smol": 0, "tiny": 1}


def _tier_order(column: pd.Series) -> pd.Series:
    return column.map(TIER_ORDER).fillna(len(TIER_ORDER)) if column.name == "tier" else column


def load_runs(
    runs: RunsInput,
    *,
    datasets: Sequence[str] = (),
    methods: Sequence[str] = (),
    n_values: Sequence[int] = (),
    baseline: bool = True,
    shipped: bool = False,
    tiers: Sequence[str] = (),
    single_tier: bool = False,
    selection: Mapping[str, Any] | None = None,
    statuses: Collection[str] | None = None,
) -> Runs:
    """Read the positions and steps of the selected runs (empty selection = everything).

    Parameters
    ----------
    runs
        ``RUNS`` (see :func:`resolve_runs`), or a catalog already opened (read once,
        shared by several selections).
    datasets, methods, n_values
        Keep only these; the target-only baseline runs (method ``"none"``) of the selected
        datasets are added to ``steps`` when ``baseline`` (speedup needs them).
    baseline
        Include the baseline runs' steps.
    shipped
        Also read the traces shipped in the repository (:func:`shipped_traces`, the
        smol tier's). When the runs then span more than one tier, every ``dataset``
        becomes ``<tier>/<dataset>`` (``smol/humaneval``, ``tiny/humaneval``) in all
        three tables, so every grouping by dataset keeps the tiers apart.
    tiers
        Keep only runs of these zoo tiers (``smol``, ``tiny``); token-level views use
        one tier, since token ids and prompt ids mean different things across tiers.
    single_tier
        With no ``tiers`` given, keep the most realistic tier present (:data:`TIER_ORDER`,
        then by name): for views that show tokens.
    selection
        Keep only method runs whose run.json matches (:func:`dsparklab.store.
        matches_selection`): run columns or dotted fields, e.g. ``{"drafter.content_hash":
        "3f2a", "engine.version": "0.32.0"}``.
    statuses
        Read runs of these statuses (default: :func:`read_statuses`, complete ones unless
        ``$DSPARKLAB_STATUSES`` names others; a run left out is named in ``left_out`` and
        in a warning, not read; pass ``dsparklab.store.schema.STATUSES`` for every run).

    Raises
    ------
    MissingInputError
        No token-level run matches the selection (the message lists what there is).
    """
    catalog = open_catalog(runs, shipped=shipped)
    selected = _token_runs(
        catalog,
        datasets=datasets,
        methods=methods,
        n_values=n_values,
        baseline=baseline,
        tiers=tiers,
        single_tier=single_tier,
        selection=selection,
    )
    selected, left_out = by_status(selected, read_statuses() if statuses is None else statuses)
    if not (selected["method"] != BASELINE_METHOD).any():
        raise MissingInputError(f"no selected method run to read: {left_out_text(left_out)}")
    kept = _read_sample(selected, _read_fraction(catalog, selected))
    method_runs = selected[selected["method"] != BASELINE_METHOD]
    positions = _read_runs(catalog, "positions", method_runs, kept)
    steps = _read_runs(catalog, "steps", selected, kept)
    selected = _sampled(selected, kept).reset_index(drop=True)
    frames = [positions, steps, selected]
    for frame in frames:
        frame["raw_dataset"] = frame["dataset"]
    if selected["tier"].nunique() > 1:
        for frame in frames:
            frame["dataset"] = frame["tier"].astype(str) + "/" + frame["raw_dataset"].astype(str)
    return Runs(catalog, positions=positions, steps=steps, runs=selected, left_out=left_out)


def token_runs(
    runs: RunsInput,
    *,
    shipped: bool = False,
    datasets: Sequence[str] = (),
    tiers: Sequence[str] = (),
    baseline: bool = True,
) -> pd.DataFrame:
    """The run table (``list_runs`` columns and ``root``) of the token-level runs
    :func:`load_runs` reads with these parameters, without reading them."""
    return _token_runs(
        open_catalog(runs, shipped=shipped), datasets=datasets, tiers=tiers, baseline=baseline
    )


def _token_runs(
    catalog: Catalog,
    *,
    datasets: Sequence[str] = (),
    methods: Sequence[str] = (),
    n_values: Sequence[int] = (),
    baseline: bool = True,
    tiers: Sequence[str] = (),
    single_tier: bool = False,
    selection: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The runs :func:`load_runs` reads, with its parameters."""
    table = catalog.runs
    if single_tier and not tiers:
        token_tiers = table.loc[table["granularity"] == "token", "tier"].astype(str)
        if len(token_tiers):
            tiers = [min(token_tiers.unique(), key=lambda t: (TIER_ORDER.get(t, 99), t))]
    keep = catalog.matching(_asked({"dataset": datasets, "tier": tiers}))
    is_base = table["method"] == BASELINE_METHOD
    chosen = keep & ~is_base & catalog.matching(_asked({"method": methods, "n": n_values}))
    if selection:
        chosen &= catalog.matching(selection)
    if not chosen.any():
        raise _nothing_matches(catalog, datasets, methods, n_values, tiers, selection)
    token = table["granularity"] == "token"
    if (chosen & ~token).any():
        other = table.loc[chosen & ~token]
        message = (
            f"{len(other)} selected runs hold no token-level rows (granularity "
            f"{sorted(other['granularity'].unique())}: imported or live); the token-level views "
            "leave them out: notebooks/06_imported_and_live shows them"
        )
        if not (chosen & token).any():
            raise MissingInputError(message)
        logger.warning(message)
        chosen &= token
    return table.loc[chosen | (keep & is_base & baseline & token)]


ANY_TABLES = ("positions", "steps", "counters", "totals", "calibration")


@dataclass(frozen=True)
class AnyRuns:
    """Every table of the selected runs, whatever each run holds (see ``granularity``).

    Token-level runs fill ``positions`` and ``steps``; vLLM's per-step imports fill
    ``steps``; imported and live runs fill ``counters`` / ``totals`` (and ``calibration``
    when the source reported one). ``runs`` lists them all with their ``granularity``.
    """

    catalog: Catalog
    runs: pd.DataFrame
    positions: pd.DataFrame
    steps: pd.DataFrame
    counters: pd.DataFrame
    totals: pd.DataFrame
    calibration: pd.DataFrame
    left_out: pd.DataFrame = field(default_factory=pd.DataFrame)  # as Runs.left_out

    @property
    def root(self) -> Location:
        """The runs' root (as :attr:`Runs.root`)."""
        return self.catalog.roots[0]


def load_any_runs(
    runs: RunsInput,
    *,
    datasets: Sequence[str] = (),
    methods: Sequence[str] = (),
    n_values: Sequence[int] = (),
    shipped: bool = False,
    tiers: Sequence[str] = (),
    tables: Collection[str] = ANY_TABLES,
    statuses: Collection[str] | None = None,
) -> AnyRuns:
    """Read the tables of the selected runs (empty selection = everything).

    Unlike :func:`load_runs` it keeps runs without token-level rows (imported with
    ``dsparklab import`` or recorded by ``dsparklab watch``) and never adds baselines.
    ``tables``: those of :data:`ANY_TABLES` to read (the others are left empty, and
    without positions or steps the row budget does not apply: what is counted is counted
    by :func:`count_runs`). ``statuses`` as in :func:`load_runs`.
    """
    catalog = open_catalog(runs, shipped=shipped)
    table = catalog.runs
    selection = {"dataset": datasets, "method": methods, "n": n_values, "tier": tiers}
    keep = (table["method"] != BASELINE_METHOD) & catalog.matching(_asked(selection))
    if not keep.any():
        raise _nothing_matches(catalog, datasets, methods, n_values, tiers)
    statuses = read_statuses() if statuses is None else statuses
    selected, left_out = by_status(table.loc[keep], statuses)
    if selected.empty:
        wanted = " or ".join(sorted(statuses))
        raise MissingInputError(f"no selected run is {wanted}: {left_out_text(left_out)}")
    token_level = {"positions", "steps"} & set(tables)
    kept = _read_sample(selected, _read_fraction(catalog, selected)) if token_level else None
    frames = [
        _read_runs(catalog, name, selected, kept) if name in tables else pd.DataFrame()
        for name in ANY_TABLES
    ]
    read = AnyRuns(catalog, _sampled(selected, kept), *frames)
    return replace(read, left_out=left_out)


def by_status(table: pd.DataFrame, statuses: Collection[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs of ``table`` whose status is in ``statuses``, the others): a failed,
    running or incomplete run read like a complete one would bias every rate, so the lab
    reads complete runs unless asked, and names the ones it leaves out (a warning)."""
    keep = table["status"].isin(list(statuses))
    left_out = table.loc[~keep].reset_index(drop=True)
    if len(left_out):
        logger.warning("%s", left_out_text(left_out))
    return table.loc[keep].reset_index(drop=True), left_out


def left_out_text(left_out: pd.DataFrame) -> str:
    """One line naming the runs left out for their status, and how to read them."""
    names = ", ".join(f"{r.run_id} ({r.status})" for r in left_out.itertuples())
    return (
        f"{len(left_out)} run(s) left out for their status: {names} (read them with "
        f"--statuses or ${STATUSES_ENV})"
    )


def _asked(wanted: Mapping[str, Sequence[Any]]) -> dict[str, Sequence[Any]]:
    """The run columns a selection constrains: an empty list of values asks for any."""
    return {
        column: values for column, values in wanted.items() if values is not None and len(values)
    }


def _nothing_matches(
    catalog: Catalog,
    datasets: Sequence[str],
    methods: Sequence[str],
    n_values: Sequence[int],
    tiers: Sequence[str],
    selection: Mapping[str, Any] | None = None,
) -> MissingInputError:
    available = catalog.runs[["tier", "method", "n", "dataset"]].drop_duplicates()
    available = available.to_dict("records")
    selected = f", selection={dict(selection)}" if selection else ""
    return MissingInputError(
        f"no runs under {', '.join(map(str, catalog.roots))} match datasets={list(datasets)}, "
        f"methods={list(methods)}, n={list(n_values)}, tiers={list(tiers)}{selected}; "
        f"available: {available}"
    )


# Position rows a notebook (or the report's findings) reads at most; past it, the requests
# of a sample of prompts (the store's hash, of the prompt id: the same prompts in every run,
# so comparisons stay paired), which the run table's ``sample`` says.
MAX_ROWS_ENV = "DSPARKLAB_MAX_ROWS"
DEFAULT_MAX_ROWS = 2_000_000


def max_rows() -> int:
    """The row budget: ``$DSPARKLAB_MAX_ROWS``, else :data:`DEFAULT_MAX_ROWS`."""
    text = os.environ.get(MAX_ROWS_ENV, "")
    try:
        value = int(text) if text else DEFAULT_MAX_ROWS
    except ValueError:
        raise ConfigError(f"{MAX_ROWS_ENV}={text!r} is not a number of rows") from None
    if value < 1:
        raise ConfigError(f"{MAX_ROWS_ENV}={text!r}: expected a positive number of rows")
    return value


def _read_fraction(catalog: Catalog, rows: pd.DataFrame) -> float:
    """The fraction of requests to read so the position rows of ``rows``' runs (their
    run.json's counts) fit :func:`max_rows`."""
    total = catalog.recorded_rows(rows, "positions")
    return 1.0 if total <= max_rows() else max_rows() / total


@dataclass(frozen=True)
class ReadSample:
    """The requests read of runs past the row budget (:func:`_read_sample`)."""

    request_ids: dict[str, list[str]]  # root -> the request ids read there
    shares: dict[str, float]  # run_id -> the share of its recorded requests read


def _read_sample(rows: pd.DataFrame, fraction: float) -> ReadSample | None:
    """Which requests to read so that ``fraction`` of the recorded ones are (None: all).

    The same prompts in every run: a prompt is read when its point
    (:func:`~dsparklab.store.sampling.request_unit` of its prompt id) lies below the
    ``fraction`` quantile of the recorded requests' points. A quantile, not ``fraction``
    itself: a store recorded as a sample (``DSPARKLAB_SAMPLE``) may hold only the requests
    whose points are already small, and a fixed threshold would then read all of them,
    past the budget, under a wrong label.
    """
    from dsparklab.store import read_trace
    from dsparklab.store.sampling import request_unit

    if fraction >= 1.0:
        return None
    frames = []
    for root, group in rows.groupby("root", sort=False):
        filters = {"run_id": group["run_id"].tolist()}
        ids = read_trace(root, "requests", columns=["request_id", "prompt_id"], filters=filters)
        frames.append(ids.assign(root=root))
    ids = pd.concat(frames, ignore_index=True)
    points = ids["prompt_id"].astype(str).map(request_unit)
    keep = points < np.quantile(points, fraction) if len(points) else points.astype(bool)
    read = ids[keep]
    shares = read.groupby("run_id").size().reindex(rows["run_id"], fill_value=0) / (
        ids.groupby("run_id").size().reindex(rows["run_id"]).clip(lower=1)
    )
    return ReadSample(
        request_ids={
            str(root): group["request_id"].unique().tolist()
            for root, group in read.groupby("root", sort=False)
        },
        shares={str(k): float(v) for k, v in shares.items()},
    )


def _sampled(rows: pd.DataFrame, kept: ReadSample | None) -> pd.DataFrame:
    """``rows`` with ``sample`` (the fraction of each run's requests the tables hold)
    scaled by the share of its recorded requests read."""
    if kept is None:
        return rows
    return rows.assign(sample=rows["sample"] * rows["run_id"].astype(str).map(kept.shares))


def _read_runs(
    catalog: Catalog, name: str, rows: pd.DataFrame, kept: ReadSample | None = None
) -> pd.DataFrame:
    """Table ``name`` of the runs in ``rows`` (read root by root, run metadata joined);
    with ``kept``, only the requests it names (each whole: its steps and positions)."""
    from dsparklab.store import read_trace

    frames = []
    for root, group in rows.groupby("root", sort=False):
        filters: dict[str, Any] = {"run_id": group["run_id"].tolist()}
        if kept is not None and name in ("positions", "steps", "requests"):
            filters["request_id"] = kept.request_ids.get(str(root), [])
        frames.append(read_trace(catalog.only(str(root)), name, filters=filters))
    return pd.concat(frames, ignore_index=True)


# Columns a count takes from its run's row of the run table (whose ``dataset`` is the label
# load_runs gave it, ``<tier>/<dataset>`` across tiers).
COUNTED_RUN_COLUMNS = (
    "method",
    "n",
    "dataset",
    "raw_dataset",
    "tier",
    "engine",
    "target",
    "drafter",
    "temperature",
    "concurrency",
)


def count_runs(
    catalog: Catalog,
    rows: pd.DataFrame,
    metric: str,
    *,
    by: Sequence[str] = (),
    per_request: bool = True,
) -> pd.DataFrame:
    """Counters of ``metric`` per request (per run without ``per_request``) over every
    request of the runs in ``rows`` (rows of ``catalog.runs``), counted by DuckDB root by
    root (:func:`dsparklab.analysis.aggregate_store`), with the rows' run columns.

    Counting reads only the columns it counts, out of memory, so it takes every request
    whatever the row budget left in the notebook's tables: the headline numbers (heatmaps,
    AL, speedup) are over the whole store even where the token-level views hold a sample.
    ``by``: row columns (``prompt_id``) kept among the keys besides run_id and request_id.
    """
    from dsparklab.analysis.sql import aggregate_store, empty_counts

    frames = []
    for root, group in rows.groupby("root", sort=False):
        counts = aggregate_store(
            catalog.only(str(root)),
            metric=metric,
            by=by if per_request else tuple(dict.fromkeys(("run_id", *by))),  # joins on run_id
            filters={"run_id": group["run_id"].tolist()},
            per_request=per_request,
        )
        run_columns = [c for c in COUNTED_RUN_COLUMNS if c in group.columns]
        counts = counts.drop(columns=[c for c in run_columns if c in counts.columns])
        frames.append(counts.merge(group[["run_id", *run_columns]], on="run_id", how="left"))
    if not frames:
        keys = by if per_request else tuple(dict.fromkeys(("run_id", *by)))
        return empty_counts(metric, keys, per_request=per_request)
    return pd.concat(frames, ignore_index=True)
