"""The run's service processes by name: the antdt services a plan needs, and the parameter-server
shards.

Each is an ``antdt <command>`` child (:mod:`antdt.runtime.launch`), started together
and awaited until its ``/readyz`` answers; chaos can kill one and start it
again with the same arguments (a parameter-server shard keeps its port and
checkpoint directory, as a StatefulSet pod would).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from antdt.demo.launcher import SERVER, WorkerProcess
from antdt.demo.placement import REPLACED, Placement
from antdt.demo.plans import RunPlan
from antdt.demo.scenario import Scenario
from antdt.embedded.broker import free_port
from antdt.errors import AntdtError
from antdt.runtime.launch import ServiceProcess, service_process, settings_env
from antdt.settings import Settings
from antdt.sizing import BatchSizing
from antdt.training import TrainingMode
from antdt.worker.agent import EXIT_STATE_LOST


def set_args(values: dict[str, str]) -> list[str]:
    """``--set KEY=VALUE`` for each setting (the monitor's and controller's start-up defaults)."""
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def parameter_servers(
    scenario: Scenario, run_dir: Path, lr: float, scenario_path: Path, handshake: Path
) -> dict[str, list[str]]:
    """``ps-<k>`` -> its ``antdt ps`` command line, one per shard the scenario asks for, each on a
    port of its own.

    The demo's wrapper (:mod:`antdt.demo.server_node`) runs it at the speed of
    the node it is placed on (``--node``, added at each launch).
    """
    shards = scenario.parameter_servers
    return {
        f"ps-{k}": [
            "ps",
            "--shard",
            str(k),
            "--shards",
            str(shards),
            "--port",
            str(free_port()),
            "--checkpoint-dir",
            str(run_dir / "ps"),
            "--out",
            str(run_dir),
            "--lr",
            str(lr),
            "--checkpoint-every",
            "2",
            "--scenario",
            str(scenario_path),
            "--handshake",
            str(handshake),
        ]
        for k in range(shards)
    }


def server_addresses(wanted: dict[str, list[str]]) -> list[str]:
    """The parameter-server shards' addresses, in shard order."""
    return [
        f"127.0.0.1:{argv[argv.index('--port') + 1]}"
        for name, argv in sorted(wanted.items())
        if name.startswith("ps-")
    ]


def service_settings(plan: RunPlan, scenario: Scenario) -> dict[str, dict[str, str]]:
    """The monitor's and controller's settings that differ from their defaults, for this plan and
    scenario."""
    settings = {"monitor": {**scenario.monitor, **dict(plan.monitor)}}
    if plan.policy is not None:
        job = {"policy": plan.policy}
        # the job's global batch, which a synchronous policy keeps whatever restarts
        if plan.training is TrainingMode.SYNC:
            job["global_batch_size"] = str(scenario.batch_size * len(scenario.workers))
        if plan.sizing is BatchSizing.IN_BAND:
            job["batch_sizing"] = BatchSizing.IN_BAND.value
        settings["controller"] = {**scenario.controller, **job}
    return settings


def wanted_services(
    plan: RunPlan,
    scenario: Scenario,
    run_dir: Path,
    lr: float,
    scenario_path: Path,
    handshake: Path,
) -> dict[str, list[str]]:
    """Name -> command line of what the plan needs: the monitor, the sharder (dynamic sharding,
    parameter servers), the controller (a policy), the parameter servers (asynchronous training),
    the grouper (partial reduce)."""
    settings = service_settings(plan, scenario)
    wanted = {"monitor": ["monitor", *set_args(settings["monitor"])]}
    if plan.uses_sharder:
        wanted["sharder"] = ["sharder"]
    if "controller" in settings:
        wanted["controller"] = ["controller", *set_args(settings["controller"])]
    if plan.training is TrainingMode.ASYNC:
        wanted.update(parameter_servers(scenario, run_dir, lr, scenario_path, handshake))
    if plan.training is TrainingMode.PREDUCE:
        wanted["grouper"] = grouper_args(scenario)
    return wanted


def grouper_args(scenario: Scenario) -> list[str]:
    """``antdt grouper`` with the scenario's P and deadline, gathering every rank at the scenario's
    checkpoint interval."""
    options = {
        "checkpoint-every-s": str(scenario.checkpoint_every_s),
        **{key.replace("_", "-"): value for key, value in scenario.grouper.items()},
    }
    return ["grouper", *[arg for key, value in options.items() for arg in (f"--{key}", value)]]


class Services:
    def __init__(
        self,
        stack: ExitStack,
        settings: Settings,
        log_dir: Path,
        placement: Placement,
        clock: Callable[[], float],
    ):
        self._stack, self._settings, self._log_dir = stack, settings, log_dir
        self.placement, self.clock = placement, clock
        self._argv: dict[str, list[str]] = {}
        self.processes: dict[str, ServiceProcess] = {}
        # services that exited by themselves, and their codes
        self.exits: list[tuple[str, int]] = []

    def start(self, wanted: dict[str, list[str]], timeout_s: float = 120.0) -> Services:
        for name, argv in wanted.items():
            self._launch(name, argv)
        for service in self.processes.values():
            service.wait_ready(timeout_s)
        return self

    def _launch(self, name: str, argv: list[str]) -> None:
        self._argv[name] = argv
        # a parameter-server shard: a process on a node
        if name in self.placement.scenario.server_names:
            self.processes[name] = self._fork_server_shard(name, argv)
            return
        self.processes[name] = self._stack.enter_context(
            service_process(self._settings, argv[0], *argv[1:], log_dir=self._log_dir)
        )

    def _fork_server_shard(self, name: str, argv: list[str]) -> ServiceProcess:
        """A parameter-server shard on the node the placement gives it, forked with torch already
        imported."""
        node, port = self.placement.where[name], free_port()
        log_path = self._log_dir / f"{name}-{port}.log"
        env = {
            **os.environ,
            **settings_env(self._settings),
            "PYTHONUNBUFFERED": "1",
            "ANTDT_NODE_ID": node,
        }
        process = WorkerProcess(
            [argv[0], "--http-port", str(port), *argv[1:], "--node", node],
            env,
            log_path,
            entry=SERVER,
        )
        service = ServiceProcess(process, port, log_path)
        self._stack.callback(service.stop)
        return service

    def supervise(self, restart: bool) -> None:
        """A service that exited by itself is started again (``restart``, as an orchestrator would),
        or ends the run."""
        for name, service in list(self.processes.items()):
            code = service.process.poll()
            if code is None:
                continue
            if code in REPLACED and name in self.placement.scenario.server_names:
                # the controller moves it elsewhere
                self.placement.replace(name, self.clock(), REPLACED[code])
            elif not restart or code == EXIT_STATE_LOST:  # a restart cannot help
                raise AntdtError(
                    f"{name} exited with code {code}; its log ends:\n{service.log_tail()}"
                )
            else:
                self.exits.append((name, code))
            self._launch(name, self._argv[name])

    def counters(self) -> dict[str, dict[str, float]]:
        """Each running service's own metrics (``antdt_*`` samples) as it serves them now: what a
        stall's report shows of the services' side."""
        return {
            name: {k: v for k, v in service.metrics().items() if k.startswith("antdt_")}
            for name, service in self.processes.items()
            if service.process.poll() is None
        }

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL ``name`` and start a new one at once, as an orchestrator would; do not wait for
        it."""
        old = self.processes[name].process
        old.kill()
        old.wait()
        self._launch(name, self._argv[name])

    def is_ready(self, name: str) -> bool:
        return self.processes[name].is_ready()

    def bus_resets(self, name: str) -> float:
        """How many bus resets the service has handled (its ``antdt_<name>_bus_resets_total``)."""
        return self.processes[name].metrics().get(f"antdt_{name}_bus_resets_total", 0.0)
