"""``antdt ps``: run one parameter-server shard until Ctrl-C or SIGTERM."""

from __future__ import annotations

from pathlib import Path

import typer

from antdt.cli import serving
from antdt.settings import load_settings


def ps(
    shard: int = typer.Option(
        0, "--shard", min=0, help="This shard's number (0 asks for the periodic checkpoints)."
    ),
    shards: int = typer.Option(
        1, "--shards", min=1, max=1024, help="How many shards hold the model."
    ),
    port: int = typer.Option(
        9500, "--port", min=0, max=65535, help="Port workers connect to (0: any free one)."
    ),
    checkpoint_dir: Path = typer.Option(
        Path("ps-checkpoints"),
        "--checkpoint-dir",
        file_okay=False,
        help="Where this shard keeps its checkpoints (must survive a restart).",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        file_okay=False,
        help="Write the ledger (ps-<shard>/ledger-epoch<E>.npy) here as epochs end.",
    ),
    lr: float = typer.Option(0.05, "--lr", min=0.0, help="SGD learning rate, applied here."),
    momentum: float = typer.Option(0.0, "--momentum", min=0.0, max=1.0, help="SGD momentum."),
    checkpoint_every: float = typer.Option(
        5.0, "--checkpoint-every", min=0.1, help="Seconds between checkpoints."
    ),
    max_staleness: int | None = typer.Option(
        None,
        "--max-staleness",
        min=0,
        help="Refuse a gradient computed more than N updates ago (default: none).",
    ),
    http_port: int = typer.Option(
        9405,
        "--http-port",
        min=0,
        max=65535,
        help="Port for /healthz, /readyz, /metrics (0: none).",
    ),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Serve one shard of a job's model to asynchronous workers (ANTDT_JOB_ID names the job).

    ANTDT_WORKER_ID, if set, is the name the shard reports under and obeys commands as (default
    ps-<shard>).
    """
    from antdt.worker.ps.server import ServerSpec

    if shard >= shards:
        raise typer.BadParameter(
            f"shard {shard} of {shards}: shards are numbered from 0", param_hint="'--shard'"
        )
    serving.configure_logging(log_level)
    settings = load_settings()
    spec = ServerSpec(
        job_id=settings.job_id,
        checkpoint_dir=checkpoint_dir,
        shard=shard,
        shards=shards,
        port=port,
        out_dir=out,
        lr=lr,
        momentum=momentum,
        checkpoint_every_s=checkpoint_every,
        max_staleness=max_staleness,
        agent_id=settings.worker_id,
    )
    serve(settings, spec, http_port)


def serve(settings, spec, http_port: int) -> None:
    """Run the shard until a signal, started as every service is (:func:`antdt.cli.serving.serve`:
    the health endpoint, a look at the bus, then the shard); a RESTART or EVICT for it ends the
    process with the agent's exit code."""
    from antdt.worker.ps.server import ParameterServer

    def banner(server: ParameterServer) -> str:
        return (
            f"parameter server {spec.name} of job {spec.job_id} on port {server.port} "
            f"({spec.shards} shard(s), checkpoints in {spec.checkpoint_dir})"
        )

    serving.serve(settings, lambda: ParameterServer(settings, spec), http_port, banner)
