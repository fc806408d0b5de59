"""The session's reference runs, shared by every test directory that reads reference-engine
runs (integration, notebooks, browser).

The run set is real: ``dsparklab collect --engine reference`` output on the zoo's tiny
checkpoints (DSpark, Eagle3 and the target-only baseline, n = 3..7, the code and prose
sets), with small limits. It is collected once per session, whichever xdist worker asks
first, in the temp directory the workers share (a file lock); the others wait and read it.
Tests may read it and may run collects that must write nothing into it; a test that writes
runs copies them elsewhere first.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from filelock import FileLock

METHODS = ("dspark", "eagle3", "none")
NS = (3, 4, 5, 6, 7)
DATASETS = ("humaneval", "prose")
# prompts per set and tokens per prompt: 22 runs in well under a minute on one core
LIMIT = 2
MAX_NEW_TOKENS = 32
ZOO_MODELS = ("tiny-target", "tiny-dspark", "tiny-eagle3")


def require_zoo() -> None:
    """Fail (not skip) when the committed checkpoints are missing, as the engine tests do."""
    from dsparklab.zoo import ZOO_DIR

    missing = [name for name in ZOO_MODELS if not (ZOO_DIR / name / "config.json").is_file()]
    if missing:
        pytest.fail(
            f"zoo checkpoints missing in {ZOO_DIR}: {', '.join(missing)}; run "
            "`dsparklab zoo train --tier tiny` (or point DSPARKLAB_ZOO_DIR at a zoo)"
        )


def shared_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temp directory every xdist worker shares (each worker's base temp
    sits below it), so what is made here is made once per session."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@functools.cache
def reference_runs(base: Path) -> Path:
    """The reference engine's runs on the zoo (22 runs) under ``base/runs``, collected once
    per session: the first worker collects, the others wait for it and read them."""
    from dsparklab.engines.plan import CollectOptions
    from dsparklab.engines.reference.collect import collect

    require_zoo()
    out, done = base / "runs", base / "runs.collected"
    with FileLock(base / "runs.lock"):
        if not done.is_file():
            collect(
                CollectOptions(
                    methods=METHODS,
                    ns=NS,
                    datasets=DATASETS,
                    out=out,
                    limit=LIMIT,
                    max_new_tokens=MAX_NEW_TOKENS,
                    threads=1,
                    progress=False,
                )
            )
            done.touch()
    return out


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's reference runs (:func:`reference_runs`)."""
    return reference_runs(shared_base(tmp_path_factory))
