"""Each format's fixture imports into a valid run whose reported numbers equal the lab's.

The fixtures (tests/unit/importers/fixtures, made by make_fixtures.py; the vLLM ones with
vLLM's own classes) are in the shapes the tools write. For each, the AL and rates the file
reports must equal what the lab computes from the file's own counts, under the definition
the tool uses (docs/acceptance-definitions.md), and the stored run must validate.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dsparklab.analysis as A
from dsparklab.analysis import definitions as D
from dsparklab.importers import import_files, parse_files
from dsparklab.store import list_runs, read_run_json, read_trace, validate_trace

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> Path:
    return FIXTURES / name


def imported(tmp_path: Path, fmt: str, *names: str, **options: object) -> list[Path]:
    runs, result = import_files(fmt, [fixture(n) for n in names], tmp_path, **options)  # type: ignore[arg-type]
    assert result.written, "nothing written"
    for report in validate_trace(tmp_path):
        assert report.ok, [str(v) for v in report.violations]
    for run in runs:
        assert not run.failed_checks, [c.as_dict() for c in run.failed_checks]
    return result.written


def tables(root: Path) -> dict[str, pd.DataFrame]:
    return {t: read_trace(root, t) for t in ("positions", "steps", "counters", "totals")}


def lab_lengths(root: Path) -> pd.DataFrame:
    t = tables(root)
    return A.compute_acceptance_length_any(
        t["positions"], steps=t["steps"], counters=t["counters"], totals=t["totals"], n_boot=0
    )


def test_vllm_metrics_two_scrapes_are_their_delta(tmp_path: Path) -> None:
    (run,) = imported(
        tmp_path, "vllm-metrics", "vllm_metrics_before.prom", "vllm_metrics_after.prom"
    )
    meta = read_run_json(run)
    assert meta["granularity"] == "aggregate"
    assert meta["num_speculative_tokens"] == 3
    files = meta["source"]["files"]
    assert [Path(f["path"]).name for f in files] == [
        "vllm_metrics_before.prom",
        "vllm_metrics_after.prom",
    ]
    assert all(f["sha256"].startswith("sha256:") for f in files)
    counters = read_trace(run, "counters").sort_values("position")
    totals = read_trace(run, "totals")

    # counts parsed independently: sum over both engines, after minus before
    def scrape(name: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in fixture(name).read_text().splitlines():
            if line.startswith("vllm:spec_decode") and line.split()[0].split("{")[0].endswith(
                "_total"
            ):
                key = line.split("{")[0]
                if "position=" in line:
                    key += line.split('position="')[1].split('"')[0]
                out[key] = out.get(key, 0.0) + float(line.split()[-1])
        return out

    before, after = scrape("vllm_metrics_before.prom"), scrape("vllm_metrics_after.prom")
    delta = {k: after[k] - before[k] for k in after}
    drafts = delta["vllm:spec_decode_num_drafts_total"]
    assert int(totals["num_drafts"].iloc[0]) == drafts
    per_pos = [delta[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{i}"] for i in range(3)]
    assert counters["n_accepted"].tolist() == per_pos
    assert counters["n_reached"].tolist() == [drafts, per_pos[0], per_pos[1]]
    (length,) = lab_lengths(run)["accept_len"]
    assert length == pytest.approx(1 + delta["vllm:spec_decode_num_accepted_tokens_total"] / drafts)


def test_vllm_bench_equals_the_same_window_scraped(tmp_path: Path) -> None:
    """The bench fixture is the delta of the two scrapes: both imports give one table."""
    (bench,) = imported(tmp_path / "b", "vllm-bench", "vllm_bench_result.json")
    (metrics,) = imported(
        tmp_path / "m", "vllm-metrics", "vllm_metrics_before.prom", "vllm_metrics_after.prom"
    )
    keys = ["position", "n_reached", "n_accepted", "n_drafted"]
    a = read_trace(bench, "counters")[keys].sort_values("position").reset_index(drop=True)
    b = read_trace(metrics, "counters")[keys].sort_values("position").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    result = json.loads(fixture("vllm_bench_result.json").read_text())
    (length,) = lab_lengths(bench)["accept_len"]
    assert length == pytest.approx(result["spec_decode_acceptance_length"])
    totals = read_trace(bench, "totals")
    assert totals["reported_accept_rate"].iloc[0] == pytest.approx(
        result["spec_decode_acceptance_rate"] / 100
    )
    survival = A.compute_acceptance_by_position_any(
        counters=read_trace(bench, "counters"), n_boot=0
    )["survival"]
    np.testing.assert_allclose(survival, result["spec_decode_per_position_acceptance_rates"])
    # the cost side: bench's latency means, milliseconds -> seconds
    (row,) = totals.to_dict("records")
    for column, key in (("ttft_s", "mean_ttft_ms"), ("tpot_s", "mean_tpot_ms")):
        assert row[column] == pytest.approx(result[key] / 1e3)
    assert row["itl_s"] == pytest.approx(result["mean_itl_ms"] / 1e3)
    # the fixture's chunks carry up to 4 tokens: a chunk gap (ITL) exceeds the per-token TPOT
    assert row["itl_s"] > row["tpot_s"] > 0


def test_vllm_bench_without_latencies_or_completions(tmp_path: Path) -> None:
    """A result without a latency key leaves its column null; nothing completed: all null
    (bench writes 0 for the means of empty lists)."""
    result = json.loads(fixture("vllm_bench_result.json").read_text())
    del result["mean_itl_ms"]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    (run,) = parse_files("vllm-bench", [path])
    (row,) = run.tables["totals"]
    assert row["itl_s"] is None and row["tpot_s"] == pytest.approx(result["mean_tpot_ms"] / 1e3)
    path.write_text(json.dumps({**result, "completed": 0}))
    (run,) = parse_files("vllm-bench", [path])
    (row,) = run.tables["totals"]
    assert (row["ttft_s"], row["tpot_s"], row["itl_s"]) == (None, None, None)


def test_vllm_request_detailed_is_step_level(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "vllm-request", "vllm_request_detailed.json")
    assert read_run_json(run)["granularity"] == "step"
    steps = read_trace(run, "steps")
    responses = json.loads(fixture("vllm_request_detailed.json").read_text())
    for response in responses:
        spec = response["metrics"]["speculative_decoding"]
        mine = steps[steps["request_id"] == response["id"]].sort_values("step")
        assert mine["accepted_len"].tolist() == spec["per_step_accepted"]
        assert mine["num_drafted"].tolist() == spec["per_step_drafted"]
        # context from the prompt length, as vLLM's first draft follows the prefill token
        assert mine["context_len"].iloc[0] == response["usage"]["prompt_tokens"] + 1
    per_request = A.compute_acceptance_length(steps_counts(steps), by=("request_id",), n_boot=0)
    for response in responses:
        spec = response["metrics"]["speculative_decoding"]
        row = per_request[per_request["request_id"] == response["id"]]
        assert row["accept_len"].iloc[0] == pytest.approx(spec["mean_acceptance_length"])
    # the cost side: the responses' timing (--enable-per-request-metrics), in seconds
    totals = read_trace(run, "totals").set_index("request_id")
    for response in responses:
        timing = response["metrics"]
        mine = totals.loc[response["id"]]
        assert mine["ttft_s"] == pytest.approx(timing["time_to_first_token_ms"] / 1e3)
        assert mine["tpot_s"] == pytest.approx(timing["mean_itl_ms"] / 1e3)
        assert pd.isna(mine["itl_s"])
    whole = read_trace(run, "totals")
    (run_row,) = whole[whole["scope"] == "run"].to_dict("records")
    assert run_row["tpot_s"] == pytest.approx(
        np.mean([r["metrics"]["mean_itl_ms"] for r in responses]) / 1e3
    )


def steps_counts(steps: pd.DataFrame) -> pd.DataFrame:
    return A.count_acceptance_from_steps(steps, by=("request_id",))


def test_vllm_request_summary_equals_detailed_counts(tmp_path: Path) -> None:
    """The summary level (histograms) gives the same per-position counts as the steps."""
    (detailed,) = imported(tmp_path / "d", "vllm-request", "vllm_request_detailed.json")
    (summary,) = imported(tmp_path / "s", "vllm-request", "vllm_request_summary.jsonl")
    assert read_run_json(summary)["granularity"] == "request"
    a = A.count_acceptance_any(steps=read_trace(detailed, "steps"), per_request=False)
    b = A.count_acceptance_any(counters=read_trace(summary, "counters"), per_request=False)
    cols = ["position", "n_reached", "n_accepted"]
    pd.testing.assert_frame_equal(
        a[cols].reset_index(drop=True), b[cols].reset_index(drop=True), check_dtype=False
    )
    totals = read_trace(summary, "totals")
    per_request = totals[totals["scope"] == "request"]
    for _, row in per_request.iterrows():
        mine = read_trace(summary, "counters", filters={"request_id": row["request_id"]})
        assert 1 + mine["n_accepted"].sum() / row["num_drafts"] == pytest.approx(
            row["reported_accept_len"]
        )


def test_vllm_request_stream_and_old_shape(tmp_path: Path) -> None:
    (stream,) = imported(tmp_path / "a", "vllm-request", "vllm_request_stream.sse")
    assert len(read_trace(stream, "requests")) == 1  # the chunks of one request
    (old,) = imported(tmp_path / "b", "vllm-request", "vllm_request_old_shape.json")
    body = json.loads(fixture("vllm_request_old_shape.json").read_text())
    stats = body["choices"][0]["speculative_decoding_stats"]
    counters = read_trace(old, "counters").sort_values("position")
    hist = D.dense_histogram(stats["acceptance_histogram"], size=4)
    assert counters["n_accepted"].tolist() == [hist[1:].sum(), hist[2:].sum(), hist[3:].sum()]
    (length,) = lab_lengths(old)["accept_len"]
    assert length == pytest.approx(stats["mean_acceptance_length"])
    # the old shape carries no timing: null
    assert read_trace(old, "totals")[["ttft_s", "tpot_s", "itl_s"]].isna().all().all()
    lines = fixture("vllm_request_stream.sse").read_text().splitlines()
    chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    final = [c for c in chunks if c.get("metrics")]
    (row,) = read_trace(stream, "totals").query("scope == 'request'").to_dict("records")
    assert row["ttft_s"] == pytest.approx(final[-1]["metrics"]["time_to_first_token_ms"] / 1e3)


def test_sglang_accept_length_is_completion_per_verify(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "sglang", "sglang_generate.jsonl")
    lines = [json.loads(x) for x in fixture("sglang_generate.jsonl").read_text().splitlines()]
    counters = read_trace(run, "counters")
    for line in lines:
        meta = line["meta_info"]
        mine = counters[counters["request_id"] == meta["id"]]
        per_step = 1 + mine["n_accepted"].sum() / meta["spec_verify_ct"]
        assert per_step == pytest.approx(
            1 + meta["spec_num_correct_drafts"] / meta["spec_verify_ct"]
        )
        # SGLang's own number, recomputed; it exceeds the per-step AL by 1 / steps here
        assert meta["spec_accept_length"] == pytest.approx(
            D.completion_per_verify(meta["completion_tokens"], meta["spec_verify_ct"])
        )
        assert meta["spec_accept_length"] - per_step == pytest.approx(1 / meta["spec_verify_ct"])
        assert meta["spec_accept_rate"] == pytest.approx(
            mine["n_accepted"].sum() / meta["spec_num_proposed_drafts"]
        )


def test_specdec_bench_runs_and_profile(tmp_path: Path) -> None:
    written = imported(
        tmp_path,
        "specdec-bench",
        "specdec_acceptance_rate.json",
        "specdec_speculation_profile.json",
    )
    runs = list_runs(tmp_path).set_index("path")
    assert len(written) == 5  # two benchmark runs, the profile, and two accept_length_by_k windows
    entries = json.loads(fixture("specdec_acceptance_rate.json").read_text())
    bench = sorted(str(p) for p in written if "speed" not in str(p))
    for path in bench:
        meta = read_run_json(path)
        entry = entries[int(meta["source"]["part"].split(":")[1])]
        counters = read_trace(path, "counters").sort_values("position")
        steps = sum(entry["Acceptance_Length_Histogram"].values())
        for i, survival in enumerate(counters["n_accepted"] / steps):
            assert survival == pytest.approx(entry["Joint_Acceptance_Rate"][str(i + 2)])
        requests = read_trace(path, "totals")
        per_request = requests[requests["scope"] == "request"]["reported_accept_len"]
        assert per_request.mean() == pytest.approx(entry["Average_AL"])  # per-request mean
    profile = json.loads(fixture("specdec_speculation_profile.json").read_text())
    main = next(p for p in written if "n3" in str(p) and "speed" in str(p))
    (length,) = lab_lengths(main)["accept_len"]
    assert length == pytest.approx(profile["mean_accept_length"], abs=1e-6)  # per step
    assert profile["mean_accept_length_per_request"] != pytest.approx(length, abs=0.01)
    windows = runs[runs["dataset"] == "speed"].sort_values("n")
    assert windows["n"].tolist() == [1, 2, 3]
    by_n = A.compute_acceptance_length_any(
        counters=read_trace(tmp_path / "speed", "counters"),
        totals=read_trace(tmp_path / "speed", "totals"),
        by=("n",),
        n_boot=0,
    ).set_index("n")
    for k, value in profile["accept_length_by_k"].items():
        assert by_n.loc[int(k), "accept_len"] == pytest.approx(value, abs=1e-6)


def test_deepspec_rates_and_calibration(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "deepspec", "deepspec_metrics.json")
    metrics = json.loads(fixture("deepspec_metrics.json").read_text())
    meta = read_run_json(run)
    assert meta["dataset"] == "gsm8k"
    assert meta["num_speculative_tokens"] == 7
    by_position = A.compute_acceptance_by_position_any(
        counters=read_trace(run, "counters"), n_boot=0
    )
    assert set(by_position["source"]) == {"reported rates"}
    np.testing.assert_allclose(by_position["survival"], metrics["spec"]["accept_rates_by_position"])
    (length,) = lab_lengths(run)["accept_len"]
    assert length == pytest.approx(metrics["spec"]["acceptance_length"], abs=8 * 5e-5)
    calibration = read_trace(run, "calibration")
    summary = calibration[calibration["bin"].isna()].sort_values("position")
    assert summary["ece"].tolist() == [p["ece"] for p in metrics["confidence"]["per_position"]]
    assert set(calibration["score"]) == {"prefix_confidence"}
    assert calibration["bin"].notna().sum() == 3 * 7


def test_every_check_is_recorded_with_its_definition(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "vllm-bench", "vllm_bench_result.json")
    checks = read_run_json(run)["checks"]
    assert checks["all_equal"] is True
    assert all(c["definition"] and c["equal"] for c in checks["reported_vs_computed"])


def test_a_contradicting_report_is_flagged_not_hidden(tmp_path: Path) -> None:
    result = json.loads(fixture("vllm_bench_result.json").read_text())
    result["spec_decode_acceptance_length"] += 0.25  # a tool that reports a different AL
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    (run,) = parse_files("vllm-bench", [path])
    bad = {c.quantity for c in run.failed_checks}
    assert "spec_decode_acceptance_length" in bad


def test_reimport_is_skipped_and_overwrite_rewrites(tmp_path: Path) -> None:
    _, first = import_files("deepspec", [fixture("deepspec_metrics.json")], tmp_path)
    _, again = import_files("deepspec", [fixture("deepspec_metrics.json")], tmp_path)
    assert first.written
    assert again.skipped == first.written
    assert not again.written
    _, forced = import_files(
        "deepspec", [fixture("deepspec_metrics.json")], tmp_path, overwrite=True
    )
    assert forced.written == first.written


# -- the definitions module ---------------------------------------------------------------
def test_marginal_and_conditional_round_trip() -> None:
    survival = np.array([0.8, 0.5, 0.2])
    conditional = D.conditional_from_marginal(survival)
    np.testing.assert_allclose(conditional, [0.8, 0.625, 0.4])
    np.testing.assert_allclose(D.marginal_from_conditional(conditional), survival)
    assert D.accept_len_from_marginal(survival) == pytest.approx(2.5)
    assert D.accept_len_from_marginal(survival, bonus=False) == pytest.approx(1.5)
    assert math.isnan(D.conditional_from_marginal([0.0, 0.0])[1])


def test_histogram_conventions() -> None:
    accepted = D.dense_histogram({"1": 40, "2": 30, "3": 30}, offset=1, size=4)  # lengths
    np.testing.assert_allclose(accepted, [40, 30, 30, 0])
    counts = D.counts_from_histogram(accepted, 3)
    assert counts["n_reached"].tolist() == [100, 60, 30]
    assert counts["n_accepted"].tolist() == [60, 30, 0]
    assert D.per_step_accept_len(accepted) == pytest.approx(1.9)
    maps = D.specdec_rates_by_length({1: 40, 2: 30, 3: 30})
    assert maps["joint"] == pytest.approx({1: 1.0, 2: 0.6, 3: 0.3})
    assert maps["conditional"] == pytest.approx({1: 1.0, 2: 0.6, 3: 0.5})
    with pytest.raises(Exception, match="exceeds the window"):
        D.dense_histogram([1, 2, 3, 4, 5], size=4)


def test_per_request_and_per_step_means_differ() -> None:
    """One long good request and one short bad one: the two means disagree."""
    long_request = D.histogram_from_steps([3] * 9 + [0], 3)  # AL 3.7 over 10 steps
    short_request = D.histogram_from_steps([0, 0], 3)  # AL 1.0 over 2 steps
    per_step = D.per_step_accept_len(long_request + short_request)
    per_request = D.per_request_accept_len(
        [D.per_step_accept_len(long_request), D.per_step_accept_len(short_request)]
    )
    assert per_step == pytest.approx(1 + 27 / 12)
    assert per_request == pytest.approx((3.7 + 1.0) / 2)
    assert per_step != pytest.approx(per_request)


def test_counts_from_rates_need_integer_products() -> None:
    assert D.counts_from_marginal_rates([0.5, 0.25], 8).tolist() == [4, 2]
    with pytest.raises(Exception, match="not an integer count"):
        D.counts_from_marginal_rates([0.3333], 8)
    assert D.fraction_from_percent(41.5) == pytest.approx(0.415)
