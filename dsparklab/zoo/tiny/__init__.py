"""The tiny tier: a 2.4M-parameter Qwen3 target and its DSpark and Eagle3 drafters."""

from dsparklab.zoo.tiny.config import (
    DSPARK_NAME,
    EAGLE3_NAME,
    STAGES,
    TARGET_NAME,
    TinyConfig,
)

__all__ = [
    "DSPARK_NAME",
    "EAGLE3_NAME",
    "STAGES",
    "TARGET_NAME",
    "TinyConfig",
]
