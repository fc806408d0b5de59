"""What every importer shares: reading inputs, one-line errors, building and writing runs.

An importer parses every input completely (pure functions from file text to
:class:`ImportedRun` objects) before anything is written, so bad input writes nothing.
:func:`write_runs` then writes each run into a hidden temporary directory through
:class:`dsparklab.store.TraceWriter` and renames it into place.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import dsparklab
from dsparklab.analysis.definitions import Check
from dsparklab.errors import TraceSchemaError
from dsparklab.provenance import hash_path
from dsparklab.store import TraceWriter, new_run_json, read_run_json
from dsparklab.store.schema import RUN_JSON

DEFAULT_DATASET = "imported"
DEFAULT_METHOD = "unknown"


class InputFormatError(TraceSchemaError):
    """An input file an importer cannot read: names the file (and line) and the field."""


# -- inputs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceFile:
    """One input file: its text and identity."""

    path: Path
    text: str
    sha256: str
    size: int

    def provenance(self) -> dict[str, Any]:
        return {"path": str(self.path.resolve()), "sha256": self.sha256, "bytes": self.size}

    def error(
        self, message: str, field: str | None = None, line: int | None = None
    ) -> InputFormatError:
        where = f"{self.path}" if line is None else f"{self.path} line {line}"
        return InputFormatError(message, path=where, field=field)


def read_source(path: Path | str) -> SourceFile:
    """Read a UTF-8 input file; a missing, unreadable or empty one is an InputFormatError."""
    path = Path(path)
    if not path.is_file():
        raise InputFormatError("no such file", path=path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFormatError(
            f"not UTF-8 text ({err.reason} at byte {err.start})", path=path
        ) from err
    if not text.strip():
        raise InputFormatError("the file is empty", path=path)
    return SourceFile(path=path, text=text, sha256=hash_path(path), size=len(data))


@dataclass(frozen=True)
class Record:
    """One JSON value from a file, with the line it started on (None: the whole file)."""

    value: Any
    line: int | None


def json_records(source: SourceFile) -> list[Record]:
    """The JSON values in a file: one document, JSON Lines, or a server-sent-event stream.

    A top-level list is split into its elements; SSE ``data:`` lines are parsed one by one
    (``[DONE]`` skipped). A truncated or malformed value names its line.
    """
    text = source.text.lstrip("\ufeff")
    stripped = text.strip()
    if stripped.startswith("data:"):
        return _sse_records(source, text)
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError as whole:
        lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
        if len(lines) <= 1:
            raise source.error(
                f"invalid JSON ({whole.msg} at line {whole.lineno} column {whole.colno})"
            ) from whole
        records = []
        for number, line in lines:
            try:
                records.append(Record(json.loads(line), number))
            except json.JSONDecodeError as err:
                raise source.error(
                    f"invalid JSON ({err.msg} at column {err.colno}; truncated?)", line=number
                ) from err
        return records
    if isinstance(value, list):
        return [Record(v, None) for v in value]
    return [Record(value, None)]


def _sse_records(source: SourceFile, text: str) -> list[Record]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]" or not payload:
            continue
        try:
            records.append(Record(json.loads(payload), number))
        except json.JSONDecodeError as err:
            raise source.error(
                f"invalid JSON in an event stream ({err.msg}; truncated?)", line=number
            ) from err
    if not records:
        raise source.error("the event stream holds no data events")
    return records


# -- typed field access ---------------------------------------------------------------------
class Fields:
    """Typed access to one JSON object's fields, raising InputFormatError naming the field."""

    def __init__(
        self, source: SourceFile, value: Any, *, prefix: str = "", line: int | None = None
    ):
        if not isinstance(value, Mapping):
            raise source.error(
                f"expected a JSON object, got {type(value).__name__}",
                field=prefix or None,
                line=line,
            )
        self.source, self.value, self.prefix, self.line = source, value, prefix, line

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, message: str) -> InputFormatError:
        return self.source.error(message, field=self.name(key), line=self.line)

    def has(self, key: str) -> bool:
        return key in self.value and self.value[key] is not None

    def sub(self, key: str) -> Fields:
        if not self.has(key):
            raise self.error(key, "required field missing")
        return Fields(self.source, self.value[key], prefix=self.name(key), line=self.line)

    def integer(self, key: str, *, minimum: int = 0, optional: bool = False) -> int | None:
        if not self.has(key):
            if optional:
                return None
            raise self.error(key, "required field missing")
        raw = self.value[key]
        if (
            isinstance(raw, bool)
            or not isinstance(raw, (int, float))
            or (isinstance(raw, float) and (not math.isfinite(raw) or raw != int(raw)))
        ):
            raise self.error(key, f"expected an integer, got {raw!r}")
        if int(raw) < minimum:
            raise self.error(key, f"must be >= {minimum}, got {raw}")
        return int(raw)

    def req_int(self, key: str, *, minimum: int = 0) -> int:
        value = self.integer(key, minimum=minimum)
        assert value is not None
        return value

    def number(
        self,
        key: str,
        *,
        low: float | None = None,
        high: float | None = None,
        optional: bool = False,
    ) -> float | None:
        if not self.has(key):
            if optional:
                return None
            raise self.error(key, "required field missing")
        raw = self.value[key]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise self.error(key, f"expected a finite number, got {raw!r}")
        if (low is not None and raw < low) or (high is not None and raw > high):
            raise self.error(key, f"{raw} is outside [{low}, {high}]")
        return float(raw)

    def req_float(self, key: str, *, low: float | None = None, high: float | None = None) -> float:
        value = self.number(key, low=low, high=high)
        assert value is not None
        return value

    def text(self, key: str, *, optional: bool = True) -> str | None:
        if not self.has(key):
            if optional:
                return None
            raise self.error(key, "required field missing")
        raw = self.value[key]
        if not isinstance(raw, (str, int)) or isinstance(raw, bool):
            raise self.error(key, f"expected a string, got {type(raw).__name__}")
        return str(raw)

    def array(self, key: str, *, optional: bool = False) -> list[Any] | None:
        if not self.has(key):
            if optional:
                return None
            raise self.error(key, "required field missing")
        raw = self.value[key]
        if not isinstance(raw, list):
            raise self.error(key, f"expected a list, got {type(raw).__name__}")
        return raw

    def numbers(
        self,
        key: str,
        *,
        optional: bool = False,
        allow_null: bool = False,
        low: float | None = 0.0,
        high: float | None = None,
    ) -> list[float] | None:
        """A list of finite numbers (nulls as NaN when ``allow_null``)."""
        raw = self.array(key, optional=optional)
        if raw is None:
            return None
        out = []
        for index, item in enumerate(raw):
            if item is None and allow_null:
                out.append(math.nan)
                continue
            if (
                isinstance(item, bool)
                or not isinstance(item, (int, float))
                or not math.isfinite(item)
            ):
                raise self.error(f"{key}[{index}]", f"expected a finite number, got {item!r}")
            if (low is not None and item < low) or (high is not None and item > high):
                raise self.error(f"{key}[{index}]", f"{item} is outside [{low}, {high}]")
            out.append(float(item))
        return out

    def counts(self, key: str, *, optional: bool = False) -> list[int] | None:
        """A list of non-negative integers."""
        values = self.numbers(key, optional=optional)
        if values is None:
            return None
        for index, v in enumerate(values):
            if v != int(v):
                raise self.error(f"{key}[{index}]", f"expected an integer count, got {v}")
        return [int(v) for v in values]

    def mapping(self, key: str, *, optional: bool = False) -> Mapping[str, Any] | None:
        if not self.has(key):
            if optional:
                return None
            raise self.error(key, "required field missing")
        raw = self.value[key]
        if not isinstance(raw, Mapping):
            raise self.error(key, f"expected an object, got {type(raw).__name__}")
        return raw


# -- runs -------------------------------------------------------------------------------------
@dataclass
class Options:
    """What the user said about the data (``--dataset --method --n``); None: infer."""

    dataset: str | None = None
    method: str | None = None
    n: int | None = None


@dataclass
class ImportedRun:
    """One run an importer built from its inputs, ready to write."""

    fmt: str
    sources: Sequence[SourceFile]
    granularity: str
    n: int
    method: str
    dataset: str
    engine: dict[str, Any]
    target: dict[str, Any]
    drafter: dict[str, Any] | None
    sampling: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reported: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    part: str = ""  # distinguishes several runs from one set of inputs

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for s in self.sources:
            h.update(s.sha256.encode())
        h.update(f"{self.fmt}|{self.part}|{self.n}|{self.method}|{self.dataset}".encode())
        return h.hexdigest()[:8]

    @property
    def name(self) -> str:
        """``<dataset>/<method>-n<n>-<format>-<digest>``: the run's directory below ``--out``."""
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.dataset) or "imported"
        method = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.method)
        return f"{safe}/{method}-n{self.n}-{self.fmt}-{self.digest}"

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.equal]

    def run_json(self) -> dict[str, Any]:
        return new_run_json(
            run_id=f"import/{self.fmt}/{self.name}",
            engine=self.engine,
            method=self.method,
            num_speculative_tokens=self.n,
            target=self.target,
            drafter=self.drafter,
            dataset=self.dataset,
            sampling=self.sampling,
            granularity=self.granularity,
            tier="imported",
            source={
                "format": self.fmt,
                "files": [s.provenance() for s in self.sources],
                "part": self.part or None,
                "reported": self.reported,
                "notes": self.notes,
            },
            checks={
                "reported_vs_computed": [c.as_dict() for c in self.checks],
                "all_equal": not self.failed_checks,
            },
            dsparklab_version=dsparklab.__version__,
        )


@dataclass
class WriteResult:
    written: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)


def write_runs(
    runs: Sequence[ImportedRun], out: Path | str, *, overwrite: bool = False
) -> WriteResult:
    """Write every run below ``out`` (skipping complete runs already there)."""
    out = Path(out)
    result = WriteResult()
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputFormatError(
            f"two inputs would make the same run {dup!r}; import them separately"
        )
    for run in runs:
        final = out / run.name
        if (final / RUN_JSON).is_file() and not overwrite:
            try:
                if read_run_json(final)["status"] == "complete":
                    result.skipped.append(final)
                    continue
            except TraceSchemaError:
                pass
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            with TraceWriter(tmp, run.run_json()) as writer:
                for table, rows in run.tables.items():
                    if rows:
                        writer.add_many(table, rows)
            if final.exists():
                shutil.rmtree(final)
            tmp.replace(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        result.written.append(final)
    return result


def reason(err: Exception) -> str:
    """An error's message without a leading ``<field>: `` (the caller names the field)."""
    text = str(err)
    head, sep, rest = text.partition(": ")
    return rest if sep and " " not in head.strip() else text


def positive_int_option(value: int | None, name: str) -> int | None:
    if value is not None and value < 1:
        raise InputFormatError(f"--{name} must be >= 1, got {value}")
    return value


def counter_row(
    position: int,
    *,
    scope: str = "run",
    request_id: str | None = None,
    interval: int | None = None,
    n_drafted: int | None = None,
    n_reached: int | None = None,
    n_accepted: int | None = None,
    accept_rate: float | None = None,
    survival: float | None = None,
) -> dict[str, Any]:
    """One ``counters`` row (every column present; NaN rates stored as null)."""
    return {
        "scope": scope,
        "request_id": request_id,
        "interval": interval,
        "position": int(position),
        "n_drafted": None if n_drafted is None else int(n_drafted),
        "n_reached": None if n_reached is None else int(n_reached),
        "n_accepted": None if n_accepted is None else int(n_accepted),
        "accept_rate": _finite(accept_rate),
        "survival": _finite(survival),
    }


def totals_row(
    *,
    scope: str = "run",
    request_id: str | None = None,
    interval: int | None = None,
    t_start: float | None = None,
    t_end: float | None = None,
    num_drafts: int | None = None,
    num_draft_tokens: int | None = None,
    num_accepted_tokens: int | None = None,
    num_output_tokens: int | None = None,
    reported_accept_len: float | None = None,
    reported_accept_len_definition: str | None = None,
    reported_accept_rate: float | None = None,
) -> dict[str, Any]:
    """One ``totals`` row (every column present)."""
    return {
        "scope": scope,
        "request_id": request_id,
        "interval": interval,
        "t_start": t_start,
        "t_end": t_end,
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_accepted_tokens": num_accepted_tokens,
        "num_output_tokens": num_output_tokens,
        "reported_accept_len": _finite(reported_accept_len),
        "reported_accept_len_definition": reported_accept_len_definition,
        "reported_accept_rate": _finite(reported_accept_rate),
    }


def _finite(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def histogram_counter_rows(
    histogram: Sequence[float] | np.ndarray,
    n: int,
    *,
    scope: str = "run",
    request_id: str | None = None,
    drafted_all: bool = False,
) -> list[dict[str, Any]]:
    """Counter rows from :math:`h_j` (``drafted_all``: every draft drafted all n tokens)."""
    from dsparklab.analysis.definitions import counts_from_histogram

    counts = counts_from_histogram(histogram, n)
    drafts = int(round(float(sum(histogram))))
    return [
        counter_row(
            int(row.position),
            scope=scope,
            request_id=request_id,
            n_drafted=drafts if drafted_all else None,
            n_reached=int(row.n_reached),
            n_accepted=int(row.n_accepted),
        )
        for row in counts.itertuples(index=False)
    ]
