"""``antdt chaos``: one epoch of a scenario while workers, the parameter server, the services and
the broker are killed (or, with ``--seed``, hit by a schedule drawn at random: kills, stops, CPU
hogs, a broker restart).

The evidence that a crash loses nothing and trains nothing twice: each victim
is restarted at once (as an orchestrator would), the epoch must finish, the
model's ledger must count every sample exactly once, and the shard log's
audit must be clean and agree with the ledger. Prints each kill and the time
lost to it; exits 1 if any of that fails.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import typer
from rich.console import Console

from antdt.cli.demo_cmd import SCENARIO_HELP, default_out, load_scenario
from antdt.cli.tables import Column, NarrowTable
from antdt.demo.environment import bus_and_broker, external_bus
from antdt.demo.faults import FaultAction, ScheduleShape
from antdt.runtime.shutdown import interrupt_on_sigterm

SERVICES = ("sharder", "monitor", "controller", "grouper")
DEFAULT_SERVICES_AT = "sharder=11,ps-0=14,controller=17,monitor=20"
#: The fixed schedule's options, which a drawn one (--seed) replaces.
FIXED_OPTIONS = (
    "--worker-every",
    "--worker-kills",
    "--mid-step-every",
    "--services-at",
    "--broker-at",
)
CHAOS_CHECKPOINT_S = 2.0
#: --training -> the bench plan a chaos run trains under.
CHAOS_PLANS = {"async": "nd", "sync": "dd", "preduce": "partial-reduce"}


def chaos(
    scenario: str = typer.Option("standard", "--scenario", help=SCENARIO_HELP),
    training: str = typer.Option(
        "async",
        "--training",
        help="async: AntDT-ND with a parameter server; sync: AntDT-DD, all-reduce; "
        "preduce: partial reduce.",
    ),
    epochs: int = typer.Option(
        1,
        "--epochs",
        min=1,
        max=100,
        help="Shorten (or lengthen) the scenario to this many epochs.",
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=2, max=64, help="Run this many of the scenario's workers."
    ),
    worker_every: float | None = typer.Option(
        None,
        "--worker-every",
        min=0.0,
        help="Kill a random worker about this often (s); 0 for none. [default: 4]",
    ),
    worker_kills: int | None = typer.Option(
        None, "--worker-kills", min=0, help="Kill at most this many workers (default: no limit)."
    ),
    mid_step_every: int | None = typer.Option(
        None,
        "--mid-step-every",
        min=0,
        help="Every n-th worker kill lands mid-step (in a push or an all-reduce); 0: none. "
        "[default: 2]",
    ),
    services_at: str | None = typer.Option(
        None,
        "--services-at",
        help="NAME=SECONDS,...: kill each once at that time ('' for none); "
        "names: sharder, monitor, controller, grouper, ps-<shard>. "
        f"[default: {DEFAULT_SERVICES_AT}]",
    ),
    broker_at: float | None = typer.Option(
        None,
        "--broker-at",
        min=0.0,
        help="Kill the embedded broker at this time (s) and start it again, empty. [default: 8]",
    ),
    no_broker: bool = typer.Option(False, "--no-broker-restart", help="Leave the broker alone."),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="Draw the whole schedule from this seed instead: kills, SIGSTOPs (SIGCONT after a "
        "random pause) and CPU hogs of random workers and services, a broker restart; "
        "one at a time.",
    ),
    faults: int = typer.Option(
        ScheduleShape.faults, "--faults", min=1, max=100, help="With --seed: how many faults."
    ),
    json_: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    out: str | None = typer.Option(
        None, "--out", help="Run directory, ledger files included (default reports/chaos-<time>)."
    ),
) -> None:
    """Kill -9 workers, the parameter server, services and the broker during an epoch; check the
    model and the log."""
    from antdt.demo.plans import PLANS

    if training not in CHAOS_PLANS:
        raise typer.BadParameter(
            f"{training!r}: choose async, sync or preduce", param_hint="'--training'"
        )
    fixed = (worker_every, worker_kills, mid_step_every, services_at, broker_at)
    if seed is not None and any(value is not None for value in fixed):
        given = [name for name, value in zip(FIXED_OPTIONS, fixed) if value is not None]
        raise typer.BadParameter(
            f"--seed draws the whole schedule: drop {', '.join(given)}", param_hint="'--seed'"
        )
    if worker_every is not None and 0 < worker_every < 1:
        raise typer.BadParameter(
            "kill workers at most once a second, or 0 for none", param_hint="'--worker-every'"
        )
    broker_at = None if no_broker else (8.0 if broker_at is None else broker_at)
    service_times = parse_service_times(DEFAULT_SERVICES_AT if services_at is None else services_at)
    # Kills come every few seconds: a synchronous group checkpoints often, so each restart loses
    # little.
    chosen = load_scenario(scenario, workers).model_copy(
        update={"epochs": epochs, "checkpoint_every_s": CHAOS_CHECKPOINT_S}
    )
    plan = PLANS[CHAOS_PLANS[training]]
    out_dir = default_out("chaos") if out is None else Path(out)
    console = Console(stderr=json_)
    console.print(
        f"[bold]antdt chaos[/bold]: {chosen.name}, {epochs} epoch(s), {plan.label}, "
        f"ideal {chosen.ideal_time_s():.1f} s"
    )
    restarts_broker = broker_at is not None if seed is None else not no_broker
    if restarts_broker and external_bus():
        raise typer.BadParameter(
            "a broker restart needs the embedded broker: unset ANTDT_BOOTSTRAP_SERVERS, "
            "or pass --no-broker-restart",
            param_hint="'--broker-at'",
        )
    # after the arguments are checked: these load torch (seconds), a bad argument's error should not
    from antdt.demo.chaos import Chaos, ChaosSpec
    from antdt.demo.harness import run_plan

    if seed is None:
        spec = ChaosSpec(
            4.0 if worker_every is None else worker_every,
            service_times,
            0,
            broker_at,
            2 if mid_step_every is None else mid_step_every,
            worker_kills,
        )
    else:
        shape = ScheduleShape(faults=faults, broker_restarts=0 if no_broker else 1)
        spec = ChaosSpec.drawn(seed, shape)
    with interrupt_on_sigterm(), bus_and_broker() as (settings, where, broker):
        the_chaos = Chaos(spec, broker)
        console.print(f"running on {where}, killing as it goes...")
        result = run_plan(chosen, plan, settings, out_dir, chaos=the_chaos)
    figures = chaos_figures(result, the_chaos)
    if json_:
        typer.echo(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())
    else:
        show(console, figures)
    if not figures["passed"]:
        raise typer.Exit(1)


def parse_service_times(text: str) -> dict[str, float]:
    """``sharder=6,ps-0=9`` → {"sharder": 6.0, "ps-0": 9.0}; a bad entry is a one-line usage
    error."""
    times = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = entry.partition("=")
        shard = name.removeprefix("ps-")
        if not sep or not (name in SERVICES or (name.startswith("ps-") and shard.isdigit())):
            raise typer.BadParameter(
                f"{entry!r}: expected sharder|monitor|controller|grouper|ps-<shard>=SECONDS",
                param_hint="'--services-at'",
            )
        try:
            times[name] = float(value)
        except ValueError:
            raise typer.BadParameter(
                f"{entry!r}: {value!r} is not a number", param_hint="'--services-at'"
            ) from None
    return times


def chaos_figures(result, the_chaos) -> dict:
    lost = [kill.lost_s for kill in the_chaos.kills if kill.lost_s is not None]
    passed = bool(
        result.audit_ok and result.ledger.ok and the_chaos.survived == len(the_chaos.kills)
    )
    return {
        "scenario": result.scenario.name,
        "epochs": result.scenario.epochs,
        "job_id": result.job_id,
        "training": result.plan.training.value,
        "plan": result.plan.name,
        "wall_s": round(result.wall_s, 3),
        "ideal_s": round(result.ideal_s, 3),
        "efficiency": round(result.efficiency, 4),
        "kills": len(the_chaos.kills),
        "survived": the_chaos.survived,
        "worker_kills": the_chaos.count("worker"),
        "mid_step_kills": the_chaos.mid_step,
        "service_kills": the_chaos.count("service"),
        "broker_restarts": the_chaos.count("broker", FaultAction.RESTART),
        "seed": the_chaos.spec.seed if the_chaos.spec.faults else None,
        "faults": fault_counts(the_chaos.kills),
        "lost_s_by_fault": lost_by_fault(the_chaos.kills),
        "restarts": result.restarts,
        "max_lost_s": round(max(lost), 2) if lost else None,
        "audit_clean": result.audit_ok,
        "ledger": result.ledger.to_dict(),
        "passed": passed,
        "heldout_loss": None if result.heldout is None else round(result.heldout[0], 4),
        "heldout_accuracy": None if result.heldout is None else round(result.heldout[1], 4),
        "services_exited": [{"service": name, "code": code} for name, code in result.service_exits],
        "audit": result.audit,
        "killed": [kill.to_dict() for kill in the_chaos.kills],
        "schedule": [fault_dict(fault) for fault in the_chaos.spec.faults],
        "groups": result.groups,
    }


def fault_counts(kills) -> dict[str, int]:
    """``{"stop worker": 2, ...}``: the faults injected, by what was done to whom."""
    counts: dict[str, int] = {}
    for kill in kills:
        counts[kill.label] = counts.get(kill.label, 0) + 1
    return counts


def lost_by_fault(kills) -> dict[str, list[float]]:
    """The seconds each fault cost before its victim served again, by what was done to whom."""
    lost: dict[str, list[float]] = {}
    for kill in kills:
        if kill.lost_s is not None:
            lost.setdefault(kill.label, []).append(round(kill.lost_s, 2))
    return lost


def fault_dict(fault) -> dict:
    return {
        "at_s": fault.at_s,
        "fault": fault.label,
        **({"hold_s": fault.hold_s} if fault.hold_s else {}),
        **({"mid_step": True} if fault.mid_step else {}),
    }


CHAOS_COLUMNS = [
    Column("at s"),
    Column("hit"),
    Column("kind"),
    Column("fault"),
    Column("mid-step"),
    Column("back after s"),
    Column("parts back after s", free_text=True),
]


def show(console: Console, figures: dict) -> None:
    table = NarrowTable(CHAOS_COLUMNS, wide=True)
    for kill in figures["killed"]:
        parts = ", ".join(
            f"{name} {seconds:.2f}" for name, seconds in kill.get("parts", {}).items()
        )
        table.add(
            f"{kill['at_s']:.1f}",
            kill["target"],
            kill["kind"],
            kill["action"] + (f" {kill['held_s']:g} s" if "held_s" in kill else ""),
            kill.get("mid_step", ""),
            "not back" if kill["lost_s"] is None else f"{kill['lost_s']:.1f}",
            parts,
        )
    table.print(console)
    ledger = figures["ledger"]
    console.print(
        f"{figures['survived']}/{figures['kills']} faults survived "
        f"({', '.join(f'{n} {label}' for label, n in figures['faults'].items()) or 'none'}; "
        f"{figures['mid_step_kills']} mid-step); "
        f"wall {figures['wall_s']:.1f} s (ideal {figures['ideal_s']:.1f} s)"
    )
    ledger_word = (
        "all ones, agrees with the log"
        if ledger["ok"]
        else "FAILED: " + "; ".join(ledger["findings"][:3])
    )
    console.print(
        f"audit: {'clean' if figures['audit_clean'] else 'NOT CLEAN'}; ledger: {ledger_word}"
    )
