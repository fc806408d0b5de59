"""The README's Python quickstart runs as written: a trace, an analysis function, a figure."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def quickstart() -> str:
    """The one ``python`` block of the README's "Quickstart (Python)" section."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## Quickstart (Python)")[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("\n## ")[0], flags=re.S)
    return code


def test_quickstart_is_three_lines_after_its_imports():
    lines = [line for line in quickstart().splitlines() if line.strip()]
    assert [line.split()[0] for line in lines[:3]] == ["from"] * 3
    assert len(lines) == 6, lines


def test_quickstart_runs_on_the_shipped_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "traces").symlink_to(REPO / "data" / "traces")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(quickstart(), "README.md (quickstart)", "exec"), namespace)
    survival = namespace["survival"]
    assert set(survival["method"]) == {"dspark", "eagle3"}
    assert survival["survival"].between(0, 1).all()
    page = (tmp_path / "survival.html").read_text(encoding="utf-8")
    assert "dspark" in page
    assert "eagle3" in page
