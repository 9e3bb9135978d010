"""How ``bench/torchrun_bench.py`` orders its runs and reads them: rounds that run every mode
once, each starting one mode further on, and each round's pair's ratio beside the ratio of the
medians (the runs are stood in for: the bench's own run is in test_user_job_bench.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # the bench scripts import as scripts
torchrun_bench = importlib.import_module("torchrun_bench")


def test_each_round_runs_every_mode_once_and_no_mode_always_runs_first(monkeypatch, tmp_path):
    order: list[str] = []

    def run_once(mode, ranks, slow, args, workdir):
        order.append(mode)
        return {"mode": mode, "round": order.count(mode) - 1}

    monkeypatch.setattr(torchrun_bench, "run_once", run_once)
    modes = ["plain", "beside", "dd"]
    runs = torchrun_bench.interleaved(modes, 2, False, SimpleNamespace(repeat=4), tmp_path)
    rounds = [order[k : k + 3] for k in range(0, len(order), 3)]
    assert all(sorted(r) == sorted(modes) for r in rounds)
    assert [r[0] for r in rounds] == ["plain", "beside", "dd", "plain"]
    assert all([run["round"] for run in runs[mode]] == [0, 1, 2, 3] for mode in modes)


def summary(mode: str, times: list[float]) -> dict:
    runs = [{"train_s": t, "finished": True, "ok": True} for t in times]
    return torchrun_bench.summary(mode, 2, False, runs)


def test_the_overhead_is_the_ratio_of_the_medians_and_the_pairs_are_taken_round_by_round():
    plain = summary("plain", [4.0, 5.0, 4.5])
    ours = summary("dd", [4.4, 5.0, 5.4])
    assert torchrun_bench.compare(ours, plain, slow=False) == ("overhead", 1.111)
    # round by round: 1.1, 1.0, 1.2; the medians' ratio pairs 4.5 with 5.0, from other rounds
    assert ours["paired_overhead"] == {"median": 1.1, "min": 1.0, "max": 1.2}


def test_a_speedup_is_the_baseline_over_ours_and_a_round_missing_a_time_is_left_out():
    plain = summary("plain", [6.0, 8.0, 7.0])
    ours = summary("dd", [3.0, 4.0, 5.0])
    ours["runs"][2]["finished"] = False
    assert torchrun_bench.compare(ours, plain, slow=True) == ("speedup", 1.75)
    assert ours["paired_speedup"] == {"median": 2.0, "min": 2.0, "max": 2.0}


def test_the_services_cpu_is_spread_by_process_over_the_runs_that_timed_each():
    runs = [
        {
            "train_s": 4.0,
            "finished": True,
            "ok": True,
            "services_cpu_s": 2.0,
            "services_cpu_by_process_s": {"broker": 1.2, "sharder": 0.5, "monitor": 0.3},
        },
        {
            "train_s": 4.2,
            "finished": True,
            "ok": True,
            "services_cpu_s": 2.4,
            "services_cpu_by_process_s": {"broker": 1.4, "sharder": 0.6, "monitor": 0.4},
        },
        {
            "train_s": 4.1,
            "finished": True,
            "ok": True,
            "services_cpu_s": 2.2,
            # the monitor was not found at one end of this run: left out of every run's spread
            "services_cpu_by_process_s": {"broker": 1.3, "sharder": 0.7},
        },
    ]
    spreads = torchrun_bench.summary("dd", 2, False, runs)
    assert spreads["services_cpu_s"] == {"median": 2.2, "min": 2.0, "max": 2.4}
    assert spreads["services_cpu_by_process_s"] == {
        "broker": {"median": 1.3, "min": 1.2, "max": 1.4},
        "sharder": {"median": 0.6, "min": 0.5, "max": 0.7},
    }


def test_runs_without_a_bus_have_no_services_figures():
    runs = [{"train_s": 4.0, "finished": True, "ok": True, "job_cpu_s": 30.0}]
    spreads = torchrun_bench.summary("plain", 2, False, runs)
    assert "services_cpu_s" not in spreads and "services_cpu_by_process_s" not in spreads
