"""The plugin's registration against the installed vLLM: switch, idempotence, patch points."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from dsparklab.engines.vllm import patch_table, patching, plugin, runs, steps  # noqa: E402
from dsparklab.engines.vllm.config import TapConfig  # noqa: E402

pytestmark = pytest.mark.vllm
PATCH_LOG = "dsparklab.engines.vllm.patching"


def _line() -> str:
    import vllm

    line = patch_table.vllm_line(vllm.__version__)
    assert line is not None, vllm.__version__
    return line


# Model Runner V1's points exist on 0.32 and 0.33 only (this module also runs on 0.34's
# sources, from test_vllm_lines.py)
needs_v1 = pytest.mark.skipif(
    _line() not in patch_table.V1_LINES, reason="Model Runner V1 is gone in this vLLM line"
)


@pytest.fixture
def fresh_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A plugin state as in a new process; patches removed afterwards."""
    patching.uninstall()
    monkeypatch.setattr(patching, "STATE", patching.PatchState())
    monkeypatch.setattr(runs, "STATE", runs.RunState())
    try:
        yield
    finally:
        runs.close_worker()
        patching.uninstall()


def test_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points

    points = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert points.get("dsparklab") == "dsparklab.engines.vllm.plugin:register"


def test_register_is_idempotent(
    fresh_plugin: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vllm.v1.worker.gpu.async_utils import StepTimingCollector
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
    from vllm.v1.worker.worker_base import WorkerBase

    original = DSparkSpeculator.__dict__["_sample_sequential"]
    monkeypatch.setenv("DSPARKLAB_TRACE_DIR", str(tmp_path))
    plugin.register()
    patched = DSparkSpeculator.__dict__["_sample_sequential"]
    assert patched is not original
    assert patched.__wrapped__ is original
    plugin.register()
    patching.install(runs.STATE.config)  # type: ignore[arg-type]
    assert DSparkSpeculator.__dict__["_sample_sequential"] is patched
    assert patching.STATE.line == _line()
    # Model Runner V2's engine step: execute_model starts the clock, sample_tokens stops
    # it, the forward and the sampler are marked
    assert steps._sample_tokens_wrapped(GPUModelRunner.__new__(GPUModelRunner))
    assert GPUModelRunner.execute_model.__wrapped__.__wrapped__.__name__ == "execute_model"
    for name in ("sample", "sample_tokens"):
        assert getattr(GPUModelRunner.__dict__[name], "__dsparklab_tap__", False), name
    assert getattr(StepTimingCollector.__dict__["forward_start"], "__dsparklab_tap__", False)
    if _line() in patch_table.V1_LINES:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1Runner

        assert V1Runner.propose_draft_token_ids.__wrapped__.__name__ == "propose_draft_token_ids"
        assert steps._sample_tokens_wrapped(V1Runner.__new__(V1Runner))
    assert WorkerBase.dsparklab_flush is runs.flush_worker
    patching.uninstall()
    assert DSparkSpeculator.__dict__["_sample_sequential"] is original
    assert not hasattr(WorkerBase, "dsparklab_flush")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_missing_topk_point_disables_only_the_topk_taps(
    fresh_plugin: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    monkeypatch.delattr(DSparkSpeculator, "_sample_sequential_topk")
    monkeypatch.setenv("DSPARKLAB_TRACE_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=PATCH_LOG):
        plugin.register()
        plugin.register()
    errors = _warnings(caplog)
    assert len(errors) == 1, errors
    assert "DSparkSpeculator._sample_sequential_topk is missing" in errors[0]
    assert "with a draft top-k" in errors[0]
    # everything else is in place
    assert patching.is_installed()
    assert getattr(DSparkSpeculator.__dict__["_sample_sequential"], "__dsparklab_tap__", False)
    with pytest.raises(patching.UnsupportedVLLMError, match="_sample_sequential_topk"):
        patching.check_vllm_compat()


def test_missing_v2_sample_leaves_verify_and_other_untimed(
    fresh_plugin: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without V2's ``sample`` the forward mark has nothing to pair with: that patch is off
    too, one warning says what is lost, and the step itself is still timed."""
    from vllm.v1.worker.gpu.async_utils import StepTimingCollector
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    monkeypatch.delattr(GPUModelRunner, "sample")
    with caplog.at_level(logging.WARNING, logger=PATCH_LOG):
        missing = patching.install(TapConfig(trace_dir=tmp_path))
    warnings = _warnings(caplog)
    assert missing == [patch_table.V2_SAMPLE.name]
    assert len(warnings) == 1 and "GPUModelRunner.sample is missing" in warnings[0], warnings
    assert "verify and other times" in warnings[0] and "target-only steps" in warnings[0]
    for name in ("execute_model", "sample_tokens"):
        assert getattr(GPUModelRunner.__dict__[name], "__dsparklab_tap__", False), name
    assert getattr(StepTimingCollector.__dict__["forward_start"], "__dsparklab_tap__", False)


@needs_v1
def test_missing_sample_tokens_leaves_the_steps_untimed(
    fresh_plugin: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without V1's sample_tokens the clock never starts (a draft slot would wait for a
    step end that never comes); drafts, acceptance and draft shares are still recorded."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    monkeypatch.delattr(GPUModelRunner, "sample_tokens")
    with caplog.at_level(logging.WARNING, logger=PATCH_LOG):
        missing = patching.install(TapConfig(trace_dir=tmp_path))
    errors = _warnings(caplog)
    assert missing == [patch_table.V1_SAMPLE_TOKENS.name]
    assert len(errors) == 1 and "sample_tokens is missing" in errors[0], errors
    assert "verify_time_s" in errors[0] and "target-only steps" in errors[0]
    assert getattr(GPUModelRunner.__dict__["execute_model"], "__dsparklab_tap__", False)
    assert getattr(GPUModelRunner.__dict__["propose_draft_token_ids"], "__dsparklab_tap__", False)
    assert not steps._sample_tokens_wrapped(CPUModelRunner.__new__(CPUModelRunner))


def test_missing_sampler_point_disables_the_dspark_group_only(
    fresh_plugin: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import (
        TargetDependentARSpeculator,
    )

    monkeypatch.delattr(DSparkSpeculator, "_sample_logits")
    with caplog.at_level(logging.WARNING, logger=PATCH_LOG):
        missing = patching.install(TapConfig(trace_dir=tmp_path))
    errors = _warnings(caplog)
    assert len(errors) == 1 and "_sample_logits is missing" in errors[0], errors
    assert "DSpark position fields" in errors[0]
    assert missing == [patch_table.DSPARK_LOGITS.name]
    for name in ("load_draft_model", "_sample_sequential", "_sample_sequential_topk"):
        assert not getattr(DSparkSpeculator.__dict__[name], "__dsparklab_tap__", False), name
    # drafts and acceptance of DSpark (through DFlash's propose) and Eagle3 still recorded
    assert getattr(DFlashSpeculator.__dict__["propose"], "__dsparklab_tap__", False)
    assert getattr(TargetDependentARSpeculator.__dict__["propose"], "__dsparklab_tap__", False)


def test_renamed_parameter_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    def propose(self, input_batch, attn_metadata, num_sampled, rejected, last_sampled):  # noqa: ANN001
        raise AssertionError("never called")

    monkeypatch.setattr(DFlashSpeculator, "propose", propose)
    with pytest.raises(patching.UnsupportedVLLMError, match="no parameter 'num_rejected'"):
        patching.check_vllm_compat()


def test_bad_setting_leaves_vllm_untouched(
    fresh_plugin: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DSPARKLAB_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("DSPARKLAB_TAP_LEVEL", "everything")
    with caplog.at_level(logging.ERROR, logger=PATCH_LOG):
        plugin.register()
    assert not patching.is_installed()
    assert any("DSPARKLAB_TAP_LEVEL" in r.getMessage() for r in caplog.records)
