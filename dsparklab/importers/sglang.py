r"""``sglang``: SGLang's per-request ``meta_info`` speculative-decoding fields.

SGLang's ``/generate`` responses (and the ``meta_info`` its OpenAI-compatible responses
carry per choice) hold, per request:

- ``spec_verify_ct``: verify steps :math:`D`;
- ``spec_num_correct_drafts`` (older: ``spec_accepted_drafts``): accepted drafted tokens;
- ``spec_num_proposed_drafts`` (older: ``spec_proposed_drafts``): :math:`D \times`
  (``speculative_num_draft_tokens`` - 1);
- ``spec_accept_rate`` = correct / proposed drafts (a fraction);
- ``spec_accept_length`` = ``completion_tokens / spec_verify_ct``: bonus included, and the
  prefill's first token too, so it exceeds the per-step AL :math:`1 + \text{correct} / D`;
- ``spec_correct_drafts_histogram`` (older: ``spec_accept_histogram``): :math:`h_j`, the
  steps that accepted exactly ``j`` drafts.

With a histogram each request gets per-position counters (:math:`R_i`, :math:`A_i`); the
window ``n`` is ``--n``, else proposed / verify steps, else the histogram's length - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dsparklab.analysis.definitions import (
    accepted_tokens,
    completion_per_verify,
    dense_histogram,
    draft_acceptance_rate,
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
from dsparklab.store.rows import totals_row

CORRECT = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def _meta_objects(source: SourceFile, record: Any, line: int | None) -> list[tuple[Fields, str]]:
    top = Fields(source, record, line=line)
    if isinstance(top.value.get("meta_info"), dict):
        return [(Fields(source, top.value["meta_info"], prefix="meta_info", line=line), "")]
    choices = top.value.get("choices")
    if isinstance(choices, list):
        found = [
            (Fields(source, c["meta_info"], prefix=f"choices[{k}].meta_info", line=line), f":{k}")
            for k, c in enumerate(choices)
            if isinstance(c, dict) and isinstance(c.get("meta_info"), dict)
        ]
        if found:
            return found
    raise source.error("not an SGLang response: no meta_info", field="meta_info", line=line)


def import_sglang(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """One run with a totals row (and, with histograms, counters) per request."""
    units = []
    skipped = 0
    for index, source, record in numbered_records(sources):
        for m, suffix in _meta_objects(source, record.value, record.line):
            if not m.has("spec_verify_ct"):
                skipped += 1
                continue
            units.append((source, m, suffix, index))
    if not units:
        raise sources[0].error(
            f"no meta_info carries spec_verify_ct ({skipped} without): the server ran "
            "without speculative decoding",
            field="meta_info.spec_verify_ct",
        )
    parsed = [_parse(source, m, suffix, index, options) for source, m, suffix, index in units]
    ns = {p["n"] for p in parsed if p["n"] is not None}
    if len(ns) > 1:
        raise sources[0].error(
            f"requests imply different windows {sorted(ns)}; pass --n (the largest)",
            field="meta_info.spec_num_proposed_drafts",
        )
    if not ns:
        raise sources[0].error(
            "cannot tell the window n (no histogram, no proposed-draft count): pass --n",
            field="meta_info.spec_correct_drafts_histogram",
        )
    n = ns.pop()
    ids = [p["request_id"] for p in parsed]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise sources[0].error(f"request id {dup!r} appears twice", field="meta_info.id")
    tables: dict[str, list[dict[str, Any]]] = {"counters": [], "totals": []}
    for p in parsed:
        fields: Fields = p["fields"]
        hist = p["histogram"]
        if hist is not None:
            if len(hist) > n + 1:
                raise fields.error(
                    p["histogram_field"], f"accepted count {len(hist) - 1} exceeds n = {n}"
                )
            dense = np.zeros(n + 1)
            dense[: len(hist)] = hist
            tables["counters"] += histogram_counter_rows(
                dense,
                n,
                scope="request",
                request_id=p["request_id"],
                drafted_all=p["proposed"] == n * p["steps"] if p["proposed"] is not None else False,
            )
        tables["totals"].append(
            totals_row(
                scope="request",
                request_id=p["request_id"],
                num_drafts=p["steps"],
                num_draft_tokens=p["proposed"],
                num_accepted_tokens=p["correct"],
                num_output_tokens=p["completion"],
                reported_accept_len=p["accept_length"],
                reported_accept_len_definition="completion_per_verify",
                reported_accept_rate=p["accept_rate"],
            )
        )
    steps = sum(p["steps"] for p in parsed)
    correct = sum(p["correct"] for p in parsed)
    completion = [p["completion"] for p in parsed]
    checks = worst_check(
        lambda worst: f"spec_accept_length (worst of {len(parsed)} requests: {worst})",
        [
            (
                p["request_id"],
                p["accept_length"],
                completion_per_verify(p["completion"], p["steps"]),
            )
            for p in parsed
            if p["accept_length"] is not None and p["completion"] is not None
        ],
        definition="completion_per_verify: completion_tokens / spec_verify_ct",
    )
    checks += worst_check(
        lambda worst: f"spec_accept_rate (worst request: {worst})",
        [
            (p["request_id"], p["accept_rate"], draft_acceptance_rate(p["correct"], p["proposed"]))
            for p in parsed
            if p["accept_rate"] is not None and p["proposed"]
        ],
        definition="spec_num_correct_drafts / spec_num_proposed_drafts",
    )
    tables["totals"].append(
        totals_row(
            num_drafts=steps,
            num_draft_tokens=sum(p["proposed"] or 0 for p in parsed)
            if all(p["proposed"] is not None for p in parsed)
            else None,
            num_accepted_tokens=correct,
            num_output_tokens=sum(completion) if all(c is not None for c in completion) else None,
        )
    )
    if not tables["counters"]:
        del tables["counters"]
    return [
        ImportedRun(
            fmt="sglang",
            sources=sources,
            granularity="request",
            n=n,
            method=options.method_or_default,
            dataset=options.dataset_or_default,
            engine=imported_engine("sglang"),
            tables=tables,
            reported={
                "requests": len(parsed),
                "meta_info_without_spec_fields": skipped,
                "per_step_accept_len (1 + correct / verify steps)": pooled_accept_len(
                    steps, correct
                ),
                "completion_per_verify (pooled)": completion_per_verify(
                    sum(c or 0 for c in completion), steps
                )
                if all(c is not None for c in completion)
                else None,
            },
            checks=checks,
            notes=[
                "spec_accept_length counts completion tokens per verify step (prefill's first "
                "token included); the lab's AL is the per-step 1 + accepted / steps",
                "tree drafting (topk > 1): proposed drafts count tree nodes, the histogram "
                "the accepted path's depth",
            ],
        )
    ]


def _parse(
    source: SourceFile, m: Fields, suffix: str, index: int, options: Options
) -> dict[str, Any]:
    steps = m.req_int("spec_verify_ct")
    correct_name = m.first_required(*CORRECT)
    correct = m.req_int(correct_name)
    proposed_name = m.first_present(*PROPOSED)
    proposed = m.integer(proposed_name, optional=True) if proposed_name else None
    if proposed is not None and correct > proposed:
        raise m.error(correct_name, f"{correct} correct of {proposed} proposed drafts")
    hist_name = m.first_present(*HISTOGRAM)
    hist = None
    if hist_name is not None:
        raw = m.value[hist_name]
        if not isinstance(raw, (list, dict)):
            raise m.error(hist_name, f"expected a list, got {type(raw).__name__}")
        if isinstance(raw, list) and raw and isinstance(raw[0], list):
            raise m.error(hist_name, "a list of lists: pass one request's meta_info per record")
        with m.definition_errors(hist_name):
            hist = dense_histogram(raw, field=m.name(hist_name)) if raw else None
        if hist is not None:
            if int(hist.sum()) != steps:
                raise m.error(
                    hist_name, f"counts sum to {int(hist.sum())}, but spec_verify_ct is {steps}"
                )
            if int(accepted_tokens(hist)) != correct:
                raise m.error(
                    correct_name,
                    f"{correct}, but the histogram's sum_j j h_j is {int(accepted_tokens(hist))}",
                )
    n = options.n
    if n is None and proposed is not None and steps and proposed % steps == 0:
        n = proposed // steps
    if n is None and hist is not None:
        n = len(hist) - 1
    return {
        "fields": m,
        "request_id": request_id(source, m.value.get("id"), index, suffix),
        "steps": steps,
        "correct": correct,
        "proposed": proposed,
        "histogram": hist,
        "histogram_field": hist_name,
        "n": n,
        "completion": m.integer("completion_tokens", optional=True),
        "accept_length": m.number("spec_accept_length", low=0.0, optional=True),
        "accept_rate": m.number("spec_accept_rate", low=0.0, high=1.0, optional=True),
    }
