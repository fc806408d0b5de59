"""Truncated, malformed, foreign or empty inputs: one line naming file and field, exit 2.

Every case runs ``dsparklab import`` (typer's runner, the command the console script
calls) on one broken file and checks: exit code 2, exactly one line on stderr, the file's
name and the offending field in it, no traceback, and nothing written below ``--out``.
Two cases also go through the installed console entry point in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsparklab.cli.app import app

FIXTURES = Path(__file__).parent / "fixtures"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def edit_json(name: str, change: Callable[[object], object]) -> str:
    value = json.loads(text(name))
    result = change(value)
    return json.dumps(value if result is None else result)


def edit_lines(name: str, change: Callable[[dict], None], line: int = 0) -> str:
    rows = [json.loads(x) for x in text(name).splitlines() if x.strip()]
    change(rows[line])
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def _del(path: list[object]) -> Callable[[object], None]:
    def change(value: object) -> None:
        for key in path[:-1]:
            value = value[key]  # type: ignore[index]
        del value[path[-1]]  # type: ignore[attr-defined]

    return change


def _set(path: list[object], new: object) -> Callable[[object], None]:
    def change(value: object) -> None:
        for key in path[:-1]:
            value = value[key]  # type: ignore[index]
        value[path[-1]] = new  # type: ignore[index]

    return change


SPEC = ["metrics", "speculative_decoding"]
# (case id, format, file name, content, text the field part of the message must contain)
CASES: list[tuple[str, str, str, str, str]] = [
    # vllm-metrics
    ("metrics-empty", "vllm-metrics", "m.prom", "", "empty"),
    (
        "metrics-foreign",
        "vllm-metrics",
        "m.prom",
        "# HELP x\nprocess_cpu_seconds_total 3.0\n",
        "vllm:spec_decode_num_drafts_total",
    ),
    (
        "metrics-garbled-line",
        "vllm-metrics",
        "m.prom",
        text("vllm_metrics_after.prom").replace(
            "vllm:spec_decode_num_drafts_total{", "vllm:spec_decode_num_drafts_total {{", 1
        ),
        "line",
    ),
    (
        "metrics-truncated",
        "vllm-metrics",
        "m.prom",
        text("vllm_metrics_after.prom").split("vllm:spec_decode_num_accepted_tokens_per_pos_total")[
            0
        ],
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ),
    (
        "metrics-not-prefix-closed",
        "vllm-metrics",
        "m.prom",
        text("vllm_metrics_after.prom")
        .replace('position="2"} ', 'position="2"} 9999', 1)
        .replace("9999 ", "9999", 1),
        'position="2"',
    ),
    (
        "metrics-bad-value",
        "vllm-metrics",
        "m.prom",
        text("vllm_metrics_after.prom").replace(
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-target"} ',
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-target"} 1.5e0x',
            1,
        ),
        "vllm:spec_decode_num_drafts_total",
    ),
    # vllm-bench
    (
        "bench-truncated",
        "vllm-bench",
        "b.json",
        text("vllm_bench_result.json")[:-40],
        "invalid JSON",
    ),
    (
        "bench-no-spec",
        "vllm-bench",
        "b.json",
        edit_json(
            "vllm_bench_result.json",
            lambda r: {k: v for k, v in r.items() if not k.startswith("spec_decode")},
        ),  # type: ignore[union-attr]
        "spec_decode_num_drafts",
    ),
    (
        "bench-rate-not-number",
        "vllm-bench",
        "b.json",
        edit_json("vllm_bench_result.json", _set(["spec_decode_acceptance_rate"], "41%")),
        "spec_decode_acceptance_rate",
    ),
    (
        "bench-rates-not-counts",
        "vllm-bench",
        "b.json",
        edit_json(
            "vllm_bench_result.json",
            _set(["spec_decode_per_position_acceptance_rates"], [0.7777, 0.5, 0.1]),
        ),
        "spec_decode_per_position_acceptance_rates",
    ),
    (
        "bench-foreign",
        "vllm-bench",
        "b.json",
        json.dumps({"hello": "world"}),
        "spec_decode_num_drafts",
    ),
    # vllm-request
    ("request-empty-list", "vllm-request", "r.json", "[]", "metrics.speculative_decoding"),
    (
        "request-no-metrics",
        "vllm-request",
        "r.json",
        edit_json("vllm_request_detailed.json", lambda rs: [r.pop("metrics") and r for r in rs]),  # type: ignore[union-attr]
        "metrics.speculative_decoding",
    ),
    (
        "request-histogram-too-long",
        "vllm-request",
        "r.jsonl",
        edit_lines(
            "vllm_request_summary.jsonl",
            lambda r: r["metrics"]["speculative_decoding"]["acceptance_histogram"].append(1),
        ),
        "acceptance_histogram",
    ),
    (
        "request-histogram-word",
        "vllm-request",
        "r.jsonl",
        edit_lines(
            "vllm_request_summary.jsonl",
            lambda r: r["metrics"]["speculative_decoding"]["acceptance_histogram"].__setitem__(
                1, "a"
            ),
        ),
        "acceptance_histogram': entry 1 is 'a'",
    ),
    (
        "request-histogram-disagrees",
        "vllm-request",
        "r.jsonl",
        edit_lines(
            "vllm_request_summary.jsonl",
            lambda r: r["metrics"]["speculative_decoding"].update(num_spec_steps=99),
        ),
        "acceptance_histogram",
    ),
    (
        "request-per-step-disagrees",
        "vllm-request",
        "r.json",
        edit_json("vllm_request_detailed.json", _set([0, *SPEC, "per_step_drafted"], [1])),
        "per_step_accepted",
    ),
    (
        "request-truncated-line",
        "vllm-request",
        "r.jsonl",
        text("vllm_request_summary.jsonl")[:-30],
        "line",
    ),
    (
        "request-bad-n",
        "vllm-request",
        "r.jsonl",
        edit_lines(
            "vllm_request_summary.jsonl",
            lambda r: r["metrics"]["speculative_decoding"].update(num_spec_tokens=0),
        ),
        "num_spec_tokens",
    ),
    # sglang
    (
        "sglang-foreign",
        "sglang",
        "s.jsonl",
        json.dumps({"choices": [{"text": "hi"}]}) + "\n",
        "meta_info",
    ),
    (
        "sglang-no-spec",
        "sglang",
        "s.jsonl",
        "\n".join(
            json.dumps({"text": "x", "meta_info": {"id": f"r{i}", "completion_tokens": 3}})
            for i in range(2)
        )
        + "\n",
        "meta_info.spec_verify_ct",
    ),
    (
        "sglang-histogram-word",
        "sglang",
        "s.jsonl",
        edit_lines(
            "sglang_generate.jsonl",
            lambda r: r["meta_info"]["spec_correct_drafts_histogram"].__setitem__(0, "a"),
        ),
        "spec_correct_drafts_histogram': entry 0",
    ),
    (
        "sglang-histogram-disagrees",
        "sglang",
        "s.jsonl",
        edit_lines(
            "sglang_generate.jsonl",
            lambda r: r["meta_info"].update(spec_verify_ct=r["meta_info"]["spec_verify_ct"] + 1),
        ),
        "spec_correct_drafts_histogram",
    ),
    (
        "sglang-negative",
        "sglang",
        "s.jsonl",
        edit_lines(
            "sglang_generate.jsonl", lambda r: r["meta_info"].update(spec_num_correct_drafts=-1)
        ),
        "spec_num_correct_drafts",
    ),
    ("sglang-not-a-response", "sglang", "s.json", json.dumps({"hello": "world"}), "meta_info"),
    (
        "sglang-openai-without-details",
        "sglang",
        "chat.json",
        edit_json("sglang_chat_sglext.json", lambda rs: [r.pop("sglext") and r for r in rs]),  # type: ignore[union-attr]
        "meta_info.spec_verify_ct",
    ),
    (
        "sglang-only-zero-verify",
        "sglang",
        "s.jsonl",
        "".join(
            json.dumps({"meta_info": {"id": f"r{i}", "spec_verify_ct": 0}}) + "\n" for i in range(2)
        ),
        "meta_info.spec_verify_ct",
    ),
    (
        "sglang-cap-length-disagrees",
        "sglang",
        "s.jsonl",
        edit_lines(
            "sglang_capped.jsonl",
            lambda r: r["meta_info"].update(spec_cap_length=3.2),
        ),
        "meta_info.spec_cap_length",
    ),
    (
        "sglang-cap-histogram-short",
        "sglang",
        "s.jsonl",
        edit_lines(
            "sglang_capped.jsonl",
            lambda r: r["meta_info"]["spec_cap_lens_histogram"].__setitem__(2, 0),
            line=1,
        ),
        "meta_info.spec_cap_lens_histogram",
    ),
    # specdec-bench
    ("specdec-empty-list", "specdec-bench", "acceptance_rate.json", "[]", "empty list"),
    ("specdec-foreign", "specdec-bench", "x.json", json.dumps({"a": 1}), "schema_version"),
    (
        "specdec-length-count-word",
        "specdec-bench",
        "acceptance_rate.json",
        edit_json(
            "specdec_acceptance_rate.json", _set([0, "Acceptance_Length_Histogram", "1"], "six")
        ),
        "Acceptance_Length_Histogram': entry '1' is 'six'",
    ),
    (
        "specdec-bad-length-key",
        "specdec-bench",
        "acceptance_rate.json",
        edit_json(
            "specdec_acceptance_rate.json", _set([0, "Acceptance_Length_Histogram", "two"], 3)
        ),
        "Acceptance_Length_Histogram",
    ),
    (
        "specdec-stub-profile",
        "specdec-bench",
        "speculation_profile.json",
        edit_json("specdec_speculation_profile.json", _set(["measured"], False)),
        "measured",
    ),
    (
        "specdec-short-vector",
        "specdec-bench",
        "speculation_profile.json",
        edit_json("specdec_speculation_profile.json", _set(["marginal_accept_rates"], [0.7, 0.4])),
        "marginal_accept_rates",
    ),
    (
        "specdec-schema-2",
        "specdec-bench",
        "speculation_profile.json",
        edit_json("specdec_speculation_profile.json", _set(["schema_version"], "2.0")),
        "schema_version",
    ),
    # deepspec
    ("deepspec-no-spec", "deepspec", "metrics.json", json.dumps({"confidence": {}}), "spec"),
    (
        "deepspec-temperature-word",
        "deepspec",
        "metrics.json",
        edit_json("deepspec_metrics.json", _set(["config", "args", "temperature"], "hot")),
        "config.args.temperature",
    ),
    (
        "deepspec-config-not-object",
        "deepspec",
        "metrics.json",
        edit_json("deepspec_metrics.json", _set(["config"], "x")),
        "config",
    ),
    (
        "deepspec-rate-above-one",
        "deepspec",
        "metrics.json",
        edit_json("deepspec_metrics.json", _set(["spec", "accept_rates_by_position", 3], 1.7)),
        "spec.accept_rates_by_position[3]",
    ),
    (
        "deepspec-increasing",
        "deepspec",
        "metrics.json",
        edit_json("deepspec_metrics.json", _set(["spec", "accept_rates_by_position", 4], 0.99)),
        "spec.accept_rates_by_position",
    ),
    (
        "deepspec-bad-position",
        "deepspec",
        "metrics.json",
        edit_json("deepspec_metrics.json", _set(["confidence", "per_position", 2, "position"], 40)),
        "confidence.per_position[2].position",
    ),
    (
        "deepspec-bin-range",
        "deepspec",
        "metrics.json",
        edit_json(
            "deepspec_metrics.json",
            _set(["confidence", "per_position", 2, "reliability", 0, "range"], [0.5]),
        ),
        "confidence.per_position[2].reliability[0].range",
    ),
    (
        "deepspec-bin-twice",
        "deepspec",
        "metrics.json",
        edit_json(
            "deepspec_metrics.json",
            _set(["confidence", "per_position", 2, "reliability", 1, "bin"], 10),
        ),
        "confidence.per_position[2].reliability",
    ),
    (
        "deepspec-rate-not-a-count",
        "deepspec",
        "metrics.json",
        edit_json("deepspec_metrics.json", _set(["spec", "accept_rates_by_position", 2], 0.5)),
        "spec.accept_rates_by_position",
    ),
    ("deepspec-not-utf8", "deepspec", "metrics.json", "\udcff", "UTF-8"),
]


@pytest.mark.parametrize(
    ("case", "fmt", "name", "content", "field"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_exit_2_nothing_written(
    tmp_path: Path, case: str, fmt: str, name: str, content: str, field: str
) -> None:
    path = tmp_path / name
    if content == "\udcff":
        path.write_bytes(b'{"spec": "\xff\xfe"}')
    else:
        path.write_text(content)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["import", fmt, str(path), "--out", str(out)])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("error: ")
    assert "Traceback" not in result.output
    assert str(path) in line, line
    assert field in line, line
    assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))


def test_enough_cases() -> None:
    assert len(CASES) >= 20
    assert {c[1] for c in CASES} == {
        "vllm-metrics",
        "vllm-bench",
        "vllm-request",
        "sglang",
        "specdec-bench",
        "deepspec",
    }


def test_a_bad_file_among_good_ones_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text("vllm_request_summary.jsonl")[:-30])
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "import",
            "vllm-request",
            str(FIXTURES / "vllm_request_detailed.json"),
            str(bad),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2
    assert not out.exists()


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = CliRunner().invoke(
        app, ["import", "deepspec", str(missing), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    assert str(missing) in result.stderr and "no such file" in result.stderr
    result = CliRunner().invoke(
        app, ["import", "vllm-request", str(tmp_path), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    assert f"{tmp_path}: is a directory" in result.stderr
    result = CliRunner().invoke(app, ["import", "tgi", str(missing), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "unknown format 'tgi'" in result.stderr


@pytest.mark.parametrize("fmt", ["vllm-metrics", "deepspec"])
def test_console_entry_point(tmp_path: Path, fmt: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("{" if fmt == "deepspec" else "garbage line here\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dsparklab.cli.app import main; main()",
            "import",
            fmt,
            str(bad),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert str(bad) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_each_run_line_names_the_run_written(tmp_path: Path) -> None:
    """The per-run line names the directory that holds the run's run.json, and says
    whether this import wrote it or found it there."""
    out = tmp_path / "o"
    source = FIXTURES / "vllm_bench_result.json"
    args = ["import", "vllm-bench", str(source), "--out", str(out), "--dataset", "humaneval"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    (line,) = [x for x in first.output.splitlines() if ": written;" in x]
    run_dir = Path(line.split(": written;")[0])
    assert (run_dir / "run.json").is_file(), line
    again = CliRunner().invoke(app, args)
    assert f"{run_dir}: already imported (use --overwrite)" in again.output
