"""Training the drafters (DSpark and Eagle3, ``speculators`` models) on target hidden states.

Shared by every tier (tiny, smol): :class:`DraftData` holds sequences and the target's
hidden states over them, :func:`train_dspark` and :func:`train_eagle3` train and save
speculators-format checkpoints that vLLM and the reference engine load. The loop
(:class:`LoopPlan`) trains for a number of steps or a wall-time budget, saves a resumable
state as it goes, and can snapshot the drafter after given amounts of data (the learning
curve).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dsparklab.zoo.load import DRAFTER_ATTN_IMPLEMENTATION
from dsparklab.zoo.tiny.config import DSPARK_NAME, EAGLE3_NAME, DSparkConfig, Eagle3Config

logger = logging.getLogger(__name__)


# --- training helpers -----------------------------------------------------------------


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warmup to 1, then cosine down to 0.1."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float, warmup: int, steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    trainable = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, steps))


def _autocast(enabled: bool) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def _num_params(module: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@dataclass
class StageReport:
    """What a stage did: wall time, steps, losses, sizes; written into the cards."""

    name: str
    seconds: float = 0.0
    steps: int = 0
    params: int = 0
    trainable_params: int = 0
    loss_first: float | None = None
    loss_last: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _smoothed(values: Sequence[float], n: int = 20) -> float:
    tail = values[-n:]
    return float(sum(tail) / len(tail))


# --- draft data ---


@dataclass
class DraftData:
    """The drafters' training set: sequences and the target's hidden states over them."""

    input_ids: torch.Tensor | list[torch.Tensor]  # [N, T], or N ragged [T_i]
    aux: torch.Tensor | list[torch.Tensor]  # [N, T, len(layer_ids) * H]
    last: torch.Tensor | list[torch.Tensor]  # [N, T, H]
    layer_ids: tuple[int, ...]
    prefix_len: int
    # Per sequence, the first position whose token is a training target (chat answers
    # start after the prompt); None: every position.
    loss_start: list[int] | None = None


def _pack(
    data: DraftData, rows: Sequence[int], *, shift: bool, mask_head: int = 0, mask_tail: int = 0
) -> dict[str, torch.Tensor]:
    """Pack sequences into one [1, total] batch with document ids and per-doc positions.

    Hidden states stored in bf16 (the smol tier's) are widened to float32 here.
    ``shift`` applies speculators' Eagle3 ``shift_batch`` per sequence (token t+1 with
    hidden t, positions from 1). ``mask_head``/``mask_tail`` zero the loss mask on each
    document's first/last positions so no target or block crosses a document boundary.
    """
    ids, aux, last, docs, pos, mask = [], [], [], [], [], []
    for doc, row in enumerate(rows):
        x, h, y = data.input_ids[row], data.aux[row].float(), data.last[row].float()
        if shift:
            x, h, y = x[1:], h[:-1], y[1:]
            p = torch.arange(1, len(x) + 1)
        else:
            p = torch.arange(len(x))
        m = torch.ones(len(x), dtype=torch.long)
        # The last prompt token is the first anchor of an answer, hence the -1.
        head = max(mask_head, data.loss_start[row] - 1 if data.loss_start else 0)
        if head:
            m[:head] = 0
        if mask_tail:
            m[-mask_tail:] = 0
        ids.append(x)
        aux.append(h)
        last.append(y)
        docs.append(torch.full((len(x),), doc, dtype=torch.long))
        pos.append(p)
        mask.append(m)
    return {
        "input_ids": torch.cat(ids).unsqueeze(0),
        "hidden_states": torch.cat(aux).unsqueeze(0),
        "verifier_last_hidden_states": torch.cat(last).unsqueeze(0),
        "document_ids": torch.cat(docs).unsqueeze(0),
        "position_ids": torch.cat(pos).unsqueeze(0),
        "loss_mask": torch.cat(mask).unsqueeze(0),
    }


def _verifier_config(target_dir: Path) -> Any:
    from speculators.config import VerifierConfig

    return VerifierConfig.from_pretrained(str(target_dir.resolve()))


def _draft_layer_kwargs(target_cfg: Any, num_layers: int) -> dict[str, Any]:
    return {
        "vocab_size": target_cfg.vocab_size,
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": target_cfg.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": target_cfg.head_dim,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_parameters": dict(target_cfg.rope_parameters),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": target_cfg.bos_token_id,
        "eos_token_id": target_cfg.eos_token_id,
        "pad_token_id": target_cfg.pad_token_id,
    }


def _save_drafter(model: Any, out: Path, target_dir: Path, architectures: list[str]) -> None:
    """save_pretrained with the verifier path written relative to the drafter dir.

    ``save_pretrained`` stamps the Python class name into ``architectures`` and copies
    speculators' config source (``config.py`` + ``auto_map``); the saved config gets the
    architecture name vLLM reads instead, and no copied source.
    """
    verifier = model.config.speculators_config.verifier
    absolute = verifier.name_or_path
    verifier.name_or_path = os.path.relpath(target_dir.resolve(), out.resolve())
    try:
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
    finally:
        verifier.name_or_path = absolute
    config_path = out / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["architectures"] = architectures
    config.pop("auto_map", None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "config.py").unlink(missing_ok=True)


@dataclass(frozen=True)
class LoopPlan:
    """How long a drafter trains, and what it leaves on the way.

    Attributes
    ----------
    steps : int
        Optimizer steps; with ``time_budget_s`` only the first estimate (the schedule's
        length is re-estimated from the measured step time every ``REPLAN_EVERY`` steps,
        and training stops when the budget is spent).
    time_budget_s : float or None
        Training wall seconds (summed over resumed runs); None trains ``steps`` steps.
    state_path : Path or None
        Where the resumable state (weights, optimizer, schedule, step) is saved every
        ``checkpoint_s`` seconds and at the end; an existing file is resumed from.
    checkpoint_s : float
        Seconds between state saves.
    milestones : tuple of int
        Answer tokens seen (first pass over the data) after which ``on_milestone`` is
        called with that count: the learning curve's snapshots.
    """

    steps: int
    time_budget_s: float | None = None
    state_path: Path | None = None
    checkpoint_s: float = 300.0
    milestones: tuple[int, ...] = ()


REPLAN_EVERY = 100


class BatchStream:
    """The rows of step ``k``: passes over the data, the first in data order, later ones
    in seeded permutations, ``per_step`` rows a step. A pure function of ``k``, so a
    resumed run draws the batches it would have drawn."""

    def __init__(self, data: DraftData, per_step: int, seed: int):
        self.num = len(data.input_ids)
        self.per_step = min(per_step, self.num)
        self.seed = seed
        starts = data.loss_start or [0] * self.num
        answer = [len(ids) - start for ids, start in zip(data.input_ids, starts, strict=True)]
        self._cum_answer = np.cumsum(answer)

    def rows(self, step: int) -> list[int]:
        first = step * self.per_step
        out = []
        for k in range(first, first + self.per_step):
            epoch, index = divmod(k, self.num)
            order = (
                np.arange(self.num)
                if epoch == 0
                else np.random.default_rng([self.seed, epoch]).permutation(self.num)
            )
            out.append(int(order[index]))
        return out

    def answer_tokens_seen(self, steps_done: int) -> int:
        """Distinct answer tokens in the rows of the first ``steps_done`` steps."""
        rows = min(steps_done * self.per_step, self.num)
        return int(self._cum_answer[rows - 1]) if rows else 0


def _train_loop(
    name: str,
    model: Any,
    plan: LoopPlan,
    lr: float,
    warmup: int,
    stream: BatchStream,
    step_fn: Callable[[list[int]], tuple[torch.Tensor, dict[str, Any]]],
    metric_fn: Callable[[dict[str, Any]], dict[str, float]],
    autocast_bf16: bool,
    on_milestone: Callable[[int], None] | None = None,
) -> tuple[list[float], dict[str, float], dict[str, Any]]:
    """Train until ``plan`` says stop; returns losses, last metrics and a summary."""
    schedule = {"total": plan.steps}
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_lambda(warmup, schedule["total"])(step)
    )
    step, elapsed, losses = 0, 0.0, []
    if plan.state_path is not None and plan.state_path.is_file():
        state = torch.load(plan.state_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, elapsed, losses = state["step"], state["elapsed"], state["losses"]
        schedule["total"] = state["total"]
        logger.info("%s: resumed at step %d (%.0f s trained)", name, step, elapsed)

    def save_state() -> None:
        if plan.state_path is None:
            return
        tmp = plan.state_path.with_name(plan.state_path.name + ".tmp")
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "step": step,
            "elapsed": elapsed,
            "losses": losses,
            "total": schedule["total"],
        }
        torch.save(state, tmp)
        tmp.replace(plan.state_path)

    def done() -> bool:
        if plan.time_budget_s is not None:
            return elapsed >= plan.time_budget_s
        return step >= schedule["total"]

    model.train()
    last_metrics: dict[str, float] = {}
    last_save = time.monotonic()
    bar = tqdm(desc=name, unit="step", initial=step, total=schedule["total"])
    while not done():
        started = time.perf_counter()
        torch.manual_seed(stream.seed * 1_000_003 + step)  # anchors etc.: a function of step
        with _autocast(autocast_bf16):
            loss, metrics = step_fn(stream.rows(step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        last_metrics = metric_fn(metrics)
        step += 1
        elapsed += time.perf_counter() - started
        if plan.time_budget_s is not None and step % REPLAN_EVERY == 0:
            schedule["total"] = step + int((plan.time_budget_s - elapsed) / (elapsed / step))
            bar.total = schedule["total"]
        seen_before, seen = stream.answer_tokens_seen(step - 1), stream.answer_tokens_seen(step)
        for mark in plan.milestones:
            if seen_before < mark <= seen and on_milestone is not None:
                model.eval()
                on_milestone(mark)
                model.train()
        bar.update(1)
        bar.set_postfix(
            loss=f"{_smoothed(losses):.3f}",
            **{k: f"{v:.2f}" for k, v in list(last_metrics.items())[:2]},
        )
        if time.monotonic() - last_save > plan.checkpoint_s:
            save_state()
            last_save = time.monotonic()
    bar.close()
    save_state()
    model.eval()
    summary = {
        "steps": step,
        "train_seconds": round(elapsed, 1),
        "answer_tokens_seen": stream.answer_tokens_seen(step),
        "passes_over_data": round(step * stream.per_step / stream.num, 3),
    }
    return losses, last_metrics, summary


def _ratio(metrics: dict[str, Any], key: str) -> float:
    total = float(metrics[f"{key}_total"])
    return float(metrics[f"{key}_sum"]) / total if total else float("nan")


@dataclass(frozen=True)
class StageSettings:
    """What one drafter's training run is given besides its model and loss."""

    cfg: DSparkConfig | Eagle3Config
    data: DraftData
    plan: LoopPlan | None
    autocast_bf16: bool
    out: Path
    snapshot_dir: Path | None


def _run_stage(
    name: str,
    model: Any,
    settings: StageSettings,
    step_fn: Callable[[list[int]], tuple[torch.Tensor, dict[str, Any]]],
    metric_fn: Callable[[dict[str, Any]], dict[str, float]],
    save: Callable[[Path], None],
    report: StageReport,
) -> None:
    """Train by the plan (snapshots at its milestones), save to ``out``, fill ``report``."""
    cfg, snapshot_dir, out = settings.cfg, settings.snapshot_dir, settings.out
    plan = settings.plan or LoopPlan(steps=cfg.steps)

    def snapshot(tokens: int) -> Path | None:
        return None if snapshot_dir is None else snapshot_dir / f"{out.name}-{tokens}"

    def on_milestone(tokens: int) -> None:
        path = snapshot(tokens)
        if path is not None:
            save(path)

    stream = BatchStream(settings.data, cfg.sequences_per_step, cfg.seed)
    losses, last, summary = _train_loop(
        name,
        model,
        plan,
        cfg.lr,
        cfg.warmup_steps,
        stream,
        step_fn,
        metric_fn,
        settings.autocast_bf16,
        on_milestone,
    )
    save(out)
    report.steps = summary["steps"]
    report.loss_first, report.loss_last = losses[0], _smoothed(losses)
    report.extra["last_step_metrics"] = {k: round(v, 4) for k, v in last.items()}
    report.extra.update(summary)
    # from disk: a resumed run took its earlier snapshots in another process
    snapshots = {
        tokens: str(path)
        for tokens in plan.milestones
        if (path := snapshot(tokens)) is not None and (path / "config.json").is_file()
    }
    if snapshots:
        report.extra["snapshots"] = snapshots


# --- DSpark ---------------------------------------------------------------------------


def train_dspark(
    cfg: DSparkConfig,
    data: DraftData,
    target_dir: Path,
    out_dir: Path,
    mask_token_id: int,
    *,
    autocast_bf16: bool = False,
    name: str = DSPARK_NAME,
    vocab: VocabMapping | None = None,
    plan: LoopPlan | None = None,
    snapshot_dir: Path | None = None,
) -> tuple[Any, StageReport]:
    """Train the DSpark drafter on the draft data; save it in speculators format.

    ``vocab`` restricts the drafter to a draft vocabulary (its lm_head rows are the
    target's rows ``t2d``; vLLM maps drafted ids back with ``d2t``). ``plan`` (default:
    ``cfg.steps`` steps) sets the length, resumable state and milestones; each milestone
    saves a loadable checkpoint ``snapshot_dir/<name>-<tokens>``.
    """
    from speculators.config import SpeculatorsConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig, Qwen3Config

    report = StageReport("dspark")
    start = time.time()
    cpu_start = time.process_time()
    target_cfg = AutoConfig.from_pretrained(target_dir)
    layer_cfg = Qwen3Config(
        **_draft_layer_kwargs(target_cfg, cfg.num_layers),
        layer_types=["full_attention"] * cfg.num_layers,
    )
    layer_cfg._attn_implementation = DRAFTER_ATTN_IMPLEMENTATION
    speculative_tokens = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
    config = DSparkSpeculatorConfig(
        architectures=["Qwen3DSparkModel"],
        transformer_layer_config=layer_cfg,
        draft_vocab_size=target_cfg.vocab_size if vocab is None else vocab.size,
        target_hidden_size=target_cfg.hidden_size,
        block_size=cfg.block_size,
        aux_hidden_state_layer_ids=list(cfg.target_layer_ids),
        mask_token_id=mask_token_id,
        sample_from_anchor=cfg.sample_from_anchor,
        markov_rank=cfg.markov_rank,
        markov_head_type=cfg.markov_head_type,
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
            default_proposal_method="greedy",
            verifier=_verifier_config(target_dir),
        ),
    )
    model = _new_drafter(DSparkDraftModel, config, cfg.seed, vocab, report)
    loss_config = resolve_loss_config(cfg.loss_fn, "eager")
    tv_loss_fn = resolve_loss_config("tv", "eager")["tv"][0]

    def step_fn(rows: list[int]) -> tuple[torch.Tensor, dict[str, Any]]:
        batch = _pack(data, rows, shift=False, mask_tail=cfg.block_size)
        _, loss, metrics = model(
            **batch,
            loss_config=loss_config,
            tv_loss_fn=tv_loss_fn,
            gamma=cfg.gamma,
            max_anchors=cfg.max_anchors,
            confidence_head_alpha=cfg.confidence_head_alpha,
        )
        return loss, metrics

    def metric_fn(m: dict[str, Any]) -> dict[str, float]:
        out = {"acc": _ratio(m, "full_acc"), "eal": _ratio(m, "eal")}
        out.update(
            {
                f"pos{p}": _ratio(m, f"position_{p}_acc")
                for p in range(cfg.block_size)
                if f"position_{p}_acc_sum" in m
            }
        )
        return out

    def save(out: Path) -> None:
        _save_drafter(model, out, target_dir, ["Qwen3DSparkModel"])
        if vocab is not None:
            _rewrite_checkpoint(
                out / "model.safetensors", lambda t: _with_draft_vocabulary(model, t)
            )

    settings = StageSettings(cfg, data, plan, autocast_bf16, out_dir / name, snapshot_dir)
    _run_stage("dspark", model, settings, step_fn, metric_fn, save, report)
    report.seconds = time.time() - start
    report.extra["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
    return model, report


# --- Eagle3 ---------------------------------------------------------------------------


def train_eagle3(
    cfg: Eagle3Config,
    data: DraftData,
    target_dir: Path,
    out_dir: Path,
    *,
    autocast_bf16: bool = False,
    name: str = EAGLE3_NAME,
    vocab: VocabMapping | None = None,
    plan: LoopPlan | None = None,
    snapshot_dir: Path | None = None,
) -> tuple[Any, StageReport]:
    """Train the Eagle3 drafter on the draft data; save it in speculators eagle3 format.

    The checkpoint omits ``embed_tokens`` and, for a full-vocabulary drafter, ``lm_head``
    (frozen copies of the target's): speculators reloads them from the target, vLLM
    shares the target's. With ``vocab`` the lm_head is the draft-vocabulary slice and
    is kept, with ``d2t``/``t2d``. ``plan`` and ``snapshot_dir`` as for
    :func:`train_dspark`.
    """
    from speculators.config import SpeculatorsConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig, LlamaConfig

    report = StageReport("eagle3")
    start = time.time()
    cpu_start = time.process_time()
    target_cfg = AutoConfig.from_pretrained(target_dir)
    layer_cfg = LlamaConfig(**_draft_layer_kwargs(target_cfg, cfg.num_layers))
    layer_cfg._attn_implementation = DRAFTER_ATTN_IMPLEMENTATION
    config = Eagle3SpeculatorConfig(
        architectures=["LlamaForCausalLMEagle3"],
        transformer_layer_config=layer_cfg,
        draft_vocab_size=target_cfg.vocab_size if vocab is None else vocab.size,
        norm_before_residual=True,
        norm_before_fc=True,
        norm_output=True,
        eagle_aux_hidden_state_layer_ids=list(cfg.target_layer_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=cfg.ttt_steps)],
            default_proposal_method="greedy",
            verifier=_verifier_config(target_dir),
        ),
    )
    model = _new_drafter(Eagle3DraftModel, config, cfg.seed, vocab, report)
    loss_config = resolve_loss_config(cfg.loss_fn, "eager")

    def step_fn(rows: list[int]) -> tuple[torch.Tensor, dict[str, Any]]:
        batch = _pack(data, rows, shift=True, mask_head=cfg.ttt_steps)
        _, loss, metrics = model(
            **batch, ttt_steps=cfg.ttt_steps, ttt_step_loss_decay=1.0, loss_config=loss_config
        )
        return loss, metrics

    def metric_fn(m: dict[str, Any]) -> dict[str, float]:
        return {f"cond{k}": _ratio(m, f"cond_acc_{k}") for k in range(cfg.ttt_steps)}

    shared = (
        ("embed_tokens.weight",) if vocab is not None else ("embed_tokens.weight", "lm_head.weight")
    )

    def drop_shared_then_add_vocab(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        kept = {k: v for k, v in tensors.items() if k not in shared}
        return kept if vocab is None else _with_draft_vocabulary(model, kept)

    def save(out: Path) -> None:
        _save_drafter(model, out, target_dir, ["LlamaForCausalLMEagle3"])
        _rewrite_checkpoint(out / "model.safetensors", drop_shared_then_add_vocab)

    settings = StageSettings(cfg, data, plan, autocast_bf16, out_dir / name, snapshot_dir)
    _run_stage("eagle3", model, settings, step_fn, metric_fn, save, report)
    report.seconds = time.time() - start
    report.extra["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
    return model, report


def _new_drafter(
    model_class: Any, config: Any, seed: int, vocab: VocabMapping | None, report: StageReport
) -> Any:
    """A seeded speculators drafter with the target's embedding/LM head (and draft vocab)."""
    torch.manual_seed(seed)
    model = model_class(config)
    if vocab is not None:
        model.load_vocab_mappings(vocab.t2d, vocab.d2t)
    model.load_verifier_weights()
    model.float()
    report.params = _num_params(model)
    report.trainable_params = _num_params(model, trainable_only=True)
    return model


@dataclass(frozen=True)
class VocabMapping:
    """A draft vocabulary: ``d2t`` offsets ``[V_draft]`` and ``t2d`` mask ``[V_target]``."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.d2t.shape[0])


def _with_draft_vocabulary(model: Any, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Make a reduced-vocabulary checkpoint's tensors self-contained and bf16.

    vLLM cannot share the target's full lm_head with a draft-vocabulary drafter, so the
    sliced lm_head, ``d2t`` and ``t2d`` are written; float tensors are stored in bf16
    (loaders upcast).
    """
    tensors = dict(tensors)
    tensors.setdefault("lm_head.weight", model.lm_head.weight.detach().clone())
    tensors["d2t"] = model.d2t.detach().clone()
    tensors["t2d"] = model.t2d.detach().clone()
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}


def _rewrite_checkpoint(
    path: Path, edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> None:
    """Replace a safetensors file by ``edit`` of its tensors, atomically."""
    from safetensors.torch import load_file, save_file

    tmp = path.with_suffix(".tmp")
    save_file(edit(load_file(path)), tmp, metadata={"format": "pt"})
    tmp.replace(path)


def _select_layers(data: DraftData, wanted: Sequence[int]) -> DraftData:
    """The draft data restricted to some aux layers (in the order given)."""
    if tuple(wanted) == data.layer_ids:
        return data
    if not isinstance(data.aux, torch.Tensor):
        raise ValueError("layer selection needs padded [N, T, F] draft data, not ragged lists")
    hidden = data.aux.shape[-1] // len(data.layer_ids)
    chunks = [
        data.aux[..., data.layer_ids.index(i) * hidden : (data.layer_ids.index(i) + 1) * hidden]
        for i in wanted
    ]
    aux = torch.cat(chunks, dim=-1)
    return DraftData(data.input_ids, aux, data.last, tuple(wanted), data.prefix_len)


def stage_json(report: StageReport) -> dict[str, Any]:
    """A StageReport as plain JSON."""
    return json.loads(
        json.dumps(
            {
                "seconds": round(report.seconds, 1),
                "steps": report.steps,
                "params": report.params,
                "trainable_params": report.trainable_params,
                "loss_first": report.loss_first,
                "loss_last": report.loss_last,
                **report.extra,
            }
        )
    )
