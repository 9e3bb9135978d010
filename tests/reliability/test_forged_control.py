"""Forged control changes: written with a plain producer, each is refused by every service,
counted and dead-lettered; the real controller keeps its epoch and serves; a signed change applies.

The forger can write to ``control.config`` with any Kafka client but holds no control key (or a
wrong one), or copies a genuine change byte for byte.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from antdt.bus.clients import CountingProducer
from antdt.bus.deadletter import HEADER_ERROR, HEADER_SERVICE
from antdt.control.epoch import epoch_claim
from antdt.control.signing import sign
from antdt.runtime.launch import service_process
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import ControlComponent, ControlConfig
from antdt.settings import load_settings
from tests.reliability.bus import dead_letters

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = b"forged-control-test-control-key-0123"
FORGER_KEY = b"not-the-control-key-not-the-key!!!!"
CODEC = SingleObjectCodec()
APPLIED = 'antdt_controller_config_changes_total{result="applied"}'
SERVICES = ("controller", "monitor")


def refused(service: str, reason: str) -> str:
    return f'antdt_{service}_control_refused_total{{reason="{reason}"}}'


def change(config_id: str, changes: dict[str, str]) -> ControlConfig:
    return ControlConfig(
        config_id=config_id,
        component=ControlComponent.ALL,
        changes=changes,
        issued_by="test",
        issued_at=datetime.now(UTC),
    )


def write(settings, records: list[ControlConfig | bytes]) -> None:
    """With a plain producer, as anyone who can reach the broker could."""
    producer = CountingProducer({"bootstrap.servers": settings.bootstrap_servers})
    for record in records:
        value = record if isinstance(record, bytes) else CODEC.encode(record)
        producer.produce(settings.topic("control", "config"), key=b"*", value=value)
    assert producer.undelivered_after_flush(10) == 0


def test_forged_unsigned_and_replayed_changes_are_refused_and_a_signed_one_applies(
    settings, topics, tmp_path
):
    keyed = load_settings(**{**settings.model_dump(), "control_key": SecretStr(KEY.decode())})
    genuine = CODEC.encode(sign(change("rate", {"controller.max_commands_per_minute": "7"}), KEY))
    with (
        service_process(keyed, "controller", log_dir=tmp_path) as controller,
        service_process(keyed, "monitor", log_dir=tmp_path) as monitor,
    ):
        controller.wait_ready()
        monitor.wait_ready()
        assert controller.metric("antdt_controller_epoch") == 1
        write(keyed, [genuine])
        controller.wait_until(lambda: controller.metric(APPLIED) == 1, "the genuine change")

        tampered = sign(change("k", {"monitor.k": "9"}), KEY)
        write(
            keyed,
            [
                change("dry-1", {"controller.dry_run": "true"}),  # unsigned
                sign(change("dry-2", {"controller.dry_run": "true"}), FORGER_KEY),
                tampered.model_copy(update={"changes": {"controller.dry_run": "true"}}),
                genuine,  # replayed
                epoch_claim(98, "intruder"),  # an unsigned claim
                sign(epoch_claim(99, "intruder"), FORGER_KEY),
            ],
        )
        expected = {"unsigned": 2, "forged": 3, "replayed": 1}
        for name, service in (("controller", controller), ("monitor", monitor)):
            service.wait_until(
                lambda n=name, s=service: all(
                    s.metric(refused(n, r)) == count for r, count in expected.items()
                ),
                f"every forgery refused by the {name}",
            )

        dead = dead_letters(keyed, want=2 * 6)
        by_service = Counter(dict(m.headers())[HEADER_SERVICE].decode() for m in dead)
        assert by_service == {"controller": 6, "monitor": 6}
        reasons = Counter(dict(m.headers())[HEADER_ERROR].decode().rsplit(": ", 1)[1] for m in dead)
        assert reasons == {r: 2 * n for r, n in expected.items()}

        assert controller.metric("antdt_controller_epoch") == 1 and controller.is_ready()
        assert controller.metric(APPLIED) == 1  # the forgeries changed nothing
        write(keyed, [sign(change("dry-3", {"controller.dry_run": "true"}), KEY)])
        controller.wait_until(lambda: controller.metric(APPLIED) == 2, "a signed change applies")
        assert monitor.is_ready()
