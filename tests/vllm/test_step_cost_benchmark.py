"""The V2 step-cost benchmark's host-work clock (``benchmarks/v2_step_costs.py``): it counts
the time a wrapper of the patch table spends around vLLM's function, once per engine step,
never vLLM's own time, also for a wrapper entered inside another's vLLM call."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsparklab.engines.vllm import patch_table
from dsparklab.engines.vllm.patch_table import V2_EXECUTE, V2_FORWARD_START, wrapper_of

REPO = Path(__file__).resolve().parents[2]


def _module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "v2_step_costs", REPO / "benchmarks" / "v2_step_costs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["v2_step_costs"] = module
    spec.loader.exec_module(module)
    return module


def _spends(seconds: float) -> Callable[[Any], Any]:
    """A wrapper's maker that spends ``seconds`` of its own before calling vLLM's function."""

    def make(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            time.sleep(seconds)
            return original(*args, **kwargs)

        return wrapper

    return make


@pytest.fixture
def slow_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    """execute_model's wrapper spends 20 ms, forward_start's 10 ms."""
    makes = {V2_EXECUTE: _spends(0.02), V2_FORWARD_START: _spends(0.01)}
    patches = tuple(
        dataclasses.replace(p, make=makes[p.point]) if p.point in makes else p
        for p in patch_table.PATCHES
    )
    monkeypatch.setattr(patch_table, "PATCHES", patches)


def _steps(count: int) -> None:
    """``count`` engine steps: vLLM's execute_model (50 ms) calls forward_start (50 ms)."""
    forward_start = wrapper_of(V2_FORWARD_START)(lambda: time.sleep(0.05))

    def execute_model() -> None:
        time.sleep(0.05)
        forward_start()

    wrapped = wrapper_of(V2_EXECUTE)(execute_model)
    for _ in range(count):
        wrapped()


def test_host_work_is_the_wrappers_own_time_per_step(slow_wrappers: None) -> None:
    bench = _module()
    table = patch_table.PATCHES
    with bench.timing_host_work() as per_step:
        _steps(2)
    assert len(per_step) == 2
    # 30 ms of the wrappers' own (sleep overshoots a little); vLLM's 100 ms would show
    assert all(0.03 <= s < 0.08 for s in per_step), per_step
    assert patch_table.PATCHES is table  # the timed makes are gone again


def test_the_bare_run_times_only_the_timer(slow_wrappers: None) -> None:
    bench = _module()
    with bench.timing_host_work(plugin=False) as per_step:
        _steps(2)
    assert len(per_step) == 2
    assert all(s < 0.01 for s in per_step), per_step
