"""Benchmark: the analysis library on a large trace store, beside DuckDB.

    .venv/bin/python benchmarks/analysis_scale.py --rows 50000000
    .venv/bin/python benchmarks/analysis_scale.py --rows 2000000 --store /tmp/small

1. A SYNTHETIC generator (used only by this benchmark; random numbers, not a
   measurement of any drafter) writes a store in the trace layout: for each of 2 methods
   (dspark, eagle3) x n = 3..7 x 6 datasets one run directory with run.json and parquet
   parts carrying the store schema and its version metadata, plus a target-only baseline
   run per dataset. Acceptance is prefix-closed per step, so "reached" needs every row's
   step, as in real traces. Parts are written with pyarrow directly (not TraceWriter,
   whose per-row Python dicts would take an hour at 50 M rows); run.json says
   ``"synthetic": true``.
2. Each measurement runs in its own subprocess, which reports its wall time (imports of
   the library or duckdb included) and peak RSS (VmHWM): the library's position x n
   acceptance heatmap (``aggregate_store`` + ``compute_acceptance_by_position``; by
   default counted from the steps table, with ``source="positions"`` from the position
   rows) and per-position calibration table (``aggregate_store`` +
   ``compute_calibration``, confidence vs accepted on reached rows, 10 bins, 1000 AUROC
   levels), and DuckDB computing the same
   counters over the same parquet files: "reached" from a window over each step, from a
   join with the steps table, or (heatmap) counted from the steps table as the library
   does. The fastest DuckDB query giving the same table is the reference. A plain
   GROUP BY n, position over the position rows is shown too; it has no "reached" column,
   so it is not the same table.
3. The library's counters are checked equal to every DuckDB variant's before printing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsparklab.store import POSITIONS_SCHEMA, REQUESTS_SCHEMA, STEPS_SCHEMA
from dsparklab.store.schema import SCHEMA_VERSION, SCHEMA_VERSION_KEY, TABLE_KEY
from dsparklab.store.writer import new_run_json, write_json_atomic

METHODS = ("dspark", "eagle3")
WINDOWS = (3, 4, 5, 6, 7)
DATASETS = ("gsm8k", "math500", "aime", "humaneval", "livecodebench", "speedbench_coding")
STEPS_PER_REQUEST = 200
PART_ROWS = 2_000_000
N_BINS = 10
LEVELS = 1000


# -- synthetic store ----------------------------------------------------------------------


def _write_part(path: Path, table: pa.Table, name: str) -> None:
    table = table.replace_schema_metadata(
        {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode(), TABLE_KEY: name.encode()}
    )
    pq.write_table(table, path, compression="zstd")


def _request_ids(run_id: str, request: np.ndarray, n_requests: int) -> pa.Array:
    dictionary = pa.array([f"{run_id}/req{r:05d}" for r in range(n_requests)], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(request, pa.int32()), dictionary).cast(
        pa.string()
    )


def _synthetic_run(
    root: Path, method: str, n: int, dataset: str, n_steps: int, rng: np.random.Generator
) -> int:
    run_id = f"{method}-n{n}-{dataset}"
    run_dir = root / run_id
    for table in ("steps", "positions", "requests"):
        (run_dir / table).mkdir(parents=True, exist_ok=True)
    n_requests = max(1, n_steps // STEPS_PER_REQUEST)
    request = np.minimum(np.arange(n_steps) // STEPS_PER_REQUEST, n_requests - 1)  # [S]
    step = np.arange(n_steps) - request * STEPS_PER_REQUEST  # [S]
    drafted = 0 if method == "none" else n
    base = {"dspark": 0.82, "eagle3": 0.78}.get(method, 0.0)
    rate = np.clip(base - 0.03 * np.arange(drafted), 0.05, 0.99)  # [n]
    hardness = rng.normal(0.0, 0.05, n_requests)[request]  # [S] per-request difficulty
    p = np.clip(rate[None, :] + hardness[:, None], 0.01, 0.99)  # [S, n]
    accepted = np.cumprod(rng.random((n_steps, drafted)) < p, axis=1).astype(bool)  # [S, n]
    accepted_len = accepted.sum(axis=1).astype(np.int32)
    draft_cost = {"dspark": 0.3, "eagle3": 0.1 * n}.get(method, 0.0)
    steps = pa.table(
        {
            "request_id": _request_ids(run_id, request, n_requests),
            "prompt_id": pa.array([f"{dataset}-{r:05d}" for r in request], pa.string()),
            "dataset": pa.array([dataset] * n_steps, pa.string()),
            "step": pa.array(step, pa.int32()),
            "context_len": pa.array(64 + step * (drafted + 1), pa.int32()),
            "num_drafted": pa.array(np.full(n_steps, drafted), pa.int32()),
            "num_verified": pa.array(np.full(n_steps, drafted), pa.int32()),
            "accepted_len": pa.array(accepted_len, pa.int32()),
            "emitted": pa.array(accepted_len + 1, pa.int32()),  # no output cut: synthetic
            "draft_time_s": pa.nulls(n_steps, pa.float64())
            if method == "none"
            else pa.array(0.01 * draft_cost * rng.uniform(0.9, 1.1, n_steps)),
            "verify_time_s": pa.array(
                0.01 * (1.1 if drafted else 1.0) * rng.uniform(0.9, 1.1, n_steps)
            ),
        },
        schema=STEPS_SCHEMA,
    )
    _write_part(run_dir / "steps" / "part-00000.parquet", steps, "steps")
    requests = pa.table(
        {
            "request_id": pa.array([f"{run_id}/req{r:05d}" for r in range(n_requests)]),
            "prompt_id": pa.array([f"{dataset}-{r:05d}" for r in range(n_requests)]),
            "dataset": pa.array([dataset] * n_requests),
            "prompt_token_ids": pa.nulls(n_requests, pa.list_(pa.int32())),
            "output_token_ids": pa.nulls(n_requests, pa.list_(pa.int32())),
            "output_text": pa.nulls(n_requests, pa.string()),
            "wall_time_s": pa.nulls(n_requests, pa.float64()),
        },
        schema=REQUESTS_SCHEMA,
    )
    _write_part(run_dir / "requests" / "part-00000.parquet", requests, "requests")
    rows = n_steps * drafted
    steps_per_part = max(1, PART_ROWS // max(drafted, 1))
    for part, start in enumerate(range(0, n_steps if drafted else 0, steps_per_part)):
        stop = min(n_steps, start + steps_per_part)
        m = stop - start
        acc = accepted[start:stop]
        markov = method == "dspark"
        conf = np.clip(p[start:stop] + rng.normal(0, 0.08, (m, drafted)), 0, 1)
        flip = rng.random((m, drafted)) < 0.15
        bias = rng.normal(0.5, 1.0, (m, drafted)) + 0.5 * acc
        token = rng.integers(0, 150_000, (m, drafted))
        size = m * drafted

        def col(values, typ, keep=True, size=size):
            return pa.array(values.reshape(-1), typ) if keep else pa.nulls(size, typ)

        table = pa.table(
            {
                "request_id": _request_ids(
                    run_id, np.repeat(request[start:stop], drafted), n_requests
                ),
                "step": pa.array(np.repeat(step[start:stop], drafted), pa.int32()),
                "position": pa.array(np.tile(np.arange(drafted), m), pa.int32()),
                "draft_token": col(token, pa.int64()),
                "target_token": col(np.where(acc, token, token + 1), pa.int64()),
                "accepted": col(acc, pa.bool_()),
                "draft_logprob": col(rng.normal(-0.5, 0.3, (m, drafted)), pa.float32()),
                "base_logprob": col(rng.normal(-0.7, 0.3, (m, drafted)), pa.float32()),
                "markov_bias": col(bias, pa.float32(), markov),
                "markov_bias_norm": col(np.abs(bias), pa.float32(), markov),
                "markov_flip": col(flip, pa.bool_(), markov),
                "confidence": col(conf, pa.float32(), markov),
            },
            schema=POSITIONS_SCHEMA,
        )
        _write_part(run_dir / "positions" / f"part-{part:05d}.parquet", table, "positions")
    meta = new_run_json(
        run_id=run_id,
        engine={"name": "synthetic", "version": "benchmarks/analysis_scale.py"},
        method=method,
        num_speculative_tokens=drafted,
        target={"name": "synthetic-target"},
        drafter=None if method == "none" else {"name": f"synthetic-{method}"},
        dataset=dataset,
        sampling={"temperature": 0.0, "seed": 0},
        synthetic=True,
        note="SYNTHETIC benchmark data from benchmarks/analysis_scale.py; not a measurement",
    )
    meta["status"] = "complete"
    meta["rows"] = {"steps": n_steps, "positions": rows, "requests": n_requests}
    write_json_atomic(run_dir / "run.json", meta)
    return rows


def generate(root: Path, rows: int, seed: int) -> int:
    """Write the synthetic store; returns the number of position rows."""
    rng = np.random.default_rng(seed)
    per_run = rows / (len(METHODS) * len(WINDOWS) * len(DATASETS))
    total = 0
    for dataset in DATASETS:
        _synthetic_run(root, "none", 0, dataset, max(1, int(per_run / 5)), rng)
        for method in METHODS:
            for n in WINDOWS:
                total += _synthetic_run(root, method, n, dataset, max(1, round(per_run / n)), rng)
    return total


# -- measurements (each runs in a subprocess) ----------------------------------------------


def _duckdb_table_sql(root: Path, table: str, columns: str) -> str:
    """One UNION ALL over the method runs' parts of ``table``, run columns as constants."""
    from dsparklab.store import list_runs

    parts = []
    for run in list_runs(root).itertuples():
        if run.method == "none":
            continue
        files = sorted(str(p) for p in (Path(run.path) / table).glob("part-*.parquet"))
        file_list = ", ".join(f"'{f}'" for f in files)
        parts.append(
            f"SELECT '{run.run_id}' AS run_id, '{run.method}' AS method, {run.n} AS n, "
            f"{columns} FROM read_parquet([{file_list}])"
        )
    return "\nUNION ALL\n".join(parts)


def _duckdb_positions_sql(root: Path, columns: str) -> str:
    return _duckdb_table_sql(root, "positions", columns)


def _reached_sql(root: Path, columns: str, variant: str) -> str:
    pos = _duckdb_positions_sql(root, columns)
    if variant == "window":
        return (
            f"SELECT *, position <= sum(accepted::INT) OVER (PARTITION BY run_id, request_id, "
            f"step) AS reached FROM ({pos})"
        )
    return (
        f"SELECT p.*, (p.position <= s.accepted_len AND p.position < s.num_verified) AS reached "
        f"FROM ({pos}) p JOIN ("
        + _duckdb_table_sql(root, "steps", "request_id, step, accepted_len, num_verified")
        + ") s USING (run_id, request_id, step)"
    )


def _duck(sql: str):
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={os.cpu_count()}")
    con.execute("SET preserve_insertion_order=false")
    return con.execute(sql).df()


def measure(name: str, root: Path, out: Path) -> None:
    """Run one measurement; write its result table and print time and peak RSS as JSON."""
    start = time.perf_counter()
    if name.startswith("lib_heatmap"):
        from dsparklab.analysis import aggregate_store, compute_acceptance_by_position

        source = "positions" if name.endswith("positions") else "steps"
        counts = aggregate_store(root, metric="acceptance", by=("method", "n"), source=source)
        result = compute_acceptance_by_position(counts, by=("method", "n"), n_boot=0)
    elif name == "lib_calibration":
        from dsparklab.analysis import aggregate_store, compute_calibration

        counts = aggregate_store(
            root,
            metric="calibration",
            by=("n",),
            scores=("confidence",),
            n_bins=N_BINS,
            levels=LEVELS,
        )
        result = compute_calibration(counts, by=("n",), scores=("confidence",))
        counts.to_parquet(out.with_suffix(".counts.parquet"))
    elif name.startswith("duckdb_heatmap"):
        variant = name.rsplit("_", 1)[1]
        if variant == "steps":
            steps = _duckdb_table_sql(
                root, "steps", "num_drafted AS d, num_verified AS v, accepted_len AS a"
            )
            sql = (
                "WITH h AS (SELECT method, n, d, least(v, d) AS l, least(a, v, d) AS a, "
                f"count(*) AS c FROM ({steps}) GROUP BY ALL) "
                "SELECT method, n, i AS position, sum(c) AS n_drafted, "
                "sum(c * (a >= i AND l > i)::INT) AS n_reached, "
                "sum(c * (a > i)::INT) AS n_accepted "
                "FROM h CROSS JOIN range(0, 64) r(i) WHERE d > i GROUP BY ALL"
            )
        elif variant == "plain":
            sql = (
                f"SELECT method, n, position, count(*) AS n_drafted, "
                f"sum(accepted::INT) AS n_accepted FROM "
                f"({_duckdb_positions_sql(root, 'position, accepted')}) GROUP BY ALL"
            )
        else:
            sql = (
                "SELECT method, n, position, count(*) AS n_drafted, "
                "sum(reached::INT) AS n_reached, sum((accepted AND reached)::INT) AS n_accepted "
                f"FROM ({_reached_sql(root, 'request_id, step, position, accepted', variant)}) "
                "GROUP BY ALL"
            )
        result = _duck(sql)
    elif name.startswith("duckdb_calibration"):
        variant = name.rsplit("_", 1)[1]
        cols = "request_id, step, position, accepted, confidence"
        sql = (
            f"SELECT n, position, least(floor(c * {N_BINS}), {N_BINS - 1})::BIGINT AS bin, "
            f"least(floor(c * {LEVELS}), {LEVELS - 1})::BIGINT AS level_code, accepted, "
            "count(*) AS count, sum(c) AS sum_score, sum(c * c) AS sum_score_sq FROM "
            f"(SELECT *, confidence::DOUBLE AS c FROM ({_reached_sql(root, cols, variant)})) "
            "WHERE reached AND confidence IS NOT NULL GROUP BY ALL"
        )
        result = _duck(sql)
    else:
        raise SystemExit(f"unknown measurement {name!r}")
    seconds = time.perf_counter() - start
    result.to_parquet(out)
    print(json.dumps({"name": name, "seconds": seconds, "peak_mib": _peak_rss_kib() / 1024}))


def _peak_rss_kib() -> float:
    """This process's peak RSS. VmHWM starts afresh at exec; ru_maxrss (the fallback) keeps
    the parent's peak across fork + exec, so it can over-report a small child."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _run_measure(name: str, root: Path, work: Path) -> dict:
    out = work / f"{name}.parquet"
    proc = subprocess.run(
        [sys.executable, __file__, "--measure", name, "--store", str(root)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "BENCH_OUT": str(out)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_equal(work: Path) -> list[str]:
    """The library's counters equal DuckDB's (the measured queries' outputs)."""
    import pandas as pd

    problems = []
    for mine in ("lib_heatmap", "lib_heatmap_positions"):
        lib = pd.read_parquet(work / f"{mine}.parquet")
        for variant in ("window", "join", "steps"):
            duck = pd.read_parquet(work / f"duckdb_heatmap_{variant}.parquet")
            merged = lib.merge(duck, on=["method", "n", "position"], suffixes=("", "_duck"))
            if len(merged) != len(lib) or len(duck) != len(lib):
                problems.append(f"{mine} rows differ ({variant}): {len(lib)} vs {len(duck)}")
            for col in ("n_drafted", "n_reached", "n_accepted"):
                if not (merged[col] == merged[f"{col}_duck"]).all():
                    problems.append(f"{mine} {col} differs from DuckDB ({variant})")
    counts = pd.read_parquet(work / "lib_calibration.counts.parquet")
    counts["level_code"] = np.round(counts["level"] * LEVELS).astype(np.int64)
    for variant in ("window", "join"):
        duck = pd.read_parquet(work / f"duckdb_calibration_{variant}.parquet")
        key = ["n", "position", "bin", "level_code", "accepted"]
        merged = counts.merge(duck, on=key, suffixes=("", "_duck"), how="outer")
        if merged["count"].isna().any() or merged["count_duck"].isna().any():
            problems.append(f"calibration cells differ from DuckDB ({variant})")
        elif not (merged["count"] == merged["count_duck"]).all() or not np.allclose(
            merged["sum_score"], merged["sum_score_duck"], rtol=1e-9
        ):
            problems.append(f"calibration counters differ from DuckDB ({variant})")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000_000, help="position rows to generate")
    parser.add_argument("--store", type=Path, default=Path("/tmp/dsparklab-bench-store"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement (best kept)")
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    parser.add_argument("--reuse", action="store_true", help="reuse an existing store")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.store, Path(os.environ["BENCH_OUT"]))
        return

    if args.reuse and any(args.store.glob("*/run.json")):
        print(f"reusing store {args.store}")
        rows = sum(
            json.loads(p.read_text())["rows"]["positions"] for p in args.store.glob("*/run.json")
        )
    else:
        if args.store.exists():
            shutil.rmtree(args.store)
        args.store.mkdir(parents=True)
        start = time.perf_counter()
        rows = generate(args.store, args.rows, args.seed)
        print(f"generated {rows:,} SYNTHETIC position rows in {time.perf_counter() - start:.0f} s")
    size = sum(p.stat().st_size for p in args.store.rglob("*.parquet"))
    print(f"store {args.store}: {size / 2**20:,.0f} MiB of parquet")

    work = args.store.parent / (args.store.name + "-results")
    work.mkdir(exist_ok=True)
    for path in args.store.rglob("*.parquet"):  # warm the page cache for every contender
        path.read_bytes()
    names = [
        "lib_heatmap",
        "lib_heatmap_positions",
        "duckdb_heatmap_window",
        "duckdb_heatmap_join",
        "duckdb_heatmap_steps",
        "duckdb_heatmap_plain",
        "lib_calibration",
        "duckdb_calibration_window",
        "duckdb_calibration_join",
    ]
    results: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name in names:
            r = _run_measure(name, args.store, work)
            best = results.get(name)
            results[name] = {
                "seconds": min(r["seconds"], best["seconds"]) if best else r["seconds"],
                "peak_mib": max(r["peak_mib"], best["peak_mib"]) if best else r["peak_mib"],
            }
    problems = _check_equal(work)

    def row(label: str, name: str, ref: str | None) -> str:
        r = results[name]
        ratio = f"{r['seconds'] / results[ref]['seconds']:.2f}x" if ref else ""
        return f"| {label} | {r['seconds']:.2f} | {r['peak_mib']:,.0f} | {ratio} |"

    heat_ref = min(
        ("duckdb_heatmap_window", "duckdb_heatmap_join", "duckdb_heatmap_steps"),
        key=lambda k: results[k]["seconds"],
    )
    cal_ref = min(
        ("duckdb_calibration_window", "duckdb_calibration_join"),
        key=lambda k: results[k]["seconds"],
    )
    labels = [
        ("heatmap: dsparklab, acceptance counted from steps (default)", "lib_heatmap", heat_ref),
        (
            "heatmap: dsparklab, source='positions' (per-row reached)",
            "lib_heatmap_positions",
            heat_ref,
        ),
        ("heatmap: DuckDB, reached by window over each step", "duckdb_heatmap_window", heat_ref),
        ("heatmap: DuckDB, reached by join with steps", "duckdb_heatmap_join", heat_ref),
        ("heatmap: DuckDB, counted from steps (histogram)", "duckdb_heatmap_steps", heat_ref),
        (
            "heatmap: DuckDB plain GROUP BY n, position (no reached; not the same numbers)",
            "duckdb_heatmap_plain",
            heat_ref,
        ),
        (
            "calibration: dsparklab aggregate_store + compute_calibration",
            "lib_calibration",
            cal_ref,
        ),
        ("calibration: DuckDB, reached by window", "duckdb_calibration_window", cal_ref),
        ("calibration: DuckDB, reached by join with steps", "duckdb_calibration_join", cal_ref),
    ]
    print()
    print(f"{rows:,} SYNTHETIC position rows, {os.cpu_count()} CPUs, best of {args.repeat}")
    print("| measurement | seconds | peak RSS MiB | vs fastest DuckDB giving the same table |")
    print("|---|---|---|---|")
    for label, name, ref in labels:
        print(row(label, name, ref))
    print(
        "library counters equal DuckDB's:", "yes" if not problems else "NO: " + "; ".join(problems)
    )
    if not args.keep:
        shutil.rmtree(args.store)
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
