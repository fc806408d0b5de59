"""Model Runner V2's step costs, recorded by the plugin on the V2 CPU harness.

The harness (``dsparklab/engines/vllm/harness.py``) runs V2's engine step on vLLM's own
classes (``DSparkSpeculator``, ``EagleSpeculator``, ``RequestState``, ``InputBatch``, the
V2 runner's method order) with the plugin's own wrappers around it. This script:

1. collects DSpark and Eagle3 at n = 3 and 7 and the target-only baseline, traced, into
   ``--out`` (runs ``dsparklab report --runs DIR`` reads: speedup and its attribution);
2. serves the same requests again with tracing off and on, interleaved over ``--rounds``
   (the order flips every round); greedy decoding makes the same engine steps every time,
   so each step's best wall time over the rounds is compared: overhead = on / off - 1 of
   their sums (goal: <= 3 %), beside each round's own ratio;
3. checks the recorded costs against the driver's own clock: for every engine step that
   verified a draft, batch_size x (draft + verify + other) of its rows against the wall
   time the driver measured around ``execute_model`` + ``sample_tokens`` (goal: within 5 %);
4. prints each field's coverage (the share of rows where it is not null).

    .venv/bin/python benchmarks/v2_step_costs.py --out runs/v2-harness
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import uuid
from pathlib import Path

import pandas as pd

from dsparklab.engines.layout import CollectOptions, RunSpec
from dsparklab.engines.reference.bench import markdown_table
from dsparklab.engines.reference.collect import ModelSet
from dsparklab.engines.vllm import harness, runs
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.prompts import load_prompts
from dsparklab.store import read_trace
from dsparklab.store.location import Location

OVERHEAD_GOAL = 0.03
SUM_GOAL = 0.05
CONFIGS = (("dspark", 3), ("dspark", 7), ("eagle3", 3), ("eagle3", 7), ("none", 0))
STEP_FIELDS = ("draft_time_s", "verify_time_s", "other_time_s", "batch_size", "emitted")
POSITION_FIELDS = ("draft_logprob", "base_logprob", "markov_bias", "markov_flip", "confidence")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the traced runs are written")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per run")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=4, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=5, help="off/on repetitions")
    parser.add_argument(
        "--levels", default="full,light", help="tap levels to time (DSPARKLAB_TAP_LEVEL)"
    )
    return parser.parse_args(argv)


def options(args: argparse.Namespace, out: str | Path) -> CollectOptions:
    return CollectOptions(
        methods=("dspark", "eagle3", "none"),
        ns=(3, 7),
        datasets=(args.dataset,),
        out=out,
        limit=args.prompts,
        max_new_tokens=args.max_new_tokens,
        overwrite=True,
        progress=False,
    )


def step_sums(timelines: dict[str, list[harness.EngineStep]], out: Path) -> pd.DataFrame:
    """Per engine step that verified drafts: the rows' batch_size x share against its wall."""
    steps = read_trace(out, "steps")
    rows = []
    for name, timeline in timelines.items():
        run = steps[steps["run_id"] == name].set_index(["request_id", "step"])
        prompt_of = {
            req_id: req_id.rsplit("-", 1)[0] for step in timeline for req_id, _ in step.verified
        }
        for step in timeline:
            if not step.verified:
                continue
            keys = [(prompt_of[req_id], n) for req_id, n in step.verified]
            got = run.loc[keys]
            parts = got[["draft_time_s", "verify_time_s", "other_time_s"]].fillna(0.0).sum(axis=1)
            recorded = float((got["batch_size"] * parts).iloc[0])
            rows.append({"run": name, "wall_s": step.wall_s, "recorded_s": recorded})
    frame = pd.DataFrame(rows)
    frame["rel_err"] = (frame["recorded_s"] - frame["wall_s"]).abs() / frame["wall_s"]
    return frame


def overhead(args: argparse.Namespace, models: ModelSet) -> pd.DataFrame:
    """Each engine step's wall time with tracing off and on, interleaved, per configuration.

    Greedy decoding of the same requests through the same runner makes the same engine
    steps in every run, so steps pair up by index; the order (off, on) flips every round.
    """
    opts = options(args, tempfile.mkdtemp(prefix="v2-overhead-"))
    prompt_sets = {args.dataset: load_prompts(args.dataset, limit=args.prompts)}
    rows = []
    for round_index in range(args.rounds):
        for method, n in CONFIGS:
            spec = RunSpec(args.dataset, method, n)
            levels: list[str | None] = [None, *args.levels.split(",")]
            if (round_index + n) % 2:
                levels.reverse()
            for level in levels:
                traced = level is not None
                tap_config = None
                if level is not None:
                    trace_dir = Location.of(tempfile.mkdtemp(prefix="v2-taps-"))
                    tap_config = TapConfig(
                        trace_dir=trace_dir,
                        run_name=uuid.uuid4().hex[:8],
                        level=level,  # type: ignore[arg-type]
                    )
                (run,) = harness.serve(
                    opts,
                    method,
                    n,
                    [spec],
                    models=models,
                    prompt_sets=prompt_sets,
                    tap_config=tap_config,
                    max_num_seqs=args.max_num_seqs,
                )
                if traced:
                    runs.close_worker()
                config = spec.name.split("/", 1)[1]
                for index, step in enumerate(run.timeline):
                    rows.append(
                        {
                            "config": config,
                            "round": round_index,
                            "traced": level or "off",
                            "step": index,
                            "wall_s": step.wall_s,
                        }
                    )
    harness.patching.uninstall()
    return pd.DataFrame(rows)


def overhead_table(times: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and tap level: each step's best time over the rounds (the least
    disturbed run), summed over the steps (the first step, where a lazily made tap writes
    its run.json, is left out: a once-per-engine cost); overhead = on / off - 1. Also each
    round's own ratio of summed step times, to show the spread."""
    steady = times[times["step"] > 0]
    best = steady.groupby(["config", "traced", "step"])["wall_s"].min().unstack("traced")
    per_round = steady.groupby(["config", "round", "traced"])["wall_s"].sum().unstack("traced")
    sums = best.groupby("config").sum()
    steps = best.groupby("config").size()
    table = pd.DataFrame({"steps": steps, "ms/step off": sums["off"] / steps * 1e3})
    for level in [c for c in best.columns if c != "off"]:
        ratio = per_round[level] / per_round["off"] - 1
        table[f"ms/step {level}"] = sums[level] / steps * 1e3
        table[f"{level} %"] = (sums[level] / sums["off"] - 1) * 100
        table[f"{level} % per round"] = ratio.groupby("config").agg(
            lambda s: f"{s.min() * 100:.1f}..{s.max() * 100:.1f}"
        )
    first = times[times["step"] == 0].groupby(["config", "traced"])["wall_s"].min().unstack()
    table["first step ms off/on"] = [
        " / ".join(f"{first.loc[c, k] * 1e3:.0f}" for k in first.columns if k in ("off", "full"))
        for c in table.index
    ]
    return table


def coverage(out: Path) -> pd.DataFrame:
    steps = read_trace(out, "steps")
    positions = read_trace(out, "positions")
    table = steps.groupby("method")[list(STEP_FIELDS)].agg(lambda s: s.notna().mean())
    if not positions.empty:
        pos = positions.groupby("method")[list(POSITION_FIELDS)].agg(lambda s: s.notna().mean())
        table = table.join(pos, how="left")
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out)
    served = harness.collect(options(args, out), max_num_seqs=args.max_num_seqs)
    timelines = {run.spec.name: run.timeline for run in served}
    sums = step_sums(timelines, out)
    models = ModelSet("tiny-target")
    times = overhead(args, models)
    table = overhead_table(times)
    by_run = sums.groupby("run")["rel_err"].agg(["median", "max", "count"])
    print(
        f"# V2 harness step costs ({args.rounds} rounds, {args.prompts} prompts, "
        f"{args.max_new_tokens} tokens, {args.max_num_seqs} in flight)\n"
    )
    print(markdown_table(table.reset_index()))
    print(f"\noverhead goal: <= {OVERHEAD_GOAL:.0%} of the step")
    print("\n## batch_size x (draft + verify + other) against the driver's wall, per engine step\n")
    errors = by_run.assign(median=by_run["median"] * 100, max=by_run["max"] * 100)
    print(
        markdown_table(errors.rename(columns={"median": "median %", "max": "max %"}).reset_index())
    )
    print(f"\ngoal: within {SUM_GOAL:.0%}")
    print("\n## coverage (share of rows with the field)\n")
    print(markdown_table(coverage(out).reset_index(), digits=3))
    worst = float(sums["rel_err"].max())
    costliest = float(table[[c for c in table.columns if c.endswith(" %")]].max().max())
    print(f"\nworst step sum error {worst:.2%}; largest tracing overhead {costliest:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
