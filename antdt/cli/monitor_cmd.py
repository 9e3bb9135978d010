"""``antdt monitor``: run the straggler and leader monitor (a Faust worker) until Ctrl-C or
SIGTERM."""

from __future__ import annotations

import logging
import os
import sys
from functools import partial

import typer

from antdt.bus.config import describe_profile
from antdt.bus.watch import shared_watch
from antdt.cli.serving import built_after_a_look
from antdt.control.topic import parse_assignments
from antdt.errors import ConfigError
from antdt.services.monitor.detection import DetectorConfig
from antdt.settings import load_settings

#: Bus resets handled by earlier images of this process (not a setting: set by the restart itself).
RESETS_ENV = "_ANTDT_MONITOR_BUS_RESETS"


def monitor(
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="Detector default KEY=VALUE (e.g. straggler_ratio=1.4, window_s=20); repeatable. "
        "Run-time changes come from the control topic as monitor.KEY.",
    ),
    batch: int = typer.Option(2000, min=1, help="Most reports processed as one batch."),
    http_port: int = typer.Option(
        9403, min=0, max=65535, help="Port for /healthz, /readyz, /metrics (0: none)."
    ),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Detect and classify stragglers and leaders from worker metrics; publish verdicts."""
    try:
        defaults = DetectorConfig().with_changes(parse_assignments(set_))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--set") from None
    # Imported here, not at the top: every command shares one process registry, and a
    # service's /metrics must show its own metrics only; and Faust (a third of a second to
    # import) is for the monitor only, not for every antdt command.
    from mode import Worker

    from antdt.bus.faust_app import describe_faust
    from antdt.bus.faust_tuning import tune_gc_for_streaming
    from antdt.services.monitor import metrics
    from antdt.services.monitor.app import MonitorConfig, MonitorService

    metrics.BUS_RESETS.inc(int(os.environ.get(RESETS_ENV, "0")))
    settings = load_settings()
    config = MonitorConfig(batch_max=batch)
    build = partial(MonitorService, settings, defaults, config)
    with built_after_a_look(settings, build, http_port) as service:
        watch = None
        try:
            service.start()
            watch = shared_watch(settings, look_now=True)
            watch.on_reset(restart_in_place)
            typer.echo(
                f"monitor serving on {settings.bootstrap_servers} (prefix {settings.topic_prefix})"
            )
            typer.echo(describe_profile(settings))
            typer.echo(describe_faust(service.app))
            worker = Worker(service.app, loglevel=log_level.lower(), redirect_stdouts=False)
            tune_gc_for_streaming()
            try:
                worker.execute_from_commandline()
            except SystemExit:
                pass
            logging.getLogger(__name__).info("monitor stopped")
        finally:
            if watch is not None:
                watch.release()
            service.close()


def restart_in_place() -> None:
    """After a bus reset, start this process over (same pid, same arguments), as
    docs/embedded-broker.md advises for Faust.

    A Faust worker does not come back from a broker that forgot its groups,
    offsets and changelog topics; its tables held only recent windows, which
    the next reports fill again. The watch has re-created the topics already.
    """
    log = logging.getLogger(__name__)
    log.warning("the bus was reset: restarting the monitor in place")
    logging.shutdown()
    # the count survives the exec
    os.environ[RESETS_ENV] = str(int(os.environ.get(RESETS_ENV, "0")) + 1)
    try:
        os.execv(sys.executable, sys.orig_argv)
    except OSError as exc:
        print(
            (
                f"antdt monitor: cannot restart after a bus reset ({exc}); "
                "exiting for the orchestrator to restart it"
            ),
            file=sys.stderr,
        )
        os._exit(70)
