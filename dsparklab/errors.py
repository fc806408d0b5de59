"""Typed errors. Messages are one line: what was wrong, in which file and field, how to fix it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


class DSparkLabError(Exception):
    """Base class of every error dsparklab raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        """What IPython (a notebook cell) shows instead of a traceback: the one line."""
        return [f"{type(self).__name__}: {self}"]


class TraceSchemaError(DSparkLabError, ValueError):
    """A trace file breaks the trace contract (see dsparklab/store/schema.py)."""

    def __init__(self, message: str, *, path: object = None, field: str | None = None):
        self.path = str(path) if path is not None else None
        self.field = field
        where = ", ".join(
            part
            for part in (
                f"file {self.path}" if self.path else "",
                f"field {field!r}" if field else "",
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)


def require_columns(frame: Any, columns: Iterable[str], *, what: str, hint: str) -> None:
    """Raise TraceSchemaError naming the first column ``frame`` lacks, the ones it has, and
    ``hint`` (where a frame with that column comes from)."""
    for name in columns:
        if name not in frame.columns:
            raise TraceSchemaError(
                f"{what} needs column {name!r}, which the frame lacks; it has "
                f"{sorted(map(str, frame.columns))} ({hint})",
                field=name,
            )


class MissingInputError(DSparkLabError, ValueError):
    """The runs lack what an analysis needs (a baseline, step timings, confidence scores,
    Markov fields, a second window): nothing is wrong with them, that view just cannot be
    computed. Notebook sections catch it and say so in one line (``%%section``)."""


class UnknownMethodError(DSparkLabError, KeyError):
    """A name (method, metric, dataset...) that no registry knows."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class ProvenanceError(DSparkLabError, ValueError):
    """An input whose origin cannot be established (e.g. a missing model file to hash)."""


class ConfigError(DSparkLabError, ValueError):
    """A configuration value out of range or inconsistent with the models it runs."""


class InputFormatError(TraceSchemaError):
    """An input file an importer cannot read: names the file (and line) and the field."""


def input_error(
    where: Path | str, message: str, *, field: str | None = None, line: int | None = None
) -> InputFormatError:
    """The error for bad input at ``where`` (a file or URL), on ``line`` when known."""
    return InputFormatError(
        message, path=where if line is None else f"{where} line {line}", field=field
    )
