"""`dsparklab collect`: decode prompt sets with an engine and write one run per combination.

The engine is chosen from :data:`ENGINES`, a dict of engine name -> ``"module:function"``
imported on use. Every collect function takes one
:class:`~dsparklab.engines.layout.CollectOptions` (``vllm-serve`` also the server's URL and
tap directory), lays runs out with :mod:`dsparklab.engines.layout`, skips complete runs,
and returns the output root.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from dsparklab.cli.common import (
    DSparkModel,
    Eagle3Model,
    Overwrite,
    TargetModel,
    Tier,
)
from dsparklab.errors import ConfigError, UnknownMethodError

ENGINES: dict[str, str] = {
    "reference": "dsparklab.engines.reference.collect:collect",
    "vllm": "dsparklab.engines.vllm.collect:collect",
    "vllm-serve": "dsparklab.engines.vllm.collect:collect_serve",
}


def engine_collector(name: str) -> Callable[..., Path]:
    """The collect function of engine ``name``."""
    target = ENGINES.get(name)
    if target is None:
        raise UnknownMethodError(
            f"unknown engine {name!r}; expected one of {', '.join(sorted(ENGINES))}"
        )
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def collect(
    engine: Annotated[str, typer.Option(help=f"Engine: {', '.join(sorted(ENGINES))}.")] = (
        "reference"
    ),
    method: Annotated[str, typer.Option(help="Comma list of dspark, eagle3, none.")] = (
        "dspark,eagle3,none"
    ),
    n: Annotated[
        str, typer.Option("--n", help="Speculative tokens: '3..7', '3,5,7' or '4'.")
    ] = "3..7",
    dataset: Annotated[
        str,
        typer.Option(help="Comma list of prompt sets (humaneval, prose, instruct, jsonl:PATH)."),
    ] = "humaneval,prose",
    limit: Annotated[int | None, typer.Option(help="First LIMIT prompts of each set.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt.")] = 128,
    out: Annotated[Path, typer.Option(help="Output root; runs go to OUT/<set>/<run>.")] = Path(
        "runs"
    ),
    temperature: Annotated[float, typer.Option(help="0 = greedy; > 0 = rejection sampling.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Sampling seed (T > 0).")] = 0,
    tier: Tier = "tiny",
    target: TargetModel = None,
    dspark: DSparkModel = None,
    eagle3: Eagle3Model = None,
    threads: Annotated[
        int, typer.Option(help="torch threads (2: one process owns both cores).")
    ] = 2,
    overwrite: Overwrite = False,
    server_url: Annotated[
        str | None,
        typer.Option(
            help="vllm-serve: the server's URL (default: $DSPARKLAB_VLLM_URL or "
            "http://localhost:8000)."
        ),
    ] = None,
    tap_dir: Annotated[
        Path | None,
        typer.Option(
            help="vllm-serve: where the server's taps write (its DSPARKLAB_TRACE_DIR) "
            "(default: $DSPARKLAB_TRACE_DIR)."
        ),
    ] = None,
) -> None:
    """Decode prompt sets and record one trace run per (dataset, method, n)."""
    from dsparklab.engines.layout import CollectOptions, parse_list, parse_ns, tier_models

    serve_options = {"server_url": server_url, "tap_dir": tap_dir}
    given = [f"--{k.replace('_', '-')}" for k, v in serve_options.items() if v is not None]
    if given and engine != "vllm-serve":
        raise ConfigError(f"{', '.join(given)} applies to --engine vllm-serve, not {engine!r}")
    collector = engine_collector(engine)
    options = CollectOptions(
        methods=parse_list(method),
        ns=parse_ns(n),
        datasets=parse_list(dataset),
        out=out,
        limit=limit,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        **tier_models(tier, target, dspark, eagle3),
        threads=threads,
        overwrite=overwrite,
        progress=True,
    )
    root = collector(options, **serve_options) if engine == "vllm-serve" else collector(options)
    typer.echo(str(root))
