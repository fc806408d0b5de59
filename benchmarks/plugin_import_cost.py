"""What the dsparklab vLLM plugin entry point costs a vLLM process with tracing off.

vLLM imports every general plugin and calls its ``register()`` in each process it starts
(API server, engine core, every worker). Each row runs in a fresh interpreter, timed
inside it (``perf_counter`` around the imports and the call), best and median over
``--repeat`` runs; the goal for the untraced entry point is <= 20 ms.

Rows:

- ``entry point, tracing off``: ``import dsparklab.engines.vllm.plugin; register()``
  with ``DSPARKLAB_TRACE_DIR`` unset (what every untraced vLLM process pays);
- ``modules the entry point used to load``: the tap math and recorder modules (torch,
  pandas, pyarrow through the trace store) that the package imported eagerly before;
- ``entry point, tracing on``: the same with ``DSPARKLAB_TRACE_DIR`` set, which imports
  vLLM's patched modules and installs the taps (reported, no goal).

    .venv/bin/python benchmarks/plugin_import_cost.py --repeat 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

GOAL_MS = 20.0

_TIMED = """
import json, sys, time
t0 = time.perf_counter()
{body}
dt = time.perf_counter() - t0
heavy = sorted(m for m in ("torch", "numpy", "pandas", "pyarrow", "vllm") if m in sys.modules)
print(json.dumps({{"ms": dt * 1e3, "heavy": heavy}}))
"""

ROWS: dict[str, tuple[str, bool]] = {
    "entry point, tracing off": (
        "import dsparklab.engines.vllm.plugin as p\np.register()",
        False,
    ),
    "modules the entry point used to load": (
        "import dsparklab.engines.vllm.core, dsparklab.engines.vllm.recorder",
        False,
    ),
    "entry point, tracing on": (
        "import dsparklab.engines.vllm.plugin as p\np.register()",
        True,
    ),
}


def _run_once(body: str, tracing: bool, trace_dir: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "DSPARKLAB_TRACE_DIR"}
    env.setdefault("OMP_NUM_THREADS", "1")
    if tracing:
        env["DSPARKLAB_TRACE_DIR"] = trace_dir
    out = subprocess.run(
        [sys.executable, "-c", _TIMED.format(body=body)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(repeat: int, rows: list[str]) -> list[dict[str, object]]:
    results = []
    with tempfile.TemporaryDirectory() as trace_dir:
        for name in rows:
            body, tracing = ROWS[name]
            runs = [_run_once(body, tracing, trace_dir) for _ in range(repeat)]
            times = [float(r["ms"]) for r in runs]  # type: ignore[arg-type]
            results.append(
                {
                    "row": name,
                    "best_ms": min(times),
                    "median_ms": statistics.median(times),
                    "heavy": runs[-1]["heavy"],
                }
            )
    return results


def table(results: list[dict[str, object]]) -> str:
    lines = [
        "| what | best ms | median ms | heavy modules loaded |",
        "|---|---:|---:|---|",
    ]
    for r in results:
        heavy = ", ".join(r["heavy"]) or "none"  # type: ignore[arg-type]
        lines.append(f"| {r['row']} | {r['best_ms']:.1f} | {r['median_ms']:.1f} | {heavy} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="fresh interpreters per row")
    parser.add_argument(
        "--skip-tracing-on", action="store_true", help="leave out the (slow) tracing-on row"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        print("plugin_import_cost: --repeat must be >= 1", file=sys.stderr)
        return 2
    rows = [r for r in ROWS if not (args.skip_tracing_on and r == "entry point, tracing on")]
    results = measure(args.repeat, rows)
    print(table(results))
    off = results[0]
    verdict = "meets" if float(off["median_ms"]) <= GOAL_MS else "misses"  # type: ignore[arg-type]
    print(
        f"\nuntraced entry point: median {off['median_ms']:.1f} ms, {verdict} the "
        f"<= {GOAL_MS:.0f} ms goal"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
