"""The report builder: every notebook executed, exported, its figures rendered, one index.

``dsparklab report --runs DIR --out reports/`` calls :func:`build_report`:

1. each ``NN_*.ipynb`` of the notebooks shipped with the package
   (:func:`dsparklab.lab.resources.notebooks_dir`; in a checkout, ``notebooks/``) runs under
   papermill in the working directory (headless: ``DSPARKLAB_HEADLESS=1``, so widgets fall
   back to static figures) with ``RUNS`` and ``OUT_DIR`` injected and the shipped traces and
   the zoo named by absolute paths (``$DSPARKLAB_SHIPPED``, ``$DSPARKLAB_ZOO_DIR``), into
   ``<out>/notebooks/``;
2. each executed notebook is exported to ``<out>/<name>.html`` (offline: plotly.js
   embedded, nothing fetched from the network);
3. the figures the notebooks saved (``<out>/figures/<name>/<figure>.json``) are written as
   interactive HTML and, where kaleido finds Chromium, PNG;
4. ``<out>/index.html`` links everything with the runs' provenance, and
   ``<out>/report.json`` records how the report was made.

A notebook that fails is reported (its executed copy holds the traceback) and the others
still run; :class:`ReportError` is raised at the end.
"""

from __future__ import annotations

import ast
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsparklab.environment import environ
from dsparklab.errors import DSparkLabError
from dsparklab.lab.display import HEADLESS_ENV, PLOTLY_MIMETYPE
from dsparklab.lab.resources import notebooks_dir as shipped_notebooks
from dsparklab.lab.runs import SHIPPED_ENV, resolve_runs, shipped_traces, within
from dsparklab.report.figures import render_figures
from dsparklab.report.html import export_html
from dsparklab.report.index import write_index
from dsparklab.report.results import NotebookResult, ReportResult
from dsparklab.store.catalog import Catalog
from dsparklab.store.location import Location

logger = logging.getLogger(__name__)

NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
KERNEL_NAME = "python3"


class ReportError(DSparkLabError):
    """One or more notebooks failed; the report was still written around them."""


def discover_notebooks(
    notebooks_dir: Path | None = None, names: Sequence[str] | None = None
) -> list[Path]:
    """The report's notebooks (``NN_*.ipynb``, sorted); ``names`` picks some by stem.

    ``notebooks_dir`` defaults to the notebooks shipped with the package.
    """
    notebooks_dir = shipped_notebooks() if notebooks_dir is None else Path(notebooks_dir)
    if not notebooks_dir.is_dir():
        raise DSparkLabError(f"no notebooks directory at {notebooks_dir}")
    found = sorted(Path(notebooks_dir).glob(NOTEBOOK_GLOB))
    if names:
        by_stem = {p.stem: p for p in found}
        unknown = [n for n in names if n not in by_stem]
        if unknown:
            raise DSparkLabError(
                f"unknown notebook {unknown[0]!r}; expected some of {sorted(by_stem)}"
            )
        found = [by_stem[n] for n in names]
    if not found:
        raise DSparkLabError(f"no notebooks matching {NOTEBOOK_GLOB} in {notebooks_dir}")
    return found


def notebook_parameters(notebooks: Sequence[Path]) -> dict[str, Any]:
    """Every parameter the notebooks declare (their ``parameters`` cells), with its
    default: ``{"N_BOOT": 1000, "SHIPPED": False, "DATASETS": [], ...}``.

    A name declared twice keeps its first default (the notebooks agree on types)."""
    declared: dict[str, Any] = {}
    for path in notebooks:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        for cell in cells:
            if "parameters" not in cell.get("metadata", {}).get("tags", []):
                continue
            for node in ast.parse("".join(cell["source"])).body:
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    declared.setdefault(node.targets[0].id, ast.literal_eval(node.value))
    return declared


def _count_plotly_outputs(executed: Path) -> int:
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    return sum(
        PLOTLY_MIMETYPE in output.get("data", {})
        for cell in nb.cells
        for output in cell.get("outputs", [])
    )


def execute_notebook(
    source: Path,
    executed: Path,
    *,
    runs: Location,
    figures_dir: Path,
    parameters: Mapping[str, Any] | None = None,
    environment: Mapping[str, str] | None = None,
    kernel_name: str = KERNEL_NAME,
    timeout: int = 600,
) -> NotebookResult:
    """Run one notebook headlessly with papermill in the working directory; a failure is
    recorded, not raised. ``environment`` is added to the kernel's environment."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    result = NotebookResult(name=source.stem, source=source, executed=executed)
    executed.parent.mkdir(parents=True, exist_ok=True)
    params = {"RUNS": str(runs), "OUT_DIR": str(figures_dir), **dict(parameters or {})}
    start = time.perf_counter()
    try:
        with environ({HEADLESS_ENV: "1", **dict(environment or {})}):
            pm.execute_notebook(
                str(source),
                str(executed),
                parameters=params,
                cwd=Path.cwd(),
                kernel_name=kernel_name,
                progress_bar=False,
                log_output=False,
                execution_timeout=timeout,
            )
    except PapermillExecutionError as err:
        result.error = f"{err.ename}: {err.evalue} (cell {err.exec_count})"
    except Exception as err:  # kernel death, timeouts: report them like cell errors
        result.error = f"{type(err).__name__}: {err}"
    result.seconds = time.perf_counter() - start
    if executed.is_file():
        result.n_plotly_outputs = _count_plotly_outputs(executed)
    result.figures = sorted(p.stem for p in figures_dir.glob("*.json"))
    if executed.is_file():
        from dsparklab.lab.display import SECTIONS_RECORD, read_records

        result.not_computed = list(read_records(executed).get(SECTIONS_RECORD) or [])
    return result


def build_report(
    runs: str | Path,
    out: str | Path,
    *,
    notebooks_dir: Path | None = None,
    names: Sequence[str] | None = None,
    shipped: str | Path | None = None,
    zoo_dir: str | Path | None = None,
    parameters: Mapping[str, Any] | None = None,
    png: bool = True,
    kernel_name: str = KERNEL_NAME,
    progress: bool = True,
    timeout: int = 600,
    show_code: bool = False,
) -> ReportResult:
    """Execute the notebooks on ``runs`` and write the report to ``out``.

    Parameters
    ----------
    runs
        A directory of run directories (see :func:`dsparklab.lab.runs.resolve_runs`).
    out
        The report directory (created; files of a previous report are replaced).
    notebooks_dir, names
        Where the notebooks are (default: the ones shipped with the package), and which
        ones (stems; default every ``NN_*.ipynb``).
    shipped
        Traces read beside ``runs`` (the demo passes the ones shipped in ``data/traces``).
        None: only ``runs``, unless the ``SHIPPED`` parameter is True, which adds
        :func:`dsparklab.lab.runs.shipped_traces`. The notebooks get ``SHIPPED``
        set to whether traces were added.
    zoo_dir
        The zoo whose cards give the findings' learning curves and calibration (default:
        :data:`dsparklab.zoo.ZOO_DIR`).
    parameters
        Extra papermill parameters for every notebook (e.g. ``{"N_BOOT": 200}``).
    png
        Render static PNGs with kaleido (skipped with a message if no Chromium).
    kernel_name, timeout
        The Jupyter kernel, and the per-cell timeout in seconds.
    progress
        Show a tqdm bar over the notebooks.
    show_code
        Keep the code cells in the notebook pages (hidden by default).

    Raises
    ------
    ReportError
        After writing everything, when a notebook failed.
    DSparkLabError
        Before running anything, when ``runs``, ``shipped`` or ``zoo_dir`` is missing.
    """
    from tqdm.auto import tqdm

    from dsparklab.zoo.load import ZOO_DIR, ZOO_ENV

    start = time.perf_counter()
    runs_path = resolve_runs(runs)
    parameters = dict(parameters or {})
    if shipped is None and parameters.get("SHIPPED") is True:
        shipped = shipped_traces()
        if shipped is None:
            raise DSparkLabError(
                "SHIPPED=True: no shipped traces at data/traces; name them with --shipped DIR"
            )
    traces = _directory(shipped, "shipped traces") if shipped is not None else None
    parameters["SHIPPED"] = traces is not None
    roots = [runs_path]
    if traces is not None and not within(runs_path, traces):
        roots.append(Location.of(traces))
    zoo = _directory(zoo_dir, "zoo") if zoo_dir is not None else ZOO_DIR
    environment = {SHIPPED_ENV: str(traces or ""), ZOO_ENV: str(zoo)}
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sources = discover_notebooks(notebooks_dir, names)
    results = []
    bar = tqdm(sources, desc="notebooks", unit="nb", disable=not progress)
    for source in bar:
        bar.set_postfix_str(source.stem)
        figures_dir = out / "figures" / source.stem
        for stale in figures_dir.glob("*"):
            stale.unlink()
        result = execute_notebook(
            source,
            out / "notebooks" / source.name,
            runs=runs_path,
            figures_dir=figures_dir,
            parameters=parameters,
            environment=environment,
            kernel_name=kernel_name,
            timeout=timeout,
        )
        if result.executed.is_file():
            result.html = export_html(
                result.executed, out / f"{source.stem}.html", show_code=show_code
            )
        if result.error:
            logger.error("%s failed: %s (see %s)", source.stem, result.error, result.executed)
        results.append(result)
    from dsparklab.report.findings import FINDINGS_FIGURES, compute_findings

    findings_dir = out / "figures" / FINDINGS_FIGURES
    for stale in findings_dir.glob("*"):
        stale.unlink()
    catalog = Catalog.of(*roots)
    findings = compute_findings(
        catalog,
        findings_dir,
        n_boot=int((parameters or {}).get("N_BOOT", 400)),
        zoo_dir=zoo,
    )
    figures = render_figures(out / "figures", png=png)
    report = ReportResult(
        out=out,
        runs=runs_path,
        catalog=catalog,
        index=out / "index.html",
        notebooks=results,
        figures=figures,
        seconds=0.0,
    )
    report.seconds = time.perf_counter() - start
    write_index(report, parameters=dict(parameters or {}), findings=findings)
    _write_report_json(report, parameters=dict(parameters or {}), findings=findings.record())
    if report.failed:
        failed = "; ".join(f"{nb.name}: {nb.error} (see {nb.executed})" for nb in report.failed)
        raise ReportError(
            f"{len(report.failed)} of {len(results)} notebooks failed: {failed}; "
            f"the rest of the report is at {report.index}"
        )
    return report


def _directory(path: str | Path, what: str) -> Path:
    """``path`` resolved; a one-line error when it is not a directory."""
    found = Path(path)
    if not found.is_dir():
        raise DSparkLabError(f"no {what} at {found}: no such directory")
    return found.resolve()


def _write_report_json(
    report: ReportResult, *, parameters: dict[str, Any], findings: dict[str, Any]
) -> None:
    from dsparklab.provenance import provenance
    from dsparklab.store import write_json_atomic

    payload = {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": str(report.runs),
        # run.json files and part names and sizes: one listing, no part read
        "inputs": {"runs": report.catalog.fingerprint()},
        "parameters": parameters,
        "seconds": round(report.seconds, 2),
        "png": report.figures.png_message or f"{len(report.figures.png)} written",
        "notebooks": [
            {
                "name": nb.name,
                "ok": nb.ok,
                "error": nb.error,
                "not_computed": nb.not_computed,
                "seconds": round(nb.seconds, 2),
                "figures": nb.figures,
                "html": nb.html.name if nb.html else None,
            }
            for nb in report.notebooks
        ],
        # the index's findings: headlines with their facts, notes, tables (Findings.record)
        "findings": findings,
        "provenance": provenance(),
    }
    write_json_atomic(report.out / "report.json", json.loads(json.dumps(payload, default=str)))
