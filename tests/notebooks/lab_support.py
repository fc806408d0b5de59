"""What the notebook and browser tests share: one report built on the session's reference
runs (tests/reference_runs.py).

Both test directories import this module by name (their conftest.py files import the
``report`` fixture from here), so the report is built once per session, whichever xdist
worker asks first (kept in the temp directory the workers share). The checks of an
executed notebook's outputs are here too.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import nbformat
import pytest
from filelock import FileLock

from dsparklab.lab.notebook import PLOTLY_MIMETYPE
from dsparklab.report import ReportError, ReportResult, build_report
from tests.reference_runs import reference_runs, shared_base

# Small parameters: the notebooks' point estimates do not depend on them.
TEST_PARAMETERS = {"N_BOOT": 50, "SHIPPED": False, "TIERS": []}
EXPECTED_NOTEBOOKS = (
    "00_explorer",
    "01_acceptance_heatmaps",
    "02_window_scaling",
    "03_confidence_calibration",
    "04_markov_attribution",
    "05_regression_diagnosis",
    "06_imported_and_live",
)


@functools.cache
def built_report(base: Path) -> ReportResult:
    """``dsparklab report`` on the session's reference runs, into ``base/report``, built once per
    session: the first worker builds it, the others read its result back."""
    runs = reference_runs(base)
    result = base / "report.pickle"
    with FileLock(base / "report.lock"):
        if not result.is_file():
            try:
                report = build_report(
                    runs, base / "report", parameters=TEST_PARAMETERS, progress=False
                )
            except ReportError as err:  # every notebook must run: show which one did not
                raise AssertionError(str(err)) from err
            result.write_bytes(pickle.dumps(report))
    return pickle.loads(result.read_bytes())  # noqa: S301 (written above, this session)


@pytest.fixture(scope="session")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    return built_report(shared_base(tmp_path_factory))


def assert_ran_clean(nb: nbformat.NotebookNode) -> None:
    """No cell of the executed notebook has an error output or wrote to stderr."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", output.get("evalue")
            if output.output_type == "stream":
                assert output.name != "stderr", output.text[:500]


def count_figures(nb: nbformat.NotebookNode) -> int:
    """How many Plotly figures the executed notebook shows."""
    return sum(PLOTLY_MIMETYPE in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
