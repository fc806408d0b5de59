"""The GPU verify-cost script (issue 32, item 7) at toy size on the CPU: its MLA attention
(weights absorbed) equals attention over the decompressed keys and values, its grouped
MoE equals a per-expert loop, and a dry run writes a profile in the lab's format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.benchmark_scripts import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "gpu_verify_cost.py"


def _module():
    return load_benchmark("gpu_verify_cost")


def test_absorbed_mla_is_attention_over_the_decompressed_keys_and_values():
    bench = _module()
    s = bench.TOY
    torch.manual_seed(0)
    layer = bench.Layer(s, torch.float64, torch.device("cpu"))
    x, cache = (
        torch.randn(2, 3, s.hidden, dtype=torch.float64),
        torch.randn(2, 5, s.kv_lora + s.rope, dtype=torch.float64),
    )
    got = layer.attention(x, cache)
    # the textbook form: queries, keys and values per head, causal over the new tokens
    q = (torch.nn.functional.rms_norm(x @ layer.q_a, (s.q_lora,)) @ layer.q_b).view(
        2, 3, s.heads, -1
    )
    q_nope, q_rope = q.split([s.nope, s.rope], -1)
    latent, rope = torch.cat([cache, x @ layer.kv_a], 1).split([s.kv_lora, s.rope], -1)
    k_nope = torch.einsum("btl,hnl->bthn", latent, layer.w_uk)
    v = torch.einsum("btl,hlv->bthv", latent, layer.w_uv)
    scores = (
        torch.einsum("bkhn,bthn->bhkt", q_nope, k_nope)
        + torch.einsum("bkhr,btr->bhkt", q_rope, rope)
    ) * (s.nope + s.rope) ** -0.5
    allowed = torch.ones(3, 8, dtype=torch.bool).tril(5)
    scores = scores.masked_fill(~allowed, float("-inf"))
    want = torch.einsum("bhkt,bthv->bkhv", scores.softmax(-1), v).reshape(2, 3, -1) @ layer.o
    assert torch.allclose(got, want, atol=1e-10)


def test_the_grouped_moe_is_the_per_expert_loop():
    bench = _module()
    s = bench.TOY
    torch.manual_seed(1)
    layer = bench.Layer(s, torch.float32, torch.device("cpu"))
    x = torch.randn(6, s.hidden)
    weights, chosen = torch.sigmoid(x @ layer.router).topk(s.active, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    want = torch.zeros_like(x)
    for t in range(6):
        for a in range(s.active):
            e = int(chosen[t, a])
            gate, up = (x[t] @ layer.gate_up[e]).chunk(2)
            want[t] += weights[t, a] * ((torch.nn.functional.silu(gate) * up) @ layer.down[e])
    gate, up = (x @ layer.shared_gate_up).chunk(2, dim=-1)
    want += (torch.nn.functional.silu(gate) * up) @ layer.shared_down
    assert torch.allclose(layer.moe(x), want, atol=1e-5)


def test_a_dry_run_writes_a_profile_and_without_cuda_the_real_run_exits_2(tmp_path: Path):
    out = tmp_path / "toy.json"
    args = ["--dry-run", "--layers", "1", "--context", "16", "--batch", "1,2",
            "--max-width", "3", "--iters", "2", "--rounds", "2", "--out", str(out)]  # fmt: skip
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text())
    assert profile["verify"]["1"] == 1.0 and set(profile["verify"]) == {"1", "2", "3"}
    assert set(profile["verify_by_batch"]) == {"1", "2"}
    assert (
        profile["measured"]["device"].startswith("cpu")
        and "no draft cost" in profile["description"]
    )
    if not torch.cuda.is_available():
        real = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
        assert real.returncode == 2 and "CUDA is not available" in real.stdout
