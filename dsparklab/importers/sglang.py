r"""``sglang``: SGLang's per-request speculative-decoding statistics.

Provenance (sgl-project/sglang): ``TokenizerManager._calculate_spec_decoding_metrics`` in
``python/sglang/srt/managers/tokenizer_manager.py`` (read at 001067ff) fills each request's
``meta_info``; ``spec_tokens_details_from_meta_info`` in
``python/sglang/srt/entrypoints/openai/utils.py`` (PRs #24081 and #33518) copies its
canonical fields into the OpenAI-compatible responses.

Where they are:

- ``/generate``: each response's ``meta_info`` (one JSON object or line per request);
- ``/v1/chat/completions`` and ``/v1/completions`` with ``return_spec_tokens_details:
  true``: the top-level ``sglext.spec_tokens_details`` (one object; for ``n > 1`` a list
  in choice order), in a non-streamed response or, streamed, in a chunk with ``choices:
  []`` after the finish-reason chunks. It holds the canonical names only, 0 and ``[]``
  standing for what ``meta_info`` did not hold. With ``return_meta_info: true`` each choice
  carries its ``meta_info`` too, which is read instead.

The fields (older names in brackets):

- ``spec_verify_ct``: verify steps :math:`D`. Older versions write it (and
  ``spec_accept_rate`` 0.0, ``spec_accept_length`` 0) for every request but the counts
  only when it is > 0; newer ones write nothing then. A request with no verify step
  drafted nothing: it is skipped, and the run's ``source.reported`` counts it;
- ``spec_num_correct_drafts`` (``spec_accepted_drafts``, ``spec_accept_token_num``):
  accepted drafted tokens;
- ``spec_num_proposed_drafts`` (``spec_proposed_drafts``, ``spec_draft_token_num``):
  :math:`D \times` (``speculative_num_draft_tokens`` - 1), full windows even when fewer
  were verified;
- ``spec_accept_rate`` = correct / proposed drafts; ``spec_accept_length`` =
  ``completion_tokens / spec_verify_ct``: bonus included, and the prefill's first token
  too, so it exceeds the per-step AL :math:`1 + \text{correct} / D`;
- ``spec_correct_drafts_histogram`` (``spec_accept_histogram``): :math:`h_j`, the steps
  that accepted exactly ``j`` drafts;
- DSpark's capped (ragged) verification: ``spec_cap_length``, the mean verify window per
  step with the bonus slot (so :math:`D \times` (``spec_cap_length`` - 1) drafted tokens
  were verified); ``spec_cap_lens_histogram[c]``, the steps whose window was ``c``;
  ``spec_block_accept_length`` (cap-accept mode only), kept as reported.

With histograms and full windows each request gets per-position counters (:math:`R_i`,
:math:`A_i`). Under capped verification the totals hold the verified drafted tokens, and
the counters only the pooled survival :math:`s_i = \sum A_i / \sum D` (a step that accepted
its whole capped window did not reach the next position, and no file says which steps
those were). The window ``n`` is ``--n``, else proposed / verify steps, else the
histogram's length - 1.
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
from dsparklab.store.rows import counter_row, totals_row

CORRECT = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
CAP_LENGTH = "spec_cap_length"
CAP_HISTOGRAM = "spec_cap_lens_histogram"
BLOCK_LENGTH = "spec_block_accept_length"
DETAILS = "sglext.spec_tokens_details"


def _stat_objects(source: SourceFile, record: Any, line: int | None) -> list[tuple[Fields, str]]:
    """``(statistics, request id suffix)`` of a response or stream chunk ([] if it has none)."""
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
    sglext = top.value.get("sglext")
    details = sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None
    if isinstance(details, dict):
        return [(Fields(source, details, prefix=DETAILS, line=line), "")]
    if isinstance(details, list):
        return [
            (Fields(source, d, prefix=f"{DETAILS}[{k}]", line=line), f":{k}")
            for k, d in enumerate(details)
        ]
    if isinstance(choices, list) or isinstance(sglext, dict):
        return []  # an OpenAI-style response or chunk without the statistics
    raise source.error(
        "not an SGLang response: no meta_info, sglext or choices", field="meta_info", line=line
    )


def _completion_tokens(record: Any) -> int | None:
    usage = record.get("usage") if isinstance(record, dict) else None
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def import_sglang(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """One run with a totals row (and, with histograms, counters) per request."""
    records = list(numbered_records(sources))
    # a stream sends its usage in a later chunk than sglext: match them by response id
    usage = {
        (source.path, record.value.get("id")): _completion_tokens(record.value)
        for _, source, record in records
        if _completion_tokens(record.value) is not None
    }
    units, without, idle = [], 0, 0
    for index, source, record in records:
        found = _stat_objects(source, record.value, record.line)
        without += not found
        for m, suffix in found:
            if not m.has("spec_verify_ct"):
                without += 1
            elif m.req_int("spec_verify_ct") == 0:
                idle += 1  # no verify step: nothing was drafted
            else:
                top_id = record.value.get("id")
                rid = request_id(source, m.value.get("id") or top_id, index, suffix)
                # one sglext object: the response's only choice, whose usage is the request's
                output = usage.get((source.path, top_id)) if m.prefix == DETAILS else None
                units.append((m, rid, output))
    if not units:
        why = (
            "the server ran without speculative decoding, or the requests did not set "
            "return_spec_tokens_details"
            if without
            else "nothing was drafted"
        )
        raise sources[0].error(
            f"no response carries a verify step ({idle} with spec_verify_ct 0, {without} "
            f"without it): {why}",
            field="meta_info.spec_verify_ct",
        )
    parsed = [_parse(m, rid, output, options) for m, rid, output in units]
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
    for p in parsed:
        hist = p["histogram"]
        if hist is not None and len(hist) > n + 1:
            raise p["fields"].error(
                p["histogram_field"], f"accepted count {len(hist) - 1} exceeds n = {n}"
            )
        p["histogram"] = None if hist is None else np.pad(hist, (0, n + 1 - len(hist)))
        p["drafted"] = p["verified"] if p["verified"] is not None else p["proposed"]
    capped = [p for p in parsed if p["verified"] is not None and p["verified"] < n * p["steps"]]
    tables: dict[str, list[dict[str, Any]]] = {
        "counters": _pooled_survival(parsed, n) if capped else _request_counters(parsed, n),
        "totals": [
            totals_row(
                scope="request",
                request_id=p["request_id"],
                num_drafts=p["steps"],
                num_draft_tokens=p["drafted"],
                num_accepted_tokens=p["correct"],
                num_output_tokens=p["completion"],
                reported_accept_len=p["accept_length"],
                reported_accept_len_definition="completion_per_verify",
                reported_accept_rate=p["accept_rate"],
            )
            for p in parsed
        ],
    }
    steps = sum(p["steps"] for p in parsed)
    correct = sum(p["correct"] for p in parsed)
    completion = [p["completion"] for p in parsed]
    drafted = [p["drafted"] for p in parsed]
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
            num_draft_tokens=sum(d or 0 for d in drafted) if None not in drafted else None,
            num_accepted_tokens=correct,
            num_output_tokens=sum(c or 0 for c in completion) if None not in completion else None,
        )
    )
    if not tables["counters"]:
        del tables["counters"]
    notes = [
        "spec_accept_length counts completion tokens per verify step (prefill's first "
        "token included); the lab's AL is the per-step 1 + accepted / steps",
        "tree drafting (topk > 1): proposed drafts count tree nodes, the histogram "
        "the accepted path's depth",
    ]
    if idle:
        notes.append(f"{idle} request(s) with spec_verify_ct 0 (no verify step) skipped")
    reported: dict[str, Any] = {
        "requests": len(parsed),
        "requests_without_verify_steps (skipped)": idle,
        "records_without_spec_statistics": without,
        "per_step_accept_len (1 + correct / verify steps)": pooled_accept_len(steps, correct),
        "completion_per_verify (pooled)": completion_per_verify(
            sum(c or 0 for c in completion), steps
        )
        if None not in completion
        else None,
    }
    if capped:
        cap = _cap_reported(parsed)
        reported.update(cap)
        notes.append(
            f"capped verification in {len(capped)} request(s): {cap['verified_drafts']} "
            f"drafted tokens verified of the {cap['proposed_drafts']} that "
            "spec_num_proposed_drafts counts (full "
            "windows); the totals hold the verified count and the lab's draft acceptance "
            "is accepted / verified, while spec_accept_rate is accepted / proposed; the "
            "counters hold only the pooled survival s_i (reached counts are unknown)"
        )
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
            reported=reported,
            checks=checks,
            notes=notes,
        )
    ]


def _request_counters(parsed: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Per-request counters from each histogram (every step verified its whole window)."""
    rows: list[dict[str, Any]] = []
    for p in parsed:
        if p["histogram"] is not None:
            rows += histogram_counter_rows(
                p["histogram"],
                n,
                scope="request",
                request_id=p["request_id"],
                drafted_all=p["drafted"] == n * p["steps"],
            )
    return rows


def _pooled_survival(parsed: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """One survival row per position, :math:`\\sum A_i / \\sum D` over the histograms."""
    counted = [p for p in parsed if p["histogram"] is not None]
    if not counted:
        return []
    pooled = np.sum([p["histogram"] for p in counted], axis=0)
    steps = float(pooled.sum())
    return [counter_row(i, survival=float(pooled[i + 1 :].sum()) / steps) for i in range(n)]


def _cap_reported(parsed: list[dict[str, Any]]) -> dict[str, Any]:
    """The cap fields as reported, pooled over the requests that have them."""
    with_cap = [p for p in parsed if p["verified"] is not None]
    steps = sum(p["steps"] for p in with_cap)
    windows = sum(p["verified"] + p["steps"] for p in with_cap)
    histograms = [p["cap_histogram"] for p in with_cap if p["cap_histogram"] is not None]
    blocks = [p for p in with_cap if p["block_length"] is not None]
    width = max((len(h) for h in histograms), default=0)
    return {
        "verified_drafts": sum(p["verified"] for p in with_cap),
        "proposed_drafts": sum(p["proposed"] or 0 for p in with_cap),
        f"{CAP_LENGTH} (pooled: window slots / verify steps)": windows / steps,
        f"{CAP_HISTOGRAM} (summed over requests)": np.sum(
            [np.pad(h, (0, width - len(h))) for h in histograms], axis=0
        )
        .astype(int)
        .tolist()
        if histograms
        else None,
        f"{BLOCK_LENGTH} (mean over requests, weighted by verify steps)": sum(
            p["block_length"] * p["steps"] for p in blocks
        )
        / sum(p["steps"] for p in blocks)
        if blocks
        else None,
    }


def _histogram(m: Fields, name: str) -> np.ndarray | None:
    """A dense histogram field ([] and absent: None, as sglext writes what it lacks)."""
    raw = m.value.get(name)
    if not raw:
        return None
    if not isinstance(raw, (list, dict)):
        raise m.error(name, f"expected a list, got {type(raw).__name__}")
    if isinstance(raw, list) and isinstance(raw[0], list):
        raise m.error(name, "a list of lists: pass one request's statistics per record")
    with m.definition_errors(name):
        return dense_histogram(raw, field=m.name(name))


def _verified(
    m: Fields, steps: int, correct: int, proposed: int | None
) -> tuple[int | None, np.ndarray | None]:
    """Drafted tokens verified under capped verification, and the window histogram.

    Every verify window holds the bonus slot, so the verified drafts are the window slots
    (``spec_cap_length`` x steps, or :math:`\\sum_c c\\, h_c`) less one per step.
    """
    length = m.number(CAP_LENGTH, low=0.0, optional=True) or None  # 0.0: not reported
    hist = _histogram(m, CAP_HISTOGRAM)
    if hist is not None and int(hist.sum()) != steps:
        raise m.error(
            CAP_HISTOGRAM, f"counts sum to {int(hist.sum())}, but spec_verify_ct is {steps}"
        )
    if hist is not None:
        slots = float(np.dot(np.arange(len(hist)), hist))
    elif length is not None:
        slots = length * steps
    else:
        return None, None
    if length is not None and abs(length * steps - slots) > 1e-6 * max(1.0, slots):
        raise m.error(
            CAP_LENGTH,
            f"{length} x spec_verify_ct {steps} = {length * steps}, but {CAP_HISTOGRAM} "
            f"holds {int(slots)} window slots",
        )
    if abs(slots - round(slots)) > 1e-6 * max(1.0, slots):
        raise m.error(CAP_LENGTH, f"{length} x spec_verify_ct {steps} is not a whole count")
    verified = round(slots) - steps
    if verified < correct or (proposed is not None and verified > proposed):
        raise m.error(
            CAP_LENGTH,
            f"{verified} drafts verified, for {correct} correct of {proposed} proposed",
        )
    return verified, hist


def _parse(m: Fields, rid: str, completion: int | None, options: Options) -> dict[str, Any]:
    steps = m.req_int("spec_verify_ct", minimum=1)
    correct_name = m.first_required(*CORRECT)
    correct = m.req_int(correct_name)
    proposed_name = m.first_present(*PROPOSED)
    # sglext writes 0 for a count meta_info did not hold
    proposed = (m.integer(proposed_name, optional=True) if proposed_name else None) or None
    if proposed is not None and correct > proposed:
        raise m.error(correct_name, f"{correct} correct of {proposed} proposed drafts")
    hist_name = m.first_present(*HISTOGRAM) or HISTOGRAM[0]
    hist = _histogram(m, hist_name)
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
    verified, cap_hist = _verified(m, steps, correct, proposed)
    n = options.n
    if n is None and proposed is not None and proposed % steps == 0:
        n = proposed // steps
    if n is None and hist is not None:
        n = len(hist) - 1
    return {
        "fields": m,
        "request_id": rid,
        "steps": steps,
        "correct": correct,
        "proposed": proposed,
        "verified": verified,
        "histogram": hist,
        "histogram_field": hist_name,
        "cap_histogram": cap_hist,
        "block_length": m.number(BLOCK_LENGTH, low=0.0, optional=True) or None,
        "n": n,
        "completion": m.integer("completion_tokens", optional=True)
        if completion is None
        else completion,
        "accept_length": m.number("spec_accept_length", low=0.0, optional=True),
        "accept_rate": m.number("spec_accept_rate", low=0.0, high=1.0, optional=True),
    }
