"""The tier run.json records for a run's models: one rule for every engine."""

from __future__ import annotations

import json
from pathlib import Path

from dsparklab.engines.checkpoints import (
    CUSTOM_TIER,
    ModelRef,
    model_tier,
    models_tier,
    resolve_model,
)


def _checkpoint(root: Path, name: str, card: dict | None = None) -> ModelRef:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text("{}")
    if card is not None:
        (path / "card.json").write_text(json.dumps(card))
    return ModelRef(name=name, path=path, content_hash="x")


def test_the_zoo_models_carry_their_cards_tier() -> None:
    assert model_tier(resolve_model("tiny-target")) == "tiny"
    assert model_tier(resolve_model("smol-target")) == "smol"  # no card: its zoo name
    assert models_tier(resolve_model("tiny-target"), resolve_model("tiny-dspark")) == "tiny"
    assert models_tier(resolve_model("tiny-target"), None) == "tiny"


def test_any_other_checkpoint_is_custom(tmp_path: Path) -> None:
    """A name with a dash is not a tier (``Qwen-7B`` is no tier ``Qwen``); models of two
    tiers are custom; a card's own tier wins over the name."""
    qwen = _checkpoint(tmp_path, "Qwen-7B")
    assert model_tier(qwen) == CUSTOM_TIER
    assert models_tier(qwen, None) == CUSTOM_TIER
    assert models_tier(resolve_model("tiny-target"), resolve_model("smol-dspark")) == CUSTOM_TIER
    carded = _checkpoint(tmp_path, "mine", {"tier": "smol"})
    assert model_tier(carded) == "smol"
