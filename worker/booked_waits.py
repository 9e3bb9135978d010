"""Collectives that run outside antdt's step but wait for the other ranks, booked as sync wait.

A rank's compute is its step's time less what was booked as waiting, and
AntDT-DD sizes batches by it. A collective antdt does not time is booked as
compute, and it waits for the slowest rank: a healthy rank then looks as
slow as the straggler and DD gives the straggler's samples to the wrong
rank. Two such collectives run every step, both rooted at rank 0 (with
gloo, rank 0 waits for every receiver; with NCCL, every rank does):

* DDP's **buffer broadcast** before each forward pass of a model with
  buffers (BatchNorm statistics, a transformer's position ids);
* PyTorch Lightning's **SIGTERM broadcast** before each training batch
  (Lightning 2.5 on).

:func:`book_as_sync_wait` wraps such a method of one object so its time is
the agent's sync wait.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch

from antdt.worker.steps import settle_device

if TYPE_CHECKING:
    from antdt.worker.agent import Agent


def book_as_sync_wait(
    owner: object,
    name: str,
    agent: Agent,
    device: torch.device,
    watched: Callable[[], AbstractContextManager] = nullcontext,
) -> bool:
    """From now on ``owner.name(...)`` is booked as ``agent``'s sync wait; returns whether
    ``owner`` has that method (a framework version without it runs no such collective).

    On a CUDA ``device`` the queued work is finished before the call (compute) and after it (the
    collective's own wait, queued by NCCL). ``watched``: the bound on its wait where no step's
    watch covers it (a job's ``watched``). Installing it again replaces the earlier wrapper.
    """
    method = getattr(type(owner), name, None)
    if method is None:
        return False
    bound = method.__get__(owner)
    cuda = device.type == "cuda"

    @functools.wraps(bound)
    def booked(*args, **kwargs):
        if cuda:
            settle_device(device.index)
        with agent.sync_wait(settle=False), watched():
            result = bound(*args, **kwargs)
            if cuda:
                settle_device(device.index)
        return result

    setattr(owner, name, booked)
    return True
