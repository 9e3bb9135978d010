"""``antdt worker``: run the example training job with the agent."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from antdt.bus.config import describe_profile
from antdt.settings import load_settings


def worker(
    job: str = typer.Option(None, help="Job id (default ANTDT_JOB_ID)."),
    worker_id: str = typer.Option(
        None, "--worker-id", help="Worker id (default ANTDT_WORKER_ID, or rank-<RANK>)."
    ),
    samples: int = typer.Option(8192, min=1, help="Dataset size."),
    shard_size: int = typer.Option(128, min=1, help="Samples per shard."),
    epochs: int = typer.Option(2, min=1),
    batch_size: int = typer.Option(
        32, min=1, help="Initial local batch size (the controller may change it)."
    ),
    step_sleep_ms: float = typer.Option(0.0, min=0, help="Calibrated sleep added to every step."),
    slowdown: str = typer.Option(
        None,
        help="Straggler injection: a factor (3.0) or episodes 'start-end:factor,...' in seconds.",
    ),
    slowdown_mode: str = typer.Option("sleep", help="sleep, or cpu (busy competitor processes)."),
    checkpoint: Path = typer.Option(
        None, help="Checkpoint file: saved on RESTART, restored at start if present."
    ),
    ps: str = typer.Option(
        None,
        "--ps",
        help="Parameter-server shards HOST:PORT,... (in shard order): share one model.",
    ),
    log_level: str = typer.Option("WARNING"),
) -> None:
    """Train a small real model on synthetic data through the agent and the sharder."""
    from antdt.worker.agent import Agent, WorkerExit
    from antdt.worker.example import ExampleConfig, train
    from antdt.worker.injection import parse_mode, parse_slowdown

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        if slowdown:
            parse_slowdown(slowdown)
        parse_mode(slowdown_mode)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    overrides = {"slowdown": slowdown, "slowdown_mode": slowdown_mode} if slowdown else {}
    settings = load_settings(**overrides)
    config = ExampleConfig(
        samples=samples,
        shard_size=shard_size,
        epochs=epochs,
        batch_size=batch_size,
        step_sleep_s=step_sleep_ms / 1000,
        checkpoint=checkpoint,
        parameter_servers=tuple(a.strip() for a in ps.split(",") if a.strip()) if ps else (),
    )
    typer.echo(describe_profile(settings))
    try:
        with Agent(job, worker_id, settings=settings, batch_size=batch_size) as agent:
            summary = train(agent, config, report=typer.echo)
    except WorkerExit as exc:
        typer.echo(f"exiting with code {exc.code}: {exc.reason}")
        raise typer.Exit(exc.code) from None
    typer.echo(
        f"trained {summary['samples']} samples in {summary['seconds']:.1f} s "
        f"({summary['samples_per_s']:.0f}/s); "
        f"held-out loss {summary['heldout_loss']:.3f}, accuracy {summary['heldout_accuracy']:.3f}"
    )
