"""``antdt up``: the bus and the services, for trying antdt with your own training script.

It starts the embedded broker (or uses ``ANTDT_BOOTSTRAP_SERVERS`` when set),
creates the topics, starts ``antdt monitor``, ``antdt sharder`` and
``antdt controller`` (and what the training mode adds: ``antdt grouper`` for
partial reduce, ``--mode preduce``) as child processes configured exactly as
in a deployment, waits for each one's ``/readyz`` and prints where
everything is.
Then it watches them: Ctrl-C or SIGTERM stops everything cleanly (exit 0),
and a service that dies is reported at once with its log file (exit 1).
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path

import typer

from antdt.errors import AntdtError
from antdt.runtime.shutdown import stop_on_signals
from antdt.training import TrainingMode

SERVICES = ("monitor", "sharder", "controller")
#: torchrun otherwise keeps one store across restarts, and a restarted group finds the last one's
#: addresses there.
TORCHRUN_FIX = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"


def up(
    port: int = typer.Option(
        0, "--port", "-p", min=0, max=65535, help="The embedded broker's port (0: a free one)."
    ),
    policy: str = typer.Option(
        "antdt-nd", "--policy", help="The controller's policy (antdt-nd, antdt-dd, or module:attr)."
    ),
    mode: TrainingMode = typer.Option(
        TrainingMode.SYNC,
        "--mode",
        help="The jobs' training mode: preduce adds the grouper (partial reduce).",
    ),
    ready_within: float = typer.Option(
        60.0, "--ready-within", min=1.0, help="Seconds each service may take to be ready."
    ),
    log_dir: Path | None = typer.Option(
        None,
        "--log-dir",
        file_okay=False,
        help="Where the services' logs go (default: a temporary folder).",
    ),
) -> None:
    """Run the bus and the monitor, sharder and controller until Ctrl-C or SIGTERM."""
    from antdt.demo.environment import bus_and_broker

    logs = log_dir or Path(tempfile.mkdtemp(prefix="antdt-up-"))
    logs.mkdir(parents=True, exist_ok=True)
    with stop_on_signals() as stop, ExitStack() as stack:
        settings, where, broker = stack.enter_context(bus_and_broker(port=port or None))
        typer.echo(f"bus: {where}")
        if broker is not None:
            typer.echo(
                f"export ANTDT_BOOTSTRAP_SERVERS={settings.bootstrap_servers}"
                " ANTDT_BROKER_PROFILE=embedded"
            )
        typer.echo(f"export {TORCHRUN_FIX}  # for torchrun's restarts (docs/torchrun.md)")
        running = _services(stack, settings, policy, mode, logs, ready_within)
        typer.echo(f"logs: {logs}; Ctrl-C stops everything")
        while not stop.wait(0.2):
            _check(running)
        typer.echo("stopping")


def _services(
    stack: ExitStack, settings, policy: str, mode: TrainingMode, logs: Path, ready_within: float
) -> dict:
    from antdt.runtime.launch import service_process

    arguments = {"controller": ["--set", f"policy={policy}"]}
    running = {
        name: stack.enter_context(
            service_process(settings, name, *arguments.get(name, ()), log_dir=logs)
        )
        for name in (*SERVICES, *mode.extra_services)
    }
    for name, service in running.items():
        try:
            service.wait_ready(ready_within)
        except AntdtError:
            raise AntdtError(
                f"{name} was not ready within {ready_within:g} s; its log: {service.log_path}"
            ) from None
        typer.echo(
            f"{name} ready (pid {service.process.pid}, http://127.0.0.1:{service.http_port}/metrics)"
        )
    return running


def _check(running: dict) -> None:
    """A service that exited ends ``antdt up`` with its name, code and log."""
    for name, service in running.items():
        code = service.process.poll()
        if code is not None:
            raise AntdtError(f"{name} exited with code {code}; its log: {service.log_path}")
