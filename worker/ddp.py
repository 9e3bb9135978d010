"""What synchronous ranks share around their collectives: bounds, a broken group's end, agreement.

The weighted all-reduce itself (different local batch sizes, the update of
one process on the whole batch, AntDT-DD as in LB-BSP) runs inside DDP's
own bucketed all-reduce, :class:`~antdt.worker.ddp_hook.WeightedReduce`;
partial reduce's group averages are
:class:`~antdt.worker.preduce.averaging.GroupAverager`. Both rest on what
is kept here once:

* **never hang**: a :class:`StepSizedTimeout` bounds a collective by a few
  of the job's recent step periods; :func:`wait_within` waits within it
  and raises :class:`CollectiveTimeout` past it (a dead rank breaks the
  collective at once; a stuck one would otherwise hold every other rank
  for the process group's whole timeout). With the ranks' heartbeats
  (:class:`~antdt.worker.liveness.PeerLiveness`) the bound only asks
  whether every rank is alive: a slow one (its data path stalled) is
  waited for, up to :data:`HUNG_AFTER_S`; one that stopped beating (dead,
  SIGSTOP, its interpreter wedged) ends the wait at once;
* **a broken group ends the process** (:func:`end_broken_group`, exit 77):
  the process group is unusable after a timeout, and the launcher
  (torchrun, the demo's pool) restarts the group from the last checkpoint;
* **agreement**: rank 0's integer for every rank (:func:`broadcast_int`),
  and one shard-state version that covers every rank's commits
  (:func:`agreed_checkpoint_version`).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn, TypeVar

import torch
import torch.distributed as dist

from antdt.errors import AntdtError
from antdt.worker.liveness import PeerLiveness, hang_verdict, silent_ranks

T = TypeVar("T")

log = logging.getLogger(__name__)


class DistributedError(AntdtError):
    """The ranks could not agree (a collective helper failed on some rank)."""


class CollectiveTimeout(DistributedError):
    """A step's collective waited longer than the job's steps allow: a rank is dead or stuck."""


#: Exit code of a rank whose group broke under it (the launcher restarts the whole group).
EXIT_GROUP_BROKEN = 77
#: The longest a collective waits while every rank is alive (a wedged device, a hung kernel).
HUNG_AFTER_S = 300.0


def broke_the_group(exc: BaseException) -> bool:
    """Whether ``exc`` says the process group broke (a peer died or is stuck) rather than the step
    failing.

    Gloo reports a peer gone as a plain RuntimeError, so its text is looked at too.
    """
    if isinstance(exc, (dist.DistBackendError, DistributedError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "nccl", "connection")
    )


def end_broken_group(who: str, exc: BaseException) -> NoReturn:
    """End this rank now, as if killed: its group's generation is over and what it did since the
    last checkpoint is rewound. No leaving announcement (it would return its shards while its last
    commits are still on their way), no interpreter teardown under the broken group's threads.
    """
    print(
        f"{who}: the group broke "
        f"({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}); "
        f"exiting {EXIT_GROUP_BROKEN}",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(EXIT_GROUP_BROKEN)


@dataclass
class StepSizedTimeout:
    """How long a step's collective may wait: ``factor`` x the longest of the last ``window`` step
    periods.

    Never less than ``floor_s`` (a step can slow down for real: a straggler,
    a checkpoint), and ``first_s`` before any period is known (the ranks'
    start-up differs). A period is the time between two completed collectives.
    """

    floor_s: float = 10.0
    factor: float = 10.0
    window: int = 20
    first_s: float = 120.0
    _periods: deque = field(default_factory=deque, repr=False)
    _last_done: float | None = field(default=None, repr=False)

    def limit_s(self) -> float:
        if not self._periods:
            return self.first_s
        return max(self.floor_s, self.factor * max(self._periods))

    def completed(self, now: float) -> None:
        if self._last_done is not None:
            self._periods.append(now - self._last_done)
            while len(self._periods) > self.window:
                self._periods.popleft()
        self._last_done = now

    def not_a_step(self, now: float) -> None:
        """The time since the last collective was not a step (a checkpoint, say): leave it out of
        the periods."""
        if self._last_done is not None:
            self._last_done = now

    def describe(self) -> str:
        known = (
            f"{self.factor:g}x the slowest of the last {len(self._periods)} steps, "
            f"at least {self.floor_s:g} s"
        )
        return known if self._periods else "the first step's bound"


def world_size(group: dist.ProcessGroup | None = None) -> int:
    """Ranks in ``group``; 1 when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def collective_device(
    group: dist.ProcessGroup | None = None, params: Sequence[torch.Tensor] = ()
) -> torch.device:
    """Where small control tensors live: next to the gradients, or where the backend needs them."""
    if params:
        return params[0].device
    if "nccl" in str(dist.get_backend(group)).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_collect_at_exit_registered = False


def collect_cycles_before_exit() -> None:
    """Free the process group's last holders before the interpreter finalises (idempotent).

    A DDP model (and a hook's state) sits in reference cycles that only the
    garbage collector frees; left to the interpreter's finalisation, freeing
    them joins gloo's worker threads when those can no longer take the GIL,
    and the process aborts ("terminate called without an active
    exception", SIGABRT) after training finished. Measured with two gloo
    ranks, five steps and ``destroy_process_group()``: 2-3 aborts in 20
    runs, plain DDP alike; with this ``gc.collect()`` at exit, 0 in 50
    (upstream: pytorch issue 190489; PR 179291, destroying the groups at
    exit, was abandoned).
    """
    global _collect_at_exit_registered
    if not _collect_at_exit_registered:
        atexit.register(_collect_everything)
        _collect_at_exit_registered = True


def _collect_everything() -> None:
    """A full collection of every object, frozen ones too (a job that never closed left its heap
    frozen: :func:`~antdt.worker.training_job.freeze_for_training`)."""
    gc.unfreeze()
    gc.collect()


def wait_within(
    works: Sequence,
    limit_s: float,
    what: str,
    limit_text: str | None = None,
    peers: PeerLiveness | None = None,
    cap_s: float = HUNG_AFTER_S,
) -> None:
    """Wait for each of ``works`` (asynchronous collectives) within ``limit_s`` in all.

    Past it, :class:`CollectiveTimeout` naming ``what`` and how long it
    waited: a rank is dead or stuck, and the process group is unusable.
    With ``peers`` the limit only starts the question: the wait goes on while
    every other rank still beats (slow, not dead: its data path or compute
    has bounds of its own), up to ``cap_s`` in all, and ends at once, naming
    them, when some rank stops beating.
    """
    began = time.monotonic()
    deadline = began + limit_s
    limit_text = limit_text or f"{limit_s:g} s"
    while not _done_by(works, deadline):
        if peers is None:
            raise CollectiveTimeout(
                f"{what} waited {time.monotonic() - began:.1f} s (limit {limit_text}): "
                "a rank is dead or stuck"
            )
        before = peers.latest()
        if _done_by(works, min(time.monotonic() + peers.window_s, began + cap_s)):
            return
        silent = silent_ranks(before, peers.latest(), peers.rank)
        waited = time.monotonic() - began
        verdict = hang_verdict(waited, limit_s, cap_s, silent, limit_text)
        if verdict is not None:
            raise CollectiveTimeout(f"{what} {verdict}")
        log.warning(
            "%s has waited %.1f s; every rank is alive, waiting on (at most %g s)",
            what,
            time.monotonic() - began,
            cap_s,
        )
        deadline = time.monotonic() + limit_s


def _done_by(works: Sequence, deadline: float) -> bool:
    """Whether every one of ``works`` finished before ``deadline`` (a timed-out wait can be
    waited again)."""
    for work in works:
        try:
            work.wait(timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())))
        except RuntimeError as exc:
            if not _is_timeout(exc):
                raise
            return False
    return True


def _is_timeout(exc: RuntimeError) -> bool:
    """gloo says "timed out"; NCCL's blocking wait says the work "ran for N milliseconds before
    timing out"."""
    text = str(exc).lower()
    return "timed out" in text or "before timing out" in text


def broadcast_int(value: int, src: int = 0, group: dist.ProcessGroup | None = None) -> int:
    """Rank ``src``'s ``value`` on every rank (``src`` is a global rank); ``value`` itself without a
    group."""
    if world_size(group) == 1:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=collective_device(group))
    dist.broadcast(box, src=src, group=group)
    return int(box.item())


def gather_objects(value: T, group: dist.ProcessGroup | None, device: torch.device) -> list[T]:
    """Every rank's picklable ``value``, in rank order, on every rank. Under NCCL the pickles travel
    on ``device`` (the model's GPU), not on whatever ``torch.cuda.current_device()`` a script
    left set (``all_gather_object`` uses that one)."""
    gathered: list[T] = [value] * world_size(group)
    if len(gathered) == 1:
        return gathered
    on_gpu = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_gpu:
        dist.all_gather_object(gathered, value, group=group)
    return gathered


def agreed_checkpoint_version(
    flush: Callable[[], None],
    ask: Callable[[], int],
    group: dist.ProcessGroup | None = None,
    src: int = 0,
) -> int:
    """The sharder's shard-state version for a checkpoint, the same on every rank.

    Every rank flushes its shard reports, then waits for the others (so every
    DONE any rank reported is covered), then rank ``src`` asks the sharder and
    broadcasts the answer (``src`` is a global rank). If asking fails on
    ``src`` the others raise too instead of waiting forever. Without
    torch.distributed: flush, then ask.
    """
    flush()
    if world_size(group) == 1:
        return ask()
    dist.barrier(group=group)
    version, failure = -1, None
    if dist.get_rank() == src:
        try:
            version = int(ask())
        except Exception as error:  # noqa: BLE001 - re-raised below, after the others are told
            failure = error
    version = broadcast_int(version, src, group)
    if failure is not None:
        raise failure
    if version < 0:
        raise DistributedError(f"rank {src} could not get a checkpoint version from the sharder")
    return version
