"""Replaying a job's shard log from the embedded broker, by time window, and the replay/audit
commands."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from datetime import datetime

import fastavro
import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from antdt.bus.clients import make_producer
from antdt.bus.murmur2 import partition_for
from antdt.cli.main import run
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import ShardLogEvent
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder import replay
from antdt.services.sharder.eventlog import LogWriter, log_topic
from antdt.services.sharder.replay import StartPoint, export_avro, find_start, replay_events
from antdt.services.sharder.state import from_ms, to_ms
from antdt.settings import Settings
from antdt.topics import topic_spec
from tests.services.sharder.helpers import JOB
from tests.services.sharder.test_audit import clean_job, first, renumbered

PARTITIONS = topic_spec("shard", "log").partitions
#: A second job in the same partition, so that replays must skip another job's records.
NEIGHBOUR = next(
    j
    for j in (f"neighbour-{i}" for i in itertools.count())
    if partition_for(j, PARTITIONS) == partition_for(JOB, PARTITIONS)
)
CODEC = SingleObjectCodec()


@dataclass
class Written:
    """What a test appended: the job's log in two batches, and the first instant of the second
    batch."""

    settings: Settings
    log: list[ShardLogEvent]
    early: list[ShardLogEvent]
    late: list[ShardLogEvent]
    boundary: datetime


def as_job(events: list[ShardLogEvent], job: str) -> list[ShardLogEvent]:
    return [e.model_copy(update={"job_id": job}) for e in events]


def past_this_millisecond() -> datetime:
    """Wait (less than 1 ms) for the clock to tick, so later records have later timestamps than
    earlier ones."""
    now = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 <= now:
        pass
    return from_ms(now + 1)


def append(settings: Settings, *batches: list[ShardLogEvent]) -> list[datetime]:
    """Append each batch durably; returns the instant each batch started (the clock ticks between
    batches)."""
    writer = LogWriter(make_producer(settings), log_topic(settings), CODEC)
    starts = []
    for batch in batches:
        starts.append(past_this_millisecond())
        writer.append(batch)
        writer.flush()
    return starts


@pytest.fixture
def written(settings: Settings, topics: dict[str, int]) -> Written:
    log = clean_job(epochs=1)
    half = len(log) // 2
    _, boundary = append(settings, log[:half] + as_job(clean_job(epochs=1), NEIGHBOUR), log[half:])
    return Written(settings, log, log[:half], log[half:], boundary)


def replayed(
    settings: Settings, job: str = JOB, start: datetime | None = None, end: datetime | None = None
) -> list:
    return list(replay_events(settings, job, CODEC, start, end))


def true_start(written: Written) -> int:
    """The offset of the first record at or after the boundary (from an unwindowed replay)."""
    return next(
        offset for offset, when, _ in replayed(written.settings) if when >= written.boundary
    )


# ---------------------------------------------------------------- replay


def test_replay_yields_one_job_in_log_order_with_record_times(written):
    rows = replayed(written.settings)
    assert [event for _, _, event in rows] == written.log
    offsets, times = [o for o, _, _ in rows], [t for _, t, _ in rows]
    assert (
        offsets == sorted(offsets)
        and times == sorted(times)
        and all(t.tzinfo is not None for t in times)
    )
    assert all(t < written.boundary for t in times[: len(written.early)])
    assert all(t >= written.boundary for t in times[len(written.early) :])
    assert [e for _, _, e in replayed(written.settings, NEIGHBOUR)] == as_job(
        clean_job(epochs=1), NEIGHBOUR
    )


def test_replay_by_time_window(written):
    settings, boundary = written.settings, written.boundary
    assert [e for _, _, e in replayed(settings, start=boundary)] == written.late
    assert [e for _, _, e in replayed(settings, end=from_ms(to_ms(boundary) - 1))] == written.early
    last = replayed(settings)[-1][1]
    assert [e for _, _, e in replayed(settings, start=boundary, end=last)] == written.late
    assert replayed(settings, start=from_ms(to_ms(last) + 1)) == []


def test_a_broker_answer_that_checks_out_is_used(written, monkeypatch):
    offset = true_start(written)
    monkeypatch.setattr(replay, "broker_offset_for_time", lambda *args: offset)
    topic = log_topic(written.settings)
    start = find_start(
        written.settings, topic, partition_for(JOB, PARTITIONS), to_ms(written.boundary)
    )
    assert start == StartPoint(offset, verified=True)
    seen = []
    original = replay.read_until_marker
    monkeypatch.setattr(
        replay, "read_until_marker", lambda *a, **k: seen.append(a[3]) or original(*a, **k)
    )
    assert [e for _, _, e in replayed(written.settings, start=written.boundary)] == written.late
    assert seen == [offset]  # the replay started at the broker's answer, not at the beginning


@pytest.mark.parametrize("wrong", ["one early", "one late", "zero", "past the end"])
def test_a_wrong_broker_answer_falls_back_to_a_scan(written, monkeypatch, wrong):
    offset = true_start(written)
    bogus = {"one early": offset - 1, "one late": offset + 1, "zero": 0, "past the end": 10**9}[
        wrong
    ]
    monkeypatch.setattr(replay, "broker_offset_for_time", lambda *args: bogus)
    # only "past the end" waits for records that never come
    monkeypatch.setattr(replay, "PROBE_TIMEOUT_S", 0.3)
    topic = log_topic(written.settings)
    assert find_start(
        written.settings, topic, partition_for(JOB, PARTITIONS), to_ms(written.boundary)
    ) == StartPoint(OFFSET_BEGINNING, False)
    assert [e for _, _, e in replayed(written.settings, start=written.boundary)] == written.late


def test_a_failing_offsets_for_times_is_no_answer():
    class Failing:
        def offsets_for_times(self, partitions, timeout):
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    class Unanswered:
        def offsets_for_times(self, partitions, timeout):
            partitions[0].offset = -1
            return partitions

    assert replay.broker_offset_for_time(Failing(), "t", 0, 1) is None
    assert replay.broker_offset_for_time(Unanswered(), "t", 0, 1) is None


def test_export_to_avro_reads_back_with_fastavro(written, tmp_path):
    events = [e for _, _, e in replayed(written.settings)]
    path = tmp_path / "log.avro"
    assert export_avro(events, path) == len(events)
    with open(path, "rb") as stream:
        reader = fastavro.reader(stream)
        assert reader.writer_schema["name"] == "antdt.ShardLogEvent"
        assert [ShardLogEvent.model_validate(record) for record in reader] == events


# ---------------------------------------------------------------- the commands


@pytest.fixture
def cli_env(written, monkeypatch) -> Written:
    settings = written.settings
    monkeypatch.setenv("ANTDT_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("ANTDT_TOPIC_PREFIX", settings.topic_prefix)
    monkeypatch.setenv("ANTDT_BROKER_PROFILE", "embedded")
    return written


def json_lines(text: str) -> list[dict]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def test_replay_command_lists_transitions(cli_env, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich sizes the table to the terminal
    assert run(["replay", "--job", JOB, "--json"]) == 0
    assert [row["seq"] for row in json_lines(capsys.readouterr().out)] == [
        e.seq for e in cli_env.log
    ]
    assert run(["replay", "--job", JOB, "--from", cli_env.boundary.isoformat(), "--json"]) == 0
    assert [row["seq"] for row in json_lines(capsys.readouterr().out)] == [
        e.seq for e in cli_env.late
    ]
    assert run(["replay", "--job", JOB]) == 0
    table = capsys.readouterr().out
    assert "DATASET_DEFINED" in table and "EPOCH_CLOSED" in table and "writer" in table


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--from", "yesterday"], "Invalid value for '--from': expected an ISO-8601 date and time"),
        (["--to", "2026-13-01"], "Invalid value for '--to'"),
        (["--from", "2026-05-02T00:00:00Z", "--to", "2026-05-01T00:00:00Z"], "is after --to"),
    ],
)
def test_replay_command_rejects_bad_times_in_one_line(cli_env, capsys, argv, expected):
    assert run(["replay", "--job", JOB, *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("antdt: error: ") and expected in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_audit_command_passes_a_clean_log_and_exports_it(cli_env, capsys, tmp_path):
    out = tmp_path / "audit.avro"
    assert run(["audit", "--job", JOB, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "audit passed" in captured.out and f"wrote {len(cli_env.log)} events" in captured.err
    with open(out, "rb") as stream:
        assert len(list(fastavro.reader(stream))) == len(cli_env.log)
    assert run(["audit", "--job", JOB, "--json", "--epoch", "0"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert (
        report["ok"]
        and report["finished"]
        and [e["samples_done_once"] for e in report["epochs"]] == [1050]
    )


def test_audit_command_exits_1_on_a_violation(cli_env, capsys):
    log = as_job(clean_job(epochs=1), "tampered")
    done = log[first(log, T.DONE)]
    closing = first(log, T.EPOCH_CLOSED)
    append(
        cli_env.settings,
        renumbered(
            [*log[:closing], done.model_copy(update={"worker_id": "intruder"}), *log[closing:]]
        ),
    )
    assert run(["audit", "--job", "tampered"]) == 1
    out = capsys.readouterr().out
    assert "audit FAILED" in out and f"shard {done.shard_id} DONE twice" in out
    assert run(["audit", "--job", "tampered", "--json"]) == 1
    assert orjson.loads(capsys.readouterr().out)["ok"] is False


def test_audit_command_errors_are_one_line(cli_env, capsys):
    assert run(["audit", "--job", "nobody"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"antdt: error: no events for job nobody in {log_topic(cli_env.settings)}"
    )
    assert run(["audit", "--job", JOB, "--epoch", "4"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "epoch 4 was never opened (opened: 0)" in lines[0]
