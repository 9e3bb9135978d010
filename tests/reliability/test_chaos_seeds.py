"""Drawn fault schedules on the real thing: ``bench/chaos_seeds.py`` runs ``antdt chaos --seed 40``
synchronously, as docs/reliability.md's table of many seeds does. (The asynchronous run of the same
seed was dropped to keep the suite under 20 minutes: its epoch ended after the first three faults,
a stop, the broker restart and a kill, and ``test_chaos.py``'s asynchronous epoch restarts the
broker and kills workers and every service; a stopped asynchronous rank is in the table.)

Seed 40 draws every kind of fault but a service kill: a rank stopped mid-step for 13.3 s (on an
unloaded machine past the synchronous step's 10 s limit: the other ranks name it and the group
restarts), the broker restarted empty, a rank killed mid-step, a rank stopped for 1.4 s (the group
only waits), a CPU hog on a rank, and a service stopped for 3.5 s, one at a time. The run must end
with every fault survived, nothing lost, nothing trained twice, nothing hung.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from antdt.demo.faults import draw_schedule

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

RUNNER = Path(__file__).parents[2] / "bench" / "chaos_seeds.py"
SEED = 40


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("chaos-seeds")
    run = subprocess.run(
        [sys.executable, str(RUNNER), "--modes", "sync", "--seeds", str(SEED)]
        + ["--out", str(out), "--bound", "420", "--json"],
        capture_output=True,
        text=True,
        timeout=880,
    )
    print(run.stderr[-2000:])
    assert run.returncode == 0, f"{run.stderr[-3000:]}\n{run.stdout[-3000:]}"
    found = json.loads(run.stdout)
    found["runs"] = {"sync": json.loads((out / f"sync-{SEED}" / "figures.json").read_text())}
    return found


def test_the_seed_draws_a_long_stop_a_short_one_a_hog_and_a_broker_restart():
    labels = [(fault.label, fault.hold_s, fault.mid_step) for fault in draw_schedule(SEED)]
    assert labels[:3] == [
        ("stop worker", 13.3, True),
        ("restart broker", 0.0, False),
        ("kill worker", 0.0, True),
    ]
    assert {label for label, _, _ in labels} >= {"hog worker", "stop service"}


def test_every_drawn_fault_is_survived_with_nothing_lost_duplicated_or_hung(report):
    summary = report["modes"]["sync"]
    assert summary["runs"] == summary["passed"] == 1 and summary["hung"] == 0
    assert summary["runs_with_lost_samples"] == summary["runs_with_duplicated_samples"] == 0
    figures = report["runs"]["sync"]
    assert figures["passed"] and figures["audit_clean"] and figures["ledger"]["ok"]
    assert figures["ledger"]["never_trained"] == figures["ledger"]["trained_twice"] == 0
    assert figures["survived"] == figures["kills"] >= 4
    assert figures["faults"].get("stop worker", 0) >= 1 and figures["broker_restarts"] == 1
    assert [fault["fault"] for fault in figures["schedule"]][:2] == [
        "stop worker",
        "restart broker",
    ]


def test_a_synchronous_group_survives_a_rank_stopped_mid_step_and_restarts_for_each_kill(report):
    """Whether the 13.3 s stop outlasts the step-sized limit depends on the machine's load (the
    limit grows with slow steps); either way the group must come through it.
    tests/worker/test_ddp.py names a stopped rank within the bound on its own."""
    figures = report["runs"]["sync"]
    first = figures["killed"][0]
    assert first["action"] == "stop" and first["held_s"] == 13.3 and first["lost_s"] > 0
    assert figures["restarts"] >= figures["faults"].get("kill worker", 0)
