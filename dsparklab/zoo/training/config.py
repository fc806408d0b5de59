"""The drafters' settings: architecture and training run of DSpark and Eagle3, and how
they are evaluated offline.

Each tier's recipe (``TinyConfig``, ``SmolConfig``) holds one of each; the values it
ran with are dumped into the checkpoints' cards.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FrozenConfig(BaseModel):
    """A recipe part: immutable, and unknown fields are an error (a typo must not pass)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class DSparkConfig(FrozenConfig):
    """The DSpark drafter (speculators ``DSparkDraftModel``) and its training run."""

    num_layers: int = Field(default=2, description="DFlash draft decoder layers")
    block_size: int = Field(default=8, description="draft block size (speculative tokens)")
    target_layer_ids: tuple[int, ...] = Field(
        default=(1, 2, 3), description="aux hidden states: input of these target layers"
    )
    markov_rank: int = Field(default=64, description="rank r of the Markov logit bias")
    markov_head_type: Literal["vanilla", "gated", "rnn"] = Field(
        default="vanilla", description="Markov head variant"
    )
    sample_from_anchor: bool = Field(
        default=True, description="slot 0 (the anchor) also predicts (DSpark convention)"
    )
    loss_fn: str = Field(default="kl_div", description="speculators loss name (eager)")
    gamma: float = Field(default=4.0, description="DFlash per-position loss decay")
    confidence_head_alpha: float = Field(default=1.0, description="confidence BCE weight")
    sequences_per_step: int = Field(default=4, description="distill sequences packed per step")
    max_anchors: int = Field(default=192, description="anchor blocks sampled per step")
    steps: int = Field(default=1000, description="optimizer steps")
    lr: float = Field(default=2e-3, description="peak AdamW learning rate")
    warmup_steps: int = Field(default=50, description="linear warmup steps, then cosine to 10%")
    seed: int = Field(default=2, description="seed for init, packing and anchors")


class Eagle3Config(FrozenConfig):
    """The Eagle3 drafter (speculators ``Eagle3DraftModel``, llama layer) and its run."""

    num_layers: int = Field(default=1, description="draft decoder layers")
    target_layer_ids: tuple[int, ...] = Field(
        default=(1, 2, 3), description="aux hidden states: input of these target layers"
    )
    ttt_steps: int = Field(default=3, description="training-time-test unroll steps")
    loss_fn: str = Field(default="kl_div", description="speculators loss name (eager)")
    sequences_per_step: int = Field(default=4, description="distill sequences packed per step")
    steps: int = Field(default=600, description="optimizer steps")
    lr: float = Field(default=2e-3, description="peak AdamW learning rate")
    warmup_steps: int = Field(default=50, description="linear warmup steps, then cosine to 10%")
    seed: int = Field(default=3, description="seed for init and packing")


class DrafterEvalConfig(FrozenConfig):
    """How the cards' offline acceptance is measured; each tier's eval config extends it."""

    gen_len: int = Field(default=128, description="greedy tokens per prompt")
    max_n: int = Field(default=7, description="largest speculation window evaluated")
    dspark_anchors: int | None = Field(
        default=None, description="anchors per sequence in the DSpark eval (None: every position)"
    )
    seed: int = Field(default=4, description="seed for anchor sampling")
