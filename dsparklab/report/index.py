"""The report's ``index.html``: notebooks, figures, and the provenance of every run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

if TYPE_CHECKING:
    from dsparklab.report.build import ReportResult

INDEX_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dsparklab report</title>
<style>
body { font-family: "DejaVu Sans", Arial, sans-serif; color: #212529; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border-bottom: 1px solid #dee2e6; padding: 0.3rem 0.6rem; text-align: left; }
th { background: #f1f3f5; }
.ok { color: #2b8a3e; font-weight: bold; } .failed { color: #c92a2a; font-weight: bold; }
.note { background: #fff9db; border-left: 4px solid #fab005; padding: 0.5rem 1rem; }
.gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr));
           gap: 1rem; }
.gallery figure { margin: 0; border: 1px solid #dee2e6; padding: 0.4rem; }
.gallery img { width: 100%; height: auto; }
.gallery figcaption { font-size: 0.8rem; }
code { font-size: 0.8rem; }
</style>
</head>
<body>
<h1>dsparklab report</h1>
<p>Runs: <code>{{ runs }}</code> ({{ run_rows|length }} runs) &middot; built {{ built }}
in {{ "%.0f"|format(seconds) }} s &middot; dsparklab {{ version }} &middot;
git {{ git_sha }}{% if git_dirty %} (dirty){% endif %}</p>
{% if failed %}<p class="note">{{ failed }} notebook(s) failed: open them below for the
traceback.</p>{% endif %}

<h2>Notebooks</h2>
<table id="notebooks">
<tr><th>notebook</th><th>status</th><th>time</th><th>figures</th><th>executed</th></tr>
{% for nb in notebooks %}
<tr><td>{% if nb.html %}<a href="{{ nb.html }}">{{ nb.name }}</a>{% else %}{{ nb.name }}
{% endif %}</td>
<td class="{{ 'ok' if nb.ok else 'failed' }}">{{ 'ok' if nb.ok else 'failed: ' ~ nb.error }}</td>
<td>{{ "%.1f"|format(nb.seconds) }} s</td><td>{{ nb.n_figures }}</td>
<td><a href="{{ nb.executed }}">.ipynb</a></td></tr>
{% endfor %}
</table>

<h2>Figures</h2>
{% if png_message %}<p class="note">{{ png_message }}</p>{% endif %}
<div class="gallery">
{% for fig in figures %}
<figure><a href="{{ fig.html }}">{% if fig.png -%}
<img src="{{ fig.png }}" alt="{{ fig.name }}">{% else %}{{ fig.name }}{% endif %}</a>
<figcaption>{{ fig.notebook }} / <a href="{{ fig.html }}">{{ fig.name }}</a></figcaption>
</figure>
{% endfor %}
</div>

<h2>Runs and their provenance</h2>
<table id="runs">
<tr>{% for h in run_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in run_rows %}<tr>{% for h in run_header %}<td>{{ row[h] }}</td>{% endfor %}</tr>
{% endfor %}
</table>
{% if parameters %}<h2>Parameters</h2><pre>{{ parameters }}</pre>{% endif %}
<p>How this report was made: <a href="report.json">report.json</a>.</p>
</body>
</html>
"""

RUN_HEADER = (
    "run_id",
    "tier",
    "method",
    "n",
    "dataset",
    "status",
    "engine",
    "target",
    "drafter",
    "temperature",
    "created_at",
    "git",
)


def _short_hash(value: Any) -> str:
    text = str(value or "")
    return text.split(":", 1)[-1][:12] if text else ""


def run_roots(runs: Path, parameters: dict[str, Any]) -> list[Path]:
    """The run directories the notebooks read: ``runs``, plus the shipped traces unless
    the ``SHIPPED`` parameter turned them off (the notebooks' default is on)."""
    from dsparklab.notebook import SHIPPED_TRACES

    shipped = parameters.get("SHIPPED", True) and SHIPPED_TRACES.is_dir()
    return [runs, SHIPPED_TRACES.resolve()] if shipped else [runs]


def run_provenance(runs: Path) -> list[dict[str, str]]:
    """One row per run: what it is, which models (name @ content hash), when, which commit."""
    from dsparklab.store import list_runs, read_run_json

    rows = []
    for record in list_runs(runs).to_dict("records"):
        meta = read_run_json(record["path"])
        engine = meta.get("engine") or {}
        target = meta.get("target") or {}
        drafter = meta.get("drafter") or {}
        git = (meta.get("provenance") or {}).get("git") or {}
        rows.append(
            {
                "run_id": str(record["run_id"]),
                "tier": str(record["tier"]),
                "method": str(record["method"]),
                "n": str(record["n"]),
                "dataset": str(record["dataset"]),
                "status": str(record["status"]),
                "engine": f"{engine.get('name', '')} {engine.get('version', '')}".strip(),
                "target": f"{target.get('name', '')} @{_short_hash(target.get('content_hash'))}",
                "drafter": (
                    f"{drafter.get('name', '')} @{_short_hash(drafter.get('content_hash'))}"
                    if drafter
                    else "none"
                ),
                "temperature": str(record["temperature"]),
                "created_at": str(meta.get("created_at", "")),
                "git": f"{str(git.get('sha') or '')[:10]}{' dirty' if git.get('dirty') else ''}",
            }
        )
    return rows


def write_index(report: ReportResult, *, parameters: dict[str, Any]) -> Path:
    """Write ``report.index`` (links relative to the report directory, so it can move)."""
    from dsparklab.provenance import git_state, package_versions

    out = report.out

    def rel(path: Path) -> str:
        return Path(os.path.relpath(path, out)).as_posix()

    figures = []
    png = set(report.figures.png)
    for page in report.figures.html:
        shot = page.with_suffix(".png")
        figures.append(
            {
                "notebook": page.parent.name,
                "name": page.stem,
                "html": rel(page),
                "png": rel(shot) if shot in png else None,
            }
        )
    notebooks = [
        {
            "name": nb.name,
            "ok": nb.ok,
            "error": nb.error,
            "seconds": nb.seconds,
            "html": rel(nb.html) if nb.html else None,
            "executed": rel(nb.executed),
            "n_figures": nb.n_plotly_outputs,
        }
        for nb in report.notebooks
    ]
    git = git_state()
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    text = env.from_string(INDEX_TEMPLATE).render(
        runs=", ".join(str(r) for r in run_roots(report.runs, parameters)),
        run_rows=[row for r in run_roots(report.runs, parameters) for row in run_provenance(r)],
        run_header=RUN_HEADER,
        built=time.strftime("%Y-%m-%d %H:%M:%S"),
        seconds=report.seconds,
        version=package_versions(("dsparklab",))["dsparklab"],
        git_sha=str(git.get("sha") or "unknown")[:10],
        git_dirty=bool(git.get("dirty")),
        failed=len(report.failed),
        notebooks=notebooks,
        figures=figures,
        png_message=report.figures.png_message,
        parameters=str(parameters) if parameters else "",
    )
    report.index.write_text(text, encoding="utf-8")
    return report.index
