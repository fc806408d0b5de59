"""Where each speedup goes, on a store of recorded runs (default: the shipped smol traces).

Prints markdown tables computed by dsparklab.analysis from the recorded steps and
positions (no decoding, no timing of its own):

1. the speedup attribution of each method's smallest -> largest window per dataset
   (tokens, draft, verify, other; parts and their sum against the measured delta log S);
2. every smaller window predicted from the largest-window run, against the measured
   speedup, with the drafts' prefix agreement;
3. the best n per (dataset, method);
4. the acceptance projected on a cost profile, and what the seeds' shape would need there.

    .venv/bin/python benchmarks/throughput_explained.py --runs data/traces/smol
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dsparklab.analysis import (
    compute_best_n,
    compute_projected_speedup,
    compute_required_survival,
    compute_window_attribution,
    compute_window_prediction,
    compute_window_scaling,
)
from dsparklab.engines.reference.bench import markdown_table
from dsparklab.lab.notebook import cost_table, load_runs
from dsparklab.lab.published import DEFAULT_COST_PROFILES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("data/traces/smol"))
    parser.add_argument(
        "--profile",
        nargs="+",
        default=list(DEFAULT_COST_PROFILES),
        help="cost profiles to project on (published:<setup>, a shipped profile, a JSON file, "
        "a runs directory or specdec-bench:DIR[#method])",
    )
    parser.add_argument("--n-boot", type=int, default=400)
    return parser.parse_args(argv)


def attribution_table(steps: pd.DataFrame, n_boot: int) -> pd.DataFrame:
    rows = []
    parts = compute_window_attribution(steps, n_boot=n_boot)
    for (method, dataset), part in parts.groupby(["method", "dataset"]):
        by = part.set_index("component")
        first = part.iloc[0]
        total = float(first["total"])
        measured = float(np.log(first["new_speedup"] / first["base_speedup"]))
        cost = float(by.loc[["draft", "verify", "other"], "delta_log_speedup"].sum())
        rows.append(
            {
                "dataset": dataset,
                "method": method,
                "n": f"{first['low_n']}->{first['high_n']}",
                "S": f"{first['base_speedup']:.3f}->{first['new_speedup']:.3f}",
                "dlogS": round(total, 4),
                **{
                    c: f"{by.loc[c, 'delta_log_speedup']:+.4f} "
                    f"[{by.loc[c, 'lo']:+.3f}, {by.loc[c, 'hi']:+.3f}]"
                    for c in ("tokens", "draft", "verify", "other")
                },
                "cost share": f"{cost / total:.0%}" if total else "",
                "|sum - measured|": f"{abs(by['delta_log_speedup'].sum() - measured):.1e}",
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = load_runs(args.runs)
    steps = runs.steps.assign(dataset=runs.steps["raw_dataset"])
    positions = runs.positions.assign(dataset=runs.positions["raw_dataset"])
    print(f"# Where the speedup goes: {args.runs} ({len(runs.runs)} runs)\n")
    print("## Smallest -> largest window, attribution of delta log S\n")
    print(markdown_table(attribution_table(steps, args.n_boot), digits=4))
    prediction = compute_window_prediction(positions, steps)
    prediction["error"] = prediction["error"].map(lambda e: f"{e:+.1%}")
    print("\n## Every smaller window from the largest-window run\n")
    print(markdown_table(prediction, digits=4))
    scaling = compute_window_scaling(
        steps, positions=positions, by=("dataset", "method"), n_boot=args.n_boot
    )
    print("\n## Best n (measured)\n")
    print(markdown_table(compute_best_n(scaling), digits=3))
    costs = cost_table(args.profile, runs)
    projected = compute_projected_speedup(scaling, costs)
    wide = projected.pivot_table(
        index=["profile", "dataset", "method"], columns="n", values="speedup"
    )
    profiles = ", ".join(args.profile)
    print(f"\n## Projected on {profiles} (not a measurement)\n")
    print(markdown_table(wide.reset_index(), digits=3))
    print("\n## Where each cost comes from\n")
    print(markdown_table(costs, digits=3))
    print(f"\n## What raising n would need on {profiles}\n")
    print(markdown_table(compute_required_survival(scaling, costs), digits=4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
