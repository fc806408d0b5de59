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
from dsparklab.errors import DSparkLabError
from dsparklab.importers import import_files, parse_files
from dsparklab.store import list_runs, read_run_json, read_trace, validate_trace
from tests.oracles import count_acceptance_from_steps

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
    return A.compute_acceptance_length(
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
    survival = A.compute_acceptance_by_position(counters=read_trace(bench, "counters"), n_boot=0)[
        "survival"
    ]
    np.testing.assert_allclose(survival, result["spec_decode_per_position_acceptance_rates"])
    # the cost side: bench's latency means, milliseconds -> seconds
    (row,) = totals.to_dict("records")
    for column, key in (("ttft_s", "mean_ttft_ms"), ("tpot_s", "mean_tpot_ms")):
        assert row[column] == pytest.approx(result[key] / 1e3)
    assert row["itl_s"] == pytest.approx(result["mean_itl_ms"] / 1e3)
    # the fixture's chunks carry up to 4 tokens: a chunk gap (ITL) exceeds the per-token TPOT
    assert row["itl_s"] > row["tpot_s"] > 0
    # bench's --max-concurrency is the run's load, which the readers join onto every row
    assert read_run_json(bench)["load"] == {"concurrency": result["max_concurrency"]}
    assert set(read_trace(bench, "counters")["concurrency"]) == {result["max_concurrency"]}


def test_vllm_bench_without_a_concurrency_limit_records_no_load(tmp_path: Path) -> None:
    result = json.loads(fixture("vllm_bench_result.json").read_text())
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**result, "max_concurrency": None}))
    (run,) = parse_files("vllm-bench", [path])
    assert "load" not in run.run_json()
    path.write_text(json.dumps({**result, "max_concurrency": "four"}))
    with pytest.raises(DSparkLabError, match="max_concurrency"):
        parse_files("vllm-bench", [path])


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
    return count_acceptance_from_steps(steps, by=("request_id",))


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


def test_vllm_request_chat_prompt_ids_are_top_level(tmp_path: Path) -> None:
    """A chat completion (vLLM's ChatCompletionResponse) has prompt_token_ids beside its
    choices, not in them."""
    body = json.loads(fixture("vllm_request_chat.json").read_text())
    assert "prompt_token_ids" not in body["choices"][0]
    (run,) = imported(tmp_path, "vllm-request", "vllm_request_chat.json")
    (request,) = read_trace(run, "requests").to_dict("records")
    assert list(request["prompt_token_ids"]) == body["prompt_token_ids"]


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


def test_sglang_openai_sglext_spec_tokens_details(tmp_path: Path) -> None:
    """Chat completions with return_spec_tokens_details: sglext.spec_tokens_details (one
    object, or one per choice), non-streamed and on a stream's sglext chunk."""
    (run,) = imported(tmp_path / "a", "sglang", "sglang_chat_sglext.json")
    single, pair = json.loads(fixture("sglang_chat_sglext.json").read_text())
    details = {
        "chatcmpl-1": single["sglext"]["spec_tokens_details"],
        "chatcmpl-2:0": pair["sglext"]["spec_tokens_details"][0],
        "chatcmpl-2:1": pair["sglext"]["spec_tokens_details"][1],
    }
    totals = read_trace(run, "totals").query("scope == 'request'").set_index("request_id")
    counters = read_trace(run, "counters")
    for rid, d in details.items():
        assert totals.loc[rid, "num_drafts"] == d["spec_verify_ct"]
        assert totals.loc[rid, "num_accepted_tokens"] == d["spec_num_correct_drafts"]
        assert totals.loc[rid, "num_draft_tokens"] == d["spec_num_proposed_drafts"]
        mine = counters[counters["request_id"] == rid].sort_values("position")
        hist = np.asarray(d["spec_correct_drafts_histogram"])
        assert mine["n_accepted"].tolist() == [hist[i + 1 :].sum() for i in range(3)]
    # n = 1: the response's usage is the request's; n = 2: usage sums the choices
    assert totals.loc["chatcmpl-1", "num_output_tokens"] == single["usage"]["completion_tokens"]
    assert totals.loc[["chatcmpl-2:0", "chatcmpl-2:1"], "num_output_tokens"].isna().all()

    (stream,) = imported(tmp_path / "b", "sglang", "sglang_chat_stream.sse")
    chunks = [
        json.loads(line[6:])
        for line in fixture("sglang_chat_stream.sse").read_text().splitlines()
        if line.startswith("data: {")
    ]
    (sglext,) = [c["sglext"]["spec_tokens_details"] for c in chunks if c.get("sglext")]
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    (row,) = read_trace(stream, "totals").query("scope == 'request'").to_dict("records")
    assert row["request_id"] == "chatcmpl-3"
    assert row["num_drafts"] == sglext["spec_verify_ct"]
    assert row["num_accepted_tokens"] == sglext["spec_num_correct_drafts"]
    assert row["num_output_tokens"] == usage["completion_tokens"]
    assert row["reported_accept_len"] == sglext["spec_accept_length"]


def test_sglang_zero_verify_requests_are_skipped_and_counted(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "sglang", "sglang_zero_verify.jsonl")
    metas = [json.loads(x)["meta_info"] for x in fixture("sglang_zero_verify.jsonl").open()]
    assert metas[3]["spec_verify_ct"] == 0 and "spec_accept_token_num" not in metas[3]
    totals = read_trace(run, "totals").query("scope == 'request'").set_index("request_id")
    assert sorted(totals.index) == ["old-0", "old-1", "old-2"]
    for m in metas[:3]:
        assert totals.loc[m["id"], "num_accepted_tokens"] == m["spec_accept_token_num"]
        assert totals.loc[m["id"], "num_draft_tokens"] == m["spec_draft_token_num"]
    meta = read_run_json(run)
    assert meta["num_speculative_tokens"] == 3  # spec_draft_token_num / spec_verify_ct
    assert meta["source"]["reported"]["requests_without_verify_steps (skipped)"] == 1
    assert any("spec_verify_ct 0" in note for note in meta["source"]["notes"])


def test_sglang_capped_verification_records_verified_drafts(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "sglang", "sglang_capped.jsonl")
    metas = [json.loads(x)["meta_info"] for x in fixture("sglang_capped.jsonl").open()]
    totals = read_trace(run, "totals").query("scope == 'request'").set_index("request_id")
    verified_total = 0
    for m in metas:
        windows = m["spec_cap_lens_histogram"]
        verified = sum(c * k for c, k in enumerate(windows)) - m["spec_verify_ct"]
        assert verified == pytest.approx(m["spec_verify_ct"] * (m["spec_cap_length"] - 1))
        assert verified < m["spec_num_proposed_drafts"]
        assert totals.loc[m["id"], "num_draft_tokens"] == verified
        verified_total += verified
    meta = read_run_json(run)
    reported = meta["source"]["reported"]
    assert reported["verified_drafts"] == verified_total
    assert reported["proposed_drafts"] == sum(m["spec_num_proposed_drafts"] for m in metas)
    summed = np.sum(
        [np.pad(h, (0, 5 - len(h))) for h in (m["spec_cap_lens_histogram"] for m in metas)], axis=0
    )
    assert reported["spec_cap_lens_histogram (summed over requests)"] == summed.tolist()
    notes = " ".join(meta["source"]["notes"])
    assert f"{verified_total} drafted tokens verified of the" in notes
    # reached counts are unknown under capped windows: the pooled survival only
    counters = read_trace(run, "counters").sort_values("position")
    assert counters["n_reached"].isna().all() and (counters["scope"] == "run").all()
    hist = np.sum([m["spec_correct_drafts_histogram"] for m in metas], axis=0)
    steps = sum(m["spec_verify_ct"] for m in metas)
    assert counters["survival"].tolist() == pytest.approx(
        [hist[i + 1 :].sum() / steps for i in range(3)]
    )
    (length,) = lab_lengths(run)["accept_len"]
    assert length == pytest.approx(1 + sum(m["spec_num_correct_drafts"] for m in metas) / steps)


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
    by_n = A.compute_acceptance_length(
        counters=read_trace(tmp_path, "counters", filters={"dataset": "speed"}),
        totals=read_trace(tmp_path, "totals", filters={"dataset": "speed"}),
        by=("n",),
        n_boot=0,
    ).set_index("n")
    for k, value in profile["accept_length_by_k"].items():
        assert by_n.loc[int(k), "accept_len"] == pytest.approx(value, abs=1e-6)


def _ece(pred: object, target: object, weight: object) -> float:
    """DeepSpec's ECE from reliability bins: sum_b |pred_b - target_b| w_b / sum_b w_b."""
    p, t, w = (np.asarray(x, dtype=np.float64) for x in (pred, target, weight))
    return float((np.abs(p - t) * w).sum() / w.sum())


def test_deepspec_counts_and_calibration(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "deepspec", "deepspec_metrics.json")
    metrics = json.loads(fixture("deepspec_metrics.json").read_text())
    spec, confidence = metrics["spec"], metrics["confidence"]
    meta = read_run_json(run)
    assert (meta["dataset"], meta["num_speculative_tokens"]) == ("gsm8k", 7)
    assert meta["source"]["reported"]["proposal_count"] == confidence["proposal_count"] == 271
    # every proposal offered all 7 positions: A_i = rate_i x proposal_count
    counters = read_trace(run, "counters").sort_values("position")
    proposals = confidence["proposal_count"]
    np.testing.assert_allclose(
        counters["n_accepted"] / proposals, spec["accept_rates_by_position"], rtol=0, atol=1e-12
    )
    assert counters["n_drafted"].tolist() == [proposals] * 7
    by_position = A.compute_acceptance_by_position(counters=counters, n_boot=0)
    assert set(by_position["source"]) == {"counts"}
    (length,) = lab_lengths(run)["accept_len"]
    assert length == pytest.approx(spec["acceptance_length"], abs=1e-12)  # no EOS round
    calibration = read_trace(run, "calibration")
    summary = calibration[calibration["bin"].isna()].sort_values("position")
    written = confidence["per_position"]
    assert summary["ece"].tolist() == [p["ece"] for p in written]
    assert summary["count"].tolist() == [p["total_weight"] for p in written]
    bins = calibration[calibration["bin"].notna()].sort_values(["position", "bin"])
    in_file = [(p["position"], b["bin"], *b["range"]) for p in written for b in p["reliability"]]
    stored = bins[["position", "bin", "bin_lo", "bin_hi"]].itertuples(index=False)
    assert [(int(p), int(b), lo, hi) for p, b, lo, hi in stored] == in_file
    assert set(calibration["score"]) == {"prefix_confidence"}


def test_deepspec_bins_keep_their_index_and_edges(tmp_path: Path) -> None:
    """A position whose only non-empty bins are 13 and 17 imports with those bins, their
    range edges, and an ECE equal to the one recomputed from them."""
    metrics = json.loads(fixture("deepspec_metrics.json").read_text())
    position = metrics["confidence"]["per_position"][3]
    total = position["total_weight"]
    position["reliability"] = [
        {"bin": 13, "range": [0.65, 0.7], "avg_pred": 0.671, "avg_target": 0.52, "weight": 68.0},
        {"bin": 17, "range": [0.85, 0.9], "avg_pred": 0.862, "avg_target": 0.9, "weight": 203.0},
    ]
    assert total == 271.0
    written = pd.DataFrame(position["reliability"])
    position["ece"] = _ece(written["avg_pred"], written["avg_target"], written["weight"])
    path = tmp_path / "artifacts" / "step_2000" / "gsm8k" / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(metrics))
    _, result = import_files("deepspec", [path], tmp_path / "runs")
    (run,) = result.written
    calibration = read_trace(run, "calibration")
    at3 = calibration[calibration["position"] == 3]
    bins = at3[at3["bin"].notna()].sort_values("bin")
    assert bins["bin"].tolist() == [13, 17]
    assert bins[["bin_lo", "bin_hi"]].to_numpy().tolist() == [[0.65, 0.7], [0.85, 0.9]]
    (ece,) = at3.loc[at3["bin"].isna(), "ece"]
    assert ece == pytest.approx(_ece(bins["pred_mean"], bins["target_mean"], bins["count"]))
    checks = read_run_json(run)["checks"]
    assert checks["all_equal"], checks
    # a file whose ECE its bins do not give is imported with the difference flagged
    position["ece"] += 0.01
    path.write_text(json.dumps(metrics))
    (parsed,) = parse_files("deepspec", [path])
    assert [c.quantity for c in parsed.failed_checks] == [
        "confidence ece vs its reliability bins (worst position: 3)"
    ]


def test_deepspec_empty_positions_keep_rates_only(tmp_path: Path) -> None:
    (run,) = imported(tmp_path, "deepspec", "deepspec_metrics_short.json")
    metrics = json.loads(fixture("deepspec_metrics_short.json").read_text())
    assert metrics["spec"]["accept_rates_by_position"][5:] == [None, None]
    counters = read_trace(run, "counters").sort_values("position")
    assert counters["position"].tolist() == [0, 1, 2, 3, 4]
    assert counters["n_accepted"].isna().all()
    assert counters["survival"].tolist() == metrics["spec"]["accept_rates_by_position"][:5]
    calibration = read_trace(run, "calibration")
    empty = calibration[calibration["position"] >= 5]
    assert empty["bin"].isna().all() and empty["count"].tolist() == [0.0, 0.0]
    assert empty[["ece", "auroc", "brier", "pred_mean", "target_mean"]].isna().all().all()
    # every offered position was accepted: no negatives, so DeepSpec's AUC is NaN
    assert calibration["auroc"].isna().all()
    notes = " ".join(read_run_json(run)["source"]["notes"])
    assert "rates only" in notes


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
