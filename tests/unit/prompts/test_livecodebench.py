"""LiveCodeBench code_generation_lite rows become the prompts LiveCodeBench itself sends
(its generic template, with and without starter code), by --dataset livecodebench:PATH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparklab.engines.plan import RunSpec
from dsparklab.prompts import LCB_SYSTEM_MESSAGE, PromptFileError, dataset_label, load_prompts

FIXTURE = Path(__file__).parent / "fixtures" / "livecodebench_test.jsonl"


def test_rows_become_livecodebench_prompts():
    prompts = load_prompts(f"livecodebench:{FIXTURE}")
    assert [p.prompt_id for p in prompts] == [
        "livecodebench/codeforces/1873_A",
        "livecodebench/leetcode/2727",
        "livecodebench/atcoder/abc301_a",
    ]
    assert {p.dataset for p in prompts} == {"livecodebench"}
    stdin, starter = prompts[0].text, prompts[1].text
    row = json.loads(FIXTURE.read_text().splitlines()[1])
    assert starter == (
        f"{LCB_SYSTEM_MESSAGE}\n\n### Question:\n{row['question_content']}\n\n"
        "### Format: You will use the following starter code to write the solution to the "
        "problem and enclose your code within delimiters.\n"
        f"```python\n{row['starter_code']}\n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n"
    )
    assert "### Format: Read the inputs from stdin solve the problem" in stdin
    assert "```python\n# YOUR CODE HERE\n```\n\n### Answer:" in stdin
    assert load_prompts(f"livecodebench:{FIXTURE}", limit=1) == prompts[:1]
    assert dataset_label(f"livecodebench:{FIXTURE}") == "livecodebench"
    spec = RunSpec(dataset=f"livecodebench:{FIXTURE}", method="eagle3", n=3)
    assert spec.dataset_dir == "livecodebench"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda r: r.pop("question_content"),
            "field 'question_content': expected a non-empty string, got missing",
        ),
        (lambda r: r.update(starter_code=None), "field 'starter_code': expected a string"),
        (
            lambda r: r.update(platform=3),
            "field 'platform': expected a non-empty string, got a int",
        ),
    ],
)
def test_a_bad_row_is_named_by_file_line_and_field(tmp_path: Path, edit, message):
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    edit(rows[2])
    path = tmp_path / "lcb.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(PromptFileError, match="line 3") as err:
        load_prompts(f"livecodebench:{path}")
    assert message in str(err.value) and str(path) in str(err.value)
    path.write_text(FIXTURE.read_text() + FIXTURE.read_text().splitlines()[0] + "\n")
    with pytest.raises(PromptFileError, match="duplicate id 'livecodebench/codeforces/1873_A'"):
        load_prompts(f"livecodebench:{path}")
