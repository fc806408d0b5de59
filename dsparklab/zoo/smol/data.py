"""The smol drafters' training data: the target's greedy answers and its hidden states.

``generate_responses`` is resumable: answers are appended to a JSONL file batch by batch
and a restart skips the prompts already answered. Hidden states are recomputed from
the token ids when needed (about two minutes here), not stored.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from dsparklab.instruct_prompts import code_requests, math_problems, prose_requests
from dsparklab.prompts import Prompt, encode_prompt
from dsparklab.zoo.hidden import capture_hidden_states
from dsparklab.zoo.smol.config import PromptSetConfig, ResponseConfig
from dsparklab.zoo.tiny.train import DraftData

logger = logging.getLogger(__name__)


def training_prompts(cfg: PromptSetConfig) -> list[Prompt]:
    """Code, math and prose requests (training splits), interleaved in a fixed order."""
    kinds = {
        "code": code_requests(cfg.code, seed=cfg.seed),
        "math": math_problems("train", cfg.math, seed=cfg.seed),
        "prose": prose_requests("train") if cfg.prose else [],
    }
    prompts = [
        Prompt(f"smol-train/{kind}/{k}", "smol-train", text)
        for kind, texts in kinds.items()
        for k, text in enumerate(texts)
    ]
    # Round-robin by index so every generation batch mixes the three kinds.
    return sorted(prompts, key=lambda p: (int(p.prompt_id.rsplit("/", 1)[1]), p.prompt_id))


@torch.no_grad()
def generate_responses(
    model: Any, tokenizer: Any, prompts: Sequence[Prompt], cfg: ResponseConfig, path: Path
) -> list[dict[str, Any]]:
    """Greedy answers to ``prompts`` (left-padded batches), appended to ``path`` (JSONL).

    Each record: ``prompt_id``, ``prompt_ids``, ``response_ids`` (up to and including
    EOS, at most ``max_new_tokens``). The generation time, summed over every invocation
    that added answers, is kept beside the file (:func:`generation_seconds`).
    """
    done: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                done[record["prompt_id"]] = record
    todo = [p for p in prompts if p.prompt_id not in done]
    eos = tokenizer.eos_token_id
    path.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="answers", unit="prompt")
    with path.open("a", encoding="utf-8") as fh:
        for first in range(0, len(todo), cfg.batch_size):
            started = time.perf_counter()
            batch = todo[first : first + cfg.batch_size]
            encoded = [encode_prompt(tokenizer, p) for p in batch]
            width = max(len(ids) for ids in encoded)
            input_ids = torch.full((len(batch), width), eos, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, ids in enumerate(encoded):
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                mask[row, width - len(ids) :] = 1
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=cfg.max_new_tokens,
                do_sample=False,
                pad_token_id=eos,
                eos_token_id=eos,
            )
            for prompt, ids, row in zip(batch, encoded, out[:, width:].tolist(), strict=True):
                response = row[: row.index(eos) + 1] if eos in row else row
                record = {
                    "prompt_id": prompt.prompt_id,
                    "prompt_ids": ids,
                    "response_ids": response,
                }
                fh.write(json.dumps(record) + "\n")
                done[prompt.prompt_id] = record
            fh.flush()
            _add_seconds(path, time.perf_counter() - started)
            bar.update(len(batch))
    bar.close()
    return [done[p.prompt_id] for p in prompts]


def _seconds_path(path: Path) -> Path:
    return path.with_name(path.name + ".seconds")


def generation_seconds(path: Path) -> float:
    """Wall seconds spent generating the answers in ``path`` (0 when unknown)."""
    sidecar = _seconds_path(path)
    return float(sidecar.read_text()) if sidecar.is_file() else 0.0


def _add_seconds(path: Path, seconds: float) -> None:
    _seconds_path(path).write_text(f"{generation_seconds(path) + seconds:.1f}\n")


def draft_vocabulary(
    records: Sequence[dict[str, Any]], draft_vocab_size: int, target_vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(d2t, t2d, coverage)``: the most frequent answer tokens as the draft vocabulary.

    ``d2t`` holds offsets (``target_id = draft_id + d2t[draft_id]``, vLLM's and
    speculators' convention), ``t2d`` a boolean mask over the target vocabulary;
    ``coverage`` is the share of answer tokens the draft vocabulary contains.
    """
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    counts = Counter(t for r in records for t in r["response_ids"])
    d2t, t2d = build_vocab_mappings_from_distribution(
        dict(counts), draft_vocab_size, target_vocab_size
    )
    kept = set((torch.arange(draft_vocab_size) + d2t).tolist())
    total = sum(counts.values())
    coverage = sum(c for t, c in counts.items() if t in kept) / total if total else 0.0
    return d2t, t2d, coverage


@torch.no_grad()
def hidden_state_data(
    model: Any, records: Sequence[dict[str, Any]], layer_ids: Sequence[int]
) -> DraftData:
    """The target's hidden states over prompt + answer, one sequence at a time (no padding).

    ``loss_start`` marks where each answer begins: drafters learn to predict answer
    tokens only, as speculators' chat data generation does.
    """
    ids_list, aux_list, last_list, starts = [], [], [], []
    for record in tqdm(records, desc="hidden states", unit="seq"):
        ids = torch.tensor([record["prompt_ids"] + record["response_ids"]])
        aux, last, _ = capture_hidden_states(model, ids, layer_ids)
        ids_list.append(ids[0])
        aux_list.append(aux[0].to(torch.bfloat16))
        last_list.append(last[0].to(torch.bfloat16))
        starts.append(len(record["prompt_ids"]))
    return DraftData(ids_list, aux_list, last_list, tuple(layer_ids), 0, loss_start=starts)
