"""The V2 step-cost benchmark (``benchmarks/v2_step_costs.py``).

Its host-work clock counts the time a wrapper of the patch table spends around vLLM's
function, once per engine step, never vLLM's own time, also for a wrapper entered inside
another's vLLM call; the clock is a fake one that the functions below advance, so every
figure is exact. Its draft-pass measure runs each traced speculator untraced too: on vLLM's
own methods, with no wrapper of the plugin's in the way, and its wrappers back after."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from dsparklab.engines.vllm import patch_table, patching, runs
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.engines.vllm.patch_table import V2_EXECUTE, V2_FORWARD_START, wrapper_of
from dsparklab.engines.vllm.staging import MARK
from tests.benchmark_scripts import load_benchmark

if TYPE_CHECKING:
    from conftest import CpuDSpark


def _module() -> Any:
    return load_benchmark("v2_step_costs")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


def _spends(clock: FakeClock, seconds: float) -> Callable[[Any], Any]:
    """A wrapper's maker that spends ``seconds`` of its own before calling vLLM's function."""

    def make(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            clock.spend(seconds)
            return original(*args, **kwargs)

        return wrapper

    return make


@pytest.fixture
def slow_wrappers(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """execute_model's wrapper spends 3 s of its own, forward_start's 1 s."""
    makes = {V2_EXECUTE: _spends(clock, 3.0), V2_FORWARD_START: _spends(clock, 1.0)}
    patches = tuple(
        dataclasses.replace(p, make=makes[p.point]) if p.point in makes else p
        for p in patch_table.PATCHES
    )
    monkeypatch.setattr(patch_table, "PATCHES", patches)


def _steps(clock: FakeClock, count: int) -> None:
    """``count`` engine steps: vLLM's execute_model (10 s of its own) calls forward_start
    (100 s of vLLM's own)."""
    forward_start = wrapper_of(V2_FORWARD_START)(lambda: clock.spend(100.0))

    def execute_model() -> None:
        clock.spend(10.0)
        forward_start()

    wrapped = wrapper_of(V2_EXECUTE)(execute_model)
    for _ in range(count):
        wrapped()


def test_host_work_is_the_wrappers_own_time_once_per_step(
    clock: FakeClock, slow_wrappers: None
) -> None:
    bench = _module()
    table = patch_table.PATCHES
    with bench.timing_host_work() as per_step:
        _steps(clock, 2)
    assert per_step == [4.0, 4.0]  # 3 s + 1 s of the wrappers', none of vLLM's 110 s
    assert patch_table.PATCHES is table  # the timed makes are gone again


def test_the_bare_run_times_only_the_timer(clock: FakeClock, slow_wrappers: None) -> None:
    bench = _module()
    with bench.timing_host_work(plugin=False) as per_step:
        _steps(clock, 2)
    assert per_step == [0.0, 0.0]


def _wrapped(spec: Any) -> list[str]:
    """The plugin's wrappers in the way of ``spec``'s methods and its draft model's."""
    found = [
        f"{cls.__name__}.{name}"
        for cls in type(spec).__mro__
        for name, value in vars(cls).items()
        if getattr(value, MARK, False)
    ]
    return found + [f"model.{k}" for k, v in vars(spec.model).items() if getattr(v, MARK, False)]


def test_the_draft_pass_runs_each_traced_speculator_untraced_too(
    cpu_dspark: CpuDSpark, build_speculator: Any, feed_speculator: Any, tmp_path: Path
) -> None:
    pytest.importorskip("vllm")
    bench = _module()
    patching.install(TapConfig(trace_dir=tmp_path / "taps", run_name="pass", flush_seconds=60))
    try:
        spec = build_speculator(cpu_dspark)
        tap = spec.__dict__["_dsparklab_tap"]
        wrapped = _wrapped(spec)
        assert "DSparkSpeculator._sample_sequential" in wrapped
        assert "model.markov_bias" in wrapped
        rows = 3
        hidden, _ = feed_speculator(spec, rows, seed=7)
        with torch.inference_mode():
            spec._sample_sequential(rows, hidden)
            traced = spec.draft_tokens[:rows].clone()
            tap.buffers.floats.fill_(float("nan"))
            with bench.untraced(spec):
                assert _wrapped(spec) == []
                spec._sample_sequential(rows, hidden)
            assert torch.equal(spec.draft_tokens[:rows], traced)
            assert torch.isnan(tap.buffers.floats).all()  # no tap ran
            assert _wrapped(spec) == wrapped
            spec._sample_sequential(rows, hidden)  # traced again
        assert torch.isfinite(tap.buffers.markov_bias[:rows]).all()
    finally:
        runs.close_worker()
        patching.uninstall()


def test_the_draft_pass_of_several_processes_is_their_median_with_its_range() -> None:
    """One process can run every pass a fifth to a half slower than the next: the table
    keeps each configuration's median over the processes and the range beside it."""
    import pandas as pd

    bench = _module()
    frames = [
        pd.DataFrame(
            {"draft pass ms off": [off, 0.2], "full +ms": [full, 0.1]},
            index=pd.Index(["dspark-n7", "eagle3-n3"], name="config"),
        )
        for off, full in [(0.90, 0.37), (1.35, 0.71), (0.92, 0.40)]
    ]
    table = bench.median_over_processes(frames)
    assert list(table.index) == ["dspark-n7", "eagle3-n3"]
    assert table.index.name == "config"
    assert table.loc["dspark-n7", "draft pass ms off"] == pytest.approx(0.92)
    assert table.loc["dspark-n7", "full +ms"] == pytest.approx(0.40)
    assert table.loc["dspark-n7", "full +ms processes"] == "0.37..0.71"
    assert table.loc["eagle3-n3", "full +ms processes"] == "0.10..0.10"
    assert "draft pass ms off processes" not in table.columns


def test_flush_stall_compares_a_flushed_step_with_the_same_step_unflushed() -> None:
    """A step that ran during a flush turn costs its excess over the same step's median in
    the rounds where it did not, spread over every steady step of the configuration; a step
    flushed in every round, the first step and the untraced runs count nothing."""
    import pandas as pd

    bench = _module()
    rows = []
    for round_ in range(3):
        for step in range(4):
            wall = {1: 0.010, 2: [0.020, 0.030, 0.022][round_], 3: 0.015}.get(step, 0.050)
            rows.append(
                {
                    "config": "dspark-n7",
                    "round": round_,
                    "traced": "full",
                    "step": step,
                    "wall_s": wall,
                    # step 2 flushed in round 1; step 3 in every round (no counterpart);
                    # the first step is left out as the overhead table leaves it out
                    "in_flush": (step == 2 and round_ == 1) or step in (0, 3),
                    # the flush thread's CPU over the run, on its first step's row
                    "flush_cpu_s": 0.004 if step == 0 else 0.0,
                }
            )
            rows.append({**rows[-1], "traced": "off", "in_flush": True, "wall_s": 1.0})
            rows.append({**rows[-2], "config": "eagle3-n3", "in_flush": False})
    table = bench.flush_stall(pd.DataFrame(rows))
    # one flushed step with a counterpart: 30 ms against the median of 20 and 22 ms
    assert table.loc["dspark-n7", "ms per flushed step"] == pytest.approx(9.0)
    # 9 steady steps (steps 1-3 over three rounds)
    assert table.loc["dspark-n7", "flush stall ms/step"] == pytest.approx(1.0)
    assert table.loc["dspark-n7", "flushed steps"] == pytest.approx(1 / 9)
    assert table.loc["eagle3-n3", "flush stall ms/step"] == 0.0
    assert table.loc["eagle3-n3", "flushed steps"] == 0.0
    # 4 ms of flush CPU a run over its 4 steps, the first step counted
    assert table.loc["dspark-n7", "flush cpu ms/step"] == pytest.approx(1.0)


def test_the_flush_turns_of_a_recorder_are_timed_in_its_thread(tmp_path: Path) -> None:
    """A recorder's flush thread, staged slots queued: each of its turns is timed, the one
    that turned the slots into rows among them, and the recorder is as before after."""
    from dsparklab.engines.vllm.recorder import FLUSH_THREAD, TraceRecorder
    from dsparklab.store import TraceWriter, new_run_json
    from tests.vllm.test_tap_core import N, _ring, _slot

    bench = _module()
    meta = new_run_json(
        run_id="t", engine={"name": "vllm"}, method="eagle3", num_speculative_tokens=N,
        target={"name": "t"}, drafter=None, dataset="d", sampling={},
    )  # fmt: skip
    writer = TraceWriter(tmp_path, meta, flush_seconds=0.05)
    recorder = TraceRecorder(N, dataset="d", writer=writer, flush_seconds=0.05)
    ring = _ring()
    unwrapped = TraceRecorder._flush_once
    with bench.timing_flush_turns() as turns:
        recorder.start_requests(["a"])
        recorder.stage(
            _slot(ring, ["a"], [[1, 2, 3]], sampled=[1], rejected=[0], seq=[4], last=[0])
        )
        recorder.stage(
            _slot(ring, ["a"], [[4, 5, 6]], sampled=[3], rejected=[1], seq=[8], last=[7])
        )
        assert recorder._thread is not None and recorder._thread.name == FLUSH_THREAD
        deadline = time.monotonic() + 30
        while recorder.queued() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not recorder.queued(), "the flush thread processed the staged slots"
        time.sleep(0.2)
    recorder.close()
    assert len(turns) >= 2
    assert all(0 <= turn.end - turn.start < 30 for turn in turns)
    assert all(0 <= turn.cpu_s <= turn.end - turn.start + 0.01 for turn in turns)
    assert sum(turn.cpu_s for turn in turns) > 0
    assert TraceRecorder._flush_once is unwrapped
    assert not hasattr(TraceRecorder._flush_once, "__wrapped__")


def test_the_draft_pass_is_timed_for_more_rows_than_eight() -> None:
    """The draft-pass measure builds its speculators with room for the rows asked (a run
    with 16 requests in flight asked for 16 rows of a speculator sized for 8)."""
    bench = _module()
    try:
        passes = bench.draft_pass("tiny", 1, ["full"], rows=12, reps=1, copies=1)
    finally:
        patching.uninstall()
    assert set(passes.index) == {"dspark-n3", "dspark-n7", "eagle3-n3", "eagle3-n7"}
    assert (passes["draft pass ms off"] > 0).all()


@pytest.mark.parametrize(("argv", "tier"), [([], "smol"), (["--tier", "tiny"], "tiny")])
def test_the_tier_picks_every_model_the_runs_serve(argv: list[str], tier: str) -> None:
    """smol by default (the tier whose taps-to-step ratio says something of a served
    model); each of the target and both drafters from the tier asked."""
    bench = _module()
    args = bench.parse_args(["--out", "runs", *argv])
    opts = bench.options(args, "runs")
    assert (opts.target, opts.dspark, opts.eagle3) == (
        f"{tier}-target",
        f"{tier}-dspark",
        f"{tier}-eagle3",
    )
