"""The patch table: every vLLM method the taps wrap, per supported vLLM line.

A :class:`Patch` names its :class:`PatchPoint` (module, class, method and the parameters
the wrapper reads), the wrapper that replaces it, the points it cannot work without, the
fields it feeds, and the vLLM lines (``0.32``, ``0.33``, ``0.34``) where the point exists
by design. :func:`vllm_line` picks the line of the installed vLLM; a point absent from its
line by design (Model Runner V1 from 0.34 on, the sharded DSpark sampling before it) is
skipped quietly, a point absent unexpectedly gives one warning naming it and the fields it
feeds (:mod:`~dsparklab.engines.vllm.patching`).

The plugin documentation's compatibility matrix is :func:`compatibility_matrix`
(a test keeps the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsparklab.engines.vllm import dspark_taps, runs, steps, v1, v2

LINES: tuple[str, ...] = ("0.32", "0.33", "0.34")
EVERY_LINE = frozenset(LINES)
# Model Runner V1 (vllm/v1/worker/gpu_model_runner.py, the V1 proposers) is gone in 0.34
V1_LINES = frozenset({"0.32", "0.33"})


@dataclass(frozen=True)
class PatchPoint:
    module: str
    cls: str
    method: str | None  # None: the class itself (attributes are added to it)
    params: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.module}.{self.cls}" + (f".{self.method}" if self.method else "")


@dataclass(frozen=True)
class Patch:
    point: PatchPoint
    make: Callable[[Any], Any]
    needs: tuple[PatchPoint, ...]  # without these the patch would record nothing
    records: str  # what is not recorded without it
    lines: frozenset[str] = EVERY_LINE  # the vLLM lines where the point exists by design


_DSPARK = "vllm.v1.worker.gpu.spec_decode.dspark.speculator"
_DFLASH = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"
_TDAR = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"
_RUNNER_V2 = "vllm.v1.worker.gpu.model_runner"
_RUNNER_V1 = "vllm.v1.worker.gpu_model_runner"
_TIMING_V2 = "vllm.v1.worker.gpu.async_utils"
_PROPOSE_V2 = ("input_batch", "num_sampled", "num_rejected", "last_sampled")

DSPARK_LOAD = PatchPoint(_DSPARK, "DSparkSpeculator", "load_draft_model")
DSPARK_SEQ = PatchPoint(_DSPARK, "DSparkSpeculator", "_sample_sequential", ("num_reqs",))
DSPARK_TOPK = PatchPoint(_DSPARK, "DSparkSpeculator", "_sample_sequential_topk", ("num_reqs",))
DSPARK_LOGITS = PatchPoint(
    _DSPARK, "DSparkSpeculator", "_sample_logits", ("logits", "idx_map", "step")
)
DSPARK_SHARDED = PatchPoint(
    _DSPARK, "DSparkSpeculator", "_sample_sequential_sharded", ("num_reqs",)
)
DSPARK_CHAIN = PatchPoint(
    _DSPARK, "DSparkSpeculator", "_sample_markov_chain", ("base_logits", "hidden", "idx_map")
)
DFLASH_PROPOSE = PatchPoint(_DFLASH, "DFlashSpeculator", "propose", _PROPOSE_V2)
TDAR_PROPOSE = PatchPoint(_TDAR, "TargetDependentARSpeculator", "propose", _PROPOSE_V2)
V2_EXECUTE = PatchPoint(_RUNNER_V2, "GPUModelRunner", "execute_model", ("scheduler_output",))
V2_SAMPLE = PatchPoint(
    _RUNNER_V2, "GPUModelRunner", "sample", ("hidden_states", "input_batch", "grammar_output")
)
V2_SAMPLE_TOKENS = PatchPoint(_RUNNER_V2, "GPUModelRunner", "sample_tokens", ("grammar_output",))
V2_FORWARD_START = PatchPoint(_TIMING_V2, "StepTimingCollector", "forward_start")
V1_PROPOSE = PatchPoint(
    _RUNNER_V1,
    "GPUModelRunner",
    "propose_draft_token_ids",
    ("scheduler_output", "sampled_token_ids", "spec_decode_metadata"),
)
V1_EXECUTE = PatchPoint(_RUNNER_V1, "GPUModelRunner", "execute_model", ("scheduler_output",))
V1_SAMPLE_TOKENS = PatchPoint(_RUNNER_V1, "GPUModelRunner", "sample_tokens", ("grammar_output",))
WORKER = PatchPoint("vllm.v1.worker.worker_base", "WorkerBase", None)
ENGINE_CLIENT_SHUTDOWN = PatchPoint("vllm.v1.engine.core_client", "MPClient", "shutdown")

_DSPARK_FIELDS = "DSpark position fields (Markov bias, log-probabilities, flip, confidence)"
_DSPARK_GROUP = (DSPARK_LOAD, DSPARK_SEQ, DSPARK_LOGITS, DFLASH_PROPOSE)
_V2_STEP = (V2_EXECUTE, V2_SAMPLE_TOKENS)
_V2_COSTS = "the engine steps' verify and other times (Model Runner V2)"

PATCHES: tuple[Patch, ...] = (
    Patch(DSPARK_LOAD, dspark_taps.wrap_load_draft_model, _DSPARK_GROUP, _DSPARK_FIELDS),
    Patch(DSPARK_SEQ, dspark_taps.wrap_sample_sequential, _DSPARK_GROUP, _DSPARK_FIELDS),
    Patch(
        DSPARK_TOPK,
        dspark_taps.wrap_sample_sequential_topk,
        _DSPARK_GROUP,
        "DSpark position fields with a draft top-k",
    ),
    Patch(DSPARK_LOGITS, dspark_taps.wrap_sample_logits, _DSPARK_GROUP, _DSPARK_FIELDS),
    Patch(
        DSPARK_SHARDED,
        dspark_taps.wrap_sample_sequential_sharded,
        (*_DSPARK_GROUP, DSPARK_CHAIN),
        "DSpark position fields under batch-sharded sampling (each rank's own rows)",
        frozenset({"0.34"}),
    ),
    Patch(
        DSPARK_CHAIN,
        dspark_taps.wrap_sample_markov_chain,
        (*_DSPARK_GROUP, DSPARK_SHARDED),
        "the base logits of batch-sharded sampling (an all-to-all of vocabulary shards)",
        frozenset({"0.34"}),
    ),
    Patch(DFLASH_PROPOSE, v2.wrap_v2_propose, (), "DSpark drafts and acceptance (Model Runner V2)"),
    Patch(TDAR_PROPOSE, v2.wrap_v2_propose, (), "Eagle3 drafts and acceptance (Model Runner V2)"),
    Patch(
        V2_EXECUTE,
        steps.wrap_execute_model,
        (),
        "finished/preempted requests (Model Runner V2; their last drafts stay pending) and "
        "the engine steps' times",
    ),
    Patch(
        V2_SAMPLE_TOKENS,
        steps.wrap_sample_tokens,
        (V2_EXECUTE,),
        "the engine steps' times and target-only steps (Model Runner V2)",
    ),
    Patch(V2_SAMPLE, steps.wrap_sample, _V2_STEP, _V2_COSTS + " and target-only steps"),
    Patch(V2_FORWARD_START, steps.wrap_forward_start, _V2_STEP, _V2_COSTS),
    Patch(
        V1_PROPOSE,
        v1.wrap_v1_propose,
        (),
        "Eagle3 drafts and acceptance (Model Runner V1)",
        V1_LINES,
    ),
    Patch(
        V1_EXECUTE,
        steps.wrap_execute_model,
        (),
        "finished/preempted requests (Model Runner V1; their last drafts stay pending) and "
        "the engine steps' times (verify_time_s)",
        V1_LINES,
    ),
    Patch(
        V1_SAMPLE_TOKENS,
        steps.wrap_sample_tokens,
        (V1_EXECUTE,),
        "the engine steps' times (Model Runner V1: verify_time_s) and target-only steps",
        V1_LINES,
    ),
    Patch(
        ENGINE_CLIENT_SHUTDOWN,
        runs.wrap_engine_client_shutdown,
        (),
        "the end of runs whose engine process was killed at shutdown (left 'running' "
        "until this process exits)",
    ),
)
# A class the plugin adds methods to (flush/close through LLM.collective_rpc).
CLASS_POINTS: tuple[tuple[PatchPoint, str], ...] = (
    (WORKER, "flush/close through LLM.collective_rpc"),
)

_VERSION = re.compile(r"^(\d+)\.(\d+)")


def vllm_line(version: str) -> str | None:
    """The supported line of a vLLM version string (``0.34.1.dev3+g...`` -> ``0.34``).

    A version past the newest line maps to the newest (nightlies run ahead of releases;
    :mod:`~dsparklab.engines.vllm.patching` says so once); an older one, or an unreadable
    string, to None.
    """
    match = _VERSION.match(version.strip())
    if match is None:
        return None
    key = (int(match.group(1)), int(match.group(2)))
    known = {tuple(int(p) for p in line.split(".")): line for line in LINES}
    if key in known:
        return known[key]
    newest = max(known)
    return known[newest] if key > newest else None


def patches_of(line: str) -> tuple[Patch, ...]:
    """The patches whose points exist in ``line`` by design."""
    return tuple(p for p in PATCHES if line in p.lines)


def wrapper_of(point: PatchPoint) -> Callable[[Any], Any]:
    """What makes the plugin's wrapper of ``point`` from the function it wraps."""
    return next(p.make for p in PATCHES if p.point == point)


def _doc_name(point: PatchPoint) -> str:
    what = f"{point.cls}.{point.method}" if point.method else point.cls
    return f"`{what}` (`{point.module.removeprefix('vllm.')}`)"


def compatibility_matrix() -> str:
    """The plugin doc's matrix: each patch point per line, and what it records."""
    rows = [
        "| patch point | " + " | ".join(LINES) + " | feeds |",
        "|---|" + "---|" * len(LINES) + "---|",
    ]
    seen: set[PatchPoint] = set()
    for patch in PATCHES:
        if patch.point in seen:
            continue
        seen.add(patch.point)
        lines = set().union(*(p.lines for p in PATCHES if p.point == patch.point))
        cells = " | ".join("patched" if line in lines else "absent by design" for line in LINES)
        rows.append(f"| {_doc_name(patch.point)} | {cells} | {patch.records} |")
    for point, records in CLASS_POINTS:
        cells = " | ".join("patched" for _ in LINES)
        rows.append(f"| {_doc_name(point)} | {cells} | {records} |")
    return "\n".join(rows)
