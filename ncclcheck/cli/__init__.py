"""The command line: typer commands that parse options, call the core, pick a renderer.

``ErrorMappingGroup`` is the one place where errors become exit codes
(docs/contract.md): a NcclcheckError prints its message and hint and exits with its
code; a stop signal exits with the code a shell gives a process that signal ended
(130, 143, 129); anything else is a bug (exit 3), with a traceback only under ``--debug``.
"""

# ruff: noqa: E402 (a stop is listened for before the heavy imports: see listen_early)
from __future__ import annotations

import sys

from ncclcheck.launch.stop import Stopped, listen_early, stopped_exit_code

listen_early(sys.argv)  # before the heavy imports below: a stop then is an incomplete run

import importlib
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from ncclcheck import __version__
from ncclcheck.cli.common import STATE
from ncclcheck.errors import InternalError, NcclcheckError
from ncclcheck.render.console import silence_stdout

# Recent typer releases carry their own copy of click; older ones use click itself.
# Either way usage errors derive from one base, and click already maps them to 2.
_PassThrough: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort)
if hasattr(typer, "TyperException"):
    _PassThrough += (typer.TyperException,)
else:  # pragma: no cover - older typer
    import click

    _PassThrough += (click.ClickException,)


# The commands, in the order --help lists them, each in the module ncclcheck.cli.<name>
# that registers it. A command's module is imported only when that command runs (or
# --help lists them all): each pulls in its own share of the package (preflight's
# launchers and recorder, doctor's evidence readers, lint's source reading), and a call
# to one paid for all of them (0.6 s of CPU for `ncclcheck --help`).
COMMANDS = ("preflight", "doctor", "watch", "lint", "probe", "playbooks")


class ErrorMappingGroup(TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, name: str) -> Any:
        if name in COMMANDS and name not in self.commands:
            self.commands[name] = _load_command(name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _PassThrough:
            raise
        except NcclcheckError as exc:
            raise typer.Exit(report_error(exc)) from None
        except BrokenPipeError:  # the reader of stdout left (`| head`) before the command ended
            silence_stdout()
            raise typer.Exit(0) from None
        except KeyboardInterrupt:
            typer.echo("ncclcheck: interrupted", err=True)
            raise typer.Exit(130) from None
        except Stopped as stop:  # what the command started is ended already (STOP.listening)
            typer.echo(f"ncclcheck: stopped by {stop}", err=True)
            raise typer.Exit(stopped_exit_code(stop.signum)) from None
        except Exception as exc:  # a bug: say so, and where to report it
            if STATE.debug:
                traceback.print_exc()
            error = InternalError(f"internal error: {type(exc).__name__}: {exc}")
            raise typer.Exit(report_error(error)) from None


def report_error(exc: NcclcheckError) -> int:
    if STATE.debug and exc.__traceback__ is not None and not isinstance(exc, InternalError):
        traceback.print_exception(exc)
    typer.echo(f"ncclcheck: error: {exc}", err=True)
    if exc.hint:
        typer.echo(f"  {exc.hint}", err=True)
    return exc.exit_code


app = typer.Typer(
    name="ncclcheck",
    cls=ErrorMappingGroup,
    help="Find the collective that not every rank reaches, before or while a job hangs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain usage errors: one or two lines, no boxes
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ncclcheck {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks for errors."),
) -> None:
    STATE.debug = debug


def _load_command(name: str) -> Any:
    """The click command that ncclcheck.cli.<name> registers, built as typer builds it."""
    module = importlib.import_module(f"ncclcheck.cli.{name}")
    holder = typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=False)
    module.register(holder)
    return typer.main.get_command(holder)


def main() -> None:
    """Entry point of the ``ncclcheck`` script and ``python -m ncclcheck``."""
    app(prog_name="ncclcheck")
