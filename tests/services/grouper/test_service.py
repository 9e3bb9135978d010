"""``antdt grouper`` against the real embedded broker: workers announce, groups come back, bad input
is dead-lettered."""

from __future__ import annotations

import json
import threading

import pytest

from antdt.bus.clients import make_producer
from antdt.bus.deadletter import HEADER_ERROR
from antdt.cli.main import run
from antdt.runtime.launch import settings_env
from antdt.schemas.codec import make_codec
from antdt.schemas.examples import group_ready
from antdt.schemas.models import GroupReason
from antdt.services.grouper.core import GrouperConfig
from antdt.services.grouper.history import one_per_group, read_copies, summary
from antdt.services.grouper.service import GrouperService
from antdt.worker.ddp import CollectiveTimeout, broke_the_group
from antdt.worker.preduce.client import GroupClient, NoGroup
from tests.fetches import count_reply_fetches
from tests.reliability.bus import dead_letters
from tests.services.running import running_loop
from tests.waiting import wait_until

WORLD = 4


def clients(settings, job: str, generation: int = 0) -> list[GroupClient]:
    return [
        GroupClient(settings, job, f"w{rank}", f"inc-{rank}-{generation}", rank, WORLD, generation)
        for rank in range(WORLD)
    ]


def steps(client: GroupClient, count: int, out: dict) -> None:
    """``count`` local 'steps' (announce and wait), then the final announcement."""
    groups = [client.wait(client.announce(step), 30.0) for step in range(count)]
    groups.append(client.wait(client.announce(count, finished=True), 30.0))
    out[client.rank] = groups


def test_workers_are_grouped_first_come_first_served_and_end_in_one_final_group(settings, topics):
    config = GrouperConfig(group_size=2, deadline_s=0.2, checkpoint_every_s=0)
    members = clients(settings, "job-g")
    got: dict[int, list] = {}
    with running_loop(GrouperService(settings, config), "grouper"):
        threads = [
            threading.Thread(target=steps, args=(c, 5 + c.rank, got), daemon=True) for c in members
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    for client in members:
        client.close()
    assert sorted(got) == list(range(WORLD))
    for rank, groups in got.items():
        # every announcement answered once
        assert [g.in_reply_to for g in groups] == list(range(1, len(groups) + 1))
        assert all(f"w{rank}" in g.members and g.job_id == "job-g" for g in groups)
        assert groups[-1].reason is GroupReason.FINAL and groups[-1].ranks == list(range(WORLD))
        assert all(len(g.ranks) <= 2 for g in groups[:-1])
    finals = {
        g.group_id for groups in got.values() for g in groups if g.reason is GroupReason.FINAL
    }
    assert len(finals) == 1
    # the bus holds every member's copy: the audit
    copies = read_copies(settings, make_codec(), "job-g")
    assert len(copies) == sum(len(groups) for groups in got.values())
    assert len(one_per_group(copies)) == len(
        {(g.group_id) for groups in got.values() for g in groups}
    )
    figures = summary(copies)
    assert figures["by_reason"]["FINAL"] == 1 and figures["per_worker"]["w3"] == 5 + 3 + 1


def test_an_operator_replays_the_groups_of_a_job(settings, topics, monkeypatch, capsys, tmp_path):
    # the pair forms by quorum at once; a short deadline could part two announcements a loaded
    # machine delivered apart
    config = GrouperConfig(group_size=2, deadline_s=10.0, checkpoint_every_s=0)
    members = clients(settings, "job-r")[:2]
    with running_loop(GrouperService(settings, config), "grouper"):
        seqs = [c.announce(0) for c in members]
        formed = [c.wait(seq, 20.0) for c, seq in zip(members, seqs)]
    for client in members:
        client.close()
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert (
        run(
            [
                "replay",
                "--log",
                "groups",
                "--job",
                "job-r",
                "--json",
                "--out",
                str(tmp_path / "groups.avro"),
            ]
        )
        == 0
    )
    [listed] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (listed["group_id"], listed["members"], listed["reason"]) == (
        formed[0].group_id,
        ["w0", "w1"],
        "QUORUM",
    )
    assert (tmp_path / "groups.avro").stat().st_size > 0
    assert run(["replay", "--log", "groups"]) == 2  # a job is needed: a one-line usage error


def test_an_older_generation_is_never_grouped_with_a_newer_one(settings, topics):
    config = GrouperConfig(group_size=2, deadline_s=10.0, checkpoint_every_s=0)
    old, new = clients(settings, "job-gen", 0), clients(settings, "job-gen", 1)
    with running_loop(GrouperService(settings, config), "grouper"):
        stale = old[0].announce(3)
        first = new[1].announce(0)
        second = new[2].announce(0)
        group = new[1].wait(first, 20.0)
        assert (group.generation, group.ranks) == (1, [1, 2]) and new[2].wait(
            second, 20.0
        ).group_id == group.group_id
        with pytest.raises(NoGroup, match="no group from the grouper"):
            old[0].wait(stale, 0.5)
    for client in old + new:
        client.close()


def test_a_wait_for_a_group_ends_as_a_broken_process_group_once_told_a_rank_is_gone(
    settings, topics
):
    """No grouper: the group cannot form. A wait told a rank stopped beating ends well before its
    bound, with the error that ends a rank for a restart (exit 77), naming the announcement."""
    waiter = clients(settings, "job-gone")[0]
    asked = []

    def broken(waited_s: float) -> str | None:
        asked.append(waited_s)
        return "rank 3 stopped beating" if waited_s > 0.2 else None

    try:
        with pytest.raises(CollectiveTimeout, match="announcement 1's group rank 3 stopped") as err:
            waiter.wait(waiter.announce(0), 60.0, broken=broken)
        assert broke_the_group(err.value) and 0.2 < asked[-1] < 60.0 and asked == sorted(asked)
    finally:
        waiter.close()


def test_bad_input_is_dead_lettered_and_the_grouper_keeps_serving(settings, topics):
    config = GrouperConfig(group_size=2, deadline_s=10.0, checkpoint_every_s=0)
    ready_topic = settings.topic("group", "ready")
    a, b = clients(settings, "job-bad")[:2]
    with running_loop(GrouperService(settings, config), "grouper"):
        producer = make_producer(settings)
        producer.produce(ready_topic, key=b"job-bad", value=b"\x00garbage")
        producer.produce(
            ready_topic, key=b"another-job", value=make_codec().encode(group_ready(), ready_topic)
        )
        producer.flush(5)
        seqs = a.announce(0), b.announce(0)
        assert a.wait(seqs[0], 20.0).ranks == [0, 1] and b.wait(seqs[1], 20.0).ranks == [0, 1]
    a.close()
    b.close()
    errors = [dict(m.headers())[HEADER_ERROR].decode() for m in dead_letters(settings, 2)]
    assert len(errors) == 2, errors
    assert any("keyed" in e or "key" in e for e in errors), errors


def test_the_grouper_knows_its_bus_before_it_is_ready_so_a_restart_right_after_is_seen(own_bus):
    """A chaos run restarted the broker between the grouper's ready and its watch's first look:
    the watch first saw the new cluster, counted no reset, and nothing rewound the reader."""
    broker, settings = own_bus
    service = GrouperService(settings).start()
    try:
        assert service._watch.cluster_id == broker.cluster_id
        broker.restart()
        wait_until(lambda: service._watch.generation == 1 and service._watch.restored == 1)
    finally:
        service.close()


def test_a_group_reader_fetches_only_between_an_announcement_and_its_group(
    settings, topics, monkeypatch
):
    """A rank waits for a group right after it announces, then trains a step: its reader, at the
    5 ms low-latency wait, polled the broker 200 times a second through every step."""
    counter = count_reply_fetches(monkeypatch)
    config = GrouperConfig(group_size=2, deadline_s=0.2, checkpoint_every_s=0)
    with running_loop(GrouperService(settings, config), "grouper"):
        member = GroupClient(settings, "job-idle", "w0", "inc-0", 0, 1, 0)
        idle_before = counter.during_idle(member._consumer)
        # alone in its world: a group of one at the deadline; fetching again, and the group comes
        group = member.wait(member.announce(0), 20.0)
        idle_after = counter.during_idle(member._consumer)
        member.close()
    assert group.in_reply_to == 1 and group.members == ["w0"]
    assert idle_before <= 1 and idle_after <= 1, (idle_before, idle_after)
