"""Issue 33: failed, running and incomplete runs are kept out of the notebooks and the
findings unless asked for, and named where they are left out."""

from __future__ import annotations

from pathlib import Path

import pytest
from counting_cases import write_store

from dsparklab.errors import ConfigError, MissingInputError
from dsparklab.lab.runs import STATUSES_ENV, load_any_runs, load_runs
from dsparklab.report.findings import compute_findings
from dsparklab.store import Catalog
from dsparklab.store.schema import STATUSES

CRASHED = "ref/gsm8k/dspark-n3-crashed"  # written with status 'failed'


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_store(str(tmp_path_factory.mktemp("statuses") / "store")))


def test_the_lab_reads_complete_runs_and_names_the_others(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"):
        runs = load_runs(store)
    assert CRASHED not in set(runs.runs["run_id"]) | set(runs.steps["run_id"])
    assert list(runs.left_out["run_id"]) == [CRASHED]
    assert f"{CRASHED} (failed)" in caplog.text
    summary = runs.summary()
    assert summary["status"].str.contains("failed (left out)", regex=False).any()
    every = load_runs(store, statuses=STATUSES)
    assert CRASHED in set(every.steps["run_id"]) and every.left_out.empty
    any_runs = load_any_runs(store)
    assert CRASHED not in set(any_runs.runs["run_id"])
    assert list(any_runs.left_out["run_id"]) == [CRASHED]


def test_the_findings_count_no_failed_run_and_say_so(store: Path, tmp_path: Path) -> None:
    findings = compute_findings(Catalog.of(store), tmp_path, n_boot=0)
    notes = [note for note in findings.notes if CRASHED in note]
    assert len(notes) == 1 and "(failed)" in notes[0] and "no finding counts them" in notes[0]


def test_statuses_are_asked_for_by_env_and_a_bad_one_is_one_line(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATUSES_ENV, "complete,failed")
    assert CRASHED in set(load_runs(store).steps["run_id"])
    monkeypatch.setenv(STATUSES_ENV, "failed")
    only = load_runs(store)
    assert set(only.runs["run_id"]) == {CRASHED}
    monkeypatch.setenv(STATUSES_ENV, "running")  # nothing selected is running
    with pytest.raises(MissingInputError, match="left out for their status") as caught:
        load_runs(store)
    assert "\n" not in str(caught.value) and "DSPARKLAB_STATUSES" in str(caught.value)
    monkeypatch.setenv(STATUSES_ENV, "done")
    with pytest.raises(ConfigError, match="unknown status 'done'"):
        load_runs(store)
