"""The reference engine's traces: valid, self-consistent, and free of side effects.

Read from the session's reference runs (tests/reference_runs.py), which the notebook and
browser tests read too."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from dsparklab.cli.app import app
from dsparklab.engines.reference import ContextUpdate, DSparkDrafter, ReferenceEngine
from dsparklab.store import find_runs, read_run_json, read_trace, validate_trace
from tests.integration.conftest import GEN_LEN, Zoo
from tests.reference_runs import DATASETS, LIMIT, MAX_NEW_TOKENS, METHODS, NS

pytestmark = pytest.mark.integration


def _files(store: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``store``: its size and modification time (ns)."""
    return {
        str(p.relative_to(store)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in store.rglob("*")
        if p.is_file()
    }


def test_collect_writes_valid_runs(runs_dir: Path) -> None:
    reports = validate_trace(runs_dir)
    names = sorted(read_run_json(r.path)["run_id"] for r in reports)
    assert names == sorted(
        f"reference/{dataset}/{method}" + (f"-n{n}" if method != "none" else "")
        for dataset in DATASETS
        for method in METHODS
        for n in (NS if method != "none" else NS[:1])
    )
    for report in reports:
        assert report.ok and report.complete, [str(v) for v in report.violations]
        assert report.rows["requests"] == LIMIT
        assert report.rows["steps"] > 0
        meta = read_run_json(report.path)
        assert meta["engine"]["name"] == "reference"
        assert meta["tier"] == "tiny"
        assert meta["config"]["num_speculative_tokens"] == meta["num_speculative_tokens"]
        assert meta["target"]["content_hash"].startswith("sha256:")
        assert (meta["drafter"] is None) == (meta["method"] == "none")


def test_accepted_len_equals_recount(runs_dir: Path) -> None:
    positions = read_trace(runs_dir, "positions")
    steps = read_trace(runs_dir, "steps")
    spec = steps[steps["method"] != "none"]
    assert len(positions) == int(spec["num_drafted"].sum())
    positions = positions.sort_values(["run_id", "request_id", "step", "position"])
    match = positions["draft_token"] == positions["target_token"]
    # accepted = every position up to here matched the target's choice
    positions["recount"] = match.groupby(
        [positions["run_id"], positions["request_id"], positions["step"]]
    ).cummin()
    assert (positions["recount"] == positions["accepted"]).all()
    recount = positions.groupby(["run_id", "request_id", "step"])["recount"].sum()
    merged = spec.set_index(["run_id", "request_id", "step"])["accepted_len"]
    pd.testing.assert_series_equal(
        recount.sort_index().astype("int64"),
        merged.sort_index().astype("int64"),
        check_names=False,
    )


def test_trace_fields_by_method(runs_dir: Path) -> None:
    positions = read_trace(runs_dir, "positions")
    dspark = positions[positions["method"] == "dspark"]
    eagle = positions[positions["method"] == "eagle3"]
    for column in ("draft_logprob", "base_logprob", "markov_bias", "markov_bias_norm"):
        assert dspark[column].notna().all(), column
    assert dspark["confidence"].between(0, 1).all()
    assert (dspark["draft_logprob"] <= 0).all()
    assert (dspark["base_logprob"] <= 0).all()
    assert (dspark["markov_bias_norm"] >= dspark["markov_bias"].abs() - 1e-4).all()
    assert eagle["draft_logprob"].notna().all()
    for column in ("base_logprob", "markov_bias", "markov_bias_norm", "markov_flip", "confidence"):
        assert eagle[column].isna().all(), column
    steps = read_trace(runs_dir, "steps")
    timed = steps[steps["method"] != "none"]
    assert (timed["draft_time_s"] > 0).all()
    assert (timed["verify_time_s"] > 0).all()
    assert steps[steps["method"] == "none"]["num_drafted"].eq(0).all()


def test_requests_hold_outputs(runs_dir: Path, zoo: Zoo) -> None:
    requests = read_trace(runs_dir, "requests")
    steps = read_trace(runs_dir, "steps")
    baseline = requests[requests["method"] == "none"].set_index("request_id")
    for _, row in requests.iterrows():
        output = list(row["output_token_ids"])
        assert 0 < len(output) <= MAX_NEW_TOKENS
        assert row["output_text"] == zoo.tokenizer.decode(output)
        assert row["wall_time_s"] > 0
        # the steps accepted at least the output (the last step may overshoot); what they
        # emitted is the output exactly, the prefill's token first
        mine = steps[
            (steps["run_id"] == row["run_id"]) & (steps["request_id"] == row["request_id"])
        ].sort_values("step")
        assert 1 + int((mine["accepted_len"] + 1).sum()) >= len(output)
        assert 1 + int(mine["emitted"].sum()) == len(output)
        assert ((mine["emitted"] <= mine["accepted_len"] + 1) & (mine["emitted"] >= 0)).all()
        overshoot = mine[mine["emitted"] < mine["accepted_len"] + 1]
        assert overshoot.empty or overshoot["step"].min() >= mine["step"].max() - 1, (
            "cut at the end"
        )
        if row["method"] != "none":
            assert output == list(baseline.loc[row["request_id"], "output_token_ids"])


def _collect_args(runs_dir: Path, **changed: str) -> list[str]:
    """`dsparklab collect` of the session's reference runs into ``runs_dir`` (the zoo's
    default checkpoints, as they were collected); ``changed`` replaces options
    (``max_new_tokens="16"``)."""
    options = {
        "engine": "reference",
        "method": ",".join(METHODS),
        "n": ",".join(map(str, NS)),
        "dataset": ",".join(DATASETS),
        "limit": str(LIMIT),
        "max_new_tokens": str(MAX_NEW_TOKENS),
        "out": str(runs_dir),
        **changed,
    }
    return ["collect"] + [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", v)]


def test_cli_resumes_and_prints_root(runs_dir: Path, zoo: Zoo) -> None:
    """The same collect again, its models named by path where the runs were collected with
    zoo names: every run is complete and of this identity (the same checkpoints), so
    nothing is redone and no file of the store is written (other tests read it meanwhile)."""
    before = _files(runs_dir)
    paths = {"target": zoo.target_path, "dspark": zoo.dspark_path, "eagle3": zoo.eagle3_path}
    args = _collect_args(runs_dir, **{role: str(path) for role, path in paths.items()})
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # the root, then one summary line per run (complete runs, skipped, are summed up too)
    lines = result.output.strip().splitlines()
    runs = sorted(read_run_json(p)["run_id"] for p in find_runs(runs_dir))
    assert lines[-len(runs) - 1] == str(runs_dir), result.output
    assert sorted(line.split(":")[0] for line in lines[-len(runs) :]) == runs
    assert _files(runs_dir) == before


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        ({"max_new_tokens": "16"}, f"max_new_tokens is {MAX_NEW_TOKENS}, this collect's is 16"),
        # another checkpoint as the target (its files hash otherwise)
        ({"target": "tiny-dspark"}, "target is 'tiny-target', this collect's is 'tiny-dspark'"),
    ],
)
def test_cli_refuses_a_complete_run_of_another_identity(
    runs_dir: Path, changed: dict[str, str], expected: str
) -> None:
    """Issue 33: a collect whose run_id is a complete run made with other settings neither
    skips it nor overwrites it: one line naming the run.json and the field, exit 2."""
    import subprocess
    import sys

    before = _files(runs_dir)
    cli = Path(sys.executable).with_name("dsparklab")
    args = _collect_args(runs_dir, method="eagle3", n="3", dataset="humaneval", **changed)
    result = subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"run.json: identity.{expected}" in line, line
    assert "--overwrite" in line and "reference/humaneval/eagle3-n3" in line, line
    assert _files(runs_dir) == before


def test_cli_rejects_unknown_engine_and_method(tmp_path: Path) -> None:
    for option, value in (("--engine", "tensorrt"), ("--method", "medusa")):
        result = CliRunner().invoke(app, ["collect", option, value, "--out", str(tmp_path)])
        assert result.exit_code != 0
        assert value in str(result.exception or result.output)


def test_cli_serve_options_need_the_serve_engine(tmp_path: Path) -> None:
    """--server-url / --tap-dir with another engine: one line naming them, exit code 2."""
    import subprocess
    import sys

    cli = Path(sys.executable).with_name("dsparklab")
    args = ["collect", "--engine", "reference", "--server-url", "http://127.0.0.1:9"]
    result = subprocess.run(
        [str(cli), *args, "--tap-dir", str(tmp_path), "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "--server-url, --tap-dir" in line and "vllm-serve" in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("method", "n"), [("dspark", 5), ("eagle3", 4), ("none", 0)])
def test_tracing_off_gives_the_same_tokens(
    zoo: Zoo, prompt_ids: list[list[int]], method: str, n: int
) -> None:
    on = zoo.engine(method, n, max_new_tokens=GEN_LEN, trace_enabled=True)
    off = zoo.engine(method, n, max_new_tokens=GEN_LEN, trace_enabled=False)
    for index, ids in enumerate(prompt_ids):
        traced = on.generate(ids, request_id=f"p{index}")
        plain = off.generate(ids, request_id=f"p{index}")
        assert traced.output_token_ids == plain.output_token_ids
        assert traced.stats == plain.stats
        assert traced.steps
        assert not plain.steps
        assert not plain.positions


@torch.inference_mode()
def test_markov_step_matches_independent_computation(zoo: Zoo, prompt_ids: list[list[int]]) -> None:
    """Recorded Markov fields == speculators' own training-time heads on the same inputs.

    For steps of a traced DSpark run, the step's inputs are rebuilt from scratch (the
    target re-run over the context without a cache, a fresh drafter), then the bias and
    confidence are recomputed with the checkpoint's training modules
    (``markov_head.block_bias`` over the drafted prefix, ``confidence_head``) in a plain
    loop, and compared with what the engine recorded.
    """
    n = 6
    engine = zoo.engine("dspark", n, max_new_tokens=GEN_LEN)
    ids = prompt_ids[0]
    result = engine.generate(ids, request_id="p0")
    sequence = ids + result.output_token_ids
    head, confidence_head = zoo.dspark.markov_head, zoo.dspark.confidence_head
    checked = 0
    for step in result.steps[:: max(1, len(result.steps) // 4)]:
        context = sequence[: step.context_len]
        out = zoo.target(input_ids=torch.tensor([context[:-1]]), output_hidden_states=True)
        layer_ids = zoo.dspark.config.aux_hidden_state_layer_ids
        aux = torch.cat([out.hidden_states[i][0] for i in layer_ids], dim=-1)
        drafter = DSparkDrafter(zoo.dspark)
        update = ContextUpdate(aux, context[1:], 0)
        drafter._extend_context(update.aux_hidden, 0)
        hidden = drafter.block_hidden(update.anchor, update.anchor_pos, n)  # [n, H]
        base = zoo.dspark.lm_head(hidden)  # [n, V]

        rows = [p for p in result.positions if p.step == step.step]
        drafted = [p.draft_token for p in rows]
        prev = torch.tensor([[context[-1], *drafted[:-1]]])  # [1, n]
        bias = head.block_bias(prev_token_ids=prev, hidden_states=hidden[None])[0]  # [n, V]
        prev_emb = head.prev_embeddings(prev)[0]
        conf = torch.sigmoid(confidence_head(torch.cat([hidden, prev_emb], dim=-1)))
        for i, row in enumerate(rows):
            logits = base[i] + bias[i]
            token = int(logits.argmax())
            top2 = logits.topk(2).values
            if float(top2[0] - top2[1]) < 1e-4:
                break  # a near-tie: the rest of the block may fairly differ
            assert row.draft_token == token
            assert row.markov_flip == (int(base[i].argmax()) != token)
            assert row.markov_bias == pytest.approx(float(bias[i, token]), abs=1e-3)
            assert row.markov_bias_norm == pytest.approx(float(bias[i].norm()), rel=1e-3)
            assert row.confidence == pytest.approx(float(conf[i]), abs=1e-3)
            base_lp = float(torch.log_softmax(base[i], -1)[token])
            draft_lp = float(torch.log_softmax(logits, -1)[token])
            assert row.base_logprob == pytest.approx(base_lp, abs=1e-3)
            assert row.draft_logprob == pytest.approx(draft_lp, abs=1e-3)
            checked += 1
    assert checked >= n, f"only {checked} positions checked"


def test_engine_refuses_mismatched_drafter(zoo: Zoo) -> None:
    from dsparklab.engines.reference import ReferenceConfig
    from dsparklab.errors import ConfigError

    with pytest.raises(ConfigError, match="DSpark drafter"):
        ReferenceEngine(
            zoo.target,
            zoo.eagle3,
            config=ReferenceConfig(method="dspark", num_speculative_tokens=3),
        )
    with pytest.raises(ConfigError, match="needs a drafter"):
        ReferenceEngine(
            zoo.target, config=ReferenceConfig(method="eagle3", num_speculative_tokens=3)
        )


def test_configurations_are_interleaved(runs_dir: Path) -> None:
    """Every run of a dataset opens before any of them finishes: prompts are decoded by
    all configurations in turn, so no run has the machine to itself."""
    from dsparklab.store import list_runs, read_run_json

    for _, group in list_runs(runs_dir).groupby("dataset"):
        metas = [read_run_json(p) for p in group["path"]]
        assert len(metas) > 1
        # to the second (run.json's resolution): the tiny runs here take about one
        assert max(m["created_at"] for m in metas) <= min(m["finished_at"] for m in metas)
