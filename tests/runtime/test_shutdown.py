"""Signals: SIGTERM and Ctrl-C take the same clean path."""

from __future__ import annotations

import os
import signal

import pytest

from antdt.runtime.shutdown import interrupt_on_sigterm, stop_on_signals


def test_stop_on_signals_sets_the_event_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_becomes_keyboard_interrupt_so_cleanup_runs():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt_on_sigterm():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10_000_000):  # the handler runs between bytecodes
                    pass
            finally:
                cleaned.append(True)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before
