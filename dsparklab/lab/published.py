"""The published figures a notebook draws beside measured ones (always labelled "published"),
the cost profiles a projection names, and the confidence temperatures of the runs' drafters.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from dsparklab.errors import (
    ProvenanceError,
    TraceSchemaError,
)
from dsparklab.lab.resources import (
    PUBLISHED_CURVES,
    PUBLISHED_SPEEDUPS,
    cost_profile_file,
    published_file,
    shipped_cost_profiles,
)
from dsparklab.lab.runs import Runs, load_runs

logger = logging.getLogger(__name__)

# published drafter label -> the lab's method name (same colour in every figure)
PUBLISHED_METHODS: dict[str, str] = {"DSpark": "dspark", "Eagle3-MLA": "eagle3"}


def load_published(path: str | Path | None = None) -> pd.DataFrame:
    """The published Kimi speedups (Novita), with the lab's ``method`` names added.

    Returns
    -------
    pandas.DataFrame
        ``target``, ``drafter`` (as published), ``method`` (``dspark``/``eagle3``),
        ``benchmark``, ``n``, ``speedup``, ``source``, ``label`` = ``"published"``.
    """
    csv = Path(path) if path is not None else published_file(PUBLISHED_SPEEDUPS)
    if not csv.is_file():
        raise ProvenanceError(f"file {csv}: the published table is missing")
    table = pd.read_csv(csv)
    expected = ["target", "drafter", "benchmark", "n", "speedup", "source"]
    missing = [c for c in expected if c not in table.columns]
    if missing:
        raise TraceSchemaError(
            f"published table lacks columns {missing}; expected {expected}", path=csv
        )
    method = table["drafter"].map(PUBLISHED_METHODS).fillna(table["drafter"].str.lower())
    return table.assign(method=method, label="published")


def cost_table(spec: str | Path, runs: Runs) -> pd.DataFrame:
    """The step costs to project ``runs``' acceptance on, for their methods and windows.

    ``spec`` is a cost profile shipped with the lab (``"gpu-like"``:
    :func:`dsparklab.lab.resources.shipped_cost_profiles`), a profile JSON file (see
    ``docs/metrics.md``), or a directory of runs whose fitted costs stand for another
    machine (:func:`dsparklab.analysis.fitted_cost_table`, profile named after it).
    """
    from dsparklab.analysis import cost_table_from_profile, fitted_cost_table

    methods = sorted(set(runs.positions["method"]))
    ns = range(1, max(int(runs.positions["n"].max()), 1) + 1)
    text = str(spec)
    path = cost_profile_file(text) if text in shipped_cost_profiles() else Path(text)
    if path.is_dir():
        other = load_runs(path)
        return fitted_cost_table(other.steps, profile=f"runs {path.name}")
    if not path.is_file():
        raise ProvenanceError(
            f"no cost profile {text!r}: name a shipped one ({shipped_cost_profiles()}), a "
            "profile JSON file or a directory of runs"
        )
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise TraceSchemaError(f"not JSON: {err}", path=path) from err
    return cost_table_from_profile(profile, methods=methods, ns=ns, source=str(path))


def confidence_temperatures(runs: Runs) -> dict[str, list[float]]:
    """run_id -> the drafter's confidence temperatures recorded in run.json (calibrated
    drafters only), for :func:`dsparklab.analysis.calibrate_confidence`."""
    out = {}
    for record in runs.runs[["run_id", "path"]].drop_duplicates().to_dict("records"):
        drafter = runs.catalog.run_json(record["path"]).get("drafter") or {}
        if drafter.get("confidence_temperatures"):
            out[str(record["run_id"])] = [float(t) for t in drafter["confidence_temperatures"]]
    return out


def load_published_curves(path: str | Path | None = None) -> pd.DataFrame:
    """Published per-position acceptance curves, one row per (curve, position).

    Returns
    -------
    pandas.DataFrame
        ``target``, ``drafter``, ``method``, ``dataset``, ``n``, ``kind`` (``marginal`` =
        survival :math:`s_i`; ``teacher-forced accuracy``, not decode-time), ``position``
        (0-based, as the traces count), ``rate``, ``accept_len``, ``source``, ``curve``
        (a display name) and ``label`` = ``"published"``.
    """
    csv = Path(path) if path is not None else published_file(PUBLISHED_CURVES)
    if not csv.is_file():
        raise ProvenanceError(f"file {csv}: the published curves are missing")
    table = pd.read_csv(csv)
    expected = ["target", "drafter", "method", "dataset", "n", "kind", "rates", "source"]
    missing = [c for c in expected if c not in table.columns]
    if missing:
        raise TraceSchemaError(
            f"published curves lack columns {missing}; expected {expected}", path=csv
        )
    rows = []
    for line, record in enumerate(table.to_dict("records"), start=2):
        try:
            rates = [float(x) for x in str(record["rates"]).split()]
        except ValueError as err:
            raise TraceSchemaError(
                f"line {line}: rates must be space-separated numbers ({err})",
                path=csv,
                field="rates",
            ) from err
        curve = f"{record['target']} {record['drafter']} ({record['dataset']})"
        for position, rate in enumerate(rates):
            rows.append({**record, "position": position, "rate": rate, "curve": curve})
    return pd.DataFrame(rows).drop(columns=["rates"]).assign(label="published")
