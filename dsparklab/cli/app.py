"""`dsparklab`: each command parses options, calls one library function, prints a summary.

Every command is registered here, and only here: the command modules define plain
functions (and ``zoo`` its sub-command group) and never import this module, so
``python -m dsparklab``, ``python -m dsparklab.cli.app`` and the ``dsparklab`` script all
see the same commands. Errors of dsparklab's own (bad input), and a path a command cannot
read or write, print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from dsparklab.cli import collect, count, demo, importers, lab, report, serve, validate, zoo
from dsparklab.errors import DSparkLabError

app = typer.Typer(
    name="dsparklab",
    help="Per-position traces of DSpark and Eagle3 speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    """Per-position traces of DSpark and Eagle3 speculative decoding."""


app.command()(validate.validate)
app.command()(validate.migrate)
app.command()(validate.compact)
app.command()(count.count)
app.command(name="replay-config")(count.replay_config)
app.command()(count.schedule)
app.command()(collect.collect)
app.command(context_settings=serve.SERVE_CONTEXT)(serve.serve)
app.command(name="import")(importers.import_command)
app.command()(importers.watch)
app.command()(report.report)
app.command()(report.compare)
app.command()(lab.lab)
app.command()(demo.demo)
app.add_typer(zoo.zoo_app, name="zoo")


def main() -> None:
    try:
        app()
    except DSparkLabError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except OSError as err:
        if err.filename is None:  # not a path the user named (a socket, a pipe): a bug
            raise
        # a path the command cannot read or write (--out under a file, no permission)
        typer.echo(f"error: {err.filename}: {err.strerror or err}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
