"""Configuration of the CPU reference engine, dumped verbatim into every run's run.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

from dsparklab.errors import ConfigError, UnknownMethodError

Method = Literal["dspark", "eagle3", "none"]
METHODS: tuple[str, ...] = get_args(Method)

# n beyond this is allowed by nothing we study (the lab's window is n = 3..7).
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class ReferenceConfig:
    """How the reference engine decodes one request.

    Every field carries a description (``ReferenceConfig.describe()``); ``to_json()`` is
    what lands in run.json under ``config``.
    """

    method: Method = field(
        default="dspark",
        metadata={
            "description": "drafting method: 'dspark' (block drafter + Markov head), "
            "'eagle3' (autoregressive drafter) or 'none' (target-only decoding, the "
            "speedup baseline)"
        },
    )
    num_speculative_tokens: int = field(
        default=5,
        metadata={
            "description": "tokens drafted per step (n); 0 for method 'none', 1.."
            f"{MAX_SPECULATIVE_TOKENS} otherwise"
        },
    )
    max_new_tokens: int = field(
        default=128,
        metadata={"description": "tokens generated per request (fewer if EOS comes first)"},
    )
    temperature: float = field(
        default=0.0,
        metadata={
            "description": "0 = greedy decoding and greedy verification; > 0 = sampling "
            "with standard rejection sampling (lossless in distribution)"
        },
    )
    seed: int = field(
        default=0,
        metadata={"description": "seed of the per-request sampling generators (T > 0)"},
    )
    trace_enabled: bool = field(
        default=True,
        metadata={
            "description": "record per-step and per-position traces; off skips every "
            "extra computation (log-probs, bias norms, confidence, timing) and emits the "
            "same tokens"
        },
    )
    stop_at_eos: bool = field(
        default=True,
        metadata={"description": "end a request at the target's end-of-sequence token"},
    )

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UnknownMethodError(
                f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}"
            )
        n = self.num_speculative_tokens
        if self.method == "none" and n != 0:
            raise ConfigError(
                f"num_speculative_tokens={n} with method 'none'; target-only decoding "
                "drafts nothing, use 0"
            )
        if self.method != "none" and not 1 <= n <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"num_speculative_tokens={n} for method {self.method!r}; expected 1.."
                f"{MAX_SPECULATIVE_TOKENS}"
            )
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens}; expected >= 1")
        if self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature}; expected >= 0 (0 = greedy)")

    @property
    def greedy(self) -> bool:
        """True when decoding and verification are greedy (temperature 0)."""
        return self.temperature == 0.0

    def to_json(self) -> dict[str, Any]:
        """The field values, as stored in run.json."""
        return asdict(self)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Field name -> description."""
        return {f.name: f.metadata["description"] for f in fields(cls)}
