"""The chaos epoch: workers killed about every 10 s and each service killed once, mid-epoch, with SIGKILL.

Runs ``antdt chaos`` as a user would (one epoch of the standard scenario,
eight workers, AntDT-ND) on its own embedded broker. Every victim is
restarted at once by the harness; the epoch must complete and the shard
log's audit must be clean: 0 samples lost, 0 trained twice.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    out = tmp_path_factory.mktemp("chaos")
    run = subprocess.run([sys.executable, "-m", "antdt.cli.main", "chaos", "--json", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"antdt chaos exited {run.returncode}:\n{run.stderr[-3000:]}\n{run.stdout[-3000:]}"
    found = json.loads(run.stdout)
    print(f"\nchaos: {found['survived']}/{found['kills']} kills survived in {found['wall_s']} s "
          f"(ideal {found['ideal_s']} s): " + ", ".join(f"{k['target']}@{k['at_s']}s back in {k['lost_s']}s"
                                                        for k in found["killed"]))
    return found


def test_every_kill_is_survived_and_each_service_was_killed_once(figures):
    killed = [kill["target"] for kill in figures["killed"] if kill["kind"] == "service"]
    assert sorted(killed) == ["controller", "monitor", "sharder"]
    assert sum(kill["kind"] == "worker" for kill in figures["killed"]) >= 2
    assert figures["survived"] == figures["kills"]
    assert all(kill["lost_s"] is not None and kill["lost_s"] > 0 for kill in figures["killed"])


def test_the_epoch_completes_with_every_sample_trained_exactly_once(figures):
    audit = figures["audit"]
    assert figures["audit_clean"] and audit["finished"] and audit["ok"]
    (epoch,) = audit["epochs"]
    assert epoch["samples_done_once"] == epoch["samples"] == 16384
    assert (epoch["gap_samples"], epoch["duplicate_done"], epoch["samples_pending"]) == (0, [], 0)

