"""The example under torchrun with ``antdt up``: DD batch sizes, a node evicted (gloo, CPU);
NCCL on GPUs. A rank killed and the group restarted from ElasticJob's checkpoint is
tests/examples/test_framework_examples.py's Accelerate case (its loop is ElasticJob's).

Real torchrun, real gloo groups, the real services: what a user runs with
``antdt up`` and ``torchrun ... examples/ddp_antdt.py``. Every wait is bounded.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from antdt.embedded.broker import free_port
from antdt.schemas.codec import make_codec
from antdt.schemas.models import AckStatus, CommandAction
from antdt.services.sharder.replay import audit_job, replay_events
from antdt.worker.ledger import read_ledgers
from tests.cli.test_up_cmd import serving
from tests.worker.test_agent import read_topic, send_command

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).parents[3] / "examples" / "ddp_antdt.py"
GLOBAL_BATCH = 96  # 3 ranks x the example's 32
RUN_S = 240.0


@pytest.fixture(scope="module")
def bus():
    """``antdt up --policy antdt-dd``: the broker and the three services, as a user starts them."""
    with serving("--policy", "antdt-dd") as settings:
        yield settings


def torchrun(
    settings,
    job: str,
    workdir: Path,
    *options: str,
    samples: int = 24000,
    node: str = "n",
    example: Path = EXAMPLE,
    checkpointed: bool = True,
    script_args: tuple[str, ...] = (),
    **env: str,
) -> subprocess.Popen:
    """``torchrun *options example *script_args`` for ``job`` on ``settings``' bus (its parameter
    servers too, if any); ``checkpointed``: the example takes ``--checkpoint``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ANTDT_")}
    environment.update(
        ANTDT_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        ANTDT_BROKER_PROFILE="embedded",
        ANTDT_JOB_ID=job,
        **({"ANTDT_PS_SERVERS": settings.ps_servers} if settings.ps_servers else {}),
        NODE_NAME=node,
        OMP_NUM_THREADS="1",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        **env,
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *options,
        str(example),
        "--samples",
        str(samples),
        *(("--checkpoint", str(workdir / "checkpoints" / "example.pt")) if checkpointed else ()),
        *script_args,
    ]
    log = open(workdir / f"torchrun-{node}.log", "w")
    return subprocess.Popen(
        command, cwd=workdir, env=environment, stdout=log, stderr=subprocess.STDOUT
    )


def finish(process: subprocess.Popen, workdir: Path, node: str = "n") -> int:
    try:
        return process.wait(RUN_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(
            f"torchrun did not finish within {RUN_S:.0f} s: "
            f"{log_tail(workdir / f'torchrun-{node}.log')}"
        ) from None


def assert_ledger_all_ones(workdir: Path, epochs: int = 2) -> None:
    ledgers = read_ledgers(workdir / "checkpoints")
    assert sorted(ledgers) == list(range(epochs))
    for epoch, counts in ledgers.items():
        assert np.all(counts == 1), (
            f"epoch {epoch}: {int(np.sum(counts != 1))} samples not trained exactly once"
        )


def job_records(settings, name: str, job: str, want=None, timeout_s: float = 30.0) -> list:
    return [
        r
        for r in read_topic(
            settings, "worker" if name != "commands" else "controller", name, want, timeout_s
        )
        if r.job_id == job
    ]


def log_tail(log: Path) -> str:
    """The end of a run's log, for a failure's message."""
    return log.read_text()[-3000:]


def until(
    condition, what: str, timeout_s: float = 120.0, every_s: float = 0.2, log: Path | None = None
):
    """Wait for ``condition``; the failure quotes the end of ``log`` (a run's), so a wait that runs
    out in CI says what the run was doing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every_s)
    tail = f":\n{log_tail(log)}" if log is not None and log.exists() else ""
    raise AssertionError(f"{what} within {timeout_s:.0f} s{tail}")


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


def assert_audit_clean(settings, job: str) -> None:
    """The job's shard log, folded independently: every sample trained exactly once per epoch."""
    codec = make_codec(settings.schema_registry_url)
    events = [event for _, _, event in replay_events(settings, job, codec)]
    report = audit_job(settings, job, events, codec)
    assert report.ok, report.violations


def test_an_evicted_node_leaves_an_elastic_job_which_goes_on_with_the_same_global_batch(
    bus, tmp_path
):
    """Node c, 3x slower, is evicted; a and b go on. (The slowed rank given less at one agreed
    step, with ElasticJob's loop, is tests/examples/test_framework_examples.py's Accelerate
    case.)"""
    port = free_port()
    options = (
        "--nnodes",
        "2:3",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "tr-evict",
        "--max-restarts",
        "3",
        "--rdzv-conf",
        "last_call_timeout=2",
    )
    # three "nodes" on one host would share its GPUs, which NCCL refuses
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    nodes = {"a": torchrun(bus, "tr-evict", tmp_path, *options, samples=12000, node="a", **cpu)}
    # a hosts it: c may leave
    until(lambda: listening(port), "node a's rendezvous store did not start")
    nodes.update(
        {
            node: torchrun(
                bus,
                "tr-evict",
                tmp_path,
                *options,
                samples=12000,
                node=node,
                **cpu,
                **({"ANTDT_SLOWDOWN": "3"} if node == "c" else {}),
            )
            for node in "bc"
        }
    )
    until(
        lambda: (
            {m.worker_id for m in job_records(bus, "metrics", "tr-evict", timeout_s=10.0)}
            >= {"a-0", "b-0", "c-0"}
        ),
        "not every node trained",
        every_s=1.0,
    )
    send_command(
        bus,
        CommandAction.EVICT,
        key=None,
        job_id="tr-evict",
        target_worker="c-0",
        reason="test: evict",
    )
    assert finish(nodes["c"], tmp_path, "c") != 0  # its torchrun agent was stopped
    assert finish(nodes["a"], tmp_path, "a") == 0 and finish(nodes["b"], tmp_path, "b") == 0
    assert_ledger_all_ones(tmp_path)
    assert_audit_clean(bus, "tr-evict")
    shrunk = {}  # each survivor's first report in the group of two: the global batch split evenly
    for report in job_records(bus, "metrics", "tr-evict"):
        if report.world_size == 2:
            shrunk.setdefault(report.worker_id, report.local_batch_size)
    assert shrunk == {"a-0": GLOBAL_BATCH // 2, "b-0": GLOBAL_BATCH // 2}
    commands = job_records(bus, "commands", "tr-evict")
    assert {
        c.global_batch_size for c in commands if c.action is CommandAction.ADJUST_BATCH_SIZE
    } <= {GLOBAL_BATCH}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_gpus_the_example_trains_over_nccl_exactly_once_and_reports_each_rank_s_device(
    bus, tmp_path
):
    ranks = torch.cuda.device_count()  # NCCL takes one rank per device
    run = torchrun(
        bus, "tr-gpu", tmp_path, "--standalone", "--nproc-per-node", str(ranks), samples=6000
    )
    assert finish(run, tmp_path) == 0
    assert_ledger_all_ones(tmp_path)
    assert "held-out accuracy" in (tmp_path / "torchrun-n.log").read_text()
    reports = job_records(bus, "metrics", "tr-gpu")
    assert {r.worker_id for r in reports} == {f"n-{rank}" for rank in range(ranks)}
    # the agent found its rank's device
    trained = [r.resources for r in reports if r.step_count > 0]
    assert trained and all(
        0 < (r.gpu_memory_used_bytes or 0) <= r.gpu_memory_total_bytes for r in trained
    )


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0
