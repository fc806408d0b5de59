r"""Interleaved wall-clock timing of reference-engine configurations (for benchmarks/).

Configurations are timed on the same prompts, interleaved: in round r, prompt p runs
every configuration in an order rotated by r + p, so slow drift of a shared machine
(other processes, thermal state) spreads over all of them instead of biasing one.
Speedups are ratios of total wall time over identical work:

.. math::

    S_c = \frac{\sum_{r,p} t_{\mathrm{none}}(r, p)}{\sum_{r,p} t_c(r, p)}

(greedy decoding is lossless, so every configuration emits the same tokens; the
table reports when one does not).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from dsparklab.engines.plan import parse_list, tier_models
from dsparklab.engines.reference.collect import ModelSet
from dsparklab.engines.reference.config import Method, ReferenceConfig
from dsparklab.engines.reference.core import ReferenceEngine
from dsparklab.prompts import encode_prompt, load_prompts

logger = logging.getLogger(__name__)


def add_benchmark_arguments(parser: argparse.ArgumentParser, *, rounds: int) -> None:
    """The options of every interleaved benchmark: prompt sets, lengths, rounds, threads,
    ``--tier`` (tiny, smol) and per-model overrides ``--target/--dspark/--eagle3``."""
    parser.add_argument("--dataset", default="humaneval", help="comma list of prompt sets")
    parser.add_argument("--limit", type=int, default=8, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=rounds, help="repetitions of the grid")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--tier", default="tiny", help="zoo tier of the default models")
    for role in ("target", "dspark", "eagle3"):
        parser.add_argument(f"--{role}", help=f"zoo name or directory [TIER-{role}]")


def model_set(args: argparse.Namespace) -> ModelSet:
    """The models :func:`add_benchmark_arguments` names."""
    name = tier_models(args.tier, args.target, args.dspark, args.eagle3)
    return ModelSet(name["target"], {"dspark": name["dspark"], "eagle3": name["eagle3"]})


def benchmark_engine(
    models: ModelSet, method: Method, n: int, *, max_new_tokens: int, trace: bool
) -> ReferenceEngine:
    """A greedy reference engine for ``method`` at window ``n`` ('none': target only)."""
    config = ReferenceConfig(
        method=method,
        num_speculative_tokens=n,
        max_new_tokens=max_new_tokens,
        trace_enabled=trace,
    )
    return ReferenceEngine(models.target, models.drafter(method), config=config)


def benchmark_prompts(
    args: argparse.Namespace, models: ModelSet, engines: Mapping[str, ReferenceEngine]
) -> list[list[int]]:
    """The prompts of ``--dataset``/``--limit``, encoded to fit every engine's context."""
    max_len = min(engine.max_prompt_len for engine in engines.values())
    return [
        encode_prompt(models.tokenizer, prompt, max_len)
        for dataset in parse_list(args.dataset)
        for prompt in load_prompts(dataset, limit=args.limit)
    ]


def time_interleaved(
    engines: Mapping[str, ReferenceEngine],
    prompts: Sequence[Sequence[int]],
    *,
    rounds: int = 2,
    warmup: bool = True,
    progress: bool = True,
) -> pd.DataFrame:
    """Time every engine on every prompt, ``rounds`` times, interleaved.

    Parameters
    ----------
    engines : mapping of str to ReferenceEngine
        Label -> engine (e.g. ``"dspark-n7"``).
    prompts : sequence of token-id lists
        The prompts, shared by all engines.
    rounds : int
        Repetitions of the whole grid.
    warmup : bool
        Run each engine once on the first prompt before timing (allocator, caches).
    progress : bool
        Show a tqdm bar.

    Returns
    -------
    pandas.DataFrame
        One row per (label, round, prompt): ``wall_time_s``, ``cpu_time_s`` (this
        thread's CPU time: insensitive to other processes competing for cores),
        ``num_tokens``,
        ``num_steps``, ``num_accepted``, ``accepted_per_pos`` and ``output`` (the tokens).
    """
    labels = list(engines)
    if warmup and prompts:
        for label in labels:
            engines[label].generate(prompts[0], request_id="warmup")
    rows = []
    total = rounds * len(prompts) * len(labels)
    with tqdm(total=total, desc="timing", disable=not progress) as bar:
        for round_index in range(rounds):
            for prompt_index, prompt in enumerate(prompts):
                shift = (round_index + prompt_index) % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    cpu = time.thread_time()
                    result = engines[label].generate(prompt, request_id=f"p{prompt_index}")
                    cpu = time.thread_time() - cpu
                    rows.append(
                        {
                            "label": label,
                            "round": round_index,
                            "prompt": prompt_index,
                            "wall_time_s": result.wall_time_s,
                            "cpu_time_s": cpu,
                            "num_tokens": len(result.output_token_ids),
                            "num_steps": result.stats.num_steps,
                            "num_accepted": result.stats.num_accepted,
                            "accepted_per_pos": list(result.stats.accepted_per_pos),
                            "output": tuple(result.output_token_ids),
                        }
                    )
                    bar.update()
    return pd.DataFrame(rows)


def markdown_table(frame: pd.DataFrame, *, digits: int = 2) -> str:
    """A DataFrame as a GitHub markdown table (floats rounded to ``digits``)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.{digits}f}"
        return str(value)

    header = [str(c) for c in frame.columns]
    body = [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in body
    ]
    return "\n".join(lines)
