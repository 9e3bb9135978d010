"""Which part of a step each demo worker is in, so chaos can kill one mid-step.

A worker writes one byte to ``phase-<rank>`` in the run's handshake directory
at each change (a positional write, no buffering, about a microsecond); the
harness reads it when it wants to kill a worker in the middle of a push to
the parameter server or of an all-reduce, and kills it only once it reads
that phase.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path


class Phase(str, Enum):
    OTHER = "o"
    PUSH = "p"  # sending an update to the parameter server and asking for its commit
    ALLREDUCE = "a"  # in the step's gradient all-reduce


def phase_file(handshake: Path, rank: int) -> Path:
    return handshake / f"phase-{rank}"


class PhaseWriter:
    """The worker's side: ``with writer.during(Phase.PUSH): ...``."""

    def __init__(self, handshake: Path, rank: int):
        self._fd = os.open(phase_file(handshake, rank), os.O_RDWR | os.O_CREAT, 0o644)
        self.set(Phase.OTHER)

    def set(self, phase: Phase) -> None:
        os.pwrite(self._fd, phase.value.encode(), 0)

    def during(self, phase: Phase):
        return _During(self, phase)

    def close(self) -> None:
        os.close(self._fd)


class _During:
    def __init__(self, writer: PhaseWriter, phase: Phase):
        self.writer, self.phase = writer, phase

    def __enter__(self) -> None:
        self.writer.set(self.phase)

    def __exit__(self, *exc_info) -> None:
        self.writer.set(Phase.OTHER)


def read_phase(handshake: Path, rank: int) -> Phase:
    """The phase worker ``rank`` wrote last (OTHER if it wrote none)."""
    try:
        with open(phase_file(handshake, rank), "rb") as file:
            value = file.read(1).decode()
    except OSError:
        return Phase.OTHER
    return Phase(value) if value in {p.value for p in Phase} else Phase.OTHER
