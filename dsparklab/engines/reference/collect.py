"""Collect reference-engine runs into run directories (the trace contract).

``collect`` is what ``dsparklab collect --engine reference`` calls: it loads the target
and the drafters once, then decodes every prompt of every (dataset, method, n) run and
writes each run through :class:`dsparklab.store.TraceWriter`. Runs whose run.json says
``complete`` are skipped, so an interrupted collection resumes where it stopped.
"""

from __future__ import annotations

import logging
import platform
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import dsparklab
from dsparklab.engines.layout import RunSpec, is_complete, plan_runs
from dsparklab.engines.reference.config import ReferenceConfig
from dsparklab.engines.reference.core import ENGINE_NAME, ReferenceEngine, record_row
from dsparklab.engines.reference.metrics import DraftStats
from dsparklab.prompts import Prompt, encode_prompt, load_prompts
from dsparklab.provenance import checkpoint_hash, provenance
from dsparklab.store import TraceWriter, new_run_json

logger = logging.getLogger(__name__)

DEFAULT_TARGET = "tiny-target"
DEFAULT_DRAFTERS = {"dspark": "tiny-dspark", "eagle3": "tiny-eagle3"}


@dataclass(frozen=True)
class ModelRef:
    """A checkpoint as run.json records it."""

    name: str
    path: Path
    content_hash: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "path": str(self.path), "content_hash": self.content_hash}


def resolve_model(name_or_path: str | Path) -> ModelRef:
    """A zoo name (``tiny-dspark``) or a checkpoint directory -> its path and hash."""
    from dsparklab.zoo import zoo_path

    path = Path(name_or_path)
    if not (path / "config.json").is_file():
        path = zoo_path(str(name_or_path))
    return ModelRef(name=path.name, path=path.resolve(), content_hash=checkpoint_hash(path))


def model_tier(name: str) -> str:
    """The zoo tier of a checkpoint name (``tiny-target`` -> ``tiny``); ``custom`` otherwise."""
    prefix, sep, _ = name.partition("-")
    return prefix if sep else "custom"


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


def collect_run(
    run_dir: Path,
    spec: RunSpec,
    models: ModelSet,
    prompts: Sequence[Prompt],
    *,
    config: ReferenceConfig,
    tier: str | None = None,
    overwrite: bool = True,
    progress: bool = True,
) -> DraftStats:
    """Decode ``prompts`` with one (method, n) and write the run to ``run_dir``."""
    engine = ReferenceEngine(models.target, models.drafter(spec.method), config=config)
    tokenizer = models.tokenizer
    drafter_ref = models.drafter_ref(spec.method)
    meta = new_run_json(
        run_id=f"{ENGINE_NAME}/{spec.name}/{uuid.uuid4().hex[:8]}",
        engine={"name": ENGINE_NAME, "version": dsparklab.__version__},
        method=spec.method,
        num_speculative_tokens=spec.n,
        target=models.target_ref.to_json(),
        drafter=None if drafter_ref is None else drafter_ref.to_json(),
        dataset=spec.dataset_dir,
        sampling={"temperature": config.temperature, "seed": config.seed},
        tier=tier or model_tier(models.target_ref.name),
        hardware={
            "device": "cpu",
            "torch_threads": torch.get_num_threads(),
            "machine": platform.machine(),
        },
        config=config.to_json(),
        config_descriptions=ReferenceConfig.describe(),
        provenance=provenance(),
    )
    stats = DraftStats.new(spec.n)
    with TraceWriter(run_dir, meta, overwrite=overwrite) as writer:
        for prompt in tqdm(prompts, desc=spec.name, leave=False, disable=not progress):
            ids = encode_prompt(tokenizer, prompt, engine.max_prompt_len)
            result = engine.generate(ids, request_id=prompt.prompt_id)
            rid = {"request_id": prompt.prompt_id}
            step_extra = {**rid, "prompt_id": prompt.prompt_id, "dataset": spec.dataset_dir}
            writer.add_many("steps", [record_row(s, **step_extra) for s in result.steps])
            writer.add_many("positions", [record_row(p, **rid) for p in result.positions])
            writer.add(
                "requests",
                {
                    **step_extra,
                    "prompt_token_ids": result.prompt_token_ids,
                    "output_token_ids": result.output_token_ids,
                    "output_text": tokenizer.decode(result.output_token_ids),
                    "wall_time_s": result.wall_time_s,
                },
            )
            stats = stats.merge(result.stats)
        writer.update_meta(stats=stats.to_json(), num_requests=len(prompts))
    return stats


def collect(
    *,
    methods: Sequence[str],
    ns: Sequence[int],
    datasets: Sequence[str],
    out: Path | str,
    limit: int | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    target: str | Path = DEFAULT_TARGET,
    dspark: str | Path = DEFAULT_DRAFTERS["dspark"],
    eagle3: str | Path = DEFAULT_DRAFTERS["eagle3"],
    threads: int | None = 1,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Collect every (dataset, method, n) run with the reference engine.

    Parameters
    ----------
    methods, ns, datasets
        The runs to make (see :func:`dsparklab.engines.layout.plan_runs`).
    out : path-like
        Root directory; each run goes to ``<out>/<dataset>/<method>-n<k>``.
    limit : int, optional
        First ``limit`` prompts of each dataset.
    max_new_tokens, temperature, seed
        Decoding settings (temperature 0 = greedy).
    target, dspark, eagle3
        Zoo names or checkpoint directories.
    threads : int, optional
        ``torch.set_num_threads`` for the collection (None leaves torch's default).
    overwrite : bool
        Redo runs that are already complete.
    progress : bool
        Show tqdm progress bars.

    Returns
    -------
    Path
        The output root.
    """
    out = Path(out)
    if threads is not None:
        torch.set_num_threads(threads)
    runs = plan_runs(methods, ns, datasets, temperature=temperature)
    todo = [r for r in runs if overwrite or not is_complete(out / r.name)]
    for skipped in (r for r in runs if r not in todo):
        logger.info("skipping %s: already complete", out / skipped.name)
    if not todo:
        return out
    models = ModelSet(target, {"dspark": dspark, "eagle3": eagle3})
    prompt_sets: dict[str, list[Prompt]] = {}
    for spec in tqdm(todo, desc="runs", disable=not progress):
        if spec.dataset not in prompt_sets:
            prompt_sets[spec.dataset] = load_prompts(spec.dataset, limit=limit)
        config = ReferenceConfig(
            method=spec.method,
            num_speculative_tokens=spec.n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
        )
        stats = collect_run(
            out / spec.name,
            spec,
            models,
            prompt_sets[spec.dataset],
            config=config,
            progress=progress,
        )
        logger.info(
            "%s: %d steps, mean acceptance length %.2f",
            spec.name,
            stats.num_steps,
            stats.mean_acceptance_length,
        )
    return out
