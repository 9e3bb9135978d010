"""``antdt demo`` and ``antdt bench`` as a user runs them: real services, real workers, the embedded
broker."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import ANTDT

PNG = b"\x89PNG\r\n\x1a\n"


def antdt(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([ANTDT, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_short_demo_ends_with_a_clean_audit_and_the_report(tmp_path):
    said = assert_short_demo_succeeded(short_demo(tmp_path), tmp_path)
    # its own embedded broker, tuned for (tests/cli/test_demo_kafka_profile.py runs the other one)
    assert "kafka clients: broker profile embedded, enable.idempotence=false" in said


def short_demo(out: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``antdt demo`` on the short scenario, on the bus the environment names (default: its own
    embedded broker)."""
    return antdt(
        "demo", "--scenario", "short", "--no-dashboard", "--out", str(out), timeout=timeout
    )


def assert_short_demo_succeeded(result: subprocess.CompletedProcess, out: Path) -> str:
    """The short demo's promises: the straggler throttled, every sample trained exactly once, the
    report written. Returns what the demo said, its lines unfolded."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    said = " ".join(result.stdout.split())  # rich folds long lines at 80 columns
    assert (
        "audit: clean: every sample trained exactly once "
        "in each of 1 epoch(s) (6,144 samples in all)" in said
    )
    assert "ledger: all ones (1 file(s)), agreeing with the log for epoch(s) [0]" in said
    assert "efficiency" in said and "held-out: loss" in said
    for name in ("progress.png", "throughput.png"):
        assert (out / name).read_bytes()[:8] == PNG
    summary = (out / "summary.md").read_text()
    # the slow worker was throttled
    assert "## antdt, AntDT-ND" in summary and "SET_SHARD_QUOTA 1" in summary
    assert list((out / "logs").glob("worker-*.log"))
    return said


def median_batch(trace: Path) -> float:
    """A worker's median samples per step over the run, from its step trace."""
    with trace.open() as rows:
        return statistics.median(int(row["samples"]) for row in csv.DictReader(rows))


@pytest.mark.slow
@pytest.mark.e2e
def test_bench_measures_the_baseline_and_dd_against_the_ideal(tmp_path):
    result = antdt(
        "bench", "--scenario", "short", "--plans", "static-bsp,dd", "--json", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(result.stdout)
    baseline, dd = figures["plans"]
    assert (baseline["plan"], dd["plan"]) == ("static-bsp", "dd")
    for plan in (baseline, dd):
        assert plan["samples"] == 6144 and plan["ideal_s"] == figures["ideal_s"]
        assert plan["efficiency"] == pytest.approx(plan["ideal_s"] / plan["wall_s"], abs=1e-3)
    assert baseline["audit_clean"] is None and baseline["speedup"] == 1.0
    # sized in-band: the controller sends nothing
    assert dd["audit_clean"] is True and dd["commands"] == 0
    # BSP waits for the 3x slower w2 every step; DD gives it less than an even share over the
    # run (its median step), and the global batch never moves. The last split alone is one
    # in-band decision: on this loaded machine a healthy worker's noisy last step can move it
    # ({w0: 37, w1: 21, w2: 38} in one CI run)
    assert sum(dd["final_batch_sizes"].values()) == 96, dd["final_batch_sizes"]
    medians = {w: median_batch(tmp_path / "dd" / "steps" / f"{w}.csv") for w in ("w0", "w1", "w2")}
    assert medians["w2"] < 96 // 3 < max(medians["w0"], medians["w1"]), medians
    assert baseline["final_batch_sizes"] == {"w0": 32, "w1": 32, "w2": 32}
    assert dd["speedup"] > 1.3, figures
    assert dd["loss_gap_to_baseline"] is not None and dd["loss_gap_to_baseline"]["largest"] < 0.5
    for plan in (baseline, dd):  # the shared model learnt, and its ledger shows every sample once
        assert plan["heldout_accuracy"] > 0.8 and plan["heldout_loss"] < 1.0, plan
        assert plan["ledger"]["ok"] and len(plan["runs"]) == 1 and plan["failures"] == []
        assert plan["median_efficiency"] == plan["runs"][0]["efficiency"]
    assert (tmp_path / "dd" / "ledger-epoch0.npy").exists()
    for name in ("summary.md", "throughput-dd.png", "loss.png", "loss-per-step.png"):
        assert (tmp_path / name).exists(), name


def test_a_broker_restart_needs_the_embedded_broker(monkeypatch):
    # an external bus: nothing here can restart it
    monkeypatch.setenv("ANTDT_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    result = antdt("chaos", "--broker-at", "3", timeout=60)
    assert result.returncode == 2
    assert "a broker restart needs the embedded broker" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("demo", "--scenario", "no-such"), "scenario no-such: "),
        (("demo", "--policy", "fast"), "'fast' is not one of"),
        (("bench", "--plans", "static-bsp,warp"), "unknown plan(s) warp"),
        (("demo", "--workers", "1"), "--workers"),
        (
            ("chaos", "--services-at", "broker=3"),
            "expected sharder|monitor|controller|grouper|ps-<shard>=SECONDS",
        ),
        (("chaos", "--training", "lockstep"), "'lockstep': choose async, sync or preduce"),
        (("chaos", "--worker-every", "0.5"), "kill workers at most once a second, or 0 for none"),
        (
            ("chaos", "--seed", "3", "--broker-at", "4"),
            "--seed draws the whole schedule: drop --broker-at",
        ),
        (("up", "--mode", "lockstep"), "'lockstep' is not one of"),
    ],
)
def test_bad_arguments_are_one_line(args, expected):
    result = antdt(*args, timeout=60)
    assert result.returncode == 2
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
