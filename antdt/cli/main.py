"""The ``antdt`` command line.

Every expected failure prints one line (``antdt: error: ...``) and exits
non-zero: a bad argument exits 2, a bad setting or an unavailable broker
exits 1. Only bugs keep their traceback.
"""

from __future__ import annotations

import logging
import os
import sys

import typer

# typer >= 0.29 vendors click; its argument errors live here.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from antdt import __version__
from antdt.cli import (
    bench_cmd,
    broker_cmd,
    chaos_cmd,
    check_cmd,
    control_cmd,
    controller_cmd,
    demo_cmd,
    grouper_cmd,
    monitor_cmd,
    probe_cmd,
    ps_cmd,
    sharder_cmd,
    sharder_tools_cmd,
    topics_cmd,
    up_cmd,
    worker_cmd,
)
from antdt.errors import AntdtError

app = typer.Typer(
    name="antdt",
    help="Straggler and leader mitigation for distributed training, on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"antdt {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_show_version,
        is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """Straggler and leader mitigation for distributed training, on Kafka."""


app.command("broker")(broker_cmd.broker)
app.command("up")(up_cmd.up)
app.command("topics")(topics_cmd.topics)
app.command("demo")(demo_cmd.demo)
app.command("bench")(bench_cmd.bench)
app.command("chaos")(chaos_cmd.chaos)
app.command("check")(check_cmd.check)
app.command("sharder")(sharder_cmd.sharder)
app.command("grouper")(grouper_cmd.grouper)
app.command("worker")(worker_cmd.worker)
app.command("monitor")(monitor_cmd.monitor)
app.command("controller")(controller_cmd.controller)
app.command("ps")(ps_cmd.ps)
app.add_typer(control_cmd.app, name="control")
app.command("replay")(sharder_tools_cmd.replay)
app.command("audit")(sharder_tools_cmd.audit)
app.command("probe")(probe_cmd.probe)


def fail(message: str, code: int) -> int:
    """Print a one-line error to stderr and return the exit code."""
    first_line = " ".join(message.strip().split())
    print(f"antdt: error: {first_line}", file=sys.stderr)
    return code


def run(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the exit code."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="antdt", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except typer.Exit as exc:
        code = exc.exit_code
    except NoArgsIsHelpError as exc:
        typer.echo(exc.format_message())
        code = 0
    except UsageError as exc:
        code = fail(f"{exc.format_message()} (see 'antdt --help')", 2)
    except ClickException as exc:
        code = fail(exc.format_message(), 1)
    except (typer.Abort, KeyboardInterrupt):
        code = fail("interrupted", 130)
    except AntdtError as exc:
        code = fail(str(exc), exc.exit_code)
    if argv is None:
        if code:
            _exit_now(code)
        sys.exit(code)
    return code


def _exit_now(code: int) -> None:
    """End a failed process without the interpreter's teardown.

    A command that fails early (the bus refused its credentials) may leave
    Kafka clients whose native threads are still running; tearing the
    interpreter down under them can crash the process (SIGABRT, "corrupted
    double-linked list") after the one-line error was printed, so the exit
    code would lie. Output and logs are flushed first; the clients die with
    the process, as they would have anyway.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
