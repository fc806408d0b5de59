"""Debian's chromium driven headless by Playwright: the fixtures of every test that opens a
page (the browser tests, and the served report's first screen in tests/vllm). Each conftest
that needs them imports them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# Playwright's own browser download cannot be used here: drive Debian's build headless.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _install_chromium() -> str:
    """Try apt-get; return '' on success, else why it failed."""
    if shutil.which("apt-get") is None:
        return "apt-get is not available"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "not root, cannot apt-get install chromium"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"],
    ):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"{' '.join(command)}: {err}"
        if done.returncode != 0:
            return f"{' '.join(command)} exited {done.returncode}: {done.stderr[-300:]}"
    return ""


@pytest.fixture(scope="session")
def chromium() -> str:
    """The chromium executable; installed with apt-get when missing, else a visible skip."""
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).is_file() else None)
    if path is None:
        reason = _install_chromium()
        path = shutil.which("chromium")
        if path is None:
            pytest.skip(f"chromium is not installed and could not be installed: {reason}")
    return path


@pytest.fixture(scope="session")
def browser(chromium: str):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go (printed by the tests, kept with pytest's temp dirs)."""
    return tmp_path_factory.mktemp("screenshots")
