r"""``deepspec``: the ``metrics.json`` DeepSpec's evaluator writes per dataset.

- ``spec.accept_rates_by_position[i]``: proposals whose accepted prefix passed position
  ``i`` over proposals that offered it: the survival :math:`s_i` (a marginal rate, rounded
  to 4 decimals; null where no proposal offered ``i``); newer files add
  ``conditional_accept_rates_by_position`` (:math:`a_i`);
- ``spec.acceptance_length``: mean committed tokens per proposal, bonus included except
  on a round that ends in EOS; ``draft_tokens_per_proposal``, ``verify_rate``,
  ``num_samples``, ``dataset``;
- ``confidence.per_position[k]``: ``position``, ``ece``, ``auc``, ``brier``,
  ``pred_mean``, ``target_mean`` (and ``total_weight``) of the head's *prefix* confidence
  :math:`\prod_{j \le k} c_j` against prefix acceptance, and ``reliability`` bins
  (``avg_pred``, ``avg_target``, ``weight``).

Only rates are in the file, so the run keeps rates (it cannot be pooled with other runs)
and the reported calibration (it cannot be recomputed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dsparklab.analysis.definitions import (
    accept_len_from_marginal,
    check,
    conditional_from_marginal,
)
from dsparklab.importers._common import (
    DEFAULT_DATASET,
    Fields,
    ImportedRun,
    Options,
    SourceFile,
    imported_engine,
    json_records,
    largest_difference_check,
    worst_check,
)
from dsparklab.store.rows import counter_row, totals_row

RATES = "accept_rates_by_position"
BIN_LOW = ("bin_lower", "bin_lo", "lower", "lo", "bin_start")
BIN_HIGH = ("bin_upper", "bin_hi", "upper", "hi", "bin_end")


def _number(
    f: Fields, key: str, *aliases: str, low: float | None = 0.0, high: float | None = None
) -> float | None:
    for name in (key, *aliases):
        if name in f.value:
            if f.value[name] is None:
                return None
            raw = f.value[name]
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise f.error(name, f"expected a number, got {raw!r}")
            if not math.isfinite(raw):
                return None  # DeepSpec writes NaN where an AUC is undefined
            if (low is not None and raw < low) or (high is not None and raw > high):
                raise f.error(name, f"{raw} is outside [{low}, {high}]")
            return float(raw)
    return None


def _calibration_rows(conf: Fields, n: int) -> tuple[list[dict[str, Any]], list[float]]:
    rows: list[dict[str, Any]] = []
    target_means: list[float] = []
    per_position = conf.array("per_position")
    assert per_position is not None
    for k, entry in enumerate(per_position):
        e = Fields(conf.source, entry, prefix=f"{conf.name('per_position')}[{k}]", line=conf.line)
        position = e.req_int("position")
        if position >= n:
            raise e.error("position", f"position {position} is outside the window n = {n}")
        target = _number(e, "target_mean", high=1.0)
        target_means.append(math.nan if target is None else target)
        rows.append(
            {
                "score": "prefix_confidence",
                "position": position,
                "bin": None,
                "bin_lo": None,
                "bin_hi": None,
                "count": _number(e, "total_weight", "count", "weight", high=None),
                "pred_mean": _number(e, "pred_mean", high=1.0),
                "target_mean": target,
                "ece": _number(e, "ece", high=1.0),
                "auroc": _number(e, "auc", "auroc", high=1.0),
                "brier": _number(e, "brier", high=1.0),
            }
        )
        bins = entry.get("reliability") if isinstance(entry, Mapping) else None
        if bins is None:
            continue
        if isinstance(bins, Mapping):  # columns: {"avg_pred": [...], "avg_target": [...], ...}
            width = max((len(v) for v in bins.values() if isinstance(v, list)), default=0)
            bins = [
                {
                    key: (v[i] if isinstance(v, list) and i < len(v) else None)
                    for key, v in bins.items()
                }
                for i in range(width)
            ]
        if not isinstance(bins, list):
            raise e.error("reliability", f"expected a list of bins, got {type(bins).__name__}")
        for b, item in enumerate(bins):
            bf = Fields(conf.source, item, prefix=f"{e.name('reliability')}[{b}]", line=conf.line)
            rows.append(
                {
                    "score": "prefix_confidence",
                    "position": position,
                    "bin": b,
                    "bin_lo": _number(bf, BIN_LOW[0], *BIN_LOW[1:], high=1.0),
                    "bin_hi": _number(bf, BIN_HIGH[0], *BIN_HIGH[1:], high=1.0),
                    "count": _number(bf, "weight", "count", high=None),
                    "pred_mean": _number(bf, "avg_pred", "pred_mean", "confidence", high=1.0),
                    "target_mean": _number(bf, "avg_target", "target_mean", "accuracy", high=1.0),
                    "ece": None,
                    "auroc": None,
                    "brier": None,
                }
            )
    return rows, target_means


def _one(source: SourceFile, record: Any, line: int | None, options: Options) -> ImportedRun:
    top = Fields(source, record, line=line)
    spec = top.sub("spec")
    rates = spec.window_rates(RATES, options.n, empty="no drafted positions", allow_null=True)
    n = len(rates)
    conditional = spec.numbers(
        "conditional_accept_rates_by_position", optional=True, allow_null=True, high=1.0
    )
    if conditional is not None and len(conditional) != n:
        raise spec.error(
            "conditional_accept_rates_by_position", f"{len(conditional)} entries for {n} positions"
        )
    survival = np.array(rates)
    finite = survival[~np.isnan(survival)]
    if len(finite) > 1 and np.any(np.diff(finite) > 1e-4):
        worst = int(np.argmax(np.diff(np.nan_to_num(survival, nan=0.0)))) + 1
        raise spec.error(
            f"{RATES}[{worst}]", "exceeds the previous position's rate: not a prefix survival"
        )
    length = spec.number("acceptance_length", low=0.0, optional=True)
    per_proposal = spec.number("draft_tokens_per_proposal", low=0.0, optional=True)
    verify_rate = spec.number("verify_rate", low=0.0, high=1.0, optional=True)
    dataset = options.dataset or spec.text("dataset") or source.path.parent.name or DEFAULT_DATASET
    checks = []
    full_blocks = per_proposal is not None and abs(per_proposal - n) < 0.05
    if length is not None:
        checks.append(
            check(
                "acceptance_length vs accept_rates_by_position",
                length,
                accept_len_from_marginal(rates),
                definition="committed_per_round vs 1 + sum_i s_i (rates rounded to 4 decimals)",
                tolerance=5e-5 * (n + 1) + (0.0 if full_blocks else 0.05),
                note="equal up to rounding when every proposal offers all n positions and few "
                "rounds end in EOS"
                + ("" if full_blocks else f"; here {per_proposal} per proposal"),
            )
        )
    if length is not None and per_proposal is not None and verify_rate is not None:
        checks.append(
            check(
                "verify_rate",
                verify_rate,
                length / (per_proposal + 1.0),
                definition="acceptance_length / (draft_tokens_per_proposal + 1)",
                tolerance=1e-3,
            )
        )
    if conditional is not None:
        checks.append(
            largest_difference_check(
                "conditional_accept_rates_by_position vs survival ratios (largest difference)",
                conditional,
                conditional_from_marginal(rates),
                definition="a_i = s_i / s_{i-1}",
                tolerance=1e-3,
            )
        )
    tables: dict[str, list[dict[str, Any]]] = {
        "counters": [
            counter_row(
                i,
                accept_rate=None if conditional is None else conditional[i],
                survival=rates[i],
            )
            for i in range(n)
            if not (math.isnan(rates[i]) and (conditional is None or math.isnan(conditional[i])))
        ],
        "totals": [
            totals_row(
                reported_accept_len=length,
                reported_accept_len_definition="committed_per_round"
                if length is not None
                else None,
            )
        ],
    }
    if top.has("confidence"):
        conf = top.sub("confidence")
        if conf.has("per_position"):
            rows, targets = _calibration_rows(conf, n)
            tables["calibration"] = rows
            checks += worst_check(
                lambda _: "confidence target_mean vs accept_rates_by_position (worst position)",
                [
                    (str(k), t, s)
                    for k, (t, s) in enumerate(zip(targets, rates, strict=False))
                    if not (math.isnan(t) or math.isnan(s))
                ],
                definition="target_mean@k = prefix acceptance = s_k (threshold 0)",
                tolerance=2e-4,
            )
    if not tables["counters"]:
        raise spec.error(RATES, "every rate is null: no position was offered")
    config: Mapping[str, Any] = _mapping(top.value.get("config"))
    args: Mapping[str, Any] = _mapping(config.get("args"))
    return ImportedRun(
        fmt="deepspec",
        sources=[source],
        granularity="aggregate",
        n=n,
        method=options.method_or_default,
        dataset=dataset,
        engine=imported_engine("deepspec"),
        target={"name": str(args.get("target_name_or_path") or "unknown")},
        drafter={"name": str(args.get("draft_name_or_path") or "unknown")},
        sampling={
            "temperature": args.get("temperature")
            if isinstance(args.get("temperature"), (int, float))
            else None
        },
        tables=tables,
        reported={
            "acceptance_length (committed per round)": length,
            "draft_tokens_per_proposal": per_proposal,
            "verify_rate": verify_rate,
            "num_samples": spec.value.get("num_samples"),
            "confidence_summary": top.value.get("confidence_summary"),
        },
        checks=checks,
        notes=["rates only: the file has no counts; calibration as DeepSpec computed it"],
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def import_deepspec(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """One run per metrics.json (one dataset each)."""
    runs = []
    for source in sources:
        records = json_records(source)
        if len(records) != 1 or not isinstance(records[0].value, dict):
            raise source.error("expected one JSON object (a metrics.json)", field="spec")
        runs.append(_one(source, records[0].value, records[0].line, options))
    return runs
