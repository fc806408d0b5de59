"""The plugin's registration against the installed vLLM: switch, idempotence, version guard."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from dsparklab.engines.vllm import plugin  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture()
def fresh_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A plugin state as in a new process; patches removed afterwards."""
    plugin.uninstall()
    monkeypatch.setattr(plugin, "_STATE", plugin._PluginState())
    try:
        yield
    finally:
        plugin.close_worker()
        plugin.uninstall()


def test_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points

    points = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert points.get("dsparklab") == "dsparklab.engines.vllm.plugin:register"


def test_register_is_idempotent(
    fresh_plugin: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    original = DSparkSpeculator.__dict__["_sample_sequential"]
    monkeypatch.setenv("DSPARKLAB_TRACE_DIR", str(tmp_path))
    plugin.register()
    patched = DSparkSpeculator.__dict__["_sample_sequential"]
    assert patched is not original and patched.__wrapped__ is original
    plugin.register()
    plugin.install(plugin._STATE.config)  # type: ignore[arg-type]
    assert DSparkSpeculator.__dict__["_sample_sequential"] is patched
    assert GPUModelRunner.propose_draft_token_ids.__wrapped__.__name__ == "propose_draft_token_ids"
    assert WorkerBase.dsparklab_flush is plugin.flush_worker
    plugin.uninstall()
    assert DSparkSpeculator.__dict__["_sample_sequential"] is original
    assert not hasattr(WorkerBase, "dsparklab_flush")


def test_unsupported_vllm_logs_one_error_naming_the_attribute(
    fresh_plugin: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    monkeypatch.delattr(DSparkSpeculator, "_sample_sequential_topk")
    monkeypatch.setenv("DSPARKLAB_TRACE_DIR", str(tmp_path))
    with caplog.at_level(logging.ERROR, logger="dsparklab.engines.vllm.plugin"):
        plugin.register()
        plugin.register()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "DSparkSpeculator._sample_sequential_topk is missing" in errors[0]
    assert not plugin.is_installed()
    with pytest.raises(plugin.UnsupportedVLLMError, match="_sample_sequential_topk"):
        plugin.check_vllm_compat()


def test_renamed_parameter_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    def propose(self, input_batch, attn_metadata, num_sampled, rejected, last_sampled):  # noqa: ANN001
        raise AssertionError("never called")

    monkeypatch.setattr(DFlashSpeculator, "propose", propose)
    with pytest.raises(plugin.UnsupportedVLLMError, match="no parameter 'num_rejected'"):
        plugin.check_vllm_compat()


def test_bad_setting_leaves_vllm_untouched(
    fresh_plugin: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DSPARKLAB_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("DSPARKLAB_TAP_LEVEL", "everything")
    with caplog.at_level(logging.ERROR, logger="dsparklab.engines.vllm.plugin"):
        plugin.register()
    assert not plugin.is_installed()
    assert any("DSPARKLAB_TAP_LEVEL" in r.getMessage() for r in caplog.records)
