"""Fixtures of the notebook tests: notebook paths by name, the run set, the built report."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_support import report  # noqa: F401  (a fixture, shared with tests/browser)

from dsparklab.report.build import discover_notebooks


@pytest.fixture(scope="session")
def notebooks() -> dict[str, Path]:
    """Short name (``"02_window_scaling"``) -> path of the shipped notebook (notebooks/)."""
    return {path.stem: path for path in discover_notebooks()}
