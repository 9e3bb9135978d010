"""Command verification (pure): what an agent obeys, and what it refuses and why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from antdt.control.signing import sign, verify
from antdt.schemas.models import AckStatus, CommandAction, MitigationCommand
from antdt.worker.commands import ACCEPT, CommandVerifier

KEY = b"k" * 32
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def command(**changes) -> MitigationCommand:
    fields = dict(
        command_id="c-1",
        job_id="job",
        target_worker="w1",
        action=CommandAction.SET_SHARD_QUOTA,
        shard_quota=1,
        reason="test",
        evidence=[],
        policy="antdt-nd",
        issued_at=NOW,
        expires_at=NOW + timedelta(minutes=1),
        controller_epoch=3,
    )
    fields.update(changes)
    return MitigationCommand(**fields)


def verifier(key=KEY) -> CommandVerifier:
    return CommandVerifier("job", "w1", key, clock=lambda: NOW)


def test_signature_round_trip_and_tamper_detection():
    signed = sign(command(), KEY)
    assert verify(signed, KEY)
    assert not verify(signed, b"other-key" * 4)
    assert not verify(signed.model_copy(update={"shard_quota": 64}), KEY)


def test_a_valid_signed_command_is_accepted_once():
    v = verifier()
    signed = sign(command(), KEY)
    assert v.check(signed) is ACCEPT
    again = v.check(signed)
    assert again.status is AckStatus.REJECTED and again.reason == "duplicate"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: command(), "unsigned"),
        (lambda: command(signature=b"\x00" * 32), "bad signature"),
        (lambda: sign(command(), b"forger-key-forger-key-forger-key"), "bad signature"),
        (lambda: sign(command(job_id="other-job"), KEY), "wrong target"),
        (lambda: sign(command(target_worker="w2"), KEY), "wrong target"),
        (
            lambda: sign(command(expires_at=NOW, issued_at=NOW - timedelta(seconds=5)), KEY),
            "expired",
        ),
    ],
    ids=["unsigned", "garbage-signature", "forged", "other-job", "other-worker", "expired"],
)
def test_refusals(make, reason):
    v = verifier()
    verdict = v.check(make())
    assert verdict.status is AckStatus.REJECTED and verdict.reason == reason
    assert v.rejected[reason] == 1


def test_a_stale_controller_epoch_is_refused_after_a_newer_one():
    v = verifier()
    assert v.check(sign(command(command_id="new", controller_epoch=5), KEY)) is ACCEPT
    verdict = v.check(sign(command(command_id="old", controller_epoch=4), KEY))
    assert verdict.status is AckStatus.REJECTED and verdict.reason.startswith("stale epoch")


def test_a_forged_command_cannot_raise_the_trusted_epoch():
    v = verifier()
    # unsigned: refused before its epoch counts
    v.check(command(command_id="forged", controller_epoch=999))
    assert v.highest_epoch == 0
    assert v.check(sign(command(command_id="real", controller_epoch=3), KEY)) is ACCEPT


def test_dry_run_is_acknowledged_and_ignored():
    verdict = verifier().check(sign(command(dry_run=True), KEY))
    assert verdict.status is AckStatus.IGNORED


def test_a_node_hint_is_acknowledged_as_ignored_not_failed():
    hint = command(
        action=CommandAction.MARK_NODE_DEGRADED, shard_quota=None, parameters={"node": "n2"}
    )
    verdict = verifier().check(sign(hint, KEY))
    assert verdict.status is AckStatus.IGNORED and "orchestrator" in verdict.reason


def test_without_a_key_signatures_are_not_required():
    assert verifier(key=None).check(command()) is ACCEPT
