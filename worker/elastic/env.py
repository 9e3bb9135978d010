"""Who a process is under torchrun (torch.distributed.elastic): read from the variables torchrun
sets.

torchrun gives every worker process its place in the job (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK`` for its node, ...) and its
agent's restart count; the antdt agent takes its identity from them, so a
script under torchrun needs no ids of its own. ``TORCHELASTIC_RUN_ID`` marks
a torchrun process: without it there is nothing to read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from antdt.errors import ConfigError

RUN_ID_VAR = "TORCHELASTIC_RUN_ID"


@dataclass(frozen=True)
class TorchrunEnv:
    """One worker process's place in a torchrun job (the names are torchrun's)."""

    run_id: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    restart_count: int
    max_restarts: int

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
        """The torchrun environment of this process, or None when torchrun did not start it."""
        environ = os.environ if environ is None else environ
        if RUN_ID_VAR not in environ:
            return None
        return cls(
            run_id=environ[RUN_ID_VAR],
            rank=_int(environ, "RANK"),
            local_rank=_int(environ, "LOCAL_RANK"),
            world_size=_int(environ, "WORLD_SIZE"),
            local_world_size=_int(environ, "LOCAL_WORLD_SIZE", 1),
            group_rank=_int(environ, "GROUP_RANK", 0),
            group_world_size=_int(environ, "GROUP_WORLD_SIZE", 1),
            restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT", 0),
            max_restarts=_int(environ, "TORCHELASTIC_MAX_RESTARTS", 0),
        )

    @property
    def named_run(self) -> bool:
        """Whether the run id names the job (``--rdzv-id``); torchrun's default is the literal
        "none"."""
        return bool(self.run_id) and self.run_id != "none"

    def worker_id(self, node: str) -> str:
        """This process's antdt id: its node and local rank, the same across restarts and
        re-rendezvous.

        Not the global rank: after a node leaves, the ranks are handed out
        again, and a rank number would then name another process.
        """
        return f"{node}-{self.local_rank}"


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None:
        if default is None:
            raise ConfigError(
                f"{name} is not set, though {RUN_ID_VAR} is: not a process torchrun started"
            )
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"{name}: expected an integer >= 0, got {value}")
    return value
