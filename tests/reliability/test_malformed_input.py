"""Malformed input: every consumer keeps running, and every bad record is dead-lettered once, with
its provenance.

Property tests (no Kafka) check the classification: whatever bytes arrive,
the codec answers with a message or a CodecError and nothing else, and a
reader dead-letters each unusable record exactly once, with its provenance
and counted. End-to-end tests then send, to every topic a service or the
agent consumes, a fixed hypothesis-generated batch plus hand-written records
that decode but mean nothing (and a few odd but legitimate ones) through the
embedded broker, to the consumer running as it is deployed, and check that
it still does its job, that the dead-letter topic holds exactly the bad
records with the right provenance and reason, and that its counter says so.
Valid messages with extreme values are in ``test_extreme_values``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from antdt.bus.deadletter import (
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_SERVICE,
    HEADER_TOPIC,
    DeadLetter,
)
from antdt.bus.readers import decode_or_deadletter
from antdt.control.signing import sign
from antdt.errors import AntdtError
from antdt.loadgen.traces import TraceSlowdown, TraceSpec, generate
from antdt.runtime.launch import service_process
from antdt.schemas import examples
from antdt.schemas.models import (
    MESSAGE_TYPES,
    AvroModel,
    CommandAction,
    ControlComponent,
    ControlConfig,
    DatasetSpec,
    MitigationCommand,
    ProgressKind,
    ShardProgress,
    WorkerMetrics,
)
from antdt.schemas.types import utc_now
from antdt.topics import worker_key
from antdt.worker import Agent
from antdt.worker.shard_client import ShardClient
from tests.reliability.agents import signed_settings, step_until
from tests.reliability.bus import (
    Record,
    assert_dead_lettered_exactly,
    assert_service_dead_lettered,
    dead_letters,
    read_until,
    send,
)
from tests.reliability.fuzz import CODEC, damaged, draw_batch, framed, garbage
from tests.services.controller.helpers import verdict

APPLIED = 'antdt_{}_config_changes_total{{result="applied"}}'
PROPERTY = hypothesis_settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ---------------------------------------------------------------- classification (no Kafka)


@PROPERTY
@given(
    st.one_of(
        st.binary(max_size=400),
        *(framed(m) for m in MESSAGE_TYPES),
        *(damaged(e) for e in examples.all_examples()),
    )
)
def test_the_codec_answers_any_bytes_with_a_message_or_a_codec_error(data):
    try:
        assert isinstance(CODEC.decode(data), AvroModel)
    except AntdtError:
        pass


class StubMessage:
    """What decode_or_deadletter reads of a ``confluent_kafka.Message``."""

    def __init__(self, value: bytes, offset: int):
        self._value, self._offset = value, offset

    def topic(self):
        return "t.worker.metrics"

    def partition(self):
        return 4

    def offset(self):
        return self._offset

    def key(self):
        return b"job"

    def value(self):
        return self._value

    def headers(self):
        return [("trace", b"x")]

    def error(self):
        return None


class RecordingSink:
    def __init__(self):
        self.records = []

    def produce(self, topic, key=None, value=None, headers=None):
        self.records.append((topic, key, value, dict(headers)))

    def poll(self, timeout=0):
        return 0


class Tally:
    def __init__(self):
        self.value = 0

    def inc(self, amount=1):
        self.value += amount


@PROPERTY
@given(data=garbage(examples.worker_metrics()), offset=st.integers(0, 2**40))
def test_a_reader_dead_letters_each_unusable_record_once_with_its_provenance(data, offset):
    sink, tally = RecordingSink(), Tally()
    deadletter = DeadLetter(sink, "t.deadletter", "monitor", counter=tally)
    assert (
        decode_or_deadletter(StubMessage(data, offset), CODEC, deadletter, expected=WorkerMetrics)
        is None
    )
    [(topic, key, value, headers)] = sink.records
    assert (topic, key, value) == ("t.deadletter", b"job", data)
    assert headers[HEADER_TOPIC] == b"t.worker.metrics" and headers[HEADER_PARTITION] == b"4"
    assert headers[HEADER_OFFSET] == str(offset).encode() and headers[HEADER_SERVICE] == b"monitor"
    assert headers["trace"] == b"x" and deadletter.count == tally.value == 1


def test_a_message_of_another_type_is_unusable_too():
    sink = RecordingSink()
    message = StubMessage(CODEC.encode(examples.control_config()), 9)
    assert (
        decode_or_deadletter(
            message, CODEC, DeadLetter(sink, "t.deadletter", "x"), expected=WorkerMetrics
        )
        is None
    )
    assert b"expected WorkerMetrics" in sink.records[0][3]["antdt.error"]


# ---------------------------------------------------------------- end to end, through the broker

FUZZED_PER_TOPIC = 30
SIGNING_KEY = b"reliability-signing-key-0123456789abcdef"


def fuzzed(topic: str, key: bytes, example: AvroModel) -> list[Record]:
    """A fixed batch of hypothesis-generated bytes for ``topic`` (the same on every run)."""
    return [Record(topic, key, value) for value in draw_batch(garbage(example), FUZZED_PER_TOPIC)]


def encoded(message: AvroModel) -> bytes:
    """The encoding of a message, checked or not: ``model_copy(update=...)`` skips validation, so
    this writes schema-valid records that the models refuse (negative counts, windows ending before
    they start)."""
    return CODEC.encode(message)


def spec(size=100, shard_size=10, epochs=1) -> DatasetSpec:
    return DatasetSpec(
        name="m",
        size=size,
        shard_size=shard_size,
        epochs=epochs,
        shuffle_seed=1,
        max_attempts=3,
        lease_s=60.0,
    )


def progress(job: str, worker: str, kind: ProgressKind, **fields) -> ShardProgress:
    return ShardProgress(
        job_id=job,
        worker_id=worker,
        incarnation="i",
        seq=fields.pop("seq", 999),
        kind=kind,
        epoch=fields.pop("epoch", 0),
        timestamp=utc_now(),
        **fields,
    )


def decoded(messages) -> list:
    return [CODEC.decode(m.value()) for m in messages if m.value()]


def late(report: WorkerMetrics, seconds: float) -> WorkerMetrics:
    """The report moved ``seconds`` later (its window kept)."""
    shift = timedelta(seconds=seconds)
    return report.model_copy(
        update={
            "window_start": report.window_start + shift,
            "window_end": report.window_end + shift,
        }
    )


def control_garbage(settings) -> list[Record]:
    """Fuzzed control records that do not decode: followed by every service and, arriving while it
    runs, dead-lettered by each (see antdt.control.topic)."""
    topic = settings.topic("control", "config")
    values = draw_batch(garbage(examples.control_config()), FUZZED_PER_TOPIC)
    return [
        Record(topic, b"*", value, "refused control record: unusable")
        for value in values
        if not decodes(value)
    ]


def decodes(value: bytes | None) -> bool:
    try:
        CODEC.decode(value or b"")
    except AntdtError:
        return False
    return True


def control_change(settings, component: ControlComponent, changes: dict[str, str]) -> Record:
    change = ControlConfig(
        config_id=f"cfg-{time.time_ns()}",
        job_id=None,
        component=component,
        changes=changes,
        issued_by="test",
        issued_at=datetime.now(UTC),
    )
    return Record(settings.topic("control", "config"), b"*", encoded(change), None)


def command(job: str, worker: str, **fields) -> MitigationCommand:
    now = utc_now()
    values = dict(
        command_id=f"c-{time.time_ns()}",
        job_id=job,
        target_worker=worker,
        action=CommandAction.SET_SHARD_QUOTA,
        shard_quota=5,
        reason="test",
        evidence=[],
        policy="test",
        issued_at=now,
        expires_at=now + timedelta(minutes=5),
        controller_epoch=1,
    )
    return sign(MitigationCommand(**{**values, **fields}), SIGNING_KEY)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_sharder_dead_letters_bad_reports_and_keeps_granting(settings, topics, tmp_path):
    job, dataset = "job-m", spec()
    progress_topic, lifecycle_topic = (
        settings.topic("shard", "progress"),
        settings.topic("worker", "lifecycle"),
    )
    key = job.encode()
    with (
        service_process(settings, "sharder", log_dir=tmp_path) as sharder,
        ShardClient(settings, job, "w0", dataset) as w0,
    ):
        sharder.wait_ready()
        held = w0.request(0, quota=2).shards  # w0 defines the dataset: 10 shards
        lifecycle = examples.worker_lifecycle().model_copy(update={"job_id": job})
        records = [
            *fuzzed(progress_topic, key, examples.shard_progress()),
            *fuzzed(lifecycle_topic, key, examples.worker_lifecycle()),
            # meaningless, though they decode
            Record(
                progress_topic,
                key,
                encoded(progress(job, "w0", ProgressKind.DONE, shard_id=10, attempt=0)),
                "does not exist",
            ),
            Record(
                progress_topic,
                key,
                encoded(progress(job, "w0", ProgressKind.STARTED, shard_id=2**40)),
                "does not exist",
            ),
            Record(
                progress_topic,
                key,
                encoded(progress(job, "w9", ProgressKind.REQUESTED, dataset=spec(size=999))),
                "is sharded as",
            ),
            Record(
                progress_topic,
                key,
                encoded(progress(job, "w0", ProgressKind.REWIND, version=10**9)),
                "does not exist",
            ),
            Record(
                progress_topic,
                b"job-new",
                encoded(progress("job-new", "w0", ProgressKind.REWIND, version=1)),
                "no dataset yet",
            ),
            Record(
                progress_topic,
                b"job-huge",
                encoded(
                    progress(
                        "job-huge",
                        "w0",
                        ProgressKind.REQUESTED,
                        dataset=spec(size=10**7, shard_size=1),
                    )
                ),
                "more than",
            ),
            Record(
                progress_topic,
                b"job-other",
                encoded(progress(job, "w0", ProgressKind.REQUESTED)),
                "belongs under",
            ),
            Record(
                progress_topic, None, encoded(progress(job, "w0", ProgressKind.REQUESTED)), "no key"
            ),
            Record(
                progress_topic,
                key,
                encoded(
                    progress(job, "w0", ProgressKind.REQUESTED).model_copy(update={"epoch": -1})
                ),
                "epoch",
            ),
            Record(
                progress_topic,
                key,
                encoded(
                    progress(job, "w0", ProgressKind.REQUESTED).model_copy(update={"shard_id": 3})
                ),
                "shard_id must be set",
            ),
            Record(
                progress_topic,
                key,
                encoded(examples.worker_metrics()),
                "expected ShardProgress or WorkerLifecycle",
            ),
            Record(progress_topic, key, None, "no value"),
            Record(lifecycle_topic, b"nope", encoded(lifecycle), "belongs under"),
            Record(lifecycle_topic, key, encoded(lifecycle.model_copy(update={"pid": -4})), "pid"),
            # normal operation, however odd: never dead-lettered
            Record(
                progress_topic,
                key,
                encoded(progress(job, "w1", ProgressKind.DONE, shard_id=held[0].shard_id)),
                None,
            ),
            Record(
                progress_topic,
                key,
                encoded(
                    progress(
                        job,
                        "w0",
                        ProgressKind.DONE,
                        shard_id=held[0].shard_id,
                        attempt=held[0].attempt + 5,
                    )
                ),
                None,
            ),
            Record(
                progress_topic,
                key,
                encoded(progress(job, "w0", ProgressKind.REQUESTED, epoch=7)),
                None,
            ),
            Record(
                lifecycle_topic,
                key,
                encoded(lifecycle.model_copy(update={"worker_id": "never-seen"})),
                None,
            ),
        ]
        sent = send(settings, records)
        bad = sum(r.because is not None for r in records)

        sharder.wait_until(
            lambda: sharder.metric("antdt_sharder_deadlettered_total") == bad,
            "every bad record counted",
        )
        with ShardClient(settings, job, "w1", dataset) as w1:
            assert w1.request(0, quota=2).shards  # still granting...
        assert w0.request(0, quota=2).shards == held  # ...and what w0 held is untouched
        assert sharder.is_ready()
        assert_dead_lettered_exactly(dead_letters(settings, bad), sent, "sharder")
        assert sharder.metric("antdt_sharder_deadlettered_total") == bad
    print(
        f"sharder: {2 * FUZZED_PER_TOPIC} fuzzed + "
        f"{bad - 2 * FUZZED_PER_TOPIC} meaningless records dead-lettered"
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_the_monitor_dead_letters_bad_reports_and_keeps_judging(settings, topics, tmp_path):
    metrics_topic, verdicts_topic = (
        settings.topic("worker", "metrics"),
        settings.topic("monitor", "verdicts"),
    )
    job = "job-m"
    trace = generate(
        TraceSpec(workers=4, seconds=30, episodes=[TraceSlowdown("w3", 10, 30, 2.0)], job_id=job),
        seed=1,
    )
    before = [r for r in trace if r.window_end <= trace[0].window_end + timedelta(seconds=5)]
    after = trace[len(before) :]
    good = examples.worker_metrics().model_copy(
        update={
            "job_id": job,
            "window_start": before[-1].window_start,
            "window_end": before[-1].window_end,
            "seq": 10**6,
        }
    )
    key = job.encode()
    stats = good.compute
    records = [
        *fuzzed(metrics_topic, key, examples.worker_metrics()),
        Record(
            metrics_topic,
            key,
            encoded(good.model_copy(update={"compute": stats.model_copy(update={"sum_s": -1.0})})),
            "compute.sum_s",
        ),
        Record(
            metrics_topic,
            key,
            encoded(good.model_copy(update={"data_wait_s": float("nan")})),
            "data_wait_s",
        ),
        Record(
            metrics_topic,
            key,
            encoded(
                good.model_copy(update={"window_start": good.window_end + timedelta(seconds=1)})
            ),
            "window_end is before window_start",
        ),
        Record(
            metrics_topic,
            key,
            encoded(good.model_copy(update={"first_step": None})),
            "first_step and last_step",
        ),
        Record(
            metrics_topic,
            key,
            encoded(good.model_copy(update={"compute": stats.model_copy(update={"sum_s": 1e7})})),
            "in one report",
        ),
        Record(
            metrics_topic, key, encoded(late(good, 2 * 3600)), "after job job-m's latest report"
        ),
        Record(metrics_topic, key, encoded(late(good, 300 * 365 * 86400)), "is outside"),
        Record(metrics_topic, b"job-other", encoded(good), "belongs under"),
        Record(metrics_topic, key, encoded(examples.control_config()), "expected WorkerMetrics"),
        Record(metrics_topic, key, None, "no value"),
    ]
    with service_process(settings, "monitor", log_dir=tmp_path) as monitor:
        monitor.wait_ready()
        sent = send(settings, [Record(metrics_topic, key, encoded(r), None) for r in before])
        monitor.wait_until(
            lambda: monitor.metric("antdt_monitor_reports_total") == len(before),
            "the job's clock is set",
        )
        fuzzed_control = control_garbage(settings)
        sent += send(settings, [*records, *fuzzed_control])
        sent += send(
            settings, [control_change(settings, ControlComponent.MONITOR, {"monitor.k": "2"})]
        )
        sent += send(settings, [Record(metrics_topic, key, encoded(r), None) for r in after])

        found = read_until(
            settings, verdicts_topic, topics[verdicts_topic], lambda rs: any(decoded(rs))
        )
        assert decoded(found)[0].worker_id == "w3"  # judged after the bad records
        monitor.wait_until(
            lambda: monitor.metric(APPLIED.format("monitor")) == 1,
            "a valid control change still applies",
        )
        bad = len(records) + len(fuzzed_control)
        assert_service_dead_lettered(monitor, "monitor", settings, sent, bad)
    print(
        f"monitor: {FUZZED_PER_TOPIC} fuzzed + "
        f"{len(records) - FUZZED_PER_TOPIC} meaningless metrics and "
        f"{len(fuzzed_control)} fuzzed control records dead-lettered"
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_the_controller_dead_letters_bad_verdicts_and_reports_and_keeps_deciding(
    settings, topics, tmp_path
):
    verdicts_topic, metrics_topic = (
        settings.topic("monitor", "verdicts"),
        settings.topic("worker", "metrics"),
    )
    commands_topic = settings.topic("controller", "commands")
    job = "job-c"
    key = job.encode()
    good = verdict("w1", job=job)
    report = examples.worker_metrics().model_copy(update={"job_id": job})
    records = [
        *fuzzed(verdicts_topic, key, examples.straggler_verdict()),
        *fuzzed(metrics_topic, key, examples.worker_metrics()),
        Record(
            verdicts_topic,
            key,
            encoded(good.model_copy(update={"individual_score": -1.0})),
            "individual_score",
        ),
        Record(
            verdicts_topic,
            key,
            encoded(good.model_copy(update={"relative_score": float("nan")})),
            "relative_score",
        ),
        Record(
            verdicts_topic,
            key,
            encoded(
                good.model_copy(
                    update={
                        "window": good.window.model_copy(
                            update={"start": good.window.end + timedelta(seconds=1)}
                        )
                    }
                )
            ),
            "window end is before its start",
        ),
        Record(
            verdicts_topic,
            key,
            encoded(examples.mitigation_command()),
            "expected StragglerVerdict or WorkerMetrics",
        ),
        Record(verdicts_topic, key, None, "no value"),
        Record(
            metrics_topic,
            key,
            encoded(report.model_copy(update={"data_wait_s": -0.5})),
            "data_wait_s",
        ),
        Record(
            metrics_topic,
            key,
            encoded(report.model_copy(update={"step_count": 10**6})),
            "step range is shorter",
        ),
        # normal operation: a verdict about a worker the controller has no report of, and one seen
        # twice
        Record(verdicts_topic, key, encoded(verdict("never-reported", job=job, t=1)), None),
        Record(verdicts_topic, key, encoded(verdict("never-reported", job=job, t=1)), None),
    ]
    with service_process(settings, "controller", log_dir=tmp_path) as controller:
        controller.wait_ready()  # reads from the end of its input: everything below is new to it
        fuzzed_control = control_garbage(settings)
        sent = send(settings, [*records, *fuzzed_control])
        sent += send(
            settings,
            [
                control_change(
                    settings, ControlComponent.CONTROLLER, {"controller.dry_run": "false"}
                )
            ],
        )
        sent += send(settings, [Record(verdicts_topic, key, encoded(good), None)])

        found = read_until(
            settings,
            commands_topic,
            topics[commands_topic],
            lambda ms: any(c.verdict_id == good.verdict_id for c in decoded(ms)),
        )
        assert [c.target_worker for c in decoded(found) if c.verdict_id == good.verdict_id] == [
            "w1"
        ]
        controller.wait_until(
            lambda: controller.metric(APPLIED.format("controller")) == 1,
            "a valid control change applies",
        )
        bad = sum(r.because is not None for r in records) + len(fuzzed_control)
        assert_service_dead_lettered(controller, "controller", settings, sent, bad)
    print(
        f"controller: {2 * FUZZED_PER_TOPIC} fuzzed + "
        f"{bad - 2 * FUZZED_PER_TOPIC - len(fuzzed_control)} meaningless records and "
        f"{len(fuzzed_control)} fuzzed control records dead-lettered"
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_the_agent_dead_letters_what_is_no_command_and_keeps_obeying(settings, topics):
    signed = signed_settings(settings, SIGNING_KEY)
    topic, key = signed.topic("controller", "commands"), worker_key("job-g", "w1").encode()
    valid = command("job-g", "w1")
    records = [
        *fuzzed(topic, key, examples.mitigation_command()),
        Record(topic, key, encoded(examples.shard_assignment()), "expected MitigationCommand"),
        Record(
            topic,
            key,
            encoded(
                valid.model_copy(update={"expires_at": valid.issued_at - timedelta(seconds=1)})
            ),
            "expires_at is before issued_at",
        ),
        Record(topic, key, None, "no value"),
        # refused, acknowledged and counted by the verifier: not dead letters
        Record(topic, key, encoded(command("job-g", "w2")), None),
        Record(topic, key, encoded(command("job-other", "w1")), None),
        # another worker's command on the same partition: not ours to judge
        Record(topic, worker_key("job-g", "w2").encode(), encoded(command("job-g", "w2")), None),
    ]
    with Agent("job-g", "w1", settings=signed, shard_quota=2) as agent:
        sent = send(signed, records)
        sent += send(signed, [Record(topic, key, encoded(valid), None)])
        step_until(agent, lambda: agent.shard_quota == 5)  # the valid command after them is applied
        bad = sum(r.because is not None for r in records)
        step_until(agent, lambda: agent.deadlettered == bad)
        assert agent.verifier.rejected["wrong target"] == 2
    assert_dead_lettered_exactly(dead_letters(signed, bad), sent, "agent")
    print(
        f"agent commands: {FUZZED_PER_TOPIC} fuzzed + "
        f"{bad - FUZZED_PER_TOPIC} meaningless records dead-lettered"
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_the_shard_client_dead_letters_what_is_no_answer_and_takes_the_real_one(settings, topics):
    topic, key = settings.topic("shard", "assignments"), worker_key("job-s", "w1").encode()
    with ShardClient(settings, "job-s", "w1", spec()) as client:
        seq = client.ask(0)
        answer = examples.shard_assignment().model_copy(
            update={"job_id": "job-s", "worker_id": "w1", "in_reply_to": seq}
        )
        records = [
            *fuzzed(topic, key, examples.shard_assignment()),
            Record(topic, key, encoded(examples.mitigation_command()), "expected ShardAssignment"),
            Record(
                topic,
                key,
                encoded(answer.model_copy(update={"worker_id": "w2"})),
                "assignment for job-s/w2",
            ),
            Record(
                topic,
                key,
                encoded(answer.model_copy(update={"job_id": "job-x"})),
                "assignment for job-x/w1",
            ),
            Record(
                topic, key, encoded(answer.model_copy(update={"shards": []})), "must list shards"
            ),
            Record(topic, key, None, "no value"),
            # to another request
            Record(topic, key, encoded(answer.model_copy(update={"in_reply_to": seq + 100})), None),
        ]
        sent = send(settings, [*records, Record(topic, key, encoded(answer), None)])
        assert client.wait_answer(seq, timeout_s=20) == answer
        bad = sum(r.because is not None for r in records)
        assert client.deadlettered == bad
    assert_dead_lettered_exactly(dead_letters(settings, bad), sent, "agent")
    print(
        f"agent assignments: {FUZZED_PER_TOPIC} fuzzed + "
        f"{bad - FUZZED_PER_TOPIC} meaningless records dead-lettered"
    )
