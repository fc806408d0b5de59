"""`dsparklab lab` stops its JupyterLab (and the kernels' process group) on SIGTERM and
SIGHUP as it does on Ctrl-C: a real JupyterLab, a real signal."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

_URL = re.compile(r"(http://127\.0\.0\.1:\d+/)lab\?token=(\w+)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_lab_stops_jupyterlab_on_signal(sig: signal.Signals, tmp_path: Path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "dsparklab", "lab", "--runs", str(tmp_path)]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    children: list[psutil.Process] = []
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = cli.stdout.readline().decode()
            lines.append(line)
            found = _URL.search(line)
            if found or not line:
                break
        assert found, "".join(lines)
        base, token = found.groups()
        with urllib.request.urlopen(f"{base}api/status?token={token}", timeout=10) as answer:
            assert answer.status == 200
        children = psutil.Process(cli.pid).children(recursive=True)
        assert children, "JupyterLab runs as the command's child"
        cli.send_signal(sig)
        assert cli.wait(timeout=60) is not None
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
        with pytest.raises(urllib.error.URLError):  # nothing listens any more
            urllib.request.urlopen(f"{base}api/status?token={token}", timeout=5)
    finally:
        if cli.poll() is None:
            cli.kill()
        # Only the command's own descendants: under xdist the worker has other children,
        # some of them zombies whose command line cannot be read.
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
