"""The smol cards' evaluation: held-out benchmark prompts, offline acceptance, learning curve.

Offline acceptance is :func:`dsparklab.zoo.evaluate.evaluate_drafters` (teacher-forced
replay of greedy verification, compared in target ids) on the target's own greedy answers
to held-out prompts of each benchmark set (never trained on: the training pool is
deduplicated against them). The learning curve evaluates every snapshot the training
left (after ~0.1, 0.3, 1 M answer tokens) and the final drafter the same way. The
confidence head is judged per position, raw and calibrated, by ECE against acceptance
given the position was reached. Decode-time figures come from the reference engine's
traces (``data/traces/smol``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dsparklab.analysis.definitions import compute_ece
from dsparklab.prompts import load_prompts
from dsparklab.zoo.calibrate import apply_temperatures, read_temperatures
from dsparklab.zoo.evaluate import distinct_ratio, dspark_block_correct, evaluate_drafters
from dsparklab.zoo.load import load_dspark_drafter, load_eagle3_drafter
from dsparklab.zoo.smol.config import DSPARK_NAME, SmolConfig
from dsparklab.zoo.smol.data import generate_responses


def eval_sequences(
    cfg: SmolConfig, target: Any, tokenizer: Any, dataset: str, limit: int, cache: Path
) -> tuple[list[dict[str, Any]], list[tuple[list[int], int]]]:
    """The target's greedy answers to ``dataset``'s first ``limit`` prompts (cached) and
    the (ids, prompt length) pairs long enough for a DSpark block."""
    ec = cfg.eval
    prompts = load_prompts(dataset, limit=limit)
    records = generate_responses(
        target, tokenizer, prompts, ec.gen_len, cache / f"eval-{dataset}-{ec.gen_len}.jsonl"
    )
    shortest = max(ec.max_n, cfg.dspark.block_size) + 2
    sequences = [
        (r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"]))
        for r in records
        if len(r["response_ids"]) >= shortest
    ]
    return records, sequences


def confidence_calibration(
    drafter: Any,
    target: Any,
    sequences: list[tuple[list[int], int]],
    max_n: int,
    temperatures: list[float] | None,
) -> dict[str, Any]:
    """Per-position ECE (10 bins) of the raw and calibrated confidence, on reached positions."""
    corrects, confs = [], []
    for ids, prompt_len in sequences:
        correct, conf = dspark_block_correct(drafter, target, ids, prompt_len)
        corrects.append(correct[:, :max_n])
        confs.append(conf[:, :max_n])
    correct, raw = np.concatenate(corrects), np.concatenate(confs)
    reached = np.concatenate(
        [np.ones((len(correct), 1), bool), np.cumprod(correct, axis=1)[:, :-1] > 0], axis=1
    )
    scores = {"raw": raw}
    if temperatures:
        scores["calibrated"] = apply_temperatures(raw, temperatures)
    out: dict[str, Any] = {"rows": [int(reached[:, i].sum()) for i in range(max_n)]}
    # positions no block reached have no score to judge: NaN
    for name, score in scores.items():
        out[f"ece_{name}"] = [
            float(compute_ece(score[reached[:, i], i], correct[reached[:, i], i]))
            if reached[:, i].any()
            else float("nan")
            for i in range(max_n)
        ]
        out[f"mean_{name}"] = [_mean(score[reached[:, i], i]) for i in range(max_n)]
    out["acceptance_given_reached"] = [_mean(correct[reached[:, i], i]) for i in range(max_n)]
    return out


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else float("nan")


def evaluate_smol(
    cfg: SmolConfig,
    target: Any,
    tokenizer: Any,
    dspark: Any | None,
    eagle3: Any | None,
    *,
    cache: Path,
    zoo_dir: Path | None = None,
    snapshots: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """Per held-out set: answer length, distinct-token ratio, offline acceptance and
    confidence calibration; then the learning curve over the training snapshots."""
    ec = cfg.eval
    start = time.time()
    result: dict[str, Any] = {"gen_len": ec.gen_len, "max_n": ec.max_n, "sets": {}}
    temperatures = read_temperatures(zoo_dir / DSPARK_NAME) if zoo_dir is not None else None
    for name in ec.datasets:
        records, sequences = eval_sequences(cfg, target, tokenizer, name, ec.prompts, cache)
        answers = [r["response_ids"] for r in records]
        acceptance = evaluate_drafters(target, sequences, ec, dspark=dspark, eagle3=eagle3)
        ratios = [distinct_ratio(a) for a in answers]
        entry = {
            "prompts": len(records),
            "answers_evaluated": len(sequences),
            "answer_tokens_mean": round(float(np.mean([len(a) for a in answers])), 1),
            "distinct_ratio_mean": round(float(np.mean(ratios)), 4),
            "distinct_ratio_median": round(float(np.median(ratios)), 4),
            "acceptance": acceptance,
        }
        if dspark is not None and dspark.confidence_head is not None:
            entry["confidence"] = confidence_calibration(
                dspark, target, sequences, ec.max_n, temperatures
            )
        result["sets"][name] = entry
    result["learning_curve"] = learning_curve(cfg, target, tokenizer, cache, snapshots or {})
    result["chance_position0"] = 1.0 / len(tokenizer)
    result["seconds"] = round(time.time() - start, 1)
    return result


def learning_curve(
    cfg: SmolConfig,
    target: Any,
    tokenizer: Any,
    cache: Path,
    snapshots: Mapping[str, Mapping[str, str]],
) -> list[dict[str, Any]]:
    """Offline AL(max_n) of each snapshot on the curve sets: one row per (drafter, tokens,
    dataset). Snapshots are keyed by the answer tokens seen when they were taken."""
    ec = cfg.eval
    loaders = {"dspark": load_dspark_drafter, "eagle3": load_eagle3_drafter}
    sets = {
        name: eval_sequences(cfg, target, tokenizer, name, ec.curve_prompts, cache)[1]
        for name in ec.curve_datasets
    }
    rows = []
    for method, by_tokens in snapshots.items():
        for tokens, path in sorted(by_tokens.items(), key=lambda kv: int(kv[0])):
            drafter = loaders[method](Path(path))
            for name, sequences in sets.items():
                summary = evaluate_drafters(
                    target,
                    sequences,
                    ec,
                    dspark=drafter if method == "dspark" else None,
                    eagle3=drafter if method == "eagle3" else None,
                )[method]
                rows.append(
                    {
                        "method": method,
                        "answer_tokens": int(tokens),
                        "dataset": name,
                        "prompts": len(sequences),
                        f"offline_al_{ec.max_n}": summary["accept_len"][ec.max_n],
                        "survival_last": summary["survival"][-1],
                    }
                )
    return rows
