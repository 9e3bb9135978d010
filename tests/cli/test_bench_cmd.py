"""``antdt bench``'s figures from made-up runs: spreads, the time to the target loss and its
speedup."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from antdt.cli.bench_cmd import add_speedups_to_target, plan_figures, run_figures, show
from tests.demo.test_report import made_up_run


def run(
    plan: str, wall_s: float, target: float | None = 0.5, speed: float = 1.0, final: float = 0.2
):
    """A made-up run whose held-out loss is 2 / (t * speed + 1), measured every second (0.5 first at
    3 s / speed)."""
    made = made_up_run(plan, wall_s, None)
    scenario = made.scenario.model_copy(update={"target_loss": target})
    curve = [(float(t), 2.0 / (t * speed + 1), 0.5) for t in range(int(wall_s))]
    return dataclasses.replace(made, scenario=scenario, loss_curve=curve, heldout=(final, 0.9))


def test_a_run_reports_the_target_and_the_time_to_it():
    figures = run_figures(run("nd", 10.0), None)
    assert figures["target_loss"] == 0.5 and figures["time_to_target_s"] == 3.0
    assert run_figures(run("nd", 10.0, target=0.15), None)["time_to_target_s"] is None
    assert run_figures(run("nd", 10.0, target=0.15, final=0.1), None)["time_to_target_s"] == 10.0
    untargeted = run_figures(run("nd", 10.0, target=None), None)
    assert untargeted["target_loss"] is None and untargeted["time_to_target_s"] is None


def test_the_plan_spread_counts_only_the_runs_that_reached_the_target():
    runs = [
        run("nd", 10.0),
        run("nd", 12.0, speed=0.5),
        run("nd", 11.0, speed=0.1, final=0.9),
        "timed out",
    ]
    row = plan_figures("nd", runs, None)
    assert row["reached_target"] == 2 and len(row["runs"]) == 3
    assert (
        row["median_time_to_target_s"],
        row["min_time_to_target_s"],
        row["max_time_to_target_s"],
    ) == (4.5, 3.0, 6.0)
    assert (row["median_heldout_loss"], row["min_heldout_loss"], row["max_heldout_loss"]) == (
        0.2,
        0.2,
        0.9,
    )
    assert row["median_heldout_accuracy"] == 0.9
    assert plan_figures("nd", [run("nd", 10.0, target=None)], None)["reached_target"] is None
    failed = plan_figures("nd", ["timed out"], None)
    assert failed["median_time_to_target_s"] is None and failed["reached_target"] is None


def test_the_speedup_to_target_is_over_the_first_baseline_that_ran():
    figures = add_speedups_to_target(
        [
            plan_figures("static-bsp", ["timed out"], None),
            plan_figures("static-async", [run("static-async", 20.0, speed=0.5)], None),
            plan_figures("nd", [run("nd", 10.0)], None),
            plan_figures("dd", [run("dd", 10.0, target=0.15)], None),
        ]
    )
    assert [row["speedup_to_target"] for row in figures] == [None, 1.0, 2.0, None]
    alone = add_speedups_to_target([plan_figures("nd", [run("nd", 10.0)], None)])
    assert alone[0]["speedup_to_target"] is None  # no baseline ran


def test_the_table_shows_the_median_time_to_target_and_how_many_runs_reached_it():
    figures = add_speedups_to_target(
        [
            plan_figures("nd", [run("nd", 10.0), run("nd", 11.0, speed=0.1, final=0.9)], None),
            plan_figures("dd", ["timed out"], None),
        ]
    )
    console = Console(record=True, width=200, force_terminal=False)
    show(console, figures, [])
    text = console.export_text()
    assert "to target s" in text and "3.0 (1/2)" in text
    assert "held-out loss first reached 0.5" in text
