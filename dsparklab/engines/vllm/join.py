"""Join what vLLM returned with what the taps recorded into one run of the store: the
part of collecting with vLLM that needs no vLLM. The drivers are
:mod:`dsparklab.engines.vllm.collect` (offline, ``vllm.LLM``) and
:mod:`dsparklab.engines.vllm.serve_client` (a running ``vllm serve``).

Both modes rely on the plugin's taps inside vLLM's workers (``DSPARKLAB_TRACE_DIR``) for
the drafted tokens and per-position values, and on vLLM's own per-request spec-decode
metrics (``per_request_spec_decode_metrics="detailed"``) for the per-step accepted
counts. The collector joins the two by request id and writes one run per (dataset,
method, n) in the shared layout (:mod:`dsparklab.engines.plan`) through
:class:`dsparklab.store.TraceWriter`:

- ``steps``: vLLM's per-step accepted/verified counts; context length, drafted count,
  batch size and the step's costs (each request's share of its engine step's draft and
  verify time, docs/vllm-plugin.md) from the taps. The taps' own accepted counts must
  agree with vLLM's; any difference is logged and listed in run.json
  (``checks.tap_vs_vllm``). Target-only runs take one step per output token after the
  first from the taps' target-only steps (with their costs) when the taps hold that many,
  else from the response alone (costs null).
- ``positions``: the taps' rows (draft token, target token where vLLM emitted one,
  log-probs, Markov bias, flip, confidence; null where a method has no such value).
- ``requests``: prompt and output tokens and text as vLLM returned them.
- ``totals`` (scope ``request``): vLLM's own per-request counts (verify steps, drafted
  and accepted tokens, its mean acceptance length), beside the taps' steps they must
  equal, and the response's timing where the server sends it (``vllm serve
  --enable-per-request-metrics``: ``ttft_s``, ``tpot_s``; :data:`TIMING_FIELDS`).

run.json also keeps vLLM's aggregate Prometheus counters
(``vllm:spec_decode_num_accepted_tokens_per_pos`` ...) over the run's requests, and
whether they equal the sums over the trace (``checks.prometheus_equals_trace``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pandas as pd

import dsparklab
from dsparklab.engines.checkpoints import ModelRef, models_tier
from dsparklab.engines.plan import CollectOptions, RunSpec, load_block
from dsparklab.engines.stats import DraftStats
from dsparklab.engines.vllm.served import (
    CollectError,
)
from dsparklab.prompts import Prompt
from dsparklab.provenance import provenance
from dsparklab.store import TraceWriter, new_run_json, read_trace
from dsparklab.store.catalog import holds_runs
from dsparklab.store.location import Location, Where
from dsparklab.store.rows import emitted_tokens, resumed_tokens, totals_row
from dsparklab.store.sampling import SAMPLE_KEY, request_sampled, sample_block
from dsparklab.store.schema import POSITIONS_SCHEMA

logger = logging.getLogger(__name__)

ENGINE_NAME = "vllm"
# A response's timing (``metrics``, ``PerRequestMetrics`` in
# vllm/entrypoints/generate/base/protocol.py, filled by build_per_request_timing_metrics in
# vllm/entrypoints/generate/base/serving.py with --enable-per-request-metrics) -> the
# totals column, in seconds. time_to_first_token_ms: first token - scheduled (no queue
# wait); mean_itl_ms: (last token - first token) / (completion tokens - 1), a time per
# output token after the first, which is what tpot_s means.
TIMING_FIELDS = {"time_to_first_token_ms": "ttft_s", "mean_itl_ms": "tpot_s"}


# -- what one request produced ------------------------------------------------------------
@dataclass
class CollectedRequest:
    """One prompt's result as vLLM returned it (offline or over HTTP)."""

    prompt: Prompt
    request_id: str  # the caller-side request id (offline: LLM's; serve: X-Request-Id)
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_text: str | None
    wall_time_s: float | None = None
    # vLLM's per-request spec-decode metrics (``SpeculativeDecodingMetrics``: the
    # response's ``metrics.speculative_decoding``, offline ``spec_decode_metrics.to_dict()``)
    spec_metrics: Mapping[str, Any] | None = None
    # the response's timing in seconds (TIMING_FIELDS), where the server sent it
    timing: Mapping[str, float] = field(default_factory=dict)

    @property
    def per_step_accepted(self) -> list[int] | None:
        """vLLM's accepted count per verify step (``detailed`` metrics only)."""
        values = (self.spec_metrics or {}).get("per_step_accepted")
        return None if values is None else [int(v) for v in values]

    @property
    def per_step_drafted(self) -> list[int] | None:
        """vLLM's drafted count per verify step (``detailed`` metrics only)."""
        values = (self.spec_metrics or {}).get("per_step_drafted")
        return None if values is None else [int(v) for v in values]

    def totals_row(self, request_id: str) -> dict[str, Any] | None:
        """What vLLM reported for this request, as a ``totals`` row (None: nothing)."""
        m = self.spec_metrics
        if not m:
            return None
        return totals_row(
            scope="request",
            request_id=request_id,
            num_drafts=int(m["num_spec_steps"]),
            num_draft_tokens=int(m["num_draft_tokens"]),
            num_accepted_tokens=int(m["num_accepted_draft_tokens"]),
            num_output_tokens=len(self.output_token_ids),
            reported_accept_len=float(m["mean_acceptance_length"]),
            reported_accept_len_definition="per_step",
            reported_accept_rate=float(m["draft_acceptance_rate"]),
            ttft_s=self.timing.get("ttft_s"),
            tpot_s=self.timing.get("tpot_s"),
        )


def response_timing(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """The totals' timing columns from a response's ``metrics`` (seconds; absent: none)."""
    out = {}
    for key, column in TIMING_FIELDS.items():
        value = (metrics or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[column] = float(value) / 1e3
    return out


@dataclass
class RunReport:
    """What :func:`write_run` wrote and what it checked."""

    run_dir: Location
    num_requests: int
    stats: DraftStats
    tap_vs_vllm: list[dict[str, Any]] = field(default_factory=list)
    requests_without_taps: list[str] = field(default_factory=list)
    totals_compared: int = 0
    totals_differ: list[dict[str, Any]] = field(default_factory=list)

    def compare_totals(
        self, request_id: str, reported: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]
    ) -> None:
        """Check vLLM's per-request counts against the steps the trace holds for it."""
        drafts = [s for s in steps if int(s["num_drafted"]) > 0]  # as vLLM counts them
        trace = {
            "num_drafts": len(drafts),
            "num_draft_tokens": sum(int(s["num_verified"]) for s in steps),
            "num_accepted_tokens": sum(int(s["accepted_len"]) for s in steps),
        }
        vllm = {k: reported[k] for k in trace}
        self.totals_compared += 1
        if vllm != trace:
            self.totals_differ.append({"request_id": request_id, "vllm": vllm, "trace": trace})

    def totals_check(self) -> dict[str, Any]:
        """run.json's ``checks.totals_vs_trace``: requests compared, those that differ."""
        return {
            "requests": self.totals_compared,
            "agree": self.totals_compared - len(self.totals_differ),
            "differ": self.totals_differ[:50],
        }


def match_ids(
    requests: Sequence[CollectedRequest], tap_prompt_ids: Iterable[str], *, exact: bool
) -> dict[str, str]:
    """Caller request id -> the tap trace's prompt_id (vLLM's external request id)."""
    tap_ids = list(dict.fromkeys(tap_prompt_ids))
    if exact:
        known = set(tap_ids)
        return {r.request_id: r.request_id for r in requests if r.request_id in known}
    out = {}
    for req in requests:
        token = f"-{req.request_id}-"
        hits = [t for t in tap_ids if token in f"-{t}-"]
        if len(hits) == 1:
            out[req.request_id] = hits[0]
        elif len(hits) > 1:
            raise CollectError(
                f"request id {req.request_id!r} matches {len(hits)} tap requests "
                f"({hits[:3]}); use unique X-Request-Id values"
            )
    return out


def _computed_steps(req: CollectedRequest) -> list[dict[str, Any]]:
    """Steps from vLLM's per-step counts alone (no taps): context from the counts."""
    per_step = req.per_step_accepted
    assert per_step is not None
    drafted = req.per_step_drafted or [0] * len(per_step)
    rows, context = [], len(req.prompt_token_ids) + 1
    for step, (accepted, verified) in enumerate(zip(per_step, drafted, strict=True)):
        rows.append(
            {
                "step": step,
                "context_len": context,
                "num_drafted": int(verified),
                "num_verified": int(verified),
                "accepted_len": int(accepted),
                **_NO_COSTS,
            }
        )
        context += int(accepted) + 1
    return rows


# the cost columns of a step no tap timed
_NO_COSTS: dict[str, Any] = {
    "batch_size": None,
    "draft_time_s": None,
    "verify_time_s": None,
    "other_time_s": None,
}
_COST_COLUMNS = tuple(_NO_COSTS)


def _with_emitted(rows: list[dict[str, Any]], req: CollectedRequest) -> list[dict[str, Any]]:
    """The request's step rows with ``emitted``: what each added to the output vLLM
    returned (which vLLM cut at max_tokens and stop tokens; the taps cannot see that),
    less the tokens re-prefills after a preemption added (seen in the context lengths)."""
    rows = sorted(rows, key=lambda r: r["step"])
    accepted = [r["accepted_len"] for r in rows]
    resumed = resumed_tokens([r["context_len"] for r in rows], accepted)
    kept = emitted_tokens(accepted, len(req.output_token_ids), resumed=resumed)
    return [{**row, "emitted": k} for row, k in zip(rows, kept, strict=True)]


def write_run(
    out: Location,
    spec: RunSpec,
    run_json: Mapping[str, Any],
    requests: Sequence[CollectedRequest],
    *,
    taps: TapTables | None,
    exact_ids: bool = True,
    prometheus: DraftStats | None = None,
    overwrite: bool = True,
    sample: float = 1.0,
) -> RunReport:
    """Join vLLM's per-request results with the tap trace and write one run.

    Parameters
    ----------
    out, spec
        The store and the run (written to ``spec.location(out)``; ``spec.n`` is 0 for
        target-only).
    run_json
        The run's metadata (``new_run_json``).
    requests
        What vLLM returned per prompt.
    taps
        The taps' tables (speculative or target-only steps), or None (none recorded).
    exact_ids
        Offline runs: the tap's prompt_id equals the caller id; serve runs: it contains
        the X-Request-Id the collector sent.
    prometheus
        vLLM's aggregate counters over exactly these requests, to check against the trace.
    sample
        The fraction of requests the taps recorded: a request they left out on purpose is
        not one "without taps" (it keeps vLLM's per-step counts, no positions), and
        run.json says the run's positions are that sample (its ``sample`` block).
    """
    if sample < 1.0:
        run_json = {**run_json, SAMPLE_KEY: sample_block(sample)}
    run_dir, n, dataset = spec.location(out), spec.n, spec.dataset_dir
    report = RunReport(run_dir=run_dir, num_requests=len(requests), stats=DraftStats.new(n))
    id_map: dict[str, str] = {}
    by_prompt: dict[str, pd.DataFrame] = {}
    pos_by_req: dict[str, pd.DataFrame] = {}
    if taps is not None and not taps.steps.empty:
        id_map = match_ids(requests, taps.steps["prompt_id"], exact=exact_ids)
        by_prompt = {k: g.sort_values("step") for k, g in taps.steps.groupby("prompt_id")}
        if not taps.positions.empty:
            pos_by_req = {
                k: g.sort_values(["step", "position"])
                for k, g in taps.positions.groupby("request_id")
            }
    with TraceWriter(out, run_json, overwrite=overwrite) as writer:
        for req in requests:
            rid = req.request_id
            # like the reference engine: the request is named by its prompt's id
            base = {
                "request_id": req.prompt.prompt_id,
                "prompt_id": req.prompt.prompt_id,
                "dataset": dataset,
            }
            writer.add(
                "requests",
                {
                    **base,
                    "prompt_token_ids": req.prompt_token_ids,
                    "output_token_ids": req.output_token_ids,
                    "output_text": req.output_text,
                    "wall_time_s": req.wall_time_s,
                },
            )
            if n == 0:
                tap = by_prompt.get(id_map.get(rid, "")) if taps is not None else None
                if taps is not None and not taps.steps.empty and tap is None:
                    report.requests_without_taps.append(rid)
                _write_target_only(writer, req, base, report, tap)
                continue
            reported = req.totals_row(req.prompt.prompt_id)
            if reported is not None:
                writer.add("totals", reported)
            tap = by_prompt.get(id_map.get(rid, ""))
            if tap is None or tap.empty:
                if request_sampled(rid, sample):
                    report.requests_without_taps.append(rid)
                steps = [] if req.per_step_accepted is None else _computed_steps(req)
                steps = _with_emitted(steps, req)
                writer.add_many("steps", [{**base, **s} for s in steps])
                for s in steps:
                    report.stats.observe_draft(s["num_verified"], s["accepted_len"])
            else:
                steps = _write_tapped(writer, req, base, tap, pos_by_req, report)
            if reported is not None:
                report.compare_totals(req.prompt.prompt_id, reported, steps)
        checks: dict[str, Any] = {
            "tap_vs_vllm": report.tap_vs_vllm[:50],
            "tap_vs_vllm_mismatched_steps": sum(m["steps"] for m in report.tap_vs_vllm),
            "requests_without_taps": report.requests_without_taps[:50],
            "totals_vs_trace": report.totals_check(),
        }
        if prometheus is not None:
            checks["prometheus"] = prometheus.to_json()
            checks["prometheus_equals_trace"] = (
                prometheus.accepted_per_pos == report.stats.accepted_per_pos
                and prometheus.num_steps == report.stats.num_steps
                and prometheus.num_accepted == report.stats.num_accepted
            )
            if not checks["prometheus_equals_trace"]:
                logger.warning(
                    "%s: vLLM's Prometheus counters %s differ from the trace's %s",
                    run_dir,
                    prometheus.accepted_per_pos,
                    report.stats.accepted_per_pos,
                )
        # the batch sizes the run's own steps ran in (the taps' rows of its requests)
        tapped = [by_prompt.get(id_map.get(r.request_id, "")) for r in requests]
        sizes = [s for t in tapped if t is not None and "batch_size" in t for s in t["batch_size"]]
        load = load_block(spec, (run_json.get("load") or {}).get("concurrency", 0), sizes)
        writer.update_meta(
            stats=report.stats.to_json(), num_requests=len(requests), checks=checks, load=load
        )
    return report


def _write_target_only(
    writer: TraceWriter,
    req: CollectedRequest,
    base: dict[str, Any],
    report: RunReport,
    tap: pd.DataFrame | None = None,
) -> None:
    """One step per token after the prefill's (the reference engine's convention): the
    taps' target-only steps, with their costs, when they hold at least that many (more:
    steps whose tokens the front end cut, e.g. at a stop string, kept with ``emitted`` 0);
    else from the response alone, costs null (a shortfall is listed in
    ``checks.tap_vs_vllm``)."""
    expected = max(len(req.output_token_ids) - 1, 0)
    rows = []
    if tap is not None and len(tap) >= expected:
        for row in tap.itertuples(index=False):
            rows.append(
                {
                    **base,
                    "step": int(row.step),
                    "context_len": int(row.context_len),
                    "num_drafted": 0,
                    "num_verified": 0,
                    "accepted_len": 0,
                    **_tap_costs(row),
                }
            )
    else:
        if tap is not None:
            report.tap_vs_vllm.append(
                {
                    "request_id": req.request_id,
                    "steps": expected - len(tap),
                    "first_step": len(tap),
                    "vllm_steps": expected,
                    "tap_steps": len(tap),
                }
            )
            logger.warning(
                "request %s: the taps hold %d target-only steps of the %d its output has; "
                "the run keeps the response's steps, untimed",
                req.request_id,
                len(tap),
                expected,
            )
        context = len(req.prompt_token_ids) + 1
        for step in range(expected):
            rows.append(
                {
                    **base,
                    "step": step,
                    "context_len": context + step,
                    "num_drafted": 0,
                    "num_verified": 0,
                    "accepted_len": 0,
                    **_NO_COSTS,
                }
            )
    for _ in rows:
        report.stats.observe_draft(0, 0)
    writer.add_many("steps", _with_emitted(rows, req))


def _tap_costs(row: Any) -> dict[str, Any]:
    """A tap step's cost columns (null where the tap store has none)."""
    return {name: _none_if_nan(getattr(row, name, None)) for name in _COST_COLUMNS}


def _write_tapped(
    writer: TraceWriter,
    req: CollectedRequest,
    base: dict[str, Any],
    tap: pd.DataFrame,
    pos_by_req: Mapping[str, pd.DataFrame],
    report: RunReport,
) -> list[dict[str, Any]]:
    """Write one request's tapped steps and positions; returns its steps rows.

    vLLM's per-step counts list the steps that verified a draft: they are compared with
    the taps' drafted steps (a step that drafted nothing, under a batch-size schedule, is
    the taps' alone)."""
    drafted = tap[tap["num_drafted"] > 0]
    tap_accepted = [int(x) for x in drafted["accepted_len"]]
    tap_verified = [int(x) for x in drafted["num_verified"]]
    per_step = req.per_step_accepted
    if per_step is not None:
        vllm_accepted = per_step
        vllm_verified = req.per_step_drafted or tap_verified
        if vllm_accepted != tap_accepted or vllm_verified != tap_verified:
            diff = [
                i
                for i in range(max(len(vllm_accepted), len(tap_accepted)))
                if i >= len(vllm_accepted)
                or i >= len(tap_accepted)
                or vllm_accepted[i] != tap_accepted[i]
                or (
                    i < len(vllm_verified)
                    and i < len(tap_verified)
                    and vllm_verified[i] != tap_verified[i]
                )
            ]
            report.tap_vs_vllm.append(
                {
                    "request_id": req.request_id,
                    "steps": len(diff),
                    "first_step": diff[0] if diff else None,
                    "vllm_steps": len(vllm_accepted),
                    "tap_steps": len(tap_accepted),
                }
            )
            logger.warning(
                "request %s: the taps' accepted counts differ from vLLM's at %d steps "
                "(first: step %s); the trace keeps the taps' (consistent with positions)",
                req.request_id,
                len(diff),
                diff[0] if diff else None,
            )
    internal = str(tap["request_id"].iloc[0])
    positions = pos_by_req.get(internal)
    steps_out = []
    for row in tap.itertuples(index=False):
        acc, ver = int(row.accepted_len), int(row.num_verified)
        steps_out.append(
            {
                **base,
                "step": int(row.step),
                "context_len": int(row.context_len),
                "num_drafted": int(row.num_drafted),
                "num_verified": ver,
                "accepted_len": acc,
                **_tap_costs(row),
            }
        )
        if row.num_drafted:  # vLLM's counters count drafts
            report.stats.observe_draft(ver, acc)
    steps_out = _with_emitted(steps_out, req)
    writer.add_many("steps", steps_out)
    if positions is not None:
        records = positions.drop(columns=[c for c in positions.columns if c not in _POS_COLS])
        rows = []
        for rec in records.to_dict("records"):
            rows.append(
                {k: _none_if_nan(v) for k, v in rec.items()} | {"request_id": base["request_id"]}
            )
        writer.add_many("positions", rows)
    return steps_out


_POS_COLS = frozenset(POSITIONS_SCHEMA.names)


def _none_if_nan(value: Any) -> Any:
    if value is None:
        return None
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        return value
    if hasattr(value, "item"):
        return value.item()
    return value


class TapTables(NamedTuple):
    """The taps' ``steps`` and ``positions`` tables (``read_trace`` of the tap runs)."""

    steps: pd.DataFrame
    positions: pd.DataFrame


def read_tap_runs(run_dirs: Iterable[Where]) -> TapTables:
    """Steps and positions of the taps' run directories (any status), concatenated."""
    steps, positions = [], []
    for run_dir in dict.fromkeys(Location.of(d) for d in run_dirs):
        if not holds_runs(run_dir):
            continue
        steps.append(read_trace(run_dir, "steps"))
        positions.append(read_trace(run_dir, "positions"))
    if not steps:
        return TapTables(pd.DataFrame(), pd.DataFrame())
    return TapTables(pd.concat(steps, ignore_index=True), pd.concat(positions, ignore_index=True))


def run_json(
    spec: RunSpec,
    target: ModelRef,
    drafter: ModelRef | None,
    options: CollectOptions,
    *,
    engine: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    hardware: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """run.json of a vLLM run: ``engine`` (version, mode ...) and ``fields`` added verbatim;
    ``hardware`` defaults to this process's device."""
    if hardware is None:
        import torch

        cuda = torch.cuda.is_available()
        hardware = {
            "device": "cuda" if cuda else "cpu",
            "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        }
    return new_run_json(
        run_id=spec.name,
        engine={"name": ENGINE_NAME, **dict(engine)},
        method=spec.method,
        num_speculative_tokens=spec.n,
        target=target.to_json(),
        drafter=None if drafter is None else drafter.to_json(),
        dataset=spec.dataset_dir,
        sampling={"temperature": options.temperature, "seed": options.seed},
        tier=options.tier or models_tier(target, drafter),
        hardware=dict(hardware),
        config={"max_new_tokens": options.max_new_tokens, **dict(extra or {})},
        provenance=provenance(),
        dsparklab_version=dsparklab.__version__,
        identity=options.identity(spec),
        **fields,
    )
