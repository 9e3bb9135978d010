"""The soak benchmark's verdict (``bench/soak_bench.py``): windows the length of the baseline, each
later one's pooled grant p99 and mean bus CPU within 20 % of the first's, no minute past the
request timeout, memory bounded. Pure functions on made-up minutes: the soak itself takes half an
hour (docs/reliability.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from antdt.loadgen.fleet import Grant, Observations

BENCH = Path(__file__).parents[2] / "bench"
sys.path.append(str(BENCH))  # the bench scripts import as scripts
soak_bench = importlib.import_module("soak_bench")
soak_grants = importlib.import_module("soak_grants")

SERVICES = ("broker", "monitor", "sharder", "controller")
#: A fleet without onsets: the verdict reads only the grants.
FLEET = type("Fleet", (), {"workers": {}, "start": 0.0})


def minute(number: int, cpu: float = 30.0, rss: float = 100.0, rolls: int = 0) -> dict:
    """One sample: each of the bus's processes at ``cpu`` % and ``rss`` MB."""
    return {
        "minute": number,
        "cpu_percent": dict.fromkeys(SERVICES, cpu),
        "rss_mb": dict.fromkeys(SERVICES, rss),
        "broker_rolls": rolls,
    }


def seen_with(latency_ms) -> Observations:
    """100 grants a minute for 10 minutes, each taking ``latency_ms(minute, k)``."""
    seen = Observations()
    for at in range(10):
        for k in range(100):
            seen.grants.append(Grant(60.0 * at + 0.5 * k, latency_ms(at + 1, k) / 1000, 0.0))
    return seen


def judged(samples: list[dict], seen: Observations, size: int = 5) -> list[str]:
    soak_bench.add_latencies(samples, seen, FLEET)
    return soak_bench.verdict(samples, soak_bench.windows(samples, seen, size), size)


def test_windows_pool_the_grants_asked_in_their_minutes():
    samples = [minute(n, cpu=10.0 * n) for n in range(1, 11)]
    seen = seen_with(lambda m, k: 1000.0 * m)
    soak_bench.add_latencies(samples, seen, FLEET)
    spans = soak_bench.windows(samples, seen, 4)
    assert [s["minutes"] for s in spans] == [[1, 4], [5, 8], [9, 10]]
    assert [s["grant_ms"]["n"] for s in spans] == [400, 400, 200]
    assert spans[0]["grant_ms"]["min"] == 1000.0 and spans[0]["grant_ms"]["max"] == 4000.0
    assert spans[1]["bus_cpu_percent"] == 4 * 65.0  # the mean of minutes 5-8, four processes
    assert spans[0]["load_cpu_ms_per_1k_records"] is None  # no load generator in these minutes
    # minute m's grants take m seconds: every one is held (past 0.7 s), none is steady
    assert [s["grants_held"] for s in spans] == [400, 400, 200]
    assert [s["steady_p99_ms"] for s in spans] == [None, None, None]


def test_every_grant_is_written_to_the_csv(tmp_path):
    seen = seen_with(lambda m, k: 10.0 * k)
    path = tmp_path / "grants.csv"
    soak_bench.write_grants(seen.grants, path)
    rows = path.read_text().splitlines()
    assert rows[0] == "asked_s,read_ms,stamped_ms" and len(rows) == 1 + 1000
    assert rows[2] == "0.5,10.0,0.0"


def test_a_flat_soak_passes_though_one_minute_in_a_window_is_slow():
    """A roll's minute has slower grants; a window with one, like the baseline's, is flat."""
    samples = [minute(n, rolls=int(n in (2, 7))) for n in range(1, 11)]
    roll_minutes = {2, 7}
    assert (
        judged(samples, seen_with(lambda m, k: 900.0 if m in roll_minutes and k < 5 else 50.0))
        == []
    )


def test_a_window_whose_p99_grew_by_more_than_a_fifth_fails():
    problems = judged(
        [minute(n) for n in range(1, 11)], seen_with(lambda m, k: 50.0 + 15 * (m > 5))
    )
    assert problems == ["minutes 6-10: grant p99 65.0 ms (baseline 50.0)"]


def test_a_growing_bus_cpu_fails_but_a_quiet_one_is_not_held_to_its_noise():
    samples = [minute(n, cpu=1.0 if n <= 5 else 2.0) for n in range(1, 11)]
    assert judged(samples, seen_with(lambda m, k: 50.0)) == []  # 4 % against 8 %: within 5 points
    samples = [minute(n, cpu=30.0 if n <= 5 else 40.0) for n in range(1, 11)]
    assert judged(samples, seen_with(lambda m, k: 50.0)) == [
        "minutes 6-10: bus CPU 160.0 % of a core (baseline 120.0)"
    ]


def test_a_minute_past_the_request_timeout_fails_even_in_a_flat_window():
    slow = seen_with(lambda m, k: 20_000.0 if m == 8 else 50.0)
    problems = judged([minute(n, rolls=1) for n in range(1, 11)], slow)
    assert "minute 8: grant p99 20000.0 ms" in problems


def test_memory_past_one_and_a_half_times_the_baselines_fails():
    samples = [minute(n, rss=100.0 if n < 10 else 151.0) for n in range(1, 11)]
    problems = judged(samples, seen_with(lambda m, k: 50.0))
    assert problems == [f"{name} RSS 151.0 MB > 1.5x 100.0 MB" for name in SERVICES]


def test_a_run_without_a_window_past_the_baseline_says_so():
    samples = [minute(n) for n in range(1, 5)]
    assert judged(samples, seen_with(lambda m, k: 50.0)) == [
        "the run gave 4 minutes: not enough past the baseline"
    ]


def test_the_soak_ends_at_once_when_antdt_up_has_exited():
    """A service's death ends ``antdt up`` and the broker with it: the soak says so that minute
    instead of sampling a bus that is gone."""
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    ended.wait(30)
    with pytest.raises(SystemExit, match=r"antdt up exited \(code 3\) in minute 4"):
        soak_bench.still_up(ended, 4)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        soak_bench.still_up(running, 4)  # nothing to say while it runs
    finally:
        running.kill()
        running.wait(30)


# ------------------------------------------------------------ what the grants say (soak_grants)


def test_the_held_grants_are_apart_from_the_steady_tail():
    """Five grants of 100 held by a roll; the steady rest's p99 is the tail without them."""
    read_s = [0.01 * k for k in range(1, 36)] + [0.4] * 60 + [1.5, 2.0, 2.5, 0.8, 0.71]
    figures = soak_grants.tail(read_s)
    assert figures["grants_held"] == 5 and figures["held_percent"] == 5.0
    assert figures["steady_p99_ms"] == 400.0 and figures["steady_over_300ms"] == 65
    assert soak_grants.tail([]) == {
        "grants_held": 0,
        "held_percent": 0.0,
        "steady_p99_ms": None,
        "steady_over_300ms": 0,
    }


def test_held_grants_cluster_by_roll():
    """Held grants asked within 10 s of each other are one roll's; a steady grant is no roll's."""
    grants = [(5.0, 1.0), (6.0, 3.0), (7.0, 2.0), (70.0, 0.9), (71.0, 1.1), (100.0, 0.2)]
    figures = soak_grants.rolls_held(grants)
    assert figures["rolls"] == 2 and figures["held_per_roll"] == [3, 2]
    assert figures["median_hold_s"] == {"median": 1.5, "min": 1.0, "max": 2.0}
    assert figures["longest_hold_s"] == 3.0
    assert soak_grants.rolls_held([(1.0, 0.1)]) == {"rolls": 0}


def test_steady_grants_are_binned_by_the_seconds_since_the_last_roll():
    """A roll begins at 60 s (two grants held); steady grants before it are a bin of their own, the
    others fall in the bin of their seconds since the roll, the last bin open-ended."""
    held = [(60.0, 2.0), (61.0, 1.5)]
    before = [(10.0, 0.05), (20.0, 0.05)]
    after = [(62.0, 0.02), (63.0, 0.03), (65.0, 0.04), (75.0, 0.4), (200.0, 0.1)]
    rows = soak_grants.since_roll(held + before + after, bins_s=(0.0, 10.0, 60.0))
    assert [(r["since_s"], r["grants"]) for r in rows] == [
        (None, 2),
        ([0.0, 10.0], 3),
        ([10.0, 60.0], 1),
        ([60.0, None], 1),
    ]
    assert rows[1]["p50_ms"] == 30.0 and rows[1]["p99_ms"] == 40.0
    assert rows[2]["over_300ms_percent"] == 100.0 and rows[1]["over_300ms_percent"] == 0.0
    assert soak_grants.since_roll([]) == []


def test_a_saved_csv_is_read_again_by_window(tmp_path):
    """The soak's CSV read back gives the same windows the soak's minutes pooled."""
    seen = seen_with(lambda m, k: 900.0 if k == 0 else 10.0 * m)
    path = tmp_path / "grants.csv"
    soak_bench.write_grants(seen.grants, path)
    spans = soak_grants.by_window(soak_grants.read_grants(path), 300.0)
    assert [s["grants"] for s in spans] == [500, 500]
    assert [s["grants_held"] for s in spans] == [5, 5]
    assert [s["steady_p99_ms"] for s in spans] == [50.0, 100.0]
    samples = [minute(n) for n in range(1, 11)]
    soak_bench.add_latencies(samples, seen, FLEET)
    pooled = soak_bench.windows(samples, seen, 5)
    assert [s["steady_p99_ms"] for s in pooled] == [s["steady_p99_ms"] for s in spans]


def test_the_grants_cli_rejects_a_missing_file(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "soak_grants.py"), str(tmp_path / "none.csv")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no such file" in done.stderr.splitlines()[-1]


def test_an_onset_is_placed_against_the_rolls_around_it():
    held = [(100.0, 1.5), (101.0, 1.2), (200.0, 1.4)]  # two rolls: at 100 s and at 200 s
    onsets = [(198.0, 5.9), (50.0, 0.3), (130.0, 0.25), (150.0, None)]
    rows = soak_grants.onsets_by_roll(onsets, held + [(120.0, 0.05)])
    assert rows == [
        {"onset_s": 50.0, "to_command_s": 0.3, "since_roll_s": None, "roll_before_command": False},
        {
            "onset_s": 130.0,
            "to_command_s": 0.25,
            "since_roll_s": 30.0,
            "roll_before_command": False,
        },
        {"onset_s": 150.0, "to_command_s": None, "since_roll_s": 50.0, "roll_before_command": True},
        {"onset_s": 198.0, "to_command_s": 5.9, "since_roll_s": 98.0, "roll_before_command": True},
    ]


def test_the_load_generators_cost_per_record_is_the_machines_control():
    minutes = [
        {"cpu_percent": {"loadgen": 12.0}, "records_sent": 110_000},
        {"cpu_percent": {"loadgen": 15.0}, "records_sent": 100_000},
    ]
    # 7.2 + 9.0 CPU seconds for 210,000 records
    assert soak_bench.load_cost(minutes) == round(16.2 / 210_000 * 1e6, 1) == 77.1
    assert soak_bench.load_cost([{"cpu_percent": {"loadgen": 12.0}, "records_sent": 0}]) is None
