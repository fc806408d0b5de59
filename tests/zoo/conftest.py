"""Fixtures shared by the zoo tests (imports inside them: the test modules set the thread
environment before anything imports torch)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smol_target() -> Path:
    """The smol target, prepared from its wheel (idempotent, and locked against a second
    preparer: another test worker, or the demo)."""
    from dsparklab.zoo import ZOO_DIR
    from dsparklab.zoo.smol import prepare

    return prepare.prepare_smol_target(ZOO_DIR)
