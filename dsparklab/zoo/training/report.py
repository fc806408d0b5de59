"""What a training stage did (wall time, steps, losses, sizes), as the cards record it.

No torch here: the card renderers read these reports without the training stack.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageReport:
    """What a stage did: wall time, steps, losses, sizes; written into the cards."""

    name: str
    seconds: float = 0.0
    steps: int = 0
    params: int = 0
    trainable_params: int = 0
    loss_first: float | None = None
    loss_last: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@contextmanager
def stage_clock(report: StageReport) -> Iterator[StageReport]:
    """Time the block into ``report``: wall ``seconds`` and ``extra["cpu_seconds"]``."""
    start, cpu_start = time.time(), time.process_time()
    yield report
    report.seconds = time.time() - start
    report.extra["cpu_seconds"] = round(time.process_time() - cpu_start, 1)


def smoothed(values: Sequence[float], n: int = 20) -> float:
    """Mean of the last ``n`` values (a loss for the progress bar and the cards)."""
    tail = values[-n:]
    return float(sum(tail) / len(tail))


def stage_json(report: StageReport) -> dict[str, Any]:
    """A StageReport as plain JSON."""
    return json.loads(
        json.dumps(
            {
                "seconds": round(report.seconds, 1),
                "steps": report.steps,
                "params": report.params,
                "trainable_params": report.trainable_params,
                "loss_first": report.loss_first,
                "loss_last": report.loss_last,
                **report.extra,
            }
        )
    )
