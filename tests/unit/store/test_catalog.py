"""Issue 33, item 1: the catalog lists a store once, answers run.json questions from what it
read, and fingerprints the store without reading its parts."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dsparklab.errors import TraceSchemaError
from dsparklab.lab.runs import load_runs
from dsparklab.report.findings import compute_findings
from dsparklab.store import Catalog, list_runs
from dsparklab.store.location import Location
from tests.notebooks.lab_synth import write_synthetic_run, write_synthetic_runs


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catalog") / "store"
    write_synthetic_runs(root, methods=("dspark", "none"), ns=(3, 5), datasets=("prose",))
    return root


@pytest.fixture
def io_counts(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the store is listed (recursive walks, run.json lookups) and how many
    run.json and parquet files are opened."""
    counts: Counter[str] = Counter()
    walk, find, read_text, read_bytes = (
        Location._walk,
        Location.find,
        Location.read_text,
        Location.read_bytes,
    )

    def counted_walk(self: Location, recursive: bool) -> list:
        counts["walk recursive" if recursive else "walk"] += 1
        return walk(self, recursive)

    def counted_find(self: Location, name: str, **kwargs: Any) -> Iterator[Location]:
        counts[f"find {name}"] += 1
        return find(self, name, **kwargs)

    def counted_read_text(self: Location) -> str:
        counts[f"read {self.name}"] += 1
        return read_text(self)

    def counted_read_bytes(self: Location) -> bytes:
        counts[f"read {self.name.rsplit('.', 1)[-1]}"] += 1
        return read_bytes(self)

    monkeypatch.setattr(Location, "_walk", counted_walk)
    monkeypatch.setattr(Location, "find", counted_find)
    monkeypatch.setattr(Location, "read_text", counted_read_text)
    monkeypatch.setattr(Location, "read_bytes", counted_read_bytes)
    return counts


def test_one_listing_serves_the_runs_their_run_json_and_selections(store: Path) -> None:
    catalog = Catalog.of(store)
    assert sorted(catalog.runs["method"]) == ["dspark", "dspark", "none"]
    assert list(catalog.runs["root"].unique()) == [str(Location.of(store))]
    run = catalog.runs[catalog.runs["n"] == 5].iloc[0]
    by_id, by_path = catalog.run_json(run["run_id"]), catalog.run_json(run["path"])
    assert by_id is by_path and by_id["num_speculative_tokens"] == 5
    with pytest.raises(TraceSchemaError, match="no run 'nope'"):
        catalog.run_json("nope")
    # a dotted run.json path and a list of values, as load_runs(selection=...) takes them
    picked = catalog.matching({"engine.name": "synthetic", "n": [5, 0]})
    assert sorted(catalog.runs.loc[picked, "method"]) == ["dspark", "none"]
    assert catalog.recorded_rows(catalog.runs[picked], "positions") == int(
        by_id["rows"]["positions"]
    )
    assert catalog.only(store).runs.equals(catalog.runs)
    assert list_runs(store).equals(catalog.runs)


def test_the_walk_for_runs_does_not_enter_the_tables(store: Path, monkeypatch) -> None:
    """A table-layout store's table directories hold parquet partitions only (on a store
    of many runs, most of its directories): the walk for run.json skips them."""
    import os

    entered: list[str] = []
    walk = os.walk

    def counted_walk(top: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for found in walk(top, *args, **kwargs):
            entered.append(found[0])
            yield found

    monkeypatch.setattr(os, "walk", counted_walk)
    assert len(Catalog.of(store).runs) == 3
    tables = [
        p for p in entered if Path(p).relative_to(store).parts[:1] in (("steps",), ("positions",))
    ]
    assert entered and tables == []


def test_a_notebooks_reads_list_the_store_once(store: Path, io_counts: Counter[str]) -> None:
    """load_runs, then every request counted for the headlines (acceptance and step
    times): one listing of the store, one read of each run.json."""
    runs = load_runs(store)
    runs.acceptance_counts()
    runs.step_time_counts()
    assert io_counts["find run.json"] == 1, io_counts
    assert io_counts["read run.json"] == 3, io_counts


def test_the_findings_list_each_root_once(
    store: Path, tmp_path: Path, io_counts: Counter[str]
) -> None:
    catalog = Catalog.of(store)
    io_counts.clear()
    findings = compute_findings(catalog, tmp_path, n_boot=0)
    assert len(findings.acceptance)
    assert io_counts["find run.json"] == 0 and io_counts["read run.json"] == 0, io_counts


def test_the_fingerprint_reads_no_part_and_follows_every_change(
    store: Path, tmp_path: Path, io_counts: Counter[str]
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    catalog = Catalog.of(copy)
    io_counts.clear()
    first = catalog.fingerprint()
    assert first.startswith("sha256:") and first == catalog.fingerprint()
    assert io_counts["read parquet"] == 0 and io_counts["walk recursive"] == 2, io_counts

    part = next((copy / "positions").rglob("part-*.parquet"))
    part.write_bytes(part.read_bytes() + b"\0")  # a part grew: its size changed
    assert Catalog.of(copy).fingerprint() != first
    grown = Catalog.of(copy).fingerprint()
    run_json = next((copy / "_runs").rglob("run.json"))
    meta = json.loads(run_json.read_text())
    meta["status"] = "failed"
    run_json.write_text(json.dumps(meta))
    assert Catalog.of(copy).fingerprint() != grown


def test_two_roots_are_listed_apart_and_counted_root_by_root(tmp_path: Path) -> None:
    """The shipped traces may reuse a demo's run_id: within a root a run_id is refused
    twice, across roots each root's runs are counted against their own root."""
    for root in ("a", "b"):
        write_synthetic_run(tmp_path / root, method="dspark", n=3, dataset="prose", tier=root)
    catalog = Catalog.of(tmp_path / "a", tmp_path / "b")
    assert catalog.runs["run_id"].nunique() == 1 and len(catalog.runs) == 2
    assert len(catalog.only(tmp_path / "b").runs) == 1
    assert (
        catalog.only(tmp_path / "b").run_json(catalog.only(tmp_path / "b").runs["path"].iloc[0])[
            "tier"
        ]
        == "b"
    )


def test_the_dataset_of_a_catalog_is_the_dataset_of_its_store(store: Path) -> None:
    from dsparklab.store import table_dataset

    catalog = Catalog.of(store)
    dataset = catalog.dataset("positions")
    assert isinstance(dataset.schema, pa.Schema)
    assert dataset.count_rows() == table_dataset(store, "positions").count_rows()
    assert dataset.count_rows() == catalog.recorded_rows(table="positions")
    assert catalog.table_directory("positions") == Location.of(store) / "positions"
