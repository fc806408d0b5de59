"""The smol tier's recipe: prompt set, distillation data, both drafters, evaluation.

``SmolConfig()`` is what ``dsparklab zoo train --tier smol`` runs and what made the
committed ``smol-dspark`` and ``smol-eagle3``; the config is dumped into their cards.
The drafter sections reuse the tiny tier's field definitions with smol-sized defaults.
"""

from __future__ import annotations

from pydantic import Field

from dsparklab.zoo.tiny.config import DSparkConfig, Eagle3Config, _Frozen

DSPARK_NAME = "smol-dspark"
EAGLE3_NAME = "smol-eagle3"
# <empty_output>: a special token that chat data never contains, used as DSpark's mask.
MASK_TOKEN = "<empty_output>"
# vLLM's Eagle3 default for a 30-layer target: outputs of layers 2, 15 and 27, i.e. the
# residual stream entering layers 3, 16 and 28 (dsparklab.zoo.hidden's convention).
AUX_LAYERS = (3, 16, 28)


class PromptSetConfig(_Frozen):
    """The training prompts (:mod:`dsparklab.instruct_prompts`, training splits only)."""

    code: int = Field(default=520, description="stdlib-function code requests")
    math: int = Field(default=300, description="math word problems (training templates)")
    prose: bool = Field(default=True, description="all training-split prose requests (336)")
    seed: int = Field(default=0, description="seed for problem numbers and code order")


class ResponseConfig(_Frozen):
    """The target's own greedy answers, the drafters' training text."""

    max_new_tokens: int = Field(default=128, description="greedy tokens per answer (or EOS)")
    batch_size: int = Field(default=16, description="prompts per left-padded generate batch")
    draft_vocab_size: int = Field(
        default=8192, description="draft vocabulary: the most frequent answer tokens (d2t/t2d)"
    )


class SmolEvalConfig(_Frozen):
    """The evaluation written on the cards (held-out prompts, offline acceptance)."""

    humaneval_prompts: int = Field(default=40, description="HumanEval prompts")
    instruct_prompts: int = Field(default=40, description="held-out instruct prompts")
    gen_len: int = Field(default=128, description="greedy tokens per prompt")
    max_n: int = Field(default=7, description="largest speculation window evaluated")
    dspark_anchors: int | None = Field(default=None, description="anchors per sequence")
    seed: int = Field(default=4, description="seed for anchor sampling")


class SmolConfig(_Frozen):
    """The whole smol tier."""

    tier: str = Field(default="smol", description="recipe name")
    threads: int = Field(default=2, description="torch CPU threads for generation")
    train_threads: int = Field(
        default=1, description="torch threads per drafter (DSpark and Eagle3 train in parallel)"
    )
    autocast_bf16: bool = Field(default=True, description="train under CPU bf16 autocast")
    prompts: PromptSetConfig = Field(default_factory=PromptSetConfig, description="prompts")
    responses: ResponseConfig = Field(default_factory=ResponseConfig, description="answers")
    dspark: DSparkConfig = Field(
        default_factory=lambda: DSparkConfig(
            num_layers=1,
            block_size=8,
            target_layer_ids=AUX_LAYERS,
            markov_rank=128,
            sequences_per_step=4,
            max_anchors=96,
            steps=6000,
            lr=1e-3,
            warmup_steps=100,
        ),
        description="DSpark drafter",
    )
    eagle3: Eagle3Config = Field(
        default_factory=lambda: Eagle3Config(
            num_layers=1,
            target_layer_ids=AUX_LAYERS,
            ttt_steps=3,
            sequences_per_step=4,
            steps=2800,
            lr=1e-3,
            warmup_steps=100,
        ),
        description="Eagle3 drafter",
    )
    eval: SmolEvalConfig = Field(default_factory=SmolEvalConfig, description="card evaluation")

    @classmethod
    def smoke(cls) -> SmolConfig:
        """A minute-long run of the same pipeline (tests): 6 prompts, 3 steps per drafter."""
        base = cls()
        return cls(
            tier="smol-smoke",
            prompts=PromptSetConfig(code=2, math=2, prose=False),
            responses=ResponseConfig(max_new_tokens=24, batch_size=4, draft_vocab_size=512),
            dspark=base.dspark.model_copy(
                update={"steps": 3, "warmup_steps": 1, "max_anchors": 8, "markov_rank": 8}
            ),
            eagle3=base.eagle3.model_copy(update={"steps": 3, "warmup_steps": 1}),
            eval=SmolEvalConfig(humaneval_prompts=1, instruct_prompts=2, gen_len=24),
        )
