"""Fixtures of the notebook tests: notebook paths by name, the run set, the built report."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_support import built_report, lab_runs

from dsparklab.report import ReportResult
from dsparklab.report.build import discover_notebooks


@pytest.fixture(scope="session")
def notebooks() -> dict[str, Path]:
    """Short name (``"02_window_scaling"``) -> path of the shipped notebook (notebooks/)."""
    return {path.stem: path for path in discover_notebooks()}


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lab_runs(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    return built_report(tmp_path_factory.getbasetemp())
