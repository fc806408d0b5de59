"""Patching vLLM: the patch points, the compatibility check, install and uninstall.

Every patched method is a :class:`PatchPoint` (module, class, method, the parameters the
wrapper reads). Before patching, each point is looked up in the installed vLLM; a missing
one disables only the patches that need it, with one log line naming it and what is
then not recorded. Patching twice is a no-op; :func:`uninstall` restores every attribute.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from dsparklab.engines.vllm import dspark_taps, runs, steps, v1, v2
from dsparklab.engines.vllm.config import TapConfig, TapConfigError
from dsparklab.engines.vllm.staging import MARK, unwrap
from dsparklab.errors import DSparkLabError

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = ">=0.32,<0.34"


class UnsupportedVLLMError(DSparkLabError, RuntimeError):
    """The installed vLLM lacks something the taps patch (named in the message)."""


@dataclass(frozen=True)
class PatchPoint:
    module: str
    cls: str
    method: str | None  # None: the class itself (attributes are added to it)
    params: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.module}.{self.cls}" + (f".{self.method}" if self.method else "")


_DSPARK = "vllm.v1.worker.gpu.spec_decode.dspark.speculator"
_DFLASH = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"
_TDAR = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"
_RUNNER_V2 = "vllm.v1.worker.gpu.model_runner"
_RUNNER_V1 = "vllm.v1.worker.gpu_model_runner"
_WORKER = "vllm.v1.worker.worker_base"
_PROPOSE_V2 = ("input_batch", "num_sampled", "num_rejected", "last_sampled")

DSPARK_LOAD = PatchPoint(_DSPARK, "DSparkSpeculator", "load_draft_model")
DSPARK_SEQ = PatchPoint(_DSPARK, "DSparkSpeculator", "_sample_sequential", ("num_reqs",))
DSPARK_TOPK = PatchPoint(_DSPARK, "DSparkSpeculator", "_sample_sequential_topk", ("num_reqs",))
DSPARK_LOGITS = PatchPoint(
    _DSPARK, "DSparkSpeculator", "_sample_logits", ("logits", "idx_map", "step")
)
DFLASH_PROPOSE = PatchPoint(_DFLASH, "DFlashSpeculator", "propose", _PROPOSE_V2)
TDAR_PROPOSE = PatchPoint(_TDAR, "TargetDependentARSpeculator", "propose", _PROPOSE_V2)
V2_EXECUTE = PatchPoint(_RUNNER_V2, "GPUModelRunner", "execute_model", ("scheduler_output",))
V1_PROPOSE = PatchPoint(
    _RUNNER_V1,
    "GPUModelRunner",
    "propose_draft_token_ids",
    ("scheduler_output", "sampled_token_ids", "spec_decode_metadata"),
)
V1_EXECUTE = PatchPoint(_RUNNER_V1, "GPUModelRunner", "execute_model", ("scheduler_output",))
V1_SAMPLE = PatchPoint(_RUNNER_V1, "GPUModelRunner", "sample_tokens", ("grammar_output",))
WORKER = PatchPoint(_WORKER, "WorkerBase", None)
ENGINE_CLIENT_SHUTDOWN = PatchPoint("vllm.v1.engine.core_client", "MPClient", "shutdown")


@dataclass(frozen=True)
class Patch:
    point: PatchPoint
    make: Callable[[Any], Any]
    needs: tuple[PatchPoint, ...]  # without these the patch would record nothing
    records: str  # what is not recorded without it


_DSPARK_FIELDS = "DSpark position fields (Markov bias, log-probabilities, flip, confidence)"
_DSPARK_GROUP = (DSPARK_LOAD, DSPARK_SEQ, DSPARK_LOGITS, DFLASH_PROPOSE)
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
    Patch(DFLASH_PROPOSE, v2.wrap_v2_propose, (), "DSpark drafts and acceptance (Model Runner V2)"),
    Patch(TDAR_PROPOSE, v2.wrap_v2_propose, (), "Eagle3 drafts and acceptance (Model Runner V2)"),
    Patch(
        V2_EXECUTE,
        runs.wrap_execute_model,
        (),
        "finished/preempted requests (Model Runner V2; their last drafts stay pending)",
    ),
    Patch(
        V1_PROPOSE,
        v1.wrap_v1_propose,
        (),
        "Eagle3 drafts and acceptance (Model Runner V1)",
    ),
    Patch(
        V1_EXECUTE,
        steps.wrap_v1_execute_model,
        (),
        "finished/preempted requests (Model Runner V1; their last drafts stay pending) and "
        "the engine steps' times (verify_time_s)",
    ),
    Patch(
        V1_SAMPLE,
        steps.wrap_v1_sample_tokens,
        (V1_EXECUTE,),
        "the engine steps' times (Model Runner V1: verify_time_s) and target-only steps",
    ),
    Patch(
        ENGINE_CLIENT_SHUTDOWN,
        runs.wrap_engine_client_shutdown,
        (),
        "the end of runs whose engine process was killed at shutdown (left 'running' "
        "until this process exits)",
    ),
)


@dataclass
class PatchState:
    registered: bool = False
    originals: dict[tuple[type, str], Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # point name -> why
    lock: threading.Lock = field(default_factory=threading.Lock)


STATE = PatchState()
_MISSING_ATTR = object()


def vllm_version() -> str:
    try:
        import vllm
    except ImportError as err:
        raise UnsupportedVLLMError(
            f"vllm is not importable ({err}); install vllm{SUPPORTED_VLLM} (pip install "
            "'dsparklab[vllm]') or unset DSPARKLAB_TRACE_DIR"
        ) from err
    return str(getattr(vllm, "__version__", "unknown"))


def probe(point: PatchPoint) -> type:
    """The class of ``point`` in the installed vLLM; raises naming what is missing."""
    try:
        module = import_module(point.module)
    except ImportError as err:
        raise UnsupportedVLLMError(f"module {point.module} is missing ({err})") from err
    cls = getattr(module, point.cls, None)
    if not isinstance(cls, type):
        raise UnsupportedVLLMError(f"{point.module}.{point.cls} is missing")
    if point.method is None:
        return cls
    fn = getattr(cls, point.method, None)
    if not callable(fn):
        raise UnsupportedVLLMError(f"{point.name} is missing")
    names = set(inspect.signature(unwrap(fn)).parameters)
    for name in point.params:
        if name not in names:
            raise UnsupportedVLLMError(f"{point.name} has no parameter {name!r}")
    return cls


def check_vllm_compat() -> dict[str, type]:
    """Look up every patch point; raise :class:`UnsupportedVLLMError` on the first missing.

    Returns ``{"module:Class": class}``.
    """
    version = vllm_version()
    found: dict[str, type] = {}
    for point in (*(p.point for p in PATCHES), WORKER):
        try:
            found[f"{point.module}:{point.cls}"] = probe(point)
        except UnsupportedVLLMError as err:
            raise UnsupportedVLLMError(
                f"vLLM {version}: {err}; the dsparklab taps support vllm{SUPPORTED_VLLM}"
            ) from err
    return found


def register_from_env() -> None:
    """The entry point's work once ``DSPARKLAB_TRACE_DIR`` is set (idempotent)."""
    with STATE.lock:
        if STATE.registered:
            return
        STATE.registered = True
        try:
            config = TapConfig.from_env()
        except TapConfigError as err:
            logger.error("dsparklab: %s; tracing stays off", err)
            return
    if config is None:
        return
    try:
        install(config)
    except UnsupportedVLLMError as err:
        logger.error("dsparklab: %s; tracing stays off", err)


def configure(config: TapConfig) -> bool:
    """Use ``config`` for tap runs made from now on in this process; install if needed.

    Returns whether any tap is installed (False on an unusable vLLM, logged).
    """
    with STATE.lock:
        STATE.registered = True
    try:
        install(config)
    except UnsupportedVLLMError as err:
        logger.error("dsparklab: %s; tracing stays off", err)
        return False
    return is_installed()


def is_installed() -> bool:
    return bool(STATE.originals)


def install(config: TapConfig) -> list[str]:
    """Patch vLLM's classes (idempotent); returns the names of missing patch points.

    Each missing point is logged once, naming it and what is then not recorded; the
    other patches go in. Raises :class:`UnsupportedVLLMError` when nothing can be patched.
    """
    runs.STATE.config = config
    runs.watch_trace_dir(config.trace_dir)
    if STATE.originals:
        return sorted(STATE.missing)
    version = vllm_version()
    classes: dict[PatchPoint, type] = {}
    for point in {*(p.point for p in PATCHES), WORKER}:
        try:
            classes[point] = probe(point)
        except UnsupportedVLLMError as err:
            STATE.missing[point.name] = str(err)
    lost: dict[str, list[str]] = {name: [] for name in STATE.missing}
    for patch in PATCHES:
        absent = [p.name for p in (patch.point, *patch.needs) if p not in classes]
        if absent:
            for name in absent:
                if patch.records not in lost[name]:
                    lost[name].append(patch.records)
            continue
        assert patch.point.method is not None
        _patch(classes[patch.point], patch.point.method, patch.make)
    if WORKER in classes:
        # collective_rpc("dsparklab_flush") / ("dsparklab_close") from LLM.collective_rpc
        _set_attr(classes[WORKER], "dsparklab_flush", runs.flush_worker)
        _set_attr(classes[WORKER], "dsparklab_close", runs.close_worker)
    else:
        lost[WORKER.name].append("flush/close through LLM.collective_rpc")
    for name, why in sorted(STATE.missing.items()):
        logger.error(
            "dsparklab: vLLM %s: %s; not recorded: %s (the dsparklab taps support vllm%s)",
            version,
            why,
            "; ".join(lost[name]) or "nothing",
            SUPPORTED_VLLM,
        )
    if not STATE.originals:
        raise UnsupportedVLLMError(f"vLLM {version}: no patch point found")
    logger.info(
        "dsparklab: vLLM taps installed (trace dir %s, level %s)", config.trace_dir, config.level
    )
    return sorted(STATE.missing)


def uninstall() -> None:
    """Restore every patched attribute (tests; a running engine keeps its buffers)."""
    for (owner, name), original in list(STATE.originals.items()):
        if original is _MISSING_ATTR:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    STATE.originals.clear()
    STATE.missing.clear()


def _set_attr(owner: type, name: str, value: Any) -> None:
    if (owner, name) in STATE.originals:
        return
    STATE.originals[(owner, name)] = owner.__dict__.get(name, _MISSING_ATTR)
    setattr(owner, name, value)


def _patch(owner: type, name: str, make: Callable[[Any], Any]) -> None:
    current = owner.__dict__.get(name)
    if current is None:  # inherited: wrap what the class resolves to
        current = getattr(owner, name)
    if getattr(current, MARK, False):
        return
    _set_attr(owner, name, make(current))
