"""The agent against the real embedded broker: events, commands, acks, refusals."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import consuming, make_producer
from antdt.bus.markers import marker_id
from antdt.bus.readers import assign_now, poll_batch
from antdt.control.signing import sign
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import (
    AckStatus,
    CommandAck,
    CommandAction,
    LifecycleEvent,
    MitigationCommand,
    WorkerLifecycle,
    WorkerMetrics,
)
from antdt.schemas.types import utc_now
from antdt.settings import load_settings
from antdt.topics import topic_spec, worker_key
from antdt.worker import EXIT_EVICTED, EXIT_RESTART, Agent, AgentState
from tests.waiting import wait_until

KEY = "s3cret-signing-key-for-tests-0123"
CODEC = SingleObjectCodec()


@pytest.fixture
def agent_settings(settings, topics):
    return load_settings(
        **{
            **settings.model_dump(),
            "report_interval_s": 0.1,
            "heartbeat_interval_s": 0.2,
            "signing_key": KEY,
        }
    )


def read_topic(settings, component, name, want=None, timeout_s=20.0) -> list:
    """The topic's records from its beginning: until ``want(found)``, or with ``want`` None up to
    its end as it is now; either way for at most ``timeout_s``. Read to its end, a topic not read
    there in time fails the read: a part of it handed back as the whole once let a CI run count
    5 of 6 incarnations that had all joined."""
    topic = topic_spec(component, name).full_name(settings.topic_prefix)
    partitions = [
        TopicPartition(topic, p, OFFSET_BEGINNING)
        for p in range(topic_spec(component, name).partitions)
    ]
    found = []
    with consuming(settings) as consumer:
        assign_now(consumer, partitions)
        unread = {}  # partition -> its end now, until read to it
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(partition, 5.0, cached=False)
            if high > low:
                unread[partition.partition] = high
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in poll_batch(consumer, 1000, 0.1):
                if message.offset() + 1 >= unread.get(message.partition(), 0):
                    unread.pop(message.partition(), None)
                if marker_id(message) is None:
                    found.append(CODEC.decode(message.value()))
            if want(found) if want is not None else not unread:
                return found
    if want is None and unread:
        raise AssertionError(
            f"{topic} not read to its end within {timeout_s:.0f} s: {len(found)} record(s) read, "
            f"partitions {sorted(unread)} short"
        )
    return found


def send_command(
    settings, action=CommandAction.ADJUST_BATCH_SIZE, key=KEY, **fields
) -> MitigationCommand:
    now = utc_now()
    values = dict(
        command_id=f"c-{time.monotonic_ns()}",
        job_id="job-agent",
        target_worker="w1",
        action=action,
        reason="test",
        evidence=[],
        policy="test",
        issued_at=now,
        expires_at=now + timedelta(minutes=5),
        controller_epoch=1,
    )
    values.update(fields)
    command = MitigationCommand(**values)
    if key is not None:
        command = sign(command, key.encode())
    topic = topic_spec("controller", "commands").full_name(settings.topic_prefix)
    producer = make_producer(settings)
    producer.produce(
        topic,
        key=worker_key(command.job_id, command.target_worker).encode(),
        value=CODEC.encode(command),
    )
    producer.flush(5)
    return command


def step_until(agent, condition, timeout_s=20.0, compute_s=0.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        if compute_s:
            time.sleep(compute_s)
        agent.step()


def acks_for(settings, command_id, want_status) -> list[CommandAck]:
    acks = read_topic(
        settings,
        "worker",
        "acks",
        lambda found: any(a.command_id == command_id and a.status is want_status for a in found),
    )
    return [a for a in acks if a.command_id == command_id]


def test_events_arrive_and_decode(agent_settings):
    with Agent("job-agent", "w1", rank=1, settings=agent_settings, batch_size=8) as agent:
        for _ in range(40):
            time.sleep(0.002)
            agent.step()
    metrics = read_topic(
        agent_settings, "worker", "metrics", lambda f: sum(m.step_count for m in f) >= 40
    )
    assert all(isinstance(m, WorkerMetrics) for m in metrics)
    assert sum(m.step_count for m in metrics) == 40 and sum(m.samples for m in metrics) == 40 * 8
    busy = [m for m in metrics if m.step_count]
    assert busy[0].first_step == 0 and busy[-1].last_step == 39
    assert all(m.compute.min_s > 0 and m.rank == 1 and m.local_batch_size == 8 for m in busy)
    assert [m.seq for m in metrics] == sorted(m.seq for m in metrics)
    lifecycle = read_topic(
        agent_settings,
        "worker",
        "lifecycle",
        lambda f: any(e.event is LifecycleEvent.LEFT for e in f),
    )
    events = [e.event for e in lifecycle if isinstance(e, WorkerLifecycle)]
    assert events[0] is LifecycleEvent.JOINED and events[-1] is LifecycleEvent.LEFT
    assert lifecycle[-1].exit_code == 0 and lifecycle[-1].reason == "finished"


def test_the_first_step_is_reported_at_once_in_a_window_of_its_own(agent_settings):
    """The opening report (one-off costs) does not wait for the report interval: the next one,
    the first the monitor and DD time, then comes an interval sooner."""
    settings = load_settings(**{**agent_settings.model_dump(), "report_interval_s": 60.0})
    with Agent("job-opening", "w1", settings=settings, batch_size=8) as agent:
        agent.step()
        metrics = read_topic(
            settings,
            "worker",
            "metrics",
            lambda f: any(m.job_id == "job-opening" and m.step_count for m in f),
        )
        opening = [m for m in metrics if m.job_id == "job-opening" and m.step_count]
        assert agent.state is AgentState.RUNNING  # not the exit's report
    assert [(m.first_step, m.last_step, m.samples) for m in opening] == [(0, 0, 8)]


def test_time_split_between_compute_data_and_sync(agent_settings):
    with Agent("job-agent", "w1", settings=agent_settings, listen_for_commands=False) as agent:
        for _ in range(5):
            with agent.data_wait():
                time.sleep(0.1)
            with agent.sync_wait():
                time.sleep(0.05)
            agent.step()
    metrics = read_topic(
        agent_settings, "worker", "metrics", lambda f: sum(m.step_count for m in f) >= 5
    )
    assert sum(m.data_wait_s for m in metrics) >= 0.5
    assert sum(m.sync_wait_s for m in metrics) >= 0.25
    # Counted as compute, the waits would make every step's compute 0.15 s at least; the step has
    # none of its own, so what is left is scheduling noise (7 ms seen on a loaded machine).
    assert max(m.compute.max_s for m in metrics) < 0.05


def test_a_sync_wait_inside_another_is_booked_once():
    agent = Agent("job-agent", "w1", listen_for_commands=False)
    started = time.perf_counter()
    with agent.sync_wait():
        with agent.sync_wait():  # a framework's collective inside antdt's own wait
            time.sleep(0.05)
    elapsed = time.perf_counter() - started
    record = agent.step()
    # booked twice, the wait would be longer than the time that passed
    assert 0.05 <= record.sync_wait_s <= elapsed


def test_a_step_without_samples_is_all_waiting_except_its_data_wait():
    agent = Agent("job-agent", "w1", listen_for_commands=False)
    agent.step()
    with agent.data_wait():
        time.sleep(0.02)
    time.sleep(0.2)  # a placeholder batch's forward pass and the wait for the others
    agent.waited_whole_step()
    record = agent.step(samples=0)
    assert record.sync_wait_s >= 0.2 and record.data_wait_s >= 0.02
    # what is left is the clock reads between the calls (booked as compute, the wait would be
    # 0.2 s of it; half that leaves room for a loaded machine's preemptions)
    assert record.compute_s < 0.1


def test_time_an_iterable_books_as_waiting_for_others_is_not_data_wait(agent_settings):
    with Agent("job-agent", "w1", settings=agent_settings, listen_for_commands=False) as agent:

        def waits_for_the_others():  # as a sharded dataset does while the sharder says WAIT
            for item in range(3):
                with agent.sync_wait():
                    time.sleep(0.05)
                yield item

        for _ in agent.iterate(waits_for_the_others()):
            agent.step()
    metrics = read_topic(
        agent_settings, "worker", "metrics", lambda f: sum(m.step_count for m in f) >= 3
    )
    # booked as data wait, the waits would be 0.15 s of it; half that leaves room for preemptions
    assert (
        sum(m.sync_wait_s for m in metrics) >= 0.15 and sum(m.data_wait_s for m in metrics) < 0.075
    )


def test_batch_size_changes_exactly_at_the_effective_step(agent_settings):
    sizes = {}
    with Agent("job-agent", "w1", settings=agent_settings, batch_size=32) as agent:
        agent.on_batch_size(lambda size: sizes.setdefault("callback", (agent.step_count, size)))
        command = send_command(agent_settings, batch_size=12, effective_step=500)
        # the command arrived, before step 500 could have been reached
        wait_until(lambda: agent._inbox, timeout_s=20.0, pause_s=0.001)
        while agent.step_count < 510:
            sizes[agent.step_count] = agent.batch_size
            agent.step()
    assert sizes[499] == 32 and sizes[500] == 12  # step 500 is the first to run with the new size
    assert sizes["callback"] == (500, 12)
    acks = acks_for(agent_settings, command.command_id, AckStatus.APPLIED)
    assert [(a.status, a.applied_step) for a in acks] == [
        (AckStatus.SCHEDULED, 500),
        (AckStatus.APPLIED, 500),
    ]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"key": None}, "unsigned"),
        ({"key": "forged-key-forged-key-forged-key"}, "bad signature"),
        ({"expires_at_offset": -1}, "expired"),
        (
            {"target_worker": "w1", "job_id": "job-agent", "controller_epoch": 0, "after_epoch": 2},
            "stale epoch",
        ),
    ],
    ids=["unsigned", "forged", "expired", "stale-epoch"],
)
def test_refused_commands_are_acknowledged_as_rejected_and_counted(agent_settings, fields, reason):
    fields = dict(fields)
    with Agent("job-agent", "w1", settings=agent_settings) as agent:
        if "after_epoch" in fields:
            send_command(agent_settings, batch_size=16, controller_epoch=fields.pop("after_epoch"))
            step_until(agent, lambda: agent.verifier.highest_epoch == 2)
        offset = fields.pop("expires_at_offset", None)
        if offset is not None:
            now = utc_now()
            fields.update(
                issued_at=now - timedelta(minutes=2), expires_at=now + timedelta(seconds=offset)
            )
        command = send_command(agent_settings, batch_size=8, **fields)
        step_until(agent, lambda: sum(agent.verifier.rejected.values()) >= 1)
        assert agent.batch_size != 8
    acks = acks_for(agent_settings, command.command_id, AckStatus.REJECTED)
    assert acks[-1].status is AckStatus.REJECTED and acks[-1].reason.startswith(reason)
    assert agent.verifier.rejected[reason] == 1


def test_a_replayed_command_id_is_refused(agent_settings):
    with Agent("job-agent", "w1", settings=agent_settings) as agent:
        first = send_command(agent_settings, action=CommandAction.SET_SHARD_QUOTA, shard_quota=5)
        step_until(agent, lambda: agent.shard_quota == 5)
        topic = topic_spec("controller", "commands").full_name(agent_settings.topic_prefix)
        producer = make_producer(agent_settings)
        producer.produce(
            topic, key=worker_key("job-agent", "w1").encode(), value=CODEC.encode(first)
        )
        producer.flush(5)
        step_until(agent, lambda: agent.verifier.rejected["duplicate"] == 1)


@contextmanager
def stepping(agent: Agent):
    """A training thread stepping ``agent`` until the block ends (joined within 10 s)."""
    stop = threading.Event()

    def train():
        while not stop.is_set():
            agent.step()

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        yield
    finally:
        stop.set()
        trainer.join(10)


def test_pause_holds_the_step_until_resume(agent_settings):
    """No step completes between PAUSE and RESUME: both are applied at the same step."""
    with Agent("job-agent", "w1", settings=agent_settings) as agent:
        with stepping(agent):
            pause = send_command(agent_settings, action=CommandAction.PAUSE)
            wait_until(lambda: agent.state is AgentState.PAUSED, timeout_s=20, pause_s=0.001)
            resume = send_command(agent_settings, action=CommandAction.RESUME)
            acks = acks_for(agent_settings, pause.command_id, AckStatus.APPLIED)
            paused_at = acks[-1].applied_step
            acks = acks_for(agent_settings, resume.command_id, AckStatus.APPLIED)
            resumed_at = acks[-1].applied_step
        assert agent.state is AgentState.RUNNING and agent.step_count > resumed_at
    assert paused_at == resumed_at


def test_a_pause_no_resume_follows_ends_at_its_limit_and_says_so(agent_settings, caplog):
    """The PAUSE's sender gone (or its RESUME refused as expired): training resumes after
    ``pause_limit_s`` instead of holding the worker for good."""
    settings = agent_settings.model_copy(update={"pause_limit_s": 0.5})
    with (
        caplog.at_level(logging.WARNING, logger="antdt.worker.agent"),
        Agent("job-agent", "w1", settings=settings) as agent,
        stepping(agent),
    ):
        pause = send_command(settings, action=CommandAction.PAUSE)
        wait_until(lambda: agent.state is AgentState.PAUSED, timeout_s=20)
        paused_at = agent.step_count
        wait_until(lambda: agent.state is AgentState.RUNNING, timeout_s=20)
        wait_until(lambda: agent.step_count > paused_at, timeout_s=20)
    [line] = [r.getMessage() for r in caplog.records if "got no RESUME" in r.getMessage()]
    assert pause.command_id in line and "0.5 s" in line


@pytest.mark.parametrize(
    ("action", "code"), [(CommandAction.RESTART, EXIT_RESTART), (CommandAction.EVICT, EXIT_EVICTED)]
)
def test_restart_and_evict_checkpoint_then_exit_with_a_distinctive_code(
    agent_settings, action, code
):
    saved = []
    with pytest.raises(SystemExit) as exited:
        with Agent("job-agent", "w1", settings=agent_settings) as agent:
            agent.on_restart(lambda: saved.append(agent.step_count))
            send_command(agent_settings, action=action, reason="persistent straggler")
            step_until(agent, lambda: False if not saved else True)
    assert exited.value.code == code and len(saved) == 1
    lifecycle = read_topic(
        agent_settings,
        "worker",
        "lifecycle",
        lambda f: any(e.event is LifecycleEvent.LEFT for e in f),
    )
    left = [e for e in lifecycle if e.event is LifecycleEvent.LEFT][-1]
    assert left.exit_code == code and "persistent straggler" in left.reason


def test_custom_actions_reach_registered_callbacks(agent_settings):
    seen = []
    with Agent("job-agent", "w1", settings=agent_settings) as agent:
        agent.on_command("flush-cache", lambda command: seen.append(command.parameters["level"]))
        unknown = send_command(agent_settings, action=CommandAction.CUSTOM, custom_action="nope")
        command = send_command(
            agent_settings,
            action=CommandAction.CUSTOM,
            custom_action="flush-cache",
            parameters={"level": "2"},
        )
        step_until(agent, lambda: len(seen) == 1)  # commands apply in order: "nope" went first
    assert (
        acks_for(agent_settings, command.command_id, AckStatus.APPLIED)[-1].status
        is AckStatus.APPLIED
    )
    assert acks_for(agent_settings, unknown.command_id, AckStatus.FAILED)[-1].reason.startswith(
        "LookupError"
    )


def test_injected_sleep_is_booked_as_compute(agent_settings):
    """A worker slowed 4x by sleep injection must look 4x slower, as a slower device would; its
    process's first step (one-time costs) is spared."""
    from antdt.worker.injection import SlowdownSpec, StragglerInjector

    with Agent("job-agent", "w1", settings=agent_settings, listen_for_commands=False) as agent:
        agent._injector = StragglerInjector(SlowdownSpec(constant=4.0)).start()
        time.sleep(0.2)  # the first step: one-time costs
        first = agent.step()
        later = []
        for _ in range(3):
            time.sleep(0.02)  # the step's own compute
            later.append(agent.step())
    assert 0.2 <= first.compute_s < 0.6  # not 0.8: spared
    assert min(r.compute_s for r in later) >= 0.08  # 0.02 s of work, four times
    metrics = read_topic(
        agent_settings, "worker", "metrics", lambda f: sum(m.step_count for m in f) >= 4
    )
    assert max(m.compute.max_s for m in metrics if m.step_count) >= 0.2  # reported as booked


def test_an_action_taken_over_reaches_its_handler_at_once_and_is_acknowledged_by_it(agent_settings):
    held = []
    with Agent("job-agent", "w1", settings=agent_settings, batch_size=32) as agent:
        agent.handle(CommandAction.ADJUST_BATCH_SIZE, held.append)
        command = send_command(agent_settings, batch_size=12, effective_step=500)
        wait_until(lambda: agent._inbox, timeout_s=20.0, pause_s=0.001)
        agent.step()
        # at step 1, not 500: the handler decides when
        assert held == [command] and agent.batch_size == 32
        agent.acknowledge(held[0], AckStatus.APPLIED, "agreed", 7)
    acks = acks_for(agent_settings, command.command_id, AckStatus.APPLIED)
    assert (acks[-1].status, acks[-1].applied_step, acks[-1].reason) == (
        AckStatus.APPLIED,
        7,
        "agreed",
    )


@pytest.mark.parametrize(("rank", "slowed"), [(0, False), (2, True), (None, False)])
def test_a_slowdown_for_some_ranks_slows_those_only(rank, slowed):
    from antdt.worker.agent import _make_injector

    injector = _make_injector(load_settings(slowdown="3", slowdown_ranks="2,5"), rank)
    try:
        assert (injector is not None) is slowed
    finally:
        if injector is not None:
            injector.close()


class RecordingCommitter:
    """Stands in for the sharder's committer: what would be sent, and at which step."""

    def __init__(self):
        self.sent: list[tuple[list, int | None]] = []

    def record(self, tags, step=None) -> int:
        self.sent.append((list(tags), step))
        return len(self.sent[-1][0])


def test_with_a_commit_interval_trained_samples_go_together_and_all_before_leaving(agent_settings):
    from antdt.worker.provenance import SampleTag, Tagged

    committer = RecordingCommitter()
    with Agent("job-agent", "w1", settings=agent_settings, listen_for_commands=False) as agent:
        agent._committer = committer
        agent.commit_every_s = 3600.0
        for index in range(3):
            agent.untag(Tagged((index, index), (SampleTag(0, index, 7, 1, "w1"),)))
            agent.step(samples=1)
        assert committer.sent == []  # held: the interval has not passed
        agent.untag(Tagged((3, 3), (SampleTag(0, 3, 7, 1, "w1"),)))
        agent.step(samples=1)
        agent.commit_trained()
        assert [tag.index for tag in committer.sent[0][0]] == [0, 1, 2, 3]
        agent.untag(Tagged((4, 4), (SampleTag(0, 4, 7, 1, "w1"),)))
        agent.step(samples=1)
    assert [tag.index for tag in committer.sent[1][0]] == [4]  # sent on the way out
