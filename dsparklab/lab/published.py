"""The published figures a notebook draws beside measured ones (always labelled "published"),
the cost profiles a projection names, and the confidence temperatures of the runs' drafters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dsparklab.errors import (
    ProvenanceError,
    TraceSchemaError,
)
from dsparklab.lab.resources import (
    PUBLISHED_CURVES,
    PUBLISHED_SPEEDUPS,
    PUBLISHED_VERIFY_COSTS,
    cost_profile_file,
    published_file,
    shipped_cost_profiles,
)
from dsparklab.lab.runs import Runs, load_runs

logger = logging.getLogger(__name__)

# published drafter label -> the lab's method name (same colour in every figure)
PUBLISHED_METHODS: dict[str, str] = {"DSpark": "dspark", "Eagle3-MLA": "eagle3"}


def _read_published(path: str | Path | None, name: str, expected: list[str]) -> pd.DataFrame:
    """The published table ``name`` shipped with the lab (or the CSV at ``path``), checked
    for the columns ``expected``."""
    csv = Path(path) if path is not None else published_file(name)
    if not csv.is_file():
        raise ProvenanceError(f"file {csv}: the published table is missing")
    table = pd.read_csv(csv)
    missing = [c for c in expected if c not in table.columns]
    if missing:
        raise TraceSchemaError(
            f"published table lacks columns {missing}; expected {expected}", path=csv
        )
    return table


def load_published(path: str | Path | None = None) -> pd.DataFrame:
    """The published Kimi speedups (Novita), with the lab's ``method`` names added.

    Returns
    -------
    pandas.DataFrame
        ``target``, ``drafter`` (as published), ``method`` (``dspark``/``eagle3``),
        ``benchmark``, ``n``, ``speedup``, ``source``, ``label`` = ``"published"``.
    """
    expected = ["target", "drafter", "benchmark", "n", "speedup", "source"]
    table = _read_published(path, PUBLISHED_SPEEDUPS, expected)
    method = table["drafter"].map(PUBLISHED_METHODS).fillna(table["drafter"].str.lower())
    return table.assign(method=method, label="published")


# the profiles a projection names unless told otherwise (notebook 02's COST_PROFILE, the
# benchmarks): a published setup, each number with its source (DSpark only: it published
# no Eagle3 draft cost), and the lab's assumption, which prices both drafters
DEFAULT_COST_PROFILES = (
    "published:DeepSeek-V4-Flash-0731 + DSpark block 7",
    "assumed-gpu-like",
)


def cost_table(spec: str | Path | Sequence[str | Path], runs: Runs) -> pd.DataFrame:
    """The step costs to project ``runs``' acceptance on, for their methods and windows.

    ``spec`` is a cost profile shipped with the lab (``"assumed-gpu-like"``:
    :func:`dsparklab.lab.resources.shipped_cost_profiles`), ``"published:<setup>"`` (a
    setup of :func:`load_published_verify_costs` with its own decode step stated and a
    drafter the lab has, e.g. ``"published:DeepSeek-V4-Flash-0731 + DSpark block 7"``:
    :func:`dsparklab.analysis.cost_table_from_published`), a profile JSON file (see
    ``docs/metrics.md``), ``"specdec-bench:<dir>"`` (specdec_bench run directories below
    ``dir``, timed where a user replayed an acceptance profile:
    :func:`specdec_bench_cost_table`), or a directory of runs whose fitted costs stand for
    another machine (:func:`dsparklab.analysis.fitted_cost_table`, profile named after it);
    or a list of these, their tables one under the other (one projection per profile).
    """
    if not isinstance(spec, (str, Path)):
        return pd.concat([cost_table(one, runs) for one in spec], ignore_index=True)
    from dsparklab.analysis import (
        cost_table_from_profile,
        cost_table_from_published,
        fitted_cost_table,
    )
    from dsparklab.analysis.projection import PUBLISHED_PREFIX

    methods = sorted(set(runs.positions["method"]))
    ns = range(1, max(int(runs.positions["n"].max()), 1) + 1)
    text = str(spec)
    if text.startswith(PUBLISHED_PREFIX):
        setup = text[len(PUBLISHED_PREFIX) :].strip()
        return cost_table_from_published(
            load_published_verify_costs(), setup=setup, methods=methods, ns=ns
        )
    if text.startswith(SPECDEC_BENCH_PREFIX):
        where, _, method = text[len(SPECDEC_BENCH_PREFIX) :].strip().partition("#")
        return specdec_bench_cost_table(Path(where), method=method or None)
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


SPECDEC_BENCH_PREFIX = "specdec-bench:"


def specdec_bench_cost_table(root: Path, *, method: str | None = None) -> pd.DataFrame:
    """The whole-step cost table of the specdec_bench runs below ``root`` (every directory
    holding a ``configuration.json``, target-only runs among them), profile
    ``"specdec-bench <root's name> at concurrency <c>"``:
    :func:`dsparklab.analysis.cost_table_from_step_times` of
    :func:`dsparklab.importers.specdec_bench.read_specdec_timing`. ``method`` names the
    drafted runs' method where specdec_bench's algorithm is not the lab's (a DSpark engine
    run as ``MTP``: ``"specdec-bench:DIR#dspark"``)."""
    from dsparklab.analysis import cost_table_from_step_times
    from dsparklab.importers.specdec_bench import CONFIGURATION_FILE, read_specdec_timing

    run_dirs = sorted({path.parent for path in Path(root).rglob(CONFIGURATION_FILE)})
    if not run_dirs:
        raise ProvenanceError(
            f"directory {root}: no specdec_bench run (a directory with {CONFIGURATION_FILE})"
        )
    return cost_table_from_step_times(
        read_specdec_timing(run_dirs, method=method), profile=f"specdec-bench {Path(root).name}"
    )


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
    expected = ["target", "drafter", "method", "dataset", "n", "kind", "rates", "source"]
    csv = Path(path) if path is not None else published_file(PUBLISHED_CURVES)
    table = _read_published(csv, PUBLISHED_CURVES, expected)
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


def load_published_verify_costs(path: str | Path | None = None) -> pd.DataFrame:
    """What verifying ``k`` tokens costs against one decode step, as published (vLLM, SGLang
    and pegainfer pull requests and issues, a vLLM blog; batch size 1).

    Returns
    -------
    pandas.DataFrame
        One row per published number: ``setup``, ``target_kind``, ``hardware``, ``engine``,
        ``parallelism``, ``context_tokens``, ``verify_tokens`` (``k``; NA where the source
        did not state it), ``cost_vs_decode`` (:math:`t(\\mathrm{verify}\\ k) /
        t(\\mathrm{decode}\\ 1)`), ``decode_step_ms``, ``draft_cost_vs_decode`` (one draft
        pass in decode steps, where given), ``how_obtained`` (stated, read off a figure or
        derived: show it wherever a number is shown), ``source`` (a row's "same" is the
        row above's source), ``drafter_method`` (the lab's method name of the setup's
        drafter, the lab's annotation; NA where it has none) and ``label`` =
        ``"published"``.
    """
    expected = [
        "setup", "hardware", "engine", "verify_tokens", "cost_vs_decode",
        "draft_cost_vs_decode", "how_obtained", "source", "drafter_method",
    ]  # fmt: skip
    csv = Path(path) if path is not None else published_file(PUBLISHED_VERIFY_COSTS)
    table = _read_published(csv, PUBLISHED_VERIFY_COSTS, expected)
    for field in ("verify_tokens", "cost_vs_decode", "draft_cost_vs_decode"):
        values = pd.to_numeric(table[field], errors="coerce")
        bad = (values.isna() & table[field].notna()) | (values <= 0)
        if field == "cost_vs_decode":
            bad |= values.isna()
        if bad.any():
            line = int(bad.to_numpy().argmax()) + 2  # the header is line 1
            value = table[field][bad].iloc[0]
            raise TraceSchemaError(
                f"line {line}: {field} must be a positive number, got {value!r}",
                path=csv,
                field=field,
            )
        table[field] = values
    source = table["source"].where(table["source"].str.strip().str.lower() != "same")
    return table.assign(
        verify_tokens=table["verify_tokens"].astype("Int64"),
        source=source.ffill(),
        label="published",
    )
