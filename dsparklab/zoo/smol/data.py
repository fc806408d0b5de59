"""The smol drafters' training data: the distilled answers, their hidden states, the vocabulary.

The answers are the committed chunks of :mod:`dsparklab.zoo.distill`
(``data/distill/smol``). Hidden states are regenerated from their token ids, one stored
chunk per answer chunk (:func:`dsparklab.zoo.hidden.write_hidden_chunk`, bf16,
memory-mapped, resumable: a chunk already stored is kept), never committed.
``generate_responses`` answers evaluation prompts (transformers, batched, cached JSONL).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from dsparklab.errors import ProvenanceError
from dsparklab.prompts import Prompt, encode_prompt
from dsparklab.zoo.distill import CHUNK_GLOB
from dsparklab.zoo.hidden import hidden_chunk_exists, open_hidden_chunk, write_hidden_chunk
from dsparklab.zoo.training.data import DraftData

logger = logging.getLogger(__name__)

HIDDEN_SECONDS = "seconds.json"


def answer_chunks(distill_dir: Path) -> list[Path]:
    """The answer chunks in order; an error naming the directory when there are none."""
    chunks = sorted(distill_dir.glob(CHUNK_GLOB))
    if not chunks:
        raise ProvenanceError(f"{distill_dir}: no {CHUNK_GLOB}; run dsparklab zoo distill")
    return chunks


def chunk_sequences(chunk: Path) -> tuple[list[list[int]], list[int]]:
    """``(prompt + answer ids, prompt length)`` per row of one answer chunk."""
    frame = pd.read_parquet(chunk, columns=["prompt_ids", "response_ids"])
    pairs = zip(frame["prompt_ids"], frame["response_ids"], strict=True)
    seqs = [list(p) + list(r) for p, r in pairs]
    return seqs, [len(p) for p in frame["prompt_ids"]]


def build_hidden_states(
    model: Any, distill_dir: Path, hidden_dir: Path, layer_ids: Sequence[int]
) -> float:
    """Store the target's hidden states for every answer chunk missing them.

    Returns the seconds spent over all invocations (kept in ``hidden_dir/seconds.json``).
    """
    hidden_dir.mkdir(parents=True, exist_ok=True)
    seconds_path = hidden_dir / HIDDEN_SECONDS
    seconds = json.loads(seconds_path.read_text()) if seconds_path.is_file() else {}
    for chunk in answer_chunks(distill_dir):
        stem = hidden_dir / chunk.stem
        if hidden_chunk_exists(stem):
            continue
        started = time.perf_counter()
        write_hidden_chunk(model, chunk_sequences(chunk)[0], layer_ids, stem)
        seconds[chunk.stem] = round(time.perf_counter() - started, 1)
        seconds_path.write_text(json.dumps(seconds, indent=1, sort_keys=True) + "\n")
    return float(sum(seconds.values()))


def load_draft_data(distill_dir: Path, hidden_dir: Path, layer_ids: Sequence[int]) -> DraftData:
    """Every answer chunk with its stored hidden states, as ragged, memory-mapped DraftData.

    ``loss_start`` marks where each answer begins: drafters learn to predict answer
    tokens only, as speculators' chat data generation does.
    """
    ids_list, aux_list, last_list, starts = [], [], [], []
    for chunk in answer_chunks(distill_dir):
        stem = hidden_dir / chunk.stem
        if not hidden_chunk_exists(stem):
            raise ProvenanceError(f"{stem}: hidden states missing; run the data stage")
        hidden = open_hidden_chunk(stem)
        seqs, prompt_lens = chunk_sequences(chunk)
        if len(hidden) != len(seqs):
            raise ProvenanceError(f"{stem}: {len(hidden)} sequences, the chunk has {len(seqs)}")
        for k, (ids, start) in enumerate(zip(seqs, prompt_lens, strict=True)):
            aux, last = hidden.sequence(k)
            if aux.shape[0] != len(ids):
                raise ProvenanceError(f"{stem}: sequence {k} has {aux.shape[0]} hidden rows")
            ids_list.append(torch.tensor(ids))
            aux_list.append(aux)
            last_list.append(last)
            starts.append(start)
    return DraftData(ids_list, aux_list, last_list, tuple(layer_ids), 0, loss_start=starts)


def draft_vocabulary(
    responses: Iterable[Sequence[int]], draft_vocab_size: int, target_vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(d2t, t2d, coverage)``: the most frequent answer tokens as the draft vocabulary.

    ``d2t`` holds offsets (``target_id = draft_id + d2t[draft_id]``, vLLM's and
    speculators' convention), ``t2d`` a boolean mask over the target vocabulary;
    ``coverage`` is the share of answer tokens the draft vocabulary contains.
    """
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    counts = Counter(int(t) for r in responses for t in r)
    d2t, t2d = build_vocab_mappings_from_distribution(
        dict(counts), draft_vocab_size, target_vocab_size
    )
    kept = set((torch.arange(draft_vocab_size) + d2t).tolist())
    total = sum(counts.values())
    coverage = sum(c for t, c in counts.items() if t in kept) / total if total else 0.0
    return d2t, t2d, coverage


@torch.no_grad()
def generate_responses(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    max_new_tokens: int,
    path: Path,
    *,
    batch_size: int = 16,
) -> list[dict[str, Any]]:
    """Greedy answers to ``prompts`` (left-padded batches), appended to ``path`` (JSONL).

    Each record: ``prompt_id``, ``prompt_ids``, ``response_ids`` (up to and including
    EOS, at most ``max_new_tokens``); a restart skips the prompts already answered.
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
        for first in range(0, len(todo), batch_size):
            batch = todo[first : first + batch_size]
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
                max_new_tokens=max_new_tokens,
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
            bar.update(len(batch))
    bar.close()
    return [done[p.prompt_id] for p in prompts]
