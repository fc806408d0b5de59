"""The smol tier's recipe: distillation data at scale, both drafters, calibration, evaluation.

``SmolConfig()`` is what ``dsparklab zoo train --tier smol`` runs and what made the
committed ``smol-dspark`` and ``smol-eagle3``; the config is dumped into their cards.
The drafter sections reuse the tiny tier's field definitions with smol-sized defaults.

Capacity (DSpark): the Kimi-K2.6 card's drafter has 3 layers, block 8, Markov rank 256 and
a confidence head fed the Markov embedding. On this target a draft layer costs about a
thirtieth of a target forward, so depth is cheap at decode time, but every layer slows
training on two CPU cores, and the budget is fixed: the recipe keeps block 8, rank 256
and the confidence head, and uses 2 layers (see the cards for the measured draft cost).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from dsparklab.zoo.distill import DistillConfig
from dsparklab.zoo.training.config import (
    DrafterEvalConfig,
    DSparkConfig,
    Eagle3Config,
    FrozenConfig,
)

DSPARK_NAME = "smol-dspark"
EAGLE3_NAME = "smol-eagle3"
# <empty_output>: a special token that chat data never contains, used as DSpark's mask.
MASK_TOKEN = "<empty_output>"
# vLLM's Eagle3 default for a 30-layer target: outputs of layers 2, 15 and 27, i.e. the
# residual stream entering layers 3, 16 and 28 (dsparklab.zoo.hidden's convention).
AUX_LAYERS = (3, 16, 28)
# Both drafters see the same hidden states, batches and schedule: only the model differs.
SHARED_RUN: dict[str, Any] = {
    "target_layer_ids": AUX_LAYERS,
    "sequences_per_step": 4,
    "lr": 1e-3,
    "warmup_steps": 200,
}


class TrainBudgetConfig(FrozenConfig):
    """What both drafters get alike: data, wall time, learning-curve snapshots."""

    # 45 minutes: both drafters train at once (one core each), so the recipe, the card
    # evaluation and the decode-time traces fit one working session on this machine.
    minutes: float | None = Field(
        default=45.0,
        description="training wall minutes per drafter (same for both); None: fixed steps",
    )
    draft_vocab_size: int = Field(
        default=8192, description="draft vocabulary: the most frequent answer tokens (d2t/t2d)"
    )
    curve_tokens: tuple[int, ...] = Field(
        default=(100_000, 300_000, 1_000_000),
        description="answer tokens seen (first pass) at which a snapshot is evaluated",
    )
    checkpoint_minutes: float = Field(default=5.0, description="resumable state saved this often")


class CalibrationConfig(FrozenConfig):
    """Sequential temperature scaling of DSpark's confidence head, on training answers."""

    sequences: int = Field(default=200, description="training sequences the fit uses")
    anchors: int = Field(default=48, description="blocks per sequence")
    seed: int = Field(default=5, description="seed for the sequence and anchor choice")


class SmolEvalConfig(DrafterEvalConfig):
    """The evaluation written on the cards (held-out prompts, offline acceptance)."""

    datasets: tuple[str, ...] = Field(
        default=("gsm8k", "humaneval", "mtbench", "aime"), description="held-out sets"
    )
    prompts: int = Field(default=40, description="prompts per set")
    curve_datasets: tuple[str, ...] = Field(
        default=("gsm8k", "humaneval"), description="sets the learning curve is measured on"
    )
    curve_prompts: int = Field(default=20, description="prompts per set for the curve")


class SmolConfig(FrozenConfig):
    """The whole smol tier."""

    tier: str = Field(default="smol", description="recipe name")
    threads: int = Field(default=2, description="torch CPU threads for hidden states, eval")
    train_threads: int = Field(
        default=1, description="torch threads per drafter (DSpark and Eagle3 train in parallel)"
    )
    autocast_bf16: bool = Field(default=True, description="train under CPU bf16 autocast")
    distill: DistillConfig = Field(
        default_factory=DistillConfig, description="the target's greedy answers"
    )
    budget: TrainBudgetConfig = Field(
        default_factory=TrainBudgetConfig, description="shared budget"
    )
    dspark: DSparkConfig = Field(
        default_factory=lambda: DSparkConfig(
            num_layers=2, block_size=8, markov_rank=256, max_anchors=96, steps=8000, **SHARED_RUN
        ),
        description="DSpark drafter (steps: first estimate; the budget decides)",
    )
    eagle3: Eagle3Config = Field(
        default_factory=lambda: Eagle3Config(num_layers=1, ttt_steps=3, steps=4000, **SHARED_RUN),
        description="Eagle3 drafter (steps: first estimate; the budget decides)",
    )
    calibration: CalibrationConfig = Field(
        default_factory=CalibrationConfig, description="confidence calibration"
    )
    eval: SmolEvalConfig = Field(default_factory=SmolEvalConfig, description="card evaluation")

    @classmethod
    def smoke(cls) -> SmolConfig:
        """A minutes-long run of the same pipeline (tests): a few answers, seconds of training."""
        base = cls()
        return cls(
            tier="smol-smoke",
            distill=DistillConfig(
                max_new_tokens=24,
                chunk_prompts=4,
                token_goal=150,
                max_num_seqs=8,
                kv_cache_gib=0.25,
            ),
            budget=TrainBudgetConfig(
                minutes=None, draft_vocab_size=512, curve_tokens=(40,), checkpoint_minutes=0.05
            ),
            dspark=base.dspark.model_copy(
                update={"steps": 3, "warmup_steps": 1, "max_anchors": 8, "markov_rank": 8}
            ),
            eagle3=base.eagle3.model_copy(update={"steps": 3, "warmup_steps": 1}),
            calibration=CalibrationConfig(sequences=4, anchors=4),
            eval=SmolEvalConfig(
                datasets=("gsm8k", "humaneval"),
                prompts=1,
                curve_datasets=("gsm8k",),
                curve_prompts=1,
                gen_len=24,
            ),
        )
