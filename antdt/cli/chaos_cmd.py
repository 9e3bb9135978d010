"""``antdt chaos``: one epoch of a scenario under AntDT-ND while workers and services are killed with SIGKILL.

The evidence that a crash loses no data: each victim is restarted at once
(as an orchestrator would), the epoch must finish, and the shard log's audit
must show every sample trained exactly once. Prints each kill and the time
lost to it.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import typer
from rich.console import Console
from rich.table import Table

from antdt.cli.demo_cmd import SCENARIO_HELP, default_out, load_scenario
from antdt.demo.environment import bus_and_broker, external_bus
from antdt.shutdown import interrupt_on_sigterm


def chaos(
    scenario: str = typer.Option("standard", "--scenario", help=SCENARIO_HELP),
    epochs: int = typer.Option(1, "--epochs", min=1, max=100, help="Shorten (or lengthen) the scenario to this many epochs."),
    worker_every: float = typer.Option(10.0, "--worker-every", min=0.0,
                                       help="Kill a random worker about this often (s); 0 for none."),
    services_at: str = typer.Option("sharder=6,controller=12,monitor=18", "--services-at",
                                    help="SERVICE=SECONDS,...: kill each once at that time ('' for none)."),
    broker_at: float | None = typer.Option(None, "--broker-at", min=0.0,
                                           help="Kill the embedded broker at this time (s) and start it again, empty."),
    seed: int = typer.Option(0, "--seed", help="Which workers are picked."),
    json_: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default reports/chaos-<time>)."),
) -> None:
    """Kill -9 workers, services or the broker during an epoch; check the audit and time each recovery."""
    from antdt.demo.chaos import Chaos, ChaosSpec
    from antdt.demo.harness import PLANS, run_plan

    if 0 < worker_every < 1:
        raise typer.BadParameter("kill workers at most once a second, or 0 for none", param_hint="'--worker-every'")
    spec = ChaosSpec(worker_every, parse_service_times(services_at), seed, broker_at)
    chosen = load_scenario(scenario, None).model_copy(update={"epochs": epochs})
    out_dir = default_out("chaos") if out is None else Path(out)
    console = Console(stderr=json_)
    console.print(f"[bold]antdt chaos[/bold]: {chosen.name}, {epochs} epoch(s), ideal {chosen.ideal_time_s():.1f} s")
    if broker_at is not None and external_bus():
        raise typer.BadParameter("a broker restart needs the embedded broker: unset ANTDT_BOOTSTRAP_SERVERS",
                                 param_hint="'--broker-at'")
    with interrupt_on_sigterm(), bus_and_broker() as (settings, where, broker):
        the_chaos = Chaos(spec, broker)
        console.print(f"running AntDT-ND on {where}, killing as it goes...")
        result = run_plan(chosen, PLANS["nd"], settings, out_dir, chaos=the_chaos)
    figures = chaos_figures(result, the_chaos)
    if json_:
        typer.echo(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())
    else:
        show(console, figures)
    if not figures["audit_clean"] or figures["survived"] < figures["kills"]:
        raise typer.Exit(1)


def parse_service_times(text: str) -> dict[str, float]:
    """``sharder=6,monitor=18`` → {"sharder": 6.0, "monitor": 18.0}; a bad entry is a one-line usage error."""
    times = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = entry.partition("=")
        if not sep or name not in ("sharder", "monitor", "controller"):
            raise typer.BadParameter(f"{entry!r}: expected sharder|monitor|controller=SECONDS", param_hint="'--services-at'")
        try:
            times[name] = float(value)
        except ValueError:
            raise typer.BadParameter(f"{entry!r}: {value!r} is not a number", param_hint="'--services-at'") from None
    return times


def chaos_figures(result, the_chaos) -> dict:
    lost = [kill.lost_s for kill in the_chaos.kills if kill.lost_s is not None]
    return {
        "scenario": result.scenario.name, "epochs": result.scenario.epochs, "job_id": result.job_id,
        "wall_s": round(result.wall_s, 3), "ideal_s": round(result.ideal_s, 3), "efficiency": round(result.efficiency, 4),
        "kills": len(the_chaos.kills), "survived": the_chaos.survived, "restarts": result.restarts,
        "max_lost_s": round(max(lost), 2) if lost else None, "audit_clean": result.audit_ok,
        "audit": result.audit, "killed": [kill.to_dict() for kill in the_chaos.kills],
    }


def show(console: Console, figures: dict) -> None:
    table = Table("at s", "killed", "kind", "back after s", "parts back after s")
    for kill in figures["killed"]:
        parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in kill.get("parts", {}).items())
        table.add_row(f"{kill['at_s']:.1f}", kill["target"], kill["kind"],
                      "not back" if kill["lost_s"] is None else f"{kill['lost_s']:.1f}", parts)
    console.print(table)
    console.print(f"{figures['survived']}/{figures['kills']} kills survived; wall {figures['wall_s']:.1f} s "
                  f"(ideal {figures['ideal_s']:.1f} s); audit: {'clean' if figures['audit_clean'] else 'NOT CLEAN'}")
