"""Which window pays: step costs as profiles, every smaller window from one run, the
marginal position, the best n, and what the published shape would need.

All costs are per step in units of one target-only decode step (the baseline's time per
token). A *cost table* holds, per (``profile``, ``method``, ``n``), ``draft_cost``
(:math:`c_{\\mathrm{draft}}(n)`) and ``verify_cost`` (:math:`V(n)`, the whole verify of
the :math:`n + 1` tokens, so the target-only step is :math:`V(0) = 1`). With a run's
acceptance the projected speedup is

.. math:: S(n) = \\frac{\\mathrm{AL}(n)}{C(n)}, \\qquad C(n) = c_{\\mathrm{draft}}(n) + V(n).

:func:`fitted_cost_table` makes one from measured steps (the speedup model's fit:
:math:`V(n) = 1 + \\hat v(n)`), :func:`cost_table_from_profile` from a documented JSON
profile (e.g. an assumed GPU-like one where verifying 8 tokens costs about one decode
step), :func:`cost_table_from_published` from a published setup's verify costs, each
number carrying its source, :func:`cost_table_from_step_times` from runs timed as a whole
step (a replayed acceptance profile measured elsewhere).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import as_columns, require_columns
from dsparklab.analysis.aggregate import compute_acceptance_by_position
from dsparklab.analysis.speedup import DRAFT_COST_SLOPE, DRAFTER_KINDS, fit_speedup_model
from dsparklab.errors import MissingInputError, TraceSchemaError, UnknownMethodError

logger = logging.getLogger(__name__)

COST_COLUMNS = ("profile", "method", "n", "draft_cost", "verify_cost")


def fitted_cost_table(
    steps: pd.DataFrame, *, by: str | Iterable[str] = (), profile: str = "measured"
) -> pd.DataFrame:
    """The speedup model's fitted costs of ``steps`` as a cost table (per method and n,
    and per ``by`` group: ``("dataset",)`` fits each dataset's context lengths apart,
    ``("concurrency",)`` each load, ``("batch_size",)`` each runtime batch size).

    :math:`c_{\\mathrm{draft}}(n) = \\hat c_0 + \\hat c_1 n` and
    :math:`V(n) = 1 + \\hat v(n)` (:func:`dsparklab.analysis.fit_speedup_model`), in
    target-only steps of the same group. By ``batch_size`` (a step column, counted per
    request with it as a key) the unit is the target-only step of that many requests:
    :math:`V_b(n) = \\bar u_b(n) / t_b`, the mean verify time of the steps that ran b
    requests over the baseline's mean step of b requests, whatever load the runs kept.
    """
    from dsparklab.analysis.layouts import MATCH_COLUMNS, STEP_MATCH_COLUMNS
    from dsparklab.analysis.window import require_step_costs

    require_step_costs(steps)
    by = [c for c in as_columns(by) if c != "method"]
    # by a step's own batch size, the run's nominal load no longer pairs anything: a step
    # of b requests is a step of b whatever concurrency its run kept
    step_keys = [c for c in by if c in STEP_MATCH_COLUMNS]
    match = [c for c in MATCH_COLUMNS if not (step_keys and c == "concurrency")] + step_keys
    if step_keys:
        # a step without a batch size (imported, migrated) has no batch to be paired by
        known = steps[step_keys].notna().all(axis=1)
        if not known.all():
            logger.warning(
                "%d of %d rows have no %s and are left out of the cost table",
                int((~known).sum()),
                len(steps),
                " / ".join(step_keys),
            )
            steps = steps[known]
    params = fit_speedup_model(steps, fit_by=("method", *by), match=match)
    table = params.assign(
        profile=profile,
        draft_cost=params["draft_cost_fit"],
        verify_cost=1.0 + params["verify_cost_fit"],
    )
    return table[[*by, *COST_COLUMNS]].reset_index(drop=True)


def cost_table_from_profile(
    profile: Mapping[str, Any], *, methods: Iterable[str], ns: Iterable[int], source: str = ""
) -> pd.DataFrame:
    """A cost table from a profile mapping (the JSON of ``docs/metrics.md``).

    ``{"name": ..., "verify": {"<tokens verified>": cost, ...}, "draft": {"<method>":
    {"c0": ..., "c1": ...}}}``: ``verify`` by width :math:`w = n + 1` (``"1"`` is the
    decode step, 1.0), ``draft`` per method, :math:`c_{\\mathrm{draft}}(n) = c_0 + c_1
    n`. Every width and method asked for must be there; ``source`` names the file in
    errors. Each row's ``cost_source`` is the profile's own ``"source"`` (where its numbers
    come from), else the file.
    """
    name = profile.get("name")
    if not isinstance(name, str) or not name:
        raise TraceSchemaError("a cost profile needs a name", path=source or None, field="name")
    verify, draft = profile.get("verify"), profile.get("draft")
    if not isinstance(verify, Mapping) or not isinstance(draft, Mapping):
        field = "verify" if not isinstance(verify, Mapping) else "draft"
        raise TraceSchemaError("must be an object", path=source or None, field=field)
    origin = str(profile.get("source") or f"profile {name} ({source or 'given'})")
    rows = []
    for method in methods:
        entry = draft.get(method)
        if not isinstance(entry, Mapping) or "c0" not in entry:
            raise TraceSchemaError(
                f"no draft cost for method {method!r}; give {{'c0': ..., 'c1': ...}}",
                path=source or None,
                field=f"draft.{method}",
            )
        for n in ns:
            width = str(int(n) + 1)
            if width not in verify:
                raise TraceSchemaError(
                    f"no verify cost for {width} tokens (n = {n})",
                    path=source or None,
                    field=f"verify.{width}",
                )
            rows.append(
                {
                    "profile": name,
                    "method": method,
                    "n": int(n),
                    "draft_cost": float(entry["c0"]) + float(entry.get("c1", 0.0)) * int(n),
                    "verify_cost": float(verify[width]),
                    "cost_source": origin,
                }
            )
    return pd.DataFrame(rows, columns=[*COST_COLUMNS, "cost_source"])


PUBLISHED_PREFIX = "published:"  # a cost profile named after a published setup


def cost_table_from_published(
    published: pd.DataFrame, *, setup: str, methods: Iterable[str], ns: Iterable[int]
) -> pd.DataFrame:
    """A cost table from one published setup's verify costs, every number with its source.

    ``published`` holds rows of ``dsparklab.lab.notebook.load_published_verify_costs``
    (``setup``, ``verify_tokens`` :math:`k`, ``cost_vs_decode`` :math:`t(k)/t(1)`,
    ``draft_cost_vs_decode`` :math:`p`, ``how_obtained``, ``source``). For window
    :math:`n` the target verifies :math:`w = n + 1` tokens:

    .. math:: V(n) = r(w) \\text{ where stated, else }
        r(k_a) + (r(k_b) - r(k_a)) \\frac{w - k_a}{k_b - k_a}

    between the nearest stated widths :math:`k_a < w < k_b`. The draft pass :math:`p` is
    the setup's drafter's (``drafter_method``), charged to that method only: once for a
    block drafter (DSpark), :math:`c_{\\mathrm{draft}}(n) = p`, once per position for an
    autoregressive one, :math:`c_{\\mathrm{draft}}(n) = n p`. Another method's draft cost
    was not published for the setup: NA (:func:`compute_projected_speedup` leaves it out).

    Refused (one line naming the setup and field): a setup not in ``published``; one
    without a stated :math:`k = 1` row (its unit is not its own decode step); a width past
    the largest stated one (never extrapolated); a method of unknown kind.

    Returns
    -------
    pandas.DataFrame
        :data:`COST_COLUMNS` (``profile`` = ``"published: <setup>"``) and ``cost_source``:
        for each number, whether it was stated, read off a figure, derived or
        interpolated, and the source.
    """
    needed = ["setup", "verify_tokens", "cost_vs_decode", "draft_cost_vs_decode"]
    require_columns(
        published,
        [*needed, "drafter_method", "how_obtained", "source"],
        what="cost_table_from_published",
    )
    rows = published[published["setup"] == setup]
    if rows.empty:
        known = sorted(published["setup"].unique())
        raise MissingInputError(f"no published verify costs for setup {setup!r}; known: {known}")
    stated = rows.dropna(subset=["verify_tokens"]).sort_values("verify_tokens")
    widths = stated["verify_tokens"].astype(int).to_numpy()
    if 1 not in widths:
        raise MissingInputError(
            f"published setup {setup!r}: field verify_tokens has no 1 (its decode step), so "
            "its costs are not in units of its own decode step; cannot project on it"
        )
    costs = stated["cost_vs_decode"].to_numpy(dtype=float)
    how = stated["how_obtained"].astype(str).to_numpy()
    pass_cost = rows["draft_cost_vs_decode"].dropna()
    draft_pass = float(pass_cost.iloc[0]) if len(pass_cost) else np.nan
    drafters = rows["drafter_method"].dropna().astype(str)
    drafter = drafters.iloc[0] if len(drafters) and drafters.iloc[0] else None
    source = str(rows["source"].iloc[0])
    out = []
    for method in methods:
        if method not in DRAFTER_KINDS:
            raise UnknownMethodError(
                f"no drafter kind for method {method!r} (known: {sorted(DRAFTER_KINDS)}); "
                "cannot say how often it pays the published draft pass"
            )
        per_position = DRAFT_COST_SLOPE[DRAFTER_KINDS[method]]
        for n in ns:
            width = int(n) + 1
            if width > widths[-1]:
                raise MissingInputError(
                    f"published setup {setup!r}: field verify_tokens stops at {widths[-1]}; "
                    f"n = {n} verifies {width} tokens, which would be an extrapolation"
                )
            at = int(np.searchsorted(widths, width))
            if widths[at] == width:
                verify, verify_how = costs[at], f"k={width} {how[at]}"
            else:
                lo, hi = at - 1, at
                share = (width - widths[lo]) / (widths[hi] - widths[lo])
                verify = costs[lo] + (costs[hi] - costs[lo]) * share
                verify_how = (
                    f"k={width} interpolated between k={widths[lo]} ({how[lo]}) and "
                    f"k={widths[hi]} ({how[hi]})"
                )
            published_draft = method == drafter and not np.isnan(draft_pass)
            if not published_draft:
                draft_how = f"draft not published for {method} on this setup"
            elif per_position:
                draft_how = f"draft {n} x the published pass (one per position)"
            else:
                draft_how = "draft one published pass"
            draft = draft_pass * (int(n) if per_position else 1) if published_draft else np.nan
            out.append(
                {
                    "profile": f"{PUBLISHED_PREFIX} {setup}",
                    "method": method,
                    "n": int(n),
                    "draft_cost": draft,
                    "verify_cost": float(verify),
                    "cost_source": f"published: {verify_how}; {draft_how}; {source}",
                }
            )
    return pd.DataFrame(out, columns=[*COST_COLUMNS, "cost_source"])


def cost_table_from_step_times(timings: pd.DataFrame, *, profile: str) -> pd.DataFrame:
    """Whole-step costs from runs timed as a whole step, in target-only steps of the same
    load (e.g. specdec_bench runs of a replayed acceptance profile:
    ``dsparklab.importers.specdec_bench.read_specdec_timing``).

    .. math:: C(n, c) = \\bar t(n, c) / \\bar t_{\\mathrm{none}}(c)

    the mean step time over the repeats of each (``method``, ``n``) at concurrency
    :math:`c` over that of the target-only runs (``method = "none"``) at :math:`c`. The
    step is not split: ``draft_cost`` and ``verify_cost`` are NA and ``step_cost`` is
    :math:`C` (what :func:`compute_projected_speedup` divides by). Each load is a profile
    of its own, ``"<profile> at concurrency <c>"``. A concurrency without a target-only run
    is left out with a warning.

    Returns
    -------
    pandas.DataFrame
        ``concurrency``, :data:`COST_COLUMNS`, ``step_cost``, ``repeats`` and
        ``cost_source``.
    """
    require_columns(
        timings, ["method", "n", "concurrency", "step_time_s"], what="cost_table_from_step_times"
    )
    mean = timings.groupby(["concurrency", "method", "n"], as_index=False).agg(
        step_time_s=("step_time_s", "mean"), repeats=("step_time_s", "size")
    )
    baseline = mean[mean["method"] == "none"].set_index("concurrency")["step_time_s"]
    drafted = mean[mean["method"] != "none"]
    unpaired = sorted(set(drafted["concurrency"]) - set(baseline.index))
    if unpaired:
        logger.warning(
            "no target-only run at concurrency %s: its runs are left out of the cost table",
            unpaired,
        )
    drafted = drafted[drafted["concurrency"].isin(baseline.index)]
    if drafted.empty:
        raise MissingInputError(
            f"{profile}: no run with a drafter at a concurrency that has a target-only run"
        )
    base = drafted["concurrency"].map(baseline)
    return drafted.assign(
        # one profile per load: a projection never mixes two loads' costs under one name
        profile=[f"{profile} at concurrency {c}" for c in drafted["concurrency"]],
        draft_cost=np.nan,
        verify_cost=np.nan,
        step_cost=drafted["step_time_s"] / base,
        cost_source=[
            f"measured: mean step time of {r} repeat(s) over the target-only step at "
            f"concurrency {c} ({profile}); draft and verify not told apart"
            for r, c in zip(drafted["repeats"], drafted["concurrency"], strict=True)
        ],
    )[["concurrency", *COST_COLUMNS, "step_cost", "repeats", "cost_source"]].reset_index(drop=True)


def _survival_curves(
    positions: pd.DataFrame, steps: pd.DataFrame | None, by: list[str], n_boot: int, seed: int
) -> pd.DataFrame:
    """Survival by position of each group's largest-window run (its longest curve)."""
    largest = positions.groupby(by)["n"].transform("max")
    top = positions[positions["n"] == largest]
    if steps is not None:  # the other runs' steps would be counted as runs of their own
        steps = steps[steps["run_id"].isin(top["run_id"].unique())]
    return compute_acceptance_by_position(
        top, steps=steps, by=[*by, "n"], n_boot=n_boot, seed=seed
    ).rename(columns={"n": "source_n"})


def compute_truncated_acceptance(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("method", "dataset"),
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """AL at every window :math:`n' \\le n` predicted from each group's largest-n run.

    .. math:: \\widehat{\\mathrm{AL}}(n') = 1 + \\sum_{i < n'} s_i

    with :math:`s_i` the survival of the run at the largest :math:`n`. This holds when a
    drafted position depends only on the context and the drafted prefix (autoregressive
    drafters: Eagle3); a block drafter (DSpark) drafts all :math:`n` positions together,
    so its first :math:`n'` drafts at :math:`n` need not be those at :math:`n'`
    (:func:`compute_prefix_agreement` measures how often they are).

    Returns
    -------
    pandas.DataFrame
        One row per group and :math:`n'`: ``source_n``, ``accept_len`` (+ ``_lo``/``_hi``,
        the survival bounds summed, a conservative band).
    """
    by = list(as_columns(by))
    curves = _survival_curves(positions, steps, by, n_boot, seed)
    rows = []
    for key, part in curves.groupby([*by, "source_n"], sort=True):
        part = part.sort_values("position")
        values = dict(zip([*by, "source_n"], key, strict=True))
        for n in range(1, int(values["source_n"]) + 1):
            head = part[part["position"] < n]
            rows.append(
                {
                    **values,
                    "n": n,
                    "accept_len": 1.0 + float(head["survival"].sum()),
                    "accept_len_lo": 1.0 + float(head["survival_lo"].sum()),
                    "accept_len_hi": 1.0 + float(head["survival_hi"].sum()),
                }
            )
    return pd.DataFrame(rows)


def compute_projected_speedup(acceptance: pd.DataFrame, costs: pd.DataFrame) -> pd.DataFrame:
    """:math:`S(n) = \\mathrm{AL}(n) / C(n)` for each acceptance row under each profile.

    Parameters
    ----------
    acceptance
        ``method``, ``n``, ``accept_len`` (+ optional ``_lo``/``_hi``) and any grouping
        columns (``dataset``), e.g. :func:`compute_truncated_acceptance` or
        :func:`dsparklab.analysis.compute_window_scaling`.
    costs
        A cost table (:data:`COST_COLUMNS`), one or several profiles; where ``draft_cost``
        and ``verify_cost`` are NA, its ``step_cost`` (:func:`cost_table_from_step_times`).
        Rows with no step cost at all (a draft cost not published; the table's
        ``cost_source`` says so) are left out, logged at INFO.

    Returns
    -------
    pandas.DataFrame
        The acceptance rows joined with each profile's costs: ``profile``, ``step_cost``
        (:math:`C(n)`), ``speedup`` (+ ``_lo``/``_hi`` from AL's bounds) and ``label``,
        ``"projected on <profile>"`` (never a measurement).
    """
    require_columns(acceptance, ["method", "n", "accept_len"], what="compute_projected_speedup")
    require_columns(costs, COST_COLUMNS, what="compute_projected_speedup")
    # the acceptance's own measured costs and speedups make way for the profile's
    replaced = [
        "speedup", "speedup_lo", "speedup_hi", "draft_cost", "verify_cost", "step_cost",
        "profile", "cost_source", "repeats", "label",
    ]  # fmt: skip
    out = acceptance.drop(columns=replaced, errors="ignore")
    # a cost table fitted per group (dataset) joins on that group too
    shared = [
        c for c in costs.columns if c in out.columns and c not in (*COST_COLUMNS, "step_cost")
    ]
    priced = out.merge(
        costs[["method", "n", *shared]].drop_duplicates(),
        how="left",
        on=["method", "n", *shared],
        indicator=True,
    )
    unpriced = priced["_merge"] == "left_only"
    if unpriced.any():
        logger.info(
            "no cost row for %s: not projected",
            sorted(set(map(tuple, priced.loc[unpriced, ["method", "n"]].to_numpy().tolist()))),
        )
    out = out.merge(costs, on=["method", "n", *shared], how="inner")
    out["step_cost"] = _step_cost(out)
    unknown = out["step_cost"].isna()
    if unknown.any():  # a published setup's draft pass is its own drafter's (by design)
        logger.info(
            "no step cost for %s on %s: not projected",
            sorted(set(out.loc[unknown, "method"])),
            sorted(set(out.loc[unknown, "profile"])),
        )
        out = out[~unknown]
    out["speedup"] = out["accept_len"] / out["step_cost"]
    for bound in ("lo", "hi"):
        column = f"accept_len_{bound}"
        out[f"speedup_{bound}"] = out[column] / out["step_cost"] if column in out else np.nan
    out["label"] = "projected on " + out["profile"].astype(str)
    return out.reset_index(drop=True)


def compute_prefix_agreement(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame,
    by: str | Iterable[str] = ("method", "dataset"),
) -> pd.DataFrame:
    """How often a run at window :math:`n'` drafts the same first tokens as the group's
    largest-window run, at the first step of each prompt (the same context on both).

    Returns
    -------
    pandas.DataFrame
        One row per group, :math:`n'` below the largest and position :math:`i < n'`:
        ``agreement`` (the fraction of paired prompts whose drafts at :math:`i` are
        equal), ``prefix_agreement`` (... whose drafts at every :math:`j \\le i` are) and
        ``n_prompts``.
    """
    by = list(as_columns(by))
    require_columns(
        positions, [*by, "n", "run_id", "request_id", "step", "position"], what="prefix agreement"
    )
    first = positions[positions["step"] == 0]
    prompts = steps[["run_id", "request_id", "prompt_id"]].drop_duplicates()
    first = first.merge(prompts, on=["run_id", "request_id"], how="inner")
    rows = []
    for key, group in first.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        top = int(group["n"].max())
        wide = group.pivot_table(
            index=["prompt_id", "position"], columns="n", values="draft_token", aggfunc="first"
        )
        for n in sorted(int(v) for v in group["n"].unique() if int(v) < top):
            pair = wide[[n, top]].dropna().reset_index()
            pair = pair[pair["position"] < n]
            if pair.empty:
                continue
            pair["same"] = pair[n] == pair[top]
            pair = pair.sort_values(["prompt_id", "position"])
            pair["prefix"] = pair.groupby("prompt_id")["same"].cummin()
            for position, at in pair.groupby("position", sort=True):
                rows.append(
                    {
                        **dict(zip(by, key, strict=True)),
                        "n": n,
                        "source_n": top,
                        "position": int(position),
                        "agreement": float(at["same"].mean()),
                        "prefix_agreement": float(at["prefix"].mean()),
                        "n_prompts": int(at["prompt_id"].nunique()),
                    }
                )
    columns = [*by, "n", "source_n", "position", "agreement", "prefix_agreement", "n_prompts"]
    return pd.DataFrame(rows, columns=columns)


def compute_window_prediction(
    positions: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    costs: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("method", "dataset"),
    n_boot: int = 0,
) -> pd.DataFrame:
    """Predicted against measured speedup at every smaller window, from one run per group.

    The prediction is :func:`compute_truncated_acceptance` over ``costs`` (default: the
    steps' own costs fitted per ``by`` group, :func:`fitted_cost_table`); the measurement is
    :func:`dsparklab.analysis.compute_window_scaling` on the runs at each :math:`n'`.

    Returns
    -------
    pandas.DataFrame
        One row per group and :math:`n'` run: ``predicted``, ``measured``, ``error`` =
        predicted / measured - 1 and ``prefix_agreement`` (the fraction of prompts whose
        first :math:`n'` drafts at :math:`n'` equal those at the largest :math:`n`: 1
        where the prediction's assumption holds).
    """
    from dsparklab.analysis.window import compute_window_scaling

    by = list(as_columns(by))
    costs = fitted_cost_table(steps, by=by) if costs is None else costs
    predicted = compute_projected_speedup(
        compute_truncated_acceptance(positions, steps=steps, by=by, n_boot=n_boot), costs
    )
    measured = compute_window_scaling(steps, by=by, n_boot=0)[[*by, "n", "speedup"]]
    table = predicted[[*by, "n", "source_n", "speedup"]].merge(
        measured, on=[*by, "n"], suffixes=("_predicted", "_measured")
    )
    table = table.rename(columns={"speedup_predicted": "predicted", "speedup_measured": "measured"})
    table = table[table["n"] < table["source_n"]]
    agreement = compute_prefix_agreement(positions, steps=steps, by=by)
    whole = agreement.sort_values("position").groupby([*by, "n"])["prefix_agreement"].last()
    table = table.merge(whole.reset_index(), on=[*by, "n"], how="left")
    table["error"] = table["predicted"] / table["measured"] - 1.0
    return table.sort_values([*by, "n"]).reset_index(drop=True)


def _step_cost(costs: pd.DataFrame) -> pd.Series:
    """Each cost row's step cost :math:`C(n) = C_d + C_u`, in decode steps; where the row
    has no split (a whole-step table, :func:`cost_table_from_step_times`) its
    ``step_cost``; NA where it has neither (a published setup's own drafter)."""
    split = costs["draft_cost"] + costs["verify_cost"]
    return split.fillna(costs["step_cost"]) if "step_cost" in costs else split


def compute_position_payoff(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None,
    costs: pd.DataFrame,
    by: str | Iterable[str] = ("method", "dataset"),
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Do the positions one more window step drafts pay? Per group, from each window
    :math:`a` of the cost table to the next one :math:`b` (:math:`b = a + 1` when every
    window was measured: one position at a time).

    With :math:`s_i` the survival of position :math:`i` (0-based; from the group's
    largest-window run), :math:`\\mathrm{AL}(a) = 1 + \\sum_{i<a} s_i` and the step cost
    :math:`C(n)` of the cost table (draft + verify, or a whole-step
    table's ``step_cost``; a window with neither is not priced):

    .. math::

        \\Delta T = \\sum_{a \\le i < b} s_i, \\qquad \\Delta C = C(b) - C(a), \\qquad
        S(b) > S(a) \\iff \\Delta T > T^{*} = \\frac{\\mathrm{AL}(a)}{C(a)}\\, \\Delta C

    Returns
    -------
    pandas.DataFrame
        One row per group, profile and window step: ``position`` (:math:`a`, the first
        added position), ``n_from`` (:math:`a`), ``n_to`` (:math:`b`), ``marginal_tokens``
        (:math:`\\Delta T`, + ``_lo``/``_hi`` summing the survival bounds),
        ``marginal_cost`` (:math:`\\Delta C`, in decode steps), ``break_even``
        (:math:`T^*`) and ``pays``: ``yes`` when the interval lies above :math:`T^*`, ``no``
        below it, ``unclear`` when it straddles.

    Raises
    ------
    MissingInputError
        The cost table holds fewer than two windows the runs drafted.
    """
    by = list(as_columns(by))
    curves = _survival_curves(positions, steps, by, n_boot, seed)
    rows = []
    for key, part in curves.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        part = part.sort_values("position")
        method = part["method"].iloc[0] if "method" in part else None
        survival = part[["survival", "survival_lo", "survival_hi"]].to_numpy(float)  # [P, 3]
        survival[:, 1:] = np.where(np.isnan(survival[:, 1:]), survival[:, :1], survival[:, 1:])
        for profile, cost in costs[costs["method"] == method].groupby("profile"):
            priced = cost.assign(step_cost=_step_cost(cost)).dropna(subset=["step_cost"])
            step_cost = dict(zip(priced["n"], priced["step_cost"], strict=True))
            windows = sorted(int(n) for n in step_cost if 1 <= n <= len(survival))
            for a, b in zip(windows[:-1], windows[1:], strict=True):
                gain = survival[a:b].sum(axis=0)  # [3]: point, lo, hi
                al = 1.0 + survival[:a, 0].sum()
                delta = step_cost[b] - step_cost[a]
                need = al / step_cost[a] * delta
                rows.append(
                    {
                        **dict(zip(by, key, strict=True)),
                        "profile": profile,
                        "position": a,
                        "n_from": a,
                        "n_to": b,
                        "marginal_tokens": float(gain[0]),
                        "marginal_tokens_lo": float(gain[1]),
                        "marginal_tokens_hi": float(gain[2]),
                        "marginal_cost": float(delta),
                        "break_even": float(need),
                        "pays": "yes" if gain[1] > need else "no" if gain[2] < need else "unclear",
                    }
                )
    if not rows:
        raise MissingInputError(
            "no window step to price: the cost table holds fewer than two of the windows "
            "the runs drafted"
        )
    return pd.DataFrame(rows)


def compute_best_n(
    scaling: pd.DataFrame, *, by: str | Iterable[str] = ("dataset", "method")
) -> pd.DataFrame:
    """The window with the highest speedup per group, and the windows it cannot be told
    apart from (their interval reaches the best one's lower bound).

    Parameters
    ----------
    scaling
        ``n``, ``speedup``, ``speedup_lo``, ``speedup_hi`` per group, e.g.
        :func:`dsparklab.analysis.compute_window_scaling` (measured) or
        :func:`compute_projected_speedup` (add ``profile`` to ``by``).

    Returns
    -------
    pandas.DataFrame
        One row per group: ``best_n``, ``speedup`` (+ ``_lo``/``_hi``) there and
        ``indistinguishable``, the sorted windows (best included) whose upper bound
        :math:`\\ge` the best's lower bound.
    """
    by = list(as_columns(by))
    require_columns(
        scaling, [*by, "n", "speedup", "speedup_lo", "speedup_hi"], what="compute_best_n"
    )
    rows = []
    for key, part in scaling.dropna(subset=["speedup"]).groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        best = part.loc[part["speedup"].idxmax()]
        floor = best["speedup_lo"] if pd.notna(best["speedup_lo"]) else best["speedup"]
        top = part["speedup_hi"].fillna(part["speedup"])
        close = sorted(int(n) for n in part.loc[top >= floor, "n"])
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "best_n": int(best["n"]),
                "speedup": float(best["speedup"]),
                "speedup_lo": float(best["speedup_lo"]),
                "speedup_hi": float(best["speedup_hi"]),
                "indistinguishable": " ".join(map(str, close)),
            }
        )
    if not rows:
        raise MissingInputError("no speedup to rank: the runs need baselines and step timings")
    return pd.DataFrame(rows)


def compute_required_survival(
    acceptance: pd.DataFrame,
    costs: pd.DataFrame,
    *,
    low_n: int | None = None,
    high_n: int | None = None,
    by: str | Iterable[str] = ("dataset", "method"),
) -> pd.DataFrame:
    """What raising the window from ``low_n`` to ``high_n`` (default: each group's
    smallest and largest n, 3 and 7 in the seeds) needs to pay under a profile.

    .. math::

        S(n_h) \\ge S(n_l) \\iff \\mathrm{AL}(n_h) - \\mathrm{AL}(n_l) \\ge
        \\mathrm{AL}(n_l) \\left(\\frac{C(n_h)}{C(n_l)} - 1\\right)

    Returns
    -------
    pandas.DataFrame
        One row per group and profile: ``low_n``, ``high_n``, ``speedup_low``,
        ``speedup_high`` (projected),
        ``extra_al`` (measured :math:`\\mathrm{AL}(n_h) - \\mathrm{AL}(n_l)`),
        ``needed_extra_al``, ``needed_mean_survival`` (the mean :math:`s_i` over positions
        :math:`n_l .. n_h - 1` that it takes) and ``rises`` (extra >= needed).
    """
    by = list(as_columns(by))
    projected = compute_projected_speedup(acceptance, costs)
    rows = []
    for key, part in projected.groupby([*by, "profile"], sort=True):
        a = int(part["n"].min()) if low_n is None else low_n
        b = int(part["n"].max()) if high_n is None else high_n
        low, high = part[part["n"] == a], part[part["n"] == b]
        if low.empty or high.empty or a == b:
            continue
        low, high = low.iloc[0], high.iloc[0]
        extra = float(high["accept_len"] - low["accept_len"])
        needed = float(low["accept_len"] * (high["step_cost"] / low["step_cost"] - 1.0))
        rows.append(
            {
                **dict(zip([*by, "profile"], key, strict=True)),
                "speedup_low": float(low["speedup"]),
                "speedup_high": float(high["speedup"]),
                "extra_al": extra,
                "needed_extra_al": needed,
                "low_n": a,
                "high_n": b,
                "needed_mean_survival": needed / (b - a) if b > a else np.nan,
                "rises": extra >= needed,
            }
        )
    return pd.DataFrame(rows)
