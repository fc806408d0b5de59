"""What the notebook and browser tests share: the run set and one report built on it.

The run set is real: ``dsparklab collect --engine reference`` output on the zoo's tiny
checkpoints (DSpark, Eagle3 and the target-only baseline, n = 3..7, the code and prose
sets), with small limits. Both test directories import this module by name (their
conftest.py files import the ``runs_dir`` and ``report`` fixtures from here), so the runs
are collected and the report built once per session, whichever xdist worker asks first
(kept in the temp directory the workers share). The checks of an executed notebook's
outputs are here too.
"""

from __future__ import annotations

import functools
import os
import pickle
from pathlib import Path

import nbformat
import pytest
from filelock import FileLock

from dsparklab.lab.notebook import PLOTLY_MIMETYPE
from dsparklab.report import ReportError, ReportResult, build_report

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
METHODS = ("dspark", "eagle3", "none")
NS = (3, 4, 5, 6, 7)
DATASETS = ("humaneval", "prose")
# prompts per set and tokens per prompt: 22 runs in well under a minute on one core
LIMIT = 2
MAX_NEW_TOKENS = 32
ZOO_MODELS = ("tiny-target", "tiny-dspark", "tiny-eagle3")


def require_zoo() -> None:
    """Fail (not skip) when the committed checkpoints are missing, as the engine tests do."""
    from dsparklab.zoo import ZOO_DIR

    missing = [name for name in ZOO_MODELS if not (ZOO_DIR / name / "config.json").is_file()]
    if missing:
        pytest.fail(
            f"zoo checkpoints missing in {ZOO_DIR}: {', '.join(missing)}; run "
            "`dsparklab zoo train --tier tiny` (or point DSPARKLAB_ZOO_DIR at a zoo)"
        )


def shared_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temp directory every xdist worker shares (each worker's base temp
    sits below it), so the run set and the report are made once per session."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@functools.cache
def lab_runs(base: Path) -> Path:
    """The reference engine's runs on the zoo (22 runs), collected once per session: the
    first worker collects, the others wait for it (a file lock) and read them."""
    from dsparklab.engines.plan import CollectOptions
    from dsparklab.engines.reference.collect import collect

    require_zoo()
    out, done = base / "runs", base / "runs.collected"
    with FileLock(base / "runs.lock"):
        if not done.is_file():
            collect(
                CollectOptions(
                    methods=METHODS,
                    ns=NS,
                    datasets=DATASETS,
                    out=out,
                    limit=LIMIT,
                    max_new_tokens=MAX_NEW_TOKENS,
                    threads=1,
                    progress=False,
                )
            )
            done.touch()
    return out


@functools.cache
def built_report(base: Path) -> ReportResult:
    """``dsparklab report`` on :func:`lab_runs`, into ``base/report``, built once per
    session: the first worker builds it, the others read its result back."""
    runs = lab_runs(base)
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
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lab_runs(shared_base(tmp_path_factory))


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
