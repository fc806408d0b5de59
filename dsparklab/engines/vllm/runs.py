"""Process state of the taps: the settings, one recorder (run directory) per tap.

vLLM loads the plugin in every process it starts; each writing process keeps its
recorders here, closes them at exit (``atexit`` for the main process, a multiprocessing
finalizer for vLLM's engine core and workers, which leave through ``os._exit``), and
forwards the requests vLLM schedules, finishes or preempts (a run is in flight until
every scheduled request finished; finished or preempted requests drop their pending
drafts). At exit a run is ``complete`` when nothing was in flight, else ``incomplete``.

``vllm serve`` force-kills its engine processes right after SIGTERM on Ctrl-C or a
supervisor's stop (``--shutdown-timeout 0``, the default), before any exit hook there
runs. So every process that installed the taps also watches its trace directory: once
its engine client has shut the engine processes down (``MPClient.shutdown``), and again
at its own exit, it closes the ``running`` runs written by its descendants that have
exited (:func:`close_runs_of_dead_descendants`), ``complete`` only if the writer had
settled (see :mod:`~dsparklab.engines.vllm.closing`). The first matters when a request
is in flight: the API server then waits for the client's connection and may never exit
by itself.

What a run.json written here records beside the common fields (``speculative``):
vLLM's ``draft_sample_method``, ``rejection_sample_method`` (with the synthetic rates or
FLy window where they apply), ``enable_adaptive_verification``, the DSpark draft top-k, and
where the confidence values come from (``confidence_source``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from dsparklab.engines.vllm.closing import ancestor_pids, close_runs_of_dead_descendants
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.engines.vllm.coverage import recorded_fields
from dsparklab.engines.vllm.recorder import TraceRecorder
from dsparklab.engines.vllm.staging import TAP_ATTR, SpecTap, mark, tap_of
from dsparklab.errors import DSparkLabError
from dsparklab.store import TraceWriter, new_run_json
from dsparklab.store.catalog import holds_runs
from dsparklab.store.layout import run_location
from dsparklab.store.location import Location
from dsparklab.store.outbox import Outbox
from dsparklab.store.sampling import SAMPLE_KEY, sample_block
from dsparklab.store.schema import JOINED_WRITERS
from dsparklab.store.writer import (
    writer_id,
)

logger = logging.getLogger(__name__)

RECORDED_METHODS = ("dspark", "eagle3")
# SpeculativeConfig fields that change what "accepted" means or what was drafted.
SPECULATIVE_FIELDS = (
    "custom_method",  # vLLM 0.34: a registered method's name (its base is in ``method``)
    "num_speculative_tokens_per_batch_size",  # dynamic n: [(first, last, n), ...]
    "draft_decode_context_parallel_size",
    "speculator_options",
    "draft_sample_method",
    "rejection_sample_method",
    "enable_adaptive_verification",
    "dspark_draft_topk",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
)


@dataclass
class RunState:
    config: TapConfig | None = None
    recorders: list[TraceRecorder] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    atexit_registered: bool = False
    run_counter: int = 0
    # trace directories whose runs this process closes for exited descendants, at exit
    watched: set[Location] = field(default_factory=set)
    watcher_pid: int | None = None
    # set by the installer: the patch table's line and the methods patched ("Class.method")
    line: str | None = None
    installed: tuple[str, ...] = ()


STATE = RunState()


def live_recorders() -> list[TraceRecorder]:
    return [r for r in STATE.recorders if not r.closed]


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


def close_worker(worker: Any = None, *, status: str = "complete") -> list[str]:
    """Drain and close every recorder of this process (runs marked ``status``)."""
    out = []
    for rec in list(STATE.recorders):
        if not rec.closed:
            try:
                rec.close(status=status)
            except Exception:
                logger.exception("dsparklab: closing the tap trace failed")
        if rec.run_dir is not None:
            out.append(str(rec.run_dir))
    return out


def _close_all_at_exit() -> None:
    for rec in live_recorders():
        try:
            rec.end()
        except Exception:  # interpreter shutdown: nothing else to do
            logger.exception("dsparklab: closing the tap trace at exit failed")


def watch_trace_dir(trace_dir: Location) -> None:
    """Close the runs this process's exited descendants left below ``trace_dir``: after
    vLLM's engine client shut down (:func:`wrap_engine_client_shutdown`) and at exit."""
    with STATE.lock:
        STATE.watched.add(trace_dir)
        if STATE.watcher_pid != os.getpid():
            STATE.watcher_pid = os.getpid()
            atexit.register(_close_watched_at_exit)


def _close_watched_at_exit() -> None:
    if STATE.watcher_pid != os.getpid():  # a forked child inherited the hook
        return
    close_watched_runs()


def close_watched_runs(wait_s: float = 10.0) -> dict[str, str]:
    """:func:`close_runs_of_dead_descendants` for every watched trace directory."""
    closed: dict[str, str] = {}
    for trace_dir in sorted(STATE.watched):
        try:
            closed |= close_runs_of_dead_descendants(trace_dir, wait_s=wait_s)
        except Exception:  # shutting down: log, never raise into vLLM
            logger.exception("dsparklab: closing the runs below %s failed", trace_dir)
    return closed


def wrap_engine_client_shutdown(original: Callable[..., Any]) -> Callable[..., Any]:
    """After vLLM's engine client stopped its engine processes, close the runs they left."""

    @functools.wraps(original)
    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            close_watched_runs()

    return mark(shutdown, original)


@dataclass(frozen=True)
class Ranks:
    """This process's ranks; 0 where unknown (distributed not initialised: one rank)."""

    tp: int = 0
    dp: int = 0
    pcp: int = 0  # prefill context parallelism (vLLM 0.34's DSpark)


def _parallel_ranks(vllm_config: Any) -> Ranks:
    tp = pcp = 0
    try:
        from vllm.distributed import parallel_state

        tp = int(parallel_state.get_tensor_model_parallel_rank())
        if (
            int(
                getattr(
                    getattr(vllm_config, "parallel_config", None),
                    "prefill_context_parallel_size",
                    1,
                )
                or 1
            )
            > 1
        ):
            pcp = int(parallel_state.get_pcp_group().rank_in_group)
    except Exception:  # distributed not initialised (unit tests): a single rank
        pass
    parallel = getattr(vllm_config, "parallel_config", None)
    return Ranks(tp=tp, dp=int(getattr(parallel, "data_parallel_rank", 0) or 0), pcp=pcp)


def records_here(ranks: Ranks, writer_ranks: str, *, joined: bool = False) -> bool:
    """Whether this rank writes: TP rank 0 of each DP replica (every TP rank with
    ``DSPARKLAB_WRITER_RANKS=all``, or when the ranks write one run together: ``joined``),
    and only PCP rank 0, whose drafts vLLM broadcasts to the other PCP ranks after
    ``propose`` (``PCPManager.sync_drafts``): theirs are never verified."""
    return ranks.pcp == 0 and (writer_ranks == "all" or joined or ranks.tp == 0)


def batch_sharded_sampling(vllm_config: Any) -> bool:
    """Whether vLLM (0.34+) is asked to shard DSpark's sequential sampling over the TP ranks
    (``--enable-batch-sharded-sampling`` with TP > 1). vLLM may still decline at load; it
    then samples every row on every rank, and the steps say so (``sharded_over``)."""
    parallel = getattr(vllm_config, "parallel_config", None)
    asked = bool(getattr(parallel, "enable_batch_sharded_sampling", False))
    return asked and int(getattr(parallel, "tensor_parallel_size", 1) or 1) > 1


def joins_one_run(vllm_config: Any, method: str, writer_ranks: str) -> bool:
    """Whether every TP rank of this engine writes into one run: DSpark under batch-sharded
    sampling, where each rank samples, and so records, its own batch rows (unless
    ``DSPARKLAB_WRITER_RANKS=all`` asks for a run per rank).

    The ranks agree on the run's name through vLLM's ``instance_id``, which the engine's
    process sets once (``VllmConfig.__post_init__``) and its workers receive pickled with the
    config: true of the multiprocessing executor on one node and of Ray. Where each rank
    builds its own config (``external_launcher``, or a multiprocessing engine over several
    nodes, whose headless nodes start alone) the ids differ, so there TP rank 0 writes alone
    and run.json marks the fields it holds for its own rows only ``partial``."""
    parallel = getattr(vllm_config, "parallel_config", None)
    backend = getattr(parallel, "distributed_executor_backend", None)
    nodes = int(getattr(parallel, "nnodes", 1) or 1)
    one_config = backend == "ray" or (backend != "external_launcher" and nodes == 1)
    return (
        method == "dspark"
        and writer_ranks == "tp0"
        and batch_sharded_sampling(vllm_config)
        and one_config
        and bool(getattr(vllm_config, "instance_id", ""))
    )


def _model_name(path: str | None) -> dict[str, Any]:
    if not path:
        return {"name": "unknown", "path": None}
    return {"name": Path(path).name or str(path), "path": str(path)}


def speculative_settings(vllm_config: Any) -> dict[str, Any]:
    """The SpeculativeConfig fields of :data:`SPECULATIVE_FIELDS` (None where absent).

    The draft top-k falls back to the draft model's ``dspark_draft_topk`` (vLLM resolves
    the checkpoint's value there).
    """
    spec_cfg = getattr(vllm_config, "speculative_config", None)
    out: dict[str, Any] = {}
    for name in SPECULATIVE_FIELDS:
        value = getattr(spec_cfg, name, None)
        out[name] = list(value) if isinstance(value, (list, tuple)) else value
    if out["dspark_draft_topk"] is None:
        draft_cfg = getattr(spec_cfg, "draft_model_config", None)
        out["dspark_draft_topk"] = getattr(
            getattr(draft_cfg, "hf_config", None), "dspark_draft_topk", None
        )
    return out


def method_of(vllm_config: Any) -> tuple[str | None, int]:
    spec_cfg = getattr(vllm_config, "speculative_config", None)
    if spec_cfg is None:
        return None, 0
    return getattr(spec_cfg, "method", None), int(getattr(spec_cfg, "num_speculative_tokens", 0))


def new_recorder(
    vllm_config: Any,
    method: str,
    n: int,
    *,
    model_runner: str,
    ranks: Ranks,
    joined: bool = False,
) -> TraceRecorder:
    """A recorder writing one run directory below ``DSPARKLAB_TRACE_DIR``; ``joined``
    (:func:`joins_one_run`): one the engine's TP ranks write together, TP rank 0 owning it."""
    import vllm

    config = STATE.config
    if config is None:
        raise DSparkLabError("dsparklab taps are not installed (no TapConfig)")
    with STATE.lock:
        STATE.run_counter += 1
        counter = STATE.run_counter
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tp, dp = ranks.tp, ranks.dp
    parallel = getattr(vllm_config, "parallel_config", None)
    tp_size = int(getattr(parallel, "tensor_parallel_size", 1) or 1)

    def where(run_id: str) -> Location:
        partition = {"dataset": config.dataset, "method": method, "num_speculative_tokens": n}
        return run_location(config.trace_dir, {**partition, "run_id": run_id})

    if joined:
        # the same on every TP rank, and no other engine's: the instance id (a start time)
        base = config.run_name or f"vllm-{method}-n{n}"
        name = f"{base}-dp{dp}-{vllm_config.instance_id}"
    else:
        base = config.run_name or f"vllm-{method}-n{n}-{stamp}-{os.getpid()}"
        name = f"{base}-dp{dp}" + (f"-tp{tp}" if config.writer_ranks == "all" else "")
        if config.trace_dir.is_local:
            if holds_runs(where(name)) or counter > 1 and where(name).exists():
                name = f"{name}-{os.getpid()}-{counter}"
        else:
            # many servers share a bucket, and an object store must not be asked (it may be
            # down): a name no other process can take
            name = f"{name}-{writer_id()}-{counter}"
    run_dir = where(name)
    spec_cfg = getattr(vllm_config, "speculative_config", None)
    model_cfg = getattr(vllm_config, "model_config", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    run_json = new_run_json(
        run_id=name,
        engine={
            "name": "vllm",
            "version": getattr(vllm, "__version__", "unknown"),
            "model_runner": model_runner,
            "plugin": "dsparklab.engines.vllm.plugin",
            "patch_table_line": STATE.line,
        },
        method=method,
        num_speculative_tokens=int(n),
        target=_model_name(getattr(model_cfg, "model", None)),
        drafter=None if method == "none" else _model_name(getattr(spec_cfg, "model", None)),
        dataset=config.dataset,
        # Sampling is per request in a server; the collector's run records it.
        sampling={"per_request": True},
        tier="tap",
        speculative=speculative_settings(vllm_config),
        hardware={
            "device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "tensor_parallel_size": getattr(parallel, "tensor_parallel_size", 1),
            "tensor_parallel_rank": tp,
            "data_parallel_rank": dp,
            "prefill_context_parallel_size": getattr(parallel, "prefill_context_parallel_size", 1),
            "decode_context_parallel_size": getattr(parallel, "decode_context_parallel_size", 1),
        },
        recorded_fields=recorded_fields(method, model_runner, config.level, STATE.installed),
        config={"taps": config.as_dict(), "pid": os.getpid(), "ancestor_pids": ancestor_pids()},
    )
    if joined and tp == 0:  # the run's owner names the ranks that join it
        run_json[JOINED_WRITERS] = [f"tp{rank}" for rank in range(1, tp_size)]
    if config.sample < 1.0:
        run_json[SAMPLE_KEY] = sample_block(config.sample)
    # an object store may be down or slow: its writes go through a bounded outbox
    outbox = (
        None
        if config.trace_dir.is_local
        else Outbox(max_bytes=int(config.buffer_mb * 2**20), name=str(config.trace_dir))
    )
    writer = TraceWriter(
        config.trace_dir,
        run_json,
        flush_seconds=config.flush_seconds,
        outbox=outbox,
        tag=f"dp{dp}" + (f"-tp{tp}" if joined else ""),
        lease_seconds=config.lease_seconds,
        joins=f"tp{tp}" if joined and tp > 0 else None,
    )
    rec = TraceRecorder(
        n,
        dataset=config.dataset,
        writer=writer,
        flush_seconds=config.flush_seconds,
        sample=config.sample,
        joined_rank=tp if joined else None,
    )
    with STATE.lock:
        STATE.recorders.append(rec)
        if not STATE.atexit_registered:
            atexit.register(_close_all_at_exit)
            multiprocessing.util.Finalize(None, _close_all_at_exit, exitpriority=100)
            STATE.atexit_registered = True
    if method == "none":
        logger.info("dsparklab: recording target-only steps into %s", run_dir)
    elif joined:
        logger.info(
            "dsparklab: recording %s n=%d drafts into %s, which all %d TP ranks write (this "
            "is rank %d)",
            method,
            n,
            run_dir,
            tp_size,
            tp,
        )
    else:
        logger.info("dsparklab: recording %s n=%d drafts into %s", method, n, run_dir)
    return rec


def make_tap(
    owner: Any,
    *,
    model_runner: str,
    factory: Callable[..., SpecTap] = SpecTap,
    **extra: Any,
) -> SpecTap | None:
    """A tap for ``owner`` (speculator or runner), or None when this process does not record.

    ``factory`` builds it (:class:`SpecTap` or the DSpark subclass) from the recorder and
    the owner's ``max_num_reqs`` / ``device``, plus ``extra``.
    """
    config = STATE.config
    vllm_config = owner.vllm_config
    method, n = method_of(vllm_config)
    if config is None or method not in RECORDED_METHODS or n <= 0:
        return None
    ranks = _parallel_ranks(vllm_config)
    joined = joins_one_run(vllm_config, method, config.writer_ranks)
    if not records_here(ranks, config.writer_ranks, joined=joined):
        return None
    recorder = new_recorder(
        vllm_config, method, n, model_runner=model_runner, ranks=ranks, joined=joined
    )
    return factory(
        recorder=recorder,
        n=n,
        max_num_reqs=int(owner.max_num_reqs),
        device=torch.device(owner.device),
        level=config.level,
        model_runner=model_runner,
        **extra,
    )


def make_target_only_tap(
    runner: Any, *, factory: Callable[..., SpecTap] = SpecTap
) -> SpecTap | None:
    """A tap recording the target-only steps of ``runner`` (a model runner without a
    speculative config), or None when this process does not record (tracing off, a
    speculative config, a tensor-parallel rank other than 0 by default)."""
    config = STATE.config
    vllm_config = runner.vllm_config
    if config is None or getattr(vllm_config, "speculative_config", None) is not None:
        return None
    ranks = _parallel_ranks(vllm_config)
    if not records_here(ranks, config.writer_ranks):
        return None
    kind = model_runner_of(runner)
    recorder = new_recorder(vllm_config, "none", 0, model_runner=kind, ranks=ranks)
    return factory(
        recorder=recorder,
        n=0,
        max_num_reqs=int(runner.max_num_reqs),
        device=torch.device(runner.device),
        level=config.level,
        model_runner=kind,
    )


# Model Runner V2's module; its CPU runner (vllm/v1/worker/cpu/model_runner.py) subclasses it
_V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"


def model_runner_of(runner: Any) -> str:
    """``v2`` for a Model Runner V2 (or a subclass), else ``v1``."""
    return "v2" if any(c.__module__ == _V2_RUNNER_MODULE for c in type(runner).__mro__) else "v1"


# Model Runner V2 warms its kernels up before serving, with requests of its own
# (vllm/v1/worker/gpu/warmup.py: "_warmup_{i}_", "_context_warmup_{i}_" on 0.34,
# "_v2_mixed_warmup_..."): no user sent them, and their steps time the compiling
WARMUP_REQUEST_PREFIXES = ("_warmup_", "_context_warmup_", "_v2_mixed_warmup")


def is_warmup_request(req_id: str) -> bool:
    """Whether ``req_id`` is one of vLLM's own kernel-warmup requests (never recorded)."""
    return req_id.startswith(WARMUP_REQUEST_PREFIXES)


def ended_request_ids(scheduler_output: Any) -> tuple[set[str], set[str]]:
    """(finished, preempted) request ids of this step; a preempted request frees its
    state and comes back later under the same id, its draft never verified."""
    finished = set(getattr(scheduler_output, "finished_req_ids", None) or ())
    preempted = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
    return finished, preempted - finished


def wrap_execute_model(original: Callable[..., Any]) -> Callable[..., Any]:
    """Forward new, finished and preempted request ids to the recorders (both runners)."""

    @functools.wraps(original)
    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.recorders:
            try:
                finished, preempted = ended_request_ids(scheduler_output)
                started = {
                    str(r.req_id)
                    for r in getattr(scheduler_output, "scheduled_new_reqs", ())
                    if not is_warmup_request(str(r.req_id))
                }
                for rec in live_recorders() if finished or preempted or started else ():
                    rec.start_requests(started)
                    rec.finish_requests(finished)
                    rec.finish_requests(preempted, forget=False)
            except Exception:
                logger.exception("dsparklab: reading finished requests failed (ignored)")
        return original(self, scheduler_output, *args, **kwargs)

    return mark(execute_model, original)


def lazy_tap(
    owner: Any,
    model_runner: str,
    wanted: bool = True,
    factory: Callable[..., SpecTap] = SpecTap,
    **extra: Any,
) -> SpecTap | None:
    """The tap kept on ``owner``, made on first use (None, kept too, when not ``wanted``);
    ``factory`` and ``extra`` as :func:`make_tap` takes them."""
    if TAP_ATTR not in owner.__dict__:
        tap = None
        try:
            if wanted:
                tap = make_tap(owner, model_runner=model_runner, factory=factory, **extra)
        except Exception as err:
            logger.error("dsparklab: could not attach the taps (%s); tracing is off", err)
        owner.__dict__[TAP_ATTR] = tap
    return tap_of(owner)
