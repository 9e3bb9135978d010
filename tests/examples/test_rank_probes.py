"""The probes docs/frameworks.md and docs/torchrun.md read a rank's costs with:
``bench/rank_profile`` (a cProfile of chosen ranks), ``bench/thread_cpu.py`` (each rank thread's
CPU seconds) and ``bench/phase_probe`` (each phase's CPU and wall time a call)."""

from __future__ import annotations

import importlib
import os
import pstats
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # the bench scripts import as scripts
thread_cpu = importlib.import_module("thread_cpu")
phase_summary = importlib.import_module("phase_probe.summary")

#: A rank's stand-in: burns a little CPU on its main thread, says so, then waits to be read.
BUSY = (
    "import sys\nsum(i * i for i in range(300_000))\nprint('ready', flush=True)\nsys.stdin.read()\n"
)


def _rank_env(rank: int, **more: str) -> dict:
    return {**os.environ, "LOCAL_RANK": str(rank), "RANK": str(rank), **more}


def test_a_chosen_rank_writes_its_profile_and_another_does_not(tmp_path):
    path = os.pathsep.join(
        filter(None, [str(BENCH / "rank_profile"), os.environ.get("PYTHONPATH")])
    )
    for rank in (0, 1):
        env = _rank_env(rank, PYTHONPATH=path, RANK_PROFILE_DIR=str(tmp_path))
        done = subprocess.run(
            [sys.executable, "-c", "sum(range(1000))", "--mode", "probe"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    written = sorted(tmp_path.glob("*.prof"))
    assert [p.name.split("-")[:2] for p in written] == [["probe", "rank0"]]
    assert pstats.Stats(str(written[0])).total_calls > 0


def test_each_rank_thread_is_counted_under_its_mode_and_rank():
    token = f"probe-{uuid.uuid4().hex}"  # names this test's child alone
    child = subprocess.Popen(
        [sys.executable, "-c", BUSY, token, "--mode", "plain"],
        env=_rank_env(2),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "ready\n"  # '' if it died
        seen: dict = defaultdict(dict)
        thread_cpu.sample(token, seen)
    finally:
        child.communicate("", timeout=30)
    rows = thread_cpu.summary(seen)
    assert [(row["mode"], row["rank"], row["pid"]) for row in rows] == [("plain", 2, child.pid)]
    assert rows[0]["threads"]["main"] > 0


#: A plain loop's phases without a process group: four batches from a DataLoader, a backward pass
#: and an optimizer step each.
PLAIN_STEPS = """
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(8, 4))
for (inputs,) in torch.utils.data.DataLoader(data, batch_size=2):
    model(inputs).sum().backward()
    optimizer.step()
"""


def test_a_rank_s_phases_are_timed_a_call_each_and_summed_by_mode(tmp_path):
    path = os.pathsep.join(filter(None, [str(BENCH / "phase_probe"), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_STEPS, "--mode", "plain"],
        env=_rank_env(0, PYTHONPATH=path, PHASE_PROBE_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = phase_summary.summarise(tmp_path)
    phases = summary["plain"]["phases"]
    assert summary["plain"]["files"] == 1
    assert set(phases) == {"loader: next batch", "backward", "optimizer step"}
    for times in phases.values():
        assert 0 < times["cpu_us"]["median"] <= 1.5 * times["wall_us"]["median"] + 5
    assert summary["plain"]["main_cpu_s"]["median"] > 0
    assert summary["plain"]["main_core_wait_s"]["median"] >= 0  # Linux's schedstat
