"""``antdt worker``: the example training job end to end, and its argument errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from antdt.cli.main import run
from antdt.schemas.models import DatasetSpec
from tests.services.sharder.harness import assert_exactly_once, job_log, running_sharder


def test_bad_slowdown_is_a_one_line_argument_error(capsys):
    assert run(["worker", "--slowdown", "40-10:2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "bad slowdown spec '40-10:2'" in lines[0]


@pytest.mark.e2e
@pytest.mark.slow
def test_two_example_workers_one_slowed_train_the_job_exactly_once(settings, topics):
    env = {**os.environ, "ANTDT_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "ANTDT_BROKER_PROFILE": "embedded",
           "ANTDT_TOPIC_PREFIX": settings.topic_prefix, "ANTDT_JOB_ID": "job-example"}
    args = [sys.executable, "-m", "antdt.cli.main", "worker", "--samples", "1024", "--shard-size", "64", "--epochs", "2"]
    with running_sharder(settings):
        fast = subprocess.Popen([*args, "--worker-id", "fast"], env=env, stdout=subprocess.PIPE, text=True)
        slow = subprocess.Popen([*args, "--worker-id", "slow", "--slowdown", "4.0", "--step-sleep-ms", "2"],
                                env=env, stdout=subprocess.PIPE, text=True)
        outputs = [p.communicate(timeout=120)[0] for p in (fast, slow)]
    assert fast.returncode == slow.returncode == 0, outputs
    trained = [int(out.strip().splitlines()[-1].split()[1]) for out in outputs]
    assert sum(trained) == 1024 * 2 and trained[0] > trained[1]  # dynamic sharding: the fast one did more
    spec = DatasetSpec(name="synthetic-clusters", size=1024, shard_size=64, epochs=2, shuffle_seed=0, max_attempts=3, lease_s=30.0)
    assert_exactly_once("job-example", spec, job_log(settings, "job-example"))
