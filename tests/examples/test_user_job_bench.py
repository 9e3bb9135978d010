"""The user-style job of ``bench/torchrun_bench.py`` finishes under torchrun without
``--max-restarts``, healthy and with a slowed rank, and trains every sample exactly once, sized
in-band (a short run of the benchmark; the long ones are in docs/torchrun.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench" / "torchrun_bench.py"


@pytest.mark.slow
def test_the_user_style_job_finishes_healthy_and_slowed_with_every_sample_once(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--ranks",
            "2",
            "--repeat",
            "1",
            "--samples",
            "6000",
            # in-band sizing here; the controller's commands are tested in test_torchrun.py
            "--sizing",
            "in-band",
            # plain DDP's runs are the bench's baseline, not antdt's to test
            "--no-baseline",
            "--run-limit-s",
            "180",
            "--workdir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report["problems"] or done.stderr[-2000:]
    antdt_runs = [run for r in report["results"] if r["mode"] == "dd" for run in r["runs"]]
    assert len(antdt_runs) == 2
    assert all(run["exit"] == 0 and run["ledger_all_ones"] for run in antdt_runs), antdt_runs
