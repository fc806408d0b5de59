"""Benchmark: the counting stage on DuckDB and Spark at scale, beside hand-written DuckDB.

    .venv/bin/python benchmarks/analysis_scale.py                      # 20 M and 200 M rows
    .venv/bin/python benchmarks/analysis_scale.py --rows 2000000 --store /tmp/small
    .venv/bin/python benchmarks/analysis_scale.py --rows 200000000 --no-spark \
        --only report,lib_heatmap,duckdb_heatmap_steps                  # the report alone

1. A SYNTHETIC generator (used only by this benchmark; random numbers, not a
   measurement of any drafter) writes a store in the table layout, as ``dsparklab compact``
   leaves it: for each of 2 methods (dspark, eagle3) x n = 3..7 x 6 datasets one run, with
   large sorted files of the store schema in its hive partitions, its run.json and its row
   of the runs table, plus a target-only baseline run per dataset. Acceptance is
   prefix-closed per step, so "reached" needs every row's step, as in real traces. Parts
   are written with pyarrow directly (not TraceWriter, whose per-row Python dicts would take
   hours at 200 M rows); run.json says ``"synthetic": true``.
2. Each measurement runs in its own subprocess, which reports its wall time (imports and,
   for Spark, the session's start included) and peak RSS (of the whole process tree, a
   Spark driver's JVM included): the library's position x n acceptance heatmap
   (``aggregate_store`` + ``compute_acceptance_by_position``, counted from the steps table
   by default, or from the position rows) and per-position calibration table
   (``aggregate_store`` + ``compute_calibration``: confidence vs accepted on reached rows,
   10 bins, 1000 AUROC levels) on DuckDB and on Spark ``local[2]``; the in-process path the
   notebooks use on frames (``read_trace`` + ``count_frames``, the same SQL by DuckDB over
   the frames in memory) up to ``--inproc-max-rows``; and
   hand-written DuckDB queries for the same counters over the same files ("reached" from a
   window over each step, from a join with the steps table, or counted from the steps
   table), and ``dsparklab report`` over the store (from ``--report-min-rows``: its findings
   and the notebooks' heatmaps, AL and speedup are counted by DuckDB over every request; the
   token-level views read a sample of whole requests within ``DSPARKLAB_MAX_ROWS``).
   ``--only`` runs some measurements alone. dsparklab's modules are byte-compiled first,
   as pip compiles every installed package's. The fastest hand-written query
   is the reference of each ratio. DuckDB runs
   with a 3 GB memory limit (``BENCH_DUCKDB_MEMORY``), past which it spills to disk, in
   the library's queries and the hand-written ones alike.
3. Every path's counters are checked equal to every hand-written query's before printing.
"""

from __future__ import annotations

import argparse
import compileall
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

import dsparklab
from dsparklab.store import POSITIONS_SCHEMA, REQUESTS_SCHEMA, STEPS_SCHEMA
from dsparklab.store.compact import ROW_GROUP_ROWS
from dsparklab.store.layout import (
    RUNS_DIR,
    RUNS_ROW,
    RUNS_TABLE,
    compacted_part_name,
    partition_path,
)
from dsparklab.store.schema import RUN_JSON
from dsparklab.store.writer import new_run_json, part_bytes, runs_row, write_json_atomic

METHODS = ("dspark", "eagle3")
WINDOWS = (3, 4, 5, 6, 7)
DATASETS = ("gsm8k", "math500", "aime", "humaneval", "livecodebench", "speedbench_coding")
STEPS_PER_REQUEST = 200
PART_ROWS = 8_000_000  # rows per positions file: large, as compaction writes them
N_BINS = 10
# DuckDB's memory limit, past which it spills to disk, for the library's queries and the
# hand-written ones alike (the default is 80 % of RAM)
DUCKDB_MEMORY = os.environ.get("BENCH_DUCKDB_MEMORY", "3GB")
LEVELS = 1000


# -- synthetic store ----------------------------------------------------------------------


def _write_part(directory: Path, seq: int, table: pa.Table, name: str) -> None:
    """One committed part of generation 1 in its partition (what compaction writes)."""
    directory.mkdir(parents=True, exist_ok=True)
    if name in ("steps", "requests"):
        table = table.drop_columns(["dataset"])  # the partition holds it
    data = part_bytes(table, name, ROW_GROUP_ROWS)
    (directory / compacted_part_name(1, seq)).write_bytes(data)


def _request_ids(run_id: str, request: np.ndarray, n_requests: int) -> pa.Array:
    dictionary = pa.array([f"{run_id}/req{r:05d}" for r in range(n_requests)], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(request, pa.int32()), dictionary).cast(
        pa.string()
    )


def _synthetic_run(
    root: Path, method: str, n: int, dataset: str, n_steps: int, rng: np.random.Generator
) -> int:
    run_id = f"synthetic/{dataset}/{method}-n{n}"
    drafted = 0 if method == "none" else n
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
    partition = partition_path(meta)
    n_requests = max(1, n_steps // STEPS_PER_REQUEST)
    request = np.minimum(np.arange(n_steps) // STEPS_PER_REQUEST, n_requests - 1)  # [S]
    step = np.arange(n_steps) - request * STEPS_PER_REQUEST  # [S]
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
            "batch_size": pa.array(np.ones(n_steps), pa.int32()),
            "other_time_s": pa.nulls(n_steps, pa.float64()),
        },
        schema=STEPS_SCHEMA,
    )
    _write_part(root / "steps" / partition, 0, steps, "steps")
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
    _write_part(root / "requests" / partition, 0, requests, "requests")
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
        _write_part(root / "positions" / partition, part, table, "positions")
    (root / "positions" / partition).mkdir(parents=True, exist_ok=True)
    meta["status"] = "complete"
    meta["rows"] = {"steps": n_steps, "positions": rows, "requests": n_requests}
    meta["compaction"] = {"generation": 1, "sorted_by": ["request_id", "step", "position"]}
    runs_dir = root / RUNS_TABLE / partition
    runs_dir.mkdir(parents=True, exist_ok=True)
    (runs_dir / RUNS_ROW).write_bytes(part_bytes(runs_row(meta), RUNS_TABLE))
    write_json_atomic(root / RUNS_DIR / partition / RUN_JSON, meta)
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
    """The method runs' rows of ``table``, read as DuckDB reads the table layout natively."""
    return (
        f"SELECT run_id, method, n, {columns} FROM read_parquet('{root}/{table}/**/*.parquet', "
        "hive_partitioning = true) WHERE method <> 'none'"
    )


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
    con.execute(f"SET memory_limit='{DUCKDB_MEMORY}'")
    return con.execute(sql).df()


def measure(name: str, root: Path, out: Path) -> None:
    """Run one measurement; write its result table and print time and peak RSS as JSON."""
    start = time.perf_counter()
    engine = "spark" if name.startswith("spark") else "duckdb"
    if name.startswith(("lib_heatmap", "spark_heatmap")):
        from dsparklab.analysis import aggregate_store, compute_acceptance_by_position

        source = "positions" if name.endswith("positions") else "steps"
        counts = aggregate_store(
            root,
            metric="acceptance",
            by=("method", "n"),
            source=source,
            engine=engine,
            memory_limit=DUCKDB_MEMORY,
            per_request=False,  # summed, as the hand-written queries it is set beside
        )
        result = compute_acceptance_by_position(counts, by=("method", "n"), n_boot=0)
    elif name.startswith(("lib_calibration", "spark_calibration")):
        from dsparklab.analysis import aggregate_store, compute_calibration

        counts = aggregate_store(
            root,
            metric="calibration",
            by=("n",),
            scores=("confidence",),
            n_bins=N_BINS,
            levels=LEVELS,
            engine=engine,
            per_request=False,
            memory_limit=DUCKDB_MEMORY,
        )
        result = compute_calibration(counts, by=("n",), scores=("confidence",))
        counts.to_parquet(out.with_suffix(".counts.parquet"))
    elif name == "inproc_heatmap":
        from dsparklab.analysis import compute_acceptance_by_position, count_frames
        from dsparklab.store import read_trace

        columns = ["request_id", "step", "position", "accepted"]
        positions = read_trace(root, "positions", columns=columns, filters={"method": METHODS})
        steps = read_trace(
            root,
            "steps",
            columns=["request_id", "step", "num_drafted", "num_verified", "accepted_len"],
            filters={"method": METHODS},
        )
        counts = count_frames(
            positions=positions, steps=steps, by=("method", "n"), per_request=False
        )
        result = compute_acceptance_by_position(counts, by=("method", "n"), n_boot=0)
    elif name == "report":
        report_dir = out.with_suffix(".report")
        shutil.rmtree(report_dir, ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-m", "dsparklab", "report", "--runs", str(root), "--out"]
            + [str(report_dir), "--no-png"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"report failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        import pandas as pd

        result = pd.DataFrame({"files": [sum(1 for _ in report_dir.rglob("*"))]})
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
    """One measurement in a subprocess; its peak memory is the whole process tree's (a
    Spark driver's JVM included), sampled every 0.1 s, or the child's VmHWM if larger."""
    import psutil

    out = work / f"{name}.parquet"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--measure", name, "--store", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BENCH_OUT": str(out)},
    )
    peak = 0
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree))
        except psutil.Error:
            pass
        time.sleep(0.1)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{stderr}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["peak_mib"] = max(result["peak_mib"], peak / 2**20)
    return result


def _check_equal(work: Path, names: list[str]) -> list[str]:
    """Every path's counters equal DuckDB's hand-written queries' (the measured outputs)."""
    import pandas as pd

    problems = []
    heatmaps = [n for n in names if "heatmap" in n and not n.startswith("duckdb")]
    for mine in heatmaps:
        lib = pd.read_parquet(work / f"{mine}.parquet")
        for variant in ("window", "join", "steps"):
            if f"duckdb_heatmap_{variant}" not in names:
                continue
            duck = pd.read_parquet(work / f"duckdb_heatmap_{variant}.parquet")
            merged = lib.merge(duck, on=["method", "n", "position"], suffixes=("", "_duck"))
            if len(merged) != len(lib) or len(duck) != len(lib):
                problems.append(f"{mine} rows differ ({variant}): {len(lib)} vs {len(duck)}")
            for col in ("n_drafted", "n_reached", "n_accepted"):
                if not (merged[col] == merged[f"{col}_duck"]).all():
                    problems.append(f"{mine} {col} differs from DuckDB ({variant})")
    for mine in [n for n in names if n.endswith("_calibration") and not n.startswith("duckdb")]:
        counts = pd.read_parquet(work / f"{mine}.counts.parquet")
        counts["level_code"] = np.round(counts["level"] * LEVELS).astype(np.int64)
        for variant in ("window", "join"):
            if f"duckdb_calibration_{variant}" not in names:
                continue
            duck = pd.read_parquet(work / f"duckdb_calibration_{variant}.parquet")
            key = ["n", "position", "bin", "level_code", "accepted"]
            merged = counts.merge(duck, on=key, suffixes=("", "_duck"), how="outer")
            if merged["count"].isna().any() or merged["count_duck"].isna().any():
                problems.append(f"{mine} cells differ from DuckDB ({variant})")
            elif not (merged["count"] == merged["count_duck"]).all() or not np.allclose(
                merged["sum_score"], merged["sum_score_duck"], rtol=1e-9
            ):
                problems.append(f"{mine} counters differ from DuckDB ({variant})")
    return problems


# (label, measurement, the hand-written DuckDB queries it is compared with)
HEAT_REFS = ("duckdb_heatmap_window", "duckdb_heatmap_join", "duckdb_heatmap_steps")
CAL_REFS = ("duckdb_calibration_window", "duckdb_calibration_join")
LABELS = [
    ("heatmap: dsparklab on DuckDB, from steps (default)", "lib_heatmap", HEAT_REFS),
    ("heatmap: dsparklab on DuckDB, source='positions'", "lib_heatmap_positions", HEAT_REFS),
    ("heatmap: dsparklab on Spark local[2], from steps", "spark_heatmap", HEAT_REFS),
    ("heatmap: in-process (read_trace + count_frames)", "inproc_heatmap", HEAT_REFS),
    ("heatmap: hand-written DuckDB, reached by window", "duckdb_heatmap_window", HEAT_REFS),
    ("heatmap: hand-written DuckDB, reached by join", "duckdb_heatmap_join", HEAT_REFS),
    ("heatmap: hand-written DuckDB, from steps", "duckdb_heatmap_steps", HEAT_REFS),
    ("calibration: dsparklab on DuckDB", "lib_calibration", CAL_REFS),
    ("calibration: dsparklab on Spark local[2]", "spark_calibration", CAL_REFS),
    ("calibration: hand-written DuckDB, reached by window", "duckdb_calibration_window", CAL_REFS),
    ("calibration: hand-written DuckDB, reached by join", "duckdb_calibration_join", CAL_REFS),
    ("dsparklab report (7 notebooks + findings; --no-png)", "report", HEAT_REFS),
]


def _bench(store: Path, rows_wanted: int, args: argparse.Namespace) -> tuple[int, dict, list]:
    """Generate (or reuse) one store and run every measurement on it."""
    runs = list(store.glob(f"{RUNS_DIR}/*/*/*/*/{RUN_JSON}"))
    if args.reuse and runs:
        print(f"reusing store {store}")
        rows = sum(json.loads(p.read_text())["rows"]["positions"] for p in runs)
    else:
        if store.exists():
            shutil.rmtree(store)
        store.mkdir(parents=True)
        start = time.perf_counter()
        rows = generate(store, rows_wanted, args.seed)
        print(f"generated {rows:,} SYNTHETIC position rows in {time.perf_counter() - start:.0f} s")
    size = sum(p.stat().st_size for p in store.rglob("*.parquet"))
    print(f"store {store}: {size / 2**20:,.0f} MiB of parquet")
    work = store.parent / (store.name + "-results")
    work.mkdir(exist_ok=True)
    names = [name for _, name, _ in LABELS]
    if args.no_spark:
        names = [n for n in names if not n.startswith("spark")]
    if args.only:
        wanted = set(args.only.split(","))
        if wanted - set(names):
            raise SystemExit(f"--only: unknown measurements {sorted(wanted - set(names))}")
        names = [n for n in names if n in wanted]
    if rows < args.report_min_rows and "report" in names:
        names.remove("report")
    if rows > args.inproc_max_rows and "inproc_heatmap" in names:
        names.remove("inproc_heatmap")
        print(f"in-process path not run above {args.inproc_max_rows:,} rows (--inproc-max-rows)")
    if rows > args.spark_calibration_max_rows and "spark_calibration" in names:
        names.remove("spark_calibration")
        print(
            f"Spark calibration not run above {args.spark_calibration_max_rows:,} rows "
            "(--spark-calibration-max-rows)"
        )
    for path in store.rglob("*.parquet"):  # warm the page cache for every contender
        path.read_bytes()
    # duckdb, pandas and pyspark import from the bytecode pip compiled when it installed
    # them; dsparklab, installed editable, would compile its sources in every measurement
    # where bytecode is not written (PYTHONDONTWRITEBYTECODE: 33 ms of dsparklab.analysis)
    compileall.compile_dir(Path(dsparklab.__file__).parent, quiet=1)
    results: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name in names:
            r = _run_measure(name, store, work)
            best = results.get(name)
            results[name] = {
                "seconds": min(r["seconds"], best["seconds"]) if best else r["seconds"],
                "peak_mib": max(r["peak_mib"], best["peak_mib"]) if best else r["peak_mib"],
            }
            print(f"  {name}: {r['seconds']:.1f} s, {r['peak_mib']:,.0f} MiB", flush=True)
    problems = _check_equal(work, names)
    if not args.keep:
        shutil.rmtree(store)
        shutil.rmtree(work)
    return rows, results, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        default="20000000,200000000",
        help="position rows to generate: one size, or sizes separated by commas",
    )
    parser.add_argument("--store", type=Path, default=Path("/tmp/dsparklab-bench-store"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (best kept)")
    parser.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    parser.add_argument("--reuse", action="store_true", help="reuse an existing store")
    parser.add_argument("--no-spark", action="store_true", help="leave Spark out")
    parser.add_argument("--inproc-max-rows", type=int, default=60_000_000)
    parser.add_argument("--spark-calibration-max-rows", type=int, default=60_000_000)
    parser.add_argument(
        "--report-min-rows", type=int, default=100_000_000, help="time the report from here"
    )
    parser.add_argument(
        "--only",
        help="measurements to run, separated by commas (default: all), e.g. report,lib_heatmap",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.store, Path(os.environ["BENCH_OUT"]))
        return

    sizes = [int(v) for v in args.rows.split(",")]
    tables = []
    for wanted in sizes:
        store = (
            args.store if len(sizes) == 1 else args.store.with_name(f"{args.store.name}-{wanted}")
        )
        tables.append(_bench(store, wanted, args))

    print()
    print(
        f"SYNTHETIC position rows, {os.cpu_count()} CPUs, best of {args.repeat}; each cell: "
        "seconds / peak RSS MiB / time vs the fastest hand-written DuckDB query"
    )
    head = " | ".join(f"{rows:,} rows" for rows, _, _ in tables)
    growth = len(tables) > 1
    print(f"| measurement | {head} |" + (" time growth |" if growth else ""))
    print("|---|" + "---|" * len(tables) + ("---|" if growth else ""))
    for label, name, refs in LABELS:
        cells = []
        for _, results, _ in tables:
            if name not in results:
                cells.append("not run")
                continue
            ref = min((results[k]["seconds"] for k in refs if k in results), default=None)
            r = results[name]
            ratio = f"{r['seconds'] / ref:.2f}x" if ref else "no reference run"
            cells.append(f"{r['seconds']:.1f} s / {r['peak_mib']:,.0f} / {ratio}")
        line = f"| {label} | " + " | ".join(cells) + " |"
        if growth:
            first, last = tables[0][1].get(name), tables[-1][1].get(name)
            line += f" {last['seconds'] / first['seconds']:.1f}x |" if first and last else " |"
        print(line)
    for rows, _, problems in tables:
        verdict = "yes" if not problems else "NO: " + "; ".join(problems)
        print(f"{rows:,} rows: every path's counters equal hand-written DuckDB's: {verdict}")


if __name__ == "__main__":
    main()
