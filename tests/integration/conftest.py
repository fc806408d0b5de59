"""Fixtures for the reference engine's integration tests: the zoo's tiny models, loaded once.

Every test here runs the real engine on the committed tiny checkpoints (data/zoo); the
models load once per session (each test starts with torch on one thread: tests/conftest.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from dsparklab.engines.reference import ReferenceConfig, ReferenceEngine
from dsparklab.prompts import Prompt, load_prompts
from tests.reference_runs import require_zoo

# Tokens generated per prompt in the lossless tests: long enough that most steps of a
# good drafter run full blocks, short enough to keep the suite lean.
GEN_LEN = 48
NUM_PROMPTS = 8


@dataclass
class Zoo:
    """The tiny tier, loaded."""

    target: torch.nn.Module
    tokenizer: Any
    dspark: torch.nn.Module
    eagle3: torch.nn.Module
    target_path: Any
    dspark_path: Any
    eagle3_path: Any

    def drafter(self, method: str) -> torch.nn.Module | None:
        return {"dspark": self.dspark, "eagle3": self.eagle3}.get(method)

    def engine(self, method: str, n: int = 0, **options: Any) -> ReferenceEngine:
        config = ReferenceConfig(method=method, num_speculative_tokens=n, **options)
        return ReferenceEngine(self.target, self.drafter(method), config=config)


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    from dsparklab.zoo import (
        ZOO_DIR,
        load_dspark_drafter,
        load_eagle3_drafter,
        load_target,
    )

    require_zoo()
    paths = {name: ZOO_DIR / f"tiny-{name}" for name in ("target", "dspark", "eagle3")}
    target, tokenizer = load_target(paths["target"])
    return Zoo(
        target=target,
        tokenizer=tokenizer,
        dspark=load_dspark_drafter(paths["dspark"], target_path=paths["target"]),
        eagle3=load_eagle3_drafter(paths["eagle3"], target_path=paths["target"]),
        target_path=paths["target"],
        dspark_path=paths["dspark"],
        eagle3_path=paths["eagle3"],
    )


@pytest.fixture(scope="session")
def target64(zoo: Zoo) -> torch.nn.Module:
    """A float64 copy of the target, to settle near-ties."""
    return copy.deepcopy(zoo.target).double().eval()


@pytest.fixture(scope="session")
def prompts() -> list[Prompt]:
    """Held-out prompts from both sets (code first)."""
    half = NUM_PROMPTS // 2
    return load_prompts("humaneval", limit=half) + load_prompts("prose", limit=half)


@pytest.fixture(scope="session")
def prompt_ids(zoo: Zoo, prompts: list[Prompt]) -> list[list[int]]:
    return [zoo.tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts]


@pytest.fixture(scope="session")
def baseline(zoo: Zoo, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Target-only greedy outputs (the reference every method must reproduce)."""
    engine = zoo.engine("none", max_new_tokens=GEN_LEN)
    return [
        engine.generate(ids, request_id=f"p{i}").output_token_ids
        for i, ids in enumerate(prompt_ids)
    ]
