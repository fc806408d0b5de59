r"""``vllm-metrics``: vLLM's speculative-decoding counters from its Prometheus ``/metrics``.

Provenance: ``SpecDecodingProm`` in ``vllm/v1/spec_decode/metrics.py`` (vLLM 0.32.0).

vLLM exports, per engine (label ``engine``), the counters

- ``vllm:spec_decode_num_drafts_total``: :math:`D`, verify steps that carried drafts;
- ``vllm:spec_decode_num_draft_tokens_total``: drafted tokens :math:`\sum_d k_d`;
- ``vllm:spec_decode_num_accepted_tokens_total``: accepted drafted tokens;
- ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}``: :math:`A_i`, drafts
  whose positions :math:`0..i` were all accepted (a marginal count),

each with a ``_created`` twin (its creation time, skipped). Counters of several engines
(data-parallel replicas) are summed. One scrape gives the counts since the server started;
two give their difference (the traffic between the scrapes); more give one interval per
consecutive pair. In the lab's terms :math:`R_0 = D`, :math:`R_i = A_{i-1}`, so
:math:`s_i = A_i / D` (vLLM's per-position rate) and :math:`\mathrm{AL} = 1 + \sum_i
A_i / D`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dsparklab.analysis.definitions import accept_len_from_marginal, check, pooled_accept_len
from dsparklab.errors import InputFormatError
from dsparklab.importers._common import (
    ImportedRun,
    Options,
    SourceFile,
    imported_engine,
    marginal_counter_rows,
)
from dsparklab.prometheus import NUM_DRAFTS, PER_POS, SpecDecodeCounters, spec_decode_counters
from dsparklab.store.rows import totals_row


def counter_rows(
    c: SpecDecodeCounters, *, scope: str = "run", interval: int | None = None
) -> list[dict[str, object]]:
    """Counter rows of one delta (:func:`~dsparklab.importers._common.marginal_counter_rows`)."""
    return marginal_counter_rows(
        c.num_drafts, c.num_draft_tokens, c.accepted_per_pos, scope=scope, interval=interval
    )


def delta_totals(
    c: SpecDecodeCounters,
    *,
    scope: str = "run",
    interval: int | None = None,
    t_start: float | None = None,
    t_end: float | None = None,
) -> dict[str, object]:
    return totals_row(
        scope=scope,
        interval=interval,
        t_start=t_start,
        t_end=t_end,
        num_drafts=c.num_drafts,
        num_draft_tokens=c.num_draft_tokens,
        num_accepted_tokens=c.num_accepted_tokens,
    )


def counter_checks(c: SpecDecodeCounters) -> list:
    survival = [a / c.num_drafts for a in c.accepted_per_pos] if c.num_drafts else []
    return [
        check(
            "num_accepted_tokens_total",
            c.num_accepted_tokens,
            sum(c.accepted_per_pos),
            definition="accepted tokens = sum_i A_i (every accepted token is accepted at one "
            "position of a prefix)",
        ),
        check(
            "acceptance_length (1 + accepted / drafts)",
            pooled_accept_len(c.num_drafts, c.num_accepted_tokens),
            accept_len_from_marginal(survival) if c.num_drafts else math.nan,
            definition="per_step: 1 + accepted / D = 1 + sum_i s_i",
        ),
    ]


def import_vllm_metrics(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """One run from one scrape (counts since start), two (their delta) or more (intervals)."""
    scrapes = [spec_decode_counters(s.text, str(s.path)) for s in sources]
    n = scrapes[0].n
    if options.n is not None and options.n != n:
        raise InputFormatError(
            f"--n {options.n} but the counters have {n} positions",
            path=sources[0].path,
            field=f"{PER_POS}_total",
        )
    if len(scrapes) == 1:
        deltas = [scrapes[0]]
    else:
        deltas = [
            after.minus(before, f"{sources[k + 1].path} (after {sources[k].path})")
            for k, (before, after) in enumerate(zip(scrapes[:-1], scrapes[1:], strict=True))
        ]
    interval = len(deltas) > 1
    tables: dict[str, list[dict[str, object]]] = {"counters": [], "totals": []}
    checks = []
    for k, delta in enumerate(deltas):
        scope = "interval" if interval else "run"
        tables["counters"] += counter_rows(delta, scope=scope, interval=k if interval else None)
        tables["totals"].append(delta_totals(delta, scope=scope, interval=k if interval else None))
        checks += counter_checks(delta)
    if sum(d.num_drafts for d in deltas) == 0:
        raise InputFormatError(
            "no drafts were verified in this window (num_drafts is 0): nothing to import",
            path=sources[-1].path,
            field=f"{NUM_DRAFTS}_total",
        )
    notes = [
        "one scrape: counts since the server started"
        if len(scrapes) == 1
        else f"{len(scrapes)} scrapes: counts between consecutive scrapes",
        "summed over engines " + ", ".join(repr(e) for e in scrapes[-1].engines),
    ]
    if any(r["n_drafted"] is None for r in tables["counters"]):
        notes.append(
            "num_draft_tokens < n x num_drafts: some drafts drafted fewer than n tokens; "
            "n_drafted unknown"
        )
    return [
        ImportedRun(
            fmt="vllm-metrics",
            sources=sources,
            granularity="interval" if interval else "aggregate",
            n=n,
            method=options.method_or_default,
            dataset=options.dataset_or_default,
            engine=imported_engine("vllm"),
            target={"name": scrapes[-1].model_name or "unknown"},
            tables=tables,
            reported={
                "num_drafts": [d.num_drafts for d in deltas],
                "num_draft_tokens": [d.num_draft_tokens for d in deltas],
                "num_accepted_tokens": [d.num_accepted_tokens for d in deltas],
                "accepted_per_pos": [d.accepted_per_pos for d in deltas],
            },
            checks=checks,
            notes=notes,
        )
    ]
