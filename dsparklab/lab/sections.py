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


# Nodes that open a scope of their own: the names they bind (a comprehension's targets, a
# function's parameters and locals) are not the cell's, and reading them there reads no
# name of the notebook's.
_SCOPES = (
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.Lambda,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
)


def _scope_locals(node: ast.AST) -> set[str]:
    """The names a scope node binds for itself."""
    if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
        return {
            n.id for gen in node.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)
        }
    assert isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef)
    args = node.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    if not isinstance(node, ast.Lambda):  # a def's assignments are its locals
        names |= {
            n.id
            for stmt in node.body
            for n in ast.walk(stmt)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
    return names


def _cell_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names the cell binds in the notebook's namespace: assignments, imports, defs,
    for/with targets; names it reads from there), leaving out what comprehensions,
    lambdas and defs bind for themselves."""
    bound: set[str] = set()
    read: set[str] = set()

    def visit(node: ast.AST, local: frozenset[str], nested: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if not nested:
                bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if not nested:
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and node.id not in local:
            (bound if isinstance(node.ctx, ast.Store) else read).add(node.id)
        if isinstance(node, _SCOPES):
            local, nested = local | _scope_locals(node), True
        for child in ast.iter_child_nodes(node):
            visit(child, local, nested)

    visit(tree, frozenset(), False)
    return bound, read


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
    bound, read = _cell_names(tree)
    needed = sorted(n for n in read if n in log.unbound and n not in namespace)
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
