"""``dsparklab lab``: JupyterLab on the notebooks, on loopback, behind a token.

JupyterLab serves the notebooks shipped with the package (in a checkout, ``notebooks/``;
see :mod:`dsparklab.lab.resources`). The runs directory reaches them through
``$DSPARKLAB_RUNS``, which their parameters cell reads when ``RUNS`` is empty (see
:func:`dsparklab.lab.runs.resolve_runs`), the shipped traces through
``$DSPARKLAB_SHIPPED`` (:func:`dsparklab.lab.runs.shipped_traces`); both absolute, as
the kernels run in the notebooks' directory.
:func:`start_lab` is what the CLI and the browser tests use; the caller owns the process
and must stop it (:meth:`LabServer.stop`).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dsparklab.errors import DSparkLabError
from dsparklab.lab.display import HEADLESS_ENV
from dsparklab.lab.resources import notebooks_dir
from dsparklab.lab.runs import RUNS_ENV, SHIPPED_ENV, resolve_runs
from dsparklab.ports import LOOPBACK, free_port
from dsparklab.store.location import Location
from dsparklab.zoo.load import ZOO_DIR, ZOO_ENV

logger = logging.getLogger(__name__)


class LabError(DSparkLabError):
    """JupyterLab did not come up."""


def lab_command(
    *,
    port: int,
    token: str,
    root_dir: Path,
    open_browser: bool = False,
    expose_app: bool = False,
) -> list[str]:
    """The ``jupyter lab`` command line: loopback only, a token, no network fetches."""
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--ServerApp.ip={LOOPBACK}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root_dir}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.open_browser={open_browser}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if expose_app:
        command.append("--LabApp.expose_app_in_browser=True")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    return command


@dataclass
class LabServer:
    """A running JupyterLab (started by :func:`start_lab`)."""

    process: subprocess.Popen[bytes]
    port: int
    token: str
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def url(self, path: str = "lab") -> str:
        """``http://127.0.0.1:PORT/<path>?token=...``."""
        return f"{self.base_url}/{path.lstrip('/')}?token={self.token}"

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the server and its kernels down; escalate to SIGTERM, then SIGKILL.

        Kernels run in their own sessions, so the graceful ``/api/shutdown`` (which shuts
        them down first) is tried before any signal.
        """
        if self.process.poll() is not None:
            return
        request = urllib.request.Request(
            f"{self.base_url}/api/shutdown",
            method="POST",
            headers={"Authorization": f"token {self.token}"},
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
            self.process.wait(timeout=timeout)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, subprocess.TimeoutExpired):
            logger.warning("JupyterLab did not shut down on request; terminating it")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
                self.process.wait(timeout=timeout)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue


def start_lab(
    runs: Location | Path | str | None,
    *,
    port: int | None = None,
    token: str | None = None,
    root_dir: Path | None = None,
    shipped: Path | None = None,
    log: Path | None = None,
    open_browser: bool = False,
    expose_app: bool = False,
    timeout: float = 90.0,
) -> LabServer:
    """Start JupyterLab and wait until it answers; returns the running server.

    Parameters
    ----------
    runs
        The runs directory for the notebooks (``$DSPARKLAB_RUNS``); None keeps the
        environment's (or the demo runs).
    port, token
        Default: a free port, a random token.
    root_dir
        The directory JupyterLab serves (default: the shipped notebooks).
    shipped
        The shipped traces for the notebooks (``$DSPARKLAB_SHIPPED``); None keeps the
        environment's (or ``data/traces`` from the notebooks' directory).
    log
        Where the server's output goes (default: a file in the system temp dir).
    open_browser, expose_app
        Open a browser; expose ``window.jupyterapp`` (for browser tests).
    timeout
        Seconds to wait for the server to answer.
    """
    import tempfile

    port = port or free_port()
    token = token or secrets.token_hex(24)
    env = dict(os.environ)
    env.pop(HEADLESS_ENV, None)  # the lab's kernels have a front end
    if runs is not None:
        env[RUNS_ENV] = str(resolve_runs(runs))
    if shipped is not None:
        env[SHIPPED_ENV] = str(Path(shipped).resolve())
    env[ZOO_ENV] = str(ZOO_DIR)  # the kernels run in the notebooks' directory
    log = log or Path(tempfile.mkstemp(prefix="dsparklab-lab-", suffix=".log")[1])
    command = lab_command(
        port=port,
        token=token,
        root_dir=notebooks_dir() if root_dir is None else root_dir,
        open_browser=open_browser,
        expose_app=expose_app,
    )
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stop() reaches the kernels
        )
    server = LabServer(process=process, port=port, token=token, log=log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabError(
                f"JupyterLab exited with code {process.returncode}; see {log}:\n"
                + log.read_text(errors="replace")[-2000:]
            )
        try:
            with urllib.request.urlopen(server.url("api/status"), timeout=2) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    server.stop()
    raise LabError(f"JupyterLab did not answer on port {port} within {timeout:.0f} s; see {log}")
