"""The report's ``index.html``: notebooks, figures, and the provenance of every run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import jinja2

from dsparklab.report.findings import Findings
from dsparklab.report.results import ReportResult
from dsparklab.store.catalog import Catalog

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
.headline { display: grid; grid-template-columns: minmax(0, 1fr) 420px; gap: 1rem;
            align-items: start; border-bottom: 1px solid #dee2e6; padding: 0.6rem 0; }
.headline h3 { font-size: 1.05rem; margin: 0 0 0.3rem 0; }
.headline p { margin: 0; line-height: 1.4; }
.headline img { width: 420px; height: auto; border: 1px solid #dee2e6; }
details { margin: 0.6rem 0; } summary { cursor: pointer; }
table { display: block; max-width: 100%; overflow-x: auto; }
</style>
</head>
<body>
<h1>dsparklab report</h1>
<p>Runs: <code>{{ runs }}</code> ({{ run_rows|length }} runs) &middot; built {{ built }}
in {{ "%.0f"|format(seconds) }} s &middot; dsparklab {{ version }} &middot;
git {{ git_sha }}{% if git_dirty %} (dirty){% endif %}</p>
{% if failed %}<p class="note">{{ failed }} notebook(s) failed: open them below for the
traceback.</p>{% endif %}

<h2 id="findings">Findings{% if f.run_sets %} ({{ f.run_sets|join(", ") }}){% endif %}</h2>
{% for h in f.headlines %}
<div class="headline"><div class="headline-text"><h3>{{ h.title }}</h3><p>{{ h.text }}</p></div>
{% set fig = figure_by_name.get(h.figure) %}{% if fig %}<a class="headline-figure"
href="{{ fig.html }}">{% if fig.png %}<img src="{{ fig.png }}" alt="{{ fig.name }}">{% else %}
{{ fig.name }}{% endif %}</a>{% endif %}</div>
{% endfor %}
{% if f.notes %}<details class="notes"><summary>What the runs do not allow
({{ f.notes|length }} note{{ "s" if f.notes|length != 1 else "" }})</summary>
{% for note in f.notes %}<p class="note">{{ note }}</p>{% endfor %}</details>{% endif %}
{% if f.window_table %}
<details><summary>AL(n) and speedup over target-only decoding per dataset and method, 95 %
bootstrap intervals over requests ({{ f.window_table|length }} rows)</summary>
<table id="window-table">
<tr>{% for c in f.window_columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in f.window_table %}<tr>{% for c in f.window_columns %}<td>{{ row.get(c, "") }}</td>
{% endfor %}</tr>{% endfor %}
</table></details>
{% endif %}
{% if f.best_n %}
<details><summary>The best window per dataset and method, and the windows whose 95 %
interval reaches its lower bound ({{ f.best_n|length }} rows)</summary>
<table id="best-n">
<tr>{% for c in f.best_n[0] %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in f.best_n %}<tr>{% for c in row %}<td>{{ row[c] }}</td>{% endfor %}</tr>
{% endfor %}</table></details>
{% endif %}
{% if f.attribution %}
<details><summary>Where the speedup went from the smallest to the largest window: the change
of log speedup split exactly into tokens per step and the draft, verify and other cost
(Shapley shares), paired bootstrap intervals over prompts ({{ f.attribution|length }}
rows)</summary>
<table id="attribution">
<tr>{% for c in f.attribution[0] %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in f.attribution %}<tr>{% for c in row %}<td>{{ row[c] }}</td>{% endfor %}</tr>
{% endfor %}</table></details>
{% endif %}
{% if f.answer %}
<details><summary>The seeds' question per dataset (a trend counts only when the 95 %
intervals at the two windows do not overlap)</summary>
<table id="seeds-answer">
<tr><th>dataset</th><th>DSpark</th><th>Eagle3</th><th>published shape?</th>
<th>faster at the largest n (intervals apart)</th></tr>
{% for a in f.answer %}<tr><td>{{ a.dataset }}</td>
<td>{{ a.dspark_trend }} ({{ "%+.2f"|format(a.dspark_change) }}x)</td>
<td>{{ a.eagle3_trend }} ({{ "%+.2f"|format(a.eagle3_change) }}x)</td>
<td>{{ "yes" if a.published_shape else "no" }}</td>
<td>{{ a.faster_at_high_n|replace("dspark", "DSpark")|replace("eagle3", "Eagle3") }}</td></tr>
{% endfor %}</table></details>
{% endif %}
{% if f.acceptance %}
<details><summary>Acceptance per run set (tier/engine), dataset, method and window n: AL with
its 95 % interval where per-request counts exist, and the survival s_i by drafted position
({{ f.acceptance|length }} row{{ "s" if f.acceptance|length != 1 else "" }})</summary>
<table id="acceptance">
<tr>{% for c in f.acceptance[0] %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in f.acceptance %}<tr>{% for c in row %}<td>{{ row[c] }}</td>{% endfor %}</tr>
{% endfor %}</table></details>
{% endif %}
{% if f.model_error %}<p>Speedup model (verify cost per window shared by the methods, block
draft constant, autoregressive draft linear in n): at most
{{ "%.3f"|format(f.model_error.max_abs_gap) }}x from the measured speedup
({{ "%.1f"|format(100 * f.model_error.max_relative_error) }} %).</p>{% endif %}
{% if f.curve %}
<details><summary>Learning curve: offline AL on held-out prompts after this many distinct
answer tokens; the last point is the final drafter ({{ f.curve|length }} rows)</summary>
<table id="learning-curve">
<tr><th>method</th><th>dataset</th><th>answer tokens</th><th>offline AL</th></tr>
{% for r in f.curve %}<tr><td>{{ r.method }}</td><td>{{ r.dataset }}</td>
<td>{{ "{:,}".format(r.answer_tokens) }}</td>
<td>{{ "%.2f"|format(r.offline_al) }}</td></tr>
{% endfor %}</table></details>
{% endif %}
{% if f.calibration %}
<details><summary>Confidence head calibration: 10-bin ECE against acceptance given the
position was reached, before and after sequential temperature scaling
({{ f.calibration|length }} rows)</summary>
<table id="calibration">
<tr><th>drafter</th><th>dataset</th><th>position</th><th>reached</th><th>accept rate</th>
<th>ECE raw</th><th>ECE calibrated</th></tr>
{% for r in f.calibration %}<tr><td>{{ r.drafter }}</td><td>{{ r.dataset }}</td>
<td>{{ r.position }}</td><td>{{ r.reached }}</td><td>{{ "%.3f"|format(r["accept rate"]) }}</td>
<td>{{ "%.3f"|format(r["ECE raw"]) }}</td>
<td>{{ "%.3f"|format(r["ECE calibrated"]) if r["ECE calibrated"] is not none else "" }}</td></tr>
{% endfor %}</table></details>
{% endif %}
<div class="gallery">
{% for fig in figures if fig.notebook == "findings" %}
<figure><a href="{{ fig.html }}">{% if fig.png -%}
<img src="{{ fig.png }}" alt="{{ fig.name }}">{% else %}{{ fig.name }}{% endif %}</a>
<figcaption><a href="{{ fig.html }}">{{ fig.name }}</a></figcaption></figure>
{% endfor %}
</div>

<h2>Notebooks</h2>
<p class="notebook-links">{% for nb in notebooks %}{% if nb.html %}<a href="{{ nb.html }}">
{{- nb.name }}</a>{% else %}{{ nb.name }}{% endif %}
{%- if not nb.ok %} <span class="failed">failed</span>{% endif %}
{{- " · " if not loop.last }}{% endfor %}</p>
<details id="notebook-details"><summary>Each notebook's status, time, figures and executed
notebook</summary>
<table id="notebooks">
<tr><th>notebook</th><th>status</th><th>time</th><th>figures</th><th>executed</th></tr>
{% for nb in notebooks %}
<tr><td>{% if nb.html %}<a href="{{ nb.html }}">{{ nb.name }}</a>{% else %}{{ nb.name }}
{% endif %}</td>
<td><span class="{{ 'ok' if nb.ok else 'failed' }}">
{{- 'ok' if nb.ok else 'failed: ' ~ nb.error }}</span>
{% if nb.not_computed %}<details class="not-computed"><summary>{{ nb.not_computed|length }}
section(s) not computed</summary><ul>{% for s in nb.not_computed %}
<li>{{ s.section }}: {{ s.reason }}</li>{% endfor %}</ul></details>{% endif %}</td>
<td>{{ "%.1f"|format(nb.seconds) }} s</td><td>{{ nb.n_figures }}</td>
<td>{% if nb.executed %}<a href="{{ nb.executed }}">.ipynb</a>{% endif %}</td></tr>
{% endfor %}
</table>
</details>

<h2>Figures</h2>
{% if png_message %}<p class="note">{{ png_message }}</p>{% endif %}
<div class="gallery">
{% for fig in figures if fig.notebook != "findings" %}
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
    "concurrency",
    "created_at",
    "git",
)


def _short_hash(value: Any) -> str:
    text = str(value or "")
    return text.split(":", 1)[-1][:12] if text else ""


def run_provenance(catalog: Catalog) -> list[dict[str, str]]:
    """One row per run: what it is, which models (name @ content hash), when, which commit."""
    rows = []
    for record in catalog.runs.to_dict("records"):
        meta = catalog.run_json(record["path"])
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
                "concurrency": str(record["concurrency"] or "not recorded"),
                "created_at": str(meta.get("created_at", "")),
                "git": f"{str(git.get('sha') or '')[:10]}{' dirty' if git.get('dirty') else ''}",
            }
        )
    return rows


def write_index(
    report: ReportResult, *, parameters: dict[str, Any], findings: Findings | None = None
) -> Path:
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
            "executed": rel(nb.executed) if nb.executed.is_file() else None,
            "not_computed": nb.not_computed,
            "n_figures": nb.n_plotly_outputs,
        }
        for nb in report.notebooks
    ]
    git = git_state()
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    text = env.from_string(INDEX_TEMPLATE).render(
        runs=", ".join(str(r) for r in report.catalog.roots),
        run_rows=run_provenance(report.catalog),
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
        f=findings or Findings(),
        figure_by_name={fig["name"]: fig for fig in figures if fig["notebook"] == "findings"},
    )
    report.index.write_text(text, encoding="utf-8")
    return report.index
