"""`dsparklab lab`: JupyterLab on the notebooks, loopback only, with a token, runs selected."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Annotated

import typer

from dsparklab.cli.common import NotebooksDir, ShippedDir, fail


def lab(
    runs: Annotated[
        str | None,
        typer.Option(
            help="Runs the notebooks read ($DSPARKLAB_RUNS): a directory or "
            "s3://bucket/prefix; default runs/demo."
        ),
    ] = None,
    shipped: ShippedDir = None,
    notebooks: NotebooksDir = None,
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1; 0 picks a free one.")] = 0,
    open_browser: Annotated[bool, typer.Option(help="Open a web browser.")] = False,
) -> None:
    """Open JupyterLab on the notebooks; Ctrl-C, SIGTERM or SIGHUP stops it and its kernels."""
    from dsparklab.lab.runs import resolve_runs, shipped_traces
    from dsparklab.lab.server import start_lab

    runs_dir = resolve_runs(runs or "")
    if shipped is not None and not shipped.is_dir():
        fail(f"no shipped traces at {shipped}: no such directory")
    if notebooks is not None and not notebooks.is_dir():
        fail(f"no notebooks directory at {notebooks}")
    server = start_lab(
        runs_dir,
        port=port or None,
        root_dir=notebooks,
        shipped=shipped if shipped is not None else shipped_traces(),
        open_browser=open_browser,
    )
    typer.echo(f"JupyterLab on the runs in {runs_dir}:\n  {server.url('lab')}")
    typer.echo(f"(log: {server.log}; Ctrl-C to stop)")
    try:
        with stop_on_signals(signal.SIGTERM, signal.SIGHUP):
            server.process.wait()
    except KeyboardInterrupt:
        typer.echo("stopping JupyterLab")
    finally:
        server.stop()


@contextlib.contextmanager
def stop_on_signals(*signals: signal.Signals) -> Iterator[None]:
    """Within the block, these signals stop the command as Ctrl-C does (KeyboardInterrupt),
    so a service manager's or a closed terminal's stop also stops JupyterLab's process
    group; the previous handlers come back afterwards."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
