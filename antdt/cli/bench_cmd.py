"""``antdt bench``: one scenario under the baseline and each part of antdt, against the ideal.

Plans, in order: static sharding with BSP (the baseline), dynamic sharding
alone (parameter server), antdt with AntDT-ND (parameter server), antdt with
AntDT-DD (all-reduce, batches sized in-band every step); on request also
``static-async`` (parameter server, each worker its own shards: the baseline
of asynchronous training when static BSP is not run) and ``dd-commands``
(AntDT-DD sized by the controller's commands) and ``partial-reduce`` (replicas
averaged in small groups of the first workers ready, docs/partial-reduce.md).
For each: wall time, the ideal time (total work / the
workers' summed speed), efficiency = ideal / wall, the speedup over the
baseline, the shared model's held-out loss and accuracy, the time to the
scenario's ``target_loss`` (when its held-out loss first reached it, and the
speedup to it over the baseline), and whether the model's ledger shows every
sample exactly once (and agrees with the log's audit).

``--repeat N`` runs each plan N times (each on a fresh embedded broker) and
reports every run and the median, min and max; the report's plots show each
plan's median run. A run that fails (an error, a timeout) is reported with
its reason and the other runs go on; ``antdt bench`` then exits 1, as it
does when a run's audit or ledger fails.
"""

from __future__ import annotations

import statistics

import orjson
import typer
from rich.console import Console

from antdt.cli.demo_cmd import SCENARIO_HELP, default_out, load_scenario
from antdt.cli.tables import WIDE_HELP, Column, NarrowTable
from antdt.demo.convergence import time_to_target
from antdt.demo.environment import run_bus
from antdt.errors import AntdtError
from antdt.runtime.shutdown import interrupt_on_sigterm

ALL_PLANS = "static-bsp,dynamic,nd,dd"
#: The plan speedups are measured against: the first of these that was run.
BASELINES = ("static-bsp", "static-async")


def bench(
    scenario: str = typer.Option("standard", "--scenario", help=SCENARIO_HELP),
    plans: str = typer.Option(
        ALL_PLANS,
        "--plans",
        help=f"Comma-separated subset of {ALL_PLANS}, static-async, dd-commands, partial-reduce.",
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=2, max=64, help="Run this many of the scenario's workers."
    ),
    repeat: int = typer.Option(1, "--repeat", min=1, max=50, help="Run each plan this many times."),
    json_: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    out: str | None = typer.Option(
        None, "--out", help="Report directory (default reports/bench-<time>)."
    ),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
) -> None:
    """Measure a scenario under static BSP, dynamic sharding, AntDT-ND and AntDT-DD."""
    from pathlib import Path

    from antdt.demo.plans import PLANS

    chosen = load_scenario(scenario, workers)
    names = [name.strip() for name in plans.split(",") if name.strip()]
    unknown = [name for name in names if name not in PLANS]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown plan(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(PLANS)}",
            param_hint="'--plans'",
        )
    from antdt.demo.report import write_report  # after the arguments: it loads torch

    out_dir = Path(out) if out else default_out("bench")
    console = Console(stderr=json_)
    ideal = chosen.ideal_time_s()
    console.print(
        f"[bold]antdt bench[/bold]: scenario {chosen.name}, ideal {ideal:.1f} s, "
        f"{repeat} run(s) per plan"
    )
    with interrupt_on_sigterm():
        outcomes = {
            name: run_repeatedly(chosen, PLANS[name], out_dir / name, repeat, console)
            for name in names
        }
    medians = [median_run(runs) for runs in outcomes.values() if median_run(runs) is not None]
    baseline = next((r for name in BASELINES for r in medians if r.plan.name == name), None)
    files = write_report(medians, out_dir, baseline) if medians else []
    figures = add_speedups_to_target(
        [plan_figures(name, runs, baseline) for name, runs in outcomes.items()]
    )
    if json_:
        typer.echo(
            orjson.dumps(
                {
                    "scenario": chosen.name,
                    "ideal_s": round(ideal, 3),
                    "repeat": repeat,
                    "plans": figures,
                    "report": [str(f) for f in files],
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    else:
        show(console, figures, files, wide)
    failed = [f"{row['plan']}: {reason}" for row in figures for reason in row["failures"]]
    if failed:
        console.print("[red]failed:[/red] " + "; ".join(failed))
        raise typer.Exit(1)


def run_repeatedly(scenario, plan, out_dir, repeat: int, console) -> list:
    """Each run's RunResult, or the one-line reason it failed."""
    from antdt.demo.harness import run_plan

    runs = []
    for index in range(repeat):
        # Each run on a fresh embedded broker: no run pays for the records an earlier one left.
        run_dir = out_dir if repeat == 1 else out_dir / f"run-{index + 1}"
        try:
            with run_bus() as (settings, where):
                console.print(f"running {plan.label} ({index + 1}/{repeat}) on {where}...")
                result = run_plan(scenario, plan, settings, run_dir)
        except AntdtError as exc:
            reason = str(exc).strip().splitlines()[0]
            console.print(f"  [red]failed[/red]: {reason}")
            runs.append(reason)
            continue
        console.print(f"  {result.wall_s:.1f} s, efficiency {result.efficiency:.3f}")
        runs.append(result)
    return runs


def median_run(runs: list):
    """The run of median wall time (the lower middle one of an even count), or None if every run
    failed."""
    done = sorted((r for r in runs if not isinstance(r, str)), key=lambda r: r.wall_s)
    return done[(len(done) - 1) // 2] if done else None


def plan_figures(name: str, runs: list, baseline) -> dict:
    """The plan's runs, their spread, and (at the top level) the median run's figures."""
    done = [r for r in runs if not isinstance(r, str)]
    each = [run_figures(r, baseline) for r in done]
    failures = [r for r in runs if isinstance(r, str)]
    failures += [
        f"run {i + 1}: the audit or the ledger does not show every sample exactly once"
        for i, row in enumerate(each)
        if row["audit_clean"] is False or not row["ledger"]["ok"]
    ]
    median = median_run(runs)
    row = {
        "plan": name,
        **(run_figures(median, baseline) if median is not None else {}),
        "runs": each,
        "failures": failures,
    }
    for key in ("wall_s", "efficiency", "heldout_loss", "heldout_accuracy", "time_to_target_s"):
        row.update(spread(key, [r[key] for r in each if r[key] is not None]))
    # Runs that never reached the target have no time to it: the spread is over those that did, so
    # say how many.
    targeted = bool(each) and each[0]["target_loss"] is not None
    row["reached_target"] = (
        sum(r["time_to_target_s"] is not None for r in each) if targeted else None
    )
    return row


def spread(key: str, values: list[float]) -> dict:
    """``median_<key>``, ``min_<key>`` and ``max_<key>`` of the values (None for each without
    one)."""
    return {
        f"median_{key}": round(statistics.median(values), 4) if values else None,
        f"min_{key}": min(values) if values else None,
        f"max_{key}": max(values) if values else None,
    }


def add_speedups_to_target(figures: list[dict]) -> list[dict]:
    """Each plan's ``speedup_to_target``: the baseline's median time to the target over its own
    (None if either lacks one).

    The baseline is the first of :data:`BASELINES` with a run that finished, as for the wall-time
    speedup.
    """
    base = next(
        (row for name in BASELINES for row in figures if row["plan"] == name and row["runs"]), None
    )
    base_s = None if base is None else base["median_time_to_target_s"]
    for row in figures:
        mine = row.get("median_time_to_target_s")
        row["speedup_to_target"] = round(base_s / mine, 3) if base_s is not None and mine else None
    return figures


def run_figures(result, baseline) -> dict:
    from antdt.demo.report import (
        command_counts,
        largest_loss_gap,
        reactions,
        time_split,
        worker_splits,
    )

    gap = (
        largest_loss_gap(result, baseline)
        if baseline is not None and result.loss_per_step
        else None
    )
    target = result.scenario.target_loss
    reached = time_to_target(
        result.loss_curve,
        target,
        result.wall_s,
        None if result.heldout is None else result.heldout[0],
    )

    return {
        "plan": result.plan.name,
        "label": result.plan.label,
        "wall_s": round(result.wall_s, 3),
        "ideal_s": round(result.ideal_s, 3),
        "efficiency": round(result.efficiency, 4),
        "speedup": None if baseline is None else round(result.speedup_over(baseline), 3),
        "samples": result.samples,
        "verdicts": result.timeline.verdicts,
        "commands": result.commands,
        "command_counts": command_counts(result),
        "final_batch_sizes": {
            w: t.batch_size
            for w, t in result.timeline.snapshot()[0].items()
            if w in {spec.name for spec in result.scenario.workers}
        },
        "loss_gap_to_baseline": None
        if gap is None
        else {"largest": round(gap[0], 4), "after_global_batches": gap[1]},
        "restarts": result.restarts,
        "audit_clean": result.audit_ok,
        "ledger": result.ledger.to_dict(),
        "moves": [
            {
                "t": round(m.t, 2),
                "process": m.process,
                "from": m.source,
                "to": m.target,
                "reason": m.reason,
                "onto_healthy": m.helped and result.scenario.node(m.target).healthy_at(m.t),
            }
            for m in result.moves
        ],
        "slow_hardware_restarted": sorted(
            {
                m.process
                for m in result.moves
                if result.scenario.node(result.scenario.home(m.process)).speed < 1
            }
        ),
        "heldout_loss": None if result.heldout is None else round(result.heldout[0], 4),
        "heldout_accuracy": None if result.heldout is None else round(result.heldout[1], 4),
        "target_loss": target,
        "time_to_target_s": None if reached is None else round(reached, 3),
        "job_id": result.job_id,
        "mean_worker_s": time_split(result),
        "per_worker_s": worker_splits(result),
        "reactions": reactions(result),
        "groups": result.groups,
    }


BENCH_COLUMNS = [
    Column("plan", free_text=True),
    Column("runs", wide_only=True),
    Column("wall s"),
    Column("efficiency", wide_only=True),
    Column("speedup"),
    Column("to target s"),
    Column("held-out acc", wide_only=True),
    Column("commands", wide_only=True),
    Column("audit"),
    Column("ledger"),
]


def show(console: Console, figures: list[dict], files, wide: bool = False) -> None:
    from antdt.demo.report import audit_word

    table = NarrowTable(BENCH_COLUMNS, wide, title="each plan's runs: median (min-max)")
    for row in figures:
        if not row["runs"]:
            table.add(row["plan"], "0", *["-"] * 8)
            continue
        table.add(
            row["label"],
            str(len(row["runs"])),
            f"{row['median_wall_s']:.1f} ({row['min_wall_s']:.1f}-{row['max_wall_s']:.1f})",
            (
                f"{row['median_efficiency']:.3f} "
                f"({row['min_efficiency']:.3f}-{row['max_efficiency']:.3f})"
            ),
            "-" if row["speedup"] is None else f"{row['speedup']:.2f}x",
            to_target_cell(row),
            "-" if row["heldout_accuracy"] is None else f"{row['heldout_accuracy']:.3f}",
            str(row["commands"]),
            audit_word(row["audit_clean"]),
            "ones" if row["ledger"]["ok"] else "FAILED",
        )
    table.print(console)
    if any(row.get("target_loss") is not None for row in figures):
        target = next(row["target_loss"] for row in figures if row.get("target_loss") is not None)
        console.print(
            f"to target: seconds until the held-out loss first reached {target:g} "
            "(runs that reached it / runs)"
        )
    if files:
        console.print("report: " + ", ".join(str(f) for f in files))


def to_target_cell(row: dict) -> str:
    """The median time to the target and how many runs reached it (``-`` without a target)."""
    if row["reached_target"] is None:
        return "-"
    median = row["median_time_to_target_s"]
    return (
        f"{'-' if median is None else f'{median:.1f}'} ({row['reached_target']}/{len(row['runs'])})"
    )
