"""Wall-clock speedup of DSpark and Eagle3 over target-only decoding, reference engine, CPU.

Every configuration (none, DSpark n=3..7, Eagle3 n=3..7) decodes the same prompts,
interleaved within one run (see dsparklab.engines.reference.bench), greedy, tracing off.
Prints a markdown table: mean acceptance length, per-position survival, tokens/s and
speedup vs ``none`` (from each prompt's best round, robust to other processes on a
shared machine; the all-rounds figure is shown too); then the goal (DSpark n=7 >= 2.0x)
and whether the speedup rises from n=3 to n=7 for DSpark but not for Eagle3 (the
published Kimi shape); then decode-time acceptance tables for the zoo cards.

    .venv/bin/python benchmarks/reference_speedup.py --limit 8 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pandas as pd
import torch

from dsparklab.engines.plan import parse_ns
from dsparklab.engines.reference import bench

GOAL_DSPARK_N7 = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="3..7", help="speculative tokens, e.g. 3..7")
    bench.add_benchmark_arguments(parser, rounds=3)
    parser.add_argument("--json", type=Path, help="also write the table here")
    return parser.parse_args(argv)


def summarize(timings: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: AL, survival per position, tokens/s, speedup vs none.

    Times are each prompt's best round (robust to other processes on a shared machine);
    ``speedup (means)`` uses every round instead.
    """
    best = timings.groupby(["label", "prompt"], sort=False)["wall_time_s"].min()
    cpu = timings.groupby(["label", "prompt"], sort=False)["cpu_time_s"].min()
    base_best = best.loc["none"].sum()
    base_all = timings[timings["label"] == "none"].set_index(["round", "prompt"])
    rows = []
    for label, group in timings.groupby("label", sort=False):
        method, _, n = label.partition("-n")
        steps = int(group["num_steps"].sum())
        accepted = int(group["num_accepted"].sum())
        per_pos = [sum(col) for col in zip(*group["accepted_per_pos"], strict=True)]
        outputs = group.set_index(["round", "prompt"])["output"]
        tokens = group[group["round"] == 0]["num_tokens"].sum()
        rows.append(
            {
                "method": method,
                "n": int(n) if n else 0,
                "AL": 1 + accepted / steps if method != "none" else 1.0,
                "survival": " ".join(f"{a / steps:.2f}" for a in per_pos) if per_pos else "",
                "tok/s": tokens / best.loc[label].sum(),
                "speedup": base_best / best.loc[label].sum(),
                "speedup (means)": base_all["wall_time_s"].sum() / group["wall_time_s"].sum(),
                "speedup (CPU)": cpu.loc["none"].sum() / cpu.loc[label].sum(),
                "same tokens": bool((outputs == base_all["output"].loc[outputs.index]).all()),
            }
        )
    return pd.DataFrame(rows)


def card_tables(timings: pd.DataFrame, method: str, ns: list[int]) -> str:
    """Decode-time acceptance for a zoo card: a_i and s_i at the largest n, AL(n)."""
    rows = timings[timings["label"].str.startswith(f"{method}-n")]
    if rows.empty:
        return ""
    per_n = {}
    for label, group in rows.groupby("label"):
        steps = int(group["num_steps"].sum())
        per_pos = [sum(col) for col in zip(*group["accepted_per_pos"], strict=True)]
        per_n[int(label.partition("-n")[2])] = (steps, per_pos)
    top = max(per_n)
    steps, per_pos = per_n[top]
    reached = [steps, *per_pos[:-1]]
    positions = pd.DataFrame(
        {
            "position i": range(1, top + 1),
            "a_i (accepted given reached)": [
                a / r if r else float("nan") for a, r in zip(per_pos, reached, strict=True)
            ],
            "s_i (survival)": [a / steps for a in per_pos],
        }
    )
    lengths = pd.DataFrame(
        {"n": ["mean acceptance length AL(n)"]}
        | {str(n): [1 + sum(per_n[n][1]) / per_n[n][0]] for n in sorted(per_n)}
    )
    return (
        f"{method}, decode-time (reference engine), n = {top}:\n\n"
        f"{bench.markdown_table(positions, digits=3)}\n\n{bench.markdown_table(lengths, digits=3)}"
    )


def verdicts(table: pd.DataFrame, ns: list[int]) -> list[str]:
    lines = []
    speed = table.set_index(["method", "n"])["speedup"]
    low, high = min(ns), max(ns)
    if ("dspark", 7) in speed.index:
        value = speed[("dspark", 7)]
        status = "met" if value >= GOAL_DSPARK_N7 else "NOT met"
        lines.append(f"goal DSpark n=7 >= {GOAL_DSPARK_N7}x: {value:.2f}x ({status})")
    for method in ("dspark", "eagle3"):
        if (method, low) in speed.index and (method, high) in speed.index:
            a, b = speed[(method, low)], speed[(method, high)]
            trend = "rises" if b > a * 1.02 else "falls" if b < a * 0.98 else "flat (within 2%)"
            lines.append(f"{method}: n={low} {a:.2f}x -> n={high} {b:.2f}x: {trend}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    ns = parse_ns(args.n)
    models = bench.model_set(args)
    engines = {
        label: bench.benchmark_engine(
            models, method, n, max_new_tokens=args.max_new_tokens, trace=False
        )
        for label, method, n in [
            ("none", "none", 0),
            *((f"{m}-n{n}", m, n) for m in ("dspark", "eagle3") for n in ns),
        ]
    }
    prompts = bench.benchmark_prompts(args, models, engines)
    timings = bench.time_interleaved(engines, prompts, rounds=args.rounds)
    table = summarize(timings)
    print(
        f"reference engine, {len(prompts)} prompts ({args.dataset}), {args.max_new_tokens} "
        f"new tokens, {args.rounds} rounds interleaved, greedy, tracing off, "
        f"{args.threads} thread(s); target {models.target_ref.name}"
    )
    print()
    print(bench.markdown_table(table))
    print()
    for line in verdicts(table, ns):
        print(line)
    for method in ("dspark", "eagle3"):
        print()
        print(card_tables(timings, method, ns))
    if args.json:
        args.json.write_text(json.dumps(table.to_dict(orient="records"), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
