"""The smol tier's recipe: prepared SmolLM2 target -> greedy answers -> DSpark and Eagle3.

Stages (``dsparklab zoo train --tier smol [--stage ...]``):

1. ``data``: prepare the target (:mod:`dsparklab.zoo.smol.prepare`), answer the training
   prompts greedily (resumable JSONL), pick the draft vocabulary from the answers, and
   store the target's hidden states over prompt + answer (bf16) in the cache.
2. ``dspark`` and ``eagle3``: train each drafter on the cached data with the tiny tier's
   trainers (``speculators`` models, one CPU thread each). When both are requested they
   run as two parallel processes, one core each. A finished stage leaves its report in
   the cache; a rerun skips the stages whose report and checkpoint match the config.
3. Evaluation on held-out prompts (HumanEval and ``instruct``) and the cards.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from dsparklab.wheels import CACHE_DIR
from dsparklab.zoo.load import load_dspark_drafter, load_eagle3_drafter, load_target
from dsparklab.zoo.smol.config import DSPARK_NAME, EAGLE3_NAME, MASK_TOKEN, SmolConfig
from dsparklab.zoo.smol.prepare import TARGET_NAME, prepare_smol_target
from dsparklab.zoo.tiny.train import (
    DraftData,
    VocabMapping,
    stage_json,
    train_dspark,
    train_eagle3,
)

logger = logging.getLogger(__name__)

STAGES = ("data", "dspark", "eagle3")
DRAFTER_STAGES = ("dspark", "eagle3")


def cache_dir(cache: Path = CACHE_DIR) -> Path:
    return cache / "smol"


def _config_key(cfg: SmolConfig, *sections: str) -> str:
    dump = json.dumps({s: cfg.model_dump()[s] for s in sections}, sort_keys=True)
    return hashlib.sha256(dump.encode()).hexdigest()[:12]


def _answers_key(cfg: SmolConfig) -> str:
    return _config_key(cfg, "prompts", "responses")


def _data_stem(cfg: SmolConfig) -> str:
    """Cache name of the hidden states: the answers' key and the aux layers captured."""
    layers = "-".join(str(i) for i in cfg.dspark.target_layer_ids)
    return f"draft-data-{_answers_key(cfg)}-L{layers}"


def build_data(cfg: SmolConfig, zoo_dir: Path, cache: Path) -> dict[str, Any]:
    """The ``data`` stage: answers, draft vocabulary and hidden states, cached."""
    from dsparklab.zoo.smol.data import (
        draft_vocabulary,
        generate_responses,
        generation_seconds,
        hidden_state_data,
        training_prompts,
    )

    if cfg.eagle3.target_layer_ids != cfg.dspark.target_layer_ids:
        raise ValueError("the smol drafters share one hidden-state cache: use the same aux layers")
    key = _answers_key(cfg)
    data_path = cache / f"{_data_stem(cfg)}.pt"
    info_path = cache / f"{_data_stem(cfg)}.json"
    if data_path.is_file() and info_path.is_file():
        return json.loads(info_path.read_text())
    torch.set_num_threads(cfg.threads)
    target_dir = prepare_smol_target(zoo_dir)
    model, tokenizer = load_target(target_dir)
    prompts = training_prompts(cfg.prompts)
    answers_path = cache / f"responses-{key}.jsonl"
    records = generate_responses(model, tokenizer, prompts, cfg.responses, answers_path)
    d2t, t2d, coverage = draft_vocabulary(
        records, cfg.responses.draft_vocab_size, model.config.vocab_size
    )
    start = time.time()
    data = hidden_state_data(model, records, cfg.dspark.target_layer_ids)
    hidden_seconds = time.time() - start
    torch.save({"data": asdict(data), "d2t": d2t, "t2d": t2d}, data_path)
    lengths = [len(r["response_ids"]) for r in records]
    info = {
        "prompts": len(prompts),
        "prompt_kinds": {
            kind: sum(p.prompt_id.split("/")[1] == kind for p in prompts)
            for kind in ("code", "math", "prose")
        },
        "answer_tokens": sum(lengths),
        "answers_ending_in_eos": sum(
            r["response_ids"][-1:] == [tokenizer.eos_token_id] for r in records
        ),
        "answer_seconds": round(generation_seconds(answers_path), 1),
        "hidden_state_seconds": round(hidden_seconds, 1),
        "draft_vocab_size": cfg.responses.draft_vocab_size,
        "draft_vocab_coverage": round(coverage, 4),
        "data_key": key,
    }
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def load_data(cfg: SmolConfig, cache: Path) -> tuple[DraftData, VocabMapping]:
    blob = torch.load(cache / f"{_data_stem(cfg)}.pt", weights_only=False)
    return DraftData(**blob["data"]), VocabMapping(blob["d2t"], blob["t2d"])


def _report_path(cache: Path, stage: str) -> Path:
    return cache / f"{stage}-report.json"


def stage_done(cfg: SmolConfig, zoo_dir: Path, cache: Path, stage: str) -> bool:
    """True when ``stage``'s checkpoint exists and its report matches the config."""
    path = _report_path(cache, stage)
    name = DSPARK_NAME if stage == "dspark" else EAGLE3_NAME
    if not path.is_file() or not (zoo_dir / name / "config.json").is_file():
        return False
    return json.loads(path.read_text()).get("config_key") == _config_key(cfg, "responses", stage)


def train_stage(cfg: SmolConfig, stage: str, zoo_dir: Path, cache: Path) -> dict[str, Any]:
    """Train one drafter on the cached data; save it and its report."""
    torch.set_num_threads(cfg.train_threads)
    data, vocab = load_data(cfg, cache)
    target_dir = zoo_dir / TARGET_NAME
    if stage == "dspark":
        from transformers import AutoTokenizer

        mask_id = AutoTokenizer.from_pretrained(target_dir).convert_tokens_to_ids(MASK_TOKEN)
        assert isinstance(mask_id, int), f"{MASK_TOKEN} is one token"
        _, report = train_dspark(
            cfg.dspark,
            data,
            target_dir,
            zoo_dir,
            mask_id,
            autocast_bf16=cfg.autocast_bf16,
            name=DSPARK_NAME,
            vocab=vocab,
        )
    elif stage == "eagle3":
        _, report = train_eagle3(
            cfg.eagle3,
            data,
            target_dir,
            zoo_dir,
            autocast_bf16=cfg.autocast_bf16,
            name=EAGLE3_NAME,
            vocab=vocab,
        )
    else:
        raise ValueError(f"unknown drafter stage {stage!r}; valid: {', '.join(DRAFTER_STAGES)}")
    record = {
        **stage_json(report),
        "config_key": _config_key(cfg, "responses", stage),
        "threads": cfg.train_threads,
    }
    _report_path(cache, stage).write_text(json.dumps(record, indent=2) + "\n")
    return record


def _run_parallel(cfg: SmolConfig, stages: Sequence[str], zoo_dir: Path, cache: Path) -> None:
    """Each drafter stage in its own process (one thread each); fail if any fails."""
    config_path = cache / f"config-{_config_key(cfg, *cfg.model_dump())}.json"
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
) -> dict[str, Any]:
    """Run the smol recipe; returns the data info, stage reports and evaluation."""
    cache = cache_dir() if cache is None else cache
    cache.mkdir(parents=True, exist_ok=True)
    info = build_data(cfg, zoo_dir, cache)
    todo = [s for s in DRAFTER_STAGES if s in stages and not stage_done(cfg, zoo_dir, cache, s)]
    if len(todo) > 1:
        _run_parallel(cfg, todo, zoo_dir, cache)
    for stage in todo if len(todo) == 1 else []:
        train_stage(cfg, stage, zoo_dir, cache)
    reports = {
        s: json.loads(_report_path(cache, s).read_text())
        for s in DRAFTER_STAGES
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
        )
        write_smol_cards(cfg, zoo_dir, info, reports, evaluation, command=command)
    return {"data": info, "stages": reports, "evaluation": evaluation}


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of one drafter stage's process (see :func:`_run_parallel`)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stage", choices=DRAFTER_STAGES, required=True)
    parser.add_argument("--zoo-dir", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True, help="SmolConfig as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = SmolConfig.model_validate_json(args.config.read_text())
    train_stage(cfg, args.stage, args.zoo_dir, args.cache)


if __name__ == "__main__":
    main()
