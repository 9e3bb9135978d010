"""Chaos on the real thing: kill -9 workers (some mid-step), the parameter server, every service,
and the broker.

Runs ``antdt chaos`` as a user would, asynchronously (AntDT-ND, a parameter server) on one epoch
of the standard scenario, eight workers, on its own embedded broker, on a fixed schedule that
hits the parameter server and every service once (each training mode also gets a drawn schedule:
test_chaos_seeds.py). Every victim is restarted at once. The epoch must complete with every
sample in the model exactly once: each ledger file all ones, the shard log's audit clean and
agreeing with it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def run_chaos(out, *args: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "antdt.cli.main", "chaos", "--json", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, (
        f"antdt chaos exited {run.returncode}:\n{run.stderr[-3000:]}\n{run.stdout[-3000:]}"
    )
    found = json.loads(run.stdout)
    print(
        f"\nchaos ({found['training']}): {found['survived']}/{found['kills']} kills survived "
        f"({found['worker_kills']} workers, {found['mid_step_kills']} mid-step) "
        f"in {found['wall_s']} s "
        f"(ideal {found['ideal_s']} s): "
        + ", ".join(
            f"{k['target']}@{k['at_s']}s{'/' + k['mid_step'] if 'mid_step' in k else ''} "
            f"back in {k['lost_s']}s"
            for k in found["killed"]
        )
    )
    return found


@pytest.fixture(scope="module")
def asynchronous(tmp_path_factory):
    out = tmp_path_factory.mktemp("chaos-async")
    return run_chaos(out), out


def check_kills(figures: dict, services: list[str]) -> None:
    killed = sorted(kill["target"] for kill in figures["killed"] if kill["kind"] == "service")
    assert killed == sorted(services)
    assert figures["worker_kills"] >= 5 and figures["mid_step_kills"] >= 2
    assert figures["broker_restarts"] == 1
    (broker,) = [kill for kill in figures["killed"] if kill["kind"] == "broker"]
    assert {"broker", "sharder", "controller", "monitor", "workers"} <= set(broker["parts"])
    assert figures["survived"] == figures["kills"]
    assert all(kill["lost_s"] is not None and kill["lost_s"] > 0 for kill in figures["killed"])


def check_exactly_once(figures: dict, out, ledgers: list[str]) -> None:
    assert figures["passed"] and figures["audit_clean"]
    (epoch,) = figures["audit"]["epochs"]
    assert (
        epoch["samples_done_once"] == epoch["samples"] == 16384
        and epoch["samples_applied_twice"] == 0
    )
    ledger = figures["ledger"]
    assert ledger["ok"] and ledger["findings"] == [] and ledger["compared_with_log"] == [0]
    for path in ledgers:
        counts = np.load(out / path)
        assert counts.shape == (16384,) and (counts == 1).all(), path


def test_async_every_kill_is_survived_with_the_parameter_server_and_every_service_killed_once(
    asynchronous,
):
    figures, _ = asynchronous
    check_kills(figures, ["controller", "monitor", "ps-0", "sharder"])
    assert any(kill.get("mid_step") == "push" for kill in figures["killed"])


def test_async_every_sample_is_in_the_shared_model_exactly_once(asynchronous):
    figures, out = asynchronous
    check_exactly_once(figures, out, ["ps-0/ledger-epoch0.npy"])
    assert figures["heldout_accuracy"] > 0.5  # the shared model learnt (chance is 0.1)
