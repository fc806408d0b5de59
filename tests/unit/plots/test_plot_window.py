"""The speedup-by-load figure rings each dataset's schedule in that dataset's panel."""

from __future__ import annotations

import pandas as pd

from dsparklab.plots import plot_speedup_by_load


def test_each_datasets_schedule_rings_its_own_panel() -> None:
    scaling = pd.DataFrame(
        [
            dict(dataset=d, method="eagle3", n=n, concurrency=c, speedup=s)
            for d, shift in (("gsm8k", 0.0), ("humaneval", 0.3))
            for n in (1, 3)
            for c, s in ((1, 1.4 + shift + 0.1 * n), (4, 1.1 + shift - 0.1 * n))
        ]
    )
    schedule = pd.DataFrame(
        [
            dict(dataset="gsm8k", method="eagle3", concurrency=1, n=3, speedup=1.7),
            dict(dataset="gsm8k", method="eagle3", concurrency=4, n=1, speedup=1.0),
            dict(dataset="humaneval", method="eagle3", concurrency=1, n=3, speedup=2.0),
            dict(dataset="humaneval", method="eagle3", concurrency=4, n=1, speedup=1.3),
        ]
    )
    fig = plot_speedup_by_load(scaling, schedule=schedule)
    rings = [t for t in fig.data if t.name == "the schedule's n"]
    assert [(t.xaxis, list(t.y)) for t in rings] == [("x", [1.7, 1.0]), ("x2", [2.0, 1.3])]
    assert [t.showlegend for t in rings] == [True, False]
