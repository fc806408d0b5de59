"""The vLLM engine: plugin taps on vLLM's DSpark/Eagle3 speculators, and the collector.

Importing this package never imports vLLM (the plugin imports it inside functions), so
the tap math in :mod:`dsparklab.engines.vllm.core` also serves the GPU cost benchmark.
"""

from dsparklab.engines.vllm.config import TapConfig, TapConfigError, VllmCollectConfig
from dsparklab.engines.vllm.core import (
    LEVEL_FIELDS,
    TAP_FIELDS,
    DraftStash,
    StagingRing,
    TapBuffers,
    confidence_from_head,
    draft_index,
    tap_confidence,
    tap_dense_position,
    tap_topk_position,
    target_to_draft_index,
    topk_base_lse,
)
from dsparklab.engines.vllm.metrics import DraftStats, stats_from_vllm_metrics
from dsparklab.engines.vllm.recorder import TraceRecorder, external_request_id

__all__ = [
    "LEVEL_FIELDS",
    "TAP_FIELDS",
    "DraftStash",
    "DraftStats",
    "StagingRing",
    "TapBuffers",
    "TapConfig",
    "TapConfigError",
    "TraceRecorder",
    "VllmCollectConfig",
    "confidence_from_head",
    "draft_index",
    "external_request_id",
    "stats_from_vllm_metrics",
    "tap_confidence",
    "tap_dense_position",
    "tap_topk_position",
    "target_to_draft_index",
    "topk_base_lse",
]
