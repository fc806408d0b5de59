"""`dsparklab migrate`: schema 1 runs gain the steps' emitted tokens, derived exactly from
their outputs; a killed migration finishes on the next run; an underivable run is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dsparklab.cli.app import app
from dsparklab.errors import TraceSchemaError
from dsparklab.store import read_trace, validate_trace
from dsparklab.store.migrate import migrate_run
from dsparklab.store.rows import emitted_tokens
from dsparklab.store.schema import SCHEMA_VERSION_KEY
from tests.conftest import as_old_layout, make_run_json, write_run


def _as_schema_1(run: Path, *, cut: int = 0) -> None:
    """Rewrite a run as schema 1 wrote it: no emitted column, version 1 stamps; ``cut``
    tokens fewer in the output (the last step's tokens cut at max_new_tokens)."""
    for part in run.rglob("part-*.parquet"):
        table = pq.read_table(part)
        if "emitted" in table.column_names:
            table = table.drop_columns(["emitted"])
        if part.parent.name == "requests" and cut:
            ids = [row[:-cut] for row in table["output_token_ids"].to_pylist()]
            index = table.schema.get_field_index("output_token_ids")
            table = table.set_column(
                index, table.schema.field(index), pa.array(ids, table.schema.field(index).type)
            )
        meta = dict(table.schema.metadata or {})
        meta[SCHEMA_VERSION_KEY] = b"1"
        pq.write_table(table.replace_schema_metadata(meta), part)
    meta_path = run / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["schema_version"] = 1
    meta_path.write_text(json.dumps(meta))


def _old_run(tmp_path: Path, run_dir: Path, accepted: tuple[int, ...]) -> Path:
    """A run as dsparklab wrote it before the table layout (schema 1 ran only there)."""
    written = write_run(tmp_path / f"scratch-{run_dir.name}", accepted, meta=make_run_json())
    return as_old_layout(written, run_dir)


def test_schema_1_runs_are_refused_then_migrated_exactly(tmp_path: Path):
    run = _old_run(tmp_path, tmp_path / "runs" / "run", (3, 1, 0, 2))
    _as_schema_1(run, cut=2)
    with pytest.raises(TraceSchemaError, match="dsparklab migrate"):
        read_trace(run, "steps")
    result = CliRunner().invoke(app, ["migrate", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "1 runs: 1 migrated, 0 current" in result.output
    steps = read_trace(run, "steps").sort_values("step")
    # 11 output tokens cut to 9: 1 (prefill) + 4 + 2 + 1 + 1 of the last step's 3
    assert steps["emitted"].tolist() == [4, 2, 1, 1] == emitted_tokens([3, 1, 0, 2], 9)
    (report,) = validate_trace(run)
    assert report.ok, [str(v) for v in report.violations]
    assert migrate_run(run) == "current"
    assert read_trace(run, "positions")["accepted"].sum() == 6, "other tables kept"


def test_a_killed_migration_finishes_and_an_underivable_run_is_refused(tmp_path: Path):
    run = _old_run(tmp_path, tmp_path / "run", (2, 2))
    _as_schema_1(run)
    # killed between the two renames of the steps table
    (run / "steps").rename(run / ".steps.old")
    (run / ".steps.v2").mkdir()
    for part in (run / ".steps.old").glob("*.parquet"):
        table = pq.read_table(part)
        table = table.append_column("emitted", pa.array([3] * table.num_rows, pa.int32()))
        pq.write_table(table, run / ".steps.v2" / part.name)
    assert migrate_run(run) == "migrated"
    assert not (run / ".steps.old").exists() and not (run / ".steps.v2").exists()
    assert read_trace(run, "steps")["emitted"].tolist() == [3, 3]

    bare = _old_run(tmp_path, tmp_path / "bare", (1,))
    _as_schema_1(bare)
    for part in (bare / "requests").glob("*.parquet"):
        part.unlink()
    with pytest.raises(TraceSchemaError, match="cannot derive emitted tokens exactly") as err:
        migrate_run(bare)
    assert "field 'output_token_ids'" in str(err.value)
    assert json.loads((bare / "run.json").read_text())["schema_version"] == 1, "left as it was"
