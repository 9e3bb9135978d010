"""The controller core's safety: dry run, ids, epoch, signatures, rate limit, policies by name or
path (no Kafka)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from antdt.control.signing import verify
from antdt.errors import ConfigError
from antdt.schemas.models import AckStatus, ControlComponent, ControlConfig
from antdt.schemas.models import CommandAction as A
from antdt.schemas.models import StragglerClass as C
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.core import ControllerCore
from antdt.services.controller.policy import load_policy, registered
from antdt.services.controller.safety import Stamp
from antdt.worker.commands import CommandVerifier
from tests.services.controller.helpers import at, report, verdict


def control(changes, job=None):
    return ControlConfig(
        config_id="c",
        job_id=job,
        component=ControlComponent.CONTROLLER,
        changes=changes,
        issued_by="t",
        issued_at=datetime.now(UTC),
    )


def test_dry_run_commands_are_flagged_change_nothing_and_agents_ignore_them():
    core = ControllerCore(ControllerConfig(dry_run=True))
    outcome = core.on_verdict(verdict("w1"), at(0))
    assert outcome.commands and all(c.dry_run for c in outcome.commands)
    assert core.job("job").workers["w1"].quota is None  # nothing was really changed
    agent = CommandVerifier("job", "w1", None, clock=lambda: at(1))
    assert agent.check(outcome.commands[0]).status is AckStatus.IGNORED


def test_commands_carry_reason_evidence_verdict_epoch_and_expiry():
    core = ControllerCore(ControllerConfig(command_ttl_s=30), Stamp(epoch=7))
    the_verdict = verdict("w1", cls=C.PERSISTENT)
    for command in core.on_verdict(the_verdict, at(0)).commands:
        assert (
            command.reason
            and command.verdict_id == the_verdict.verdict_id
            and command.policy == "antdt-nd"
        )
        assert (
            command.controller_epoch == 7
            and (command.expires_at - command.issued_at).total_seconds() == 30
        )


def test_a_verdict_seen_twice_is_acted_on_once_and_ids_survive_a_new_controller():
    first = ControllerCore(stamp=Stamp(epoch=1))
    commands = first.on_verdict(verdict("w1"), at(0)).commands
    assert first.on_verdict(verdict("w1"), at(0)).commands == ()
    successor = ControllerCore(stamp=Stamp(epoch=2))
    again = successor.on_verdict(verdict("w1"), at(5)).commands
    assert [c.command_id for c in again] == [c.command_id for c in commands]
    agent = CommandVerifier("job", "w1", None, clock=lambda: at(6))
    assert agent.check(commands[0]).status is None
    assert agent.check(again[0]).reason == "duplicate"


def test_commands_are_signed_and_a_stale_epoch_is_rejected():
    key = b"k" * 32
    old = (
        ControllerCore(stamp=Stamp(epoch=1, signing_key=key))
        .on_verdict(verdict("w1"), at(0))
        .commands[0]
    )
    new = (
        ControllerCore(stamp=Stamp(epoch=2, signing_key=key))
        .on_verdict(verdict("w1", t=1), at(1))
        .commands[0]
    )
    assert verify(old, key) and verify(new, key)
    agent = CommandVerifier("job", "w1", key, clock=lambda: at(2))
    assert agent.check(new).status is None
    assert agent.check(old).reason.startswith("stale epoch")


def test_the_rate_limit_holds_whole_decisions_back():
    core = ControllerCore(ControllerConfig(max_commands_per_minute=2))
    first = core.on_verdict(verdict("w1"), at(0))
    second = core.on_verdict(verdict("w2"), at(0))
    third = core.on_verdict(verdict("w3"), at(0))
    assert len(first.commands) == len(second.commands) == 1 and third.commands == ()
    assert "rate limit" in third.skipped[-1]
    assert core.on_verdict(verdict("w4", t=30), at(30)).commands  # a token back after 30 s


def test_policy_threshold_and_dry_run_change_at_run_time():
    core = ControllerCore()
    assert core.apply(control({"controller.dry_run": "true", "controller.straggler_quota": "0"}))
    command = core.on_verdict(verdict("w1"), at(0)).commands[0]
    assert command.dry_run and command.shard_quota == 0
    assert core.apply(
        control(
            {"controller.policy": "tests.services.controller.custom_policy:PauseEveryStraggler"},
            job="job",
        )
    )
    assert [c.action for c in core.on_verdict(verdict("w2"), at(1)).commands] == [A.PAUSE]


def test_invalid_changes_are_refused_whole():
    core = ControllerCore()
    for changes in (
        {"controller.policy": "nope"},
        {"controller.policy": "tests.services.controller.custom_policy:NOT_A_POLICY"},
        {"controller.dry_run": "maybe"},
        {"controller.leader_quota": "1"},
        {"controller.unknown": "1"},
    ):
        with pytest.raises(ConfigError):
            core.apply(control(changes))
    assert core.config.defaults == ControllerConfig() and core.config.overrides == {}


def test_policies_load_by_name_or_import_path():
    assert {"antdt-nd", "antdt-dd"} <= set(registered())
    assert (
        load_policy("tests.services.controller.custom_policy:PauseEveryStraggler").name
        == "pause-every-straggler"
    )
    with pytest.raises(ConfigError, match="cannot load"):
        load_policy("no.such.module:Policy")


def test_dd_through_the_core_adjusts_batches_from_worker_reports():
    core = ControllerCore(ControllerConfig(policy="antdt-dd"))
    for worker, speed in (("a", 100), ("b", 300)):  # the opening reports: one-off costs, no model
        assert not core.on_metrics(report(worker, speed, 32, 45, t=-1), at(-1)).commands
    core.on_metrics(report("a", 100, 32, 50), at(0))
    outcome = core.on_metrics(report("b", 300, 32, 50), at(0))
    assert {(c.target_worker, c.batch_size, c.global_batch_size) for c in outcome.commands} == {
        ("a", 16, 64),
        ("b", 48, 64),
    }
    assert core.job("job").workers["a"].batch_size == 16
