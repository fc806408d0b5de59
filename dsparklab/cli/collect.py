"""`dsparklab collect`: decode prompt sets with an engine and write one run per combination.

The engine is chosen from :data:`ENGINES`, a dict of engine name -> ``"module:function"``
imported on use. Every collect function takes one
:class:`~dsparklab.engines.plan.CollectOptions` (``vllm-serve`` also the server's URL and
tap directory, what the server runs and the models the options named), lays runs out with
:mod:`dsparklab.engines.plan`, skips complete runs, and returns the output root.

For ``vllm-serve`` the command asks the server what it runs first
(:func:`dsparklab.engines.vllm.served.discover`): ``--method`` / ``--n`` default to the
server's and a value that disagrees is refused (one line, exit 2, nothing written). The
command ends with one line per run (:func:`run_summary`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dsparklab.cli.common import (
    DSparkModel,
    Eagle3Model,
    Overwrite,
    TargetModel,
)
from dsparklab.errors import ConfigError, UnknownMethodError

if TYPE_CHECKING:
    from dsparklab.engines.plan import CollectOptions
    from dsparklab.store.location import Location

ENGINES: dict[str, str] = {
    "reference": "dsparklab.engines.reference.collect:collect",
    "vllm": "dsparklab.engines.vllm.collect:collect",
    "vllm-serve": "dsparklab.engines.vllm.serve_client:collect_serve",
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


DEFAULT_METHODS = "dspark,eagle3,none"
DEFAULT_NS = "3..7"
DEFAULT_TIER = "tiny"


def _dataset_help() -> str:
    from dsparklab.prompts import PROMPT_FILE_PREFIXES, prompt_set_names

    names = ", ".join([*prompt_set_names(), *(f"{p}PATH" for p in PROMPT_FILE_PREFIXES)])
    return f"Comma list of prompt sets: {names}."


def collect(
    engine: Annotated[str, typer.Option(help=f"Engine: {', '.join(sorted(ENGINES))}.")] = (
        "reference"
    ),
    method: Annotated[
        str | None,
        typer.Option(
            help=f"Comma list of dspark, eagle3, none (default: {DEFAULT_METHODS}; "
            "vllm-serve: the server's, and any other value is refused)."
        ),
    ] = None,
    n: Annotated[
        str | None,
        typer.Option(
            "--n",
            help=f"Speculative tokens: '3..7', '3,5,7' or '4' (default: {DEFAULT_NS}; "
            "vllm-serve: the server's, and any other value is refused).",
        ),
    ] = None,
    dataset: Annotated[str, typer.Option(help=_dataset_help())] = "humaneval,prose",
    limit: Annotated[int | None, typer.Option(help="First LIMIT prompts of each set.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt.")] = 128,
    out: Annotated[
        str,
        typer.Option(
            help="Output root (a directory or s3://bucket/prefix); one run per (set, method, n)."
        ),
    ] = "runs",
    temperature: Annotated[float, typer.Option(help="0 = greedy; > 0 = rejection sampling.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Sampling seed (T > 0).")] = 0,
    tier: Annotated[
        str | None,
        typer.Option(
            help=f"Zoo tier whose models are the defaults (tiny, smol; default: {DEFAULT_TIER}). "
            "vllm-serve: the server's models decide the tier; a value given must match."
        ),
    ] = None,
    target: TargetModel = None,
    dspark: DSparkModel = None,
    eagle3: Eagle3Model = None,
    threads: Annotated[
        int | None,
        typer.Option(
            help="torch threads (default: OMP_NUM_THREADS where it is set, else 2: one "
            "process owns both cores)."
        ),
    ] = None,
    overwrite: Overwrite = False,
    concurrency: Annotated[
        str | None,
        typer.Option(
            help="Load: requests in flight, e.g. '1,2,4' (a closed loop of C; vllm: the "
            "engine's max_num_seqs). Each run is made at each, named -c<C>, and records it "
            "(default: the engine's own, recorded; reference: 1).",
        ),
    ] = None,
    repeats: Annotated[
        int,
        typer.Option(
            help="Make every run this many times (-r<R> after the first), repeat-major and "
            "then by concurrency, so drift spreads over all configurations.",
        ),
    ] = 1,
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
    """Decode prompt sets and record one trace run per (dataset, method, n); one line each.

    Each run's line: requests, steps, AL, whether vLLM's per-request totals agree.

    vllm-serve: what the server runs labels the runs; a disagreeing option is refused.
    """
    from dsparklab.engines.plan import (
        CollectOptions,
        default_threads,
        parse_concurrencies,
        parse_list,
        parse_ns,
        tier_models,
    )

    serve_options = {"server_url": server_url, "tap_dir": tap_dir}
    given = [f"--{k.replace('_', '-')}" for k, v in serve_options.items() if v is not None]
    if given and engine != "vllm-serve":
        raise ConfigError(f"{', '.join(given)} applies to --engine vllm-serve, not {engine!r}")
    collector = engine_collector(engine)
    served = engine == "vllm-serve"
    options = CollectOptions(
        methods=parse_list(method or ("" if served else DEFAULT_METHODS)),
        ns=[] if served and n is None else parse_ns(n or DEFAULT_NS),
        datasets=parse_list(dataset),
        out=out,
        limit=limit,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        **tier_models(tier or DEFAULT_TIER, target, dspark, eagle3),
        threads=default_threads() if threads is None else threads,
        overwrite=overwrite,
        progress=True,
        engine=engine,  # names the runs (each collector sets its own; the summary lines too)
        concurrencies=parse_concurrencies(concurrency) if concurrency else (),
        repeats=repeats,
    )
    if served:
        root, options = _collect_served(
            collector,
            options,
            server_url=server_url,
            tap_dir=tap_dir,
            named={"target": target, "dspark": dspark, "eagle3": eagle3, "tier": tier},
        )
    else:
        root = collector(options)
    typer.echo(str(root))
    for spec in options.runs():
        typer.echo(run_summary(spec.location(root), spec.name))


def _collect_served(
    collector: Callable[..., Path],
    options: CollectOptions,
    *,
    server_url: str | None,
    tap_dir: Path | None,
    named: dict[str, str | None],
) -> tuple[Path, CollectOptions]:
    """Ask the server what it runs, refuse options that disagree, then collect."""
    from dsparklab.engines.vllm.serve_client import (
        default_server_url,
        default_tap_dir,
        served_options,
    )
    from dsparklab.engines.vllm.served import discover

    url, taps = default_server_url(server_url), default_tap_dir(tap_dir)
    served = discover(url, taps)
    options = served_options(options, served)
    root = collector(options, server_url=url, tap_dir=taps, served=served, named=named)
    return root, options


def run_summary(run_dir: Location, name: str) -> str:
    """One line: requests, steps, AL, and whether vLLM's per-request totals agree."""
    from dsparklab.engines.stats import acceptance_length
    from dsparklab.errors import DSparkLabError
    from dsparklab.store import read_run_json

    try:
        meta = read_run_json(run_dir)
    except DSparkLabError:
        return f"{name}: not written"
    rows = meta.get("rows") or {}
    stats = meta.get("stats") or {}
    steps = int(stats.get("num_steps", rows.get("steps", 0)))
    requests = int(meta.get("num_requests", rows.get("requests", 0)))
    head = f"{name}: {_count(requests, 'request')}, {_count(steps, 'step')}"
    if meta["status"] != "complete":
        head += f" ({meta['status']})"
    if meta["method"] == "none":
        return f"{head}, target only"
    al = acceptance_length(int(stats.get("num_accepted", 0)), steps)
    whose = "the server's" if (meta.get("engine") or {}).get("mode") == "serve" else "vLLM's"
    check = (meta.get("checks") or {}).get("totals_vs_trace")
    if not check or not check.get("requests"):
        totals = "no per-request totals to compare (the engine reports none)"
    elif check["agree"] == check["requests"]:
        totals = f"per-request totals agree with {whose} ({check['agree']} of {check['requests']})"
    else:
        differ = check["requests"] - check["agree"]
        totals = (
            f"per-request totals DIFFER from {whose} for {differ} of {check['requests']} "
            "requests (run.json checks.totals_vs_trace)"
        )
    return f"{head}, AL {al:.2f}; {totals}"


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}" if k == 1 else f"{k} {noun}s"
