"""The Lightning example under torchrun with ``antdt up``: a rank 3x slower is given less at one
agreed step, a rank killed is restarted from Lightning's own checkpoint, exactly once.

Real torchrun, real gloo, a real ``lightning.pytorch.Trainer`` and the real services: what a user
runs with ``antdt up`` and ``torchrun ... examples/lightning_antdt.py``. Every wait is bounded.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from pathlib import Path

import psutil
import pytest
import torch

from antdt.schemas.models import AckStatus, CommandAction, LifecycleEvent
from tests.cli.test_up_cmd import serving
from tests.worker.elastic.test_torchrun import (
    assert_audit_clean,
    assert_ledger_all_ones,
    finish,
    job_records,
    torchrun,
    until,
)

pytest.importorskip("lightning", reason="the lightning extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).parents[3] / "examples" / "lightning_antdt.py"
GLOBAL_BATCH = 96  # 3 ranks x the example's 32


@pytest.fixture(scope="module")
def bus():
    """``antdt up --policy antdt-dd``, as a user starts it."""
    with serving("--policy", "antdt-dd") as settings:
        yield settings


def applied_resizes(settings, job: str) -> dict[int, set[int]]:
    """Each batch-size decision's effective step -> the steps its ranks switched at."""
    commands = {
        c.command_id: c
        for c in job_records(settings, "commands", job)
        if c.action is CommandAction.ADJUST_BATCH_SIZE
    }
    applied = defaultdict(set)
    for ack in job_records(settings, "acks", job):
        if ack.status is AckStatus.APPLIED and ack.command_id in commands:
            applied[commands[ack.command_id].effective_step].add(ack.applied_step)
    return applied


def test_a_slowed_rank_gets_less_and_a_killed_one_resumes_from_lightning_s_checkpoint(
    bus, tmp_path
):
    run = torchrun(
        bus,
        "pl-dd",
        tmp_path,
        "--standalone",
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "2",
        example=EXAMPLE,
        script_args=("--save-every", "20"),
        checkpointed=False,
        samples=12000,
        ANTDT_SLOWDOWN="3",
        ANTDT_SLOWDOWN_RANKS="2",
    )
    until(
        lambda: applied_resizes(bus, "pl-dd") or run.poll() is not None,
        "no batch size applied",
        every_s=1.0,
    )
    assert run.poll() is None, (tmp_path / "torchrun-n.log").read_text()[-3000:]
    last = tmp_path / "checkpoints" / "last.ckpt"
    resized_at = last.stat().st_mtime_ns
    until(lambda: last.stat().st_mtime_ns != resized_at, "no checkpoint after the resize")
    victim = until(
        lambda: [
            p
            for p in psutil.Process(run.pid).children(recursive=True)
            if "lightning_antdt" in " ".join(p.cmdline())
        ],
        "no rank running",
    )[1]
    victim.send_signal(signal.SIGKILL)
    assert finish(run, tmp_path) == 0
    assert_ledger_all_ones(tmp_path)
    assert_audit_clean(bus, "pl-dd")
    applied = applied_resizes(bus, "pl-dd")
    assert all(len(steps) == 1 for steps in applied.values()), dict(applied)
    saved = torch.load(last, map_location="cpu", weights_only=False)["antdt"]
    assert saved["global_batch"] == GLOBAL_BATCH == sum(saved["batch_sizes"])
    assert saved["batch_sizes"][2] < GLOBAL_BATCH // 3 < max(saved["batch_sizes"])
    commands = job_records(bus, "commands", "pl-dd")
    assert {
        c.global_batch_size for c in commands if c.action is CommandAction.ADJUST_BATCH_SIZE
    } == {GLOBAL_BATCH}
    joined = [e for e in job_records(bus, "lifecycle", "pl-dd") if e.event is LifecycleEvent.JOINED]
    assert len({e.incarnation for e in joined}) >= 6, "the group was not started again"
    assert victim.pid in {e.pid for e in joined}
