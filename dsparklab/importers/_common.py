"""What every importer shares: reading inputs, one-line errors, building and writing runs.

An importer parses every input completely (pure functions from file text to
:class:`ImportedRun` objects) before anything is written, so bad input writes nothing.
:func:`write_runs` then writes each run through :class:`dsparklab.store.TraceWriter`,
its run.json last, so a run appears whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import dsparklab
from dsparklab.analysis.definitions import Check, check
from dsparklab.errors import DSparkLabError, InputFormatError, input_error
from dsparklab.provenance import hash_path
from dsparklab.store import TraceWriter, new_run_json
from dsparklab.store.layout import run_location
from dsparklab.store.location import Location, Where
from dsparklab.store.reader import complete_run_json
from dsparklab.store.rows import counter_row

DEFAULT_DATASET = "imported"
DEFAULT_METHOD = "unknown"


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
        return input_error(self.path, message, field=field, line=line)


def read_source(path: Path | str) -> SourceFile:
    """Read a UTF-8 input file; a missing, unreadable or empty one is an InputFormatError."""
    path = Path(path)
    if path.is_dir():
        raise InputFormatError("is a directory; name the exported file", path=path)
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


def numbered_records(sources: Sequence[SourceFile]) -> Iterator[tuple[int, SourceFile, Record]]:
    """Every JSON value of every file, numbered across the files (ids for responses without).

    Lazy: a file is parsed once the values before it are used, so errors come in file order.
    """
    index = 0
    for source in sources:
        for record in json_records(source):
            yield index, source, record
            index += 1


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
def is_finite_number(value: Any) -> bool:
    """A finite JSON number (``true`` / ``false`` are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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

    def first_present(self, *names: str) -> str | None:
        """The first of ``names`` (a field and its older spellings) the object has."""
        return next((name for name in names if self.has(name)), None)

    def first_required(self, *names: str) -> str:
        """Like :meth:`first_present`; none of them is an error naming the first."""
        name = self.first_present(*names)
        if name is None:
            raise self.error(names[0], "required field missing")
        return name

    @contextmanager
    def definition_errors(self, key: str) -> Iterator[None]:
        """Re-raise an error of :mod:`dsparklab.analysis.definitions` as one naming ``key``."""
        try:
            yield
        except DSparkLabError as err:
            raise self.error(key, _reason(err)) from err

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
        if not is_finite_number(raw):
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
            if not is_finite_number(item):
                raise self.error(f"{key}[{index}]", f"expected a finite number, got {item!r}")
            if (low is not None and item < low) or (high is not None and item > high):
                raise self.error(f"{key}[{index}]", f"{item} is outside [{low}, {high}]")
            out.append(float(item))
        return out

    def window_rates(
        self, key: str, n: int | None, *, empty: str, allow_null: bool = False
    ) -> list[float]:
        """Rates in [0, 1] by draft position: their count is the window, which ``--n`` must match.

        ``empty`` says why an empty list holds no positions.
        """
        rates = self.numbers(key, allow_null=allow_null, high=1.0)
        assert rates is not None
        if not rates:
            raise self.error(key, f"empty: {empty}")
        if n is not None and n != len(rates):
            raise self.error(key, f"--n {n} but the file has {len(rates)} positions")
        return rates

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

    # for files that do not name them
    @property
    def dataset_or_default(self) -> str:
        return self.dataset or DEFAULT_DATASET

    @property
    def method_or_default(self) -> str:
        return self.method or DEFAULT_METHOD


def imported_engine(name: str, **extra: Any) -> dict[str, Any]:
    """An imported run's ``engine``: the tool that wrote the file (files do not say its version)."""
    return {"name": name, "version": "unknown", "mode": "imported", **extra}


def _unknown_model() -> dict[str, Any]:
    return {"name": "unknown"}


def _unknown_sampling() -> dict[str, Any]:
    return {"temperature": None}


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
    # what most files do not say
    target: dict[str, Any] = field(default_factory=_unknown_model)
    drafter: dict[str, Any] | None = field(default_factory=_unknown_model)
    sampling: dict[str, Any] = field(default_factory=_unknown_sampling)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reported: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    part: str = ""  # distinguishes several runs from one set of inputs
    load: dict[str, Any] | None = None  # run.json's load block, where the file says it

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for s in self.sources:
            h.update(s.sha256.encode())
        h.update(f"{self.fmt}|{self.part}|{self.n}|{self.method}|{self.dataset}".encode())
        return h.hexdigest()[:8]

    @property
    def name(self) -> str:
        """``<dataset>/<method>-n<n>-<format>-<digest>``: the run's name (its run_id is
        ``import/<format>/<name>``)."""
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
            **({} if self.load is None else {"load": self.load}),
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
    written: list[Location] = field(default_factory=list)
    skipped: list[Location] = field(default_factory=list)


def write_runs(runs: Sequence[ImportedRun], out: Where, *, overwrite: bool = False) -> WriteResult:
    """Write every run below ``out`` (skipping complete runs already there)."""
    out = Location.of(out)
    result = WriteResult()
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputFormatError(
            f"two inputs would make the same run {dup!r}; import them separately"
        )
    for run in runs:
        meta = run.run_json()
        final = run_location(out, meta)
        if not overwrite and complete_run_json(final) is not None:
            result.skipped.append(final)
            continue
        # run.json last: the run appears whole or not at all, on a disk or an object store
        with TraceWriter(out, meta, overwrite=True, publish="last") as writer:
            for table, rows in run.tables.items():
                if rows:
                    writer.add_many(table, rows)
        result.written.append(final)
    return result


def _reason(err: Exception) -> str:
    """An error's message without a leading ``<field>: `` (the caller names the field)."""
    text = str(err)
    head, sep, rest = text.partition(": ")
    return rest if sep and " " not in head.strip() else text


def request_id(source: SourceFile, given: Any, index: int, suffix: str = "") -> str:
    """The response's own id, else ``<file name>#<response index>`` (``suffix``: the choice)."""
    if isinstance(given, str) and given:
        return f"{given}{suffix}"
    return f"{source.path.name}#{index}{suffix}"


def worst_check(
    quantity: Callable[[str], str],
    cases: Iterable[tuple[str, float | None, float | None]],
    *,
    definition: str,
    tolerance: float = 1e-9,
) -> list[Check]:
    """The check of the case furthest from its computed value (none: no check).

    ``cases`` are ``(case, reported, computed)``; a case without a computed value is the
    furthest. ``quantity`` names the check from the worst case.
    """
    worst = max(
        cases,
        key=lambda c: math.inf if c[1] is None or c[2] is None else abs(c[1] - c[2]),
        default=None,
    )
    if worst is None:
        return []
    case, reported, computed = worst
    return [check(quantity(case), reported, computed, definition=definition, tolerance=tolerance)]


def largest_difference_check(
    quantity: str,
    reported: Sequence[float] | np.ndarray,
    computed: Sequence[float] | np.ndarray,
    *,
    definition: str,
    tolerance: float,
) -> Check:
    """Two vectors that must agree, as one check: their largest difference (NaNs skipped) vs 0."""
    differences = np.abs(
        np.asarray(reported, dtype=np.float64) - np.asarray(computed, dtype=np.float64)
    )
    largest = float(np.nanmax(differences)) if len(differences) else 0.0
    return check(quantity, largest, 0.0, definition=definition, tolerance=tolerance)


def positive_int_option(value: int | None, name: str) -> int | None:
    if value is not None and value < 1:
        raise InputFormatError(f"--{name} must be >= 1, got {value}")
    return value


def marginal_counter_rows(
    num_drafts: int,
    num_draft_tokens: int,
    accepted_per_pos: Sequence[int] | np.ndarray,
    *,
    scope: str = "run",
    interval: int | None = None,
) -> list[dict[str, Any]]:
    """Counter rows from vLLM's marginal counts :math:`A_i` and drafts :math:`D`.

    :math:`R_0 = D`, :math:`R_i = A_{i-1}`; ``n_drafted`` is :math:`D` when every draft
    drafted all n tokens (``num_draft_tokens = n D``), else unknown (null).
    """
    drafted = num_drafts if num_draft_tokens == len(accepted_per_pos) * num_drafts else None
    return [
        counter_row(
            i,
            scope=scope,
            interval=interval,
            n_drafted=drafted,
            n_reached=num_drafts if i == 0 else accepted_per_pos[i - 1],
            n_accepted=accepted,
        )
        for i, accepted in enumerate(accepted_per_pos)
    ]


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
