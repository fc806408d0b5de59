"""The tiny recipe end to end at smoke size: every stage trains a few steps, saves in the
formats vLLM reads, reloads through dsparklab.zoo, and gets a card."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from dsparklab.zoo import load_dspark_drafter, load_eagle3_drafter, load_target
from dsparklab.zoo.card import read_card
from dsparklab.zoo.evaluate import acceptance_summary, distinct_ratio
from dsparklab.zoo.hidden import capture_hidden_states
from dsparklab.zoo.tiny.config import DSPARK_NAME, EAGLE3_NAME, TARGET_NAME, TinyConfig
from dsparklab.zoo.tiny.train import train_tier


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    result = train_tier(TinyConfig.smoke(), out, command="pytest smoke")
    return out, result


def _keys(path):
    with safe_open(path / "model.safetensors", "pt") as fh:
        return set(fh.keys())


def _sha(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_every_stage_trains_and_saves(smoke):
    out, result = smoke
    assert set(result.stages) == {"target", "dspark", "eagle3"}
    for report in result.stages.values():
        assert report.steps == 3
        assert np.isfinite(report.loss_last)
        assert report.seconds > 0
    for name in (TARGET_NAME, DSPARK_NAME, EAGLE3_NAME):
        files = {p.name for p in (out / name).iterdir()}
        assert {"config.json", "model.safetensors", "CARD.md", "card.json"} <= files
        assert "config.py" not in files  # no copied speculators source
    assert {"tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (out / TARGET_NAME).iterdir()
    }


def test_target_config_and_tokenizer(smoke):
    out, _ = smoke
    config = json.loads((out / TARGET_NAME / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] in (32, 64, 80, 96, 112, 128)
    model, tokenizer = load_target(out / TARGET_NAME)
    assert next(model.parameters()).dtype == torch.float32
    assert not model.training
    assert tokenizer.eos_token_id == 0
    assert tokenizer.mask_token_id == 1
    text = "def add(a, b):\n    return a + b\n"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_dspark_config_has_the_fields_vllm_reads(smoke):
    out, _ = smoke
    config = json.loads((out / DSPARK_NAME / "config.json").read_text())
    cfg = TinyConfig.smoke().dspark
    assert config["speculators_model_type"] == "dspark"
    assert config["architectures"] == ["Qwen3DSparkModel"]
    assert config["block_size"] == cfg.block_size
    assert config["markov_rank"] == cfg.markov_rank
    assert config["markov_head_type"] == "vanilla"
    assert config["enable_confidence_head"] is True
    assert config["confidence_head_with_markov"] is True
    assert config["aux_hidden_state_layer_ids"] == list(cfg.target_layer_ids)
    assert config["sample_from_anchor"] is True  # explicit: vLLM defaults it to False
    assert config["mask_token_id"] == 1
    assert config["draft_vocab_size"] == config["transformer_layer_config"]["vocab_size"]
    assert config["speculators_config"]["verifier"]["name_or_path"] == f"../{TARGET_NAME}"
    keys = _keys(out / DSPARK_NAME)
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"} <= keys
    assert {"confidence_head.proj.weight", "confidence_head.proj.bias", "fc.weight"} <= keys
    assert "embed_tokens.weight" not in keys
    assert "verifier_lm_head.weight" not in keys


def test_eagle3_config_and_weights(smoke):
    out, _ = smoke
    config = json.loads((out / EAGLE3_NAME / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["transformer_layer_config"]["model_type"] == "llama"
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["speculators_config"]["verifier"]["name_or_path"] == f"../{TARGET_NAME}"
    keys = _keys(out / EAGLE3_NAME)
    assert "fc.weight" in keys
    assert "layers.0.self_attn.q_proj.weight" in keys
    assert "embed_tokens.weight" not in keys
    assert "lm_head.weight" not in keys


def test_drafters_load_from_any_directory_wired_to_the_target(smoke, tmp_path, monkeypatch):
    out, _ = smoke
    monkeypatch.chdir(tmp_path)  # the relative target path must not depend on the cwd
    target, _ = load_target(out / TARGET_NAME)
    embed = target.model.embed_tokens.weight
    for drafter in (load_dspark_drafter(out / DSPARK_NAME), load_eagle3_drafter(out / EAGLE3_NAME)):
        assert not drafter.training
        assert next(drafter.parameters()).dtype == torch.float32
        assert torch.equal(drafter.embed_tokens.weight, embed)
        assert torch.equal(drafter.lm_head.weight, embed)  # tied target: lm_head == embedding
        assert torch.equal(drafter.verifier_norm.weight, target.model.norm.weight)
    dspark = load_dspark_drafter(out / DSPARK_NAME)
    assert dspark.markov_head is not None
    assert dspark.confidence_head is not None


def test_hidden_state_convention_matches_transformers(smoke):
    out, _ = smoke
    target, _ = load_target(out / TARGET_NAME)
    ids = torch.tensor([[5, 17, 33, 2, 99, 7, 64, 3]])
    aux, last, logits = capture_hidden_states(target, ids, [0, 1, 2, 3])
    with torch.no_grad():
        ref = target(input_ids=ids, output_hidden_states=True)
    hidden = target.config.hidden_size
    for k, layer in enumerate([0, 1, 2, 3]):
        torch.testing.assert_close(
            aux[..., k * hidden : (k + 1) * hidden], ref.hidden_states[layer]
        )
    # "last" is pre-norm: the final norm and LM head turn it into the logits.
    torch.testing.assert_close(target.lm_head(target.model.norm(last)), ref.logits)
    torch.testing.assert_close(logits, ref.logits)
    with pytest.raises(ValueError, match="layer_ids must lie in"):
        capture_hidden_states(target, ids, [5])


def test_cards_record_command_time_and_evaluation(smoke):
    out, _ = smoke
    for name in (TARGET_NAME, DSPARK_NAME, EAGLE3_NAME):
        card = read_card(out / name)
        assert card["command"] == "pytest smoke"
        assert card["training"]["seconds"] > 0
        assert card["training"]["steps"] == 3
        assert card["files"]["model.safetensors"] > 0
        md = (out / name / "CARD.md").read_text()
        assert md.startswith(f"# {name}")
        assert "## Evaluation" in md
    degeneracy = read_card(out / TARGET_NAME)["evaluation"]["degeneracy"]
    assert set(degeneracy) == {"humaneval", "prose"}
    assert 0 < degeneracy["humaneval"]["distinct_ratio_mean"] <= 1
    for name in (DSPARK_NAME, EAGLE3_NAME):
        summary = read_card(out / name)["evaluation"]["offline_acceptance_humaneval"]
        assert len(summary["survival"]) == 7
        assert summary["num_starts"] > 0


def test_retraining_one_stage_keeps_the_others(smoke):
    out, _ = smoke
    before = {name: _sha(out / name) for name in (TARGET_NAME, DSPARK_NAME, EAGLE3_NAME)}
    target_card = read_card(out / TARGET_NAME)
    cfg = TinyConfig.smoke().model_copy(
        update={"dspark": TinyConfig.smoke().dspark.model_copy(update={"seed": 7})}
    )
    result = train_tier(cfg, out, stages=("dspark",), command="pytest dspark only")
    assert set(result.stages) == {"dspark"}
    assert _sha(out / TARGET_NAME) == before[TARGET_NAME]
    assert _sha(out / EAGLE3_NAME) == before[EAGLE3_NAME]
    assert _sha(out / DSPARK_NAME) != before[DSPARK_NAME]
    assert read_card(out / TARGET_NAME)["training"] == target_card["training"]
    assert read_card(out / DSPARK_NAME)["command"] == "pytest dspark only"


def test_acceptance_summary_identities():
    perfect = acceptance_summary(np.ones((5, 7), dtype=bool))
    assert perfect["accept_len"][7] == 8.0
    assert perfect["accept_len"][3] == 4.0
    never = acceptance_summary(np.zeros((5, 7), dtype=bool))
    assert never["accept_len"][7] == 1.0
    assert np.isnan(never["conditional"][1])
    # i.i.d. positions with acceptance a: AL(n) -> (1 - a^(n+1)) / (1 - a).
    rng = np.random.default_rng(0)
    a = 0.7
    summary = acceptance_summary(rng.random((200_000, 7)) < a)
    assert summary["accept_len"][7] == pytest.approx((1 - a**8) / (1 - a), rel=0.01)
    assert summary["conditional"][3] == pytest.approx(a, abs=0.01)
    # A later hit after a miss does not count.
    assert acceptance_summary(np.array([[False, True, True]]))["accept_len"][3] == 1.0
    assert distinct_ratio([1, 1, 2, 3]) == 0.75


def test_cli_lists_the_committed_zoo_and_rejects_bad_options(tmp_path):
    from typer.testing import CliRunner

    from dsparklab.cli.app import app

    runner = CliRunner()
    listing = runner.invoke(app, ["zoo", "list"])
    assert listing.exit_code == 0, listing.output
    for name in (TARGET_NAME, DSPARK_NAME, EAGLE3_NAME):
        assert name in listing.output
    assert "degeneracy" in listing.output
    assert "AL(7)" in listing.output
    bad_tier = runner.invoke(app, ["zoo", "train", "--tier", "huge", "--out", str(tmp_path)])
    assert bad_tier.exit_code == 2
    assert "unknown tier" in bad_tier.output
    bad_stage = runner.invoke(
        app, ["zoo", "train", "--tier", "smoke", "--out", str(tmp_path), "--stage", "x"]
    )
    assert bad_stage.exit_code == 2
    assert "unknown stage" in bad_stage.output
    assert not any(tmp_path.iterdir())  # nothing trained
