"""Fixtures of the browser tests: the built report (chromium and its page fixtures are the
root conftest's: tests/browser_fixtures.py).

The report and the run set are the notebook tests' (tests/notebooks/lab_support.py, built
once per session whichever directory asks first).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))

# the notebook tests' fixtures: the same run set and report
from lab_support import report, runs_dir  # noqa: E402, F401
