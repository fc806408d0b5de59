"""Which requests a sampled run records: a hash of the request id against the fraction.

``DSPARKLAB_SAMPLE=f`` records the fraction ``f`` of requests. The decision is a pure
function of the request id the caller chose (vLLM's internal suffix removed), so every
rank of a server and every server of a fleet agrees on it, and a request is recorded whole
(every step and position) or not at all. Intervals computed over a sampled run are over
the sampled requests: with requests as the bootstrap unit, a uniform sample of them is
what the intervals already assume.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

# run.json key holding the fraction (absent: every request recorded)
SAMPLE_KEY = "sample"
# Ids containing this are recorded whatever the fraction: the collector's probe of a
# server, which it must find in the taps to learn what the server runs.
ALWAYS_RECORDED = "dsparklab-probe-"


@lru_cache(maxsize=1 << 16)
def request_unit(request_id: str) -> float:
    """The request's point in [0, 1): the first 8 bytes of its BLAKE2b digest."""
    digest = hashlib.blake2b(request_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def request_sampled(request_id: str, fraction: float) -> bool:
    """Whether a run sampling ``fraction`` of its requests records this one."""
    return fraction >= 1.0 or ALWAYS_RECORDED in request_id or request_unit(request_id) < fraction


def check_fraction(fraction: float, *, name: str) -> float:
    """``fraction`` when it is in (0, 1]; ValueError naming ``name`` otherwise."""
    if not math.isfinite(fraction) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"{name} must be a fraction in (0, 1], got {fraction}")
    return fraction


def sample_block(fraction: float) -> dict[str, Any]:
    """run.json's ``sample`` block of a run that recorded ``fraction`` of its requests."""
    return {"fraction": fraction, "by": "blake2b(request id)"}


def run_sample(meta: Mapping[str, Any]) -> float:
    """The fraction of requests a run recorded (1.0 when it did not sample)."""
    block = meta.get(SAMPLE_KEY)
    if isinstance(block, Mapping):
        return float(block.get("fraction", 1.0))
    return 1.0
