"""The trace contract, schema v1: the one place that says what a run directory holds.

A run is one (engine, target, drafter, method, n, dataset, sampling) combination::

    <run>/run.json                      metadata + status (running | complete | failed)
    <run>/steps/part-00000.parquet      one row per (request, step)
    <run>/positions/part-00000.parquet  one row per (request, step, drafted position)
    <run>/requests/part-00000.parquet   one row per request

Parts are written under a hidden temporary name and renamed, so a reader never sees half a
file. Method-specific fields are null where they don't apply (Eagle3 has no Markov head;
the target-only baseline drafts nothing).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1
# Stamped into every parquet part's key-value metadata.
SCHEMA_VERSION_KEY = b"dsparklab.schema_version"
TABLE_KEY = b"dsparklab.table"

RUN_JSON = "run.json"
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
TEMP_SUFFIX = ".tmp"

STATUSES = ("running", "complete", "failed")
METHODS = ("dspark", "eagle3", "none")

STEPS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        # tokens in the sequence (prompt + emitted) when the step's draft began
        pa.field("context_len", pa.int32(), nullable=False),
        pa.field("num_drafted", pa.int32(), nullable=False),
        # positions sent to the verifier (< num_drafted under adaptive verification)
        pa.field("num_verified", pa.int32(), nullable=False),
        pa.field("accepted_len", pa.int32(), nullable=False),
        pa.field("draft_time_s", pa.float64()),
        pa.field("verify_time_s", pa.float64()),
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
)
