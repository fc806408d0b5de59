"""The trace contract, schema v2: the one place that says what a run directory holds.

A run is one (engine, target, drafter, method, n, dataset, sampling) combination::

    <run>/run.json                      metadata + status (running | complete | failed)
    <run>/steps/part-00000.parquet      one row per (request, step)
    <run>/positions/part-00000.parquet  one row per (request, step, drafted position)
    <run>/requests/part-00000.parquet   one row per request

Parts are written under a hidden temporary name and renamed, so a reader never sees half a
file. Method-specific fields are null where they don't apply (Eagle3 has no Markov head;
the target-only baseline drafts nothing).

Runs without token-level rows (imported from what an engine or a benchmark harness
exports, or scraped live) say so in ``run.json`` (``granularity``, see
:data:`GRANULARITIES`) and hold what they have in the aggregate tables
(:data:`AGGREGATE_TABLES`)::

    <run>/counters/part-*.parquet       one row per (unit, drafted position): counts or rates
    <run>/totals/part-*.parquet         one row per unit: drafts, draft/accepted tokens, the
                                        numbers the source itself reported
    <run>/calibration/part-*.parquet    per-position confidence metrics a source reported

A *unit* is the run, one request or one scrape interval (``scope``). A run.json without
``granularity`` is a token-level run (every run written before these tables existed).
"""

from __future__ import annotations

import pyarrow as pa

# 2: steps carry ``emitted`` (schema 1 runs: ``dsparklab migrate``, dsparklab/store/migrate.py)
SCHEMA_VERSION = 2
# Stamped into every parquet part's key-value metadata.
SCHEMA_VERSION_KEY = b"dsparklab.schema_version"
TABLE_KEY = b"dsparklab.table"

RUN_JSON = "run.json"
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
TEMP_SUFFIX = ".tmp"

STATUSES = ("running", "complete", "incomplete", "failed")
# run.json of a run several processes write (vLLM's batch-sharded DSpark sampling: one per
# tensor-parallel rank): the tags of the writers that join its owner's run; each keeps its
# own status and counts in ``<run>/writers/<tag>.json`` (JOINED_DIR), never in run.json
JOINED_WRITERS = "joined_writers"
JOINED_DIR = "writers"
METHODS = ("dspark", "eagle3", "none")

STEPS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        # tokens in the sequence (prompt + emitted) when the step's draft began; null when
        # the source does not say (an imported response without its prompt length)
        pa.field("context_len", pa.int32()),
        pa.field("num_drafted", pa.int32(), nullable=False),
        # positions sent to the verifier (< num_drafted under adaptive verification)
        pa.field("num_verified", pa.int32(), nullable=False),
        pa.field("accepted_len", pa.int32(), nullable=False),
        # output tokens the step added once the output was cut at max_new_tokens and at a
        # stop token: accepted_len + 1 but for a request's last steps; with the prefill's
        # token, a request's steps add up to its output. Null where the writer does not
        # see the output (a vLLM worker's own tap store: the front end cuts it)
        pa.field("emitted", pa.int32()),
        # Step costs are this request's share of what the engine spent on the batch the step
        # ran in: the batch's time / batch_size, so sums over requests give the batch time
        # once (batch_size x share gives it back). draft: proposing; verify: the target's
        # forward over the block (vLLM: the engine step beyond the draft, verify and other
        # together); other: the rest of the step where the engine times it apart
        # (scheduling, sampling, bookkeeping); null where not recorded.
        pa.field("batch_size", pa.int32()),
        pa.field("draft_time_s", pa.float64()),
        pa.field("verify_time_s", pa.float64()),
        pa.field("other_time_s", pa.float64()),
    ]
)

POSITIONS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("draft_token", pa.int64(), nullable=False),
        # the target's choice at this position given the drafted prefix; null when the
        # engine cannot see it (vLLM exposes only accepted counts)
        pa.field("target_token", pa.int64()),
        pa.field("accepted", pa.bool_(), nullable=False),
        pa.field("draft_logprob", pa.float32()),
        pa.field("base_logprob", pa.float32()),
        pa.field("markov_bias", pa.float32()),
        pa.field("markov_bias_norm", pa.float32()),
        pa.field("markov_flip", pa.bool_()),
        pa.field("confidence", pa.float32()),
    ]
)

REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("output_token_ids", pa.list_(pa.int32())),
        pa.field("output_text", pa.string()),
        pa.field("wall_time_s", pa.float64()),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "steps": STEPS_SCHEMA,
    "positions": POSITIONS_SCHEMA,
    "requests": REQUESTS_SCHEMA,
}

# -- runs without token-level rows -------------------------------------------------------
# What a run holds, finest first: ``token`` (positions + steps + requests), ``step``
# (steps + requests: per-step accepted counts, no drafted tokens), ``request`` (per-request
# counters), ``aggregate`` (counters over the whole run) and ``interval`` (counters per
# scrape interval of a live server).
GRANULARITIES = ("token", "step", "request", "aggregate", "interval")
DEFAULT_GRANULARITY = "token"
# the unit a counters / totals row describes
SCOPES = ("run", "request", "interval")

# Per (unit, drafted position i), in the lab's definitions (docs/acceptance-definitions.md):
# n_reached R_i = drafts whose positions 0..i-1 were all accepted (and i was verified),
# n_accepted A_i = drafts whose positions 0..i were all accepted (vLLM's per-position
# counter), n_drafted = drafts that drafted position i (null when the source does not say).
# Sources that give rates but no counts fill accept_rate (a_i = P(accepted_i | reached_i))
# and/or survival (s_i = P(positions 0..i accepted)) and leave the counts null.
COUNTERS_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.string(), nullable=False),
        pa.field("request_id", pa.string()),
        pa.field("interval", pa.int32()),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("n_drafted", pa.int64()),
        pa.field("n_reached", pa.int64()),
        pa.field("n_accepted", pa.int64()),
        pa.field("accept_rate", pa.float64()),
        pa.field("survival", pa.float64()),
    ]
)

# How a reported acceptance length was computed; stored with every reported number.
AL_DEFINITIONS: dict[str, str] = {
    "per_step": "mean over drafts of (accepted drafted tokens + 1): 1 + sum_i s_i "
    "= 1 + accepted / drafts (bonus token included)",
    "per_request": "mean over requests of each request's per-step AL (requests weigh equally)",
    "completion_per_verify": "completion tokens / verify steps (SGLang spec_accept_length: "
    "counts the prefill's first token too, so it exceeds the per-step AL by 1 / steps)",
    "committed_per_round": "mean over proposals of committed tokens, bonus included except "
    "on a round that ends in EOS (DeepSpec acceptance_length)",
}


# Per unit. num_drafts: verify steps that carried drafts; num_draft_tokens: drafted tokens
# verified; num_accepted_tokens: accepted drafted tokens (bonus excluded); num_output_tokens:
# tokens the unit emitted (a response's completion tokens), when known. reported_*: what the
# source printed, converted to a fraction, with the definition it uses
# (AL_DEFINITIONS, which validate holds them to); t_start / t_end: a scrape interval's
# wall-clock bounds (unix seconds).
TOTALS_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.string(), nullable=False),
        pa.field("request_id", pa.string()),
        pa.field("interval", pa.int32()),
        pa.field("t_start", pa.float64()),
        pa.field("t_end", pa.float64()),
        pa.field("num_drafts", pa.int64()),
        pa.field("num_draft_tokens", pa.int64()),
        pa.field("num_accepted_tokens", pa.int64()),
        pa.field("num_output_tokens", pa.int64()),
        pa.field("reported_accept_len", pa.float64()),
        pa.field("reported_accept_len_definition", pa.string()),
        pa.field("reported_accept_rate", pa.float64()),
        # the cost side the source reported for the unit, in seconds: mean time per output
        # token after the first, mean inter-token latency, mean time to first token
        pa.field("tpot_s", pa.float64()),
        pa.field("itl_s", pa.float64()),
        pa.field("ttft_s", pa.float64()),
    ]
)

# Confidence calibration a source computed itself (one row per position with ``bin`` null,
# plus one row per reliability bin). ``score`` names what was judged: "confidence" (the
# head's c_i at reached positions) or "prefix_confidence" (prod_{j<=i} c_j against
# survival); ``count`` is the number (or weight) of observations.
CALIBRATION_SCHEMA = pa.schema(
    [
        pa.field("score", pa.string(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("bin", pa.int32()),
        pa.field("bin_lo", pa.float64()),
        pa.field("bin_hi", pa.float64()),
        pa.field("count", pa.float64()),
        pa.field("pred_mean", pa.float64()),
        pa.field("target_mean", pa.float64()),
        pa.field("ece", pa.float64()),
        pa.field("auroc", pa.float64()),
        pa.field("brier", pa.float64()),
    ]
)

AGGREGATE_TABLES: dict[str, pa.Schema] = {
    "counters": COUNTERS_SCHEMA,
    "totals": TOTALS_SCHEMA,
    "calibration": CALIBRATION_SCHEMA,
}
# Every table a run directory may hold.
ALL_TABLES: dict[str, pa.Schema] = {**TABLES, **AGGREGATE_TABLES}

# run.json fields a reader relies on; the rest (hardware, config, provenance) is free-form.
RUN_REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema_version": int,
    "run_id": str,
    "created_at": str,
    "status": str,
    "engine": dict,
    "method": str,
    "num_speculative_tokens": int,
    "target": dict,
    "drafter": (dict, type(None)),
    "dataset": str,
    "sampling": dict,
}
# Optional run.json values the readers join onto every row (``run_columns``), by dotted
# path: absent is fine, present must have this type (a bool is never a number here).
RUN_OPTIONAL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "engine.name": str,
    "target.name": str,
    "drafter.name": str,
    "tier": str,
    "sampling.temperature": (int, float, type(None)),
    "load": (dict, type(None)),
    "load.concurrency": (int, type(None)),
}

# The runs table of the table layout (dsparklab/store/layout.py): one row per run, written
# with run.json when the run opens and at each status change; its partition keys (dataset,
# method, n, run_id) are its directory's. A running run's fate is its run.json's lease.
RUNS_SCHEMA = pa.schema(
    [
        pa.field("engine", pa.string()),
        pa.field("target", pa.string()),
        pa.field("drafter", pa.string()),
        pa.field("tier", pa.string()),
        pa.field("temperature", pa.float64()),
        pa.field("status", pa.string()),
        pa.field("granularity", pa.string()),
        pa.field("sample", pa.float64()),
        pa.field("created_at", pa.string()),
        pa.field("finished_at", pa.string()),
    ]
)

# Run-level columns the readers join onto every row, taken from run.json.
RUN_COLUMNS = (
    "run_id",
    "engine",
    "method",
    "n",
    "target",
    "drafter",
    "tier",
    "temperature",
    "dataset",
    "concurrency",
)
