"""``antdt bench``: one scenario under the baseline and each part of antdt, against the ideal.

Plans, in order: static sharding with BSP (the baseline), dynamic sharding
alone, antdt with AntDT-ND, antdt with AntDT-DD. For each: wall time, the
ideal time (total work / the workers' summed speed), efficiency = ideal /
wall, and the speedup over the baseline.
"""

from __future__ import annotations

import orjson
import typer
from rich.console import Console
from rich.table import Table

from antdt.cli.demo_cmd import SCENARIO_HELP, default_out, load_scenario
from antdt.demo.environment import run_bus
from antdt.shutdown import interrupt_on_sigterm

ALL_PLANS = "static-bsp,dynamic,nd,dd"


def bench(
    scenario: str = typer.Option("standard", "--scenario", help=SCENARIO_HELP),
    plans: str = typer.Option(ALL_PLANS, "--plans", help=f"Comma-separated subset of {ALL_PLANS}."),
    workers: int | None = typer.Option(None, "--workers", min=2, max=64, help="Run this many of the scenario's workers."),
    json_: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    out: str | None = typer.Option(None, "--out", help="Report directory (default reports/bench-<time>)."),
) -> None:
    """Measure a scenario under static BSP, dynamic sharding, AntDT-ND and AntDT-DD."""
    from pathlib import Path

    from antdt.demo.harness import PLANS, run_plan
    from antdt.demo.report import audit_word, write_report

    chosen = load_scenario(scenario, workers)
    names = [name.strip() for name in plans.split(",") if name.strip()]
    unknown = [name for name in names if name not in PLANS]
    if unknown or not names:
        raise typer.BadParameter(f"unknown plan(s) {', '.join(unknown) or '(none)'}; choose from {ALL_PLANS}",
                                 param_hint="'--plans'")
    out_dir = Path(out) if out else default_out("bench")
    console = Console(stderr=json_)
    results = []
    ideal = chosen.ideal_time_s()
    console.print(f"[bold]antdt bench[/bold]: scenario {chosen.name}, ideal {ideal:.1f} s")
    with interrupt_on_sigterm():
        for name in names:
            # Each plan on a fresh embedded broker: no plan pays for the records an earlier one left.
            with run_bus() as (settings, where):
                console.print(f"running {PLANS[name].label} on {where}...")
                result = run_plan(chosen, PLANS[name], settings, out_dir / name)
            console.print(f"  {result.wall_s:.1f} s, efficiency {result.efficiency:.3f}")
            results.append(result)
    baseline = next((r for r in results if r.plan.name == "static-bsp"), None)
    files = write_report(results, out_dir, baseline)
    figures = [figures_of(r, baseline) for r in results]
    if json_:
        typer.echo(orjson.dumps({"scenario": chosen.name, "ideal_s": round(ideal, 3),
                                 "plans": figures, "report": [str(f) for f in files]}, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table("plan", "wall s", "ideal s", "efficiency", "speedup", "commands", "restarts", "audit")
    for row in figures:
        table.add_row(row["label"], f"{row['wall_s']:.1f}", f"{row['ideal_s']:.1f}", f"{row['efficiency']:.3f}",
                      "-" if row["speedup"] is None else f"{row['speedup']:.2f}x", str(row["commands"]),
                      str(row["restarts"]), audit_word(row["audit_clean"]))
    console.print(table)
    console.print("report: " + ", ".join(str(f) for f in files))


def figures_of(result, baseline) -> dict:
    from antdt.demo.report import reactions, time_split, worker_splits

    return {
        "plan": result.plan.name, "label": result.plan.label, "wall_s": round(result.wall_s, 3),
        "ideal_s": round(result.ideal_s, 3), "efficiency": round(result.efficiency, 4),
        "speedup": None if baseline is None else round(result.speedup_over(baseline), 3),
        "samples": result.samples, "verdicts": result.timeline.verdicts, "commands": result.commands,
        "restarts": result.restarts, "audit_clean": result.audit_ok, "job_id": result.job_id,
        "mean_worker_s": time_split(result), "per_worker_s": worker_splits(result), "reactions": reactions(result),
    }
