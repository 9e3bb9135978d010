"""The agent's /metrics, scraped live against the embedded broker.

Off unless a port is set; one registry per agent; what a worker that stopped
reporting looks like from its side; counts made in the training process
alone while real DataLoader worker processes (spawn and fork) read the data.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextlib import ExitStack, closing

import psutil
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import DataLoader

from antdt.embedded.broker import free_port
from antdt.runtime.launch import http_get, scraped_samples
from antdt.schemas.models import CommandAction, DatasetSpec
from antdt.settings import load_settings
from antdt.worker import Agent
from antdt.worker.agent_metrics import metrics_port, serve
from antdt.worker.dataset import loader
from tests.services.sharder.harness import running_sharder
from tests.worker.test_agent import KEY, send_command, step_until, wait_until

JOB, WORKER = "job-agent", "w1"  # whom send_command addresses


@pytest.fixture
def metered(settings, topics):
    """Settings with the agent's metrics on (any free port), short intervals, signed commands."""
    return with_port(settings, 0, report_interval_s=0.1, heartbeat_interval_s=0.2, signing_key=KEY)


def with_port(settings, port, **more):
    return load_settings(**{**settings.model_dump(), "agent_metrics_port": port, **more})


def series(name: str, agent: Agent, **labels: str) -> str:
    """The key :func:`scraped_samples` gives a sample of ``agent``."""
    labels |= {"job_id": agent.spec.job_id, "worker_id": agent.spec.worker_id}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def scrape_until(agent: Agent, condition, timeout_s: float = 20.0) -> dict[str, float]:
    """Scrape the agent's /metrics until ``condition(samples)`` holds; the samples that made it."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scraped_samples(agent.metrics.port)
        if condition(samples):
            return samples
        assert time.monotonic() < deadline, f"never met; last scrape: {samples}"
        time.sleep(0.02)


# ------------------------------------------------------------------ the port


def test_the_port_is_the_set_one_plus_the_local_rank():
    assert metrics_port(None, {"LOCAL_RANK": "3"}) is None  # off
    assert metrics_port(9500, {}) == 9500
    assert metrics_port(9500, {"LOCAL_RANK": "3"}) == 9503
    assert metrics_port(0, {"LOCAL_RANK": "3"}) == 0  # any free port, for every rank


def test_metrics_are_off_unless_a_port_is_set_and_kept_all_the_same(settings, topics):
    with Agent(JOB, WORKER, settings=settings, listen_for_commands=False) as agent:
        agent.step(samples=4)
        assert agent.metrics.port is None
    # read in process; the last report, made at exit, is counted
    identity = {"job_id": JOB, "worker_id": WORKER}
    assert agent.metrics.registry.get_sample_value("antdt_agent_samples_total", identity) == 4


def test_ranks_of_one_node_serve_on_consecutive_ports(settings, topics, monkeypatch):
    base = consecutive_free_ports()
    with ExitStack() as running:
        agents = []
        for local_rank in (0, 1):
            monkeypatch.setenv("LOCAL_RANK", str(local_rank))  # as torchrun sets it
            agent = Agent(
                JOB, f"w{local_rank}", settings=with_port(settings, base), listen_for_commands=False
            )
            agents.append(running.enter_context(agent))
        assert [agent.metrics.port for agent in agents] == [base, base + 1]


def consecutive_free_ports() -> int:
    """A port that is free with the next one."""
    for _ in range(50):
        base = free_port()
        with closing(socket.socket()) as probe:
            try:
                probe.bind(("0.0.0.0", base + 1))
                return base
            except OSError:
                continue
    raise AssertionError("no two consecutive free ports")


def test_a_taken_port_leaves_training_on_without_metrics(settings, topics, caplog):
    with closing(socket.create_server(("0.0.0.0", 0))) as taken:
        port = taken.getsockname()[1]
        with (
            caplog.at_level(logging.WARNING, "antdt.worker.agent_metrics"),
            Agent(JOB, WORKER, settings=with_port(settings, port)) as agent,
        ):
            agent.step()
            assert agent.metrics.port is None
    assert f"cannot serve on port {port}" in caplog.text


# ------------------------------------------------------------------ what is served


def test_steps_events_and_commands_are_scraped_live(metered):
    with Agent(JOB, WORKER, settings=metered) as agent:
        port = agent.metrics.port
        assert port and http_get(port, "/readyz") == (200, "ready\n")
        for _ in range(5):
            agent.step(samples=4)
        send_command(metered, batch_size=64)
        send_command(metered, key=None, batch_size=8)  # unsigned: refused
        step_until(
            agent, lambda: agent.batch_size == 64 and agent.verifier.rejected["unsigned"] == 1
        )
        steps = agent.step_count
        samples = scrape_until(  # steps show once reported, events once acknowledged
            agent,
            lambda s: (
                s[series("antdt_agent_steps_total", agent)] == steps
                and s[series("antdt_agent_events_sent_total", agent)] >= 3
                and s[series("antdt_agent_report_lag_seconds", agent)] < 1.0
            ),
        )
    assert samples[series("antdt_agent_samples_total", agent)] >= 20 + 32 * (steps - 5)
    for status in ("APPLIED", "REJECTED"):
        key = series("antdt_agent_commands_total", agent, action="ADJUST_BATCH_SIZE", status=status)
        assert samples[key] == 1
    assert samples[series("antdt_agent_commands_rejected_total", agent, reason="unsigned")] == 1
    assert samples[series("antdt_agent_batch_size", agent)] == 64
    assert samples[series("antdt_agent_paused", agent)] == 0
    assert samples[series("antdt_agent_events_dropped_total", agent, reason="undelivered")] == 0
    assert samples[series("antdt_agent_overhead_seconds_total", agent)] > 0
    assert samples[series("antdt_agent_step_seconds_total", agent, part="compute")] > 0
    assert http_get(port, "/metrics")[0] == 0, "the server stops with the agent"


def test_a_paused_worker_shows_paused_while_held(metered):
    """PAUSE holds the training thread in its step: the scrape, from another thread, sees it."""
    seen: list[float] = []

    def watch_then_resume() -> None:
        try:
            samples = scrape_until(agent, lambda s: s.get(series("antdt_agent_paused", agent)))
            seen.append(samples[series("antdt_agent_paused", agent)])
        finally:
            send_command(metered, CommandAction.RESUME)  # never leave the test held

    with Agent(JOB, WORKER, settings=metered) as agent:
        send_command(metered, CommandAction.PAUSE)
        watcher = threading.Thread(target=watch_then_resume, daemon=True)
        watcher.start()
        step_until(agent, lambda: not watcher.is_alive() and not agent.paused)
        watcher.join(5)
        after = scraped_samples(agent.metrics.port)
    assert seen == [1.0]
    assert after[series("antdt_agent_paused", agent)] == 0
    for action in ("PAUSE", "RESUME"):
        key = series("antdt_agent_commands_total", agent, action=action, status="APPLIED")
        assert after[key] == 1


def test_two_agents_in_one_process_keep_apart(metered):
    with (
        Agent(JOB, "a", settings=metered, listen_for_commands=False) as first,
        Agent(JOB, "b", settings=metered, listen_for_commands=False) as second,
    ):
        for _ in range(3):
            first.step()
        assert first.metrics.port != second.metrics.port
        scrape_until(first, lambda s: s[series("antdt_agent_steps_total", first)] == 3)
        other = scraped_samples(second.metrics.port)
    assert other[series("antdt_agent_steps_total", second)] == 0
    assert not any('worker_id="a"' in key for key in other)


@pytest.mark.slow
def test_a_worker_whose_bus_is_away_shows_lag_pending_and_drops():
    """What an operator alerts on when a worker stopped reporting: seen from the worker's side."""
    nowhere = load_settings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        agent_metrics_port=0,
        report_interval_s=0.1,
    )
    with Agent(JOB, WORKER, settings=nowhere, listen_for_commands=False) as agent:
        agent.step()
        samples = scrape_until(
            agent,
            lambda s: (
                s[series("antdt_agent_report_lag_seconds", agent)] > 1.0
                and s[series("antdt_agent_events_pending", agent)] >= 2
            ),
        )
    assert samples[series("antdt_agent_events_sent_total", agent)] == 0
    dropped = agent.metrics.registry.get_sample_value(
        "antdt_agent_events_dropped_total",
        {"job_id": JOB, "worker_id": WORKER, "reason": "undelivered"},
    )
    assert dropped >= 2, "what could not be delivered at exit is counted"


# ------------------------------------------------------------------ DataLoader worker processes


class WhereRead:
    """Samples that say which process read them, and whether a metrics server started there."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, int, bool]:
        server = serve(CollectorRegistry(), 0, lambda: True)
        if server is not None:
            server.stop()
        return index, os.getpid(), server is not None


def counted_once(agent: Agent, batches: list, size: int) -> None:
    """The trainer's endpoint counts each step and sample once (loader processes count nothing)."""
    steps = series("antdt_agent_steps_total", agent)
    samples = scrape_until(agent, lambda s: s[steps] >= len(batches))
    assert samples[steps] == len(batches)
    assert samples[series("antdt_agent_samples_total", agent)] == size


def read_elsewhere(batches: list, size: int) -> set[int]:
    """Every sample once, read in loader processes that served nothing; their pids."""
    indices = sorted(int(i) for batch in batches for i in batch[0])
    pids = {int(pid) for batch in batches for pid in batch[1]}
    assert indices == list(range(size))
    assert pids and os.getpid() not in pids
    assert not any(bool(served) for batch in batches for served in batch[2])
    return pids


@pytest.mark.slow
def test_spawned_loader_processes_read_sharded_data_and_only_the_trainer_counts(metered):
    spec = DatasetSpec(
        name="ds", size=40, shard_size=10, epochs=1, shuffle_seed=1, max_attempts=3, lease_s=60
    )
    batches = []
    with (
        running_sharder(metered),
        Agent(JOB, WORKER, settings=metered, listen_for_commands=False) as agent,
    ):
        data = agent.shards(WhereRead(spec.size), spec)
        reading = loader(data, batch_size=4, num_workers=2)  # spawn, as antdt's loader has it
        deadline = time.monotonic() + 120
        while not data.finished:
            assert time.monotonic() < deadline, "the epoch never finished"
            for batch in agent.iterate(reading):
                batches.append(batch)
                agent.step(samples=len(batch[0]))
        counted_once(agent, batches, spec.size)
        data.close()
    read_elsewhere(batches, spec.size)


def test_forked_loader_processes_let_go_of_the_port(metered):
    """A forked loader process gets a copy of the agent and its socket: it serves nothing, and
    once the agent is gone the port is free although the (persistent) loader processes live on."""
    source = WhereRead(24)
    data = DataLoader(
        source, batch_size=4, num_workers=2, multiprocessing_context="fork", persistent_workers=True
    )
    with Agent(JOB, WORKER, settings=metered, listen_for_commands=False) as agent:
        port = agent.metrics.port
        batches = []
        for batch in agent.iterate(data):
            batches.append(batch)
            agent.step(samples=len(batch[0]))
        counted_once(agent, batches, source.size)
        loaders = [psutil.Process(pid) for pid in read_elsewhere(batches, source.size)]
        assert not any(listens_on(process, port) for process in loaders)
    assert all(process.status() != psutil.STATUS_ZOMBIE for process in loaders), "still alive"
    with closing(socket.create_server(("0.0.0.0", port))):
        pass  # bound again while they live
    del data


def listens_on(process: psutil.Process, port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr.port == port
        for c in process.net_connections("tcp")
    )


def test_serve_serves_in_the_training_process():
    """The control for the loader tests: outside a loader process :func:`serve` does serve."""
    assert torch.utils.data.get_worker_info() is None
    server = serve(CollectorRegistry(), 0, lambda: True)
    try:
        assert server is not None
        wait_until(lambda: http_get(server.port, "/healthz")[0] == 200)
    finally:
        server.stop()
