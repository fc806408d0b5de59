"""Settings of the vLLM taps, read from the environment.

The taps are switched on by one environment variable, ``DSPARKLAB_TRACE_DIR``; every
other ``DSPARKLAB_*`` variable only refines what they do. vLLM loads plugins in every
process (API server, engine core, each worker), so the settings travel as environment
variables, which child processes inherit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dsparklab.errors import DSparkLabError

# The switch: taps are installed only when this names a directory.
ENV_TRACE_DIR = "DSPARKLAB_TRACE_DIR"
ENV_RUN_NAME = "DSPARKLAB_RUN_NAME"
ENV_DATASET = "DSPARKLAB_DATASET"
ENV_TAP_LEVEL = "DSPARKLAB_TAP_LEVEL"
ENV_FLUSH_SECONDS = "DSPARKLAB_FLUSH_SECONDS"
ENV_WRITER_RANKS = "DSPARKLAB_WRITER_RANKS"

TapLevel = Literal["full", "light"]
WriterRanks = Literal["tp0", "all"]
TAP_LEVELS: tuple[str, ...] = ("full", "light")
WRITER_RANKS: tuple[str, ...] = ("tp0", "all")


class TapConfigError(DSparkLabError, ValueError):
    """A ``DSPARKLAB_*`` environment variable holds a value the taps cannot use."""


def _describe(text: str, default: Any) -> Any:
    return field(default=default, metadata={"description": text})


@dataclass(frozen=True)
class TapConfig:
    """What the taps record and where (one instance per process, from the environment)."""

    trace_dir: Path = _describe(
        "root directory; each writing process adds one run directory below it", Path()
    )
    run_name: str = _describe("run directory name prefix; empty: vllm-<method>-n<N>-<utc time>", "")
    dataset: str = _describe(
        "dataset label written into the steps/requests rows of the tap trace", "vllm"
    )
    level: TapLevel = _describe(
        "'full': all position fields; 'light': token, bias at token, flip and "
        "confidence only (no full-vocabulary log-sum-exp or bias norm)",
        "full",
    )
    flush_seconds: float = _describe(
        "a background thread turns finished steps into parquet parts this often", 10.0
    )
    writer_ranks: WriterRanks = _describe(
        "'tp0': tensor-parallel rank 0 of each data-parallel replica writes (drafts are "
        "replicated across TP ranks, so this is the whole trace); 'all': every rank "
        "writes its own run directory (to check that ranks agree)",
        "tp0",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TapConfig | None:
        """The config described by ``DSPARKLAB_*`` variables; None when tracing is off."""
        env = os.environ if environ is None else environ
        root = env.get(ENV_TRACE_DIR, "").strip()
        if not root:
            return None
        level = env.get(ENV_TAP_LEVEL, "full").strip() or "full"
        if level not in TAP_LEVELS:
            raise TapConfigError(
                f"{ENV_TAP_LEVEL}={level!r} is not one of {list(TAP_LEVELS)}; unset it or pick one"
            )
        ranks = env.get(ENV_WRITER_RANKS, "tp0").strip() or "tp0"
        if ranks not in WRITER_RANKS:
            raise TapConfigError(f"{ENV_WRITER_RANKS}={ranks!r} is not one of {list(WRITER_RANKS)}")
        raw_flush = env.get(ENV_FLUSH_SECONDS, "10").strip() or "10"
        try:
            flush = float(raw_flush)
        except ValueError as err:
            raise TapConfigError(
                f"{ENV_FLUSH_SECONDS}={raw_flush!r} is not a number of seconds"
            ) from err
        if flush <= 0:
            raise TapConfigError(f"{ENV_FLUSH_SECONDS} must be > 0, got {flush}")
        return cls(
            trace_dir=Path(root).expanduser(),
            run_name=env.get(ENV_RUN_NAME, "").strip(),
            dataset=env.get(ENV_DATASET, "vllm").strip() or "vllm",
            level=level,  # type: ignore[arg-type]
            flush_seconds=flush,
            writer_ranks=ranks,  # type: ignore[arg-type]
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce this config in a child process."""
        return {
            ENV_TRACE_DIR: str(self.trace_dir),
            ENV_RUN_NAME: self.run_name,
            ENV_DATASET: self.dataset,
            ENV_TAP_LEVEL: self.level,
            ENV_FLUSH_SECONDS: str(self.flush_seconds),
            ENV_WRITER_RANKS: self.writer_ranks,
        }

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["trace_dir"] = str(self.trace_dir)
        return out
