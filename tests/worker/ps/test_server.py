"""The parameter server with the real sharder and broker: one shared model, every sample in it
exactly once.

Workers are threads here (each with its own agent, sharder client and
connections); the servers run in-process too, so a test can stop one the
hard way (close without a word) and start a new one from its checkpoints.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import traceback
from contextlib import ExitStack

import pytest
import torch

from antdt.errors import ShardStateLost
from antdt.schemas.models import DatasetSpec, ShardState
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.audit import audit_log, compare_with_ledger
from antdt.services.sharder.state import fold
from antdt.worker import Agent
from antdt.worker.agent import EXIT_STATE_LOST
from antdt.worker.example import SyntheticClassification, evaluate, make_model
from antdt.worker.ledger import read_ledgers
from antdt.worker.ps import server as server_module
from antdt.worker.ps.checkpoints import CheckpointStore
from antdt.worker.ps.client import read_parameters
from antdt.worker.ps.job import ParameterServerJob
from antdt.worker.ps.model import ShardModel
from antdt.worker.ps.server import ParameterServer, ServerSpec, ServerState
from tests.services.sharder.harness import job_log, running_sharder

pytestmark = pytest.mark.slow
SPEC = DatasetSpec(
    name="ps", size=2048, shard_size=16, epochs=2, shuffle_seed=3, max_attempts=3, lease_s=30
)


def server(
    settings, tmp_path, shard: int = 0, shards: int = 1, port: int = 0, **knobs
) -> ParameterServer:
    spec = ServerSpec(
        job_id=settings.job_id,
        checkpoint_dir=tmp_path / "ckpt",
        shard=shard,
        shards=shards,
        port=port,
        out_dir=tmp_path / "out",
        checkpoint_every_s=0.5,
        **knobs,
    )
    return ParameterServer(settings, spec).start()


def train(
    settings, name: str, addresses: list[str], source, trained: dict, pace_s: float = 0.0
) -> None:
    """One worker: the user's loop over :class:`ParameterServerJob` (a stale push is recomputed by
    the job)."""
    torch.manual_seed(0)
    model = make_model()
    loss_fn = torch.nn.CrossEntropyLoss()
    with Agent(settings=settings, worker_id=name, listen_for_commands=False) as agent:
        with ParameterServerJob(
            model,
            source,
            batch_size=agent.batch_size,
            servers=addresses,
            epochs=SPEC.epochs,
            shard_size=SPEC.shard_size,
            seed=SPEC.shuffle_seed,
            name=SPEC.name,
            agent=agent,
            server_timeout_s=60,
        ) as job:
            for inputs, labels in job.batches():
                loss_fn(model(inputs), labels).backward()
                time.sleep(pace_s)
    trained[name] = job.samples


def run_workers(settings, addresses, source, count: int, pace_s: float = 0.0, during=None) -> dict:
    """Train ``count`` worker threads to the end; a worker still running after two minutes fails the
    test.

    The threads are daemons, so one that never ends cannot keep the test
    session alive; the failure names what the shard log says is unfinished.
    """
    trained: dict[str, int] = {}
    threads = [
        threading.Thread(
            target=train, args=(settings, f"w{i}", addresses, source, trained, pace_s), daemon=True
        )
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    if during is not None:
        during()
    deadline = time.monotonic() + 120
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [thread for thread in threads if thread.is_alive()]
    assert not stuck, f"a worker did not finish: {unfinished(settings)}\n{stacks(stuck)}"
    failed = sorted({f"w{i}" for i in range(count)} - set(trained))
    assert not failed, f"worker(s) {failed} raised (see the thread's traceback above)"
    return trained


def stacks(threads) -> str:
    """Where each stuck thread is, so a hang in CI says where it hangs."""
    frames = sys._current_frames()
    return "\n".join(
        f"{thread.name}:\n{''.join(traceback.format_stack(frames[thread.ident]))}"
        for thread in threads
        if thread.ident in frames
    )


def unfinished(settings) -> str:
    """The job's shards that are not DONE, as the shard log folds them (for a failure message)."""
    state = fold(settings.job_id, job_log(settings, settings.job_id))
    open_slots = [
        f"{s.shard_id}:{s.state.value}@{s.attempt} by {s.worker} "
        f"({len(s.applied)}/{s.length} applied)"
        for s in state.slots
        if s.state is not ShardState.DONE
    ]
    return (
        f"epoch {state.epoch} seq {state.last_seq} finished={state.finished}; "
        f"open: {open_slots[:20]}"
    )


def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def check_exactly_once(settings, tmp_path, shards: int) -> None:
    report = audit_log(job_log(settings, settings.job_id))
    assert report.ok and report.finished, report.violations
    for shard in range(shards):
        ledgers = read_ledgers(tmp_path / "out" / f"ps-{shard}")
        assert sorted(ledgers) == [0, 1]
        assert compare_with_ledger(report, ledgers) == []


def test_two_shards_train_one_model_and_every_sample_is_in_it_exactly_once(
    settings, topics, tmp_path
):
    settings = settings.model_copy(update={"job_id": "job-ps-two"})
    source = SyntheticClassification(SPEC.size, seed=3)
    with running_sharder(settings), ExitStack() as stack:
        servers = [
            stack.enter_context(_closing(server(settings, tmp_path, k, 2))) for k in range(2)
        ]
        addresses = [f"localhost:{s.port}" for s in servers]
        trained = run_workers(settings, addresses, source, 3)
        wait_for(
            lambda: all(
                (tmp_path / "out" / f"ps-{k}" / "ledger-epoch1.npy").exists() for k in range(2)
            ),
            "the servers wrote the last epoch's ledger",
        )
        model = make_model()
        assert read_parameters(addresses, model)
        loss, accuracy = evaluate(model, source.heldout(1024))
    assert sum(trained.values()) == SPEC.size * SPEC.epochs
    assert accuracy > 0.5, (loss, accuracy)  # chance is 0.1: the shared model learnt
    # both shards applied every update
    assert sum(s.model.version for s in servers) == 2 * servers[0].model.version
    check_exactly_once(settings, tmp_path, 2)
    # each shard's own timing reaches the monitor's topic, as a parameter server
    reports = server_reports(settings)
    assert {r.worker_id for r in reports} == {"ps-0", "ps-1"}
    for shard in ("ps-0", "ps-1"):
        mine = [r for r in reports if r.worker_id == shard]
        assert (
            sum(r.samples for r in mine) == SPEC.size * SPEC.epochs
            and sum(r.step_count for r in mine) > 0
        )
        assert all(r.queue_depth is not None for r in mine)


def server_reports(settings):
    """The parameter servers' WorkerMetrics of the job, read from the beginning until they count
    every sample."""
    from antdt.bus.readers import BEGINNING, KeyedReader
    from antdt.schemas.codec import make_codec
    from antdt.topics import topic_spec

    topic = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    found = []
    with KeyedReader(settings, topic, settings.job_id, make_codec(None), start=BEGINNING) as reader:
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and sum(r.samples for r in found) < 2 * SPEC.size * SPEC.epochs
        ):
            found += [r for r in reader.poll(0.2) if r.role == "ps"]
    return found


def test_a_server_that_dies_comes_back_from_its_checkpoint_and_everyone_rolls_back(
    settings, topics, tmp_path
):
    settings = settings.model_copy(update={"job_id": "job-ps-crash"})
    source = SyntheticClassification(SPEC.size, seed=3)
    with running_sharder(settings), ExitStack() as stack:
        first = server(settings, tmp_path)
        port = first.port
        replacement = {}
        # gone without a word
        crash_and_restart = replace_server(first, settings, tmp_path, stack, replacement)

        run_workers(
            settings, [f"localhost:{port}"], source, 2, pace_s=0.002, during=crash_and_restart
        )
        again = replacement["server"]
        wait_for(
            lambda: (tmp_path / "out" / "ps-0" / "ledger-epoch1.npy").exists(),
            "the last epoch's ledger",
        )
        assert again.state is ServerState.SERVING
    events = job_log(settings, settings.job_id)
    assert any(e.transition is T.REWOUND and e.worker_id == "ps-0" for e in events)
    check_exactly_once(settings, tmp_path, 1)


def test_a_shard_told_to_restart_leaves_with_a_checkpoint_and_its_replacement_carries_on(
    settings, topics, tmp_path
):
    from antdt.schemas.models import CommandAction
    from antdt.worker.agent import EXIT_RESTART
    from tests.worker.test_agent import send_command

    settings = settings.model_copy(update={"job_id": "job-ps-move"})
    source = SyntheticClassification(SPEC.size, seed=3)
    with running_sharder(settings), ExitStack() as stack:
        first = server(settings, tmp_path)
        port = first.port
        replacement = {}

        def told_to_restart():
            send_command(
                settings,
                CommandAction.RESTART,
                key=None,
                job_id=settings.job_id,
                target_worker="ps-0",
            )
            wait_for(lambda: first.exit is not None, "the shard left")

        move_the_shard = replace_server(
            first, settings, tmp_path, stack, replacement, before_close=told_to_restart
        )
        run_workers(settings, [f"localhost:{port}"], source, 2, pace_s=0.002, during=move_the_shard)
        wait_for(
            lambda: (tmp_path / "out" / "ps-0" / "ledger-epoch1.npy").exists(),
            "the last epoch's ledger",
        )
    assert first.exit.code == EXIT_RESTART and first.state is ServerState.LEAVING
    assert replacement["server"].state is ServerState.SERVING
    check_exactly_once(settings, tmp_path, 1)


def test_a_connection_that_carries_no_request_is_closed_at_its_bound(
    settings, topics, tmp_path, monkeypatch
):
    """A worker's host gone without closing its connection leaves no server thread waiting on it
    for good (the worker itself reconnects at its next request)."""
    monkeypatch.setattr(server_module, "IDLE_CONNECTION_S", 0.5)
    with _closing(server(settings, tmp_path)) as shard:
        with socket.create_connection(("localhost", shard.port), timeout=30) as idle:
            assert idle.recv(1) == b""  # closed by the shard, long before this end's 30 s


def test_a_gradient_computed_too_long_ago_is_refused_and_recomputed(settings, topics, tmp_path):
    settings = settings.model_copy(update={"job_id": "job-ps-stale"})
    source = SyntheticClassification(SPEC.size, seed=3)
    with running_sharder(settings), ExitStack() as stack:
        bounded = stack.enter_context(_closing(server(settings, tmp_path, max_staleness=0)))
        run_workers(settings, [f"localhost:{bounded.port}"], source, 3)
        wait_for(
            lambda: (tmp_path / "out" / "ps-0" / "ledger-epoch1.npy").exists(),
            "the last epoch's ledger",
        )
    from antdt.worker.ps import metrics

    assert metrics.STALE._value.get() > 0  # three workers on one server: some pushes were behind
    check_exactly_once(settings, tmp_path, 1)


def replace_server(first, settings, tmp_path, stack, replacement: dict, before_close=lambda: None):
    """For ``run_workers(during=...)``: once updates are applied and checkpointed, ``before_close``,
    then close ``first`` (without a word: its pending updates are lost) and start its replacement on
    its port."""
    port = first.port

    def replace() -> None:
        wait_for(
            lambda: first.model.version > 40 and len(first.store.versions()) >= 2, "updates applied"
        )
        before_close()
        first.close()
        replacement["server"] = stack.enter_context(_closing(server(settings, tmp_path, port=port)))

    return replace


class _closing:
    def __init__(self, server):
        self.server = server

    def __enter__(self):
        return self.server

    def __exit__(self, *exc_info):
        if not self.server._stop.is_set():
            self.server.close()


def test_a_shard_whose_job_state_is_lost_ends_at_once_naming_the_cause(settings, topics, tmp_path):
    """A double fault beyond the fault model: the shard restarts from its checkpoint, but the job's
    shard state is gone (here the log holds nothing of the job). The sharder refuses the rewind
    and the shard ends with its reason and exit code 78, instead of waiting out its recovery bound
    and being restarted into the same wait."""
    settings = settings.model_copy(update={"job_id": "job-ps-lost"})
    model = ShardModel(lr=0.05)
    model.initialize([["weight", [4]]], torch.zeros(4))
    checkpoint = {"model": model.state_dict(), "epoch": 0, "log_offset": 9, "writer_epoch": 1}
    CheckpointStore(tmp_path / "ckpt" / "ps-0").save(7, {**checkpoint, "cluster_id": None})
    with running_sharder(settings):
        shard = server(settings, tmp_path, recover_within_s=60)
        assert shard.state is ServerState.RECOVERING
        with pytest.raises(
            ShardStateLost, match=r"refused to rewind job job-ps-lost to version 7 \("
        ) as lost:
            shard.run(threading.Event())  # it ends by itself
    assert "has no dataset yet" in str(lost.value)
    assert lost.value.exit_code == EXIT_STATE_LOST
