"""``antdt controller`` through the real broker: verdict in, signed command out, an agent applies
it; two controllers split the jobs and one takes over the other's with a higher epoch, which fences
the old one; a reconfiguration takes effect without a restart."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import NewTopic

from antdt.bus.clients import consuming, make_admin, producing
from antdt.bus.markers import marker_id
from antdt.bus.murmur2 import partition_for
from antdt.bus.readers import assign_now, poll_batch
from antdt.control.signing import verify
from antdt.errors import ConfigError
from antdt.runtime.launch import service_process
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import (
    AckStatus,
    CommandAction,
    ControlComponent,
    ControlConfig,
    StragglerClass,
    VerdictKind,
)
from antdt.services.controller.core import ControllerCore
from antdt.services.controller.safety import Stamp
from antdt.services.controller.service import ControllerService
from antdt.settings import load_settings
from antdt.topics import worker_key
from antdt.worker import Agent
from tests.services.controller.helpers import verdict
from tests.services.controller.k8s_api import RecordingApiServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = "controller-test-signing-key-0123456789"
CODEC = SingleObjectCodec()
JOB = "job-c"


@pytest.fixture
def signed(settings, topics):
    return load_settings(
        **{
            **settings.model_dump(),
            "signing_key": KEY,
            "report_interval_s": 0.2,
            "heartbeat_interval_s": 0.5,
        }
    )


def send_verdict(settings, worker: str, t: float, job: str = JOB, **kwargs):
    the_verdict = verdict(worker, job=job, **kwargs).model_copy(
        update={"verdict_id": f"{job}:{worker}:{t}:{time.time_ns()}"}
    )
    with producing(settings) as producer:
        producer.produce(
            settings.topic("monitor", "verdicts"), key=job.encode(), value=CODEC.encode(the_verdict)
        )
    return the_verdict


def read_all(settings, topic, partitions, done, timeout_s=30.0):
    found = []
    with consuming(settings) as consumer:
        assign_now(
            consumer, [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        deadline = time.monotonic() + timeout_s
        while not done(found) and time.monotonic() < deadline:
            found += [
                CODEC.decode(m.value())
                for m in poll_batch(consumer, 500, 0.1)
                if marker_id(m) is None
            ]
    assert done(found), f"gave up on {topic} with {len(found)} record(s)"
    return found


def commands_for(settings, topics, verdict_id, want=1):
    topic = settings.topic("controller", "commands")
    found = read_all(
        settings,
        topic,
        topics[topic],
        lambda cs: sum(c.verdict_id == verdict_id for c in cs) >= want,
    )
    return [c for c in found if c.verdict_id == verdict_id]


def ack_of(settings, topics, command_id):
    topic = settings.topic("worker", "acks")
    found = read_all(
        settings, topic, topics[topic], lambda acks: any(a.command_id == command_id for a in acks)
    )
    return next(a for a in found if a.command_id == command_id)


def step_until(agent, condition, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        agent.step()
        time.sleep(0.01)


def test_verdict_to_signed_command_that_an_agent_applies(signed, topics, tmp_path):
    with (
        service_process(signed, "controller", log_dir=tmp_path) as controller,
        Agent(JOB, "w1", settings=signed, shard_quota=2) as agent,
    ):
        controller.wait_ready()
        the_verdict = send_verdict(signed, "w1", 1)
        step_until(agent, lambda: agent.shard_quota == 1)
        [command] = commands_for(signed, topics, the_verdict.verdict_id)
        assert command.action is CommandAction.SET_SHARD_QUOTA and verify(command, KEY.encode())
        assert command.controller_epoch == controller.metric("antdt_controller_epoch") >= 1
        assert ack_of(signed, topics, command.command_id).status is AckStatus.APPLIED


def job_in(partitions: range, count: int) -> str:
    """A job id that hashes into one of ``partitions`` (of ``count``)."""
    return next(
        job for job in (f"job-{n}" for n in range(1000)) if partition_for(job, count) in partitions
    )


def test_two_controllers_split_the_jobs_and_a_survivor_takes_over_with_a_higher_epoch(
    signed, topics, tmp_path
):
    count = topics[signed.topic("monitor", "verdicts")]
    # one job per half
    low, high = job_in(range(count // 2), count), job_in(range(count // 2, count), count)
    with (
        service_process(signed, "controller", log_dir=tmp_path) as first,
        service_process(signed, "controller", log_dir=tmp_path) as second,
        Agent(low, "w1", settings=signed) as low_agent,
        Agent(high, "w1", settings=signed) as high_agent,
    ):
        both = (first, second)
        first.wait_until(
            lambda: [c.metric("antdt_controller_partitions") for c in both] == [count // 2] * 2,
            "the two controllers split the partitions",
        )
        commands = {}
        for job, agent in ((low, low_agent), (high, high_agent)):
            the_verdict = send_verdict(signed, "w1", 1, job=job)
            step_until(agent, lambda agent=agent: agent.shard_quota == 1)
            [commands[job]] = commands_for(signed, topics, the_verdict.verdict_id)
        epochs = {c.metric("antdt_controller_epoch"): c for c in both}
        # each job answered by its owner
        assert commands[low].controller_epoch != commands[high].controller_epoch
        owner = epochs[commands[low].controller_epoch]
        survivor = second if owner is first else first
        owner.process.kill()
        survivor.wait_until(
            lambda: survivor.metric("antdt_controller_partitions") == count,
            "the survivor holds all",
        )
        new_epoch = survivor.metric("antdt_controller_epoch")
        assert new_epoch > max(epochs)

        the_verdict = send_verdict(signed, "w1", 2, job=low, kind=VerdictKind.CLEARED)
        # restored: the survivor recalled the quota of 1
        step_until(low_agent, lambda: low_agent.shard_quota == 2)
        [command] = commands_for(signed, topics, the_verdict.verdict_id)
        assert command.controller_epoch == new_epoch == low_agent.verifier.highest_epoch

        # the dead owner, late
        zombie = ControllerCore(stamp=Stamp(commands[low].controller_epoch, KEY.encode()))
        stale = zombie.on_verdict(verdict("w1", job=low, t=99), datetime.now(UTC))
        with producing(signed) as producer:
            producer.produce(
                signed.topic("controller", "commands"),
                key=worker_key(low, "w1").encode(),
                value=CODEC.encode(stale.commands[0]),
            )
        ack = ack_of(signed, topics, stale.commands[0].command_id)
        assert ack.status is AckStatus.REJECTED and ack.reason.startswith("stale epoch")


def test_dry_run_switched_on_at_run_time(signed, topics, tmp_path):
    with (
        service_process(signed, "controller", log_dir=tmp_path) as controller,
        Agent(JOB, "w1", settings=signed) as agent,
    ):
        controller.wait_ready()
        change = ControlConfig(
            config_id="dry",
            job_id=None,
            component=ControlComponent.CONTROLLER,
            changes={"controller.dry_run": "true"},
            issued_by="test",
            issued_at=datetime.now(UTC),
        )
        with producing(signed) as producer:
            producer.produce(
                signed.topic("control", "config"), key=b"*", value=CODEC.encode(change)
            )
        controller.wait_until(
            lambda: (
                controller.metric('antdt_controller_config_changes_total{result="applied"}') == 1
            ),
            "the change applied",
        )
        the_verdict = send_verdict(signed, "w1", 3)
        [command] = commands_for(signed, topics, the_verdict.verdict_id)
        assert command.dry_run
        assert ack_of(signed, topics, command.command_id).status is AckStatus.IGNORED
        agent.step()
        assert agent.shard_quota == 2  # nothing changed


def test_remediation_on_kubernetes_deletes_the_pod_and_labels_the_node(signed, topics, tmp_path):
    """With ANTDT_K8S_REMEDIATION on, a persistent straggler's node is labelled and its pod
    deleted."""
    api = RecordingApiServer()
    env = {
        "ANTDT_K8S_REMEDIATION": "true",
        "ANTDT_K8S_API_URL": api.url,
        "ANTDT_K8S_NAMESPACE": "training",
        "ANTDT_K8S_SERVICE_ACCOUNT_DIR": str(tmp_path),
    }
    try:
        with service_process(signed, "controller", log_dir=tmp_path, extra_env=env) as controller:
            controller.wait_ready()
            send_verdict(
                signed, "train-1", 3, cls=StragglerClass.PERSISTENT, node="node-7", ratio=4.0
            )
            calls = [(r["method"], r["path"]) for r in api.wait_for(2, timeout_s=30)]
            assert calls == [
                ("PATCH", "/api/v1/nodes/node-7"),
                ("DELETE", "/api/v1/namespaces/training/pods/train-1"),
            ]
            controller.wait_until(
                lambda: (
                    controller.metric(
                        'antdt_controller_k8s_actions_total{action="RESTART",result="done"}'
                    )
                    == 1
                ),
                "the restart is counted",
            )
    finally:
        api.close()


def test_inputs_with_different_partition_counts_are_refused_at_start(settings):
    """A job's verdicts and reports would land on different controllers: say so instead of splitting
    it."""
    verdicts = settings.topic("monitor", "verdicts")
    admin = make_admin(settings)
    admin.create_topics([NewTopic(verdicts, num_partitions=3)])[verdicts].result(timeout=10)
    service = ControllerService(settings)
    with pytest.raises(ConfigError, match="must have as many partitions"):
        service.start()
    service.close()
