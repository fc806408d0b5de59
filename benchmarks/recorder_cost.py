"""What the vLLM recorder's flush thread spends turning staged engine steps into rows.

The flush thread runs beside the engine's thread, under the interpreter lock that thread
needs between its torch calls (and, on a small CPU machine, on a core its torch threads
would use), so its CPU time is what it can take from engine steps
(``benchmarks/v2_step_costs.py`` measures the stall it causes in a served harness, on a
few steps; this measures the work itself, steadily). Synthetic DSpark engine steps of
``--requests`` requests drafting ``--n`` tokens each, every tap field staged, random
acceptance, go through the recorder as the plugin hands them over (a host slot per step
from the staging ring), processed in flush turns of ``--turn`` steps and written as
parquet parts through a real :class:`~dsparklab.store.TraceWriter`. Best and median over
``--repeat`` passes, the flush thread's CPU (``time.thread_time``):

- ``processing``: the turns (slots into rows: steps, positions, requests);
- ``writing``: the parquet parts of those rows (``TraceWriter.flush``; every 10 s in a
  served engine, at the end here).

    .venv/bin/python benchmarks/recorder_cost.py --steps 2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import torch

from dsparklab.engines.reference.bench import markdown_table
from dsparklab.engines.vllm.core import FLOAT_FIELDS, FLOAT_VIEWS, HostSlot, StagingRing
from dsparklab.engines.vllm.recorder import TraceRecorder
from dsparklab.store import TraceWriter, new_run_json


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4, help="requests in each step")
    parser.add_argument("--n", type=int, default=7, help="tokens drafted per request")
    parser.add_argument("--steps", type=int, default=2000, help="engine steps per pass")
    parser.add_argument("--turn", type=int, default=25, help="steps per flush turn")
    parser.add_argument("--repeat", type=int, default=5)
    return parser.parse_args(argv)


def engine_steps(requests: int, n: int, steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``steps`` engine steps' staged values: every request verifies its previous draft
    (a random number of its tokens accepted) and drafts ``n`` more."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, np.ndarray]] = []
    for step in range(steps):
        accepted = rng.integers(0, n + 1, requests)
        floats = rng.standard_normal((len(FLOAT_FIELDS), requests, n))
        out.append(
            {
                "num_sampled": (accepted + 1 if step else np.ones(requests)).astype(np.int32),
                "num_rejected": (n - accepted if step else np.zeros(requests)).astype(np.int32),
                "seq_lens": np.full(requests, 100 + step * (n + 1), dtype=np.int64),
                "last_token": rng.integers(0, 49152, requests),
                "draft_tokens": rng.integers(0, 49152, (requests, n)),
                "floats": floats.astype(np.float32),
                "markov_flip": rng.integers(0, 2, (requests, n)).astype(np.int8),
            }
        )
    return out


def one_pass(
    args: argparse.Namespace, steps: list[dict[str, np.ndarray]], store: str
) -> tuple[float, float]:
    """One pass over ``steps``, its run written into ``store``: the flush thread's CPU
    seconds processing and writing."""
    specs = {name: (value.shape, torch.from_numpy(value).dtype) for name, value in steps[0].items()}
    # as the DSpark tap stages them: the float fields views of one block
    ring = StagingRing(specs, "cpu", views=FLOAT_VIEWS, num_slots=args.turn + 1)
    req_ids = [f"req-{i}-0123abcd" for i in range(args.requests)]
    meta = new_run_json(
        run_id="recorder-cost", engine={"name": "vllm"}, method="dspark",
        num_speculative_tokens=args.n, target={"name": "t"}, drafter=None, dataset="d",
        sampling={},
    )  # fmt: skip
    writer = TraceWriter(store, meta, flush_rows=10**9, flush_seconds=1e9)
    recorder = TraceRecorder(args.n, dataset="d", writer=writer)
    recorder.start_requests(req_ids)
    processing = 0.0
    for first in range(0, len(steps), args.turn):
        for values in steps[first : first + args.turn]:
            slot = ring.acquire()
            assert isinstance(slot, HostSlot)
            for name, value in values.items():
                ring.copy_in(slot, name, torch.from_numpy(value))
            slot.meta.update(req_ids=req_ids, num_drafted=args.n)
            recorder.stage(slot, ring.release)
        started = time.thread_time()
        recorder.process_ready()
        processing += time.thread_time() - started
    started = time.thread_time()
    writer.flush()
    writing = time.thread_time() - started
    recorder.finish_requests(req_ids)
    recorder.close()
    return processing, writing


def timed_pass(args: argparse.Namespace, steps: list[dict[str, np.ndarray]]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as store:
        return one_pass(args, steps, store)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = engine_steps(args.requests, args.n, args.steps)
    timed_pass(args, steps[: args.turn * 2])  # warm up imports and allocators
    passes = [timed_pass(args, steps) for _ in range(args.repeat)]
    rows = []
    for index, what in enumerate(("processing", "writing")):
        per_step = [p[index] / args.steps * 1e6 for p in passes]
        rows.append(
            {
                "flush thread": what,
                "us/step best": min(per_step),
                "us/step median": statistics.median(per_step),
                "us per position row": statistics.median(per_step) / (args.requests * args.n),
            }
        )
    print(
        f"# recorder: {args.steps} engine steps of {args.requests} requests x n = {args.n}, "
        f"flush turns of {args.turn} steps, {args.repeat} passes\n"
    )
    print(markdown_table(pd.DataFrame(rows), digits=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
