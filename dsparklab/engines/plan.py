"""What every engine's collector shares: its options, which runs they make, and where.

``dsparklab collect --method dspark,eagle3,none --n 3..7 --dataset humaneval,prose``
makes one run per (dataset, method, n) -- one ``none`` run per dataset, since the
target-only baseline drafts nothing -- named ``<engine>/<dataset>/<method>-n<k>``
(``<engine>/<dataset>/none``; ``-t<T>`` appended when sampling, ``-c<C>`` when the
collect names its concurrency, ``-r<R>`` for repeats after the first): its run_id, by which the
store ``<out>`` (in the table layout, :mod:`dsparklab.store.layout`) holds it. Every engine's
``collect`` takes one :class:`CollectOptions` (plus the few settings only that engine has).

A run's identity (:meth:`CollectOptions.identity`: engine, target, drafter, decoding settings
and prompt limit) is recorded in its run.json. A collect skips a complete run only when the
identity recorded is its own; a complete run of another identity under the same run_id is
refused with one line naming the field (exit 2), never skipped nor overwritten unasked. A
model spelled another way (a zoo name, a path to the same directory) is the same model when
its files hash to the checkpoint the run recorded.
The engine is in the run_id, so runs of two engines coexist in one store.

Load is a run dimension: ``--concurrency 1,2,4 --repeats 3`` makes every run at each
concurrency (requests in flight: a closed loop of C) three times, ordered repeat-major
and then by concurrency, so that drift over the collect spreads over every configuration
instead of landing on the last ones. Every run records its load in run.json (``load``:
the concurrency it kept, its repeat, and the batch sizes its steps saw).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparklab.errors import ConfigError, DSparkLabError, UnknownMethodError
from dsparklab.store.layout import run_location
from dsparklab.store.location import Location, Where
from dsparklab.store.reader import complete_run_json
from dsparklab.store.schema import METHODS

logger = logging.getLogger(__name__)


def checkpoint_hash_of(spelled: Any) -> str | None:
    """The content hash of the local checkpoint a model's name or path spells (a zoo
    name, a relative or absolute path); None when it spells none."""
    from dsparklab.engines.checkpoints import resolve_model

    if not isinstance(spelled, str):
        return None
    try:
        return resolve_model(spelled).content_hash
    except (DSparkLabError, OSError):
        return None


DEFAULT_TARGET = "tiny-target"
DEFAULT_DRAFTERS = {"dspark": "tiny-dspark", "eagle3": "tiny-eagle3"}


@dataclass(frozen=True)
class RunSpec:
    """One run to collect: a dataset, a method and its n (0 for 'none'), by one engine
    (a key of ``dsparklab collect --engine``: reference, vllm, vllm-serve; or vllm-harness)."""

    dataset: str
    method: str
    n: int
    temperature: float = 0.0
    engine: str = "reference"
    concurrency: int | None = None  # None: the engine's own (its line says which)
    repeat: int = 0

    @property
    def dataset_dir(self) -> str:
        """The dataset's directory name (a JSONL set is named by its file's stem)."""
        from dsparklab.prompts import dataset_label

        return dataset_label(self.dataset)

    @property
    def name(self) -> str:
        """``<engine>/<dataset>/<method>-n<k>`` (``<engine>/<dataset>/none`` for the
        baseline; ``-t<T>`` appended when sampling, ``-c<C>`` for a concurrency the collect
        named, ``-r<R>`` for a repeat after the first)."""
        leaf = "none" if self.method == "none" else f"{self.method}-n{self.n}"
        if self.temperature:
            leaf += f"-t{self.temperature:g}"
        if self.concurrency is not None:
            leaf += f"-c{self.concurrency}"
        if self.repeat:
            leaf += f"-r{self.repeat}"
        return f"{self.engine}/{self.dataset_dir}/{leaf}"

    def location(self, out: Where) -> Location:
        """Where the run of this spec lives in the store ``out`` (its run.json's directory);
        the run_id is :attr:`name`."""
        return run_location(
            out,
            {
                "dataset": self.dataset_dir,
                "method": self.method,
                "num_speculative_tokens": self.n,
                "run_id": self.name,
            },
        )


def parse_ns(text: str) -> list[int]:
    """``"3..7"`` -> [3, 4, 5, 6, 7]; ``"3,5,7"`` -> [3, 5, 7]; ``"4"`` -> [4]."""
    values: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if ".." in part:
                low, high = (int(v) for v in part.split("..", 1))
                if low > high:
                    raise ConfigError(f"--n range {part!r} is empty; write LOW..HIGH")
                values.extend(range(low, high + 1))
            elif part:
                values.append(int(part))
    except ValueError as err:
        raise ConfigError(f"--n {text!r} is not a list of ints or LOW..HIGH ranges") from err
    if not values or min(values) < 1:
        raise ConfigError(f"--n {text!r}: expected speculative token counts >= 1")
    return sorted(set(values))


def parse_concurrencies(text: str) -> list[int]:
    """``"1,2,4"`` or ``"1..4"`` -> requests in flight, each >= 1 (as :func:`parse_ns`)."""
    try:
        return parse_ns(text)
    except ConfigError as err:
        raise ConfigError(
            f"--concurrency {text!r}: expected request counts >= 1, e.g. 1,2,4"
        ) from err


def parse_list(text: str) -> list[str]:
    """``"a,b"`` -> ["a", "b"] (blanks dropped, order kept, duplicates removed)."""
    return list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


def tier_models(
    tier: str, target: str | None, dspark: str | None, eagle3: str | None
) -> dict[str, str]:
    """The models a collection runs: those named, else the tier's (``TIER-target``...)."""
    named = {"target": target, "dspark": dspark, "eagle3": eagle3}
    return {role: value or f"{tier}-{role}" for role, value in named.items()}


def plan_runs(
    methods: Sequence[str],
    ns: Iterable[int],
    datasets: Sequence[str],
    *,
    temperature: float = 0.0,
    engine: str = "reference",
    concurrencies: Sequence[int] = (),
    repeats: int = 1,
) -> list[RunSpec]:
    """Every run of a collect request by ``engine``: repeat-major, then concurrency (the
    engine's own when none is named), then dataset-major, baseline first."""
    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: expected 1 or more")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UnknownMethodError(
            f"unknown method {unknown[0]!r}; expected some of {', '.join(METHODS)}"
        )
    ns = sorted(set(ns))
    ordered = sorted(set(methods), key=lambda m: (m != "none", list(METHODS).index(m)))
    loads: list[int | None] = [*sorted(set(concurrencies))] or [None]
    runs = []
    for repeat in range(repeats):
        for concurrency in loads:
            for dataset in datasets:
                for method in ordered:
                    for n in [0] if method == "none" else ns:
                        runs.append(
                            RunSpec(dataset, method, n, temperature, engine, concurrency, repeat)
                        )
    return runs


def load_block(spec: RunSpec, concurrency: int, batch_sizes: Iterable[Any] = ()) -> dict[str, Any]:
    """run.json's ``load``: the requests in flight the run kept (``concurrency``: the
    spec's, else the engine's own), its ``repeat``, and how many of its request-steps ran
    in a batch of each size (``batch_sizes``, ``{"size": steps}``; absent when the steps
    record none)."""
    block: dict[str, Any] = {"concurrency": int(concurrency), "repeat": int(spec.repeat)}
    sizes = Counter(int(size) for size in batch_sizes if size == size and size is not None)
    if sizes:
        block["batch_sizes"] = {str(size): sizes[size] for size in sorted(sizes)}
    return block


def is_complete(run_dir: Where) -> bool:
    """True when ``run_dir`` holds a readable run.json with status 'complete'."""
    return complete_run_json(run_dir) is not None


def default_threads() -> int:
    """A collector's torch threads: ``OMP_NUM_THREADS`` where it is set to a positive count
    (the usual bound on a process's threads; the test suite sets 1, its two workers sharing
    two cores), else 2: one process owns both of this machine's cores."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 2


@dataclass(frozen=True)
class CollectOptions:
    """One collection, for any engine: the runs to make and how to decode them.

    Parameters
    ----------
    methods, ns, datasets
        The runs to make (see :func:`plan_runs`).
    out
        The store: a directory or ``s3://bucket/prefix``; each run goes to its partition
        (:meth:`RunSpec.location`).
    limit
        First ``limit`` prompts of each dataset (None: all).
    max_new_tokens, temperature, seed
        Decoding settings (temperature 0 = greedy).
    target, dspark, eagle3
        Zoo names or checkpoint directories (a server decides what it runs: there they
        only label the runs, with hashes when they are directories).
    threads
        ``torch.set_num_threads`` on CPU (None leaves torch's default); by default
        :func:`default_threads`.
    overwrite
        Redo runs that are already complete (else they are skipped).
    progress
        Show progress bars.
    tier
        The tier run.json records; None: the models' zoo tier (``smol-target`` ->
        ``smol``; a served model outside the zoo: ``custom``).
    engine
        The engine that collects (its key names the runs); each collector sets its own.
    concurrencies, repeats
        Load: each run at each concurrency (requests in flight; empty: the engine's own),
        ``repeats`` times, interleaved (:func:`plan_runs`).
    """

    methods: Sequence[str]
    ns: Sequence[int]
    datasets: Sequence[str]
    out: Where
    limit: int | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    target: str | Path = DEFAULT_TARGET
    dspark: str | Path = DEFAULT_DRAFTERS["dspark"]
    eagle3: str | Path = DEFAULT_DRAFTERS["eagle3"]
    threads: int | None = field(default_factory=default_threads)
    overwrite: bool = False
    progress: bool = True
    tier: str | None = None
    engine: str = "reference"
    concurrencies: Sequence[int] = ()
    repeats: int = 1

    @property
    def drafters(self) -> dict[str, str | Path]:
        """Method -> its drafter (zoo name or directory)."""
        return {"dspark": self.dspark, "eagle3": self.eagle3}

    def runs(self) -> list[RunSpec]:
        """Every run these options name (:func:`plan_runs`)."""
        return plan_runs(
            self.methods,
            self.ns,
            self.datasets,
            temperature=self.temperature,
            engine=self.engine,
            concurrencies=self.concurrencies,
            repeats=self.repeats,
        )

    def identity(self, spec: RunSpec) -> dict[str, Any]:
        """What makes ``spec``'s run this run and no other, as its run.json records it:
        engine, target, the method's drafter, decoding settings and the prompt limit (the
        seed only when sampling: greedy runs do not depend on it; the concurrency when the
        collect named one)."""
        drafter = self.drafters.get(spec.method)
        identity: dict[str, Any] = {
            "engine": spec.engine,
            "target": str(self.target),
            "drafter": None if drafter is None else str(drafter),
            "temperature": float(spec.temperature),
            "max_new_tokens": int(self.max_new_tokens),
            "limit": self.limit,
        }
        if spec.temperature:
            identity["seed"] = int(self.seed)
        if spec.concurrency is not None:
            identity["concurrency"] = int(spec.concurrency)
        return identity

    @staticmethod
    def _same_model(
        key: str, spelled: Any, meta: dict[str, Any], hashes: dict[Any, str | None]
    ) -> bool:
        """Whether identity field ``key`` names, spelled another way (a zoo name, a path),
        the checkpoint the run recorded: its files hash to the run's ``content_hash``."""
        model = meta.get(key)
        recorded = model.get("content_hash") if isinstance(model, dict) else None
        if not recorded:
            return False
        if spelled not in hashes:
            hashes[spelled] = checkpoint_hash_of(spelled)
        return hashes[spelled] == recorded

    def todo(self) -> list[RunSpec]:
        """The runs to make: all with ``overwrite``, else those not complete in ``out``.

        Raises
        ------
        ConfigError
            A complete run of ``out`` has this run_id but another identity (one line
            naming its run.json and the first field that differs).
        """
        Location.of(self.out).check_bucket()  # before any model loads
        todo = []
        hashes: dict[Any, str | None] = {}  # this collect's models, hashed once each
        for spec in self.runs():
            where = spec.location(self.out)
            meta = None if self.overwrite else complete_run_json(where)
            if meta is None:
                todo.append(spec)
                continue
            wanted, recorded = self.identity(spec), meta.get("identity") or {}
            differ = next(
                (
                    key
                    for key in wanted
                    if recorded.get(key) != wanted[key]
                    and not self._same_model(key, wanted[key], meta, hashes)
                ),
                None,
            )
            if differ is not None:
                raise ConfigError(
                    f"{where / 'run.json'}: identity.{differ} is {recorded.get(differ)!r}, "
                    f"this collect's is {wanted[differ]!r}; collect into another --out, or "
                    f"--overwrite to replace {spec.name}"
                )
            logger.info("skipping %s: already complete", where)
        return todo
