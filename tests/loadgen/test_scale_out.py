"""Two instances of each service share ten jobs; one of each is killed mid-run and the others take
over.

The jobs are simulated agents (:mod:`antdt.loadgen`) speaking the real
protocol to real ``antdt monitor``, ``antdt controller`` and ``antdt
sharder`` processes on a broker of this test's own. After the kills every
job must go on: its shard log audits clean (no shard lost or trained twice,
epochs completed after the kill), and its straggler, which turns slow only
after the kill, is detected and commanded, whichever instances served the job
before.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import pytest

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.embedded.broker import EmbeddedBroker
from antdt.loadgen.driver import FleetDriver
from antdt.loadgen.fleet import FleetSpec
from antdt.runtime.launch import service_process
from antdt.schemas.codec import make_codec
from antdt.schemas.models import DatasetSpec
from antdt.services.sharder.audit import EpochStatus
from antdt.services.sharder.replay import audit_job, replay_events
from antdt.settings import BrokerProfile, load_settings
from antdt.topics import topic_spec

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVICES = ("sharder", "controller", "monitor")
JOBS = 10
KILL_AT_S = 20.0
RUN_S = 60.0
SPEC = FleetSpec(
    jobs=JOBS,
    workers_per_job=6,
    shard_s=0.5,
    stragglers=0.1,
    factor=4.0,
    onset_from_s=KILL_AT_S + 10,
    onset_until_s=KILL_AT_S + 15,
    request_timeout_s=5.0,
    job_prefix="out",
    dataset=DatasetSpec(
        name="out",
        size=1200,
        shard_size=20,
        epochs=1000,
        shuffle_seed=1,
        max_attempts=3,
        lease_s=8.0,
    ),
)
#: What each service's instance reports about the jobs it serves before the kill.
SERVES = {
    "sharder": "antdt_sharder_jobs",
    "controller": "antdt_controller_partitions",
    "monitor": "antdt_monitor_jobs",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The whole run: services up, fleet running, one instance of each killed at KILL_AT_S."""
    logs = tmp_path_factory.mktemp("scale-out")
    with EmbeddedBroker() as broker, ExitStack() as stack:
        settings = load_settings(
            bootstrap_servers=broker.bootstrap_servers,
            broker_profile=BrokerProfile.EMBEDDED,
            topic_prefix="out",
            client_id="antdt-scale-out",
        )
        ensure_topics(make_admin(settings), settings)
        instances = {
            name: [
                stack.enter_context(service_process(settings, name, log_dir=logs)) for _ in range(2)
            ]
            for name in SERVICES
        }
        for pair in instances.values():
            for instance in pair:
                instance.wait_ready()
        driver = FleetDriver(settings, SPEC)
        fleet = threading.Thread(target=driver.run, args=(RUN_S,), daemon=True)
        started = time.monotonic()
        fleet.start()
        time.sleep(KILL_AT_S - 2)
        served = {name: pair[0].metric(SERVES[name]) for name, pair in instances.items()}
        epochs_before = {w.job_id: w.epoch for w in driver.fleet.workers.values()}
        time.sleep(max(0.0, started + KILL_AT_S - time.monotonic()))
        for pair in instances.values():
            pair[0].process.kill()
        fleet.join(RUN_S + 30)
        assert not fleet.is_alive(), "the fleet did not stop"
        codec = make_codec(None)
        audits = {
            job: audit_job(
                settings, job, [e for _, _, e in replay_events(settings, job, codec)], codec
            )
            for job in sorted({w.job_id for w in driver.fleet.workers.values()})
        }
        yield {
            "driver": driver,
            "served": served,
            "epochs_before": epochs_before,
            "audits": audits,
            "survivors": {name: pair[1] for name, pair in instances.items()},
        }


def test_each_killed_instance_served_jobs_before_the_kill(run):
    assert all(count > 0 for count in run["served"].values()), run["served"]


def test_every_job_audits_clean_and_completed_epochs_after_the_kill(run):
    for job, report in run["audits"].items():
        assert report.ok, f"{job}: {report.violations[:5]}"
        complete = [e for e in report.epochs if e.status is EpochStatus.COMPLETE]
        assert all(e.samples_done_once == e.samples for e in complete), job
        assert len(complete) > run["epochs_before"][job] + 1, (
            f"{job}: {len(complete)} epochs complete"
        )


def test_every_job_s_straggler_was_commanded_after_the_kill(run):
    fleet = run["driver"].fleet
    stragglers = {key for key, w in fleet.workers.items() if w.onset is not None}
    assert len(stragglers) == JOBS
    assert set(fleet.seen.first_command_s) == stragglers
    assert max(fleet.seen.first_command_s.values()) < 15.0


def test_the_survivors_serve_every_job(run):
    survivors = run["survivors"]
    assert survivors["sharder"].metric("antdt_sharder_jobs") == JOBS
    assert survivors["monitor"].metric("antdt_monitor_jobs") == JOBS
    assert (
        survivors["controller"].metric("antdt_controller_partitions")
        == topic_spec("worker", "metrics").partitions
    )
