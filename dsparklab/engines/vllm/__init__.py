"""The vLLM engine: plugin taps on vLLM's DSpark/Eagle3 speculators, and the collector.

Names are loaded on first use (PEP 562), so importing this package -- which vLLM does in
every process through the plugin entry point -- costs nothing until a name is used, and
never imports vLLM (the taps import it inside functions).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_NAMES = {
    "StepClock": "clock",
    "TapConfig": "config",
    "TapConfigError": "config",
    "LEVEL_FIELDS": "core",
    "TAP_FIELDS": "core",
    "FLOAT_VIEWS": "core",
    "DraftStash": "core",
    "StagingRing": "core",
    "TapBuffers": "core",
    "HeadColumns": "core",
    "ZeroTest": "core",
    "confidence_from_head": "core",
    "draft_index": "core",
    "first_argmax": "core",
    "logprob_at": "core",
    "tap_confidence": "core",
    "dense_position_values": "core",
    "write_step": "core",
    "affine_map": "core",
    "tap_topk_position": "core",
    "target_to_draft_index": "core",
    "temperature_scale": "core",
    "topk_base_lse": "core",
    "stats_from_vllm_metrics": "metrics",
    "TraceRecorder": "recorder",
    "external_request_id": "recorder",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
