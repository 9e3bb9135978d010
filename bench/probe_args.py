"""What the rank probes (``rank_profile/``, ``phase_probe/``) read of the script they run in: its
``--mode``, which names the files they write. Each probe's ``sitecustomize`` appends ``bench/`` to
``sys.path`` to import it (appended: nothing the script imports is shadowed)."""

from __future__ import annotations

import sys


def script_mode(argv: list[str] | None = None) -> str:
    """The script's ``--mode M`` or ``--mode=M`` (``run`` without one)."""
    argv = sys.argv if argv is None else argv
    for index, argument in enumerate(argv):
        if argument == "--mode" and index + 1 < len(argv):
            return argv[index + 1]
        if argument.startswith("--mode="):
            return argument.split("=", 1)[1]
    return "run"
