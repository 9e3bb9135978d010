"""The worker processes of one run, supervised the way an orchestrator would.

Workers are forked from a fork server that has torch imported
(:mod:`antdt.demo.launcher`), so starting (or restarting) them costs no
import time.

Asynchronous runs: a worker that exits with EXIT_RESTART or EXIT_EVICTED
(the controller replaced it) is started again on the node
:class:`~antdt.demo.placement.Placement` picks, as the Kubernetes
remediation would; in chaos runs, one that died any other way is started
again where it was. The others train on.
Synchronous runs: a rank that dies takes the step's collective with it, so,
as torchelastic does, every rank is stopped and a new generation of the
whole group is started; it resumes from the last checkpoint. Outside chaos
runs a failure that is not a RESTART ends the run with the worker's last
words.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from antdt.demo.handshake import done_file
from antdt.demo.launcher import WorkerProcess
from antdt.demo.phases import Phase, read_phase
from antdt.demo.placement import REPLACED, Placement
from antdt.demo.plans import RunPlan
from antdt.demo.scenario import Scenario
from antdt.errors import AntdtError
from antdt.runtime.launch import settings_env
from antdt.settings import Settings
from antdt.training import TrainingMode
from antdt.worker.agent import EXIT_STATE_LOST


class WorkerPool:
    def __init__(
        self,
        scenario_path: Path,
        scenario: Scenario,
        plan: RunPlan,
        handshake: Path,
        settings: Settings,
        run_dir: Path,
        servers: list[str],
        restart_failed: bool,
        placement: Placement,
        clock: Callable[[], float],
    ):
        self.scenario_path, self.scenario, self.plan = scenario_path, scenario, plan
        self.placement, self.clock = placement, clock
        self.handshake, self.settings, self.run_dir = handshake, settings, run_dir
        self.log_dir = run_dir / "logs"
        self.servers = list(servers)
        self.restart_failed = restart_failed
        self.processes: dict[int, WorkerProcess] = {}
        self.finished: set[int] = set()
        self.restarts = 0
        self.generation = 0

    def start(self) -> WorkerPool:
        for rank in range(len(self.scenario.workers)):
            self._launch(rank)
        return self

    def _launch(self, rank: int) -> None:
        worker = self.scenario.workers[rank]
        node = self.placement.where[worker.name]
        env = {
            **os.environ,
            **settings_env(self.settings),
            "PYTHONUNBUFFERED": "1",
            "ANTDT_WORKER_ID": worker.name,
            "ANTDT_NODE_ID": node,
            "OMP_NUM_THREADS": "1",
        }
        argv = [
            "--scenario",
            str(self.scenario_path),
            "--rank",
            str(rank),
            "--node",
            node,
            "--training",
            self.plan.training.value,
            "--sharding",
            self.plan.sharding.value,
            "--handshake",
            str(self.handshake),
            "--out",
            str(self.run_dir),
            "--ps",
            ",".join(self.servers),
            "--generation",
            str(self.generation),
            "--sizing",
            self.plan.sizing.value,
        ]
        self.processes[rank] = WorkerProcess(argv, env, self.log_dir / f"worker-{worker.name}.log")

    def log_tail(self, rank: int, chars: int = 3000) -> str:
        path = self.log_dir / f"worker-{self.scenario.workers[rank].name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def supervise(self) -> None:
        """Restart what asked (or, in chaos runs, happened) to need it; raise on a worker that
        failed."""
        for rank, process in list(self.processes.items()):
            code = process.poll()
            if code is None or rank in self.finished:
                continue
            name = self.scenario.workers[rank].name
            if code == 0:
                self.finished.add(rank)
                continue
            if code in REPLACED:
                self.placement.replace(name, self.clock(), REPLACED[code])
            elif not self.restart_failed or code == EXIT_STATE_LOST:  # a restart cannot help
                raise AntdtError(
                    f"worker {name} (rank {rank}) exited with code {code}: {self._last_words(rank)}"
                    f"{self._outside_the_collective()}\nits log ends:\n{self.log_tail(rank)}"
                )
            if not self.plan.grouped:
                self.restarts += 1
                self._launch(rank)
            else:
                self._restart_group()
                return

    def _last_words(self, rank: int) -> str:
        lines = [line for line in self.log_tail(rank).splitlines() if line.strip()]
        return lines[-1].strip()[:300] if lines else "(nothing in its log)"

    def _outside_the_collective(self) -> str:
        """Synchronous runs: the live ranks that are not in the step's all-reduce (the stuck ones,
        if any)."""
        if self.plan.training is not TrainingMode.SYNC:
            return ""
        names = [
            self.scenario.workers[r].name
            for r in self.running()
            if read_phase(self.handshake, r) is not Phase.ALLREDUCE
        ]
        return f"; live ranks outside the all-reduce: {', '.join(names)}" if names else ""

    def _restart_group(self) -> None:
        """Stop every rank and start the next generation of the group (it resumes from the last
        checkpoint)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            process.wait()
        for rank in range(len(self.scenario.workers)):
            done_file(self.handshake, rank).unlink(missing_ok=True)
        self.finished.clear()
        self.generation += 1
        self.restarts += 1
        for rank in range(len(self.scenario.workers)):
            self._launch(rank)

    def running(self) -> list[int]:
        """Ranks whose process is alive and not finished."""
        return [
            rank
            for rank, p in self.processes.items()
            if p.poll() is None and rank not in self.finished
        ]

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
