"""Model Runner V2 path of the taps, driven by vLLM's own objects on CPU.

vLLM's ``RequestState`` (``last_sampled_tokens`` is ``[max_num_reqs, 1]``, request-state
order), ``InputBatch`` (real constructor, rows re-sorted every step), the real
``DSparkSpeculator`` with vLLM's ``Qwen3DSparkForCausalLM`` loaded from the zoo, and the
real ``_sample_sequential``. Requests are added and removed the way the runner does it
(``RequestState.add_request`` / ``remove_request``), one finishes and one is preempted
and resumes. What vLLM's ``propose`` does before the draft step is a Triton kernel
(``prepare_dflash_inputs``) and an attention forward, neither of which runs on CPU; the
harness writes that kernel's outputs (anchor = the request state's last sampled token,
sample slots mapped to the request-state index) and fixed backbone outputs, then runs the
draft step through the plugin's ``propose`` wrapper called exactly as the V2 runner
calls it. The trace must equal the reference engine's Markov step on the same inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import torch
from v2_propose import propose_as_v2_runner, wrapped_draft_step

from dsparklab.engines.vllm import patching, runs
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.store import read_run_json, read_trace, validate_trace
from dsparklab.store.reader import store_runs

if TYPE_CHECKING:
    from conftest import CpuDSpark

pytestmark = pytest.mark.vllm
ATOL = 1e-5


@dataclass
class Harness:
    spec: Any
    req_states: Any
    input_buffers: Any
    propose: Any
    execute_model: Any
    n: int
    gen: torch.Generator
    draft_inputs: dict[str, Any]  # rows and backbone outputs ("hidden") the draft step reads
    # (request id, draft step of that request) -> expected values of its draft
    drafts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, req_id: str, prompt: list[int]) -> None:
        self.req_states.add_request(req_id, len(prompt), prompt, 0, 64)

    def end(self, *, finished: set[str] = frozenset(), preempted: set[str] = frozenset()) -> None:
        from vllm.v1.core.sched.output import SchedulerOutput

        out = SchedulerOutput.make_empty()
        out.finished_req_ids = set(finished)
        out.preempted_req_ids = set(preempted)
        self.execute_model(None, out)

    def step(
        self,
        rows: list[tuple[str, int, int, int]],  # (request id, num_sampled, num_rejected, token)
        expected_markov: Any,
    ) -> dict[str, torch.Tensor]:
        """One verify + draft step over ``rows`` (batch order); returns the expectation."""
        from vllm.v1.worker.gpu.input_batch import InputBatch

        spec, n, num_reqs = self.spec, self.n, len(rows)
        state = [self.req_states.req_id_to_index[r[0]] for r in rows]
        for (_, sampled, _, token), idx in zip(rows, state, strict=True):
            if sampled > 0:  # what the runner's postprocess writes after sampling
                self.req_states.last_sampled_tokens[idx, 0] = token
        seq_lens = [int(self.req_states.prefill_len.np[i]) + 3 * n for i in state]
        q = spec.num_query_per_req
        batch = InputBatch.make_dummy(num_reqs, num_reqs * q, self.input_buffers)
        batch = replace(
            batch,
            req_ids=[r[0] for r in rows],
            idx_mapping=torch.tensor(state, dtype=torch.int64),
            idx_mapping_np=np.array(state, dtype=np.intp),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        )
        # prepare_dflash_inputs' outputs (sample_from_anchor layout), in torch
        last = self.req_states.last_sampled_tokens
        offset = 0 if spec.sample_from_anchor else 1
        for r, idx in enumerate(state):
            slots = slice(r * n, (r + 1) * n)
            spec.sample_indices[slots] = torch.arange(n) + r * q + offset
            spec.sample_pos[slots] = torch.arange(n) + seq_lens[r] + 1
            spec.sample_idx_mapping[slots] = idx
            spec.temperature[idx] = 0.0
            spec.input_buffers.input_ids[spec._anchor_idx[r]] = last[idx, 0]
        hidden = torch.randn(num_reqs * q, spec.model.config.hidden_size, generator=self.gen) * 2
        anchors = last[torch.tensor(state), 0].clone()
        self.draft_inputs.update(rows=num_reqs, hidden=hidden)
        propose_as_v2_runner(
            self.propose,
            spec,
            batch,
            torch.tensor([r[1] for r in rows], dtype=torch.int32),  # num_sampled
            torch.tensor([r[2] for r in rows], dtype=torch.int32),  # num_rejected
            self.req_states.last_sampled_tokens,  # [max_num_reqs, 1]
            next_prefill_tokens=self.req_states.next_prefill_tokens,
            temperature=torch.zeros(spec.max_num_reqs),
            seeds=torch.zeros(spec.max_num_reqs, dtype=torch.int64),
            num_speculative_tokens=n,
            is_profile=False,  # a keyword the wrapper does not read is passed on
        )
        exp = expected_markov(spec, hidden, anchors)
        for r, (req_id, *_rest) in enumerate(rows):
            self.drafts.setdefault(req_id, []).append(
                {k: v[r].clone() for k, v in exp.items() if k not in ("base", "sample_hidden")}
                | {"seq_len": seq_lens[r]}
            )
        assert torch.equal(spec.draft_tokens[:num_reqs], exp["tokens"])
        return exp


@pytest.fixture
def harness(cpu_dspark: CpuDSpark, build_speculator: Any, tmp_path: Path) -> Any:
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.states import RequestState

    patching.install(TapConfig(trace_dir=tmp_path / "taps", run_name="v2", flush_seconds=60))
    try:
        spec = build_speculator(cpu_dspark)
        n = spec.num_speculative_steps
        vocab = cpu_dspark.vllm_config.model_config.get_vocab_size()
        req_states = RequestState(spec.max_num_reqs, 256, 256, n, vocab, torch.device("cpu"))

        draft_inputs: dict[str, Any] = {}

        def finish_requests(self: Any, scheduler_output: Any) -> None:
            # the runner's own bookkeeping: finished and preempted states are freed
            for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
                req_states.remove_request(req_id)

        wrapped_exec = GPUModelRunner.__dict__["execute_model"]
        assert getattr(wrapped_exec, "__dsparklab_tap__", False)
        yield Harness(
            spec=spec,
            req_states=req_states,
            input_buffers=InputBuffers(spec.max_num_reqs, 256, torch.device("cpu")),
            propose=wrapped_draft_step(draft_inputs),
            execute_model=runs.wrap_execute_model(finish_requests),
            n=n,
            gen=torch.Generator().manual_seed(11),
            draft_inputs=draft_inputs,
        )
    finally:
        runs.close_worker()
        patching.uninstall()


def test_v2_trace_equals_reference_over_resorted_finished_and_preempted_requests(
    harness: Harness, expected_markov_fn: Any
) -> None:
    h, n = harness, harness.n
    step = lambda rows: h.step(rows, expected_markov_fn)  # noqa: E731
    for req_id, prompt in (("a-00000001", [5, 6, 7]), ("b-00000002", [8, 9]), ("c-00000003", [4])):
        h.add(req_id, prompt)
    a, b, c, d = "a-00000001", "b-00000002", "c-00000003", "d-00000004"
    # 1: prefill done for a, b, c (one token each, nothing verified)
    step([(a, 1, 0, 101), (b, 1, 0, 102), (c, 1, 0, 103)])
    # 2: re-sorted; c accepts 2, a all n, b none; d's prefill completes
    h.add(d, [3, 3, 3, 3])
    step([(c, 3, n - 2, 201), (a, n + 1, 0, 202), (b, 1, n, 203), (d, 1, 0, 204)])
    # a finishes, b is preempted (both states freed; b's draft is never verified)
    h.end(finished={a}, preempted={b})
    step([(d, 2, n - 1, 301), (c, 1, n, 302)])
    recorder = h.spec.__dict__["_dsparklab_tap"].recorder
    runs.flush_worker()
    assert set(recorder._pending) == {c, d}  # a's and b's drafts dropped, not left pending
    # b resumes under the same id (a new state slot), prefilled again
    h.add(b, [8, 9, 203])
    step([(b, 1, 0, 401), (c, n + 1, 0, 402), (d, 1, n, 403)])
    step([(b, 4, n - 3, 501)])

    tap = h.spec.__dict__["_dsparklab_tap"]
    run_dir = tap.recorder.run_dir
    runs.close_worker()
    assert all(r.ok for r in validate_trace(run_dir))
    steps = read_trace(run_dir, "steps")
    positions = read_trace(run_dir, "positions")
    # (request, its draft index in h.drafts, accepted, verified, emitted token)
    verified = [
        (a, 0, n, n, 202),
        (b, 0, 0, n, 203),
        (c, 0, 2, n, 201),
        (c, 1, 0, n, 302),
        (c, 2, n, n, 402),
        (d, 0, 1, n, 301),
        (d, 1, 0, n, 403),
        (b, 2, 3, n, 501),  # after the resume: its draft index 1 was preempted away
    ]
    got = {(r.request_id, int(r.step)): r for r in steps.itertuples()}
    assert len(got) == len(verified) == len(steps)
    step_no: dict[str, int] = {}
    for req_id, k, accepted, num_verified, emitted in verified:
        s = step_no.get(req_id, 0)
        step_no[req_id] = s + 1
        row = got[(req_id, s)]  # numbering continues across the preemption
        exp = h.drafts[req_id][k]
        assert (row.accepted_len, row.num_verified, row.num_drafted) == (accepted, num_verified, n)
        assert row.prompt_id == req_id.split("-")[0]
        pos = positions[(positions.request_id == req_id) & (positions.step == s)]
        pos = pos.sort_values("position")
        assert pos.draft_token.tolist() == exp["tokens"].tolist()
        assert pos.accepted.tolist() == [p < accepted for p in range(n)]
        if accepted < n:
            assert pos.target_token.iloc[accepted] == emitted  # from last_sampled_tokens
        for name in ("markov_bias", "markov_bias_norm", "confidence"):
            torch.testing.assert_close(
                torch.tensor(pos[name].tolist()), exp[name].float(), atol=ATOL, rtol=0, msg=name
            )
        for name in ("draft_logprob", "base_logprob"):
            torch.testing.assert_close(
                torch.tensor(pos[name].tolist()), exp[name].float(), atol=1e-4, rtol=0, msg=name
            )
        assert pos.markov_flip.tolist() == exp["markov_flip"].bool().tolist()
    # step costs: the batch of the engine step that verified each draft (rows 4, 2, 3, 1),
    # each row its share of that step's draft pass; V2's step is not timed (no verify)
    batch = {(a, 0): 4, (b, 0): 4, (c, 0): 4, (d, 0): 2, (c, 1): 2, (c, 2): 3, (d, 1): 3}
    batch[(b, 1)] = 1
    assert {(r.request_id, int(r.step)): int(r.batch_size) for r in steps.itertuples()} == batch
    assert (steps["draft_time_s"] > 0).all()
    assert steps["verify_time_s"].isna().all() and steps["other_time_s"].isna().all()
    assert steps.groupby("batch_size")["draft_time_s"].nunique().eq(1).all()
    meta = read_run_json(run_dir)
    assert meta["status"] == "complete"
    assert meta["engine"]["model_runner"] == "v2"
    spec_cfg = h.spec.vllm_config.speculative_config
    assert meta["speculative"]["draft_sample_method"] == spec_cfg.draft_sample_method
    assert meta["speculative"]["rejection_sample_method"] == spec_cfg.rejection_sample_method
    assert meta["speculative"]["enable_adaptive_verification"] is False
    assert "dspark_draft_topk" in meta["speculative"]
    # adaptive verification off: vLLM skips the head, the taps evaluate it
    assert meta["confidence_source"] == "confidence_head_evaluated_by_taps"


# -- the whole V2 engine step: the harness (dsparklab/engines/vllm/harness.py) ------------
HARNESS_LIMIT, HARNESS_TOKENS = 3, 24


def _harness_options(out: Path) -> Any:
    from dsparklab.engines.plan import CollectOptions

    return CollectOptions(
        methods=("dspark", "eagle3", "none"),
        ns=(3, 7),
        datasets=("humaneval",),
        out=out,
        limit=HARNESS_LIMIT,
        max_new_tokens=HARNESS_TOKENS,
        progress=False,
        threads=1,
    )


@pytest.fixture(scope="module")
def harness_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """DSpark and Eagle3 (n = 3 and 7) and the baseline through the harness, traced."""
    from dsparklab.engines.vllm import harness

    base = tmp_path_factory.mktemp("harness")
    served = harness.collect(_harness_options(base / "v2"), max_num_seqs=2, keep_taps=base / "taps")
    return {"served": served, "v2": base / "v2", "taps": base / "taps"}


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference engine on the harness's prompts and settings."""
    from dsparklab.engines.reference.collect import collect as reference_collect

    out = tmp_path_factory.mktemp("harness-reference") / "reference"
    reference_collect(_harness_options(out))
    return out


def test_the_harness_drafts_and_verifies_as_the_reference_engine(
    harness_runs: Any, reference_runs: Path
) -> None:
    """Greedy, the same drafters: vLLM's Markov stage and Eagle3 head over the reference
    backbones give the reference engine's drafts, verdicts and values, request by request,
    and every output equals plain greedy decoding (the baseline)."""
    keys = ["method", "n", "request_id", "step"]  # the run_ids name their engines
    got = read_trace(harness_runs["v2"], "steps").sort_values(keys)
    want = read_trace(reference_runs, "steps").sort_values(keys)
    cols = [*keys, "context_len", "num_drafted", "accepted_len", "emitted"]
    assert got[cols].reset_index(drop=True).equals(want[cols].reset_index(drop=True))
    outputs = read_trace(harness_runs["v2"], "requests").groupby("request_id")["output_token_ids"]
    assert (outputs.apply(lambda s: len({tuple(x) for x in s})) == 1).all(), "lossless"
    pkeys = [*keys, "position"]
    got_pos = read_trace(harness_runs["v2"], "positions").sort_values(pkeys).reset_index(drop=True)
    want_pos = read_trace(reference_runs, "positions").sort_values(pkeys).reset_index(drop=True)
    for name in ("draft_token", "accepted", "markov_flip"):
        assert got_pos[name].equals(want_pos[name]), name
    # vLLM emits the target's token up to the first rejection only; the reference engine's
    # verify forward has the target's choice at every position
    reached = got_pos.merge(got[[*keys, "accepted_len"]], on=keys, how="left")
    seen = got_pos["target_token"].notna()
    assert seen.equals(reached["position"] <= reached["accepted_len"])
    assert got_pos.loc[seen, "target_token"].tolist() == want_pos.loc[seen, "target_token"].tolist()
    for name in ("draft_logprob", "base_logprob", "markov_bias", "markov_bias_norm", "confidence"):
        both = got_pos[name].notna() | want_pos[name].notna()
        diff = (got_pos.loc[both, name] - want_pos.loc[both, name]).abs()
        assert diff.max() < 2e-4, (name, diff.max())
    dspark = got_pos[got_pos["method"] == "dspark"]
    eagle = got_pos[got_pos["method"] == "eagle3"]
    assert dspark["confidence"].notna().all() and eagle["draft_logprob"].notna().all()


def test_every_v2_step_row_carries_draft_verify_and_other(harness_runs: Any) -> None:
    """Model Runner V2's step clock: every row has its share of the three parts (the
    baseline: verify and other, no draft pass), and per engine step they add up to the
    step's time, inside the driver's own wall time around the step."""
    steps = read_trace(harness_runs["v2"], "steps")
    drafted = steps[steps["method"] != "none"]
    baseline = steps[steps["method"] == "none"]
    for name in ("draft_time_s", "verify_time_s", "other_time_s"):
        assert (drafted[name] > 0).all(), name
    assert baseline["draft_time_s"].isna().all()
    assert (baseline["verify_time_s"] > 0).all() and (baseline["other_time_s"] >= 0).all()
    for run in harness_runs["served"]:
        rows = steps[steps["run_id"] == run.spec.name].set_index(["request_id", "step"])
        for step in run.timeline:
            if not step.verified:
                continue
            keys = [(req_id.rsplit("-", 1)[0], n) for req_id, n in step.verified]
            got = rows.loc[keys]
            assert (got["batch_size"] == step.batch_size).all()
            parts = got[["draft_time_s", "verify_time_s", "other_time_s"]].fillna(0.0).sum(axis=1)
            recorded = got["batch_size"] * parts
            assert recorded.nunique() == 1 or np.ptp(recorded.to_numpy()) < 1e-9
            assert 0 < recorded.iloc[0] <= step.wall_s
    for meta in map(read_run_json, store_runs(harness_runs["taps"])):
        costs = meta["step_costs"]
        assert costs["untimed_engine_steps"] == 0
        assert costs["verify_timed_steps"] == costs["engine_steps"] > 0
        assert costs["attributed_s"] + costs["unattributed_s"] == pytest.approx(
            costs["step_time_s"]
        )
        assert meta["engine"]["model_runner"] == "v2"
        assert meta["engine"]["patch_table_line"] is not None
        assert {
            "custom_method",
            "num_speculative_tokens_per_batch_size",
            "draft_decode_context_parallel_size",
            "speculator_options",
        } <= set(meta["speculative"])
        assert meta["hardware"]["prefill_context_parallel_size"] == 1
        if meta["method"] == "dspark":
            assert set(meta["recorded_fields"].values()) == {"recorded"}
        if meta["method"] == "eagle3":
            assert meta["recorded_fields"]["draft_logprob"] == "recorded"
            assert "in the draft graph" in meta["draft_logprob_source"]


def test_the_report_findings_over_harness_runs_give_speedup_and_its_attribution(
    harness_runs: Any, tmp_path: Path
) -> None:
    """V2 runs alone (no reference engine, no V1): speedup(n) against the V2 baseline, and
    the window attribution into tokens, draft, verify and other."""
    from dsparklab.report.findings import compute_findings
    from dsparklab.store import Catalog

    findings = compute_findings(Catalog.of(harness_runs["v2"]), tmp_path, n_boot=50)
    rows = {row["method"]: row for row in findings.window_table}
    assert set(rows) == {"dspark", "eagle3"}
    interval = re.compile(r"^\d+\.\d+x \(\d+\.\d+–\d+\.\d+\)$")
    for row in rows.values():
        assert interval.match(row["speedup(3)"]) and interval.match(row["speedup(7)"]), row
    attribution = {row["method"]: row for row in findings.attribution}
    assert set(attribution) == {"dspark", "eagle3"}
    for row in attribution.values():
        assert {"tokens", "draft", "verify", "other"} <= set(row), row
    assert {row["method"] for row in findings.best_n} == {"dspark", "eagle3"}
    assert not [note for note in findings.notes if "speedup not measured" in note]


def test_a_schedule_that_drafts_nothing_at_a_batch_size_keeps_every_v2_step(
    harness_runs: Any, tmp_path: Path
) -> None:
    """Dynamic speculative decoding on Model Runner V2: the runner looks n up per batch
    size as vLLM's scheduler does (its own ``build_dynamic_sd_schedule_lookup``). Where two
    requests share a step, n = 0: the drafter still runs, proposes nothing, and the next
    step (one token scheduled) is recorded as a target-only step of the run, with its
    costs, so every output token has its step; the outputs stay the target's."""
    from dsparklab.engines.plan import RunSpec
    from dsparklab.engines.vllm import harness

    schedule = [[1, 1, 3], [2, 2, 0]]
    options = replace(_harness_options(tmp_path / "v2"), methods=("eagle3",), ns=(3,))
    harness.collect(options, max_num_seqs=2, keep_taps=tmp_path / "taps", schedule=schedule)
    spec = RunSpec("humaneval", "eagle3", 3, engine=harness.HARNESS_ENGINE)
    run_dir = Path(spec.location(tmp_path / "v2").path)
    (report,) = validate_trace(run_dir)  # 1 + sum(emitted) = output length, per request
    assert report.ok and report.complete, [str(v) for v in report.violations]
    assert (
        read_run_json(run_dir)["speculative"]["num_speculative_tokens_per_batch_size"] == schedule
    )
    steps = read_trace(run_dir, "steps")
    for name in ("verify_time_s", "other_time_s"):
        assert steps[name].notna().all(), name
    steps = steps.sort_values(["request_id", "step"])
    plain = steps["num_drafted"] == 0
    assert plain.any() and (~plain).any()
    assert (steps.loc[plain, "accepted_len"] == 0).all()
    assert (steps.loc[plain, "emitted"] == 1).all()
    # n is looked up by the batch of the step that proposed: the request's previous step
    # (unknown for its first, which follows the prefill)
    proposed_at = steps.groupby("request_id")["batch_size"].shift(1)
    assert (proposed_at[plain].dropna() == 2).all() and (proposed_at[~plain].dropna() == 1).all()
    assert proposed_at[plain].notna().any() and proposed_at[~plain].notna().any()
    outputs = read_trace(run_dir, "requests").set_index("prompt_id")["output_token_ids"]
    plain_outputs = read_trace(harness_runs["v2"], "requests")
    plain_outputs = plain_outputs[plain_outputs["method"] == "none"].set_index("prompt_id")
    for prompt_id, tokens in outputs.items():
        assert list(tokens) == list(plain_outputs.loc[prompt_id, "output_token_ids"]), prompt_id
