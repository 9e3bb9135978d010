"""``antdt demo``: a straggler scenario through the real services, live, with a report at the end.

Starts the embedded broker (or uses ``ANTDT_BOOTSTRAP_SERVERS``), the
monitor, the controller and the sharder, then one process per scenario
worker training a real small model; shows a live dashboard; ends with the
wall time against the ideal, the commands issued and the audit of the
shard log, and writes the report (PNG plots and ``summary.md``).
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from antdt.bus.config import describe_profile
from antdt.demo.environment import run_bus
from antdt.demo.scenario import Scenario
from antdt.runtime.shutdown import interrupt_on_sigterm

SCENARIO_HELP = (
    "A scenario file (YAML or JSON) or a shipped one: standard, fixed-cost, short, contention,"
    " bursty."
)


class PolicyChoice(str, Enum):
    ND = "nd"
    DD = "dd"
    OFF = "off"


def load_scenario(scenario: str, workers: int | None) -> Scenario:
    """The scenario, trimmed or extended to ``workers``; a bad file is a one-line usage error."""
    from antdt.errors import ConfigError

    try:
        loaded = Scenario.load(scenario)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--scenario'") from None
    try:
        return loaded.with_workers(workers) if workers else loaded
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--workers'") from None


def default_out(kind: str) -> Path:
    return Path("reports") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def demo(
    scenario: str = typer.Option("standard", "--scenario", help=SCENARIO_HELP),
    policy: PolicyChoice | None = typer.Option(
        None, "--policy", help="nd, dd or off (default: the scenario's cluster mode)."
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=2, max=64, help="Run this many of the scenario's workers."
    ),
    out: Path | None = typer.Option(
        None, "--out", file_okay=False, help="Report directory (default reports/demo-<time>)."
    ),
    dashboard: bool = typer.Option(
        True, "--dashboard/--no-dashboard", help="Live dashboard (off: one line per 5 s)."
    ),
) -> None:
    """Run a straggler scenario through antdt, live, and write the report (exits 1 if a sample was
    not trained exactly once)."""
    from antdt.demo.plans import demo_plan

    chosen = load_scenario(scenario, workers)
    plan = demo_plan(chosen, policy.value if policy else None)
    # after the arguments are checked: these load torch (seconds), a bad argument's error should not
    from antdt.demo.dashboard import Dashboard
    from antdt.demo.harness import run_plan
    from antdt.demo.report import audit_text, heldout_text, ledger_text, write_report

    out = out or default_out("demo")
    console = Console()
    with interrupt_on_sigterm(), run_bus() as (settings, where):
        console.print(
            f"[bold]antdt demo[/bold]: scenario [cyan]{chosen.name}[/cyan] "
            f"({len(chosen.workers)} workers, {chosen.total_samples:,} samples), {plan.label}, "
            f"on {where}"
        )
        console.print(describe_profile(settings), soft_wrap=True)
        console.print("starting the services and the workers...")
        if dashboard:
            with Dashboard(chosen, f"{chosen.name}: {plan.label}", console) as view:
                result = run_plan(chosen, plan, settings, out, on_tick=view.tick)
        else:
            result = run_plan(chosen, plan, settings, out, on_tick=_plain_ticker(console))
    files = write_report([result], out)
    console.print(
        f"wall time [bold]{result.wall_s:.1f} s[/bold], ideal {result.ideal_s:.1f} s: "
        f"efficiency [bold]{result.efficiency:.3f}[/bold]; {result.timeline.verdicts} verdicts, "
        f"{result.commands} commands, {result.restarts} restarts"
    )
    console.print(f"held-out: {heldout_text(result)}")
    console.print(f"audit: {audit_text(result)}")
    console.print(f"ledger: {ledger_text(result)}")
    console.print("report: " + ", ".join(str(path) for path in files))
    if result.audit_ok is False or not result.ledger.ok:
        raise typer.Exit(1)


def _plain_ticker(console: Console, every_s: float = 5.0):
    """One line every ``every_s``: for logs and CI, where a live view is noise."""
    state = {"next": 0.0}

    def tick(timeline, elapsed_s: float) -> None:
        if elapsed_s >= state["next"]:
            state["next"] = elapsed_s + every_s
            console.print(
                f"{elapsed_s:6.1f} s: {timeline.samples:,} samples, "
                f"{len(timeline.commands)} commands, {timeline.verdicts} verdicts"
            )

    return tick
