"""The test harness's own settings (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SERIAL_MODULES

ROOT = Path(__file__).parent.parent


def test_every_serial_module_exists():
    """A renamed module would silently leave the serial unit and run beside another one."""
    assert [module for module in sorted(SERIAL_MODULES) if not (ROOT / module).is_file()] == []
