"""GPU check: what the dsparklab DSpark taps add to one draft step, under CUDA graphs.

Kimi-sized tensors (vocabulary 163840, hidden 7168, n = 7, Markov rank 256), batch
R = 1 and 64, bfloat16. The draft step is modelled the way vLLM's
``DSparkSpeculator._sample_sequential`` runs it inside its FULL CUDA graph: the LM head
over the R*n sample slots, then n sequential Markov positions (embed the previous token,
project to a vocabulary-sized bias, add, argmax). A one-layer dense MLP stands in for the
draft backbone (the real backbone costs more, so the percentage against it is an upper
bound of the real one).

Three graphs are captured and replayed: without taps, with the ``full`` taps and with the
``light`` taps -- the very functions the vLLM plugin calls (imported from
``dsparklab.engines.vllm``, which does not import vLLM), plus the confidence head the taps
evaluate when adaptive verification is off -- and the ``full`` graph again under the
plugin's step clock (eight CUDA events a step, recorded in host code around the replay and
read afterwards, ``full+clock``). The tapped variants also pay the plugin's
non-blocking device-to-host copies into pinned memory after each replay. Reported: time
per step, the taps' added microseconds and their share of the step (goal: <= 2 %).

Usage::

    python benchmarks/gpu_tap_cost.py [--iters 200] [--out results.json]

Exits with status 2 and a one-line message when CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsparklab.engines.vllm import (
    FLOAT_VIEWS,
    StagingRing,
    StepClock,
    TapBuffers,
    confidence_from_head,
    dense_position_values,
    draft_index,
    first_argmax,
    tap_confidence,
    write_step,
)


@dataclass(frozen=True)
class Shapes:
    """Tensor sizes; the defaults are Kimi-sized (K2 vocabulary and hidden size)."""

    vocab: int = 163_840
    hidden: int = 7_168
    n: int = 7
    markov_rank: int = 256
    mlp: int = 18_432  # dense MLP width of the backbone stand-in


KIMI = Shapes()


@dataclass
class Weights:
    shapes: Shapes
    lm_head: torch.Tensor  # [V, H]
    w1: torch.Tensor  # [V, r]
    w2: torch.Tensor  # [V, r]
    conf_w: torch.Tensor  # [1, H + r] float32
    conf_b: torch.Tensor  # [1] float32
    up: torch.Tensor  # [2*MLP, H]
    down: torch.Tensor  # [H, MLP]


@dataclass
class Step:
    """Static input/output buffers of one captured draft step for R requests."""

    rows: int
    hidden: torch.Tensor  # [R*n, H]
    anchor: torch.Tensor  # [R]
    draft_tokens: torch.Tensor  # [R, n] (persistent, like vLLM's)
    buffers: TapBuffers


def make_weights(device: torch.device, dtype: torch.dtype, shapes: Shapes = KIMI) -> Weights:
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int, scale: float, dt: torch.dtype = dtype) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(
            dt
        )

    v, h, r, m = shapes.vocab, shapes.hidden, shapes.markov_rank, shapes.mlp
    return Weights(
        shapes=shapes,
        lm_head=rand(v, h, scale=h**-0.5),
        w1=rand(v, r, scale=1.0),
        w2=rand(v, r, scale=r**-0.5),
        conf_w=rand(1, h + r, scale=0.01, dt=torch.float32),
        conf_b=torch.zeros(1, device=device),
        up=rand(2 * m, h, scale=h**-0.5),
        down=rand(h, m, scale=m**-0.5),
    )


def make_step(rows: int, w: Weights) -> Step:
    """Static inputs for R = ``rows`` requests (random hidden states and anchors)."""
    device, sh = w.lm_head.device, w.shapes
    gen = torch.Generator(device=device).manual_seed(rows)
    return Step(
        rows=rows,
        hidden=torch.randn(rows * sh.n, sh.hidden, generator=gen, device=device).to(
            w.lm_head.dtype
        ),
        anchor=torch.randint(0, sh.vocab, (rows,), generator=gen, device=device),
        draft_tokens=torch.zeros(rows, sh.n, dtype=torch.int64, device=device),
        buffers=TapBuffers.allocate(rows, sh.n, device),
    )


def draft_step(w: Weights, s: Step, *, taps: str | None, backbone: bool) -> None:
    """One draft step (what the FULL graph captures); ``taps``: None, 'full' or 'light'."""
    hidden = s.hidden
    if backbone:
        gate, up = (hidden @ w.up.t()).chunk(2, dim=-1)
        hidden = hidden + (torch.nn.functional.silu(gate) * up) @ w.down.t()
    rows, n = s.rows, w.shapes.n
    base = (hidden @ w.lm_head.t()).view(rows, n, w.shapes.vocab)
    prev = s.anchor
    embeds = []
    recorded = []
    base_argmax = first_argmax(base) if taps is not None else None
    for i in range(n):
        embed = w.w1[prev]  # [R, r]
        bias = embed @ w.w2.t()  # [R, V]
        logits = base[:, i] + bias
        token = logits.argmax(dim=-1)
        s.draft_tokens[:, i].copy_(token)
        if taps is not None:
            # one position at a time, as the DSpark tap does on an accelerator
            idx = draft_index(token, None)
            values = dense_position_values(
                bias[:, None], logits[:, None], idx, level=taps, greedy=True
            )
            recorded.append(([i], values))
            embeds.append(embed)
        prev = token
    if taps is not None:
        assert base_argmax is not None
        # as the tap's end does (the base log-probs at the level "full")
        write_step(s.buffers, recorded, base_argmax, base if taps == "full" else None)
        markov = torch.stack(embeds, dim=1).flatten(0, 1)
        confidence = confidence_from_head(w.conf_w, w.conf_b, hidden, markov)
        tap_confidence(s.buffers, confidence, rows)


def capture(fn: Any, warmup: int = 3) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def time_replays(
    graph: torch.cuda.CUDAGraph, iters: int, after: Any = None, clock: bool = False
) -> float:
    """Mean milliseconds per replay (+ ``after`` outside the graph, e.g. staging copies).

    ``clock``: each replay is also one engine step of the plugin's step clock
    (``dsparklab/engines/vllm/clock.py``): its eight marks, CUDA events recorded on the
    current stream around the step, the forward, the sampler and the draft pass; they are
    read afterwards, off the hot path, as the recorder's thread reads them.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    clocks = []
    start.record()
    for _ in range(iters):
        step = StepClock(cuda=True) if clock else None
        if step is not None:
            for mark in ("step_start", "forward_start", "forward_end", "sample_start"):
                step.mark(mark)
            step.mark("sample_end")
            step.mark("draft_start")
        graph.replay()
        if step is not None:
            step.mark("draft_end")
        if after is not None:
            after()
        if step is not None:
            step.mark("step_end")
            clocks.append(step)
    end.record()
    end.synchronize()
    for step in clocks:  # what the recorder does later: every span resolves
        assert step.ready() and step.draft_s() is not None and step.verify_s() is not None
    return start.elapsed_time(end) / iters


def bench(rows: int, w: Weights, *, iters: int, repeats: int, backbone: bool) -> dict[str, Any]:
    device = w.lm_head.device
    step = make_step(rows, w)
    n = w.shapes.n
    specs = {"draft_tokens": ((rows, n), torch.int64)}
    specs |= {name: (tuple(t.shape), t.dtype) for name, t in step.buffers.staged().items()}
    ring = StagingRing(specs, device, views=FLOAT_VIEWS)

    def stage() -> None:  # what the plugin's propose wrapper does after the graph
        slot = ring.acquire()
        assert slot is not None
        ring.copy_in(slot, "draft_tokens", step.draft_tokens)
        for name, tensor in step.buffers.staged().items():
            ring.copy_in(slot, name, tensor)
        ring.seal(slot)
        ring.release(slot)  # (the recorder releases after reading; here: immediately)

    graphs = {
        "none": capture(lambda: draft_step(w, step, taps=None, backbone=backbone)),
        "full": capture(lambda: draft_step(w, step, taps="full", backbone=backbone)),
        "light": capture(lambda: draft_step(w, step, taps="light", backbone=backbone)),
    }
    # correctness: the graph's taps equal an eager run; tokens unchanged by the taps
    graphs["none"].replay()
    torch.cuda.synchronize()
    plain_tokens = step.draft_tokens.clone()
    graphs["full"].replay()
    torch.cuda.synchronize()
    graph_bias = step.buffers.markov_bias.clone()
    tokens_equal = bool(torch.equal(plain_tokens, step.draft_tokens))
    draft_step(w, step, taps="full", backbone=backbone)
    torch.cuda.synchronize()
    eager_equal = bool(torch.allclose(graph_bias, step.buffers.markov_bias, atol=1e-3))

    times: dict[str, list[float]] = {k: [] for k in (*graphs, "full+clock")}
    for _ in range(repeats):  # interleaved, to share clock/thermal drift
        times["none"].append(time_replays(graphs["none"], iters))
        times["full"].append(time_replays(graphs["full"], iters, stage))
        times["light"].append(time_replays(graphs["light"], iters, stage))
        times["full+clock"].append(time_replays(graphs["full"], iters, stage, clock=True))
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {
        "rows": rows,
        "backbone_stand_in": backbone,
        "step_ms": round(med["none"], 4),
        "tokens_unchanged_by_taps": tokens_equal,
        "graph_taps_equal_eager": eager_equal,
    }
    for level in ("full", "light", "full+clock"):
        added = med[level] - med["none"]
        out[f"{level}_added_us"] = round(added * 1e3, 2)
        out[f"{level}_added_pct"] = round(100.0 * added / med["none"], 3)
    for graph in graphs.values():
        graph.reset()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=200, help="replays per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved measurements")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64], help="batch sizes R")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu_tap_cost: CUDA is not available (torch "
            f"{torch.__version__}); this benchmark needs an NVIDIA GPU -- nothing measured",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    weights = make_weights(device, torch.bfloat16)
    runs: list[dict[str, Any]] = []
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shapes": KIMI.__dict__,
        "goal_pct": 2.0,
        "runs": runs,
    }
    for rows in args.rows:
        for backbone in (False, True):
            res = bench(rows, weights, iters=args.iters, repeats=args.repeats, backbone=backbone)
            runs.append(res)
            print(json.dumps(res), flush=True)
    if args.out:
        with Path(args.out).open("w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    ok = all(r["tokens_unchanged_by_taps"] and r["graph_taps_equal_eager"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
