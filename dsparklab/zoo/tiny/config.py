"""The tiny tier's recipe: every size, step count and seed, in one self-describing config.

``TinyConfig()`` is what ``dsparklab zoo train --tier tiny`` runs and what made the
committed checkpoints under ``data/zoo/``; ``TinyConfig.smoke()`` is a seconds-long
variant of the same pipeline for tests. The config is dumped verbatim into each
checkpoint's ``card.json``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dsparklab.zoo.training.config import (
    DrafterEvalConfig,
    DSparkConfig,
    Eagle3Config,
    FrozenConfig,
)

TARGET_NAME = "tiny-target"
DSPARK_NAME = "tiny-dspark"
EAGLE3_NAME = "tiny-eagle3"

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"

Stage = Literal["target", "dspark", "eagle3"]
STAGES: tuple[Stage, ...] = ("target", "dspark", "eagle3")


class CorpusConfig(FrozenConfig):
    """What the target and its tokenizer are trained on."""

    code_max_file_bytes: int = Field(
        default=300_000, description="skip stdlib .py files larger than this (generated tables)"
    )
    code_max_total_bytes: int | None = Field(
        default=None, description="stop adding stdlib files past this many bytes (None: all)"
    )
    prose_repeat: int = Field(
        default=3, description="times the (small) prose training split is repeated in the stream"
    )
    val_fraction: float = Field(
        default=0.01, description="tail fraction of the token stream kept for validation loss"
    )


class TokenizerConfig(FrozenConfig):
    """Byte-level BPE trained with ``tokenizers`` on the corpus."""

    vocab_size: int = Field(default=4096, description="BPE vocabulary size incl. special tokens")
    min_frequency: int = Field(default=2, description="minimum pair frequency for a merge")


class TargetConfig(FrozenConfig):
    """The target LM (transformers Qwen3 architecture) and its training run."""

    hidden_size: int = Field(default=192, description="model width")
    num_hidden_layers: int = Field(default=4, description="decoder layers")
    num_attention_heads: int = Field(default=3, description="query heads")
    num_key_value_heads: int = Field(default=1, description="key/value heads (GQA)")
    head_dim: int = Field(default=64, description="per-head width (vLLM CPU attention: 64 ok)")
    intermediate_size: int = Field(default=512, description="MLP width")
    max_position_embeddings: int = Field(default=2048, description="context limit (vLLM)")
    rope_theta: float = Field(default=10000.0, description="RoPE base")
    seq_len: int = Field(default=512, description="training window in tokens")
    batch_size: int = Field(default=8, description="windows per step")
    steps: int = Field(default=2000, description="optimizer steps")
    lr: float = Field(default=4e-3, description="peak AdamW learning rate")
    warmup_steps: int = Field(default=100, description="linear warmup steps, then cosine to 10%")
    compile: bool = Field(
        default=True,
        description="torch.compile the training step (~1.7x faster on CPU after ~1 min of "
        "compilation; falls back to eager if compilation fails)",
    )
    weight_decay: float = Field(default=0.1, description="AdamW weight decay")
    seed: int = Field(default=0, description="seed for init and batch sampling")


class DistillConfig(FrozenConfig):
    """The drafters' training data: the target's own greedy continuations.

    Prefixes are random windows of the training corpus; the target continues each
    greedily, so the drafters learn the distribution they meet at decode time.
    """

    num_sequences: int = Field(default=448, description="sequences generated")
    prefix_len: int = Field(default=64, description="corpus tokens per prefix")
    gen_len: int = Field(default=192, description="greedy tokens generated per prefix")
    batch_size: int = Field(default=32, description="sequences per generation batch")
    seed: int = Field(default=1, description="seed for prefix sampling")


class EvalConfig(DrafterEvalConfig):
    """The evaluation written on the cards (held-out prompts, offline acceptance)."""

    humaneval_prompts: int | None = Field(
        default=None, description="HumanEval prompts used (None: all 164)"
    )
    prose_prompts: int | None = Field(
        default=None, description="held-out prose prompts used (None: all)"
    )
    batch_size: int = Field(default=16, description="prompts per generation batch")
    min_n: int = Field(default=3, description="smallest speculation window evaluated")


class TinyConfig(FrozenConfig):
    """The whole tiny tier: corpus, tokenizer, target, distillation data, both drafters."""

    tier: Literal["tiny", "smoke"] = Field(default="tiny", description="recipe name")
    threads: int = Field(
        default=1,
        description="torch CPU threads; 1 because on a shared, oversubscribed CPU two OpenMP "
        "threads stall at every barrier (measured ~8x slower per step than one thread)",
    )
    autocast_bf16: bool = Field(
        default=True,
        description="train under CPU bf16 autocast (AMX matmuls, ~1.7x faster here); "
        "weights stay float32 and are saved and evaluated in float32",
    )
    corpus: CorpusConfig = Field(default_factory=CorpusConfig, description="corpus")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="BPE")
    target: TargetConfig = Field(default_factory=TargetConfig, description="target LM")
    distill: DistillConfig = Field(default_factory=DistillConfig, description="draft data")
    dspark: DSparkConfig = Field(default_factory=DSparkConfig, description="DSpark drafter")
    eagle3: Eagle3Config = Field(default_factory=Eagle3Config, description="Eagle3 drafter")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="card evaluation")

    @classmethod
    def smoke(cls) -> TinyConfig:
        """A seconds-long run of the same pipeline (tests): small corpus, few steps."""
        return cls(
            tier="smoke",
            corpus=CorpusConfig(code_max_total_bytes=200_000, prose_repeat=1, val_fraction=0.05),
            tokenizer=TokenizerConfig(vocab_size=512),
            target=TargetConfig(
                hidden_size=128,
                num_hidden_layers=4,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=256,
                seq_len=64,
                batch_size=2,
                compile=False,
                steps=3,
                warmup_steps=1,
            ),
            distill=DistillConfig(num_sequences=8, prefix_len=16, gen_len=24, batch_size=8),
            dspark=DSparkConfig(
                markov_rank=8, sequences_per_step=2, max_anchors=8, steps=3, warmup_steps=1
            ),
            eagle3=Eagle3Config(sequences_per_step=2, steps=3, warmup_steps=1),
            eval=EvalConfig(
                gen_len=16, humaneval_prompts=2, prose_prompts=2, batch_size=4, dspark_anchors=4
            ),
        )

    def with_max_steps(self, max_steps: int | None) -> TinyConfig:
        """A copy whose every training stage stops after at most ``max_steps`` steps."""
        if max_steps is None:
            return self
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")

        def cap(section: FrozenConfig) -> FrozenConfig:
            steps = min(section.steps, max_steps)  # type: ignore[attr-defined]
            warmup = min(section.warmup_steps, max(1, steps // 10))  # type: ignore[attr-defined]
            return section.model_copy(update={"steps": steps, "warmup_steps": warmup})

        return self.model_copy(
            update={
                "target": cap(self.target),
                "dspark": cap(self.dspark),
                "eagle3": cap(self.eagle3),
            }
        )
