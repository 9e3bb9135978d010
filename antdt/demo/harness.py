"""Running a scenario end to end: the services, the worker processes, the start signal, the result.

One :func:`run_plan` call is one measured run. It starts what the plan needs
as child processes (:mod:`antdt.demo.services`: the monitor always, the
sharder for dynamic sharding, the controller when a policy is on, the
parameter-server shards for asynchronous training), waits until each answers
``/readyz``, starts one worker process per scenario worker
(:mod:`antdt.demo.pool`), waits until every worker is ready, then gives the
start signal and takes the time (the files of :mod:`antdt.demo.handshake`).
The run ends when every worker has written its finish time; its wall time is
the latest one. Everything started is stopped on the way out, Ctrl-C included.

The result carries what a user asks of a training run: the time against the
ideal, the shared model's held-out loss and accuracy (over time and at the
end, :mod:`antdt.demo.evaluation`), the shard log's audit, and the model's
own ledger compared with it (:mod:`antdt.worker.ledger`).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from antdt.demo.chaos import Chaos, Injection
from antdt.demo.evaluation import Evaluator, from_file, from_servers
from antdt.demo.handshake import READY_WITHIN_S, done_file, give_start, ready_file
from antdt.demo.phases import read_phase
from antdt.demo.placement import Move, Placement
from antdt.demo.plans import RunPlan
from antdt.demo.pool import WorkerPool
from antdt.demo.scenario import Scenario
from antdt.demo.services import Services, server_addresses, wanted_services
from antdt.demo.stall import describe_stall
from antdt.demo.steptrace import read_trace, trace_path
from antdt.demo.timeline import Timeline
from antdt.demo.trainer import LR
from antdt.errors import AntdtError
from antdt.services.sharder.audit import LedgerCheck, check_ledgers
from antdt.settings import Settings
from antdt.training import TrainingMode
from antdt.worker.ledger import FILE_PATTERN


@dataclass
class RunResult:
    """One run's outcome: the figures the demo summary and the benchmark report."""

    plan: RunPlan
    scenario: Scenario
    job_id: str
    wall_s: float
    ideal_s: float
    samples: int
    # workers started again (a RESTART, an EVICT, a chaos kill), and servers the controller replaced
    restarts: int
    timeline: Timeline
    audit: dict | None = None  # the sharder log's audit, None without a sharder
    # what a chaos run killed, and when each came back
    kills: list[Injection] = field(default_factory=list)
    ledger: LedgerCheck = field(default_factory=LedgerCheck)
    heldout: tuple[float, float] | None = None  # (loss, accuracy) of the final model
    # (s, loss, accuracy)
    loss_curve: list[tuple[float, float, float]] = field(default_factory=list)
    # services that died by themselves (restarted)
    service_exits: list[tuple[str, int]] = field(default_factory=list)
    # sync: (full-batch steps trained, the loss)
    loss_per_step: list[tuple[int, float]] = field(default_factory=list)
    # where the orchestrator placed replaced processes, and why
    moves: list[Move] = field(default_factory=list)
    # partial reduce: the groups the grouper formed, read back from the bus
    groups: dict | None = None

    @property
    def efficiency(self) -> float:
        return self.ideal_s / self.wall_s if self.wall_s else 0.0

    @property
    def audit_ok(self) -> bool | None:
        return None if self.audit is None else bool(self.audit["ok"] and self.audit["finished"])

    @property
    def commands(self) -> int:
        return len(self.timeline.commands)

    def speedup_over(self, baseline: RunResult | None) -> float | None:
        return None if baseline is None else baseline.wall_s / self.wall_s


def run_plan(
    scenario: Scenario,
    plan: RunPlan,
    settings: Settings,
    run_dir: Path,
    *,
    on_tick: Callable[[Timeline, float], None] | None = None,
    tick_s: float = 0.25,
    timeout_s: float | None = None,
    chaos: Chaos | None = None,
) -> RunResult:
    """Run ``scenario`` under ``plan`` on the bus ``settings`` point at; files go under
    ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    job_id = f"{scenario.name}-{plan.name}-{uuid.uuid4().hex[:6]}"
    settings = settings.model_copy(
        update={
            "job_id": job_id,
            "report_interval_s": scenario.report_interval_s,
            "signing_key": settings.signing_key or secrets.token_hex(16),
        }
    )
    scenario_path = run_dir / f"scenario-{plan.name}.json"
    scenario_path.write_text(scenario.model_dump_json(indent=2))
    names = [w.name for w in scenario.workers]
    ideal = scenario.ideal_time_s()
    timeout_s = timeout_s or 60 + 8 * ideal * max(
        1.0, len(names) * min(w.speed for w in scenario.workers)
    )
    with ExitStack() as stack:
        handshake = run_dir / f"handshake-{job_id}"
        handshake.mkdir()
        timeline = stack.enter_context(Timeline(settings, job_id, names))
        placement = Placement(scenario, on_move=timeline.add_move)
        wanted = wanted_services(plan, scenario, run_dir, LR, scenario_path, handshake)
        services = Services(stack, settings, run_dir / "logs", placement, timeline.now).start(
            wanted
        )
        servers = server_addresses(wanted)
        pool = WorkerPool(
            scenario_path,
            scenario,
            plan,
            handshake,
            settings,
            run_dir,
            servers,
            restart_failed=chaos is not None,
            placement=placement,
            clock=timeline.now,
        ).start()
        stack.callback(pool.close)
        if chaos is not None:  # first: a stopped rank must be able to take its SIGTERM
            stack.callback(chaos.release_all)
        _wait_for(
            lambda: all(ready_file(handshake, r).exists() for r in range(len(names))),
            pool,
            READY_WITHIN_S,
            "workers ready",
        )
        start = time.time()
        timeline.set_start(start)
        give_start(handshake, start)
        evaluator = Evaluator(
            scenario,
            from_servers(servers) if servers else from_file(run_dir / "model-latest.pt"),
            clock=lambda: time.time() - start,
        ).start()
        deadline = time.monotonic() + timeout_s
        while not pool.all_finished:
            for node in timeline.degraded():
                placement.mark_degraded(node)
            pool.supervise()
            services.supervise(restart=chaos is not None)
            if chaos is not None:
                chaos.tick(time.time() - start, pool, services, timeline)
            if on_tick is not None:
                on_tick(timeline, time.time() - start)
            if time.monotonic() > deadline:
                phases = {name: read_phase(handshake, rank).name for rank, name in enumerate(names)}
                stalled = describe_stall(settings, job_id, run_dir, phases, services.counters())
                raise AntdtError(
                    f"the run did not finish within {timeout_s:.0f} s (ideal {ideal:.0f} s): "
                    f"{stalled}; workers' phases {phases}; {run_dir / 'stall.json'}, "
                    f"logs in {run_dir / 'logs'}"
                )
            time.sleep(tick_s)
        if chaos is not None:
            chaos.settle(lambda: time.time() - start, pool, services, timeline)
        results = [json.loads(done_file(handshake, r).read_text()) for r in range(len(names))]
        wall = max(r["finished_s"] for r in results)
        samples = sum(r["samples"] for r in results)
        heldout = evaluator.final(None if servers else from_file(run_dir / "model-final.pt"))
        if servers:
            _wait_for_ledgers(run_dir, scenario, pool)
        _settle(timeline, samples)
        if on_tick is not None:
            on_tick(timeline, wall)
    report = _audit(settings, job_id, run_dir) if plan.uses_sharder else None
    groups = _groups(settings, job_id) if plan.training is TrainingMode.PREDUCE else None
    server_restarts = sum(1 for move in placement.moves if move.process in scenario.server_names)
    return RunResult(
        plan,
        scenario,
        job_id,
        wall,
        ideal,
        samples,
        pool.restarts + server_restarts,
        timeline,
        None if report is None else report.to_dict(),
        chaos.kills if chaos is not None else [],
        check_ledgers(run_dir, report),
        heldout,
        evaluator.curve,
        services.exits,
        loss_per_step(run_dir, scenario) if plan.training is TrainingMode.SYNC else [],
        list(placement.moves),
        groups,
    )


def loss_per_step(run_dir: Path, scenario: Scenario) -> list[tuple[int, float]]:
    """Rank 0's trace of the global batch's loss, by samples trained in units of the full global
    batch.

    Counting full-batch steps rather than steps keeps two plans comparable
    where one takes a few short or empty steps (an epoch's end); a restarted
    generation's steps replace the ones the group lost.
    """
    path = trace_path(run_dir, scenario.workers[0].name)
    if not path.exists():
        return []
    by_step = {
        int(row["step"]): (int(row["global_batch"]), row["loss"]) for row in read_trace(path)
    }
    full, trained, curve = scenario.batch_size * len(scenario.workers), 0, {}
    for _, (global_batch, loss) in sorted(by_step.items()):
        trained += global_batch
        if loss is not None:
            curve[round(trained / full)] = loss
    return sorted(curve.items())


def _wait_for(condition: Callable[[], bool], pool: WorkerPool, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        pool.supervise()
        if time.monotonic() > deadline:
            raise AntdtError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)


def _wait_for_ledgers(
    run_dir: Path, scenario: Scenario, pool: WorkerPool, timeout_s: float = 30.0
) -> None:
    """The parameter servers write the last epoch's ledger when they read its close in the log."""
    last = FILE_PATTERN.format(epoch=scenario.epochs - 1)
    _wait_for(
        lambda: all(
            (run_dir / f"ps-{k}" / last).exists() for k in range(scenario.parameter_servers)
        ),
        pool,
        timeout_s,
        "the parameter servers' ledgers",
    )


def _settle(timeline: Timeline, samples: int, timeout_s: float = 10.0) -> None:
    """Wait until the timeline has read the workers' last reports (they count every trained
    sample)."""
    deadline = time.monotonic() + timeout_s
    while timeline.samples < samples and time.monotonic() < deadline:
        time.sleep(0.05)


def _groups(settings: Settings, job_id: str) -> dict:
    """What the bus says about the run's partial-reduce groups
    (:mod:`antdt.services.grouper.history`)."""
    from antdt.schemas.codec import make_codec
    from antdt.services.grouper.history import read_copies, summary

    return summary(read_copies(settings, make_codec(settings.schema_registry_url), job_id))


def _audit(settings: Settings, job_id: str, run_dir: Path):
    """The audit of the job's log; the log itself is kept beside the ledger (``shard-log.avro``),
    for later audits."""
    from antdt.schemas.codec import make_codec
    from antdt.services.sharder.replay import audit_job, export_avro, replay_events

    codec = make_codec(settings.schema_registry_url)
    events = [event for _, _, event in replay_events(settings, job_id, codec)]
    export_avro(events, run_dir / "shard-log.avro")
    return audit_job(settings, job_id, events, codec)
