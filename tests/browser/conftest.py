"""Fixtures of the browser tests: the built report (chromium and its page fixtures are the
root conftest's: tests/browser_fixtures.py).

The report is the notebook tests' (tests/notebooks/lab_support.py), on the session's
reference runs (tests/reference_runs.py); each is made once per session whichever
directory asks first.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))

# the notebook tests' fixtures: the same run set and report
from lab_support import report  # noqa: E402, F401
