r"""What one verify forward costs the reference engine, against a bare forward.

For each block width m (= n + 1 tokens: the anchor and n drafts) the script times, at a
fixed context, interleaved over rounds (each round runs every configuration once, in an
order rotated by the round):

- ``bare``: ``model(input_ids, past_key_values=cache)``, logits only, then the cache is
  cropped back (the cost a verify cannot avoid);
- ``engine``: :meth:`TargetRunner.forward` with the drafter's aux layers and
  :meth:`TargetRunner.crop`, what a verify step runs.

It prints the median milliseconds per configuration and the ratio to a 1-token decode
(the speedup model's :math:`v(n) = t_{verify}(n+1) / t_{decode}(1)`)::

    python benchmarks/verify_cost.py --tier smol --context 300 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch
from transformers import DynamicCache

from dsparklab.engines.reference.models import TargetRunner
from dsparklab.zoo import ZOO_DIR, load_target

AUX_LAYERS = {"smol": (3, 16, 28), "tiny": (1, 2, 3)}


def _bare(model: torch.nn.Module, cache: DynamicCache, tokens: list[int]) -> None:
    start = cache.get_seq_length()
    ids = torch.tensor([tokens])
    positions = torch.arange(start, start + len(tokens)).unsqueeze(0)
    model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
    cache.crop(start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default="smol", choices=sorted(AUX_LAYERS))
    parser.add_argument("--context", type=int, default=300, help="tokens already in the cache")
    parser.add_argument("--widths", default="1,2,4,6,7,8,9,16", help="block widths m = n + 1")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_target(ZOO_DIR / f"{args.tier}-target")
    widths = [int(w) for w in args.widths.split(",")]
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    context = torch.randint(0, vocab, (args.context,), generator=generator).tolist()
    block = torch.randint(0, vocab, (max(widths),), generator=generator).tolist()

    runner = TargetRunner(model, AUX_LAYERS[args.tier])
    runner.reset()
    bare_cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        runner.forward(context)
        model(input_ids=torch.tensor([context]), past_key_values=bare_cache, use_cache=True)

        def run_engine(m: int) -> None:
            runner.forward(block[:m])
            runner.crop(m)

        configs = [(kind, m) for m in widths for kind in ("bare", "engine")]
        times: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
        for _ in range(2):  # warm-up
            for kind, m in configs:
                run_engine(m) if kind == "engine" else _bare(model, bare_cache, block[:m])
        for r in range(args.rounds):
            for kind, m in configs[r % len(configs) :] + configs[: r % len(configs)]:
                tick = time.perf_counter()
                run_engine(m) if kind == "engine" else _bare(model, bare_cache, block[:m])
                times[(kind, m)].append(time.perf_counter() - tick)
    decode = statistics.median(times[("bare", 1)]) if 1 in widths else float("nan")
    rows = []
    for m in widths:
        bare = statistics.median(times[("bare", m)])
        engine = statistics.median(times[("engine", m)])
        rows.append(
            {
                "m (= n+1)": m,
                "bare ms": round(bare * 1e3, 1),
                "engine ms": round(engine * 1e3, 1),
                "engine / bare": round(engine / bare, 3),
                "v = engine / decode(1)": round(engine / decode, 3),
            }
        )
    print(
        f"{args.tier}-target, context {args.context}, {args.threads} thread(s), "
        f"{args.rounds} interleaved rounds (medians)"
    )
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
