"""The broker restarts under a running job, empty: the job still finishes, and the audit is clean.

Runs ``antdt chaos --broker-at 8`` as a user would (one epoch of the standard
scenario, eight workers, AntDT-ND, all three services) with no other kill.
At 8 s the embedded broker is killed and started again on the same port:
every topic, record, offset and group is gone. The services and agents must
notice, re-create the topics and re-announce their state (the sharder its
jobs as snapshots, the controller its epoch; the monitor restarts in place;
the workers re-send their last reports), and the epoch must complete. The log
before the restart is gone, so the audit starts from the sharder's
re-published snapshot and covers every shard done after it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    out = tmp_path_factory.mktemp("broker-restart")
    run = subprocess.run([sys.executable, "-m", "antdt.cli.main", "chaos", "--worker-every", "0", "--services-at", "",
                          "--broker-at", "8", "--json", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"antdt chaos exited {run.returncode}:\n{run.stderr[-3000:]}\n{run.stdout[-3000:]}"
    found = json.loads(run.stdout)
    (restart,) = found["killed"]
    print(f"\nbroker restart at {restart['at_s']} s: back after {restart['lost_s']} s; parts {restart['parts']}; "
          f"epoch in {found['wall_s']} s (ideal {found['ideal_s']} s)")
    return found


def test_every_part_comes_back_after_the_broker_restart(figures):
    (restart,) = figures["killed"]
    assert (restart["target"], restart["kind"]) == ("broker", "broker")
    assert figures["survived"] == figures["kills"] == 1
    parts = restart["parts"]
    assert {"broker", "sharder", "controller", "monitor", "first worker", "workers"} <= set(parts)
    assert 0 < parts["broker"] < restart["lost_s"]
    assert restart["lost_s"] == pytest.approx(max(parts["workers"], parts["monitor"]), abs=0.02)


def test_the_epoch_completes_with_a_clean_audit_from_the_republished_snapshot(figures):
    audit = figures["audit"]
    assert figures["audit_clean"] and audit["finished"] and audit["ok"]
    assert audit["from_snapshot_seq"] is not None and audit["from_snapshot_seq"] > 1  # the old log is gone
    assert audit["seq_gaps"] == []
    (epoch,) = audit["epochs"]
    assert epoch["samples_done_once"] == epoch["samples"] == 16384
    assert (epoch["gap_samples"], epoch["duplicate_done"], epoch["not_holder_done"], epoch["samples_pending"]) == (0, [], [], 0)
