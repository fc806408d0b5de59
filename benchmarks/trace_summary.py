"""Benchmark table from recorded traces: acceptance length, speedup and calibration.

    .venv/bin/python benchmarks/trace_summary.py --runs data/traces/smol

Reads a directory of runs (every method x n plus the target-only baseline of each
dataset) and prints, per dataset and method, for each n: the mean acceptance length
AL(n) (with its 95 % bootstrap interval over requests), the measured speedup over the
baseline runs of the same dataset (ratio of time per emitted token, from the steps'
draft and verify times; :func:`dsparklab.analysis.compute_window_scaling`), and for
DSpark the confidence head's per-position ECE at the largest n
(:func:`dsparklab.analysis.compute_calibration`). The runs are timed one after the
other, not interleaved: for speedups measured in one interleaved run use
``reference_speedup.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from dsparklab.analysis import calibrate_confidence, compute_calibration, compute_window_scaling
from dsparklab.engines.reference.bench import markdown_table
from dsparklab.lab.notebook import confidence_temperatures, load_runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="a directory of runs")
    parser.add_argument("--n-boot", type=int, default=400, help="bootstrap replicates")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = load_runs(args.runs)
    scaling = compute_window_scaling(
        runs.steps, positions=runs.positions, by=("method", "dataset"), n_boot=args.n_boot
    )
    table = scaling.assign(
        AL=scaling.apply(
            lambda r: f"{r.accept_len:.2f} [{r.accept_len_lo:.2f}, {r.accept_len_hi:.2f}]",
            axis=1,
        ),
        speedup=scaling.apply(
            lambda r: f"{r.speedup:.2f}x [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]", axis=1
        ),
    )
    print("Acceptance length and speedup vs the target-only baseline (95% CI over requests)")
    for dataset, part in table.groupby("dataset"):
        print(f"\n{dataset}")
        wide = part.pivot_table(
            index="n", columns="method", values=["AL", "speedup"], aggfunc="first"
        )
        wide.columns = [f"{method} {value}" for value, method in wide.columns]
        print(markdown_table(wide.reset_index()))
    dspark = runs.positions[runs.positions["method"] == "dspark"]
    if not dspark.empty:
        top = dspark[dspark["n"] == dspark["n"].max()]
        temperatures = confidence_temperatures(runs)
        scores = ("confidence", "confidence_calibrated") if temperatures else ("confidence",)
        if temperatures:
            top = calibrate_confidence(top, temperatures)
        calib = compute_calibration(
            top, steps=runs.steps, by=("dataset",), scores=scores, per_position=True
        )
        print(
            f"\nDSpark confidence head at n = {int(top['n'].max())}, per position "
            f"(raw{' and calibrated' if temperatures else ''}; ECE against accepted given reached)"
        )
        cols = ["dataset", "score", "position", "n_rows", "mean_score", "accept_rate", "ece"]
        print(markdown_table(pd.DataFrame(calib[cols + ["auroc"]]), digits=3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
