"""The smol tier's recipe: distilled answers -> hidden states -> DSpark and Eagle3 -> cards.

Stages (``dsparklab zoo train --tier smol [--stage ...]``), each resumable:

1. ``data``: prepare the target (:mod:`dsparklab.zoo.smol.prepare`); the answers are the
   committed chunks of ``dsparklab zoo distill`` (``--distill``, default
   ``data/distill/smol``); pick the draft vocabulary from them; store the target's hidden
   states over prompt + answer per chunk (bf16, memory-mapped) in the cache.
2. ``dspark`` and ``eagle3``: the same data and the same wall-time budget for both
   (``budget.minutes``), one CPU thread each, in two parallel processes. Each saves a
   resumable state every few minutes (an interrupted run goes on where it stopped) and a
   snapshot after each learning-curve milestone (answer tokens seen).
3. ``calibrate``: sequential temperature scaling of DSpark's confidence head on training
   answers (:mod:`dsparklab.zoo.calibrate`).
4. Evaluation on held-out benchmark prompts (offline acceptance), the learning curve
   (each snapshot), and the cards.

The cache (``DSPARKLAB_CACHE_DIR``/smol) holds hidden states, states, snapshots and
reports; nothing in it is committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsparklab.wheels import CACHE_DIR
from dsparklab.zoo.calibrate import fit_sequential_temperatures, write_temperatures
from dsparklab.zoo.distill import read_chunks, read_manifest
from dsparklab.zoo.evaluate import dspark_block_correct
from dsparklab.zoo.load import load_dspark_drafter, load_eagle3_drafter, load_target
from dsparklab.zoo.smol.config import DSPARK_NAME, EAGLE3_NAME, MASK_TOKEN, SmolConfig
from dsparklab.zoo.smol.data import (
    answer_chunks,
    build_hidden_states,
    chunk_sequences,
    draft_vocabulary,
    load_draft_data,
)
from dsparklab.zoo.smol.prepare import TARGET_NAME, prepare_smol_target
from dsparklab.zoo.training.checkpoint import VocabMapping
from dsparklab.zoo.training.drafters import DrafterRun, train_dspark, train_eagle3
from dsparklab.zoo.training.loop import LoopPlan
from dsparklab.zoo.training.report import stage_json

logger = logging.getLogger(__name__)

STAGES = ("data", "dspark", "eagle3", "calibrate")
# drafter stage -> the checkpoint it writes under the zoo
DRAFTER_NAMES = {"dspark": DSPARK_NAME, "eagle3": EAGLE3_NAME}
DRAFTER_STAGES = tuple(DRAFTER_NAMES)
DISTILL_DIR = Path("data/distill/smol")


def cache_dir(cache: Path = CACHE_DIR) -> Path:
    return cache / "smol"


def _key(*parts: Any) -> str:
    dump = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(dump.encode()).hexdigest()[:12]


def _data_key(cfg: SmolConfig, distill_dir: Path) -> str:
    """The answers (their manifest's identity and chunk hashes), vocabulary size, layers."""
    manifest = read_manifest(distill_dir)
    chunks = {k: v["hash"] for k, v in manifest.get("chunks", {}).items()}
    return _key(
        manifest.get("identity"), chunks, cfg.budget.draft_vocab_size, cfg.dspark.target_layer_ids
    )


def _stage_key(cfg: SmolConfig, data_key: str, stage: str) -> str:
    return _key(data_key, cfg.budget.model_dump(), getattr(cfg, stage).model_dump())


def _hidden_dir(cfg: SmolConfig, cache: Path) -> Path:
    layers = "-".join(str(i) for i in cfg.dspark.target_layer_ids)
    return cache / f"hidden-L{layers}"


def build_data(cfg: SmolConfig, zoo_dir: Path, cache: Path, distill_dir: Path) -> dict[str, Any]:
    """The ``data`` stage: draft vocabulary and hidden states; returns the data summary."""
    if cfg.eagle3.target_layer_ids != cfg.dspark.target_layer_ids:
        raise ValueError("the smol drafters share one hidden-state cache: use the same aux layers")
    key = _data_key(cfg, distill_dir)
    info_path = cache / f"data-{key}.json"
    if info_path.is_file():
        return json.loads(info_path.read_text())
    torch.set_num_threads(cfg.threads)
    target_dir = prepare_smol_target(zoo_dir)
    model, tokenizer = load_target(target_dir)
    answers = read_chunks(distill_dir)
    d2t, t2d, coverage = draft_vocabulary(
        answers["response_ids"], cfg.budget.draft_vocab_size, model.config.vocab_size
    )
    torch.save({"d2t": d2t, "t2d": t2d}, cache / f"vocab-{key}.pt")
    hidden_seconds = build_hidden_states(
        model, distill_dir, _hidden_dir(cfg, cache), cfg.dspark.target_layer_ids
    )
    manifest = read_manifest(distill_dir)
    lengths = answers["response_ids"].map(len)
    info = {
        "distill_dir": str(distill_dir),
        "chunks": len(answer_chunks(distill_dir)),
        "prompts": len(answers),
        "prompts_by_source": {k: int(v) for k, v in answers["source"].value_counts().items()},
        "pool": manifest["identity"]["pool"],
        "answer_tokens": int(lengths.sum()),
        "prompt_tokens": int(answers["prompt_ids"].map(len).sum()),
        "answers_ending_in_eos": int((answers["finish_reason"] == "stop").sum()),
        "max_new_tokens": cfg.distill.max_new_tokens,
        "answer_seconds": round(sum(c["seconds"] for c in manifest["chunks"].values()), 1),
        "hidden_state_seconds": round(hidden_seconds, 1),
        "draft_vocab_size": cfg.budget.draft_vocab_size,
        "draft_vocab_coverage": round(coverage, 4),
        "data_key": key,
        "eos_token_id": tokenizer.eos_token_id,
    }
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def _report_path(cache: Path, stage: str) -> Path:
    return cache / f"{stage}-report.json"


def stage_done(cfg: SmolConfig, zoo_dir: Path, cache: Path, stage: str, data_key: str) -> bool:
    """True when ``stage``'s checkpoint exists and its report matches the config and data."""
    path = _report_path(cache, stage)
    name = DSPARK_NAME if stage in ("dspark", "calibrate") else EAGLE3_NAME
    if not path.is_file() or not (zoo_dir / name / "config.json").is_file():
        return False
    return json.loads(path.read_text()).get("config_key") == _stage_key(
        cfg, data_key, "dspark" if stage == "calibrate" else stage
    )


def train_stage(
    cfg: SmolConfig, stage: str, zoo_dir: Path, cache: Path, distill_dir: Path
) -> dict[str, Any]:
    """Train one drafter on the cached data (resuming its state); save it and its report."""
    torch.set_num_threads(cfg.train_threads)
    key = _data_key(cfg, distill_dir)
    data = load_draft_data(distill_dir, _hidden_dir(cfg, cache), cfg.dspark.target_layer_ids)
    blob = torch.load(cache / f"vocab-{key}.pt")
    vocab = VocabMapping(blob["d2t"], blob["t2d"])
    target_dir = zoo_dir / TARGET_NAME
    stage_key = _stage_key(cfg, key, stage)
    minutes = cfg.budget.minutes
    section = getattr(cfg, stage)
    plan = LoopPlan(
        steps=section.steps,
        time_budget_s=None if minutes is None else minutes * 60.0,
        state_path=cache / f"{stage}-state-{stage_key}.pt",
        checkpoint_s=cfg.budget.checkpoint_minutes * 60.0,
        milestones=tuple(cfg.budget.curve_tokens),
    )
    if stage not in DRAFTER_NAMES:
        raise ValueError(f"unknown drafter stage {stage!r}; valid: {', '.join(DRAFTER_STAGES)}")
    run = DrafterRun(
        data,
        target_dir,
        zoo_dir / DRAFTER_NAMES[stage],
        autocast_bf16=cfg.autocast_bf16,
        vocab=vocab,
        plan=plan,
        snapshot_dir=cache / f"curve-{stage_key}",
    )
    if stage == "dspark":
        from transformers import AutoTokenizer

        mask_id = AutoTokenizer.from_pretrained(target_dir).convert_tokens_to_ids(MASK_TOKEN)
        assert isinstance(mask_id, int), f"{MASK_TOKEN} is one token"
        _, report = train_dspark(cfg.dspark, run, mask_id)
    else:
        _, report = train_eagle3(cfg.eagle3, run)
    record = {**stage_json(report), "config_key": stage_key, "threads": cfg.train_threads}
    _report_path(cache, stage).write_text(json.dumps(record, indent=2) + "\n")
    return record


def calibrate_dspark(cfg: SmolConfig, zoo_dir: Path, cache: Path, distill_dir: Path) -> dict:
    """Fit the confidence temperatures on training answers; store them beside the drafter."""
    cc = cfg.calibration
    torch.set_num_threads(cfg.threads)
    target, _ = load_target(zoo_dir / TARGET_NAME)
    drafter = load_dspark_drafter(zoo_dir / DSPARK_NAME)
    sequences = [
        pair
        for chunk in answer_chunks(distill_dir)
        for pair in zip(*chunk_sequences(chunk), strict=True)
        if len(pair[0]) - pair[1] > drafter.block_size + 1
    ]
    rng = np.random.default_rng(cc.seed)
    picked = rng.choice(len(sequences), size=min(cc.sequences, len(sequences)), replace=False)
    torch.manual_seed(cc.seed)
    corrects, confs = [], []
    for index in picked:
        ids, prompt_len = sequences[int(index)]
        correct, conf = dspark_block_correct(
            drafter, target, ids, prompt_len, max_anchors=cc.anchors
        )
        corrects.append(correct)
        confs.append(conf)
    correct, conf = np.concatenate(corrects), np.concatenate(confs)
    temperatures = fit_sequential_temperatures(correct, conf)
    fitted_on: dict[str, object] = {
        "training_sequences": len(picked),
        "blocks": int(len(correct)),
        "seed": cc.seed,
    }
    write_temperatures(zoo_dir / DSPARK_NAME, temperatures, fitted_on=fitted_on)
    key = _stage_key(cfg, _data_key(cfg, distill_dir), "dspark")
    record = {"temperatures": temperatures, **fitted_on, "config_key": key}
    _report_path(cache, "calibrate").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _run_parallel(
    cfg: SmolConfig, stages: Sequence[str], zoo_dir: Path, cache: Path, distill_dir: Path
) -> None:
    """Each drafter stage in its own process (one thread each); fail if any fails."""
    config_path = cache / f"config-{_key(cfg.model_dump())}.json"
    config_path.write_text(cfg.model_dump_json(indent=2) + "\n")
    procs = {
        stage: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dsparklab.zoo.smol.train",
                "--stage",
                stage,
                "--zoo-dir",
                str(zoo_dir),
                "--cache",
                str(cache),
                "--distill",
                str(distill_dir),
                "--config",
                str(config_path),
            ]
        )
        for stage in stages
    }
    failed = [stage for stage, proc in procs.items() if proc.wait() != 0]
    if failed:
        raise RuntimeError(f"smol drafter stage(s) failed: {', '.join(failed)}")


def train_smol(
    cfg: SmolConfig,
    zoo_dir: Path,
    *,
    stages: Sequence[str] = STAGES,
    evaluate: bool = True,
    command: str | None = None,
    cache: Path | None = None,
    distill_dir: Path = DISTILL_DIR,
) -> dict[str, Any]:
    """Run the smol recipe; returns the data info, stage reports and evaluation."""
    cache = cache_dir() if cache is None else cache
    cache.mkdir(parents=True, exist_ok=True)
    info = build_data(cfg, zoo_dir, cache, distill_dir)
    key = info["data_key"]
    todo = [
        s for s in DRAFTER_STAGES if s in stages and not stage_done(cfg, zoo_dir, cache, s, key)
    ]
    if len(todo) > 1:
        _run_parallel(cfg, todo, zoo_dir, cache, distill_dir)
    for stage in todo if len(todo) == 1 else []:
        train_stage(cfg, stage, zoo_dir, cache, distill_dir)
    if "calibrate" in stages and (
        "dspark" in todo or not stage_done(cfg, zoo_dir, cache, "calibrate", key)
    ):
        calibrate_dspark(cfg, zoo_dir, cache, distill_dir)
    reports = {
        s: json.loads(_report_path(cache, s).read_text())
        for s in (*DRAFTER_STAGES, "calibrate")
        if _report_path(cache, s).is_file()
    }
    evaluation: dict[str, Any] = {}
    if evaluate:
        from dsparklab.zoo.smol.card import write_smol_cards
        from dsparklab.zoo.smol.evaluate import evaluate_smol

        torch.set_num_threads(cfg.threads)
        target, tokenizer = load_target(zoo_dir / TARGET_NAME)
        evaluation = evaluate_smol(
            cfg,
            target,
            tokenizer,
            load_dspark_drafter(zoo_dir / DSPARK_NAME),
            load_eagle3_drafter(zoo_dir / EAGLE3_NAME),
            cache=cache,
            zoo_dir=zoo_dir,
            snapshots={
                # the learning curve's last point: the final drafter, at the answer tokens
                # it saw (a drafter the budget stopped inside its first pass saw fewer
                # than the data holds)
                s: {
                    **reports.get(s, {}).get("snapshots", {}),
                    str(reports.get(s, {}).get("answer_tokens_seen", info["answer_tokens"])): (
                        str(zoo_dir / name)
                    ),
                }
                for s, name in (("dspark", DSPARK_NAME), ("eagle3", EAGLE3_NAME))
            },
        )
        write_smol_cards(cfg, zoo_dir, info, reports, evaluation, command=command)
    return {"data": info, "stages": reports, "evaluation": evaluation}


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of one drafter stage's process (see :func:`_run_parallel`)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stage", choices=DRAFTER_STAGES, required=True)
    parser.add_argument("--zoo-dir", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--distill", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True, help="SmolConfig as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = SmolConfig.model_validate_json(args.config.read_text())
    train_stage(cfg, args.stage, args.zoo_dir, args.cache, args.distill)


if __name__ == "__main__":
    main()
