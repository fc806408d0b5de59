"""DSPARKLAB_* (and AWS_* for an s3:// root) reach vLLM's Ray workers: vLLM's own list of
variables to copy (vllm.ray.ray_env.get_env_vars_to_copy) includes them once a traced
process has loaded the plugin, and a worker that got none of them says so once."""

from __future__ import annotations

import logging
import os

import pytest

from dsparklab.engines.vllm import plugin

pytest.importorskip("vllm")


def test_a_traced_driver_has_vllm_copy_its_variables_to_ray_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.ray.ray_env import get_env_vars_to_copy

    monkeypatch.setenv("DSPARKLAB_TRACE_DIR", "s3://bucket/taps")
    monkeypatch.setenv("DSPARKLAB_SAMPLE", "0.1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 16)
    monkeypatch.setenv(plugin.RAY_PREFIXES_ENV, "MYLIB_")
    before = get_env_vars_to_copy()
    assert "DSPARKLAB_TRACE_DIR" not in before, "vLLM now copies them itself: drop the hint"
    plugin.share_with_ray_workers()
    copied = get_env_vars_to_copy()
    assert {"DSPARKLAB_TRACE_DIR", "DSPARKLAB_SAMPLE", "AWS_SECRET_ACCESS_KEY"} <= copied
    assert plugin.RAY_PREFIXES_ENV in copied  # and the prefixes themselves travel
    assert os.environ[plugin.RAY_PREFIXES_ENV] == "MYLIB_,DSPARKLAB_,AWS_"
    plugin.share_with_ray_workers()  # idempotent
    assert os.environ[plugin.RAY_PREFIXES_ENV] == "MYLIB_,DSPARKLAB_,AWS_"


def test_a_worker_without_the_trace_root_of_its_driver_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("DSPARKLAB_TRACE_DIR", raising=False)
    monkeypatch.setenv(plugin.RAY_PREFIXES_ENV, "DSPARKLAB_,AWS_")
    monkeypatch.setattr(plugin, "_warned_untraced_worker", False)
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
        plugin.register()
    lines = [r.getMessage() for r in caplog.records if "DSPARKLAB_TRACE_DIR" in r.getMessage()]
    assert len(lines) == 1 and "nothing is recorded here" in lines[0]
    monkeypatch.delenv(plugin.RAY_PREFIXES_ENV)
    assert plugin.untraced_worker_warning() is None  # an untraced fleet stays quiet
