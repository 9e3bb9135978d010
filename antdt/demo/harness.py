"""Running a scenario end to end: the services, the worker processes, the start signal, the result.

One :func:`run_plan` call is one measured run. It starts what the plan needs
as child processes (the sharder for dynamic sharding, the monitor always,
the controller when a policy is on), waits until each answers ``/readyz``,
starts one worker process per scenario worker, waits until every worker is
ready, then gives the start signal and takes the time (the files of
:mod:`antdt.demo.handshake`). The run ends when
every worker has written its finish time; its wall time is the latest one.
Everything started is stopped on the way out, Ctrl-C included.

Plans (``antdt bench`` runs all four; ``antdt demo`` one of the last three):

| plan | training | sharding | policy |
|---|---|---|---|
| ``static-bsp`` | synchronous (BSP) | static slices | none: the baseline |
| ``dynamic`` | independent (ND) | dynamic shards | none |
| ``nd`` | independent (ND) | dynamic shards | AntDT-ND |
| ``dd`` | synchronous (DD) | dynamic shards | AntDT-DD |
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from antdt.demo.chaos import Chaos, Kill
from antdt.demo.handshake import done_file, give_start, ready_file
from antdt.demo.scenario import ClusterMode, Scenario
from antdt.demo.timeline import Timeline
from antdt.errors import AntdtError, ConfigError
from antdt.launch import ServiceProcess, service_process, settings_env
from antdt.settings import Settings
from antdt.worker.agent import EXIT_RESTART


@dataclass(frozen=True)
class RunPlan:
    """How a run trains and which antdt parts are on."""

    name: str
    training: str  # "async" or "sync"
    sharding: str  # "dynamic" or "static"
    policy: str | None  # a controller policy, or None for no controller

    @property
    def label(self) -> str:
        return {"static-bsp": "static sharding, BSP (baseline)", "dynamic": "dynamic sharding only",
                "nd": "antdt, AntDT-ND", "dd": "antdt, AntDT-DD"}.get(self.name, self.name)


PLANS = {
    "static-bsp": RunPlan("static-bsp", "sync", "static", None),
    "dynamic": RunPlan("dynamic", "async", "dynamic", None),
    "nd": RunPlan("nd", "async", "dynamic", "antdt-nd"),
    "dd": RunPlan("dd", "sync", "dynamic", "antdt-dd"),
}
POLICIES = ("nd", "dd", "off")


def demo_plan(scenario: Scenario, policy: str | None) -> RunPlan:
    """The demo's plan: the scenario's cluster mode, with ``policy`` (default: the mode's own) or none."""
    training = "async" if scenario.mode is ClusterMode.ND else "sync"
    chosen = policy or scenario.mode.value
    if chosen not in POLICIES:
        raise ConfigError(f"policy {chosen!r}: choose one of {', '.join(POLICIES)}")
    if chosen == "off":
        return RunPlan("dynamic" if training == "async" else "sync-dynamic", training, "dynamic", None)
    return RunPlan(chosen if PLANS[chosen].training == training else f"{chosen}-on-{scenario.mode.value}",
                   training, "dynamic", f"antdt-{chosen}")


@dataclass
class RunResult:
    """One run's outcome: the figures the demo summary and the benchmark report."""

    plan: RunPlan
    scenario: Scenario
    job_id: str
    wall_s: float
    ideal_s: float
    samples: int
    restarts: int
    timeline: Timeline
    audit: dict | None = None  # the sharder log's audit (dynamic sharding), None without a sharder
    kills: list[Kill] = field(default_factory=list)  # what a chaos run killed, and when each came back

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


class WorkerPool:
    """The worker processes of one run.

    A worker that exits with EXIT_RESTART is started again (async only). With
    ``restart_failed`` (chaos runs), so is one that died any other way, as
    an orchestrator's restart policy would; otherwise a failure ends the run.
    """

    def __init__(self, scenario_path: Path, scenario: Scenario, plan: RunPlan, handshake: Path, settings: Settings,
                 log_dir: Path, restart_failed: bool = False):
        self.scenario_path, self.scenario, self.plan = scenario_path, scenario, plan
        self.handshake, self.settings, self.log_dir = handshake, settings, log_dir
        self.restart_failed = restart_failed
        self.processes: dict[int, subprocess.Popen] = {}
        self.finished: set[int] = set()
        self.restarts = 0

    def start(self) -> WorkerPool:
        for rank in range(len(self.scenario.workers)):
            self._launch(rank)
        return self

    def _launch(self, rank: int) -> None:
        worker = self.scenario.workers[rank]
        env = {**os.environ, **settings_env(self.settings), "PYTHONUNBUFFERED": "1",
               "ANTDT_WORKER_ID": worker.name, "ANTDT_NODE_ID": f"node-{worker.name}", "OMP_NUM_THREADS": "1"}
        argv = [sys.executable, "-m", "antdt.demo.trainer", "--scenario", str(self.scenario_path), "--rank", str(rank),
                "--training", self.plan.training, "--sharding", self.plan.sharding, "--handshake", str(self.handshake)]
        with (self.log_dir / f"worker-{worker.name}.log").open("a") as log:
            self.processes[rank] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL)

    def log_tail(self, rank: int, chars: int = 3000) -> str:
        path = self.log_dir / f"worker-{self.scenario.workers[rank].name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def supervise(self) -> None:
        """Restart what asked to be restarted; raise on a worker that failed."""
        for rank, process in list(self.processes.items()):
            code = process.poll()
            if code is None or rank in self.finished:
                continue
            name = self.scenario.workers[rank].name
            if code == 0:
                self.finished.add(rank)
            elif (code == EXIT_RESTART and self.plan.training == "async") or self.restart_failed:
                self.restarts += 1
                self._launch(rank)
            else:
                raise AntdtError(f"worker {name} exited with code {code}; its log ends:\n{self.log_tail(rank)}")

    def running(self) -> list[int]:
        """Ranks whose process is alive and not finished."""
        return [rank for rank, p in self.processes.items() if p.poll() is None and rank not in self.finished]

    def kill(self, rank: int) -> None:
        """SIGKILL: no clean-up, no last report, shards left held (chaos)."""
        self.processes[rank].kill()
        self.processes[rank].wait()

    @property
    def all_finished(self) -> bool:
        return len(self.finished) == len(self.scenario.workers)

    def close(self, grace_s: float = 5.0) -> None:
        running = [p for p in self.processes.values() if p.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _set_args(values: dict[str, str]) -> list[str]:
    """``--set KEY=VALUE`` for each setting (the monitor's and controller's start-up defaults)."""
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def run_plan(
    scenario: Scenario, plan: RunPlan, settings: Settings, run_dir: Path, *,
    on_tick: Callable[[Timeline, float], None] | None = None, tick_s: float = 0.25, timeout_s: float | None = None,
    chaos: Chaos | None = None,
) -> RunResult:
    """Run ``scenario`` under ``plan`` on the bus ``settings`` point at; files go under ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = run_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    job_id = f"{scenario.name}-{plan.name}-{uuid.uuid4().hex[:6]}"
    settings = settings.model_copy(update={"job_id": job_id, "report_interval_s": scenario.report_interval_s,
                                           "signing_key": settings.signing_key or secrets.token_hex(16)})
    scenario_path = run_dir / f"scenario-{plan.name}.json"
    scenario_path.write_text(scenario.model_dump_json(indent=2))
    names = [w.name for w in scenario.workers]
    ideal = scenario.ideal_time_s()
    timeout_s = timeout_s or 60 + 8 * ideal * max(1.0, len(names) * min(w.speed for w in scenario.workers))
    with ExitStack() as stack:
        services = Services(stack, settings, log_dir).start(_wanted_services(plan, scenario))
        handshake = run_dir / f"handshake-{job_id}"
        handshake.mkdir()
        timeline = stack.enter_context(Timeline(settings, job_id, names))
        pool = WorkerPool(scenario_path, scenario, plan, handshake, settings, log_dir,
                          restart_failed=chaos is not None).start()
        stack.callback(pool.close)
        _wait_for(lambda: all(ready_file(handshake, r).exists() for r in range(len(names))), pool, 180.0,
                  "workers ready")
        start = time.time()
        timeline.set_start(start)
        give_start(handshake, start)
        deadline = time.monotonic() + timeout_s
        while not pool.all_finished:
            pool.supervise()
            if chaos is not None:
                chaos.tick(time.time() - start, pool, services, timeline)
            if on_tick is not None:
                on_tick(timeline, time.time() - start)
            if time.monotonic() > deadline:
                raise AntdtError(f"the run did not finish within {timeout_s:.0f} s (ideal {ideal:.0f} s); logs in {log_dir}")
            time.sleep(tick_s)
        results = [json.loads(done_file(handshake, r).read_text()) for r in range(len(names))]
        wall = max(r["finished_s"] for r in results)
        samples = sum(r["samples"] for r in results)
        _settle(timeline, samples)
        if on_tick is not None:
            on_tick(timeline, wall)
    audit = _audit(settings, job_id) if plan.sharding == "dynamic" else None
    return RunResult(plan, scenario, job_id, wall, ideal, samples, pool.restarts, timeline, audit,
                     chaos.kills if chaos is not None else [])


def _wanted_services(plan: RunPlan, scenario: Scenario) -> dict[str, list[str]]:
    """The services a plan needs and their arguments: the monitor, the sharder (dynamic sharding), the controller (a policy)."""
    wanted = {"monitor": _set_args(scenario.monitor)}
    if plan.sharding == "dynamic":
        wanted["sharder"] = []
    if plan.policy is not None:
        wanted["controller"] = _set_args({**scenario.controller, "policy": plan.policy})
    return wanted


class Services:
    """The run's service processes by name: started together, then awaited; one can be killed and started again."""

    def __init__(self, stack: ExitStack, settings: Settings, log_dir: Path):
        self._stack, self._settings, self._log_dir = stack, settings, log_dir
        self._args: dict[str, list[str]] = {}
        self.processes: dict[str, ServiceProcess] = {}

    def start(self, wanted: dict[str, list[str]], timeout_s: float = 120.0) -> Services:
        for name, args in wanted.items():
            self._launch(name, args)
        for service in self.processes.values():
            service.wait_ready(timeout_s)
        return self

    def _launch(self, name: str, args: list[str]) -> None:
        self._args[name] = args
        self.processes[name] = self._stack.enter_context(
            service_process(self._settings, name, *args, log_dir=self._log_dir))

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL ``name`` and start a new one at once, as an orchestrator would; do not wait for it."""
        old = self.processes[name].process
        old.kill()
        old.wait()
        self._launch(name, self._args[name])

    def is_ready(self, name: str) -> bool:
        return self.processes[name].is_ready()

    def bus_resets(self, name: str) -> float:
        """How many bus resets the service has handled (its ``antdt_<name>_bus_resets_total``)."""
        return self.processes[name].metrics().get(f"antdt_{name}_bus_resets_total", 0.0)


def _wait_for(condition: Callable[[], bool], pool: WorkerPool, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        pool.supervise()
        if time.monotonic() > deadline:
            raise AntdtError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)


def _settle(timeline: Timeline, samples: int, timeout_s: float = 10.0) -> None:
    """Wait until the timeline has read the workers' last reports (they count every trained sample)."""
    deadline = time.monotonic() + timeout_s
    while timeline.samples < samples and time.monotonic() < deadline:
        time.sleep(0.05)


def _audit(settings: Settings, job_id: str) -> dict:
    from antdt.schemas.codec import make_codec
    from antdt.services.sharder.replay import audit_job, replay_events

    codec = make_codec(settings.schema_registry_url)
    events = [event for _, _, event in replay_events(settings, job_id, codec)]
    return audit_job(settings, job_id, events, codec).to_dict()
