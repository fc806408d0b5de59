"""Notebook sections that say why they were not computed, instead of failing the page.

A cell that starts with ``%%section <title>`` (the magic :func:`dsparklab.lab.display.setup`
registers) runs its body like any cell, except:

- when the body raises :class:`~dsparklab.errors.MissingInputError` (the runs lack a
  baseline, timings, confidence scores, a second window...), the cell shows one line,
  ``<title>: not computed: <reason>``, and the names it would have bound are left unbound
  (restored to what they were before the cell);
- a later section that reads one of those names is not run either: it says which name it
  needs and which section did not compute it, so one missing input never cascades into a
  traceback;
- every section not computed is recorded (``sections_not_computed``), so the report's
  index lists them.

Any other exception is a real error and propagates as usual (the cell fails).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsparklab.errors import MissingInputError

RECORD_NAME = "sections_not_computed"
_UNSET = object()


@dataclass
class SectionLog:
    """What the sections of one kernel session did not compute, and the names they left
    unbound (name -> title of the section that would have bound it)."""

    not_computed: list[dict[str, str]] = field(default_factory=list)
    unbound: dict[str, str] = field(default_factory=dict)

    def skip(self, title: str, reason: str, names: set[str]) -> str:
        self.not_computed = [s for s in self.not_computed if s["section"] != title]
        self.not_computed.append({"section": title, "reason": reason})
        for name in names:
            self.unbound[name] = title
        return f"{title}: not computed: {reason}"

    def computed(self, title: str, names: set[str]) -> None:
        self.not_computed = [s for s in self.not_computed if s["section"] != title]
        for name in names:
            self.unbound.pop(name, None)


def _bound_names(tree: ast.Module) -> set[str]:
    """Names the cell binds at module level (assignments, imports, defs, for/with targets)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _read_names(tree: ast.Module) -> set[str]:
    return {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def run_section(
    title: str,
    source: str,
    namespace: dict[str, Any],
    log: SectionLog,
    *,
    show: Callable[[Any], None],
) -> str | None:
    """Run one section's ``source`` in ``namespace``: None when it was computed, else the
    one line saying why not.

    ``show`` displays the value of a trailing expression, as a notebook cell does.
    """
    title = title.strip() or "section"
    tree = ast.parse(source, filename=f"<section {title}>")
    bound = _bound_names(tree)
    needed = sorted(n for n in _read_names(tree) if n in log.unbound and n not in namespace)
    if needed:
        return log.skip(
            title,
            f"needs `{needed[0]}`, which section '{log.unbound[needed[0]]}' did not compute",
            bound,
        )
    saved = {name: namespace.get(name, _UNSET) for name in bound}
    body, last = tree.body, None
    tail = body[-1] if body else None
    if isinstance(tail, ast.Expr):
        body, last = body[:-1], ast.Expression(tail.value)
    try:
        exec(compile(ast.Module(body, type_ignores=[]), f"<section {title}>", "exec"), namespace)
        value = eval(compile(last, f"<section {title}>", "eval"), namespace) if last else None
    except MissingInputError as err:
        for name, old in saved.items():
            if old is _UNSET:
                namespace.pop(name, None)
            else:
                namespace[name] = old
        return log.skip(title, str(err), {n for n, old in saved.items() if old is _UNSET})
    log.computed(title, bound)
    if value is not None:
        show(value)
    return None
