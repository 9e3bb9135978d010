"""The report: plots and a summary from a run's timeline (a run put together here, no bus)."""

from __future__ import annotations

import pytest

from antdt.demo.harness import RunResult
from antdt.demo.plans import PLANS, demo_plan
from antdt.demo.report import cumulative, write_report
from antdt.demo.scenario import ClusterMode, Scenario
from antdt.demo.timeline import CommandLine, Marker, Point, Timeline
from antdt.services.sharder.audit import LedgerCheck
from antdt.settings import load_settings
from antdt.training import TrainingMode

PNG = b"\x89PNG\r\n\x1a\n"


def made_up_run(plan: str, wall_s: float, audit: dict | None) -> RunResult:
    scenario = Scenario.load("short")
    timeline = Timeline(load_settings(), "job", [w.name for w in scenario.workers])
    for rank, worker in enumerate(scenario.workers):
        rate = scenario.speed_at(rank, 0)
        timeline.workers[worker.name].points = [
            Point(t * 0.5, rate, 32, int(rate * 0.5)) for t in range(1, 20)
        ]
    timeline.markers = [
        Marker(2.0, "w2", "verdict", "DETERMINISTIC straggler x3.0"),
        Marker(2.1, "w2", "command", "SET_SHARD_QUOTA 1"),
    ]
    timeline.commands = [CommandLine(2.1, "w2", "SET_SHARD_QUOTA 1", {"APPLIED": 1})]
    ledger = LedgerCheck(files=["ledger-epoch0.npy"], compared_epochs=[0] if audit else [])
    curve = [(t * 1.0, 2.0 / (t + 1), min(0.99, 0.1 + t / 10)) for t in range(10)]
    return RunResult(
        PLANS[plan],
        scenario,
        f"job-{plan}",
        wall_s,
        scenario.ideal_time_s(),
        scenario.total_samples,
        0,
        timeline,
        audit,
        ledger=ledger,
        heldout=curve[-1][1:],
        loss_curve=curve,
    )


def test_the_report_has_the_plots_and_a_summary_with_the_figures(tmp_path):
    clean = {
        "ok": True,
        "finished": True,
        "violations": [],
        "epochs": [{"samples_done_once": 6144}],
    }
    baseline, nd = made_up_run("static-bsp", 30.0, None), made_up_run("nd", 8.0, clean)
    files = write_report([baseline, nd], tmp_path, baseline)
    names = sorted(f.name for f in files)
    assert names == [
        "loss.png",
        "progress.png",
        "summary.md",
        "throughput-nd.png",
        "throughput-static-bsp.png",
    ]
    for png in (f for f in files if f.suffix == ".png"):
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
    summary = (tmp_path / "summary.md").read_text()
    assert (
        f"| antdt, AntDT-ND (PS) | 8.0 s | {nd.ideal_s:.1f} s | {nd.efficiency:.3f} "
        "| 3.75x | 0.200 | 0.990 | 1 | 0 "
        "| clean | ones |"
    ) in summary
    assert "- held-out: loss 0.200, accuracy 0.990" in summary
    assert "- ledger: all ones (1 file(s)), agreeing with the log for epoch(s) [0]" in summary
    assert "| static sharding, BSP (baseline) | 30.0 s |" in summary
    assert "| 2.1 s | w2 | SET_SHARD_QUOTA 1 | applied 1 |" in summary
    assert (
        "clean: every sample trained exactly once in each of 1 epoch(s) (6,144 samples in all)"
        in summary
    )


def test_cumulative_samples_add_up_every_worker_report():
    run = made_up_run("nd", 10.0, None)
    times, totals = cumulative(run)
    assert times == sorted(times) and totals == sorted(totals)
    assert totals[-1] == sum(
        p.samples for track in run.timeline.workers.values() for p in track.points
    )


def test_the_demo_plan_follows_the_scenario_mode_and_the_policy():
    short = Scenario.load("short")
    assert demo_plan(short, None) == PLANS["nd"]
    assert demo_plan(short, "off") == PLANS["dynamic"]
    dd = short.model_copy(update={"mode": ClusterMode.DD})
    assert demo_plan(dd, None) == PLANS["dd"]
    off = demo_plan(dd, "off")
    assert off.training is TrainingMode.SYNC and off.policy is None


def test_the_dashboard_shows_workers_commands_and_progress():
    from rich.console import Console

    from antdt.demo.dashboard import Dashboard

    run = made_up_run("nd", 10.0, None)
    run.timeline.workers["w2"].verdict = "DETERMINISTIC straggler"
    console = Console(record=True, width=140, force_terminal=False)
    view = Dashboard(run.scenario, "short: antdt, AntDT-ND", console)
    console.print(view._render(run.timeline, 5.0))
    text = console.export_text()
    assert "DETERMINISTIC straggler" in text and "SET_SHARD_QUOTA 1" in text and "applied 1" in text
    assert "epoch 1/1" in text and "1 commands" in text
    for worker in ("w0", "w1", "w2"):
        assert worker in text


def test_the_audit_line_names_violations_or_an_unfinished_log():
    from antdt.demo.report import audit_text

    broken = {
        "ok": False,
        "finished": True,
        "violations": ["epoch 0: shard 3 done twice"],
        "epochs": [],
    }
    unfinished = {"ok": True, "finished": False, "violations": [], "epochs": []}
    assert audit_text(made_up_run("nd", 8.0, broken)) == "VIOLATIONS: epoch 0: shard 3 done twice"
    assert audit_text(made_up_run("nd", 8.0, unfinished)) == "job not finished: the log has no end"
    assert audit_text(made_up_run("static-bsp", 8.0, None)).startswith("no sharder")


def test_the_loss_gap_compares_smoothed_curves_over_common_steps():
    from types import SimpleNamespace

    from antdt.demo.report import largest_loss_gap, smoothed

    assert smoothed([(0, 1.0), (1, 3.0), (2, 5.0)], width=2) == {1: 2.0, 2: 4.0}
    ours = SimpleNamespace(loss_per_step=[(s, 2.0 - s / 100) for s in range(40)])
    theirs = SimpleNamespace(
        loss_per_step=[(s, 2.0 - s / 100 + (0.05 if s == 25 else 0.0)) for s in range(30)]
    )
    gap, step = largest_loss_gap(ours, theirs)
    # one step 0.05 off, spread over a 10-step mean
    assert gap == pytest.approx(0.005) and 25 <= step <= 29
    assert largest_loss_gap(ours, SimpleNamespace(loss_per_step=[])) is None


def test_the_summary_says_when_each_plan_reached_the_target_loss(tmp_path):
    import dataclasses

    from antdt.demo.report import plot_loss, target_text, write_summary

    run = made_up_run("nd", 10.0, None)  # held-out loss 2 / (t + 1) at t = 0..9 s, final 0.2
    aimed = dataclasses.replace(run, scenario=run.scenario.model_copy(update={"target_loss": 0.5}))
    assert target_text(run) is None
    assert (
        target_text(aimed)
        == "held-out loss 0.5 reached after 3.0 s (first evaluation at or below it)"
    )
    missed = dataclasses.replace(run, scenario=run.scenario.model_copy(update={"target_loss": 0.1}))
    assert target_text(missed) == "held-out loss 0.1 not reached"
    summary = write_summary([aimed], tmp_path, []).read_text()
    assert "- target: held-out loss 0.5 reached after 3.0 s" in summary
    assert "- target:" not in write_summary([run], tmp_path, []).read_text()
    # the target dashed across
    assert plot_loss([aimed], tmp_path / "loss.png").read_bytes()[:8] == PNG
