r"""``vllm-request``: vLLM's per-request ``metrics.speculative_decoding`` in responses.

Provenance: ``RequestSpecDecodeMetrics.to_dict`` in ``vllm/v1/metrics/stats.py`` (vLLM
0.32.0); the older per-choice shape and the chat ``prompt_token_ids``: below.

A server started with ``--per-request-spec-decode-metrics summary`` adds to each
``/v1/completions`` or ``/v1/chat/completions`` response (``n == 1`` only; null for
``n > 1``; in a stream, on the final usage chunk)::

    "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 1 + accepted / steps,      # per step, bonus included
        "draft_acceptance_rate": accepted / drafted tokens,  # fraction
        "acceptance_histogram": [h_0, ..., h_n],             # dense; j = accepted drafts
        "num_spec_steps": D, "num_accepted_draft_tokens": sum_j j h_j,
        "num_draft_tokens": sum_d k_d, "num_spec_tokens": n}}

``detailed`` adds ``per_step_accepted`` and ``per_step_drafted`` (one entry per verify
step, in order): those runs get one ``steps`` row per verify step (granularity ``step``);
``summary`` runs get per-request counters from the histogram (:math:`R_i = \sum_{j \ge i}
h_j`, :math:`A_i = \sum_{j > i} h_j`; granularity ``request``). The older shape is read
too: a per-choice ``speculative_decoding_stats`` object (``--per-request-spec-decode-stats``)
whose histogram is a sparse mapping with string keys, as vLLM's
``docs/features/speculative_decoding/acceptance_metrics.md`` documented it at cd199986
(PR #48915, before the stats moved to ``metrics``). Files: one response, a JSON list, JSON
Lines or a saved server-sent-event stream. The prompt's ``prompt_token_ids`` are per choice
in a completion and at the top level in a chat completion (``ChatCompletionResponse``,
``vllm/entrypoints/openai/chat_completion/protocol.py``, vLLM 0.32.0).

The cost side, where the server sends it (``--enable-per-request-metrics``): beside
``speculative_decoding`` the response's ``metrics`` (``PerRequestMetrics``,
``vllm/entrypoints/generate/base/protocol.py``, built by
``build_per_request_timing_metrics`` in ``vllm/entrypoints/generate/base/serving.py``
from the engine's timestamps) has ``time_to_first_token_ms`` (first token - scheduled:
no queue wait, no network) and ``mean_itl_ms`` ((last token - first token) / (completion
tokens - 1), null for one token): a time per output token after the first, which the
totals call ``tpot_s``; ``itl_s`` stays null (the response has no per-chunk gaps). Each
request's totals row carries them in seconds; the run's row the means over the requests
that have them (as ``vllm bench serve`` averages over requests). Older servers and the
old shape send none: null.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsparklab.analysis.definitions import (
    Check,
    accepted_tokens,
    check,
    dense_histogram,
    histogram_from_steps,
    per_request_accept_len,
    per_step_accept_len,
    pooled_accept_len,
)
from dsparklab.importers._common import (
    Fields,
    ImportedRun,
    Options,
    SourceFile,
    histogram_counter_rows,
    imported_engine,
    numbered_records,
    request_id,
    worst_check,
)
from dsparklab.store.rows import emitted_tokens, totals_row

METRICS = "metrics.speculative_decoding"
OLD = "speculative_decoding_stats"
# the response's timing (``metrics``, milliseconds) -> the totals column (seconds)
TIMING = {"time_to_first_token_ms": "ttft_s", "mean_itl_ms": "tpot_s"}


@dataclass
class RequestMetrics:
    """One request's spec-decode metrics, checked for consistency."""

    request_id: str
    source: SourceFile
    line: int | None
    n: int
    histogram: np.ndarray
    steps: int
    accepted: int
    draft_tokens: int
    mean_al: float | None
    rate: float | None
    per_step_accepted: list[int] | None
    per_step_drafted: list[int] | None
    prompt_tokens: int | None
    completion_tokens: int | None
    prompt_token_ids: list[int] | None
    output_token_ids: list[int] | None
    text: str | None
    model: str | None
    timing: dict[str, float | None]  # TIMING's columns, seconds (None: not sent)


def _metrics_objects(
    source: SourceFile, record: Any, line: int | None
) -> tuple[list[tuple[Fields, str, Fields]], bool]:
    """``(response fields, request id suffix, metrics fields)`` for each unit of a record.

    The second value tells whether the record is a response that carries no metrics
    (null for n > 1, or a stream chunk before the last).
    """
    top = Fields(source, record, line=line)
    metrics = top.value.get("metrics")
    if isinstance(metrics, dict) and metrics.get("speculative_decoding") is not None:
        return [
            (top, "", Fields(source, metrics["speculative_decoding"], prefix=METRICS, line=line))
        ], False
    choices = top.value.get("choices")
    old = []
    if isinstance(choices, list):
        for k, choice in enumerate(choices):
            if isinstance(choice, dict) and choice.get(OLD) is not None:
                old.append(
                    (
                        top,
                        f":{choice.get('index', k)}",
                        Fields(source, choice[OLD], prefix=f"choices[{k}].{OLD}", line=line),
                    )
                )
    if old:
        return old, False
    if "choices" in top.value or "usage" in top.value or "object" in top.value:
        return [], True
    raise source.error(
        "not a vLLM response: no choices, usage or metrics.speculative_decoding",
        field=METRICS,
        line=line,
    )


def _parse(source: SourceFile, top: Fields, suffix: str, m: Fields, index: int) -> RequestMetrics:
    n = m.req_int("num_spec_tokens", minimum=1)
    raw = m.value.get("acceptance_histogram")
    if raw is None:
        raise m.error("acceptance_histogram", "required field missing")
    if not isinstance(raw, (list, dict)):
        raise m.error(
            "acceptance_histogram", f"expected a list or an object, got {type(raw).__name__}"
        )
    with m.definition_errors("acceptance_histogram"):
        hist = dense_histogram(raw, size=n + 1, field=m.name("acceptance_histogram"))
    if np.any(hist != np.round(hist)):
        raise m.error("acceptance_histogram", "counts must be integers")
    steps = m.req_int(m.first_required("num_spec_steps", "num_drafts"))
    accepted = m.req_int(m.first_required("num_accepted_draft_tokens", "num_accepted_tokens"))
    draft_tokens = m.req_int("num_draft_tokens")
    if int(hist.sum()) != steps:
        raise m.error(
            "acceptance_histogram",
            f"counts sum to {int(hist.sum())}, but num_spec_steps is {steps}",
        )
    if int(accepted_tokens(hist)) != accepted:
        raise m.error(
            "num_accepted_draft_tokens",
            f"{accepted}, but the histogram's sum_j j h_j is {int(accepted_tokens(hist))}",
        )
    if accepted > draft_tokens:
        raise m.error(
            "num_accepted_draft_tokens", f"{accepted} accepted of {draft_tokens} drafted tokens"
        )
    per_acc = m.counts("per_step_accepted", optional=True)
    per_dra = m.counts("per_step_drafted", optional=True)
    if (per_acc is None) != (per_dra is None):
        missing = "per_step_drafted" if per_dra is None else "per_step_accepted"
        raise m.error(missing, "required with its per-step twin (the detailed level has both)")
    if per_acc is not None and per_dra is not None:
        if len(per_acc) != steps or len(per_dra) != steps:
            raise m.error(
                "per_step_accepted", f"{len(per_acc)} / {len(per_dra)} entries for {steps} steps"
            )
        for k, (a, d) in enumerate(zip(per_acc, per_dra, strict=True)):
            if not 0 <= a <= d <= n:
                raise m.error(
                    f"per_step_accepted[{k}]", f"need 0 <= accepted {a} <= drafted {d} <= n {n}"
                )
        if not np.array_equal(histogram_from_steps(per_acc, n), hist):
            raise m.error("per_step_accepted", "its histogram differs from acceptance_histogram")
        if sum(per_dra) != draft_tokens:
            raise m.error(
                "per_step_drafted",
                f"sums to {sum(per_dra)}, but num_draft_tokens is {draft_tokens}",
            )
    raw_usage = top.value.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    choice = {}
    choices = top.value.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
    text = choice.get("text")
    if text is None and isinstance(choice.get("message"), dict):
        text = choice["message"].get("content")
    timing: dict[str, float | None] = dict.fromkeys(TIMING.values())
    raw_metrics = top.value.get("metrics")
    if isinstance(raw_metrics, dict):
        times = Fields(source, raw_metrics, prefix="metrics", line=top.line)
        for key, column in TIMING.items():
            if times.has(key) and raw_metrics[key] is not None:
                timing[column] = times.req_float(key, low=0.0) / 1e3
    return RequestMetrics(
        request_id=request_id(source, top.value.get("id"), index, suffix),
        source=source,
        line=m.line,
        n=n,
        histogram=hist.astype(np.int64),
        steps=steps,
        accepted=accepted,
        draft_tokens=draft_tokens,
        mean_al=m.number("mean_acceptance_length", low=0.0, optional=True),
        rate=m.number("draft_acceptance_rate", low=0.0, high=1.0, optional=True),
        per_step_accepted=per_acc,
        per_step_drafted=per_dra,
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        # chat responses carry the prompt's ids at the top level, completions per choice
        prompt_token_ids=_ints_or_none(top.value.get("prompt_token_ids"))
        or _ints_or_none(choice.get("prompt_token_ids")),
        output_token_ids=_ints_or_none(choice.get("token_ids")),
        text=text if isinstance(text, str) else None,
        model=top.value.get("model") if isinstance(top.value.get("model"), str) else None,
        timing=timing,
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _ints_or_none(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return [int(v) for v in value]
    return None


def read_requests(sources: Sequence[SourceFile]) -> tuple[list[RequestMetrics], int]:
    """Every request with metrics in ``sources``, and how many responses had none."""
    requests: list[RequestMetrics] = []
    without = 0
    for index, source, record in numbered_records(sources):
        units, bare = _metrics_objects(source, record.value, record.line)
        without += int(bare)
        for top, suffix, m in units:
            requests.append(_parse(source, top, suffix, m, index))
    if not requests:
        raise sources[0].error(
            f"no response carries {METRICS} ({without} responses without): start the server "
            "with --per-request-spec-decode-metrics summary|detailed and send n = 1 requests",
            field=METRICS,
        )
    seen: dict[str, RequestMetrics] = {}
    for req in requests:
        if req.request_id in seen:
            raise req.source.error(
                f"request id {req.request_id!r} appears twice", field="id", line=req.line
            )
        seen[req.request_id] = req
    ns = {r.n for r in requests}
    if len(ns) > 1:
        first = next(r for r in requests if r.n != requests[0].n)
        raise first.source.error(
            f"num_spec_tokens {first.n} differs from {requests[0].n} in other responses "
            "(several servers?)",
            field=f"{METRICS}.num_spec_tokens",
            line=first.line,
        )
    return requests, without


def import_vllm_request(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """One run from every response: per-step rows (``detailed``) or per-request counters."""
    requests, without = read_requests(sources)
    n = requests[0].n
    if options.n is not None and options.n != n:
        raise requests[0].source.error(
            f"--n {options.n} but the responses say num_spec_tokens {n}",
            field=f"{METRICS}.num_spec_tokens",
            line=requests[0].line,
        )
    detailed = all(r.per_step_accepted is not None for r in requests)
    dataset = options.dataset_or_default
    tables: dict[str, list[dict[str, Any]]] = {"totals": [], "requests": []}
    if detailed:
        tables["steps"] = []
    else:
        tables["counters"] = []
    for req in requests:
        tables["requests"].append(
            {
                "request_id": req.request_id,
                "prompt_id": req.request_id,
                "dataset": dataset,
                "prompt_token_ids": req.prompt_token_ids,
                "output_token_ids": req.output_token_ids,
                "output_text": req.text,
                "wall_time_s": None,
            }
        )
        tables["totals"].append(
            totals_row(
                scope="request",
                request_id=req.request_id,
                num_drafts=req.steps,
                num_draft_tokens=req.draft_tokens,
                num_accepted_tokens=req.accepted,
                num_output_tokens=req.completion_tokens,
                reported_accept_len=req.mean_al,
                reported_accept_len_definition="per_step",
                reported_accept_rate=req.rate,
                ttft_s=req.timing["ttft_s"],
                tpot_s=req.timing["tpot_s"],
            )
        )
        if detailed:
            assert req.per_step_accepted is not None
            assert req.per_step_drafted is not None
            context = None if req.prompt_tokens is None else req.prompt_tokens + 1
            # completion_tokens is the output the server returned: each step's share of it
            emitted = emitted_tokens(req.per_step_accepted, req.completion_tokens)
            for step, (a, d) in enumerate(
                zip(req.per_step_accepted, req.per_step_drafted, strict=True)
            ):
                tables["steps"].append(
                    {
                        "request_id": req.request_id,
                        "prompt_id": req.request_id,
                        "dataset": dataset,
                        "step": step,
                        "context_len": context,
                        "num_drafted": d,
                        "num_verified": d,
                        "accepted_len": a,
                        "emitted": emitted[step],
                        "draft_time_s": None,
                        "verify_time_s": None,
                    }
                )
                if context is not None:
                    context += a + 1
        else:
            tables["counters"] += histogram_counter_rows(
                req.histogram,
                n,
                scope="request",
                request_id=req.request_id,
                drafted_all=req.draft_tokens == n * req.steps,
            )
    total_steps = sum(r.steps for r in requests)
    total_accepted = sum(r.accepted for r in requests)
    total_drafted = sum(r.draft_tokens for r in requests)
    if total_steps == 0:
        raise requests[0].source.error(
            "no verify steps in any response: nothing to import", field=f"{METRICS}.num_spec_steps"
        )
    timing = _mean_timing(requests)
    tables["totals"].append(
        totals_row(
            num_drafts=total_steps,
            num_draft_tokens=total_drafted,
            num_accepted_tokens=total_accepted,
            ttft_s=timing["ttft_s"],
            tpot_s=timing["tpot_s"],
        )
    )
    checks = _checks(requests)
    notes = [f"{len(requests)} requests ({'detailed' if detailed else 'summary'} level)"]
    if without:
        notes.append(f"{without} responses carried no {METRICS} (n > 1, or stream chunks)")
    if not detailed and any(r.draft_tokens != n * r.steps for r in requests):
        notes.append(
            "some steps drafted fewer than n tokens: per-request reached counts from the "
            "histogram assume every step could reach every position"
        )
    per_request = [r.mean_al for r in requests if r.mean_al is not None and r.steps]
    return [
        ImportedRun(
            fmt="vllm-request",
            sources=sources,
            granularity="step" if detailed else "request",
            n=n,
            method=options.method_or_default,
            dataset=dataset,
            engine=imported_engine("vllm"),
            target={"name": next((r.model for r in requests if r.model), "unknown")},
            tables=tables,
            reported={
                "requests": len(requests),
                "responses_without_metrics": without,
                "per_step_accept_len (pooled over steps)": pooled_accept_len(
                    total_steps, total_accepted
                ),
                "per_request_accept_len (mean of mean_acceptance_length)": per_request_accept_len(
                    per_request
                ),
                "acceptance_histogram (summed)": [
                    int(v) for v in np.sum([r.histogram for r in requests], axis=0)
                ],
            },
            checks=checks,
            notes=notes,
        )
    ]


def _mean_timing(requests: Sequence[RequestMetrics]) -> dict[str, float | None]:
    """The run's timing columns: each the mean over the requests that carry it."""
    out: dict[str, float | None] = {}
    for column in TIMING.values():
        values = [v for r in requests if (v := r.timing[column]) is not None]
        out[column] = float(np.mean(values)) if values else None
    return out


def _checks(requests: Sequence[RequestMetrics]) -> list[Check]:
    """The responses' own AL and rate, recomputed from their counts (worst request shown)."""
    out = worst_check(
        lambda worst: f"mean_acceptance_length (worst of {len(requests)} requests: {worst})",
        [
            (r.request_id, r.mean_al, per_step_accept_len(r.histogram))
            for r in requests
            if r.mean_al is not None and r.steps
        ],
        definition="per_step: 1 + sum_j j h_j / sum_j h_j",
    )
    out += worst_check(
        lambda worst: f"draft_acceptance_rate (worst request: {worst})",
        [
            (r.request_id, r.rate, r.accepted / r.draft_tokens)
            for r in requests
            if r.rate is not None and r.draft_tokens
        ],
        definition="num_accepted_draft_tokens / num_draft_tokens",
    )
    no_steps = [r for r in requests if not r.steps and r.mean_al is not None]
    if no_steps:
        out.append(
            check(
                "mean_acceptance_length of requests without verify steps",
                no_steps[0].mean_al,
                1.0,
                definition="vLLM reports 1.0 when a request had no verify step",
                note="such requests contribute no counts",
            )
        )
    return out
