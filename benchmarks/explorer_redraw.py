"""The explorer's redraw time in the kernel, per control, on a run set.

    .venv/bin/python benchmarks/explorer_redraw.py --runs data/traces/smol

Builds notebook 00's explorer on ``--runs`` (its widgets shown without a front end) and
drives every control in the browser test's order (dataset, method, n, view, request,
heatmap click, rows, then back), ``--rounds`` times. Each interaction is timed from the
control's new value to the end of its handler: the figures rebuilt and their widget
updates queued, the status line and the losses table rewritten. What a reader waits for
in JupyterLab adds the message round trip and plotly's render, which the browser test
records per run set (``<run set>/explorer_redraws.json`` beside its screenshots); the
issue's goal is 300 ms for that whole redraw.

The table also gives each control's longest pause of Python's garbage collector.
Displaying the explorer freezes the kernel's heap out of the collector (see
``Dashboard.display``); ``--unfreeze`` undoes that after the build. A full collection
over the heap is rare in this process; in JupyterLab, after Run All, one landed in the n
redraw of every drive (260-315 ms there, 150-180 ms frozen: five drives each, alternated).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from plotly.callbacks import InputDeviceState, Points

from dsparklab.analysis import annotate_positions, compute_acceptance_by_position
from dsparklab.engines.reference.bench import markdown_table
from dsparklab.lab.notebook import load_runs, load_token_text
from dsparklab.widgets import Explorer

GOAL_MS = 300.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("data/traces/smol"))
    parser.add_argument("--rounds", type=int, default=5, help="passes over every control")
    parser.add_argument("--n-boot", type=int, default=200, help="bootstrap replicates")
    parser.add_argument(
        "--unfreeze", action="store_true", help="leave the kernel's heap in the collector's reach"
    )
    return parser.parse_args(argv)


def build_explorer(runs_dir: Path, n_boot: int) -> Explorer:
    """Notebook 00's explorer on ``runs_dir``, its widgets built."""
    runs = load_runs(runs_dir, single_tier=True)
    counts = runs.acceptance_counts()
    by_position = compute_acceptance_by_position(
        counts, by=("method", "n", "dataset"), n_boot=n_boot
    )
    annotated = annotate_positions(runs.positions, steps=runs.steps)
    binned = {c: runs.acceptance_by_bin(c, n_boot=n_boot)[0] for c in ("depth_bin", "context_bin")}
    explorer = Explorer(by_position, annotated, token_labels=load_token_text(runs), binned=binned)
    with contextlib.redirect_stdout(io.StringIO()):  # no front end: the widget's repr
        explorer.display(interactive=True)
    return explorer


def _other(options: list[str], current: str) -> str:
    return next((o for o in options if o != current), current)


def click_cell(explorer: Explorer, position: int, n: int) -> None:
    """A click on the heatmap cell (``position``, window ``n``), dispatched as plotly
    dispatches the front end's click message to the trace's handlers."""
    trace = explorer.figure_widgets["heatmap"].data[0]
    trace._dispatch_on_click(Points([0], [position], [n], trace.name, 0), InputDeviceState())


def interactions(explorer: Explorer, flip: bool) -> list[tuple[str, Callable[[], None]]]:
    """Every control once; ``flip`` picks the other end of each choice, so every round
    changes something."""
    ex = explorer
    pick = -1 if flip else 0
    return [
        ("dataset", lambda: setattr(ex.dataset, "value", ex.datasets[pick])),
        ("method", lambda: setattr(ex.method, "value", ex.methods[pick])),
        ("n", lambda: setattr(ex.n, "value", ex.windows()[1 if flip else -1])),
        ("view", lambda: setattr(ex.view, "value", "survival" if flip else "conditional")),
        ("request", lambda: setattr(ex.request, "value", _other(ex.requests(), ex.request.value))),
        ("heatmap click", lambda: click_cell(ex, 1, ex.windows()[0 if flip else -2])),
        ("rows", lambda: setattr(ex.rows, "value", ex.row_choices()[1 if flip else 0])),
    ]


class CollectorPauses:
    """The garbage collector's pauses, in ms, as ``gc.callbacks`` reports them."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._started) * 1e3)

    def take_longest(self) -> float:
        """The longest pause since the last call (0 when none)."""
        longest = max(self.pauses, default=0.0)
        self.pauses.clear()
        return longest


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    explorer = build_explorer(args.runs, args.n_boot)
    if args.unfreeze:
        gc.unfreeze()
    collector = CollectorPauses()
    times: dict[str, list[float]] = {}
    pauses: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        for name, act in interactions(explorer, flip=round_ % 2 == 0):
            collector.take_longest()
            started = time.perf_counter()
            act()
            times.setdefault(name, []).append((time.perf_counter() - started) * 1e3)
            pauses.setdefault(name, []).append(collector.take_longest())
            if explorer.error:
                raise SystemExit(f"{name}: {explorer.error}")
    table = pd.DataFrame(
        [
            {
                "control": name,
                "median ms": statistics.median(values),
                "best ms": min(values),
                "worst ms": max(values),
                "longest collector pause ms": max(pauses[name]),
                "% of the 300 ms goal (median)": 100 * statistics.median(values) / GOAL_MS,
            }
            for name, values in times.items()
        ]
    ).set_index("control")
    heap = "left in the collector's reach" if args.unfreeze else "frozen"
    print(f"# explorer redraws in the kernel ({args.runs}, {args.rounds} rounds, heap {heap})\n")
    print(markdown_table(table.round(1).reset_index()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
