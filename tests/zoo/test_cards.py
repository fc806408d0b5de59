"""Decode-time acceptance on the cards: read from the runs of exactly this checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparklab.errors import TraceSchemaError
from dsparklab.provenance import checkpoint_hash
from dsparklab.zoo.card import CARD_MD, decode_time_acceptance, read_card
from dsparklab.zoo.smol.card import write_smol_cards
from dsparklab.zoo.smol.config import DSPARK_NAME, SmolConfig
from dsparklab.zoo.tiers import add_decode_time
from tests.conftest import make_run_json, write_run

DATA = {
    "distill_dir": "distill",
    "chunks": 1,
    "prompts": 4,
    "prompts_by_source": {"sharegpt": 2, "builder-math": 2},
    "pool": {"dropped": {"duplicate": 0, "evaluation_overlap": 0}},
    "answer_tokens": 96,
    "prompt_tokens": 40,
    "answers_ending_in_eos": 3,
    "max_new_tokens": 24,
    "answer_seconds": 1.0,
    "hidden_state_seconds": 1.0,
    "draft_vocab_size": 512,
    "draft_vocab_coverage": 0.99,
}


def _checkpoint(zoo: Path) -> Path:
    path = zoo / DSPARK_NAME
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"weights")
    write_smol_cards(SmolConfig(), zoo, DATA, {}, {"sets": {}}, command="pytest")
    return path


def _run(root: Path, name: str, drafter_hash: str, n: int, accepted: list[int]) -> None:
    meta = make_run_json(
        run_id=name,
        num_speculative_tokens=n,
        drafter={"name": "smol-dspark", "path": "-", "content_hash": drafter_hash},
    )
    run = write_run(root / name, accepted, meta=meta)
    # What the reference engine writes at the end of a run (DraftStats.to_json).
    meta = json.loads((run / "run.json").read_text())
    meta["stats"] = {
        "num_steps": len(accepted),
        "num_drafted": n * len(accepted),
        "num_accepted": sum(accepted),
        "num_emitted": sum(accepted) + len(accepted),
        "accepted_per_pos": [sum(a > i for a in accepted) for i in range(n)],
        "mean_acceptance_length": 1 + sum(accepted) / len(accepted),
    }
    (run / "run.json").write_text(json.dumps(meta))


def test_decode_time_acceptance_matches_only_this_checkpoint(tmp_path: Path):
    ckpt = _checkpoint(tmp_path / "zoo")
    own = checkpoint_hash(ckpt)
    _run(tmp_path / "runs", "mine", own, 3, [3, 1, 0, 2])
    _run(tmp_path / "runs", "stale", "sha256:older", 3, [0, 0, 0, 0])
    table = decode_time_acceptance(ckpt, tmp_path / "runs")
    row = table["sets"]["humaneval"]["3"]
    assert row["accept_len"] == 1 + 6 / 4
    assert row["steps"] == 4
    # a_1 = 3/4 reached-and-accepted; a_2 = 2/3; a_3 = 1/2.
    assert row["conditional"] == [0.75, round(2 / 3, 4), 0.5]

    assert add_decode_time(ckpt, tmp_path / "runs")
    assert checkpoint_hash(ckpt) == own, "cards are not part of the checkpoint's identity"
    assert read_card(ckpt)["evaluation"]["decode_time"] == table
    assert "| 3 | 2.500 | 4 | 0.750 | 0.667 | 0.500 |" in (ckpt / CARD_MD).read_text()
    # Rewriting the card (a new evaluation) keeps the decode-time section.
    write_smol_cards(SmolConfig(), tmp_path / "zoo", DATA, {}, {"sets": {}}, command="again")
    assert read_card(ckpt)["evaluation"]["decode_time"] == table
    _run(tmp_path / "other-runs", "stale", "sha256:older", 3, [0, 0])
    assert not add_decode_time(ckpt, tmp_path / "other-runs")
    with pytest.raises(TraceSchemaError, match="no run.json"):
        add_decode_time(ckpt, tmp_path / "zoo")
