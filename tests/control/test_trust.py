"""The control gate: only changes signed with a control key, each once, none older than the last."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from antdt.control.epoch import epoch_claim
from antdt.control.signing import sign
from antdt.control.trust import ControlGate, Refusal, control_keys, signed_change
from antdt.schemas.models import ControlComponent, ControlConfig
from antdt.settings import load_settings

KEY, OLD_KEY, OTHER = b"control-key-0123456789abcdef", b"old-control-key-0123456789", b"forger-key"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def change(config_id: str, at_s: float = 0.0, job: str | None = None) -> ControlConfig:
    return ControlConfig(
        config_id=config_id,
        job_id=job,
        component=ControlComponent.CONTROLLER,
        changes={"controller.dry_run": "true"},
        issued_by="ops",
        issued_at=T0 + timedelta(seconds=at_s),
    )


def test_with_a_key_only_a_change_signed_with_it_is_admitted():
    gate = ControlGate([KEY])
    assert gate.refusal(change("a"), b"*") is Refusal.UNSIGNED
    assert gate.refusal(sign(change("b"), OTHER), b"*") is Refusal.FORGED
    tampered = sign(change("c"), KEY).model_copy(update={"changes": {"controller.k": "9"}})
    assert gate.refusal(tampered, b"*") is Refusal.FORGED
    assert gate.refusal(sign(change("d"), KEY), b"*") is None


def test_a_copy_of_an_admitted_change_is_a_replay():
    gate = ControlGate([KEY])
    signed = sign(change("a"), KEY)
    assert gate.refusal(signed, b"*") is None
    assert gate.refusal(signed, b"*") is Refusal.REPLAYED


def test_a_change_issued_before_the_newest_of_its_key_is_stale_but_other_keys_are_not():
    gate = ControlGate([KEY])
    assert gate.refusal(sign(change("new", at_s=10), KEY), b"*") is None
    assert gate.refusal(sign(change("old", at_s=5), KEY), b"*") is Refusal.STALE
    assert gate.refusal(sign(change("job", at_s=5, job="j"), KEY), b"j") is None


def test_epoch_claims_are_ordered_by_epoch_not_by_clock():
    gate = ControlGate([KEY])
    assert gate.refusal(sign(change("op", at_s=3600), KEY), b"*") is None
    late_clock = epoch_claim(2, "controller-b").model_copy(update={"issued_at": T0})
    assert gate.refusal(sign(late_clock, KEY), b"*") is None


def test_the_key_being_rotated_out_is_still_accepted():
    gate = ControlGate([KEY, OLD_KEY])
    assert gate.refusal(sign(change("old-key"), OLD_KEY), b"*") is None


def test_without_a_key_everything_new_is_admitted():
    gate = ControlGate([])
    assert gate.refusal(change("a"), b"*") is None
    assert gate.refusal(change("a"), b"*") is Refusal.REPLAYED


def test_settings_give_the_current_key_first_and_sign_with_it_only():
    settings = load_settings(
        control_key=SecretStr(KEY.decode()), control_previous_key=SecretStr(OLD_KEY.decode())
    )
    assert control_keys(settings) == [KEY, OLD_KEY]
    assert ControlGate([KEY]).refusal(signed_change(change("x"), settings), b"*") is None
    assert signed_change(change("y"), load_settings()).signature is None


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 20)), max_size=30))
def test_no_change_is_ever_admitted_twice(deliveries):
    """Whatever order and repetitions a topic holds, each change applies at most once, in
    issued order per key."""
    gate, admitted = ControlGate([KEY]), []
    for number, at_s in deliveries:
        candidate = sign(change(f"c{number}", at_s=number * 10 + at_s % 3), KEY)
        if gate.refusal(candidate, b"*") is None:
            admitted.append(candidate)
    ids = [c.config_id for c in admitted]
    assert len(ids) == len(set(ids))
    times = [c.issued_at for c in admitted]
    assert times == sorted(times)
