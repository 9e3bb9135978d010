"""``antdt up``: the bus and the services, for trying antdt with your own training script.

It starts the embedded broker (or uses ``ANTDT_BOOTSTRAP_SERVERS`` when set),
creates the topics, starts ``antdt monitor``, ``antdt sharder`` and
``antdt controller`` (and what the training mode adds: ``antdt grouper`` for
partial reduce, ``--mode preduce``; the job's parameter-server shards,
``antdt ps``, for asynchronous training, ``--mode async``) as child
processes configured exactly as in a deployment, waits for each one's
``/readyz`` and prints where everything is.
Then it watches them: Ctrl-C or SIGTERM stops everything cleanly (exit 0),
and a service that dies is reported at once with its log file (exit 1).
On the embedded broker, whose log only grows, it rolls the broker once it
holds ``--roll-at-mb`` (:mod:`antdt.embedded.roll`).
"""

from __future__ import annotations

import re
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import typer

from antdt.errors import AntdtError
from antdt.runtime.shutdown import stop_on_signals
from antdt.settings import NAME_PATTERN
from antdt.training import TrainingMode

SERVICES = ("monitor", "sharder", "controller")
#: torchrun otherwise keeps one store across restarts, and a restarted group finds the last one's
#: addresses there.
TORCHRUN_FIX = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
#: The embedded broker's memory at which ``antdt up`` rolls it: at 100 MB the soak's grant p50
#: stays flat on 2 cores (its p99 verdict passed in one run of two), at 256 MB its grant p99
#: doubles between rolls (docs/reliability.md, "Soak").
ROLL_AT_MB = 100.0


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
        help="The jobs' training mode: preduce adds the grouper (partial reduce), async the job's "
        "parameter servers.",
    ),
    job: str | None = typer.Option(
        None, "--job", help="async: the job the parameter servers serve (default ANTDT_JOB_ID)."
    ),
    ps_shards: int | None = typer.Option(
        None, "--ps-shards", min=1, max=64, help="async: how many parameter-server shards (1)."
    ),
    ps_lr: float | None = typer.Option(
        None, "--ps-lr", min=0.0, help="async: the servers' SGD learning rate (antdt ps's, 0.05)."
    ),
    ps_momentum: float | None = typer.Option(
        None, "--ps-momentum", min=0.0, max=1.0, help="async: the servers' SGD momentum (0)."
    ),
    ready_within: float = typer.Option(
        60.0, "--ready-within", min=1.0, help="Seconds each service may take to be ready."
    ),
    roll_at_mb: float = typer.Option(
        ROLL_AT_MB,
        "--roll-at-mb",
        min=0.0,
        help="Embedded broker: start it again, empty, once it holds this many MB (0: never; "
        "antdt.embedded.roll).",
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

    job = _job_name(job)
    servers_asked = any(option is not None for option in (job, ps_shards, ps_lr, ps_momentum))
    if servers_asked and mode is not TrainingMode.ASYNC:
        raise typer.BadParameter(
            "--job and --ps-* configure the parameter servers of --mode async",
            param_hint="'--mode'",
        )
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
        if mode is TrainingMode.ASYNC:
            served = job or settings.job_id
            servers = ParameterServers(served, ps_shards or 1, ps_lr, ps_momentum)
            running |= servers.start(stack, settings, logs, ready_within)
        roll = _roll(broker, settings, roll_at_mb)
        typer.echo(f"logs: {logs}; Ctrl-C stops everything")
        while not stop.wait(0.2):
            _check(running)
            rolled = roll.check() if roll is not None else None
            if rolled:
                typer.echo(rolled)
        typer.echo("stopping")


def _roll(broker, settings, bound_mb: float):
    """The managed roll of the embedded broker's log, or None (an external bus, or 0)."""
    from antdt.bus.admin import ensure_topics
    from antdt.bus.clients import make_admin
    from antdt.embedded.roll import BrokerRoll

    if broker is None or bound_mb == 0:
        return None
    typer.echo(f"the embedded broker is rolled at {bound_mb:g} MB (--roll-at-mb)")
    return BrokerRoll(broker, bound_mb, lambda: ensure_topics(make_admin(settings), settings))


def _job_name(job: str | None) -> str | None:
    if job is not None and not re.fullmatch(NAME_PATTERN, job):
        raise typer.BadParameter(
            f"{job!r} is not a job name ({NAME_PATTERN})", param_hint="'--job'"
        )
    return job


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
    _wait_ready(running, ready_within)
    return running


def _wait_ready(running: dict, ready_within: float) -> None:
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


@dataclass(frozen=True)
class ParameterServers:
    """One job's parameter-server shards (``antdt ps``), as ``--mode async`` starts them: their
    checkpoints and the ledger they write under the log folder; SGD as ``antdt ps`` has it unless
    given."""

    job: str
    shards: int
    lr: float | None
    momentum: float | None

    def start(self, stack: ExitStack, settings, logs: Path, ready_within: float) -> dict:
        from antdt.embedded.broker import free_port
        from antdt.runtime.launch import service_process

        served = settings.model_copy(update={"job_id": self.job})
        ports = [free_port() for _ in range(self.shards)]
        running = {
            f"ps-{shard}": stack.enter_context(
                service_process(served, "ps", *self._arguments(shard, port, logs), log_dir=logs)
            )
            for shard, port in enumerate(ports)
        }
        _wait_ready(running, ready_within)
        addresses = ",".join(f"127.0.0.1:{port}" for port in ports)
        typer.echo(f"export ANTDT_JOB_ID={self.job} ANTDT_PS_SERVERS={addresses}")
        typer.echo(f"ledger: {logs / 'ledger'} (ps-<shard>/ledger-epoch<E>.npy)")
        return running

    def _arguments(self, shard: int, port: int, logs: Path) -> list[str]:
        return [
            *("--shard", str(shard), "--shards", str(self.shards), "--port", str(port)),
            *("--checkpoint-dir", str(logs / "ps-checkpoints")),
            *("--out", str(logs / "ledger")),
            *(("--lr", str(self.lr)) if self.lr is not None else ()),
            *(("--momentum", str(self.momentum)) if self.momentum is not None else ()),
        ]


def _check(running: dict) -> None:
    """A service that exited ends ``antdt up`` with its name, code and log."""
    for name, service in running.items():
        code = service.process.poll()
        if code is not None:
            raise AntdtError(f"{name} exited with code {code}; its log: {service.log_path}")
