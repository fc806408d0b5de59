"""Collect reference-engine runs into run directories (the trace contract).

``collect`` is what ``dsparklab collect --engine reference`` calls: it loads the target
and the drafters once, then, per dataset, decodes each prompt with every (method, n)
configuration before moving to the next prompt (interleaved, so no run has the machine
to itself and the timings of all configurations share the machine's drift), writing each
run through :class:`dsparklab.store.TraceWriter`. Runs whose run.json says ``complete``
are skipped, so an interrupted collection resumes where it stopped (an interrupted run is
marked ``failed`` with its rows kept, and is redone).
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch
from tqdm.auto import tqdm

import dsparklab
from dsparklab.engines.checkpoints import ModelRef, models_tier, resolve_model
from dsparklab.engines.plan import DEFAULT_DRAFTERS, CollectOptions, RunSpec, load_block
from dsparklab.engines.reference.config import Method, ReferenceConfig
from dsparklab.engines.reference.core import ENGINE_NAME, ReferenceEngine, record_row
from dsparklab.engines.stats import DraftStats
from dsparklab.errors import ConfigError
from dsparklab.prompts import Prompt, encode_prompt, load_prompts
from dsparklab.provenance import provenance
from dsparklab.store import TraceWriter, new_run_json
from dsparklab.store.location import Location

logger = logging.getLogger(__name__)


class ModelSet:
    """The target and drafters of one collection, each loaded on first use."""

    def __init__(self, target: str | Path, drafters: dict[str, str | Path] | None = None) -> None:
        self.target_ref = resolve_model(target)
        self._drafter_names = dict(DEFAULT_DRAFTERS if drafters is None else drafters)
        self._drafter_refs: dict[str, ModelRef] = {}
        self._target: tuple[Any, Any] | None = None
        self._drafters: dict[str, torch.nn.Module] = {}

    @property
    def target(self) -> torch.nn.Module:
        return self._load_target()[0]

    @property
    def tokenizer(self) -> Any:
        return self._load_target()[1]

    def _load_target(self) -> tuple[Any, Any]:
        if self._target is None:
            from dsparklab.zoo import load_target

            self._target = load_target(self.target_ref.path)
        return self._target

    def drafter_ref(self, method: str) -> ModelRef | None:
        """The drafter checkpoint of ``method`` (None for 'none')."""
        return None if method == "none" else self._resolve_drafter(method)

    def _resolve_drafter(self, method: str) -> ModelRef:
        if method not in self._drafter_refs:
            self._drafter_refs[method] = resolve_model(self._drafter_names[method])
        return self._drafter_refs[method]

    def drafter(self, method: str) -> torch.nn.Module | None:
        if method == "none":
            return None
        if method not in self._drafters:
            from dsparklab.zoo import load_dspark_drafter, load_eagle3_drafter

            loader = {"dspark": load_dspark_drafter, "eagle3": load_eagle3_drafter}[method]
            path = self._resolve_drafter(method).path
            self._drafters[method] = loader(path, target_path=self.target_ref.path)
        return self._drafters[method]


def _drafter_json(ref: ModelRef) -> dict[str, Any]:
    """The drafter as run.json records it, with its confidence temperatures if calibrated."""
    from dsparklab.zoo.calibrate import read_temperatures

    temperatures = read_temperatures(ref.path)
    return {**ref.to_json(), **({"confidence_temperatures": temperatures} if temperatures else {})}


class RunRecorder:
    """One (method, n) run being written: its engine, its writer and its running tally."""

    def __init__(
        self,
        out: Location,
        spec: RunSpec,
        models: ModelSet,
        *,
        config: ReferenceConfig,
        identity: Mapping[str, Any],
        tier: str | None = None,
        overwrite: bool = True,
    ) -> None:
        self.spec = spec
        self.models = models
        self.engine = ReferenceEngine(models.target, models.drafter(spec.method), config=config)
        drafter_ref = models.drafter_ref(spec.method)
        meta = new_run_json(
            run_id=spec.name,
            engine={"name": ENGINE_NAME, "version": dsparklab.__version__},
            method=spec.method,
            num_speculative_tokens=spec.n,
            target=models.target_ref.to_json(),
            drafter=None if drafter_ref is None else _drafter_json(drafter_ref),
            dataset=spec.dataset_dir,
            sampling={"temperature": config.temperature, "seed": config.seed},
            tier=tier or models_tier(models.target_ref, drafter_ref),
            hardware={
                "device": "cpu",
                "torch_threads": torch.get_num_threads(),
                "machine": platform.machine(),
            },
            config=config.to_json(),
            config_descriptions=ReferenceConfig.describe(),
            provenance=provenance(),
            identity=dict(identity),
            load=load_block(spec, 1),  # one request at a time
        )
        self.stats = DraftStats.new(spec.n)
        self.requests = 0
        self.writer = TraceWriter(out, meta, overwrite=overwrite)

    def record(self, prompt: Prompt) -> None:
        """Decode one prompt and buffer its rows."""
        tokenizer = self.models.tokenizer
        ids = encode_prompt(tokenizer, prompt, self.engine.max_prompt_len)
        result = self.engine.generate(ids, request_id=prompt.prompt_id)
        rid = {"request_id": prompt.prompt_id}
        step_extra = {**rid, "prompt_id": prompt.prompt_id, "dataset": self.spec.dataset_dir}
        self.writer.add_many("steps", [record_row(s, **step_extra) for s in result.steps])
        self.writer.add_many("positions", [record_row(p, **rid) for p in result.positions])
        self.writer.add(
            "requests",
            {
                **step_extra,
                "prompt_token_ids": result.prompt_token_ids,
                "output_token_ids": result.output_token_ids,
                "output_text": tokenizer.decode(result.output_token_ids),
                "wall_time_s": result.wall_time_s,
            },
        )
        self.stats = self.stats.merge(result.stats)
        self.requests += 1

    def __enter__(self) -> RunRecorder:
        self.writer.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        # complete: the summary goes into run.json; failed: the writer keeps every row
        if exc[0] is None:
            self.writer.update_meta(stats=self.stats.to_json(), num_requests=self.requests)
        self.writer.__exit__(*exc)


def collect(options: CollectOptions) -> Location:
    """Collect every (dataset, method, n) run of ``options`` with the reference engine.

    The demo labels its live runs with ``options.tier`` ``smol-live`` so that they stay
    apart from the shipped ``smol`` traces made in another sitting. Returns the output
    root.
    """
    options = replace(options, engine=ENGINE_NAME)
    if any(c != 1 for c in options.concurrencies):
        raise ConfigError(
            f"--concurrency {','.join(map(str, options.concurrencies))}: the reference engine "
            "decodes one request at a time; collect load with --engine vllm or vllm-serve"
        )
    out = Location.of(options.out)
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    todo = options.todo()
    if not todo:
        return out
    models = ModelSet(options.target, options.drafters)
    by_dataset: dict[str, list[RunSpec]] = {}
    for spec in todo:
        by_dataset.setdefault(spec.dataset, []).append(spec)
    for dataset, specs in by_dataset.items():
        prompts = load_prompts(dataset, limit=options.limit)
        with ExitStack() as stack:
            recorders = [
                stack.enter_context(
                    RunRecorder(
                        out,
                        spec,
                        models,
                        config=ReferenceConfig(
                            method=cast(Method, spec.method),  # plan_runs checked it
                            num_speculative_tokens=spec.n,
                            max_new_tokens=options.max_new_tokens,
                            temperature=options.temperature,
                            seed=options.seed,
                        ),
                        identity=options.identity(spec),
                        tier=options.tier,
                        overwrite=True,
                    )
                )
                for spec in specs
            ]
            bar = tqdm(
                total=len(prompts) * len(recorders), desc=dataset, disable=not options.progress
            )
            for index, prompt in enumerate(prompts):
                # every configuration decodes this prompt before the next one starts, in
                # an order rotated by the prompt: machine drift spreads over all of them
                shift = index % len(recorders)
                for recorder in recorders[shift:] + recorders[:shift]:
                    recorder.record(prompt)
                    bar.update(1)
            bar.close()
        for recorder in recorders:
            logger.info(
                "%s: %d steps, mean acceptance length %.2f",
                recorder.spec.name,
                recorder.stats.num_steps,
                recorder.stats.mean_acceptance_length,
            )
    return out
