"""vLLM's spec-decode counters read into the lab's tally, to check traces against them.

vLLM's ``SpecDecodingStats`` counters (``vllm/v1/spec_decode/metrics.py``) and their
Prometheus series map onto :class:`dsparklab.engines.stats.DraftStats` as that module says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dsparklab.engines.stats import DraftStats

ACCEPTED_PER_POS_METRIC = "vllm:spec_decode_num_accepted_tokens_per_pos"
NUM_DRAFTS_METRIC = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS_METRIC = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED_METRIC = "vllm:spec_decode_num_accepted_tokens"


def stats_from_vllm_metrics(metrics: Iterable[Any], num_spec_tokens: int) -> DraftStats:
    """Read vLLM's spec-decode counters from ``LLM.get_metrics()`` into a DraftStats.

    ``metrics`` are ``vllm.v1.metrics.reader`` objects (``Counter``/``Vector`` with
    ``name``, ``labels`` and ``value``/``values``); counters of several engines add up.
    """
    stats = DraftStats.new(num_spec_tokens)
    for metric in metrics:
        name = getattr(metric, "name", "")
        if name == ACCEPTED_PER_POS_METRIC:
            values = getattr(metric, "values", None)
            if values is not None:  # a Vector: one value per position
                for pos, value in enumerate(values[:num_spec_tokens]):
                    stats.accepted_per_pos[pos] += int(value)
            else:  # one Counter per position label
                pos = int(_labels(metric).get("position", -1))
                if 0 <= pos < num_spec_tokens:
                    stats.accepted_per_pos[pos] += int(metric.value)
        elif name == NUM_DRAFTS_METRIC:
            stats.num_steps += int(metric.value)
        elif name == NUM_DRAFT_TOKENS_METRIC:
            stats.num_drafted += int(metric.value)
        elif name == NUM_ACCEPTED_METRIC:
            stats.num_accepted += int(metric.value)
    stats.num_emitted = stats.num_accepted + stats.num_steps
    return stats


def _labels(metric: Any) -> Mapping[str, str]:
    labels = getattr(metric, "labels", None)
    return labels if isinstance(labels, Mapping) else {}
