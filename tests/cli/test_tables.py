"""The replay and audit tables in an 80-column terminal: every line fits and no identifier is
cut."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from rich.console import Console

from antdt.cli.sharder_tools_cmd import audit_table, command_table, group_table, shard_table
from antdt.cli.tables import Column, NarrowTable, clock
from antdt.cli.topics_cmd import topic_table
from antdt.schemas import examples
from antdt.schemas.models import CommandAction
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.audit import audit_log
from tests.services.sharder.helpers import dataset, new_core
from tests.services.sharder.test_audit import finish

REASON = "lease expired after 30 s without progress from the worker that held it"


def rendered(table: NarrowTable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    table.print(console)
    return console.export_text()


def fits(text: str, width: int, whole: list[str]) -> None:
    assert max(len(line) for line in text.splitlines()) <= width
    cut = [value for value in whole if value not in text]
    assert not cut, f"cut or missing at {width} columns: {cut}"


def shard_rows():
    first = examples.shard_log_event()
    rows = []
    for i in range(6):
        event = first.model_copy(
            update={
                "seq": 1000 + i,
                "transition": T.LEASE_EXPIRED,
                "shard_id": 123456 + i,
                "worker_id": f"trainer-node-17-rank-{i}",
                "attempt": 2,
                "reason": REASON,
                "writer_epoch": 12,
            }
        )
        rows.append((i, first.timestamp + timedelta(seconds=i), event))
    return rows


@pytest.mark.parametrize("wide", [False, True])
def test_a_job_s_shard_log_fits_80_columns_and_keeps_every_id_whole(wide):
    rows = shard_rows()
    text = rendered(shard_table("job-demo", rows, wide), 80 if not wide else 160)
    whole = [str(e.seq) for _, _, e in rows] + [str(e.shard_id) for _, _, e in rows]
    whole += (
        [e.worker_id for _, _, e in rows]
        + [clock(when, wide) for _, when, _ in rows]
        + ["LEASE_EXPIRED"]
    )
    fits(text, 80 if not wide else 160, whole)
    assert ("writer epoch" in text) == wide


def test_the_narrow_view_names_the_day_it_leaves_out():
    rows = shard_rows()
    text = rendered(shard_table("job-demo", rows, wide=False))
    assert str(rows[0][1].date()) in text


def test_commands_fit_80_columns():
    first = examples.mitigation_command()
    commands = [
        first.model_copy(
            update={
                "target_worker": f"trainer-node-17-rank-{i}",
                "reason": REASON,
                "action": CommandAction.SET_SHARD_QUOTA,
                "shard_quota": i,
            }
        )
        for i in range(4)
    ]
    text = rendered(command_table("job-demo", commands, wide=False))
    fits(
        text,
        80,
        [c.target_worker for c in commands] + ["SET_SHARD_QUOTA", clock(first.issued_at, False)],
    )


def test_groups_fit_80_columns():
    first = examples.group_formed()
    text = rendered(group_table("job-demo", [first], wide=False))
    fits(text, 80, [clock(first.timestamp, False), first.reason.value, *first.members])


def test_an_audit_fits_80_columns():
    core, log = new_core(dataset(size=400, shard_size=100, epochs=2))
    report = audit_log(finish(core, log))
    text = rendered(audit_table(report, wide=False))
    fits(text, 80, [e.status.value for e in report.epochs] + ["400/400"])


def test_a_row_must_give_every_column():
    table = NarrowTable([Column("a"), Column("b", wide_only=True)], wide=False)
    table.add(1, 2)
    with pytest.raises(ValueError, match="1 values for 2 columns"):
        table.add(1)


def test_the_topic_registry_fits_80_columns():
    from antdt.topics import TOPICS

    text = rendered(topic_table("antdt", wide=False))
    words = [word for spec in TOPICS for word in spec.value_name.split()]
    fits(text, 80, [spec.full_name("antdt") for spec in TOPICS] + words)
