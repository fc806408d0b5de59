"""Check run directories against the trace contract and its invariants.

Unlike the readers, which stop at the first problem, validation reports every violation
it finds, each with the file, row and field, so a broken run can be repaired or
discarded knowingly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dsparklab.errors import TraceSchemaError
from dsparklab.store.reader import check_part_schema, find_runs, part_files, read_run_json
from dsparklab.store.schema import RUN_JSON, TABLES, TEMP_SUFFIX

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
    path: Path
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


def validate_trace(root: Path | str) -> list[RunReport]:
    """Validate one run or every run below ``root``."""
    return [validate_run(run_dir) for run_dir in find_runs(root)]


def validate_run(run_dir: Path | str) -> RunReport:
    run_dir = Path(run_dir)
    report = RunReport(path=run_dir)
    try:
        meta = read_run_json(run_dir)
    except TraceSchemaError as err:
        report.violations.append(Violation(str(run_dir / RUN_JSON), err.field, _reason(err)))
        return report
    report.status = meta["status"]
    n = meta["num_speculative_tokens"]

    for tmp in sorted(run_dir.rglob(f"*{TEMP_SUFFIX}")):
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
    for table in TABLES:
        frames[table] = _load_table(run_dir, table, report)
        report.rows[table] = len(frames[table])
    if report.violations:
        return report  # invariants are meaningless over unreadable parts

    steps, positions, requests = frames["steps"], frames["positions"], frames["requests"]
    if report.complete and steps.empty:
        report.violations.append(
            Violation(str(run_dir / "steps"), None, "run is marked complete but has no steps")
        )
        return report
    _check_positions(positions, n, report)
    _check_steps(steps, positions, n, report)
    if report.complete:
        _check_requests(steps, requests, report)
    return report


def _reason(err: TraceSchemaError) -> str:
    # the error's own text already starts with "file X, field Y: "; keep the reason only
    text = str(err)
    return text.split(": ", 1)[1] if err.path and ": " in text else text


def _load_table(run_dir: Path, table: str, report: RunReport) -> pd.DataFrame:
    pieces = []
    for path in part_files(run_dir, table):
        try:
            check_part_schema(path, table)
            arrow = pq.read_table(path)
        except TraceSchemaError as err:
            report.violations.append(Violation(str(path), err.field, _reason(err)))
            continue
        except (pa.ArrowInvalid, OSError) as err:
            report.violations.append(Violation(str(path), None, f"unreadable parquet: {err}"))
            continue
        schema = TABLES[table]
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
        frame = TABLES[table].empty_table().to_pandas()
        frame["_file"] = pd.Series(dtype=str)
        frame["_row"] = pd.Series(dtype="int64")
        return frame
    return pd.concat(pieces, ignore_index=True)


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


def _check_steps(steps: pd.DataFrame, positions: pd.DataFrame, n: int, report: RunReport) -> None:
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
    per_request = steps.groupby("request_id")["step"].agg(["min", "max", "nunique"])
    gaps = per_request[
        (per_request["min"] != 0) | (per_request["max"] != per_request["nunique"] - 1)
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
    orphans = positions.merge(
        steps[["request_id", "step"]].drop_duplicates(),
        on=["request_id", "step"],
        how="left",
        indicator=True,
    )
    _flag(
        report,
        orphans[orphans["_merge"] == "left_only"],
        "step",
        "position row of (request_id, step) = ({request_id}, {step}) has no step row",
    )


def _check_requests(steps: pd.DataFrame, requests: pd.DataFrame, report: RunReport) -> None:
    missing = steps[~steps["request_id"].isin(requests["request_id"])]
    _flag(
        report,
        missing.drop_duplicates("request_id"),
        "request_id",
        "request {request_id} has steps but no requests row",
    )
