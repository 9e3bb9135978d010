"""``bench/chaos_seeds.py --resume``: a sweep stopped early (or run in parts) keeps the runs it
finished and counts them in its report, without running them again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).parents[2] / "bench" / "chaos_seeds.py"


def figures(passed: bool, trained_twice: int) -> dict:
    """What ``antdt chaos --json`` writes for a run, the fields the runner reads."""
    return {
        "passed": passed,
        "wall_s": 30.0,
        "faults": {"stop worker": 2, "kill worker": 1},
        "lost_s_by_fault": {"stop worker": [4.0, 6.0], "kill worker": [3.0]},
        "ledger": {
            "never_trained": 0,
            "trained_twice": trained_twice,
            "findings": [f"{trained_twice} samples trained twice"] if trained_twice else [],
        },
        "survived": 3,
        "kills": 3,
        "killed": [],
        "audit_clean": True,
    }


def test_a_resumed_sweep_counts_the_kept_runs_and_runs_none_again(tmp_path):
    for seed, passed, twice in ((1, True, 0), (2, False, 9)):
        folder = tmp_path / f"async-{seed}"
        folder.mkdir()
        (folder / "figures.json").write_text(json.dumps(figures(passed, twice)))
    run = subprocess.run(
        [sys.executable, str(RUNNER), "--modes", "async", "--seeds", "1-2", "--resume"]
        + ["--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stderr  # seed 2 failed
    assert run.stderr.count("(kept from an earlier sweep)") == 2
    summary = json.loads(run.stdout)["modes"]["async"]
    assert (summary["runs"], summary["passed"], summary["failed"]) == (2, 1, 1)
    assert summary["runs_with_duplicated_samples"] == 1
    assert summary["not_passed"] == [
        {"seed": 2, "outcome": "failed", "why": "9 samples trained twice"}
    ]
    assert summary["faults"] == {"kill worker": 2, "stop worker": 4}
    assert summary["lost_s_by_fault"]["stop worker"]["n"] == 4
