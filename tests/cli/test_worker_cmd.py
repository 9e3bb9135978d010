"""``antdt worker``: the example training job end to end, and its argument errors."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from antdt.cli.main import run
from antdt.schemas.models import DatasetSpec
from tests.services.sharder.harness import assert_exactly_once, job_log, running_sharder


def test_bad_slowdown_is_a_one_line_argument_error(capsys):
    assert run(["worker", "--slowdown", "40-10:2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "bad slowdown spec '40-10:2'" in lines[0]


def first_line_of(process: subprocess.Popen, within_s: float) -> str:
    """The first line ``process`` prints, waited for at most ``within_s``."""
    ready, _, _ = select.select([process.stdout], [], [], within_s)
    assert ready, f"the worker printed nothing within {within_s:.0f} s"
    return process.stdout.readline()


@pytest.mark.e2e
@pytest.mark.slow
def test_two_example_workers_one_slowed_train_the_job_exactly_once(settings, topics):
    env = {
        **os.environ,
        "ANTDT_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "ANTDT_BROKER_PROFILE": "embedded",
        "ANTDT_TOPIC_PREFIX": settings.topic_prefix,
        "ANTDT_JOB_ID": "job-example",
    }
    args = [
        sys.executable,
        "-m",
        "antdt.cli.main",
        "worker",
        "--samples",
        "1024",
        "--shard-size",
        "64",
        "--epochs",
        "2",
    ]
    with running_sharder(settings):
        fast = subprocess.Popen(
            [*args, "--worker-id", "fast"], env=env, stdout=subprocess.PIPE, text=True
        )
        # the slow one starts once the fast one has imported torch: in CI, beside another test,
        # the fast one's imports once took so long that the slow one trained most of the job
        # first. A static split would still give each half, so "the fast one did more" holds
        # only through dynamic sharding.
        first_line = first_line_of(fast, within_s=60.0)
        slow = subprocess.Popen(
            [*args, "--worker-id", "slow", "--slowdown", "4.0", "--step-sleep-ms", "5"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        outputs = [p.communicate(timeout=120)[0] for p in (fast, slow)]
        outputs[0] = first_line + outputs[0]
    assert fast.returncode == slow.returncode == 0, outputs
    trained = [int(out.strip().splitlines()[-1].split()[1]) for out in outputs]
    # dynamic sharding: the fast one did more
    assert sum(trained) == 1024 * 2 and trained[0] > trained[1]
    spec = DatasetSpec(
        name="synthetic-clusters",
        size=1024,
        shard_size=64,
        epochs=2,
        shuffle_seed=0,
        max_attempts=3,
        lease_s=30.0,
    )
    assert_exactly_once("job-example", spec, job_log(settings, "job-example"))


@pytest.mark.e2e
@pytest.mark.slow
def test_a_worker_slowed_by_sleep_is_a_straggler_within_5_s_and_stays_one(settings, topics):
    """Injected sleep is booked as compute, as a slower device's time would be: the monitor sees it
    at once.

    Three workers share two cores here, so each gets one torch thread (as
    the demo's pool does): with two, their OpenMP threads spin for each
    other on a busy machine and the unslowed workers' steps vary 1-4x.
    """
    from antdt.runtime.launch import service_process
    from antdt.schemas.models import StragglerClass, VerdictKind, WorkerMetrics

    job = "job-slowed"
    env = {
        **os.environ,
        "ANTDT_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "ANTDT_BROKER_PROFILE": "embedded",
        "ANTDT_TOPIC_PREFIX": settings.topic_prefix,
        "ANTDT_JOB_ID": job,
        "ANTDT_REPORT_INTERVAL_S": "0.5",
        "OMP_NUM_THREADS": "1",
    }
    args = [
        sys.executable,
        "-m",
        "antdt.cli.main",
        "worker",
        "--samples",
        "16000",
        "--shard-size",
        "128",
        "--epochs",
        "1",
        "--step-sleep-ms",
        "50",
    ]
    reports, verdicts = [], []
    with (
        running_sharder(settings),
        service_process(settings, "monitor") as monitor,
        _reader(settings, job) as read,
    ):
        monitor.wait_ready()
        workers = [
            subprocess.Popen(
                [*args, "--worker-id", f"w{i}", *(["--slowdown", "4"] if i == 2 else [])],
                env=env,
                stdout=subprocess.DEVNULL,
            )
            for i in range(3)
        ]
        # until the first one is done: all three train till then
        while all(w.poll() is None for w in workers):
            for record in read():
                (reports if isinstance(record, WorkerMetrics) else verdicts).append(record)
        first_done = datetime.now(UTC)
        for worker in workers:
            worker.wait(120)
        # what the monitor issued before then may still be on its way: read until quiet
        quiet_by = time.monotonic() + 30
        while (arrived := read()) and time.monotonic() < quiet_by:
            for record in arrived:
                (reports if isinstance(record, WorkerMetrics) else verdicts).append(record)
    cleared = [v for v in verdicts if v.kind is VerdictKind.CLEARED]
    verdicts = [v for v in verdicts if v.issued_at <= first_done]
    # the monitor judges once every worker has reported (min_workers=3): the clock starts there,
    # not at the slowed worker's first report (a loaded machine can start another worker later)
    judged_from = max(
        min(r.window_end for r in reports if r.worker_id == worker) for worker in ("w0", "w1", "w2")
    )
    mine = sorted((v for v in verdicts if v.worker_id == "w2"), key=lambda v: v.issued_at)
    assert mine and mine[0].kind is VerdictKind.STRAGGLER, [(v.kind, v.issued_at) for v in mine]
    assert (mine[0].issued_at - judged_from).total_seconds() <= 5.0
    assert not any(v.kind is not VerdictKind.STRAGGLER for v in mine), [
        (v.kind.value, v.classification.value) for v in mine
    ]
    # a healthy worker woken late on a loaded machine is slow for a moment, and may be told so
    # (TRANSIENT) if the monitor clears it again; a lasting or unclear verdict is a false one
    false = [
        (
            v.worker_id,
            v.classification.value,
            round(v.speed_ratio, 2),
            str(v.issued_at - judged_from),
        )
        for v in verdicts
        if v.worker_id != "w2"
        and v.kind is VerdictKind.STRAGGLER
        and not (
            v.classification is StragglerClass.TRANSIENT
            and any(c.worker_id == v.worker_id and c.issued_at > v.issued_at for c in cleared)
        )
    ]
    assert not false, false


def _reader(settings, job):
    """Reads the job's metrics and verdicts from the beginning; ``read()`` returns what arrived
    since."""
    from contextlib import contextmanager

    from antdt.bus.readers import BEGINNING, KeyedReader
    from antdt.schemas.codec import make_codec
    from antdt.topics import topic_spec

    @contextmanager
    def reading():
        codec = make_codec(None)
        readers = [
            KeyedReader(
                settings,
                topic_spec(c, n).full_name(settings.topic_prefix),
                job,
                codec,
                start=BEGINNING,
            )
            for c, n in (("worker", "metrics"), ("monitor", "verdicts"))
        ]
        try:
            yield lambda: [record for reader in readers for record in reader.poll(0.1)]
        finally:
            for reader in readers:
                reader.close()

    return reading()
