r"""``deepspec``: the ``metrics.json`` DeepSpec's DSpark evaluator writes per dataset.

Provenance (deepseek-ai/DeepSpec at afdfa7c9): the file is
``ConfidenceHeadRecorder.build_dataset_payload`` / ``write_dataset_outputs`` and
``confidence.per_position`` is ``PerPositionConfidenceMetrics.compute``, both in
``deepspec/eval/dspark/confidence_head.py``; ``spec`` is ``BaseEvaluator.build_metrics_row``
(``deepspec/eval/base_evaluator.py``), ``config.args`` the arguments of ``eval.py``.

Only the DSpark evaluator with a confidence head (and ``--confidence-threshold 0``) writes
it, to ``<tensorboard dir>/artifacts/step_<step>/<dataset>/metrics.json``, as
``{"config": {"args", "tasks"}, "spec", "confidence", "confidence_summary"}``, floats at
full precision and NaN where a metric is undefined:

- ``spec.accept_rates_by_position[i]``: the proposals that accepted position ``i`` over
  those that offered it (null where none did); ``acceptance_length``: committed tokens per
  proposal, bonus included except on a round that ends at an accepted EOS;
  ``draft_tokens_per_proposal``; ``verify_rate`` = acceptance_length /
  (draft_tokens_per_proposal + 1); ``num_samples``; ``dataset``;
- ``confidence.proposal_count`` (the proposals, one per verify round), ``sample_count`` and
  ``per_position[k]``: ``position``, ``total_weight`` (the proposals that offered ``k``),
  ``ece``, ``auc``, ``brier``, ``pred_mean``, ``target_mean`` of the head's prefix
  confidence :math:`\prod_{j \le k} c_j` against prefix acceptance, and ``reliability``:
  the non-empty ones of 20 equal-width bins, each ``{"bin", "range": [lo, hi], "avg_pred",
  "avg_target", "weight"}``. A position no proposal offered has ``total_weight`` 0.0, NaN
  metrics and ``reliability: []``.

When every proposal offered all ``n`` positions (``draft_tokens_per_proposal == n``) each
rate is :math:`A_i / D` with :math:`D` = ``proposal_count``, and the run gets those counts;
otherwise (a round cut at an accepted EOS offers fewer) it keeps the rates. The calibration
is DeepSpec's, one row per position and one per bin, with the bin's index and edges as
written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dsparklab.analysis.definitions import (
    Check,
    accept_len_from_marginal,
    check,
    counts_from_marginal_rates,
)
from dsparklab.importers._common import (
    DEFAULT_DATASET,
    Fields,
    ImportedRun,
    Options,
    SourceFile,
    imported_engine,
    json_records,
    marginal_counter_rows,
    worst_check,
)
from dsparklab.store.rows import counter_row, totals_row

RATES = "accept_rates_by_position"
SCORE = "prefix_confidence"


def _metric(f: Fields, key: str, *, high: float | None = 1.0) -> float | None:
    """A per-position metric in [0, high]; NaN (undefined, e.g. an AUC without negatives)
    and absent are None."""
    if not f.has(key):
        return None
    raw = f.value[key]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise f.error(key, f"expected a number, got {raw!r}")
    if math.isnan(raw):
        return None
    if raw < 0 or (high is not None and raw > high) or math.isinf(raw):
        raise f.error(key, f"{raw} is outside [0, {high}]")
    return float(raw)


def _bin_row(b: Fields, position: int) -> dict[str, Any]:
    edges = b.numbers("range", high=1.0)
    assert edges is not None
    if len(edges) != 2 or edges[0] >= edges[1]:
        raise b.error("range", f"expected [lo, hi] with lo < hi, got {b.value['range']!r}")
    return {
        "score": SCORE,
        "position": position,
        "bin": b.req_int("bin"),
        "bin_lo": edges[0],
        "bin_hi": edges[1],
        "count": b.req_float("weight", low=0.0),
        "pred_mean": b.req_float("avg_pred", low=0.0, high=1.0),
        "target_mean": b.req_float("avg_target", low=0.0, high=1.0),
        "ece": None,
        "auroc": None,
        "brier": None,
    }


def _calibration(conf: Fields, rates: Sequence[float]) -> tuple[list[dict[str, Any]], list[Check]]:
    """The calibration rows (per position, then its bins) and the checks against the bins."""
    n = len(rates)
    rows: list[dict[str, Any]] = []
    targets: list[tuple[str, float | None, float]] = []
    eces: list[tuple[str, float | None, float]] = []
    weights: list[tuple[str, float | None, float]] = []
    per_position = conf.array("per_position")
    assert per_position is not None
    for k, entry in enumerate(per_position):
        e = Fields(conf.source, entry, prefix=f"{conf.name('per_position')}[{k}]", line=conf.line)
        position = e.req_int("position")
        if position >= n:
            raise e.error("position", f"position {position} is outside the window n = {n}")
        total = e.req_float("total_weight", low=0.0)
        summary: dict[str, Any] = {
            "score": SCORE,
            "position": position,
            "bin": None,
            "bin_lo": None,
            "bin_hi": None,
            "count": total,
            "pred_mean": _metric(e, "pred_mean"),
            "target_mean": _metric(e, "target_mean"),
            "ece": _metric(e, "ece"),
            "auroc": _metric(e, "auc"),
            "brier": _metric(e, "brier"),
        }
        items = e.array("reliability")
        assert items is not None
        bins = [
            _bin_row(
                Fields(conf.source, item, prefix=f"{e.name('reliability')}[{b}]", line=e.line),
                position,
            )
            for b, item in enumerate(items)
        ]
        indices = [b["bin"] for b in bins]
        if len(set(indices)) != len(indices):
            dup = next(i for i in indices if indices.count(i) > 1)
            raise e.error("reliability", f"bin {dup} is listed twice")
        rows += [summary, *bins]
        if total > 0:
            case = str(position)
            err = sum(abs(b["pred_mean"] - b["target_mean"]) * b["count"] for b in bins) / total
            eces.append((case, summary["ece"], err))
            weights.append((case, total, sum(b["count"] for b in bins)))
            if not math.isnan(rates[position]):
                targets.append((case, summary["target_mean"], rates[position]))
    checks = worst_check(
        lambda worst: f"confidence ece vs its reliability bins (worst position: {worst})",
        eces,
        definition="ece@k = sum_b |avg_pred_b - avg_target_b| weight_b / total_weight@k",
    )
    checks += worst_check(
        lambda worst: f"confidence total_weight vs its bins' weights (worst position: {worst})",
        weights,
        definition="total_weight@k = sum_b weight_b (only empty bins are left out)",
    )
    checks += worst_check(
        lambda worst: f"confidence target_mean vs {RATES} (worst position: {worst})",
        targets,
        definition="target_mean@k = prefix acceptance at k = accept_rates_by_position[k] "
        "(the head observes every proposal at threshold 0)",
    )
    return rows, checks


def _one(source: SourceFile, record: Any, line: int | None, options: Options) -> ImportedRun:
    top = Fields(source, record, line=line)
    spec = top.sub("spec")
    rates = spec.window_rates(RATES, options.n, empty="no drafted positions", allow_null=True)
    n = len(rates)
    finite = np.array([r for r in rates if not math.isnan(r)])
    if len(finite) > 1 and np.any(np.diff(finite) > 1e-12):
        worst = int(np.argmax(np.diff(np.nan_to_num(rates, nan=0.0)))) + 1
        raise spec.error(
            f"{RATES}[{worst}]", "exceeds the previous position's rate: not a prefix survival"
        )
    if not len(finite):
        raise spec.error(RATES, "every rate is null: no position was offered")
    length = spec.number("acceptance_length", low=0.0, optional=True)
    per_proposal = spec.number("draft_tokens_per_proposal", low=0.0, optional=True)
    verify_rate = spec.number("verify_rate", low=0.0, high=1.0, optional=True)
    samples = spec.integer("num_samples", optional=True)
    dataset = options.dataset or spec.text("dataset") or source.path.parent.name or DEFAULT_DATASET
    conf = top.sub("confidence") if top.has("confidence") else None
    proposals = conf.integer("proposal_count", optional=True) if conf is not None else None

    checks: list[Check] = []
    notes = ["calibration as DeepSpec computed it: each bin's index and range as written"]
    full = bool(proposals) and per_proposal is not None and abs(per_proposal - n) <= 1e-9 * n
    drafts = draft_tokens = accepted_tokens = None
    if full:
        assert proposals is not None
        if len(finite) < n:
            raise spec.error(RATES, f"a null rate, but every proposal offered all {n} positions")
        with spec.definition_errors(RATES):
            accepted = counts_from_marginal_rates(rates, proposals, field=spec.name(RATES))
        counters = marginal_counter_rows(proposals, n * proposals, accepted)
        drafts, draft_tokens, accepted_tokens = proposals, n * proposals, int(accepted.sum())
        if length is not None and samples is not None:
            computed = accept_len_from_marginal(rates)
            # each sample ends at most one round at an accepted EOS, which commits no bonus
            slack = samples / proposals
            checks.append(
                check(
                    f"acceptance_length vs 1 + sum_i {RATES}",
                    length,
                    computed,
                    definition="committed tokens per proposal = 1 + sum_i s_i, less 1 / "
                    "proposal_count per round that ends at an accepted EOS (one per sample "
                    "at most)",
                    tolerance=slack / max(1.0, computed),
                )
            )
        notes.append(
            f"every proposal offered all {n} positions: counts A_i = rate_i x proposal_count"
        )
    else:
        counters = [counter_row(i, survival=r) for i, r in enumerate(rates) if not math.isnan(r)]
        notes.append(
            "rates only: some proposals offered fewer than n positions (a round cut at an "
            "accepted EOS), so the rates have different denominators and give no counts; "
            "acceptance_length is then not 1 + sum_i s_i (not checked)"
        )
    if length is not None and per_proposal is not None and verify_rate is not None:
        checks.append(
            check(
                "verify_rate",
                verify_rate,
                length / (per_proposal + 1.0),
                definition="acceptance_length / (draft_tokens_per_proposal + 1)",
            )
        )
    totals = totals_row(
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted_tokens,
        reported_accept_len=length,
        reported_accept_len_definition="committed_per_round" if length is not None else None,
    )
    tables: dict[str, list[dict[str, Any]]] = {"counters": counters, "totals": [totals]}
    if conf is not None and conf.has("per_position"):
        tables["calibration"], calibration_checks = _calibration(conf, rates)
        checks += calibration_checks
    # the run's settings, where the file has them: optional, but typed when present
    config = top.sub("config") if top.has("config") else None
    args = config.sub("args") if config is not None and config.has("args") else None
    temperature = args.number("temperature", optional=True) if args is not None else None
    target = args.text("target_name_or_path") if args is not None else None
    drafter = args.text("draft_name_or_path") if args is not None else None
    return ImportedRun(
        fmt="deepspec",
        sources=[source],
        granularity="aggregate",
        n=n,
        method=options.method_or_default,
        dataset=dataset,
        engine=imported_engine("deepspec"),
        target={"name": target or "unknown"},
        drafter={"name": drafter or "unknown"},
        sampling={"temperature": temperature},
        tables=tables,
        reported={
            "acceptance_length (committed per round)": length,
            "draft_tokens_per_proposal": per_proposal,
            "verify_rate": verify_rate,
            "num_samples": samples,
            "proposal_count": proposals,
            "sample_count": conf.value.get("sample_count") if conf is not None else None,
            "step": args.value.get("step") if args is not None else None,
            "confidence_summary": top.value.get("confidence_summary"),
        },
        checks=checks,
        notes=notes,
    )


def import_deepspec(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """One run per metrics.json (one dataset each)."""
    runs = []
    for source in sources:
        records = json_records(source)
        if len(records) != 1 or not isinstance(records[0].value, dict):
            raise source.error("expected one JSON object (a metrics.json)", field="spec")
        runs.append(_one(source, records[0].value, records[0].line, options))
    return runs
