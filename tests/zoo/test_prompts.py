"""Prompt sets: HumanEval, held-out prose, user JSONL files (incl. malformed ones)."""

from __future__ import annotations

import json

import pytest

from dsparklab.errors import DSparkLabError, UnknownMethodError
from dsparklab.prompts import (
    Prompt,
    PromptFileError,
    load_prompts,
    prompt_set_names,
    prose_corpus,
    prose_paragraphs,
)


def test_humaneval_is_the_packaged_set():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert [p.prompt_id for p in prompts[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert prompts[0].dataset == "humaneval"
    assert prompts[0].text.startswith("from typing import List")
    assert "def has_close_elements" in prompts[0].text
    assert load_prompts("humaneval", limit=3) == prompts[:3]


def test_prose_prompts_are_held_out_and_never_in_training_split():
    prompts = load_prompts("prose")
    assert len(prompts) >= 30
    assert len({p.prompt_id for p in prompts}) == len(prompts)
    assert all(p.dataset == "prose" and len(p.text) >= 200 for p in prompts)
    train_text = "\n".join(prose_corpus("train"))
    heldout_text = "\n".join(prose_corpus("heldout"))
    for prompt in prompts:
        assert prompt.text not in train_text
        assert prompt.text in heldout_text
    # The split is a partition of the paragraphs, decided by content alone.
    paragraphs = prose_paragraphs()
    heldout = [p for p in paragraphs if p.heldout]
    assert 0.05 < len(heldout) / len(paragraphs) < 0.25
    assert load_prompts("prose") == prompts  # deterministic


def test_unknown_name_lists_valid_names():
    with pytest.raises(UnknownMethodError) as err:
        load_prompts("gsm9k")
    message = str(err.value)
    for name in prompt_set_names():
        assert name in message
    assert "jsonl:" in message


def test_jsonl_loader_reads_documented_fields(tmp_path):
    path = tmp_path / "mix.jsonl"
    rows = [
        {"question": "Natalia sold clips...", "answer": "72"},  # GSM8K
        {"problem": "Find x.", "unique_id": "test/algebra/1.json"},  # MATH500
        {"question_content": "Given an array...", "question_id": 3},  # LiveCodeBench
        {"turns": ["Write a parser.", "Now test it."], "question_id": "sb-7"},  # SPEED-Bench
        {"prompt": "def f():", "task_id": "X/1", "question": "ignored: prompt wins"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    prompts = load_prompts(f"jsonl:{path}")
    assert prompts == [
        Prompt("mix/1", "mix", "Natalia sold clips..."),
        Prompt("test/algebra/1.json", "mix", "Find x."),
        Prompt("3", "mix", "Given an array..."),
        Prompt("sb-7", "mix", "Write a parser."),
        Prompt("X/1", "mix", "def f():"),
    ]
    assert load_prompts(f"jsonl:{path}", limit=2) == prompts[:2]


@pytest.mark.parametrize(
    ("lines", "line", "field", "words"),
    [
        (['{"question": "ok"}', "{not json"], 2, None, "not valid JSON"),
        (['["a list"]'], 1, None, "JSON object"),
        (['{"answer": "42"}'], 1, "prompt", "no prompt text"),
        (['{"question": 7}'], 1, "question", "non-empty string"),
        (['{"turns": []}'], 1, "turns", "list of strings"),
        (['{"question": "a", "id": 1}', '{"question": "b", "id": 1}'], 2, "id", "duplicate"),
        (['{"question": "a", "id": {"x": 1}}'], 1, "id", "string or integer"),
    ],
)
def test_jsonl_errors_name_file_line_and_field(tmp_path, lines, line, field, words):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(PromptFileError) as err:
        load_prompts(f"jsonl:{path}")
    assert isinstance(err.value, DSparkLabError)
    assert err.value.path == str(path)
    assert err.value.line == line
    assert err.value.field == field
    message = str(err.value)
    assert str(path) in message
    assert words in message
    assert "\n" not in message


def test_jsonl_missing_or_empty_file(tmp_path):
    with pytest.raises(PromptFileError, match="file not found"):
        load_prompts(f"jsonl:{tmp_path / 'nope.jsonl'}")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(PromptFileError, match="empty"):
        load_prompts(f"jsonl:{empty}")


def test_instruct_set_is_held_out_from_the_smol_training_prompts():
    from dsparklab.instruct_prompts import (
        MATH_HELDOUT_TEMPLATES,
        MATH_TEMPLATES,
        PROSE_TOPICS,
        math_problems,
        prose_requests,
    )

    prompts = load_prompts("instruct")
    assert len(prompts) == 168
    assert len({p.prompt_id for p in prompts}) == 168
    # Interleaved: any limit keeps math and prose in equal shares.
    kinds = [p.prompt_id.split("/")[1] for p in load_prompts("instruct", limit=40)]
    assert kinds.count("math") == kinds.count("prose") == 20
    held_topics = {t for t in PROSE_TOPICS if any(t in p.text for p in prompts)}
    train_text = "\n".join(prose_requests("train"))
    assert held_topics
    assert not any(f" {t}" in train_text for t in held_topics)
    # Every held-out problem matches a held-out template and no training template.
    import re

    def pattern(text: str) -> re.Pattern[str]:
        parts = re.split(r"\{[a-z]+\}", text)
        return re.compile(".+?".join(re.escape(part) for part in parts) + "$")

    cut = len(MATH_TEMPLATES) - MATH_HELDOUT_TEMPLATES
    train = [pattern(t[0]) for t in MATH_TEMPLATES[:cut]]
    held = [pattern(t[0]) for t in MATH_TEMPLATES[cut:]]
    for problem in math_problems("heldout", 12):
        body = problem.split("\n\n", 1)[1]
        assert any(p.match(body) for p in held)
        assert not any(p.match(body) for p in train)
    for problem in math_problems("train", 16):
        assert any(p.match(problem.split("\n\n", 1)[1]) for p in train)


def test_chat_targets_get_the_chat_template():
    from transformers import AutoTokenizer

    from dsparklab.prompts import chat_request, encode_prompt
    from dsparklab.zoo import ZOO_DIR

    prompt = load_prompts("humaneval", limit=1)[0]
    assert chat_request(prompt).startswith("Complete the following Python function")
    assert prompt.text in chat_request(prompt)
    tiny = AutoTokenizer.from_pretrained(ZOO_DIR / "tiny-target")
    assert encode_prompt(tiny, prompt) == tiny(prompt.text, add_special_tokens=False)["input_ids"]
    assert encode_prompt(tiny, prompt, max_len=5) == encode_prompt(tiny, prompt)[-5:]


@pytest.mark.parametrize(
    ("stem", "line", "want_id", "want_text"),
    [
        (
            "math500",
            {
                "problem": "Convert the point $(0,3)$ to polar coordinates.",
                "solution": "...",
                "answer": "(3, \\frac{\\pi}{2})",
                "subject": "Precalculus",
                "level": 2,
                "unique_id": "test/precalculus/807.json",
            },
            "test/precalculus/807.json",
            "Convert the point $(0,3)$ to polar coordinates.",
        ),
        (
            "livecodebench",
            {
                "question_title": "A. Short Sort",
                "question_content": "There are three cards with letters a, b, c ...",
                "platform": "codeforces",
                "question_id": "1873_A",
                "contest_id": "1873",
                "contest_date": "2023-08-21T00:00:00",
                "starter_code": "",
                "difficulty": "easy",
                "public_test_cases": "[]",
            },
            "1873_A",
            "There are three cards with letters a, b, c ...",
        ),
        (
            "speed_bench",
            {
                "question_id": "coding_0",
                "category": "coding",
                "turns": ["Write a function that merges two sorted lists.", "Now in C."],
            },
            "coding_0",
            "Write a function that merges two sorted lists.",
        ),
    ],
)
def test_jsonl_formats_of_the_benchmarks_users_bring(tmp_path, stem, line, want_id, want_text):
    """docs/prompt-sets.md: each benchmark's own line layout loads as documented."""
    path = tmp_path / f"{stem}.jsonl"
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    assert load_prompts(f"jsonl:{path}") == [Prompt(want_id, stem, want_text)]
