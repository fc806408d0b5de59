"""The smol cards' evaluation: target degeneracy and offline drafter acceptance, per
held-out prompt set (HumanEval and ``instruct``), on the target's own greedy answers.

Offline acceptance is :func:`dsparklab.zoo.evaluate.evaluate_drafters` (teacher-forced
replay of greedy verification, compared in target ids); the decode-time figures come
from the reference engine's shipped traces (``data/traces/smol``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from dsparklab.prompts import load_prompts
from dsparklab.zoo.evaluate import distinct_ratio, evaluate_drafters
from dsparklab.zoo.smol.config import SmolConfig
from dsparklab.zoo.smol.data import generate_responses

EVAL_SETS = ("humaneval", "instruct")


def evaluate_smol(
    cfg: SmolConfig,
    target: Any,
    tokenizer: Any,
    dspark: Any | None,
    eagle3: Any | None,
    *,
    cache: Path,
) -> dict[str, Any]:
    """Per prompt set: answer length, distinct-token ratio and offline acceptance.

    The target's greedy answers come from batched generation (cached as JSONL in
    ``cache``); padding cannot bias the acceptance, which compares the drafters with
    the target's own argmax over the unpadded answer.
    """
    ec = cfg.eval
    start = time.time()
    limits = {"humaneval": ec.humaneval_prompts, "instruct": ec.instruct_prompts}
    answers_cfg = cfg.responses.model_copy(update={"max_new_tokens": ec.gen_len})
    shortest = max(ec.max_n, dspark.block_size if dspark is not None else 0) + 2
    result: dict[str, Any] = {"gen_len": ec.gen_len, "max_n": ec.max_n, "sets": {}}
    for name in EVAL_SETS:
        prompts = load_prompts(name, limit=limits[name])
        records = generate_responses(
            target, tokenizer, prompts, answers_cfg, cache / f"eval-{name}-{ec.gen_len}.jsonl"
        )
        answers = [r["response_ids"] for r in records]
        # An answer shorter than a block plus its anchor leaves no DSpark anchor.
        sequences = [
            (r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"]))
            for r in records
            if len(r["response_ids"]) >= shortest
        ]
        acceptance = evaluate_drafters(
            target,
            sequences,
            dspark=dspark,
            eagle3=eagle3,
            max_n=ec.max_n,
            dspark_anchors=ec.dspark_anchors,
            seed=ec.seed,
        )
        ratios = [distinct_ratio(a) for a in answers]
        result["sets"][name] = {
            "prompts": len(prompts),
            "answers_evaluated": len(sequences),
            "answer_tokens_mean": round(float(np.mean([len(a) for a in answers])), 1),
            "distinct_ratio_mean": round(float(np.mean(ratios)), 4),
            "distinct_ratio_median": round(float(np.median(ratios)), 4),
            "acceptance": acceptance,
        }
    result["chance_position0"] = 1.0 / len(tokenizer)
    result["seconds"] = round(time.time() - start, 1)
    return result
