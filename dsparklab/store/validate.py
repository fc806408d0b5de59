"""Check run directories against the trace contract and its invariants.

Unlike the readers, which stop at the first problem, validation reports every violation
it finds, each with the file, row and field, so a broken run can be repaired or
discarded knowingly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dsparklab.errors import TraceSchemaError
from dsparklab.store.layout import (
    PARTITION_KEYS,
    RUNS_DIR,
    RUNS_ROW,
    RUNS_TABLE,
    is_partitioned,
    partition_values,
    run_tables,
    store_of,
    table_location,
)
from dsparklab.store.location import Location, Where
from dsparklab.store.reader import (
    check_part_schema,
    find_runs,
    parts_by_generation,
    read_run_json,
    resolve_run,
    run_granularity,
    with_partition_columns,
)
from dsparklab.store.rows import resumed_tokens
from dsparklab.store.schema import (
    AGGREGATE_TABLES,
    AL_DEFINITIONS,
    ALL_TABLES,
    RUN_JSON,
    SCOPES,
    TEMP_SUFFIX,
)

# Which units a run of each granularity may describe in its counters / totals tables.
ALLOWED_SCOPES: dict[str, frozenset[str]] = {
    "token": frozenset({"run", "request"}),
    "step": frozenset({"run", "request"}),
    "request": frozenset({"run", "request"}),
    "aggregate": frozenset({"run"}),
    "interval": frozenset({"interval", "run"}),
}
CALIBRATION_SCORES = ("confidence", "prefix_confidence")

# At most this many violations of one kind are listed; the rest are counted.
MAX_LISTED = 20


@dataclass(frozen=True)
class Violation:
    file: str
    field: str | None
    message: str
    row: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.row is not None:
            where += f" row {self.row}"
        if self.field:
            where += f" field {self.field!r}"
        return f"{where}: {self.message}"


@dataclass
class RunReport:
    path: Location
    status: str = "unknown"
    violations: list[Violation] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def summary(self) -> str:
        counts = ", ".join(f"{n} {t}" for t, n in self.rows.items())
        if not self.ok:
            verdict = f"INVALID ({len(self.violations)} violations)"
        elif self.complete:
            verdict = "ok"
        else:
            verdict = f"incomplete (status {self.status}; every finished part readable)"
        return f"{self.path}: {verdict}; {counts}" if counts else f"{self.path}: {verdict}"


def validate_trace(root: Where) -> list[RunReport]:
    """Validate one run or every run below ``root``; below a store in the table layout,
    also report each partition holding parts that no run.json owns
    (:func:`unowned_partitions`)."""
    runs = find_runs(root)
    return [validate_run(run_dir) for run_dir in runs] + unowned_partitions(root, runs)


def unowned_partitions(store: Where, runs: list[Location]) -> list[RunReport]:
    """One report per ``<store>/<table>/<partition>`` with files but no
    ``<store>/_runs/<partition>/run.json`` among ``runs``: a removal or a move cut short,
    or a copy that left run.json behind. No reader of dsparklab's counts those parts (they
    list a run's parts from its run.json), but a SQL engine reading ``<store>/<table>``
    natively does, so a store holding them is not valid."""
    store = Location.of(store)
    owned = {
        run.relative_to(store / RUNS_DIR)
        for run in runs
        if is_partitioned(run) and store_of(run) == store
    }
    found: dict[str, list[str]] = {}
    for table in (*ALL_TABLES, RUNS_TABLE):
        home = store / table
        for part in home.walk_files() if home.is_dir() else []:
            partition = "/".join(part.relative_to(home).split("/")[: len(PARTITION_KEYS)])
            if partition not in owned and partition.count("=") == len(PARTITION_KEYS):
                found.setdefault(partition, []).append(table)
    return [
        RunReport(
            path=store / RUNS_DIR / partition,
            status="no run.json",
            violations=[
                Violation(
                    str(store / table / partition),
                    None,
                    "parts with no run.json: a removal or move cut short, or run.json not "
                    "copied; SQL reading the table directory counts them, dsparklab's readers "
                    "do not: delete the directory or restore its run.json",
                )
                for table in dict.fromkeys(tables)
            ],
        )
        for partition, tables in sorted(found.items())
    ]


def validate_run(run_dir: Where) -> RunReport:
    run_dir = resolve_run(run_dir)
    report = RunReport(path=run_dir)
    try:
        meta = read_run_json(run_dir)
    except TraceSchemaError as err:
        report.violations.append(Violation(str(run_dir / RUN_JSON), err.field, _reason(err)))
        return report
    report.status = meta["status"]
    n = meta["num_speculative_tokens"]
    granularity = run_granularity(meta)
    if is_partitioned(run_dir):
        _check_runs_row(run_dir, report)

    # an object store commits a part in one PUT: only a disk can hold a leftover
    homes = run_tables(run_dir, tuple(ALL_TABLES)) if run_dir.is_local else []
    leftovers = sorted(t for home in homes for t in Path(home).rglob(f".*{TEMP_SUFFIX}"))
    for tmp in leftovers:
        if report.complete:
            report.violations.append(
                Violation(
                    str(tmp),
                    None,
                    "leftover temporary part in a run marked complete; delete it "
                    "(readers ignore it) or re-collect the run",
                )
            )

    frames: dict[str, pd.DataFrame] = {}
    for table in ALL_TABLES:
        if table in AGGREGATE_TABLES and not table_location(run_dir, table).is_dir():
            frames[table] = _empty_frame(table)
            continue  # a token-level run has no aggregate tables at all
        frames[table] = _load_table(run_dir, meta, table, report)
        report.rows[table] = len(frames[table])
    if report.violations:
        return report  # invariants are meaningless over unreadable parts
    # a complete run's run.json counts what its parts hold (a killed writer's may lag the
    # parts it wrote after its last run.json: incomplete, not corrupt)
    if report.complete:
        recorded = meta.get("rows") or {}
        for table, count in report.rows.items():
            if int(recorded.get(table, 0)) != count:
                report.violations.append(
                    Violation(
                        str(run_dir / RUN_JSON),
                        f"rows.{table}",
                        f"run.json records {int(recorded.get(table, 0))} {table} rows; its "
                        f"current parts hold {count}",
                    )
                )

    steps, positions, requests = frames["steps"], frames["positions"], frames["requests"]
    if granularity == "token":
        if report.complete and steps.empty:
            report.violations.append(
                Violation(str(run_dir / "steps"), None, "run is marked complete but has no steps")
            )
            return report
    elif not _check_granularity(run_dir, granularity, frames, report):
        return report
    _check_positions(positions, n, report)
    # a writer that dropped whole flushes while its store was away leaves gaps in requests
    _check_steps(
        steps,
        positions,
        n,
        report,
        gaps_allowed=bool(meta.get("dropped")),
        # a writer killed between a flush's steps part and its positions part leaves steps
        # without their positions: only a complete run must hold every one
        positions_required=granularity == "token" and report.complete,
    )
    if report.complete and not steps.empty:
        _check_requests(steps, requests, report)
    _check_counters(frames["counters"], n, granularity, report)
    _check_totals(frames["totals"], frames["counters"], granularity, report)
    _check_calibration(frames["calibration"], n, report)
    return report


def _check_runs_row(run_dir: Location, report: RunReport) -> None:
    """The runs table's row of a run in the table layout: there (an engine reading
    ``<store>/runs`` lists the run from it), with the status run.json's writer wrote."""
    row = table_location(run_dir, RUNS_TABLE) / RUNS_ROW
    if not row.is_file():
        report.violations.append(
            Violation(str(row), None, "the runs table has no row for this run")
        )
        return
    written = read_run_json(run_dir, derive_status=False, joined=False)["status"]
    (status,) = pq.read_table(row.path, filesystem=row.fs, columns=["status"])["status"].to_pylist()
    if status != written:
        report.violations.append(
            Violation(str(row), "status", f"the runs table says {status!r}; run.json {written!r}")
        )


def _check_granularity(
    run_dir: Location, granularity: str, frames: dict[str, pd.DataFrame], report: RunReport
) -> bool:
    """A run without token-level rows holds what its granularity says; False: stop here."""
    if not frames["positions"].empty:
        report.violations.append(
            Violation(
                str(run_dir / "positions"),
                "granularity",
                f"run.json says granularity {granularity!r} but the run has position rows; "
                "a run with drafted tokens is a 'token' run",
            )
        )
        return False
    if granularity == "step":
        if report.complete and frames["steps"].empty:
            report.violations.append(
                Violation(
                    str(run_dir / "steps"),
                    None,
                    "run is marked complete (granularity 'step') but has no steps",
                )
            )
            return False
        return True
    if not frames["steps"].empty:
        report.violations.append(
            Violation(
                str(run_dir / "steps"),
                "granularity",
                f"run.json says granularity {granularity!r} but the run has step rows; a "
                "run with per-step counts is a 'step' run",
            )
        )
        return False
    if report.complete and frames["counters"].empty and frames["totals"].empty:
        report.violations.append(
            Violation(
                str(run_dir / "counters"),
                None,
                f"run is marked complete (granularity {granularity!r}) but holds no counters "
                "or totals rows",
            )
        )
        return False
    return True


def _empty_frame(table: str) -> pd.DataFrame:
    frame = ALL_TABLES[table].empty_table().to_pandas()
    frame["_file"] = pd.Series(dtype=str)
    frame["_row"] = pd.Series(dtype="int64")
    return frame


def _check_scopes(frame: pd.DataFrame, granularity: str, report: RunReport, table: str) -> None:
    allowed = ALLOWED_SCOPES[granularity]
    _flag(
        report,
        frame[~frame["scope"].isin(list(allowed))],
        "scope",
        "scope {scope!r} is not allowed in a run of granularity "
        + repr(granularity)
        + f" (allowed: {sorted(allowed)}; known scopes: {list(SCOPES)})",
    )
    _flag(
        report,
        frame[(frame["scope"] == "request") & frame["request_id"].isna()],
        "request_id",
        f"a {table} row of scope 'request' has no request_id",
    )
    _flag(
        report,
        frame[(frame["scope"] == "interval") & frame["interval"].isna()],
        "interval",
        f"a {table} row of scope 'interval' has no interval",
    )
    _flag(
        report,
        frame[
            (frame["scope"] == "run") & (frame["request_id"].notna() | frame["interval"].notna())
        ],
        "scope",
        f"a {table} row of scope 'run' names a request or an interval",
    )


def _unit_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a hashable unit key (nulls as empty strings / -1)."""
    return frame.assign(
        _unit=frame["scope"].astype(str)
        + "|"
        + frame["request_id"].fillna("").astype(str)
        + "|"
        + frame["interval"].fillna(-1).astype("int64").astype(str)
    )


def _check_counters(counters: pd.DataFrame, n: int, granularity: str, report: RunReport) -> None:
    if counters.empty:
        return
    _check_scopes(counters, granularity, report, "counters")
    _flag(
        report,
        counters[(counters["position"] < 0) | (counters["position"] >= n)],
        "position",
        "position {position} is outside [0, num_speculative_tokens=" + str(n) + ")",
    )
    frame = _unit_frame(counters)
    _flag(
        report,
        frame[frame.duplicated(["_unit", "position"], keep="first")],
        "position",
        "duplicate (scope, request_id, interval, position) at position {position}",
    )
    _flag_negative(report, frame, ("n_drafted", "n_reached", "n_accepted"))
    _flag(
        report,
        frame[frame["n_accepted"] > frame["n_reached"]],
        "n_accepted",
        "n_accepted {n_accepted} > n_reached {n_reached} at position {position}",
    )
    _flag(
        report,
        frame[frame["n_reached"] > frame["n_drafted"]],
        "n_reached",
        "n_reached {n_reached} > n_drafted {n_drafted} at position {position}",
    )
    for name in ("accept_rate", "survival"):
        _flag(
            report,
            frame[(frame[name] < 0) | (frame[name] > 1)],
            name,
            f"{name} " + "{" + name + "} is outside [0, 1]",
        )
    empty = frame["n_accepted"].isna() & frame["accept_rate"].isna() & frame["survival"].isna()
    _flag(
        report,
        frame[empty],
        "n_accepted",
        "row at position {position} has neither counts (n_accepted) nor rates",
    )
    _flag(
        report,
        frame[frame["n_accepted"].notna() & frame["n_reached"].isna()],
        "n_reached",
        "n_accepted without n_reached at position {position}",
    )
    # prefix-closed acceptance: A_i <= A_{i-1}, R_i <= A_{i-1}, s_i <= s_{i-1}
    ordered = frame.sort_values(["_unit", "position"])
    previous = ordered.groupby("_unit", sort=False).shift(1)
    consecutive = ordered["position"] == previous["position"] + 1
    _flag(
        report,
        ordered[consecutive & (ordered["n_accepted"] > previous["n_accepted"])],
        "n_accepted",
        "n_accepted {n_accepted} at position {position} exceeds the previous position's "
        "(acceptance must be prefix-closed)",
    )
    _flag(
        report,
        ordered[consecutive & (ordered["n_reached"] > previous["n_accepted"])],
        "n_reached",
        "n_reached {n_reached} at position {position} exceeds the drafts that accepted the "
        "previous position",
    )
    _flag(
        report,
        ordered[consecutive & (ordered["survival"] > previous["survival"] + 1e-9)],
        "survival",
        "survival {survival} at position {position} exceeds the previous position's",
    )


def _check_totals(
    totals: pd.DataFrame, counters: pd.DataFrame, granularity: str, report: RunReport
) -> None:
    if totals.empty:
        return
    _check_scopes(totals, granularity, report, "totals")
    frame = _unit_frame(totals)
    _flag(
        report,
        frame[frame.duplicated(["_unit"], keep="first")],
        "scope",
        "duplicate unit (scope {scope}, request_id {request_id}, interval {interval})",
    )
    _flag_negative(
        report,
        frame,
        ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_output_tokens"),
    )
    _flag(
        report,
        frame[frame["num_accepted_tokens"] > frame["num_draft_tokens"]],
        "num_accepted_tokens",
        "num_accepted_tokens {num_accepted_tokens} > num_draft_tokens {num_draft_tokens}",
    )
    _flag(
        report,
        frame[(frame["reported_accept_rate"] < 0) | (frame["reported_accept_rate"] > 1)],
        "reported_accept_rate",
        "reported_accept_rate {reported_accept_rate} is outside [0, 1] (stored as a fraction)",
    )
    _flag(
        report,
        frame[frame["reported_accept_len"] < 0],
        "reported_accept_len",
        "reported_accept_len {reported_accept_len} is negative",
    )
    definition = frame["reported_accept_len_definition"]
    _flag(
        report,
        frame[definition.notna() & ~definition.isin(list(AL_DEFINITIONS))],
        "reported_accept_len_definition",
        "reported_accept_len_definition {reported_accept_len_definition!r} is not one of "
        f"{list(AL_DEFINITIONS)}",
    )
    _flag(
        report,
        frame[frame["reported_accept_len"].notna() & definition.isna()],
        "reported_accept_len_definition",
        "reported_accept_len {reported_accept_len} says nothing of how it was computed",
    )
    _flag(
        report,
        frame[frame["t_end"] < frame["t_start"]],
        "t_end",
        "interval ends ({t_end}) before it starts ({t_start})",
    )
    counted = _unit_frame(counters.dropna(subset=["n_accepted"]))
    if counted.empty:
        return
    sums = counted.groupby("_unit")["n_accepted"].sum().rename("sum_accepted")
    merged = frame.merge(sums, left_on="_unit", right_index=True, how="inner")
    _flag(
        report,
        merged[
            merged["num_accepted_tokens"].notna()
            & (merged["num_accepted_tokens"] != merged["sum_accepted"])
        ],
        "num_accepted_tokens",
        "num_accepted_tokens {num_accepted_tokens} != {sum_accepted}, the sum of the unit's "
        "per-position accepted counts",
    )


def _check_calibration(calibration: pd.DataFrame, n: int, report: RunReport) -> None:
    if calibration.empty:
        return
    _flag(
        report,
        calibration[~calibration["score"].isin(list(CALIBRATION_SCORES))],
        "score",
        "score {score!r} is not one of " + str(list(CALIBRATION_SCORES)),
    )
    _flag(
        report,
        calibration[(calibration["position"] < 0) | (calibration["position"] >= n)],
        "position",
        "position {position} is outside [0, num_speculative_tokens=" + str(n) + ")",
    )
    for name in ("bin_lo", "bin_hi", "pred_mean", "target_mean", "ece", "auroc", "brier"):
        _flag(
            report,
            calibration[(calibration[name] < 0) | (calibration[name] > 1)],
            name,
            f"{name} " + "{" + name + "} is outside [0, 1]",
        )
    _flag(
        report,
        calibration[calibration["count"] < 0],
        "count",
        "count {count} is negative",
    )


def _reason(err: TraceSchemaError) -> str:
    # the error's own text already starts with "file X, field Y: "; keep the reason only
    text = str(err)
    return text.split(": ", 1)[1] if err.path and ": " in text else text


def _load_table(run_dir: Location, meta: dict, table: str, report: RunReport) -> pd.DataFrame:
    pieces = []
    partitioned = is_partitioned(run_dir)
    constants = partition_values(run_dir) if partitioned else {}
    current, others = parts_by_generation(run_dir, table, meta)
    for other in others:
        report.violations.append(
            Violation(
                str(other),
                None,
                "a part of a compaction generation run.json does not name (a compaction in "
                "progress or cut short): dsparklab's readers skip it, SQL reading the table "
                "directory counts it; run `dsparklab compact` on the store again",
            )
        )
    for path in current:
        try:
            check_part_schema(path, table, partitioned=partitioned)
            arrow = pq.read_table(path.path, filesystem=path.fs)
        except TraceSchemaError as err:
            report.violations.append(Violation(str(path), err.field, _reason(err)))
            continue
        except (pa.ArrowInvalid, OSError) as err:
            report.violations.append(Violation(str(path), None, f"unreadable parquet: {err}"))
            continue
        schema = ALL_TABLES[table]
        arrow = with_partition_columns(arrow, table, constants)  # the partition's, if any
        for spec in schema:
            if not spec.nullable and arrow.column(spec.name).null_count:
                first = arrow.column(spec.name).is_null().to_pylist().index(True)
                report.violations.append(
                    Violation(str(path), spec.name, "null in a required column", first)
                )
        frame = arrow.select(schema.names).to_pandas()
        frame["_file"] = str(path)
        frame["_row"] = range(len(frame))
        pieces.append(frame)
    if not pieces:
        return _empty_frame(table)
    return pd.concat(pieces, ignore_index=True)


def _flag_negative(report: RunReport, frame: pd.DataFrame, names: tuple[str, ...]) -> None:
    """Flag the rows where any count in ``names`` is negative, one issue per column."""
    for name in names:
        _flag(report, frame[frame[name] < 0], name, f"{name} " + "{" + name + "} is negative")


def _flag(report: RunReport, bad: pd.DataFrame, field: str, message: str) -> None:
    """Record one violation per offending row (first MAX_LISTED, then a count)."""
    if bad.empty:
        return
    for _, row in bad.head(MAX_LISTED).iterrows():
        text = message.format(**row.to_dict())
        report.violations.append(Violation(row["_file"], field, text, int(row["_row"])))
    if len(bad) > MAX_LISTED:
        report.violations.append(
            Violation(
                bad.iloc[MAX_LISTED]["_file"],
                field,
                f"... and {len(bad) - MAX_LISTED} more rows like the above",
            )
        )


def _check_positions(positions: pd.DataFrame, n: int, report: RunReport) -> None:
    _flag(
        report,
        positions[(positions["position"] < 0) | (positions["position"] >= n)],
        "position",
        "position {position} is outside [0, num_speculative_tokens=" + str(n) + ")",
    )
    key = ["request_id", "step", "position"]
    _flag(
        report,
        positions[positions.duplicated(key, keep="first")],
        "position",
        "duplicate (request_id, step, position) = ({request_id}, {step}, {position})",
    )
    ordered = positions.sort_values(key)
    # prefix-closed: once a position is rejected, no later one in the step is accepted
    closed = ordered.groupby(["request_id", "step"], sort=False)["accepted"].cummin()
    _flag(
        report,
        ordered[ordered["accepted"] & ~closed.astype(bool)],
        "accepted",
        "position {position} of step {step} is accepted after a rejected position "
        "(acceptance must be prefix-closed)",
    )


def _check_steps(
    steps: pd.DataFrame,
    positions: pd.DataFrame,
    n: int,
    report: RunReport,
    *,
    gaps_allowed: bool = False,
    positions_required: bool = True,
) -> None:
    if positions_required:  # a request is recorded whole: a step that drafted has positions
        _flag(
            report,
            _unmatched_steps(steps.loc[steps["num_drafted"] > 0], positions),
            "num_drafted",
            "step {step} of request {request_id} drafted {num_drafted} tokens but the run "
            "has no position row of it",
        )
    _flag(
        report,
        steps[steps.duplicated(["request_id", "step"], keep="first")],
        "step",
        "duplicate (request_id, step) = ({request_id}, {step})",
    )
    _flag(
        report,
        steps[
            (steps["accepted_len"] < 0)
            | (steps["accepted_len"] > steps["num_verified"])
            | (steps["num_verified"] > steps["num_drafted"])
            | (steps["num_drafted"] > n)
        ],
        "accepted_len",
        "need 0 <= accepted_len ({accepted_len}) <= num_verified ({num_verified}) <= "
        "num_drafted ({num_drafted}) <= n=" + str(n),
    )
    emitted = steps["emitted"]
    _flag(
        report,
        steps[emitted.notna() & ((emitted < 0) | (emitted > steps["accepted_len"] + 1))],
        "emitted",
        "need 0 <= emitted ({emitted}) <= accepted_len + 1 ({accepted_len} + 1)",
    )
    per_request = steps.groupby("request_id")["step"].agg(["min", "max", "nunique"])
    gaps = per_request[
        ~gaps_allowed
        & ((per_request["min"] != 0) | (per_request["max"] != per_request["nunique"] - 1))
    ]
    _flag(
        report,
        steps[steps["request_id"].isin(gaps.index)].drop_duplicates("request_id"),
        "step",
        "steps of request {request_id} are not contiguous from 0",
    )

    if positions.empty:
        return
    counted = (
        positions.groupby(["request_id", "step"])
        .agg(n_accepted=("accepted", "sum"), n_positions=("position", "size"))
        .reset_index()
    )
    merged = steps.merge(counted, on=["request_id", "step"], how="inner")
    _flag(
        report,
        merged[merged["accepted_len"] != merged["n_accepted"]],
        "accepted_len",
        "accepted_len {accepted_len} != {n_accepted} accepted positions in step {step}",
    )
    _flag(
        report,
        merged[merged["num_drafted"] != merged["n_positions"]],
        "num_drafted",
        "num_drafted {num_drafted} != {n_positions} position rows in step {step}",
    )
    _flag(
        report,
        _unmatched_steps(positions, steps),
        "step",
        "position row of (request_id, step) = ({request_id}, {step}) has no step row",
    )


def _unmatched_steps(rows: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``rows`` whose (request_id, step) has no row in ``other``."""
    keys = ["request_id", "step"]
    joined = rows.merge(other[keys].drop_duplicates(), on=keys, how="left", indicator=True)
    return joined[joined["_merge"] == "left_only"]


def _check_requests(steps: pd.DataFrame, requests: pd.DataFrame, report: RunReport) -> None:
    missing = steps[~steps["request_id"].isin(requests["request_id"])]
    _flag(
        report,
        missing.drop_duplicates("request_id"),
        "request_id",
        "request {request_id} has steps but no requests row",
    )
    # a request's steps add up to its output: the prefill's token, any re-prefill's after a
    # preemption (rows.resumed_tokens), then what each step emitted
    timed = steps[steps["emitted"].notna()].sort_values(["request_id", "step"])
    counted = timed.groupby("request_id")["emitted"].sum()
    outputs = requests[requests["output_token_ids"].notna()].drop_duplicates("request_id")
    if outputs.empty or counted.empty:
        return
    context = timed["context_len"].astype(np.float64)  # NaN where not known
    resumed = {
        request_id: resumed_tokens(group.tolist(), timed.loc[group.index, "accepted_len"].tolist())
        for request_id, group in context.groupby(timed["request_id"], sort=False)
    }
    outputs = outputs.assign(
        n_output=outputs["output_token_ids"].map(len).astype(np.int64),
        n_emitted=outputs["request_id"].map(counted).astype(np.float64),
        n_resumed=outputs["request_id"].map(resumed).fillna(0).astype(np.int64),
    )
    outputs = outputs[outputs["n_emitted"].notna() & (outputs["n_output"] > 0)]
    _flag(
        report,
        outputs[outputs["n_emitted"] + outputs["n_resumed"] + 1 != outputs["n_output"]],
        "emitted",
        "request {request_id}: its steps emitted {n_emitted:.0f} tokens after the prefill's "
        "({n_resumed} more from re-prefills), but its output holds {n_output} "
        "(need 1 + re-prefilled + sum of emitted = output length)",
    )
