"""Collect traces from a running ``vllm serve`` whose workers have the taps on: ask it what
it runs, send the prompt sets, wait for the taps' rows, and join them
(:mod:`dsparklab.engines.vllm.join`) into one run per dataset.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from dsparklab.engines.checkpoints import ModelRef, models_tier, resolve_model
from dsparklab.engines.plan import CollectOptions, load_block
from dsparklab.engines.vllm.config import ENV_TRACE_DIR
from dsparklab.engines.vllm.join import (
    CollectedRequest,
    TapTables,
    match_ids,
    read_tap_runs,
    response_timing,
    run_json,
    write_run,
)
from dsparklab.engines.vllm.served import (
    ServedConfig,
    ServedMismatchError,
    discover,
    http_json,
    served_run,
)
from dsparklab.prompts import Prompt, load_prompts
from dsparklab.store.catalog import Catalog
from dsparklab.store.location import Location, Where
from dsparklab.store.reader import store_runs
from dsparklab.store.sampling import request_sampled

logger = logging.getLogger(__name__)

# the run_id's engine of runs sent to a running server (``collect --engine vllm-serve``)
SERVE_ENGINE = "vllm-serve"
ENV_SERVER_URL = "DSPARKLAB_VLLM_URL"


def serve_completion(
    base_url: str,
    model: str,
    prompt: Prompt,
    prompt_token_ids: list[int] | None,
    *,
    request_id: str,
    max_tokens: int,
    temperature: float,
    seed: int,
    timeout: float = 600.0,
) -> CollectedRequest:
    """One ``/v1/completions`` request, tagged with ``X-Request-Id: request_id``."""
    payload = {
        "model": model,
        "prompt": prompt_token_ids if prompt_token_ids is not None else prompt.text,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "return_token_ids": True,
    }
    started = time.perf_counter()
    body = http_json(
        f"{base_url.rstrip('/')}/v1/completions", payload, {"X-Request-Id": request_id}, timeout
    )
    wall = time.perf_counter() - started
    choice = body["choices"][0]
    metrics = body.get("metrics") or {}
    spec = metrics.get("speculative_decoding") or {}
    return CollectedRequest(
        prompt=prompt,
        request_id=request_id,
        prompt_token_ids=list(choice.get("prompt_token_ids") or prompt_token_ids or []),
        output_token_ids=list(choice.get("token_ids") or []),
        output_text=choice.get("text"),
        wall_time_s=wall,
        spec_metrics=spec or None,
        timing=response_timing(metrics),
    )


def _tap_steps_needed(req: CollectedRequest) -> int | None:
    """The tap steps a request must have: vLLM's verify steps (speculative runs with
    per-step counts), one per output token after the first (target-only), else unknown."""
    if req.per_step_accepted is not None:
        return len(req.per_step_accepted)
    if req.spec_metrics is None:
        return max(len(req.output_token_ids) - 1, 0)
    return None


def _wait_for_taps(
    tap_dir: Location,
    wanted: Sequence[CollectedRequest],
    *,
    timeout: float,
    poll: float = 1.0,
    settle: float = 15.0,
) -> tuple[TapTables, float]:
    """Read the workers' tap runs until every request they record has its steps there (or
    timeout), and the fraction of requests they record (their run.json's ``sample``).

    "There" means that many steps: vLLM's per-step counts in the responses, or a
    target-only request's output tokens after the first; without either, that the tap
    rows stopped changing for ``settle`` seconds. Taps recording a sample
    (``DSPARKLAB_SAMPLE``) never record the other requests: those are not waited for.
    """
    deadline = time.monotonic() + timeout
    needed = {r.request_id: _tap_steps_needed(r) for r in wanted}
    known = all(k is not None for k in needed.values())
    last_count, stable_since = -1, time.monotonic()
    while True:
        dirs = store_runs(tap_dir)
        tables = read_tap_runs(dirs)
        # the taps' run.json says what they record (read each poll: a run starts late)
        sample = tap_sample(dirs)
        recorded = [r for r in wanted if request_sampled(r.request_id, sample)]
        steps = tables.steps
        if not recorded:
            return tables, sample
        if not steps.empty:
            ids = match_ids(recorded, steps["prompt_id"], exact=False)
            counts = steps.groupby("prompt_id")["step"].nunique()
            if known:
                done = all(
                    r.request_id in ids
                    and int(counts.get(ids[r.request_id], 0)) >= int(needed[r.request_id] or 0)
                    for r in recorded
                )
            else:
                total = len(steps)
                if total != last_count:
                    last_count, stable_since = total, time.monotonic()
                done = time.monotonic() - stable_since >= settle
            if done:
                return tables, sample
        if time.monotonic() >= deadline:
            logger.warning(
                "taps in %s incomplete after %.0f s (the workers flush every "
                "DSPARKLAB_FLUSH_SECONDS); writing what is there",
                tap_dir,
                timeout,
            )
            return tables, sample
        time.sleep(poll)


def tap_sample(tap_runs: Sequence[Location]) -> float:
    """The fraction of requests these tap runs record (1.0: every one, or no run yet); the
    largest where servers writing one directory differ."""
    if not tap_runs:
        return 1.0
    return float(max(Catalog.of(*tap_runs).runs["sample"]))


def default_server_url(url: str | None = None) -> str:
    """``url``, else ``$DSPARKLAB_VLLM_URL``, else ``http://localhost:8000`` (no trailing /)."""
    return (url or os.environ.get(ENV_SERVER_URL) or "http://localhost:8000").rstrip("/")


def default_tap_dir(tap_dir: Where | None = None) -> Location | None:
    """``tap_dir``, else ``$DSPARKLAB_TRACE_DIR``; None: the server's taps are not read."""
    value = tap_dir or os.environ.get(ENV_TRACE_DIR, "").strip()
    return Location.of(value) if value else None


def served_options(options: CollectOptions, served: ServedConfig) -> CollectOptions:
    """``options`` with the server's (method, n): empty ``methods`` / ``ns`` take them, any
    other value must name them (:func:`~dsparklab.engines.vllm.served.served_run`)."""
    method, n = served_run(served, options.methods, options.ns)
    return replace(options, methods=[method], ns=[n] if n else [])


# The options that name a role's model, for messages.
_MODEL_FLAGS = {"target": "--target", "dspark": "--dspark", "eagle3": "--eagle3"}


def _served_model_ref(
    served_path: str | None, named: str | Path | None, *, role: str, url: str
) -> ModelRef | None:
    """The run.json entry of a model the server loaded (``served_path``, its path or hub id).

    A model the caller ``named`` must be the same checkpoint (same directory name). The
    checkpoint is hashed where this process can read it and it is the caller's directory
    or a zoo checkpoint (a card.json); otherwise its hash is ``unknown (served)``.
    """
    if served_path is None:  # the server did not say (no tap run)
        if named is None:
            return None
        served_path = str(named)
    name = Path(served_path).name
    if named is not None and Path(str(named)).name != name:
        raise ServedMismatchError(
            f"the server at {url} serves {role} {served_path}; {_MODEL_FLAGS[role]} {named} "
            "disagrees (leave it out to take the server's)"
        )
    from dsparklab.zoo import ZOO_DIR
    from dsparklab.zoo.card import CARD_JSON

    candidates = [(Path(str(named)), True)] if named is not None else []
    candidates += [(Path(served_path), False), (ZOO_DIR / name, False)]
    for path, explicit in candidates:
        if (path / "config.json").is_file() and (explicit or (path / CARD_JSON).is_file()):
            return resolve_model(path)
    return ModelRef(name=name, path=Path(served_path), content_hash="unknown (served)")


def served_models(
    served: ServedConfig, method: str, named: Mapping[str, str | Path | None] | None = None
) -> tuple[ModelRef, ModelRef | None]:
    """The target and drafter refs of the server's runs, checked against ``named``."""
    named = dict(named or {})
    target = _served_model_ref(served.target, named.get("target"), role="target", url=served.url)
    assert target is not None
    drafter = None
    if method != "none":
        drafter = _served_model_ref(served.drafter, named.get(method), role=method, url=served.url)
    return target, drafter


def collect_serve(
    options: CollectOptions,
    *,
    server_url: str | None = None,
    tap_dir: Where | None = None,
    served: ServedConfig | None = None,
    named: Mapping[str, str | Path | None] | None = None,
    concurrency: int = 8,
    tap_timeout: float = 120.0,
    tokenize: Callable[[Prompt], list[int]] | None = None,
) -> Location:
    """Send the prompt sets to a running ``vllm serve`` whose workers have the taps on.

    The server decides what the runs are: its (method, n), target and drafter, vLLM
    version and hardware are asked of it first (:func:`~dsparklab.engines.vllm.served.discover`,
    unless ``served`` is given), and run.json records them (tier: the models' zoo tier).
    ``options.methods`` / ``options.ns`` may be empty (the server's); any value given must
    name the server's, and a model in ``named`` (role -> zoo name or directory, as the
    ``--target`` / ``--dspark`` / ``--eagle3`` options name them) must be the server's,
    else :class:`~dsparklab.engines.vllm.served.ServedMismatchError` (nothing written).

    The server must run with ``DSPARKLAB_TRACE_DIR`` set (its workers write the tap
    traces there; this process must be able to read that directory) and, for vLLM's
    per-step counts, ``--per-request-spec-decode-metrics detailed``. ``server_url``
    defaults to ``$DSPARKLAB_VLLM_URL`` or ``http://localhost:8000``; ``tap_dir`` to
    ``$DSPARKLAB_TRACE_DIR`` (neither: runs keep vLLM's per-step counts, no positions).
    ``concurrency`` requests are in flight at once (a closed loop; where
    ``options.concurrencies`` names loads, each run keeps its own); ``tap_timeout`` bounds
    each wait for the taps' rows; ``tokenize`` (prompt -> token ids) sends token ids
    instead of text.
    """
    options = replace(options, engine=SERVE_ENGINE)
    out = Location.of(options.out)
    url = default_server_url(server_url)
    taps = default_tap_dir(tap_dir)
    if served is None:
        served = discover(url, taps, tap_timeout=tap_timeout)
    options = served_options(options, served)
    method = options.methods[0]
    n = served.n if method != "none" else 0
    target_ref, drafter_ref = served_models(served, method, named)
    tier = models_tier(target_ref, drafter_ref)
    wanted_tier = (named or {}).get("tier")
    if wanted_tier is not None and str(wanted_tier) != tier:
        raise ServedMismatchError(
            f"the server at {url} runs {served.describe()}, models of tier {tier!r}; "
            f"--tier {wanted_tier} disagrees (leave it out)"
        )
    todo = options.todo()
    if not todo:
        return out
    if taps is None and n:
        logger.warning(
            "no tap directory (--tap-dir / DSPARKLAB_TRACE_DIR): the runs keep vLLM's "
            "per-step counts, without positions"
        )
    options = replace(options, tier=options.tier or tier)
    token = uuid.uuid4().hex[:10]
    for run_index, spec in enumerate(todo):
        prompts = load_prompts(spec.dataset, limit=options.limit)

        def one(item: tuple[int, Prompt], tag: str = f"dsl{token}r{run_index}") -> CollectedRequest:
            index, prompt = item
            return serve_completion(
                url,
                served.model,
                prompt,
                tokenize(prompt) if tokenize is not None else None,
                request_id=f"{tag}x{index}",
                max_tokens=options.max_new_tokens,
                temperature=options.temperature,
                seed=options.seed,
            )

        in_flight = spec.concurrency or concurrency
        with ThreadPoolExecutor(max_workers=max(1, in_flight)) as pool:
            results = list(pool.map(one, enumerate(prompts)))
        # target-only servers record their steps' costs too (engines/vllm/steps.py)
        tables, sample = _wait_for_taps(taps, results, timeout=tap_timeout) if taps else (None, 1.0)
        meta = run_json(
            spec,
            target_ref,
            drafter_ref,
            options,
            engine={
                "version": served.vllm_version,
                "mode": "serve",
                "model_runner": served.model_runner,
            },
            hardware=served.hardware or {"device": "unknown (served; no tap run)"},
            speculative=dict(served.speculative or {}),
            extra={
                "server_url": url,
                "served_model": served.model,
                "tap_dir": None if taps is None else str(taps),
                "served": served.to_json(),
            },
            load=load_block(spec, in_flight),
        )
        write_run(out, spec, meta, results, taps=tables, exact_ids=False, sample=sample)
    return out
