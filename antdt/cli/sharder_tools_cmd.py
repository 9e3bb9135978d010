"""``antdt replay`` and ``antdt audit``: read a job's shard log back, and check it.

``replay`` lists the transitions of a job (optionally in a window of record
time); ``audit`` folds the whole log with the independent auditor
(:mod:`antdt.services.sharder.audit`) and exits 1 on any violation, so it can
gate a pipeline. Both can export what they read as an Avro container file.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from antdt.cli.tables import WIDE_HELP, Column, NarrowTable, clock, day_span
from antdt.errors import AntdtError
from antdt.schemas.codec import make_codec, to_json
from antdt.schemas.models import GroupFormed, MitigationCommand, ShardLogEvent
from antdt.services.controller.command_log import read_commands
from antdt.services.sharder.audit import AuditReport
from antdt.services.sharder.eventlog import log_topic
from antdt.services.sharder.replay import audit_job, export_avro, replay_events
from antdt.settings import Settings, load_settings

JOB_HELP = "Training job id."
OUT_HELP = "Also write the events read to this Avro container file."


def parse_time(value: str | None, option: str) -> datetime | None:
    """An ISO-8601 date and time (naive means UTC), or a one-line usage error naming the option."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"expected an ISO-8601 date and time such as 2026-05-01T12:00:00Z, got {value!r}",
            param_hint=f"'{option}'",
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def read_log(
    settings: Settings, job: str, start: datetime | None = None, end: datetime | None = None
) -> list[tuple[int, datetime, ShardLogEvent]]:
    """The job's events in the window, in log order."""
    return list(replay_events(settings, job, make_codec(settings.schema_registry_url), start, end))


def export(rows: list[tuple[int, datetime, ShardLogEvent]], out: Path | None) -> None:
    """Write the events to ``out`` if asked; the note goes to stderr so JSON output stays clean."""
    if out is not None:
        count = export_avro((event for _, _, event in rows), out)
        typer.echo(f"wrote {count} events to {out}", err=True)


class LogName(str, Enum):
    SHARDS = "shards"
    COMMANDS = "commands"
    GROUPS = "groups"


def replay(
    job: str | None = typer.Option(
        None, "--job", help=JOB_HELP + " Required for --log shards and groups."
    ),
    log: LogName = typer.Option(
        LogName.SHARDS,
        "--log",
        help="shards: the job's shard log; commands: the controller's "
        "commands; groups: the job's partial-reduce groups.",
    ),
    from_: str | None = typer.Option(
        None, "--from", help="Only events recorded at or after this ISO-8601 time."
    ),
    to: str | None = typer.Option(
        None, "--to", help="Only events recorded at or before this ISO-8601 time."
    ),
    json_: bool = typer.Option(False, "--json", help="One JSON object per event and line."),
    out: Path | None = typer.Option(None, "--out", dir_okay=False, help=OUT_HELP),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
) -> None:
    """List a job's shard transitions, the controller's commands (the audit log), or a job's
    partial-reduce groups."""
    start, end = parse_time(from_, "--from"), parse_time(to, "--to")
    if start and end and start > end:
        raise typer.BadParameter(f"{from_} is after --to {to}", param_hint="'--from'")
    if log is LogName.COMMANDS:
        return replay_commands(job, start, end, json_, out, wide)
    if job is None:
        raise typer.BadParameter(f"--log {log.value} needs --job", param_hint="'--job'")
    if log is LogName.GROUPS:
        return replay_groups(job, start, end, json_, out, wide)
    rows = read_log(load_settings(), job, start, end)
    export(rows, out)
    if json_:
        for _, _, event in rows:
            typer.echo(to_json(event).decode())
        return
    shard_table(job, rows, wide).print(Console())


SHARD_COLUMNS = [
    Column("seq"),
    Column("time"),
    Column("writer epoch", wide_only=True),
    Column("transition"),
    Column("epoch", wide_only=True),
    Column("shard"),
    Column("worker"),
    Column("attempt", wide_only=True),
    Column("reason", free_text=True),
]


def shard_table(
    job: str, rows: list[tuple[int, datetime, ShardLogEvent]], wide: bool
) -> NarrowTable:
    table = NarrowTable(
        SHARD_COLUMNS, wide, title=_title(f"job {job}", [when for _, when, _ in rows], wide)
    )
    for _, when, e in rows:
        table.add(
            e.seq,
            clock(when, wide),
            e.writer_epoch,
            e.transition.value,
            e.epoch,
            e.shard_id,
            e.worker_id,
            e.attempt,
            e.reason,
        )
    return table


def _title(what: str, times: list[datetime], wide: bool) -> str:
    """``what``; when the rows show only the time of day, the day(s) and time zone as well."""
    if wide or not times:
        return what
    return f"{what}, {day_span(times)} ({min(times).tzname() or 'local'})"


def exported_or_json(records: list, record: type, noun: str, out: Path | None, json_: bool) -> bool:
    """Write ``records`` to ``out`` if asked (the note on stderr); print them as JSON lines if asked
    (then True)."""
    if out is not None:
        count = export_avro(records, out, record)
        typer.echo(f"wrote {count} {noun} to {out}", err=True)
    if json_:
        for value in records:
            typer.echo(to_json(value).decode())
    return json_


def replay_commands(
    job: str | None,
    start: datetime | None,
    end: datetime | None,
    json_: bool,
    out: Path | None,
    wide: bool,
) -> None:
    settings = load_settings()
    commands = list(
        read_commands(settings, make_codec(settings.schema_registry_url), job, start, end)
    )
    if exported_or_json(commands, MitigationCommand, "commands", out, json_):
        return
    command_table(job, commands, wide).print(Console())


COMMAND_COLUMNS = [
    Column("issued"),
    Column("epoch", wide_only=True),
    Column("job", wide_only=True),
    Column("worker"),
    Column("action"),
    Column("value"),
    Column("dry run"),
    Column("policy", wide_only=True),
    Column("verdict", wide_only=True),
    Column("reason", free_text=True),
]


def command_table(job: str | None, commands: list[MitigationCommand], wide: bool) -> NarrowTable:
    what = f"commands of job {job}" if job else "commands"
    table = NarrowTable(
        COMMAND_COLUMNS, wide, title=_title(what, [c.issued_at for c in commands], wide)
    )
    for c in commands:
        value = (
            c.shard_quota
            if c.shard_quota is not None
            else c.batch_size
            if c.batch_size is not None
            else c.parameters
        )
        table.add(
            clock(c.issued_at, wide),
            c.controller_epoch,
            c.job_id,
            c.target_worker,
            c.action.value,
            escape(str(value or "")),
            "yes" if c.dry_run else "",
            c.policy,
            c.verdict_id,
            escape(c.reason),
        )
    return table


def replay_groups(
    job: str,
    start: datetime | None,
    end: datetime | None,
    json_: bool,
    out: Path | None,
    wide: bool,
) -> None:
    """One row per group (its first member's copy), in formation order."""
    from antdt.services.grouper.history import one_per_group, read_copies

    settings = load_settings()
    groups = [
        g
        for g in one_per_group(read_copies(settings, make_codec(settings.schema_registry_url), job))
        if (start is None or g.timestamp >= start) and (end is None or g.timestamp <= end)
    ]
    if exported_or_json(groups, GroupFormed, "groups", out, json_):
        return
    group_table(job, groups, wide).print(Console())


GROUP_COLUMNS = [
    Column("formed"),
    Column("group"),
    Column("gen"),
    Column("reason"),
    Column("waited ms"),
    Column("members", free_text=True),
]


def group_table(job: str, groups: list[GroupFormed], wide: bool) -> NarrowTable:
    table = NarrowTable(
        GROUP_COLUMNS,
        wide,
        title=_title(f"groups of job {job}", [g.timestamp for g in groups], wide),
    )
    for g in groups:
        table.add(
            clock(g.timestamp, wide),
            g.group_id,
            g.generation,
            g.reason.value,
            g.waited_ms,
            escape(" ".join(g.members)),
        )
    return table


def audit(
    job: str = typer.Option(..., "--job", help=JOB_HELP),
    epoch: int | None = typer.Option(None, "--epoch", min=0, help="Report only this data epoch."),
    json_: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    out: Path | None = typer.Option(None, "--out", dir_okay=False, help=OUT_HELP),
    allow_quarantine: bool = typer.Option(
        False, "--allow-quarantine", help="Quarantined shards are not violations."
    ),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    ledger: Path | None = typer.Option(
        None,
        "--ledger",
        exists=True,
        file_okay=False,
        help="A directory of the model's ledger-epoch<E>.npy files (or ps-<k>/ ones): "
        "they must be all ones and agree with the log.",
    ),
) -> None:
    """Prove from the log that every sample was trained exactly once per epoch; exit 1 if not."""
    settings = load_settings()
    rows = read_log(settings, job)
    if not rows:
        raise AntdtError(f"no events for job {job} in {log_topic(settings)}")
    export(rows, out)
    report = audit_job(
        settings,
        job,
        [event for _, _, event in rows],
        make_codec(settings.schema_registry_url),
        allow_quarantine=allow_quarantine,
    )
    if epoch is not None:
        report = _one_epoch(report, epoch)
    findings = ledger_findings(report, ledger) if ledger is not None else []
    if json_:
        typer.echo(
            orjson.dumps(
                {**report.to_dict(), **({"ledger_findings": findings} if ledger else {})}
            ).decode()
        )
    else:
        print_report(report, wide)
        if ledger is not None:
            for finding in findings:
                Console().print(f"[red]ledger:[/red] {escape(finding)}", highlight=False)
            if not findings:
                Console().print("[green]the ledger is all ones and agrees with the log[/green]")
    if not report.ok or findings:
        raise typer.Exit(1)


def ledger_findings(report: AuditReport, directory: Path) -> list[str]:
    """What the model's ledger files under ``directory`` say against the log (see
    antdt.demo.harness.check_ledgers)."""
    from antdt.services.sharder.audit import check_ledgers

    return check_ledgers(directory, report).findings


def _one_epoch(report: AuditReport, epoch: int) -> AuditReport:
    try:
        return report.for_epoch(epoch)
    except KeyError:
        opened = ", ".join(str(e.epoch) for e in report.epochs) or "none"
        raise typer.BadParameter(
            f"epoch {epoch} was never opened (opened: {opened})", param_hint="'--epoch'"
        ) from None


AUDIT_COLUMNS = [
    Column("epoch"),
    Column("status"),
    Column("passes", wide_only=True),
    Column("done once"),
    Column("duplicates"),
    Column("gaps"),
    Column("quarantined"),
    Column("reclaimed", wide_only=True),
    Column("retries", wide_only=True),
    Column("not holder", wide_only=True),
]


def audit_table(report: AuditReport, wide: bool) -> NarrowTable:
    table = NarrowTable(AUDIT_COLUMNS, wide, title=f"audit of job {report.job_id}")
    for e in report.epochs:
        table.add(
            e.epoch,
            e.status.value,
            e.passes,
            f"{e.samples_done_once}/{e.samples}",
            len(e.duplicate_done),
            e.gap_samples,
            len(e.quarantined),
            e.reclaimed,
            e.retries,
            len(e.not_holder_done),
        )
    return table


def print_report(report: AuditReport, wide: bool = False) -> None:
    """The report as people read it: one row per epoch, the log's health, then the verdict."""
    console = Console()
    audit_table(report, wide).print(console)
    if report.from_snapshot_seq is not None:
        console.print(
            f"the log before seq {report.from_snapshot_seq} is gone (the bus was reset, or "
            f"retention): audited from the snapshot taken there"
        )
    console.print(
        f"events {report.events} (applied {report.applied}, fenced {report.fenced}, duplicate seqs "
        f"{report.duplicate_seqs}, seq gaps {len(report.seq_gaps)}), rewinds {report.rewinds}, "
        f"finished: {'yes' if report.finished else 'no'}"
    )
    for violation in report.violations:
        console.print(f"[red]violation:[/red] {escape(violation)}", highlight=False)
    console.print(
        "[green]audit passed[/green]"
        if report.ok
        else f"[red]audit FAILED: {len(report.violations)} violation(s)[/red]"
    )
