"""`dsparklab lab`: JupyterLab on notebooks/, loopback only, with a token, runs selected."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def lab(
    runs: Annotated[
        Path | None,
        typer.Option(help="Runs the notebooks read ($DSPARKLAB_RUNS); default runs/demo."),
    ] = None,
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1; 0 picks a free one.")] = 0,
    open_browser: Annotated[bool, typer.Option(help="Open a web browser.")] = False,
) -> None:
    """Open JupyterLab on the notebooks; Ctrl-C stops it and its kernels."""
    from dsparklab.notebook import resolve_runs
    from dsparklab.report.lab import start_lab

    runs_dir = resolve_runs(runs or "")
    server = start_lab(runs_dir, port=port or None, open_browser=open_browser)
    typer.echo(f"JupyterLab on the runs in {runs_dir}:\n  {server.url('lab')}")
    typer.echo(f"(log: {server.log}; Ctrl-C to stop)")
    try:
        server.process.wait()
    except KeyboardInterrupt:
        typer.echo("stopping JupyterLab")
    finally:
        server.stop()
