"""Hypothesis strategies for malformed input, and a way to draw a fixed batch of it.

Two kinds of bad record:

* bytes no codec accepts: arbitrary bytes, a valid single-object header of
  the topic's schema followed by arbitrary bytes, and valid encodings with a
  byte changed or cut short (filtered to those the codec refuses, so every
  record drawn is bad, whatever the seed);
* messages that decode but mean nothing (built in the tests by hand).

Plus strategies for *valid* messages with extreme values, to check that
what the models accept the services can process.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from antdt.errors import AntdtError
from antdt.schemas.codec import SINGLE_OBJECT_MARKER, SingleObjectCodec
from antdt.schemas.models import (
    SHARD_PROGRESS_KINDS,
    AvroModel,
    DatasetSpec,
    ProgressKind,
    ResourceSnapshot,
    ShardCommit,
    ShardProgress,
    StepTimeStats,
    StragglerClass,
    StragglerVerdict,
    VerdictKind,
    VerdictWindow,
    WorkerMetrics,
)
from antdt.schemas.store import default_store

CODEC = SingleObjectCodec()
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def refused(data: bytes) -> bool:
    """True if the codec refuses ``data`` (what every service checks first)."""
    try:
        CODEC.decode(data)
    except AntdtError:
        return True
    return False


def framed(model: type[AvroModel]) -> st.SearchStrategy[bytes]:
    """A correct single-object header for ``model``'s schema, then anything."""
    header = SINGLE_OBJECT_MARKER + default_store().current(model.avro_name).fingerprint
    return st.binary(max_size=300).map(lambda body: header + body)


FIXED_TIME = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def frozen(example: AvroModel) -> AvroModel:
    """``example`` with every timestamp set to one fixed time, so its encoding is the same on every
    run."""

    def fix(value):
        if isinstance(value, datetime):
            return FIXED_TIME
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    return type(example).model_validate(fix(example.model_dump()))


def damaged(example: AvroModel) -> st.SearchStrategy[bytes]:
    """A valid encoding of ``example`` with one byte changed, or cut short."""
    data = CODEC.encode(frozen(example))
    flipped = st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)).map(
        lambda change: (
            data[: change[0]] + bytes([data[change[0]] ^ change[1]]) + data[change[0] + 1 :]
        )
    )
    cut = st.integers(0, len(data) - 1).map(lambda length: data[:length])
    return st.one_of(flipped, cut)


def garbage(example: AvroModel) -> st.SearchStrategy[bytes]:
    """Bytes the codec refuses, aimed at the topic that carries ``example``'s type."""
    return st.one_of(st.binary(max_size=300), framed(type(example)), damaged(example)).filter(
        refused
    )


def draw_batch(strategy: st.SearchStrategy, count: int) -> list:
    """``count`` values of ``strategy``, the same on every run (derandomized), without shrinking.

    ``.example()`` is meant for the REPL; this runs the strategy the way a
    test does and keeps what it generated.
    """
    drawn: list = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value) -> None:
        drawn.append(value)

    collect()
    return drawn[:count]


# ---------------------------------------------------------------- valid messages with extreme
# values


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
small_names = st.sampled_from(["w0", "w1", "w2", "w3"])
counts32 = st.one_of(st.integers(0, 50), st.integers(0, INT32_MAX))
counts64 = st.one_of(st.integers(0, 50), st.integers(0, INT64_MAX))
seconds = st.one_of(
    st.floats(0, 10, allow_nan=False), st.floats(0, 1e300, allow_nan=False, allow_infinity=False)
)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)


@st.composite
def dataset_specs(draw) -> DatasetSpec:
    return DatasetSpec(
        name=draw(names),
        size=draw(st.one_of(st.integers(1, 500), st.integers(1, INT64_MAX))),
        shard_size=draw(st.one_of(st.integers(1, 50), st.integers(1, INT64_MAX))),
        epochs=draw(st.one_of(st.integers(1, 3), st.integers(1, INT32_MAX))),
        shuffle_seed=draw(st.integers(-(2**63), INT64_MAX)),
        max_attempts=draw(st.integers(1, INT32_MAX)),
        lease_s=draw(st.floats(1e-9, 1e300, allow_nan=False, allow_infinity=False)),
    )


@st.composite
def shard_reports(draw, job_id: str) -> ShardProgress:
    """Any report the model accepts: shard ids, epochs, attempts, versions anywhere in their
    range."""
    kind = draw(st.sampled_from(ProgressKind))
    return ShardProgress(
        job_id=job_id,
        worker_id=draw(small_names),
        incarnation="i",
        seq=draw(counts64),
        kind=kind,
        epoch=draw(st.one_of(st.integers(0, 3), counts32)),
        shard_id=draw(st.one_of(st.integers(0, 60), counts64))
        if kind in SHARD_PROGRESS_KINDS
        else None,
        step=draw(st.none() | counts64),
        error=draw(st.none() | st.text(max_size=20)),
        attempt=draw(st.none() | st.integers(0, 5) | counts32),
        quota=draw(st.none() | st.integers(0, 5) | counts32),
        dataset=draw(st.none() | dataset_specs()),
        version=draw(st.one_of(st.integers(0, 40), counts64))
        if kind is ProgressKind.REWIND
        else None,
        commits=draw(st.lists(shard_commits(), min_size=1, max_size=3))
        if kind is ProgressKind.COMMIT
        else [],
        update_id=draw(st.none() | names) if kind is ProgressKind.COMMIT else None,
        read_shards=draw(st.lists(st.one_of(st.integers(0, 60), counts64), max_size=3))
        if kind is ProgressKind.REQUESTED
        else [],
        timestamp=draw(times),
    )


@st.composite
def shard_commits(draw) -> ShardCommit:
    return ShardCommit(
        holder=draw(st.none() | small_names),
        shard_id=draw(st.one_of(st.integers(0, 60), counts64)),
        attempt=draw(st.one_of(st.integers(0, 5), counts32)),
        samples=draw(st.lists(st.one_of(st.integers(0, 600), counts64), min_size=1, max_size=4)),
    )


#: Durations a timer can measure, up to what the monitor accepts in a report (1e6 s). Zero and
#: sub-nanosecond times are left out: the detector divides by them (see the xfail tests).
judged_seconds = st.one_of(st.floats(1e-9, 1e-6), st.floats(1e-9, 10), st.floats(1e-9, 1e6))


@st.composite
def step_stats(draw, durations: st.SearchStrategy[float] = seconds) -> StepTimeStats:
    low, p50, p90, high = sorted(draw(st.lists(durations, min_size=4, max_size=4)))
    return StepTimeStats(sum_s=draw(durations), min_s=low, max_s=high, p50_s=p50, p90_s=p90)


#: Window starts a minute apart at most: a job's reports close enough in time for the detector to
#: judge them.
close_times = st.integers(0, 60_000).map(
    lambda ms: datetime(2026, 11, 21, tzinfo=UTC) + timedelta(milliseconds=ms)
)


@st.composite
def worker_reports(
    draw,
    job_id: str,
    starts: st.SearchStrategy[datetime] = times,
    durations: st.SearchStrategy[float] = seconds,
) -> WorkerMetrics:
    """Any WorkerMetrics the model accepts, from a few workers of one job."""
    start = draw(starts)
    steps = draw(st.one_of(st.integers(0, 20), counts32))
    first = draw(counts64.filter(lambda f: f <= INT64_MAX - steps)) if steps else None
    resources = ResourceSnapshot(
        **{
            name: draw(seconds)
            for name in (
                "process_cpu_percent",
                "host_cpu_percent",
                "cpu_steal_percent",
                "load_1m",
                "host_memory_percent",
            )
        },
        **{
            name: draw(counts64)
            for name in (
                "rss_bytes",
                "io_read_bytes",
                "io_write_bytes",
                "net_sent_bytes",
                "net_recv_bytes",
            )
        },
    )
    return WorkerMetrics(
        job_id=job_id,
        worker_id=draw(small_names),
        seq=draw(counts64),
        incarnation=draw(st.sampled_from(["a", "b"])),
        window_start=start,
        window_end=start + timedelta(seconds=draw(st.floats(0, 3600) | st.floats(0, 2))),
        step_count=steps,
        first_step=first,
        last_step=None if first is None else first + steps - 1,
        compute=draw(step_stats(durations)),
        data_wait_s=draw(durations),
        sync_wait_s=draw(durations),
        samples=draw(counts64),
        local_batch_size=draw(counts32),
        resources=resources,
    )


@st.composite
def verdicts(draw, job_id: str) -> StragglerVerdict:
    """Any StragglerVerdict the model accepts, about a few workers of one job."""
    end = draw(times)
    kind = draw(st.sampled_from(VerdictKind))
    finite = st.floats(allow_nan=False, allow_infinity=False)
    return StragglerVerdict(
        verdict_id=draw(names),
        job_id=job_id,
        worker_id=draw(small_names),
        node_id=draw(st.none() | names),
        kind=kind,
        classification=StragglerClass.NONE
        if kind is VerdictKind.CLEARED
        else draw(st.sampled_from(StragglerClass)),
        relative_score=draw(finite),
        individual_score=draw(seconds),
        speed_ratio=draw(seconds),
        window=VerdictWindow(start=end - timedelta(seconds=10), end=end, reports=draw(counts32)),
        episode_start=draw(st.none() | st.just(end - timedelta(seconds=40))),
        evidence=[],
        issued_at=end,
    )


@st.composite
def job_traces(draw, job_id: str) -> list[WorkerMetrics]:
    """Four workers reporting every second, with any values the model accepts in each report.

    Reports in a realistic rhythm, so that the detector builds baselines
    and judges workers on extreme figures (zero samples, huge times).
    """
    base = datetime(2026, 11, 21, tzinfo=UTC)
    reports = []
    for second in range(1, draw(st.integers(3, 12)) + 1):
        for worker in ("w0", "w1", "w2", "w3"):
            report = draw(
                worker_reports(
                    job_id, st.just(base + timedelta(seconds=second - 1)), judged_seconds
                )
            )
            reports.append(
                report.model_copy(
                    update={
                        "worker_id": worker,
                        "seq": second,
                        "incarnation": "a",
                        "window_end": base + timedelta(seconds=second),
                    }
                )
            )
    return reports
