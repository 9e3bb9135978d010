"""Real gloo process groups for the tests that spawn ranks."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


def join_gloo(init_file: str, rank: int, world: int = 2, timeout_s: float = 60.0) -> None:
    """This spawned process as ``rank`` of a CPU gloo group met through ``init_file`` (one thread:
    the machine is small)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
