"""The partial-reduce example under torchrun with ``antdt up --mode preduce``: one rank slowed,
every sample once; a node evicted from an elastic job, the others going on without it.

Real torchrun, gloo, the grouper ``antdt up`` starts, the sharder's log
audited: what a user runs with ``torchrun ... examples/preduce_antdt.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from antdt.embedded.broker import free_port
from antdt.schemas.models import CommandAction
from tests.cli.test_up_cmd import serving
from tests.worker.elastic.test_torchrun import (
    assert_audit_clean,
    assert_ledger_all_ones,
    finish,
    job_records,
    listening,
    torchrun,
    until,
)
from tests.worker.test_agent import send_command

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).parents[3] / "examples" / "preduce_antdt.py"


@pytest.fixture(scope="module")
def bus():
    """``antdt up --mode preduce``: the broker, the three services and the grouper."""
    with serving("--mode", "preduce", last="grouper") as settings:
        yield settings


def test_with_a_rank_slowed_every_sample_is_in_the_model_once_and_the_log_audits_clean(
    bus, tmp_path
):
    run = torchrun(
        bus,
        "tr-preduce",
        tmp_path,
        "--standalone",
        "--nproc-per-node",
        "3",
        samples=6000,
        example=EXAMPLE,
        ANTDT_SLOWDOWN="3",
        ANTDT_SLOWDOWN_RANKS="2",
    )
    assert finish(run, tmp_path) == 0
    assert_ledger_all_ones(tmp_path)
    assert_audit_clean(bus, "tr-preduce")
    log = (tmp_path / "torchrun-n.log").read_text()
    assert "held-out accuracy" in log, log[-2000:]


def test_an_evicted_node_leaves_and_the_others_start_again_without_it_at_once(bus, tmp_path):
    """Three nodes of one rank; c is evicted. A group of every rank (a checkpoint, the end) would
    wait for c for ever: a and b see it stop beating, end their group (exit 77) and torchrun
    starts them again as a group of two, in one generation although only their failures, not
    the membership change, count as their agents' restarts. Every sample still once."""
    job, port = "tr-preduce-evict", free_port()
    options = ("--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d")
    options += ("--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job, "--max-restarts", "3")
    options += ("--rdzv-conf", "last_call_timeout=2")
    node = {"samples": 12000, "example": EXAMPLE, "CUDA_VISIBLE_DEVICES": ""}
    nodes = {"a": torchrun(bus, job, tmp_path, *options, node="a", **node)}
    until(lambda: listening(port), "node a's rendezvous store did not start")  # a hosts it
    nodes |= {name: torchrun(bus, job, tmp_path, *options, node=name, **node) for name in "bc"}
    until(
        lambda: (
            {m.worker_id for m in job_records(bus, "metrics", job, timeout_s=10.0)}
            >= {"a-0", "b-0", "c-0"}
        ),
        "not every node trained",
        every_s=1.0,
    )
    send_command(bus, CommandAction.EVICT, key=None, job_id=job, target_worker="c-0", reason="test")
    assert finish(nodes["c"], tmp_path, "c") != 0  # its torchrun agent was stopped
    assert finish(nodes["a"], tmp_path, "a") == 0 and finish(nodes["b"], tmp_path, "b") == 0
    assert_ledger_all_ones(tmp_path)
    assert_audit_clean(bus, job)
    for name in "ab":
        log = (tmp_path / f"torchrun-{name}.log").read_text()
        assert "no group from the grouper" not in log, log[-2000:]
    assert 2 in {report.world_size for report in job_records(bus, "metrics", job)}
