"""Malformed runs: every one gives a typed, one-line error naming the file and field.

Each case breaks a good run in one way. `validate_trace` must report it (file + field in the
message), the `dsparklab validate` CLI must print one line per violation and exit 2 without a
traceback, and (for breaks the readers can see) `read_trace` raises TraceSchemaError.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dsparklab.errors import TraceSchemaError
from dsparklab.store import read_trace, validate_trace
from dsparklab.store.layout import store_of, table_location
from dsparklab.store.location import Location
from tests.conftest import make_run_json, write_run


def _rewrite(part: Path, edit: Callable[[pa.Table], pa.Table], *, keep_meta: bool = True) -> None:
    table = pq.read_table(part)
    meta = table.schema.metadata
    table = edit(table)
    if keep_meta:
        table = table.replace_schema_metadata(meta)
    pq.write_table(table, part)


def _table(run: Path, table: str) -> Path:
    return Path(table_location(run, table).path)


def _first(run: Path, table: str) -> Path:
    return sorted(_table(run, table).glob("part-*.parquet"))[0]


def _set_column(table: pa.Table, name: str, values: list) -> pa.Table:
    # nullable, as a foreign writer would declare it, so nulls can be written at all
    spec = table.schema.field(name).with_nullable(True)
    index = table.schema.get_field_index(name)
    return table.set_column(index, spec, pa.array(values, spec.type))


def _edit_json(run: Path, edit: Callable[[dict], None]) -> None:
    meta = json.loads((run / "run.json").read_text())
    edit(meta)
    (run / "run.json").write_text(json.dumps(meta))


def missing_run_json(run: Path) -> tuple[str, str | None]:
    (run / "run.json").unlink()
    return "run.json", None


def invalid_json(run: Path) -> tuple[str, str | None]:
    (run / "run.json").write_text('{"schema_version": 1,')
    return "run.json", None


def missing_field(run: Path) -> tuple[str, str | None]:
    _edit_json(run, lambda m: m.pop("method"))
    return "run.json", "method"


def wrong_field_type(run: Path) -> tuple[str, str | None]:
    _edit_json(run, lambda m: m.update(num_speculative_tokens="3"))
    return "run.json", "num_speculative_tokens"


def wrong_nested_field_type(run: Path) -> tuple[str, str | None]:
    """A value the readers join onto every row, of the wrong type (here the sampling
    temperature as a word): refused by name, never a float() traceback."""
    _edit_json(run, lambda m: m["sampling"].update(temperature="hot"))
    return "run.json", "sampling.temperature"


def wrong_run_version(run: Path) -> tuple[str, str | None]:
    _edit_json(run, lambda m: m.update(schema_version=99))
    return "run.json", "schema_version"


def unknown_status(run: Path) -> tuple[str, str | None]:
    _edit_json(run, lambda m: m.update(status="done"))
    return "run.json", "status"


def truncated_part(run: Path) -> tuple[str, str | None]:
    part = _first(run, "positions")
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    return part.name, None


def leftover_temp_part(run: Path) -> tuple[str, str | None]:
    (_table(run, "steps") / ".part-00009.parquet.tmp").write_bytes(b"PAR1 half")
    return ".part-00009.parquet.tmp", None


def wrong_part_version(run: Path) -> tuple[str, str | None]:
    part = _first(run, "steps")
    table = pq.read_table(part)
    meta = dict(table.schema.metadata)
    meta[b"dsparklab.schema_version"] = b"7"
    pq.write_table(table.replace_schema_metadata(meta), part)
    return part.name, "schema_version"


def unversioned_part(run: Path) -> tuple[str, str | None]:
    part = _first(run, "steps")
    pq.write_table(pq.read_table(part).replace_schema_metadata(None), part)
    return part.name, "schema_version"


def missing_column(run: Path) -> tuple[str, str | None]:
    part = _first(run, "positions")
    _rewrite(part, lambda t: t.drop_columns(["accepted"]))
    return part.name, "accepted"


def wrong_dtype(run: Path) -> tuple[str, str | None]:
    part = _first(run, "steps")
    _rewrite(
        part,
        lambda t: t.set_column(
            t.schema.get_field_index("accepted_len"),
            "accepted_len",
            pc.cast(t["accepted_len"], pa.float64()),
        ),
    )
    return part.name, "accepted_len"


def not_prefix_closed(run: Path) -> tuple[str, str | None]:
    part = _first(run, "positions")  # step 0 accepts all three; reject position 1 only
    _rewrite(
        part,
        lambda t: _set_column(
            t,
            "accepted",
            [
                not (s == 0 and p == 1) and a
                for s, p, a in zip(
                    t["step"].to_pylist(),
                    t["position"].to_pylist(),
                    t["accepted"].to_pylist(),
                    strict=True,
                )
            ],
        ),
    )
    return part.name, "accepted"


def duplicate_rows(run: Path) -> tuple[str, str | None]:
    part = _first(run, "positions")
    _rewrite(part, lambda t: pa.concat_tables([t, t.slice(0, 1)]))
    return part.name, "position"


def position_out_of_range(run: Path) -> tuple[str, str | None]:
    part = _first(run, "positions")
    _rewrite(part, lambda t: _set_column(t, "position", [p + 1 for p in t["position"].to_pylist()]))
    return part.name, "position"


def position_without_step_row(run: Path) -> tuple[str, str | None]:
    part = _first(run, "positions")  # the last row names a step the run never took
    _rewrite(part, lambda t: _set_column(t, "step", t["step"].to_pylist()[:-1] + [999]))
    return part.name, "step"


def empty_run(run: Path) -> tuple[str, str | None]:
    for part in _table(run, "steps").glob("*.parquet"):
        part.unlink()
    for part in _table(run, "positions").glob("*.parquet"):
        part.unlink()
    return "steps", None


def accepted_len_mismatch(run: Path) -> tuple[str, str | None]:
    part = _first(run, "steps")
    _rewrite(part, lambda t: _set_column(t, "accepted_len", [0] * len(t)))
    return part.name, "accepted_len"


def steps_not_contiguous(run: Path) -> tuple[str, str | None]:
    for part in _table(run, "steps").glob("*.parquet"):
        _rewrite(part, lambda t: _set_column(t, "step", [s * 2 for s in t["step"].to_pylist()]))
    return "part-", "step"


def null_in_required_column(run: Path) -> tuple[str, str | None]:
    part = _first(run, "positions")
    _rewrite(
        part, lambda t: _set_column(t, "draft_token", [None] + t["draft_token"].to_pylist()[1:])
    )
    return part.name, "draft_token"


def missing_request_row(run: Path) -> tuple[str, str | None]:
    for part in _table(run, "requests").glob("*.parquet"):
        part.unlink()
    return "part-", "request_id"


def emitted_beyond_the_output(run: Path) -> tuple[str, str | None]:
    """Steps that claim more tokens than the request's output holds (the step-count bias
    the emitted column exists to remove): validate names the requests part and field."""
    part = _first(run, "requests")
    _rewrite(part, lambda t: _set_column(t, "output_token_ids", [[4, 5]] * len(t)))
    return part.name, "emitted"


def emitted_above_accepted(run: Path) -> tuple[str, str | None]:
    part = _first(run, "steps")
    _rewrite(
        part, lambda t: _set_column(t, "emitted", [a + 2 for a in t["accepted_len"].to_pylist()])
    )
    return part.name, "emitted"


# Breaks of the file format itself, which readers must refuse too ...
FORMAT_BREAKS = [
    missing_run_json,
    invalid_json,
    missing_field,
    wrong_field_type,
    wrong_nested_field_type,
    wrong_run_version,
    unknown_status,
    truncated_part,
    wrong_part_version,
    unversioned_part,
    missing_column,
    wrong_dtype,
]
# ... and breaks readers load past (invariants, or a temp file they never list): validate's job.
INVARIANT_BREAKS = [
    leftover_temp_part,
    not_prefix_closed,
    duplicate_rows,
    position_out_of_range,
    position_without_step_row,
    empty_run,
    accepted_len_mismatch,
    steps_not_contiguous,
    null_in_required_column,
    missing_request_row,
    emitted_beyond_the_output,
    emitted_above_accepted,
]
CASES = FORMAT_BREAKS + INVARIANT_BREAKS


@pytest.fixture(params=CASES, ids=[c.__name__ for c in CASES])
def broken(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[Path, str, str | None, Callable]:
    run = write_run(tmp_path / "run", meta=make_run_json())
    file_hint, field = request.param(run)
    return run, file_hint, field, request.param


def test_validate_reports_file_and_field(broken) -> None:
    run, file_hint, field, _ = broken
    if not (run / "run.json").exists():
        with pytest.raises(TraceSchemaError, match="run.json"):
            validate_trace(run)
        return
    (report,) = validate_trace(run)
    assert not report.ok
    messages = [str(v) for v in report.violations]
    hit = [m for m in messages if file_hint in m and (field is None or repr(field) in m)]
    assert hit, messages
    assert all("\n" not in m for m in messages)


def test_readers_refuse_format_breaks(broken) -> None:
    run, file_hint, field, case = broken
    if case not in FORMAT_BREAKS:
        # an invariant break (or a temp file readers never list): readers load the rows,
        # validate reports the break
        read_trace(run, "positions")
        read_trace(run, "steps")
        return
    with pytest.raises(TraceSchemaError) as info:
        read_trace(run, "positions")
        read_trace(run, "steps")
    message = str(info.value)
    assert file_hint in message
    assert "\n" not in message
    if field is not None:
        assert repr(field) in message


def test_cli_prints_one_line_and_exits_2(broken) -> None:
    run, file_hint, field, _ = broken
    proc = subprocess.run(
        [sys.executable, "-m", "dsparklab.cli.app", "validate", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert file_hint in proc.stdout + proc.stderr


def test_no_data_lost_by_validation(broken) -> None:
    run, *_ = broken
    store = Path(store_of(Location.of(run)).path)  # the run's every table
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    with contextlib.suppress(TraceSchemaError):
        validate_trace(run)
    after = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    assert before == after


def test_missing_path_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dsparklab.cli.app", "validate", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "nope" in proc.stderr


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("engine.name", 5),
        ("target.name", ["a"]),
        ("drafter.name", 5),
        ("tier", 5),
        ("sampling.temperature", True),
        ("load", "x"),
        ("load.concurrency", "four"),
    ],
)
def test_run_json_values_joined_onto_rows_are_typed(
    tmp_path: Path, field: str, value: object
) -> None:
    """Every run.json value the readers join onto rows is checked on read, by its dotted
    name; absent ones are fine (an imported run may not record its load)."""
    run = write_run(tmp_path / "run", meta=make_run_json())
    parent, _, key = field.rpartition(".")

    def edit(meta: dict) -> None:
        holder = meta if not parent else meta.setdefault(parent, {})
        if parent == "load" and not isinstance(holder, dict):
            holder = meta["load"] = {}
        holder[key] = value

    _edit_json(run, edit)
    with pytest.raises(TraceSchemaError) as info:
        read_trace(run, "steps")
    assert repr(field) in str(info.value)
    assert "run.json" in str(info.value)
    (report,) = validate_trace(run)
    assert not report.ok


def test_absent_optional_run_values_read(tmp_path: Path) -> None:
    """Absent optional values read as their defaults: no tier, temperature 0, concurrency
    0 (nothing recorded it)."""
    run = write_run(tmp_path / "run", meta=make_run_json())

    def edit(meta: dict) -> None:
        meta.pop("tier", None)
        meta.pop("load", None)
        meta["sampling"].pop("temperature", None)
        meta["engine"]["name"] = "vllm"

    _edit_json(run, edit)
    steps = read_trace(run, "steps")
    assert len(steps)
    assert (steps["tier"] == "").all() and (steps["temperature"] == 0.0).all()
    assert (steps["concurrency"] == 0).all()
