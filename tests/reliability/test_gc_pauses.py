"""The collector probe that docs/reliability.md reads a soak with (``bench/gc_probe``,
``bench/gc_pauses.py``): a child's full passes, summed under its name."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # the bench scripts import as scripts
gc_pauses = importlib.import_module("gc_pauses")

#: A child with a heap of 50,000 lists that runs three full passes.
THREE_FULL_PASSES = (
    "import gc\nkept = [[i] for i in range(50_000)]\nfor _ in range(3):\n    gc.collect()\n"
)


def test_a_probed_process_full_passes_are_summed(tmp_path):
    path = os.pathsep.join(filter(None, [str(BENCH / "gc_probe"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "GC_PROBE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", THREE_FULL_PASSES],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    [child] = gc_pauses.read_probe(tmp_path)
    assert child["pid"] > 0 and child["full_passes"] >= 3
    assert child["full_max_ms"] >= child["full_median_ms"] > 0


def test_a_process_is_named_by_its_command():
    name = gc_pauses.process_name
    assert name("/v/bin/python -m antdt.cli.main sharder --http-port 9402") == "antdt sharder"
    assert name("/v/bin/python bench/soak_bench.py --json") == "soak_bench.py"
    assert name("/v/bin/python -m antdt.services.sharder.snapshots") == (
        "antdt.services.sharder.snapshots"
    )
