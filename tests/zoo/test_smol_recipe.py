"""The smol recipe at smoke size: data, both drafters, evaluation, cards, resumption and
bit-for-bit reproduction, on the smol target prepared from its wheel (as test_smol_tier.py;
a module of its own, so the two run side by side)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402

from dsparklab.provenance import hash_path  # noqa: E402
from dsparklab.zoo import load_dspark_drafter  # noqa: E402
from dsparklab.zoo.smol import prepare  # noqa: E402
from dsparklab.zoo.smol.config import DSPARK_NAME, EAGLE3_NAME  # noqa: E402

pytestmark = pytest.mark.integration


def _smoke_zoo(root, smol_target):
    zoo = root / "zoo"
    zoo.mkdir(parents=True)
    (zoo / prepare.TARGET_NAME).symlink_to(smol_target, target_is_directory=True)
    return zoo


def _distill_in_its_own_process(target, out):
    """The smoke distillation in a process of its own, as the recipe runs it (``dsparklab zoo
    distill``, then ``dsparklab zoo train``): a vLLM engine changes process-wide state (its
    CPU worker's settings), and on a CPU with AMX a stage trained afterwards in the same
    process comes out with other bits than in a fresh process (seen 2026-12-06)."""
    code = (
        "import sys; from pathlib import Path; "
        "from dsparklab.zoo.distill import generate_chunks; "
        "from dsparklab.zoo.smol.config import SmolConfig; "
        "generate_chunks(Path(sys.argv[1]), SmolConfig.smoke().distill, Path(sys.argv[2]))"
    )
    subprocess.run([sys.executable, "-c", code, str(target), str(out)], check=True)


def test_recipe_smoke(smol_target, tmp_path):
    """The whole recipe at smoke size: data, both drafters in parallel, eval, cards; a
    rerun skips every finished stage; a fresh run reproduces a drafter bit for bit."""
    from dsparklab.zoo.calibrate import read_temperatures
    from dsparklab.zoo.smol.config import SmolConfig
    from dsparklab.zoo.smol.train import train_smol

    zoo = _smoke_zoo(tmp_path / "a", smol_target)
    cache = tmp_path / "a" / "cache"
    cfg = SmolConfig.smoke()
    distill = tmp_path / "distill"
    _distill_in_its_own_process(zoo / prepare.TARGET_NAME, distill)
    result = train_smol(cfg, zoo, cache=cache, command="pytest smoke", distill_dir=distill)
    assert result["data"]["prompts"] == 8
    assert result["data"]["chunks"] == 2
    assert set(result["stages"]) == {"dspark", "eagle3", "calibrate"}
    for name in (DSPARK_NAME, EAGLE3_NAME):
        card = json.loads((zoo / name / "card.json").read_text())
        assert card["command"] == "pytest smoke"
        assert set(card["evaluation"]["sets"]) == {"gsm8k", "humaneval"}
        # the learning curve: the snapshot after 40 answer tokens, then the final drafter
        curve = card["evaluation"]["learning_curve"]
        assert [r["answer_tokens"] for r in curve] == [40, result["data"]["answer_tokens"]]
        assert (zoo / name / "CARD.md").read_text().startswith(f"# {name}")
    assert len(read_temperatures(zoo / DSPARK_NAME)) == cfg.dspark.block_size
    dspark = load_dspark_drafter(zoo / DSPARK_NAME)
    assert dspark.d2t is not None
    assert dspark.d2t.shape[0] == 512
    weights = {p.parent.name: hash_path(p) for p in zoo.glob("smol-*/model.safetensors")}
    mtimes = {p: p.stat().st_mtime_ns for p in zoo.glob("smol-*/model.safetensors")}
    again = train_smol(cfg, zoo, cache=cache, evaluate=False, distill_dir=distill)
    assert again["stages"] == result["stages"]
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes

    # a fresh run of the DSpark stage alone, in this process, gives the drafter the
    # parallel run's own process trained, bit for bit
    fresh = _smoke_zoo(tmp_path / "b", smol_target)
    train_smol(
        cfg,
        fresh,
        stages=("data", "dspark"),
        cache=tmp_path / "b" / "cache",
        evaluate=False,
        distill_dir=distill,
    )
    assert hash_path(fresh / DSPARK_NAME / "model.safetensors") == weights[DSPARK_NAME]
    assert not (fresh / EAGLE3_NAME).exists()
    shutil.rmtree(tmp_path / "a" / "cache")
