"""The files through which the harness and its worker processes meet.

In the run's handshake directory each worker writes ``ready-<rank>`` once it
can train, the harness then writes ``go`` (the run's start time, as seconds
since the epoch), and each worker writes ``done-<rank>.json`` (finish time,
samples, steps) when it ends. Every file appears whole (written aside, then
renamed), so a reader never sees half of one.
"""

from __future__ import annotations

import time
from pathlib import Path

POLL_S = 0.005


def ready_file(handshake: Path, rank: int) -> Path:
    return handshake / f"ready-{rank}"


def done_file(handshake: Path, rank: int) -> Path:
    return handshake / f"done-{rank}.json"


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def give_start(handshake: Path, start_wall: float) -> None:
    write_atomically(handshake / "go", repr(start_wall))


def wait_for_start(handshake: Path) -> float:
    """The run's start time, once the harness has written it (at once for a restarted worker)."""
    go = handshake / "go"
    while not go.exists():
        time.sleep(POLL_S)
    return float(go.read_text())
