"""Importers: what inference engines and benchmark harnesses already export, as runs.

``dsparklab import FORMAT PATH... --out DIR`` turns each input into runs at the
granularity the file has (per step, per request, aggregate counters, scrape intervals),
with provenance naming every source file and its hash and, in ``run.json``
(``checks.reported_vs_computed``), every number the file reported next to the one the lab
computes from the file's own counts (:mod:`dsparklab.analysis.definitions`). Bad input
raises :class:`InputFormatError` (one line naming the file and the field) before anything
is written. ``dsparklab watch`` (:mod:`dsparklab.importers.watch`) scrapes a live server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dsparklab.importers._common import (
    ImportedRun,
    InputFormatError,
    Options,
    SourceFile,
    WriteResult,
    positive_int_option,
    read_source,
    write_runs,
)
from dsparklab.importers.deepspec import import_deepspec
from dsparklab.importers.prometheus import import_vllm_metrics
from dsparklab.importers.sglang import import_sglang
from dsparklab.importers.specdec_bench import import_specdec_bench
from dsparklab.importers.vllm_bench import import_vllm_bench
from dsparklab.importers.vllm_request import import_vllm_request

Importer = Callable[[Sequence[SourceFile], Options], list[ImportedRun]]

FORMATS: dict[str, Importer] = {
    "vllm-metrics": import_vllm_metrics,
    "vllm-bench": import_vllm_bench,
    "vllm-request": import_vllm_request,
    "sglang": import_sglang,
    "specdec-bench": import_specdec_bench,
    "deepspec": import_deepspec,
}


def parse_files(
    fmt: str,
    paths: Sequence[Path | str],
    *,
    dataset: str | None = None,
    method: str | None = None,
    n: int | None = None,
) -> list[ImportedRun]:
    """Parse every input of one format into runs (nothing is written)."""
    if fmt not in FORMATS:
        raise InputFormatError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not paths:
        raise InputFormatError(f"{fmt}: no input files given")
    options = Options(dataset=dataset, method=method, n=positive_int_option(n, "n"))
    sources = [read_source(p) for p in paths]
    return FORMATS[fmt](sources, options)


def import_files(
    fmt: str,
    paths: Sequence[Path | str],
    out: Path | str,
    *,
    dataset: str | None = None,
    method: str | None = None,
    n: int | None = None,
    overwrite: bool = False,
) -> tuple[list[ImportedRun], WriteResult]:
    """Parse ``paths`` as ``fmt`` and write the runs below ``out``."""
    runs = parse_files(fmt, paths, dataset=dataset, method=method, n=n)
    return runs, write_runs(runs, out, overwrite=overwrite)


__all__ = [
    "FORMATS",
    "ImportedRun",
    "InputFormatError",
    "import_files",
    "parse_files",
]
