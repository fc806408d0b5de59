"""The project's own docs: links resolve, the trace contract matches the schema, every
metric is documented, and nothing cites a file outside the repository. The how-tos'
command blocks run in tests/docs/test_howtos.py, in order, where each page says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsparklab import analysis
from dsparklab.store.schema import ALL_TABLES, STATUSES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*)$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))}


def _markdown_sources() -> list[tuple[Path, str]]:
    sources = [(p, p.read_text(encoding="utf-8")) for p in [ROOT / "README.md", *PAGES]]
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        sources.append((notebook, text))
    return sources


def test_docs_exist() -> None:
    names = {p.name for p in PAGES}
    assert {
        "index.md",
        "method.md",
        "trace-contract.md",
        "acceptance-definitions.md",
        "metrics.md",
        "vllm-plugin.md",
        "howto-trace-vllm-serve.md",
        "howto-report.md",
        "howto-compare-runs.md",
    } <= names
    indexed = set(LINK.findall((DOCS / "index.md").read_text(encoding="utf-8")))
    assert {p.name for p in PAGES} - {"index.md"} <= indexed, "a page missing from index.md"


@pytest.mark.parametrize("source", _markdown_sources(), ids=lambda s: s[0].name)
def test_relative_links_resolve(source: tuple[Path, str]) -> None:
    path, text = source
    broken = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor}")
        elif not linked.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
    assert not broken, f"{path.name}: {broken}"


def _documented_columns() -> dict[str, list[str]]:
    """Column names per table, from the contract's '## name' / '### name' tables."""
    text = (DOCS / "trace-contract.md").read_text(encoding="utf-8")
    columns: dict[str, list[str]] = {}
    table = None
    for line in text.splitlines():
        heading = re.match(r"^#{2,3}\s+(\w+)\s*$", line)
        if heading:
            table = heading.group(1) if heading.group(1) in ALL_TABLES else None
        elif table and (row := re.match(r"^\| `(\w+)` \| ([\w<>]+) \|", line)):
            columns.setdefault(table, []).append(row.group(1))
    return columns


def test_trace_contract_matches_schema() -> None:
    documented = _documented_columns()
    assert set(documented) == set(ALL_TABLES)
    for table, schema in ALL_TABLES.items():
        assert documented[table] == schema.names, table


def test_trace_contract_types_and_nulls_match_schema() -> None:
    text = (DOCS / "trace-contract.md").read_text(encoding="utf-8")
    for table, schema in ALL_TABLES.items():
        section = re.search(rf"^#{{2,3}} {table}\n(.*?)(?=^#)", text + "\n#", re.M | re.S)
        assert section, table
        rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| (yes|no) \|", section.group(1), re.M)
        for name, type_name, nullable in rows:
            field = schema.field(name)
            expected = str(field.type).replace("list<item: int32>", "list<int32>")
            expected = {"float": "float32", "double": "float64"}.get(expected, expected)
            assert type_name.strip() == expected, (table, name)
            assert (nullable == "yes") == field.nullable, (table, name)


def test_every_public_metric_is_documented() -> None:
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    public = [name for name in analysis.__all__ if name.startswith("compute_")]
    assert public
    missing = [name for name in public if f"`{name}" not in text]
    assert not missing, f"docs/metrics.md does not document {missing}"


def test_nothing_shipped_cites_outside_the_repository() -> None:
    outside = ("DESIGN" + ".md", "../" + "shared")
    shipped = [ROOT / "README.md", *PAGES]
    for folder, pattern in (("dsparklab", "*.py"), ("notebooks", "*.ipynb"), ("tests", "*.py")):
        shipped += sorted((ROOT / folder).rglob(pattern))
    offenders = [
        f"{p.relative_to(ROOT)}: {word}"
        for p in shipped
        for word in outside
        if word in p.read_text(encoding="utf-8")
    ]
    assert not offenders, offenders


def test_every_status_is_documented() -> None:
    text = (DOCS / "trace-contract.md").read_text(encoding="utf-8")
    documented = re.findall(r"^- `(\w+)`: ", text, re.M)
    assert documented == list(STATUSES)


def test_the_plugin_docs_matrix_is_the_patch_table() -> None:
    """docs/vllm-plugin.md's compatibility matrix is generated from the patch table."""
    from dsparklab.engines.vllm.patch_table import compatibility_matrix

    text = (DOCS / "vllm-plugin.md").read_text()
    begin, end = "<!-- patch-table:begin -->\n", "\n<!-- patch-table:end -->"
    shown = text[text.index(begin) + len(begin) : text.index(end)]
    assert shown == compatibility_matrix(), (
        "regenerate the matrix: python -c 'from dsparklab.engines.vllm.patch_table import "
        "compatibility_matrix; print(compatibility_matrix())'"
    )


def test_no_docstring_holds_a_control_character() -> None:
    """A formula in a docstring that is not raw turns ``\\frac`` into a form feed and
    ``\\rfloor`` into a carriage return: every docstring of the package reads as written."""
    import ast

    broken = []
    for path in sorted((ROOT / "dsparklab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False) or ""
                if re.search(r"[\x00-\x08\x0b-\x1f]", doc):
                    broken.append(f"{path.relative_to(ROOT)}: {getattr(node, 'name', 'module')}")
    assert broken == []
