"""``train_dspark`` and ``train_eagle3``: one drafter's training run, saved in
speculators format (what vLLM and the reference engine load).

Both take the drafter's settings and a :class:`DrafterRun` (what the tier gives every
drafter: data, target, output, draft vocabulary, loop plan); they differ in the model,
its loss and what the checkpoint keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsparklab.zoo.load import DRAFTER_ATTN_IMPLEMENTATION
from dsparklab.zoo.training.checkpoint import (
    VocabMapping,
    draft_layer_kwargs,
    new_drafter,
    rewrite_checkpoint,
    save_drafter,
    verifier_config,
    with_draft_vocabulary,
)
from dsparklab.zoo.training.config import DSparkConfig, Eagle3Config
from dsparklab.zoo.training.data import BatchStream, DraftData, pack_batch
from dsparklab.zoo.training.loop import LoopPlan, train_loop
from dsparklab.zoo.training.report import StageReport, smoothed, stage_clock

StepFn = Callable[[list[int]], tuple[torch.Tensor, dict[str, Any]]]
MetricFn = Callable[[dict[str, Any]], dict[str, float]]


@dataclass(frozen=True)
class DrafterRun:
    """What a tier gives each drafter's training run besides its settings.

    Attributes
    ----------
    data : DraftData
        Sequences and the target's hidden states (the drafter's aux layers only).
    target_dir : Path
        The target checkpoint (embedding and LM head; the verifier path in the config).
    out : Path
        The drafter checkpoint directory written.
    autocast_bf16 : bool
        Train under CPU bf16 autocast.
    vocab : VocabMapping or None
        A draft vocabulary (lm_head rows ``t2d``; vLLM maps drafted ids back with
        ``d2t``); None drafts over the target's whole vocabulary.
    plan : LoopPlan or None
        Length, resumable state and milestones; None trains the settings' ``steps``.
    snapshot_dir : Path or None
        Each milestone saves a loadable checkpoint ``snapshot_dir/<out.name>-<tokens>``.
    """

    data: DraftData
    target_dir: Path
    out: Path
    autocast_bf16: bool = False
    vocab: VocabMapping | None = None
    plan: LoopPlan | None = None
    snapshot_dir: Path | None = None


def _ratio(metrics: dict[str, Any], key: str) -> float:
    total = float(metrics[f"{key}_total"])
    return float(metrics[f"{key}_sum"]) / total if total else float("nan")


def _run_stage(
    cfg: DSparkConfig | Eagle3Config,
    run: DrafterRun,
    model: Any,
    step_fn: StepFn,
    metric_fn: MetricFn,
    save: Callable[[Path], None],
    report: StageReport,
) -> None:
    """Train by the plan (snapshots at its milestones), save to ``run.out``, fill ``report``."""
    plan = run.plan or LoopPlan(steps=cfg.steps)

    def snapshot(tokens: int) -> Path | None:
        return None if run.snapshot_dir is None else run.snapshot_dir / f"{run.out.name}-{tokens}"

    def on_milestone(tokens: int) -> None:
        path = snapshot(tokens)
        if path is not None:
            save(path)

    stream = BatchStream(run.data, cfg.sequences_per_step, cfg.seed)
    losses, last, summary = train_loop(
        report.name,
        model,
        plan,
        cfg.lr,
        cfg.warmup_steps,
        stream,
        step_fn,
        metric_fn,
        run.autocast_bf16,
        on_milestone,
    )
    save(run.out)
    report.steps = summary["steps"]
    report.loss_first, report.loss_last = losses[0], smoothed(losses)
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


def _proposal_config(algorithm: str, speculative_tokens: int, target_dir: Path) -> Any:
    from speculators.config import SpeculatorsConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return SpeculatorsConfig(
        algorithm=algorithm,
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
        default_proposal_method="greedy",
        verifier=verifier_config(target_dir),
    )


def train_dspark(cfg: DSparkConfig, run: DrafterRun, mask_token_id: int) -> tuple[Any, StageReport]:
    """Train the DSpark drafter on the draft data; save it in speculators format.

    DFlash block backbone, Markov logit-bias head and confidence head (with the Markov
    embedding); ``mask_token_id`` fills the block's slots after the anchor.
    """
    from speculators.losses import resolve_loss_config
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from transformers import AutoConfig, Qwen3Config

    with stage_clock(StageReport("dspark")) as report:
        target_cfg = AutoConfig.from_pretrained(run.target_dir)
        layer_cfg = Qwen3Config(
            **draft_layer_kwargs(target_cfg, cfg.num_layers),
            layer_types=["full_attention"] * cfg.num_layers,
        )
        layer_cfg._attn_implementation = DRAFTER_ATTN_IMPLEMENTATION
        speculative_tokens = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
        config = DSparkSpeculatorConfig(
            architectures=["Qwen3DSparkModel"],
            transformer_layer_config=layer_cfg,
            draft_vocab_size=target_cfg.vocab_size if run.vocab is None else run.vocab.size,
            target_hidden_size=target_cfg.hidden_size,
            block_size=cfg.block_size,
            aux_hidden_state_layer_ids=list(cfg.target_layer_ids),
            mask_token_id=mask_token_id,
            sample_from_anchor=cfg.sample_from_anchor,
            markov_rank=cfg.markov_rank,
            markov_head_type=cfg.markov_head_type,
            enable_confidence_head=True,
            confidence_head_with_markov=True,
            speculators_config=_proposal_config("dspark", speculative_tokens, run.target_dir),
        )
        model = new_drafter(DSparkDraftModel, config, cfg.seed, run.vocab, report)
        loss_config = resolve_loss_config(cfg.loss_fn, "eager")
        tv_loss_fn = resolve_loss_config("tv", "eager")["tv"][0]

        def step_fn(rows: list[int]) -> tuple[torch.Tensor, dict[str, Any]]:
            batch = pack_batch(run.data, rows, shift=False, mask_tail=cfg.block_size)
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
            save_drafter(model, out, run.target_dir, ["Qwen3DSparkModel"])
            if run.vocab is not None:
                rewrite_checkpoint(
                    out / "model.safetensors", lambda t: with_draft_vocabulary(model, t)
                )

        _run_stage(cfg, run, model, step_fn, metric_fn, save, report)
    return model, report


def train_eagle3(cfg: Eagle3Config, run: DrafterRun) -> tuple[Any, StageReport]:
    """Train the Eagle3 drafter on the draft data; save it in speculators eagle3 format.

    The checkpoint omits ``embed_tokens`` and, for a full-vocabulary drafter, ``lm_head``
    (frozen copies of the target's): speculators reloads them from the target, vLLM
    shares the target's. With a draft vocabulary the lm_head is its slice and is kept,
    with ``d2t``/``t2d``.
    """
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from transformers import AutoConfig, LlamaConfig

    with stage_clock(StageReport("eagle3")) as report:
        target_cfg = AutoConfig.from_pretrained(run.target_dir)
        layer_cfg = LlamaConfig(**draft_layer_kwargs(target_cfg, cfg.num_layers))
        layer_cfg._attn_implementation = DRAFTER_ATTN_IMPLEMENTATION
        config = Eagle3SpeculatorConfig(
            architectures=["LlamaForCausalLMEagle3"],
            transformer_layer_config=layer_cfg,
            draft_vocab_size=target_cfg.vocab_size if run.vocab is None else run.vocab.size,
            norm_before_residual=True,
            norm_before_fc=True,
            norm_output=True,
            eagle_aux_hidden_state_layer_ids=list(cfg.target_layer_ids),
            speculators_config=_proposal_config("eagle3", cfg.ttt_steps, run.target_dir),
        )
        model = new_drafter(Eagle3DraftModel, config, cfg.seed, run.vocab, report)
        loss_config = resolve_loss_config(cfg.loss_fn, "eager")

        def step_fn(rows: list[int]) -> tuple[torch.Tensor, dict[str, Any]]:
            batch = pack_batch(run.data, rows, shift=True, mask_head=cfg.ttt_steps)
            _, loss, metrics = model(
                **batch, ttt_steps=cfg.ttt_steps, ttt_step_loss_decay=1.0, loss_config=loss_config
            )
            return loss, metrics

        def metric_fn(m: dict[str, Any]) -> dict[str, float]:
            return {f"cond{k}": _ratio(m, f"cond_acc_{k}") for k in range(cfg.ttt_steps)}

        vocab = run.vocab
        shared = (
            ("embed_tokens.weight",)
            if vocab is not None
            else ("embed_tokens.weight", "lm_head.weight")
        )

        def drop_shared_then_add_vocab(
            tensors: dict[str, torch.Tensor],
        ) -> dict[str, torch.Tensor]:
            kept = {k: v for k, v in tensors.items() if k not in shared}
            return kept if vocab is None else with_draft_vocabulary(model, kept)

        def save(out: Path) -> None:
            save_drafter(model, out, run.target_dir, ["LlamaForCausalLMEagle3"])
            rewrite_checkpoint(out / "model.safetensors", drop_shared_then_add_vocab)

        _run_stage(cfg, run, model, step_fn, metric_fn, save, report)
    return model, report
