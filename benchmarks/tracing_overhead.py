"""Cost of tracing in the reference engine: the same decoding with tracing on and off.

For each configuration (default DSpark n=3 and n=7, Eagle3 n=7, target-only), the
traced and untraced engines decode the same prompts, interleaved within one run.
Overhead = traced time / untraced time - 1 (goal <= 3 %), from each prompt's best
round, in this thread's CPU time (what tracing costs, insensitive to other processes
competing for the cores) and in wall time (plus the all-rounds wall figure). The "store" column
adds what writing those rows through the TraceWriter costs (parquet, fsync) per request,
measured separately on the rows the traced runs produced.

    .venv/bin/python benchmarks/tracing_overhead.py --limit 8 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from dsparklab.engines.layout import parse_list
from dsparklab.engines.reference import ReferenceEngine, bench, record_row
from dsparklab.store import TraceWriter, new_run_json

GOAL = 0.03
CONFIGS = "dspark-n3,dspark-n7,eagle3-n7,none"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=CONFIGS, help="comma list of METHOD-nK / none")
    bench.add_benchmark_arguments(parser, rounds=5)
    return parser.parse_args(argv)


def store_cost(engine: ReferenceEngine, prompts: list[list[int]]) -> float:
    """Seconds per request to write a traced request's rows through the TraceWriter."""
    results = [engine.generate(p, request_id=f"p{i}") for i, p in enumerate(prompts)]
    meta = new_run_json(
        run_id="overhead",
        engine={"name": "reference", "version": "bench"},
        method=engine.config.method,
        num_speculative_tokens=engine.config.num_speculative_tokens,
        target={"name": "t", "path": "t", "content_hash": "sha256:0"},
        drafter=None,
        dataset="bench",
        sampling={"temperature": 0.0, "seed": 0},
    )
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        with TraceWriter(Path(tmp) / "run", meta) as writer:
            for result in results:
                extra = {"request_id": result.request_id, "prompt_id": "p", "dataset": "bench"}
                writer.add_many("steps", [record_row(s, **extra) for s in result.steps])
                writer.add_many(
                    "positions",
                    [record_row(p, request_id=result.request_id) for p in result.positions],
                )
                writer.add(
                    "requests",
                    {
                        **extra,
                        "prompt_token_ids": result.prompt_token_ids,
                        "output_token_ids": result.output_token_ids,
                        "output_text": "",
                        "wall_time_s": result.wall_time_s,
                    },
                )
        return (time.perf_counter() - start) / len(results)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    models = bench.model_set(args)
    engines: dict[str, ReferenceEngine] = {}
    for label in parse_list(args.configs):
        method, _, n = label.partition("-n")
        for trace in (True, False):
            engines[f"{label}/{'on' if trace else 'off'}"] = bench.benchmark_engine(
                models, method, int(n or 0), max_new_tokens=args.max_new_tokens, trace=trace
            )
    prompts = bench.benchmark_prompts(args, models, engines)
    timings = bench.time_interleaved(engines, prompts, rounds=args.rounds)
    timings["config"] = timings["label"].str.split("/").str[0]
    timings["trace"] = timings["label"].str.split("/").str[1]
    rows = []
    for config, group in timings.groupby("config", sort=False):
        # each prompt's best round: robust to other processes on a shared machine
        best = group.groupby(["prompt", "trace"])[["wall_time_s", "cpu_time_s"]].min()
        wall = best["wall_time_s"].unstack("trace")
        cpu = best["cpu_time_s"].unstack("trace")
        means = group.groupby("trace")["wall_time_s"].sum()
        store = store_cost(engines[f"{config}/on"], prompts)
        rows.append(
            {
                "config": config,
                "off s/req": wall["off"].mean(),
                "on s/req": wall["on"].mean(),
                "overhead (CPU)": cpu["on"].sum() / cpu["off"].sum() - 1,
                "overhead (wall)": wall["on"].sum() / wall["off"].sum() - 1,
                "overhead (wall, means)": means["on"] / means["off"] - 1,
                "store s/req": store,
                "store share": store / wall["on"].mean(),
            }
        )
    table = pd.DataFrame(rows)
    print(
        f"reference engine, {len(prompts)} prompts ({args.dataset}), {args.max_new_tokens} "
        f"new tokens, {args.rounds} rounds interleaved, greedy, {args.threads} thread(s)"
    )
    print()
    shown = table.copy()
    for column in ("overhead (CPU)", "overhead (wall)", "overhead (wall, means)", "store share"):
        shown[column] = shown[column].map(lambda v: f"{100 * v:+.1f}%")
    print(bench.markdown_table(shown, digits=4))
    print()
    for column in ("overhead (CPU)", "overhead (wall)"):
        worst = table[column].max()
        status = "met" if worst <= GOAL else "NOT met"
        print(f"goal tracing {column} <= {100 * GOAL:.0f}%: worst {100 * worst:+.1f}% ({status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
