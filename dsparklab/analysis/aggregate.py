r"""Acceptance for runs without token-level rows: counters, rates, totals, intervals.

Runs imported from what engines and benchmark harnesses export (or scraped live) hold
per-position *counters* (:math:`R_i`, :math:`A_i` per run, request or scrape interval),
sometimes only *rates*, and per-unit *totals* with the numbers the source reported (see
``dsparklab/store/schema.py``). These functions turn them into the same tables the
token-level analysis returns, so one heatmap or AL curve can hold every run whatever it
holds (:mod:`dsparklab.analysis.coverage` says plainly what each run cannot show).

Counts finish with the formulas of :func:`dsparklab.analysis.compute_acceptance_by_position`
(:math:`a_i = A_i / R_i`, :math:`s_i = \prod_{j \le i} a_j`,
:math:`\mathrm{AL} = 1 + \sum_i s_i`); a run that gave rates only keeps its rates and
cannot be pooled with other runs (there is nothing to weight them by).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import UNIT_COLUMNS, as_columns, require_columns
from dsparklab.analysis.acceptance import (
    _empty_by_position,
    finish_acceptance,
    is_acceptance_counts,
)
from dsparklab.analysis.definitions import conditional_from_marginal
from dsparklab.analysis.sql.counting import count_frames
from dsparklab.errors import DSparkLabError

COUNTER_COLUMNS = ("scope", "request_id", "interval", "position", "n_reached", "n_accepted")


def _counted(counters: pd.DataFrame) -> pd.DataFrame:
    return counters[counters["n_accepted"].notna() & counters["n_reached"].notna()]


def count_acceptance_from_counters(
    counters: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("run_id",),
    per_request: bool = True,
) -> pd.DataFrame:
    """The acceptance counter table (that of :func:`dsparklab.analysis.count_frames`), from
    stored counters.

    Parameters
    ----------
    counters
        ``read_trace(root, "counters")``: rows with counts (rate-only rows are skipped;
        see :func:`compute_rate_acceptance`).
    by
        Grouping columns (run columns, or ``interval`` for a live run's time series).
    per_request
        Keep ``run_id``, ``request_id`` when every counted row is per request (bootstrap
        intervals need them); run- and interval-scoped counters are summed per group.

    Returns
    -------
    pandas.DataFrame
        ``by`` [+ run_id, request_id] + ``position``, ``n_drafted``, ``n_reached``,
        ``n_accepted``. A null ``n_drafted`` (the source does not say how many drafts
        drafted position i) becomes :math:`R_i`, the drafts known to have reached it.

    Notes
    -----
    Interval rows of one run are disjoint (per-interval deltas), so summing them gives the
    run's counts; a run's run-scoped and request-scoped rows are never both counted (the
    finer one is used).
    """
    by = as_columns(by)
    require_columns(counters, COUNTER_COLUMNS, what="count_acceptance_from_counters")
    frame = _counted(counters)
    if "run_id" not in frame.columns:
        frame = frame.assign(run_id="run")
    # one scope per run: requests if the run has them, else intervals, else the run
    finest = frame.groupby("run_id")["scope"].agg(
        lambda s: (
            "request"
            if (s == "request").any()
            else ("interval" if (s == "interval").any() else "run")
        )
    )
    frame = frame[frame["scope"].to_numpy() == frame["run_id"].map(finest).to_numpy()]
    drafted = frame["n_drafted"].astype("Float64").fillna(frame["n_reached"].astype("Float64"))
    frame = frame.assign(n_drafted=drafted)
    keys = list(by)
    if per_request and len(frame) and (frame["scope"] == "request").all():
        keys += [c for c in UNIT_COLUMNS if c not in keys]
    keys.append("position")
    require_columns(frame, keys, what="count_acceptance_from_counters")
    if frame.empty:
        return pd.DataFrame(
            {c: pd.Series(dtype=object if c != "position" else np.int64) for c in keys}
            | {c: pd.Series(dtype=np.int64) for c in ("n_drafted", "n_reached", "n_accepted")}
        )
    summed = (
        frame.groupby(keys, dropna=False, sort=True)[["n_drafted", "n_reached", "n_accepted"]]
        .sum()
        .reset_index()
    )
    for name in ("n_drafted", "n_reached", "n_accepted"):
        summed[name] = summed[name].astype(np.int64)
    summed["position"] = summed["position"].astype(np.int64)
    return summed


def compute_rate_acceptance(
    counters: pd.DataFrame, *, by: str | Iterable[str] = ("run_id",)
) -> pd.DataFrame:
    """Acceptance by position of runs that reported rates but no counts.

    Returns
    -------
    pandas.DataFrame
        The columns of :func:`dsparklab.analysis.compute_acceptance_by_position` (counts,
        intervals and ``n_requests`` NA) with ``accept_rate`` and ``survival`` as reported;
        a missing one is derived: :math:`a_i = s_i / s_{i-1}`, :math:`s_i = \\prod_{j\\le
        i} a_j`; plus ``n_runs``.

    Notes
    -----
    Rates of different runs cannot be weighted without their counts: a group holding
    several rate-only runs gets the unweighted mean over runs of each run's
    :math:`s_i` (and :math:`a_i = \\bar s_i / \\bar s_{i-1}`), with ``n_runs`` saying
    how many were averaged. Group by ``run_id`` to see each run as reported.
    """
    by = as_columns(by)
    require_columns(counters, ("position", "accept_rate", "survival"), what="rate acceptance")
    frame = counters[counters["n_accepted"].isna()] if "n_accepted" in counters else counters
    if "run_id" not in frame.columns:
        frame = frame.assign(run_id="run")
    if frame.empty:
        return _empty_by_position(by)
    per_run = []
    for _, run in frame.groupby("run_id", sort=True):
        run = run.sort_values("position")
        survival = run["survival"].to_numpy(dtype=np.float64, na_value=np.nan)
        rate = run["accept_rate"].to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isnan(survival).all() and not np.isnan(rate).all():
            survival = np.cumprod(np.where(np.isnan(rate), 0.0, rate))
        if np.isnan(rate).all():
            rate = conditional_from_marginal(survival)
        keep = (
            run[[*by, "run_id"]].reset_index(drop=True)
            if "run_id" not in by
            else run[list(by)].reset_index(drop=True)
        )
        per_run.append(
            keep.assign(
                position=run["position"].to_numpy(dtype=np.int64),
                accept_rate=rate,
                survival=survival,
            )
        )
    rows = pd.concat(per_run, ignore_index=True)
    keys = [*by, "position"]
    grouped = rows.groupby(keys, sort=True, dropna=False)
    result = grouped.agg(
        survival=("survival", "mean"),
        accept_rate=("accept_rate", "mean"),
        n_runs=("run_id", "nunique") if "run_id" in rows else ("position", "size"),
    ).reset_index()
    several = result["n_runs"] > 1
    if several.any():  # a_i of the mean survival, not the mean of a_i
        pooled = result[several]
        groups = [g for _, g in pooled.groupby(list(by), dropna=False)] if by else [pooled]
        for group in groups:
            group = group.sort_values("position")
            result.loc[group.index, "accept_rate"] = conditional_from_marginal(
                group["survival"].to_numpy()
            )
    for name in ("n_drafted", "n_reached", "n_accepted", "n_requests"):
        result[name] = pd.array([pd.NA] * len(result), dtype="Int64")
    for name in ("accept_rate_lo", "accept_rate_hi", "survival_lo", "survival_hi"):
        result[name] = np.nan
    return result[[*_empty_by_position(by).columns, "n_runs"]]


def _count_pieces(
    positions: pd.DataFrame | None,
    steps: pd.DataFrame | None,
    counters: pd.DataFrame | None,
    by: tuple[str, ...],
    per_request: bool,
    counts: pd.DataFrame | None = None,
) -> list[pd.DataFrame]:
    """One counter table per source of counts (counted already, positions, bare steps,
    counters)."""
    pieces: list[pd.DataFrame] = []
    if counts is not None and len(counts):
        require_columns(counts, [*by, "position", "n_reached", "n_accepted"], what="acceptance")
        if "n_drafted" not in counts:  # a source that does not say: the drafts that reached i
            counts = counts.assign(n_drafted=counts["n_reached"])
        counted = counts[counts["n_drafted"] > 0]
        pieces.append(counted if per_request else _flatten(counted, by))
    token_runs: set[str] = set()
    if positions is not None and len(positions):
        pieces.append(
            count_frames(positions=positions, steps=steps, by=by, per_request=per_request)
        )
        token_runs = set(positions["run_id"].unique()) if "run_id" in positions else {"run"}
    if steps is not None and len(steps):
        run_ids = steps["run_id"] if "run_id" in steps else pd.Series("run", index=steps.index)
        rest = steps[~run_ids.isin(token_runs)]
        if len(rest):
            counted = count_frames(steps=rest, by=by, per_request=per_request)
            pieces.append(counted[counted["n_drafted"] > 0])
    if counters is not None and len(counters):
        run_ids = (
            counters["run_id"] if "run_id" in counters else pd.Series("run", index=counters.index)
        )
        counted = counters["n_accepted"].notna()
        by_request = set(run_ids[counted & (counters["scope"] == "request")])
        for part in (counters[run_ids.isin(by_request)], counters[~run_ids.isin(by_request)]):
            if len(part):
                pieces.append(count_acceptance_from_counters(part, by=by, per_request=per_request))
    return [p for p in pieces if len(p)]


def _flatten(piece: pd.DataFrame, by: tuple[str, ...]) -> pd.DataFrame:
    """Sum a counter table over requests (drop run_id / request_id unless grouped by)."""
    drop = [c for c in UNIT_COLUMNS if c in piece.columns and c not in by]
    if not drop:
        return piece
    return (
        piece.drop(columns=drop)
        .groupby([*by, "position"], dropna=False)[["n_drafted", "n_reached", "n_accepted"]]
        .sum()
        .reset_index()
    )


def _split_counts(
    pieces: list[pd.DataFrame], by: tuple[str, ...]
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(per-request counts, counts summed over requests) with no group in both.

    A group that holds some run without per-request counts is summed over requests
    entirely: an interval over part of a group would be misleading.
    """
    with_units = [p for p in pieces if all(c in p.columns for c in UNIT_COLUMNS)]
    flat = [_flatten(p, by) for p in pieces if not all(c in p.columns for c in UNIT_COLUMNS)]
    units = pd.concat(with_units, ignore_index=True) if with_units else None
    summed = pd.concat(flat, ignore_index=True) if flat else None
    if units is not None and summed is not None and by:
        flat_keys = set(map(tuple, summed[list(by)].astype(str).to_numpy()))
        in_flat = units[list(by)].astype(str).apply(tuple, axis=1).isin(flat_keys)
        if in_flat.any():
            summed = pd.concat([summed, _flatten(units[in_flat], by)], ignore_index=True)
            units = units[~in_flat]
    elif units is not None and summed is not None:  # one group: all summed
        summed = pd.concat([summed, _flatten(units, by)], ignore_index=True)
        units = None
    if summed is not None:
        summed = (
            summed.groupby([*by, "position"], dropna=False)[
                ["n_drafted", "n_reached", "n_accepted"]
            ]
            .sum()
            .reset_index()
        )
    return (units if units is not None and len(units) else None), summed


def _positions_and_counts(
    data: pd.DataFrame | None, counts: pd.DataFrame | None
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(positions, counts): the first argument of the acceptance functions is either."""
    if data is None or not is_acceptance_counts(data):
        return data, counts
    if counts is not None:
        raise DSparkLabError(
            "acceptance counts given twice: pass them as the first argument or as counts=, not both"
        )
    return None, data


def count_acceptance_any(
    positions: pd.DataFrame | None = None,
    *,
    steps: pd.DataFrame | None = None,
    counters: pd.DataFrame | None = None,
    counts: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    per_request: bool = True,
) -> pd.DataFrame:
    """Acceptance counters of every run, from the finest rows each run holds.

    Token-level runs are counted from ``positions``; runs whose steps have no position
    rows (``step`` granularity: vLLM's per-step counts without drafted tokens) from
    ``steps`` (both by :func:`dsparklab.analysis.count_frames`); the rest from
    ``counters`` (:func:`count_acceptance_from_counters`). The sources are disjoint by
    run, so their counts add: :math:`R_i = \\sum_{\\text{runs}} R_i`, likewise
    :math:`A_i`. Per-request rows are kept only when every run of the selection has them.
    ``counts`` adds runs counted already (per-request acceptance counters, e.g.
    :func:`dsparklab.analysis.aggregate_store` with ``per_request=True``), disjoint by run
    from the other tables.
    """
    by = as_columns(by)
    pieces = _count_pieces(positions, steps, counters, by, per_request, counts)
    if not pieces:
        return count_acceptance_from_counters(
            pd.DataFrame({c: pd.Series(dtype=object) for c in (*COUNTER_COLUMNS, "n_drafted")}),
            by=by,
            per_request=False,
        )
    if all(all(c in p.columns for c in UNIT_COLUMNS) for p in pieces):
        return pd.concat(pieces, ignore_index=True)
    return pd.concat([_flatten(p, by) for p in pieces], ignore_index=True)


def _finish_any(
    pieces: list[pd.DataFrame],
    by: tuple[str, ...],
    table: int,
    *,
    n_boot: int,
    ci: float,
    seed: int,
) -> pd.DataFrame:
    """Table ``table`` of :func:`finish_acceptance` (0: by position, 1: length) of the
    pieces' counts: with intervals where every run of a group has per-request counts."""
    units, summed = _split_counts(pieces, by)
    frames = []
    if units is not None:
        frames.append(finish_acceptance(units, by, n_boot=n_boot, ci=ci, seed=seed)[table])
    if summed is not None:
        frames.append(finish_acceptance(summed, by, n_boot=0, ci=ci, seed=seed)[table])
    if not frames:
        return finish_acceptance(pd.DataFrame(), by, n_boot=0, ci=ci, seed=seed)[table]
    frames = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def compute_acceptance_by_position(
    data: pd.DataFrame | None = None,
    *,
    steps: pd.DataFrame | None = None,
    counters: pd.DataFrame | None = None,
    counts: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Conditional acceptance and survival per drafted position, with bootstrap intervals,
    for runs of any granularity.

    Parameters
    ----------
    data
        Acceptance counts (``position``, ``n_reached``, ``n_accepted``, ``n_drafted``:
        :func:`dsparklab.analysis.aggregate_store`, the lab's ``count_runs``,
        :func:`count_acceptance_any`), or the positions table of token-level runs.
    steps
        The steps table: ``prompt_id`` grouping and adaptive verification for the
        positions; a run with steps but no row in ``data`` (vLLM's per-step counts) is
        counted from its steps, so filter both tables alike.
    counters
        Imported or scraped per-position counters (and rates) of runs without rows.
    counts
        Runs counted already, besides the positions in ``data`` (disjoint by run).
    by
        Grouping columns, e.g. ``("method", "n", "dataset")`` or ``"prompt_id"``.
    n_boot
        Bootstrap replicates over requests; 0 skips the intervals (columns are NaN).
    ci
        Interval level (percentile bootstrap).
    seed
        Seeds the resampling; each group's stream depends on the seed and the group key
        only, so a group's interval does not change when other groups are added.

    Returns
    -------
    pandas.DataFrame
        One row per group and position: ``n_drafted``, ``n_reached``, ``n_accepted``,
        ``accept_rate`` (:math:`a_i`), ``survival`` (:math:`s_i`), their ``_lo``/``_hi``
        bounds, ``n_requests`` (NA for counts summed over requests) and ``source``:
        ``"counts"``, or ``"reported rates"`` for runs that gave rates only
        (:func:`compute_rate_acceptance`, appended as reported).

    Notes
    -----
    With :math:`R_i` reached and :math:`A_i` accepted drafts at position :math:`i`,
    summed over every run of the group from the finest rows each holds
    (:func:`count_acceptance_any`):

    .. math::

        a_i = \\frac{A_i}{R_i} = P(\\mathrm{accepted}_i \\mid \\mathrm{reached}_i), \\qquad
        s_i = \\prod_{j \\le i} a_j = P(\\mathrm{accepted}_i)

    :math:`a_i` is NaN where nothing was reached and the product then treats it as 0.
    Pooling runs of different ``n`` in one group estimates :math:`a_i` for the later
    positions from the longer windows only. Intervals resample requests (run_id,
    request_id) with replacement within each group, and only for groups whose runs all
    have per-request counts (others: NaN bounds).
    """
    by = as_columns(by)
    positions, counts = _positions_and_counts(data, counts)
    pieces = _count_pieces(positions, steps, counters, by, True, counts)
    counted = _finish_any(pieces, by, 0, n_boot=n_boot, ci=ci, seed=seed).assign(source="counts")
    if counters is None or not len(counters) or counters["n_accepted"].notna().all():
        return counted
    rates = compute_rate_acceptance(counters, by=by).assign(source="reported rates")
    if counted.empty:
        return rates
    return pd.concat([counted, rates], ignore_index=True)


def compute_acceptance_length(
    data: pd.DataFrame | None = None,
    *,
    steps: pd.DataFrame | None = None,
    counters: pd.DataFrame | None = None,
    totals: pd.DataFrame | None = None,
    counts: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Mean acceptance length per group for runs of any granularity, with a bootstrap
    interval over requests and its definition.

    Parameters are those of :func:`compute_acceptance_by_position`, plus ``totals``: the
    numbers sources reported per run, used for runs that hold nothing else.

    Returns
    -------
    pandas.DataFrame
        ``by`` + ``accept_len`` (+ ``_lo``/``_hi`` where per-request counts exist),
        ``n_positions`` (drafted positions seen), ``n_steps`` (steps that drafted),
        ``n_accepted``, ``n_requests`` and ``definition``: ``per_step``
        (:math:`1 + \\sum_i s_i` from counts or reported rates) or, for runs that hold
        only a reported number (e.g. specdec_bench's ``accept_length_by_k``),
        ``reported: <its definition>``. One ``per_step`` row per group.

    Notes
    -----
    .. math:: \\mathrm{AL} = 1 + \\sum_{i=0}^{n-1} s_i = 1 + \\sum_i \\prod_{j \\le i} a_j

    The 1 is the bonus token, so :math:`1 \\le \\mathrm{AL} \\le n + 1`. When every step
    drafts all :math:`n` positions this equals the mean of ``accepted_len + 1`` over steps.
    Rate-only runs cannot be weighted against other runs (see
    :func:`compute_rate_acceptance`). A group holding both counted and rate-only runs gets
    the unweighted mean over its runs :math:`r` of each run's own length,
    :math:`\\mathrm{AL} = \\frac{1}{|R|} \\sum_r \\bigl(1 + \\sum_i s_{r,i}\\bigr)`, with
    no counts or interval (they would be the counted runs' alone).
    """
    by = as_columns(by)
    positions, counts = _positions_and_counts(data, counts)
    counted = _count_pieces(positions, steps, counters, by, True, counts)
    length = _finish_any(counted, by, 1, n_boot=n_boot, ci=ci, seed=seed)
    pieces = []
    if counters is not None and len(counters) and not counters["n_accepted"].notna().all():
        rated = _rate_lengths(compute_rate_acceptance(counters, by=by), by)
        mixed = set(_key_tuples(length, by)) & set(_key_tuples(rated, by))
        if mixed:
            in_length = np.array([k in mixed for k in _key_tuples(length, by)], dtype=bool)
            in_rated = np.array([k in mixed for k in _key_tuples(rated, by)], dtype=bool)
            runs = _run_lengths(positions, steps, counters, counts, by, ci=ci, seed=seed)
            runs = runs[np.array([k in mixed for k in _key_tuples(runs, by)], dtype=bool)]
            pieces.append(_mean_over_runs(runs, by))
            length, rated = length[~in_length], rated[~in_rated]
        if len(rated):
            pieces.append(rated)
    pieces = [piece.assign(definition="per_step") for piece in [length, *pieces] if len(piece)]
    if totals is not None and len(totals):
        have = set()
        for piece in pieces:
            if "run_id" in piece.columns:
                have |= set(piece["run_id"])
        for table in (counters, positions, steps, counts):
            if table is not None and "run_id" in table:
                have |= set(table["run_id"])
        only = totals[(totals["scope"] == "run") & totals["reported_accept_len"].notna()]
        if "run_id" in only.columns:
            only = only[~only["run_id"].isin(have)]
        if len(only):
            reported = only[[*by, "reported_accept_len", "reported_accept_len_definition"]].rename(
                columns={"reported_accept_len": "accept_len"}
            )
            reported["definition"] = "reported: " + reported.pop(
                "reported_accept_len_definition"
            ).fillna("unknown")
            pieces.append(reported)
    if not pieces:
        return length.assign(definition=pd.Series(dtype=str))
    return pd.concat(pieces, ignore_index=True)


def _key_tuples(frame: pd.DataFrame, by: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each row's group as a tuple of strings (``()`` for every row when ``by`` is empty)."""
    values = frame[list(by)].astype(str).to_numpy() if by else np.empty((len(frame), 0))
    return [tuple(row) for row in values]


def _rate_lengths(rates: pd.DataFrame, by: tuple[str, ...]) -> pd.DataFrame:
    """``by`` + ``accept_len`` = 1 + sum_i s_i per group of a rate-acceptance table."""
    grouped = rates.groupby(list(by), dropna=False) if by else [((), rates)]
    rows = [
        {
            **dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
            "accept_len": 1.0 + float(np.nansum(g["survival"])),
        }
        for key, g in grouped
    ]
    return pd.DataFrame(rows, columns=[*by, "accept_len"])


def _run_lengths(
    positions: pd.DataFrame | None,
    steps: pd.DataFrame | None,
    counters: pd.DataFrame,
    counts: pd.DataFrame | None,
    by: tuple[str, ...],
    *,
    ci: float,
    seed: int,
) -> pd.DataFrame:
    """``by`` + ``run_id`` + ``accept_len`` of every run, counted or rate-only, on its own."""
    per_run = by if "run_id" in by else (*by, "run_id")
    pieces = _count_pieces(positions, steps, counters, per_run, False, counts)
    counted = _finish_any(pieces, per_run, 1, n_boot=0, ci=ci, seed=seed)
    rated = _rate_lengths(compute_rate_acceptance(counters, by=per_run), per_run)
    columns = [*per_run, "accept_len"]
    return pd.concat([counted[columns], rated[columns]], ignore_index=True)


def _mean_over_runs(runs: pd.DataFrame, by: tuple[str, ...]) -> pd.DataFrame:
    """``by`` + ``accept_len``: the mean over each group's runs of their lengths."""
    if not by:
        return pd.DataFrame({"accept_len": [float(runs["accept_len"].mean())]})
    return runs.groupby(list(by), dropna=False, sort=True)["accept_len"].mean().reset_index()


def compute_acceptance_over_time(
    counters: pd.DataFrame,
    totals: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("run_id",),
) -> pd.DataFrame:
    """Acceptance by position per scrape interval of live runs (``dsparklab watch``).

    Returns
    -------
    pandas.DataFrame
        One row per group, interval and position: ``t_start``, ``t_end`` (unix seconds),
        ``t_mid_s`` (seconds since the group's first interval began; the interval index
        + 0.5 when the scrapes carry no times, e.g. imported files), ``num_drafts``,
        ``n_reached``, ``n_accepted``, ``accept_rate``, ``survival`` and the interval's
        ``accept_len``.

    Notes
    -----
    Per interval :math:`k` with :math:`D_k` drafts and per-position accepted counts
    :math:`A_{k,i}`: :math:`s_{k,i} = A_{k,i} / D_k`, :math:`a_{k,i} = A_{k,i} /
    A_{k,i-1}` (:math:`A_{k,-1} = D_k`), :math:`\\mathrm{AL}_k = 1 + \\sum_i s_{k,i}`.
    Intervals without drafts (an idle server) have NaN rates.
    """
    by = as_columns(by)
    keys = [*by, "interval"]
    rows = counters[(counters["scope"] == "interval") & counters["n_accepted"].notna()]
    times = totals[totals["scope"] == "interval"]
    cols = [
        *keys,
        "position",
        "t_start",
        "t_end",
        "t_mid_s",
        "num_drafts",
        "n_reached",
        "n_accepted",
        "accept_rate",
        "survival",
        "accept_len",
    ]
    if rows.empty or times.empty:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    joined = rows.merge(
        times[[*keys, "t_start", "t_end", "num_drafts"]], on=keys, how="left", sort=True
    )
    drafts = joined["num_drafts"].to_numpy(dtype=np.float64, na_value=np.nan)
    reached = joined["n_reached"].to_numpy(dtype=np.float64, na_value=np.nan)
    accepted = joined["n_accepted"].to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        joined["accept_rate"] = np.where(
            reached > 0, accepted / np.where(reached > 0, reached, 1), np.nan
        )
        joined["survival"] = np.where(
            drafts > 0, accepted / np.where(drafts > 0, drafts, 1), np.nan
        )
    length = (
        joined.groupby(keys, dropna=False)["survival"].sum(min_count=1).rename("accept_len") + 1.0
    )
    joined = joined.merge(length.reset_index(), on=keys, how="left")
    first = (
        joined.groupby(list(by), dropna=False)["t_start"].transform("min")
        if by
        else joined["t_start"].min()
    )
    mid = (joined["t_start"] + joined["t_end"]) / 2.0 - first
    # scrapes imported from files carry no times: the interval index stands in
    joined["t_mid_s"] = mid.fillna(joined["interval"].astype(float) + 0.5)
    return joined[cols].sort_values([*keys, "position"]).reset_index(drop=True)


__all__ = [
    "compute_acceptance_by_position",
    "compute_acceptance_length",
    "compute_acceptance_over_time",
    "compute_rate_acceptance",
    "count_acceptance_any",
    "count_acceptance_from_counters",
]
