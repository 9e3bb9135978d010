"""Where a demo, benchmark or ``antdt up`` finds its bus."""

from __future__ import annotations

import pytest

from antdt.demo import environment
from antdt.embedded.broker import free_port
from antdt.errors import BusUnreachable


def test_a_dead_external_bus_says_where_the_address_came_from(monkeypatch):
    # ANTDT_BOOTSTRAP_SERVERS left over from an earlier `antdt up` whose broker is gone
    monkeypatch.setenv("ANTDT_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.setattr(environment, "EXTERNAL_BUS_WITHIN_S", 1.0)
    with pytest.raises(BusUnreachable) as caught, environment.run_bus():
        pass
    message = str(caught.value)
    assert "cannot read cluster metadata" in message, message
    assert "unset ANTDT_BOOTSTRAP_SERVERS" in message, message
