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

from antdt.errors import AntdtError

POLL_S = 0.005
#: How long the harness waits for every worker to be ready before it gives up on the run.
READY_WITHIN_S = 180.0
#: How long a ready worker waits for the start: the others' readiness, and a margin.
START_WITHIN_S = READY_WITHIN_S + 60.0


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


def wait_for_start(handshake: Path, within_s: float = START_WITHIN_S) -> float:
    """The run's start time, once the harness has written it (at once for a restarted worker);
    AntdtError after ``within_s`` (the harness gone, say, killed with its workers left behind)."""
    go, deadline = handshake / "go", time.monotonic() + within_s
    while not go.exists():
        if time.monotonic() > deadline:
            raise AntdtError(f"the run did not start within {within_s:g} s ({go} never appeared)")
        time.sleep(POLL_S)
    return float(go.read_text())
