"""GPU check: what verifying k tokens costs against one decode step, on a Kimi-K2-shaped stack.

Which n pays is decided by verify(k) / decode(1) per batch size (published: 1.47 at 8
tokens for GLM-5.2 on 8x H200, 1.05 for DeepSeek-V4-Flash with CUDA graphs on B300). This
script measures it on ``--layers`` decoder layers shaped like Kimi-K2's, with random bf16
weights:

- MLA attention as served (weights absorbed): 64 heads, query LoRA 1536, KV LoRA 512,
  128 no-rope + 64 rope query/key dims, value 128; each request's cache holds
  ``--context`` tokens of the 512-dim latent plus the 64-dim rope key;
- routed MoE: 384 experts of width 2048, 8 active per token (sigmoid router, top 8), one
  shared expert; the routed experts run as one grouped GEMM over the tokens sorted by
  expert (``torch._grouped_mm``), so an expert no token chose is not read, as a fused MoE
  kernel does.

For each batch size b and width k it times the stack's forward over b x k new tokens
(k = 1: a decode step; k = n + 1: verifying n drafts), under a CUDA graph where it can be
captured (else eagerly, and the profile says so), and writes a cost profile in the lab's
format (``data/profiles/``): ``verify`` at batch 1 and ``verify_by_batch``, each
t(b, k) / t(b, 1), with the device, shapes and how it was measured. It measures no draft
cost: a projection on it takes the draft costs from elsewhere.

    python benchmarks/gpu_verify_cost.py --out data/profiles/measured-h200-kimi-k2-shaped.json
    python benchmarks/gpu_verify_cost.py --dry-run --out /tmp/toy.json   # CPU, toy shapes

Exits with status 2 and a one-line message when CUDA is not available (without --dry-run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Shapes:
    """Layer sizes; the defaults are Kimi-K2's published configuration."""

    hidden: int = 7168
    heads: int = 64
    q_lora: int = 1536
    kv_lora: int = 512
    nope: int = 128
    rope: int = 64
    value: int = 128
    experts: int = 384
    active: int = 8
    expert_width: int = 2048


TOY = Shapes(
    hidden=64, heads=4, q_lora=32, kv_lora=16, nope=8, rope=4, value=8, experts=8, active=2,
    expert_width=16,
)  # fmt: skip


class Layer(torch.nn.Module):
    """One decoder layer: MLA attention (absorbed) and a routed MoE with a shared expert."""

    def __init__(self, s: Shapes, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()

        def w(*shape: int) -> torch.nn.Parameter:
            scale = shape[-2] ** -0.5 if len(shape) > 1 else 1.0
            t = torch.randn(*shape, dtype=dtype, device=device) * scale
            return torch.nn.Parameter(t, requires_grad=False)

        self.s = s
        self.q_a = w(s.hidden, s.q_lora)
        self.q_b = w(s.q_lora, s.heads * (s.nope + s.rope))
        self.kv_a = w(s.hidden, s.kv_lora + s.rope)
        self.w_uk = w(s.heads, s.nope, s.kv_lora)  # key up-projection, absorbed into q
        self.w_uv = w(s.heads, s.kv_lora, s.value)  # value up-projection, after attention
        self.o = w(s.heads * s.value, s.hidden)
        self.router = w(s.hidden, s.experts)
        self.gate_up = w(s.experts, s.hidden, 2 * s.expert_width)
        self.down = w(s.experts, s.expert_width, s.hidden)
        self.shared_gate_up = w(s.hidden, 2 * s.expert_width)
        self.shared_down = w(s.expert_width, s.hidden)

    def attention(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """``x`` [B, K, D] new tokens over ``cache`` [B, C, L + R] (latent and rope key);
        the new tokens see the cache and, causally, each other."""
        s = self.s
        b, k, _ = x.shape
        q = (torch.nn.functional.rms_norm(x @ self.q_a, (s.q_lora,)) @ self.q_b).view(
            b, k, s.heads, s.nope + s.rope
        )
        q_nope, q_rope = q.split([s.nope, s.rope], dim=-1)
        q_latent = torch.einsum("bkhn,hnl->bkhl", q_nope, self.w_uk)  # [B, K, H, L]
        keys = torch.cat([cache, x @ self.kv_a], dim=1)  # [B, C + K, L + R]
        latent, rope = keys.split([s.kv_lora, s.rope], dim=-1)
        scores = torch.einsum("bkhl,btl->bhkt", q_latent, latent)
        scores = scores + torch.einsum("bkhr,btr->bhkt", q_rope, rope)
        scores = scores * (s.nope + s.rope) ** -0.5
        context = cache.shape[1]
        future = torch.ones(k, k, dtype=torch.bool, device=x.device).triu(1)
        mask = torch.cat([torch.zeros(k, context, dtype=torch.bool, device=x.device), future], 1)
        scores = scores.masked_fill(mask, float("-inf"))
        attended = torch.einsum("bhkt,btl->bkhl", scores.softmax(-1), latent)  # [B, K, H, L]
        values = torch.einsum("bkhl,hlv->bkhv", attended, self.w_uv)
        return values.reshape(b, k, s.heads * s.value) @ self.o

    def moe(self, x: torch.Tensor) -> torch.Tensor:
        """Routed experts as one grouped GEMM over the tokens sorted by expert, plus the
        shared expert; ``x`` [T, D]."""
        s = self.s
        weights, chosen = torch.sigmoid(x @ self.router).topk(s.active, dim=-1)  # [T, A]
        weights = weights / weights.sum(-1, keepdim=True)
        flat = chosen.flatten()  # [T * A]
        order = flat.argsort()
        token = order // s.active
        # tokens per expert, in a fixed shape (bincount's output size would need the host)
        counts = torch.zeros(s.experts, dtype=torch.int64, device=x.device)
        offsets = counts.scatter_add_(0, flat, torch.ones_like(flat)).cumsum(0).to(torch.int32)
        gate, up = torch._grouped_mm(x[token], self.gate_up, offs=offsets).chunk(2, dim=-1)
        out = torch._grouped_mm(torch.nn.functional.silu(gate) * up, self.down, offs=offsets)
        routed = torch.zeros_like(x).index_add_(
            0, token, out * weights.flatten()[order].unsqueeze(-1)
        )
        shared_gate, shared_up = (x @ self.shared_gate_up).chunk(2, dim=-1)
        return routed + (torch.nn.functional.silu(shared_gate) * shared_up) @ self.shared_down

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        s = self.s
        x = x + self.attention(torch.nn.functional.rms_norm(x, (s.hidden,)), cache)
        b, k, _ = x.shape
        mixed = self.moe(torch.nn.functional.rms_norm(x, (s.hidden,)).view(b * k, s.hidden))
        return x + mixed.view(b, k, s.hidden)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (~34 GB each)")
    parser.add_argument("--context", type=int, default=4096, help="cached tokens per request")
    parser.add_argument("--batch", default="1,2,4,8", help="batch sizes")
    parser.add_argument("--max-width", type=int, default=16, help="k = 1 .. this")
    parser.add_argument("--iters", type=int, default=50, help="timed replays per shape")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--out", type=Path, help="write the profile JSON here")
    parser.add_argument("--dry-run", action="store_true", help="toy shapes on the CPU")
    return parser.parse_args(argv)


def timed(fn: Any, iters: int, device: torch.device) -> float:
    """Median milliseconds of ``fn`` over ``iters`` calls."""
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def step_function(
    layers: list[Layer], shapes: Shapes, batch: int, width: int, context: int
) -> tuple[Any, bool]:
    """The forward over ``batch`` x ``width`` new tokens, as a replayable function (a
    captured CUDA graph where capture works) and whether it is a graph."""
    device = layers[0].q_a.device
    dtype = layers[0].q_a.dtype
    x = torch.randn(batch, width, shapes.hidden, dtype=dtype, device=device)
    caches = [
        torch.randn(batch, context, shapes.kv_lora + shapes.rope, dtype=dtype, device=device)
        for _ in layers
    ]

    def forward() -> torch.Tensor:
        h = x
        for layer, cache in zip(layers, caches, strict=True):
            h = layer(h, cache)
        return h

    with torch.inference_mode():
        forward()  # warm up (kernels chosen, memory pooled)
        if device.type != "cuda":
            return forward, False
        try:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                forward()
            return graph.replay, True
        except Exception as err:  # data-dependent kernels may refuse capture
            print(f"# b={batch} k={width}: eager ({type(err).__name__}: {err})", file=sys.stderr)
            return forward, False


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Milliseconds per (batch, width), interleaved over rounds (each round visits every
    shape, in an order rotated by the round), and the profile built from them."""
    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    shapes = Shapes() if cuda else TOY
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    layers = [Layer(shapes, dtype, device) for _ in range(args.layers)]
    batches = [int(b) for b in str(args.batch).split(",")]
    widths = list(range(1, args.max_width + 1))
    grid = [(b, k) for b in batches for k in widths]
    functions = {key: step_function(layers, shapes, *key, args.context) for key in grid}
    samples: dict[tuple[int, int], list[float]] = {key: [] for key in grid}
    for r in range(args.rounds):
        shift = (r * 7) % len(grid)
        for key in grid[shift:] + grid[:shift]:
            samples[key].append(timed(functions[key][0], args.iters, device))
    ms = {key: statistics.median(v) for key, v in samples.items()}
    by_batch = {
        str(b): {str(k): round(ms[(b, k)] / ms[(b, 1)], 4) for k in widths} for b in batches
    }
    name = torch.cuda.get_device_name() if cuda else "cpu (dry run, toy shapes)"
    graphs = sorted({functions[key][1] for key in grid})
    return {
        "name": f"measured-{'kimi-k2-shaped' if cuda else 'toy'}-{name.split()[-1].lower()}",
        "description": (
            f"Measured by benchmarks/gpu_verify_cost.py on {name}: the forward of "
            f"{args.layers} Kimi-K2-shaped decoder layers (MLA absorbed, 384-expert MoE as a "
            f"grouped GEMM, random {str(dtype).split('.')[-1]} weights, {args.context} cached "
            "tokens per request) over k new tokens per request, relative to k = 1 at the same "
            "batch size; median over rounds of the median of the replays. Verify costs "
            "only: no draft cost was measured."
        ),
        "verify": by_batch[str(batches[0])] if batches[0] == 1 else {},
        "verify_by_batch": by_batch,
        "measured": {
            "device": name,
            "torch": torch.__version__,
            "cuda_graphs": graphs == [True],
            "eager_shapes": [f"{b}x{k}" for (b, k), (_, g) in functions.items() if not g],
            "layers": args.layers,
            "context": args.context,
            "shapes": asdict(shapes),
            "dtype": str(dtype),
            "iters": args.iters,
            "rounds": args.rounds,
            "ms": {f"{b}x{k}": round(ms[(b, k)], 4) for b, k in grid},
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_verify_cost: CUDA is not available (use --dry-run for toy shapes on the CPU)")
        return 2
    profile = measure(args)
    print("| batch | " + " | ".join(f"k={k}" for k in range(1, args.max_width + 1)) + " |")
    print("|---" * (args.max_width + 1) + "|")
    for b, row in profile["verify_by_batch"].items():
        print(f"| {b} | " + " | ".join(f"{v:.3f}" for v in row.values()) + " |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(profile, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
