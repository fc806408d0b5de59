r"""``vllm-bench``: the result file of ``vllm bench serve --save-result``.

Provenance: ``vllm/benchmarks/serve.py`` (vLLM 0.32.0), the ``spec_decode_*`` fields and
the latency means.

``vllm bench serve`` scrapes the server's ``/metrics`` before and after its traffic and
saves the difference: ``spec_decode_num_drafts`` (:math:`D`), ``spec_decode_draft_tokens``,
``spec_decode_accepted_tokens``, ``spec_decode_acceptance_rate`` (accepted / drafted
tokens, **in percent**), ``spec_decode_acceptance_length`` (:math:`1 + \text{accepted} /
D`, bonus included) and ``spec_decode_per_position_acceptance_rates`` (fractions
:math:`s_i = A_i / D`). The per-position counts are recovered exactly as
:math:`A_i = s_i D`. ``--append-result`` writes one JSON object per line: each becomes a
run.

The cost side: the run's ``totals`` carry bench's latency means, in seconds (the file has
milliseconds; :data:`LATENCIES`), as ``calculate_metrics`` in vLLM 0.32's
``vllm/benchmarks/serve.py`` computes them from what its client saw: ``mean_ttft_ms``, the
mean time to the first streamed chunk (queueing and the network included);
``mean_tpot_ms``, the mean over requests with more than one output token of
:math:`(\text{latency} - \text{TTFT}) / (\text{output tokens} - 1)`; ``mean_itl_ms``, the
mean gap between streamed chunks over all requests (a chunk may carry several tokens under
speculative decoding, so it can exceed TPOT). Bench saves them when its
``--percentile-metrics`` name them (``ttft,tpot,itl`` by default); a file without one
leaves that column null, and a run with no completed request leaves all three null (bench
writes 0 there).

The load: ``max_concurrency`` (bench's ``--max-concurrency``, saved as
``result_json["max_concurrency"]`` in ``vllm/benchmarks/serve.py``, vLLM 0.32.0; null when
bench ran without a limit) becomes run.json's ``load.concurrency``, the requests bench's
client kept in flight at most, which the notebooks and ``count`` group runs by; a file
without a limit records no load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsparklab.analysis.definitions import (
    accept_len_from_marginal,
    check,
    counts_from_marginal_rates,
    draft_acceptance_rate,
    fraction_from_percent,
    pooled_accept_len,
)
from dsparklab.importers._common import (
    Fields,
    ImportedRun,
    Options,
    SourceFile,
    imported_engine,
    json_records,
    marginal_counter_rows,
)
from dsparklab.store.rows import totals_row

RATES = "spec_decode_per_position_acceptance_rates"
# bench's latency means (milliseconds) -> the totals column (seconds)
LATENCIES = {"mean_ttft_ms": "ttft_s", "mean_tpot_ms": "tpot_s", "mean_itl_ms": "itl_s"}


def _latencies(f: Fields) -> dict[str, float | None]:
    """The totals' latency columns in seconds (None: not in the file, or nothing completed)."""
    completed = f.integer("completed", optional=True)
    out: dict[str, float | None] = {}
    for key, column in LATENCIES.items():
        value = f.number(key, low=0.0, optional=True)
        out[column] = None if value is None or completed == 0 else value / 1e3
    return out


def _one(
    source: SourceFile, record: Any, line: int | None, index: int, options: Options
) -> ImportedRun:
    f = Fields(source, record, line=line)
    if not f.has("spec_decode_num_drafts"):
        if f.has("completed") or f.has("request_throughput"):
            raise f.error(
                "spec_decode_num_drafts",
                "required field missing: the benchmark saw no speculative decoding (the "
                "server ran without it, or bench could not scrape its /metrics)",
            )
        raise f.error(
            "spec_decode_num_drafts", "required field missing: not a vllm bench serve result"
        )
    drafts = f.req_int("spec_decode_num_drafts", minimum=1)
    draft_tokens = f.req_int("spec_decode_draft_tokens", minimum=1)
    accepted = f.req_int("spec_decode_accepted_tokens")
    if accepted > draft_tokens:
        raise f.error(
            "spec_decode_accepted_tokens", f"{accepted} accepted of {draft_tokens} drafted tokens"
        )
    rate_pct = f.req_float("spec_decode_acceptance_rate", low=0.0, high=100.0)
    length = f.req_float("spec_decode_acceptance_length", low=0.0)
    rates = f.window_rates(RATES, options.n, empty="no per-position counters on the server")
    n = len(rates)
    with f.definition_errors(RATES):
        per_pos = counts_from_marginal_rates(rates, drafts, field=f.name(RATES))
    for i in range(1, n):
        if per_pos[i] > per_pos[i - 1]:
            raise f.error(f"{RATES}[{i}]", "exceeds the previous position's rate: not a survival")
    counters = marginal_counter_rows(drafts, draft_tokens, per_pos)
    latency = _latencies(f)
    totals = [
        totals_row(
            num_drafts=drafts,
            num_draft_tokens=draft_tokens,
            num_accepted_tokens=accepted,
            num_output_tokens=f.integer("total_output_tokens", optional=True),
            reported_accept_len=length,
            reported_accept_len_definition="per_step",
            reported_accept_rate=fraction_from_percent(rate_pct),
            ttft_s=latency["ttft_s"],
            tpot_s=latency["tpot_s"],
            itl_s=latency["itl_s"],
        )
    ]
    checks = [
        check(
            "spec_decode_acceptance_length",
            length,
            pooled_accept_len(drafts, accepted),
            definition="per_step: 1 + spec_decode_accepted_tokens / spec_decode_num_drafts",
        ),
        check(
            "spec_decode_acceptance_length vs per-position rates",
            length,
            accept_len_from_marginal(rates),
            definition="1 + sum_i s_i",
            tolerance=1e-9 * n,
        ),
        check(
            "spec_decode_acceptance_rate (percent -> fraction)",
            fraction_from_percent(rate_pct),
            draft_acceptance_rate(accepted, draft_tokens),
            definition="accepted / drafted tokens",
        ),
        check(
            "spec_decode_accepted_tokens",
            accepted,
            int(per_pos.sum()),
            definition="accepted tokens = sum_i A_i",
        ),
    ]
    model = f.text("model_id") or "unknown"
    # bench's --max-concurrency (null: no limit, nothing to record)
    concurrency = f.integer("max_concurrency", minimum=1, optional=True)
    return ImportedRun(
        fmt="vllm-bench",
        sources=[source],
        granularity="aggregate",
        n=n,
        method=options.method_or_default,
        dataset=options.dataset_or_default,
        engine=imported_engine("vllm", backend=f.text("backend")),
        target={"name": model, "tokenizer": f.text("tokenizer_id")},
        load=None if concurrency is None else {"concurrency": concurrency},
        tables={"counters": counters, "totals": totals},
        reported={
            k: record.get(k)
            for k in (
                "date",
                "label",
                "num_prompts",
                "completed",
                "duration",
                "spec_decode_num_drafts",
                "spec_decode_draft_tokens",
                "spec_decode_accepted_tokens",
                "spec_decode_acceptance_rate",
                "spec_decode_acceptance_length",
                RATES,
                *LATENCIES,
            )
            if k in record
        },
        checks=checks,
        notes=[
            "the counts of the server between bench's two /metrics scrapes (all traffic "
            "the server saw meanwhile, not only bench's)"
        ],
        part=f"{source.path.name}:{index}",
    )


def import_vllm_bench(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """One run per saved result (one per line with ``--append-result``)."""
    runs = []
    for source in sources:
        for index, record in enumerate(json_records(source)):
            runs.append(_one(source, record.value, record.line, index, options))
    return runs
