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
from dsparklab.store.location import Location
from dsparklab.store.sampling import check_fraction

# The switch: taps are installed only when this names a directory.
ENV_TRACE_DIR = "DSPARKLAB_TRACE_DIR"
ENV_RUN_NAME = "DSPARKLAB_RUN_NAME"
ENV_DATASET = "DSPARKLAB_DATASET"
ENV_TAP_LEVEL = "DSPARKLAB_TAP_LEVEL"
ENV_FLUSH_SECONDS = "DSPARKLAB_FLUSH_SECONDS"
ENV_WRITER_RANKS = "DSPARKLAB_WRITER_RANKS"
ENV_SAMPLE = "DSPARKLAB_SAMPLE"
ENV_BUFFER_MB = "DSPARKLAB_BUFFER_MB"
ENV_LEASE_SECONDS = "DSPARKLAB_LEASE_SECONDS"

TapLevel = Literal["full", "light"]
WriterRanks = Literal["tp0", "all"]
TAP_LEVELS: tuple[str, ...] = ("full", "light")
WRITER_RANKS: tuple[str, ...] = ("tp0", "all")


class TapConfigError(DSparkLabError, ValueError):
    """A ``DSPARKLAB_*`` environment variable holds a value the taps cannot use."""


def _describe(text: str, default: Any) -> Any:
    return field(default=default, metadata={"description": text})


def _number(env: Mapping[str, str], name: str, default: str) -> float:
    raw = env.get(name, default).strip() or default
    try:
        return float(raw)
    except ValueError:
        raise TapConfigError(f"{name}={raw!r} is not a number") from None


@dataclass(frozen=True)
class TapConfig:
    """What the taps record and where (one instance per process, from the environment)."""

    trace_dir: Location = _describe(
        "root directory or s3://bucket/prefix; each writing process adds one run below it",
        Location.of("."),
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
    sample: float = _describe(
        "fraction of requests recorded, chosen by a hash of the request id (every rank "
        "and server agrees; a request is recorded whole or not at all)",
        1.0,
    )
    buffer_mb: float = _describe(
        "MiB of finished parts held while the store does not answer; past it the oldest "
        "are dropped and counted in run.json",
        256.0,
    )
    lease_seconds: float = _describe(
        "a live run's lease, renewed while its writer lives; a reader takes a 'running' run "
        "whose lease has passed for incomplete (its writer was killed, e.g. by vLLM's "
        "shutdown, or lost its store)",
        120.0,
    )

    def __post_init__(self) -> None:
        # a Path or a URI given by a caller: one Location from here on
        object.__setattr__(self, "trace_dir", Location.of(self.trace_dir))

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
        flush = _number(env, ENV_FLUSH_SECONDS, "10")
        if flush <= 0:
            raise TapConfigError(f"{ENV_FLUSH_SECONDS} must be > 0, got {flush}")
        sample = _number(env, ENV_SAMPLE, "1")
        try:
            check_fraction(sample, name=ENV_SAMPLE)
        except ValueError as err:
            raise TapConfigError(f"{err}; unset it to record every request") from None
        buffer_mb = _number(env, ENV_BUFFER_MB, "256")
        if buffer_mb <= 0:
            raise TapConfigError(f"{ENV_BUFFER_MB} must be > 0, got {buffer_mb}")
        lease = _number(env, ENV_LEASE_SECONDS, "120")
        if lease <= flush:
            raise TapConfigError(
                f"{ENV_LEASE_SECONDS}={lease} must exceed {ENV_FLUSH_SECONDS}={flush} "
                "(each flush renews the lease)"
            )
        return cls(
            trace_dir=Location.of(root if "://" in root else Path(root).expanduser()),
            run_name=env.get(ENV_RUN_NAME, "").strip(),
            dataset=env.get(ENV_DATASET, "vllm").strip() or "vllm",
            level=level,  # type: ignore[arg-type]
            flush_seconds=flush,
            writer_ranks=ranks,  # type: ignore[arg-type]
            sample=sample,
            buffer_mb=buffer_mb,
            lease_seconds=lease,
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
            ENV_SAMPLE: repr(self.sample),
            ENV_BUFFER_MB: repr(self.buffer_mb),
            ENV_LEASE_SECONDS: repr(self.lease_seconds),
        }

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["trace_dir"] = str(self.trace_dir)
        return out
