"""Different local batch sizes under synchronous data parallelism (AntDT-DD, as in LB-BSP).

A straggler gets a smaller local batch and a leader a bigger one, the global
batch staying constant. Plain DDP averages gradients with equal weights, which
is only right when every rank holds the same number of samples. If each rank's
loss is the *mean* over its local batch of ``b_i`` samples, the gradient of the
global batch (``B = sum b_i`` samples) is ``sum_i (b_i / B) g_i``:
:class:`WeightedGradientAverager` computes exactly that, so the update is the
one a single process would make on the concatenated batch.

Deadlock freedom: every call of :meth:`WeightedGradientAverager.sync` runs the
same collectives in the same order on every rank, whatever the local batch
sizes (zero included). The batch sizes themselves travel in the first
collective, so the ranks never need to agree on them beforehand: a rank that
applies a new size one step early or late changes which samples are trained,
never the sequence of collectives, and the weights stay exact.

With a :class:`~antdt.worker.ledger.LedgerSlots` the averager also counts
every rank's samples of the step into the ledger, in the same all-reduce as
the gradients: the ledger changes exactly when the model does.

Never hang: with a :class:`StepSizedTimeout` each collective waits at most a
few of the job's recent step periods, then raises :class:`CollectiveTimeout`
(a dead rank breaks the collective at once; a stuck one would otherwise hold
every other rank for the process group's whole timeout). With the ranks'
heartbeats (:class:`~antdt.worker.liveness.PeerLiveness`) the bound only asks
whether every rank is alive: a slow one (its data path stalled) is waited
for, up to :data:`HUNG_AFTER_S`; one that stopped beating (dead, SIGSTOP, its
interpreter wedged) ends the wait at once. The process group is unusable
after a timeout: end the process and let the launcher (torchrun, the demo's
pool) restart the group from the last checkpoint.
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
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from antdt.errors import AntdtError
from antdt.worker.ledger import LedgerSlots
from antdt.worker.liveness import PeerLiveness, hang_verdict, silent_ranks

log = logging.getLogger(__name__)

SyncTimer = Callable[[], AbstractContextManager[object]]
"""Makes a context manager entered around the collectives, to book their time as synchronisation."""


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


def _no_timer() -> AbstractContextManager[object]:
    return contextlib.nullcontext()


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
        atexit.register(gc.collect)
        _collect_at_exit_registered = True


def _parameters(
    model_or_params: torch.nn.Module | Iterable[torch.Tensor],
) -> list[torch.nn.Parameter]:
    source = (
        model_or_params.parameters()
        if isinstance(model_or_params, torch.nn.Module)
        else model_or_params
    )
    params, seen = [], set()
    for param in source:
        if param.requires_grad and id(param) not in seen:  # tied weights are reduced once
            seen.add(id(param))
            params.append(param)
    return params


class WeightedGradientAverager:
    """Averages gradients across ranks weighted by local batch size.

    Call :meth:`sync` after ``backward()`` and before ``optimizer.step()``, on
    every rank, every step (a rank with no samples this step calls it too, with
    ``local_batch_size=0``). Use it *instead of* DDP's own gradient averaging
    (wrap the model in nothing, or use DDP's ``no_sync()``).

    Collectives per call: one, when every gradient shares a device and is
    float32 or float64: the batch sizes, which parameters have a gradient
    anywhere, and the batch-weighted gradients travel in one flat buffer.
    Otherwise (mixed devices or dtypes, half precision, whose mantissa cannot
    carry batch sizes exactly) one small integer all-reduce, then one per
    (device, dtype). Either way the count stays constant however many
    parameters the model has, and is the same on every rank.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        sync_timer: SyncTimer | None = None,
        ledger: LedgerSlots | None = None,
        timeout: StepSizedTimeout | None = None,
        peers: PeerLiveness | None = None,
    ):
        """``peers``: the ranks' heartbeats; a collective past its ``timeout`` then waits on while
        every rank is alive (:func:`wait_within`)."""
        self.group = group
        self.peers = peers
        self.sync_timer = sync_timer
        self.ledger = ledger
        self.timeout = timeout
        self.steps = 0  # collectives completed: names the step in a timeout's message
        collect_cycles_before_exit()

    def sync(
        self,
        model_or_params: torch.nn.Module | Iterable[torch.Tensor],
        local_batch_size: int,
        sync_timer: SyncTimer | None = None,
        tags: Sequence = (),
    ) -> int:
        """Replace every rank's gradients by the global-batch gradient; returns the global batch
        size.

        ``sync_timer`` (this call's, else the averager's, e.g. ``agent.sync_wait``)
        is entered around the collectives: the first one is where a fast rank
        waits for the slow ones, so its time is synchronisation, not compute.
        With a timer on CUDA the call waits for the collectives to finish, so
        the time booked is their real time.

        A parameter whose gradient is None on a rank counts as zero there; it
        ends with the reduced gradient on every rank, or None on every rank if
        no rank with samples produced one (as in single-process training).
        A rank with ``local_batch_size == 0`` contributes zero whatever its
        gradients hold (stale values, even NaN). If the global batch is 0, all
        gradients become None everywhere; skip the optimizer step then.
        Without torch.distributed (or with one rank) nothing changes.

        ``tags``: this rank's samples of the step (``agent.pending_tags``),
        counted into the ledger when the averager has one.
        """
        return self.sync_counting(model_or_params, local_batch_size, (), sync_timer, tags)[0]

    def sync_counting(
        self,
        model_or_params: torch.nn.Module | Iterable[torch.Tensor],
        local_batch_size: int,
        counters: Sequence[int] = (),
        sync_timer: SyncTimer | None = None,
        tags: Sequence = (),
    ) -> tuple[int, list[int]]:
        """:meth:`sync`, plus small non-negative integers summed over the ranks in the same
        collective.

        For loop control that would otherwise cost a collective of its own
        (how many ranks still have data, say). Returns (global batch, sums).
        """
        counters = [int(c) for c in counters]
        slots = self.ledger.encode(tags) if self.ledger is not None else []
        global_batch, sums = self._sync_counting(
            model_or_params, local_batch_size, counters + slots, sync_timer
        )
        if self.ledger is not None:
            self.ledger.add(sums[len(counters) :])
        return global_batch, sums[: len(counters)]

    def _sync_counting(
        self,
        model_or_params,
        local_batch_size: int,
        counters: list[int],
        sync_timer: SyncTimer | None,
    ) -> tuple[int, list[int]]:
        if (
            isinstance(local_batch_size, bool)
            or not isinstance(local_batch_size, int)
            or local_batch_size < 0
        ):
            raise ValueError(f"local_batch_size must be an int >= 0, got {local_batch_size!r}")
        if any(c < 0 for c in counters):
            raise ValueError(f"counters must be >= 0, got {counters}")
        params = _parameters(model_or_params)
        world = world_size(self.group)
        if world == 1:
            return local_batch_size, counters
        for param in params:
            if param.grad is not None and param.grad.is_sparse:
                raise ValueError("sparse gradients are not supported")
        timer = sync_timer or self.sync_timer
        with (timer or _no_timer)():
            if _one_buffer_fits(params, [local_batch_size, *counters], world):
                global_batch, sums = self._one_collective(params, local_batch_size, counters)
            else:
                global_batch, sums = self._two_collectives(params, local_batch_size, counters)
        self.steps += 1
        if self.timeout is not None:
            self.timeout.completed(time.monotonic())
        return global_batch, sums

    def _all_reduce(self, buffers: list[torch.Tensor]) -> None:
        """Sum each buffer over the ranks, all in flight at once; within the timeout's bound when
        there is one."""
        works = [
            dist.all_reduce(b, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            for b in buffers
        ]
        if self.timeout is None:
            for work in works:
                work.wait()
        else:
            limit = self.timeout.limit_s()
            wait_within(
                works,
                limit,
                f"the all-reduce of step {self.steps}",
                f"{limit:.1f} s: {self.timeout.describe()}",
                peers=self.peers,
            )
        _finish_cuda(buffers)

    def _one_collective(
        self, params: list[torch.nn.Parameter], local_batch_size: int, counters: list[int]
    ) -> tuple[int, list[int]]:
        """[b_i, counters, has_grad flags, b_i * gradients] in one all-reduce, divided by B
        afterwards.

        sum_i(b_i g_i) / B is the same average as sum_i((b_i / B) g_i); the
        control numbers ride along exactly (checked by :func:`_one_buffer_fits`).
        """
        contributes = local_batch_size > 0
        head = [local_batch_size, *counters] + [
            int(contributes and p.grad is not None) for p in params
        ]
        flat = (
            self._flatten(params, float(local_batch_size), contributes)
            if params
            else torch.zeros(0)
        )
        buffer = torch.cat([torch.tensor(head, dtype=flat.dtype, device=flat.device), flat])
        self._all_reduce([buffer])
        control = [round(x) for x in buffer[: len(head)].tolist()]
        global_batch, sums, has_grad = (
            control[0],
            control[1 : 1 + len(counters)],
            control[1 + len(counters) :],
        )
        grads = buffer[len(head) :]
        if global_batch:
            grads.div_(global_batch)
        offset = 0
        for param, anywhere in zip(params, has_grad):
            n = param.numel()
            if anywhere and global_batch:
                self._unflatten([param], grads[offset : offset + n])
            else:
                param.grad = None
            offset += n
        return global_batch, sums

    def _two_collectives(
        self, params: list[torch.nn.Parameter], local_batch_size: int, counters: list[int]
    ) -> tuple[int, list[int]]:
        """Mixed devices or dtypes, or low-precision gradients: exact integers first, then one
        buffer per (device, dtype)."""
        device = collective_device(self.group, params)
        contributes = local_batch_size > 0
        # [b_i, counters, has_grad_0, ..., has_grad_n]: where the ranks learn about each other.
        control = torch.tensor(
            [local_batch_size, *counters]
            + [int(contributes and param.grad is not None) for param in params],
            dtype=torch.int64,
            device=device,
        )
        self._all_reduce([control])
        control = control.tolist()
        global_batch, sums, has_grad = (
            control[0],
            control[1 : 1 + len(counters)],
            control[1 + len(counters) :],
        )
        weight = local_batch_size / global_batch if global_batch else 0.0
        buckets: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        for param, anywhere in zip(params, has_grad):
            if anywhere:
                buckets.setdefault((param.device, param.dtype), []).append(param)
            else:
                param.grad = None  # consistent on every rank: no rank with samples had a gradient
        flats = [self._flatten(members, weight, contributes) for members in buckets.values()]
        self._all_reduce(flats)
        for members, flat in zip(buckets.values(), flats):
            self._unflatten(members, flat)
        return global_batch, sums

    @staticmethod
    def _flatten(
        members: list[torch.nn.Parameter], weight: float, contributes: bool
    ) -> torch.Tensor:
        """One buffer holding ``weight * grad`` of each member (zeros where absent or not
        contributing)."""
        flat = torch.zeros(
            sum(p.numel() for p in members), dtype=members[0].dtype, device=members[0].device
        )
        if contributes:
            offset = 0
            for param in members:
                n = param.numel()
                if param.grad is not None:
                    flat[offset : offset + n].copy_(param.grad.reshape(-1)).mul_(weight)
                offset += n
        return flat

    @staticmethod
    def _unflatten(members: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
        offset = 0
        for param in members:
            n = param.numel()
            reduced = flat[offset : offset + n].view_as(param)
            if param.grad is None:
                param.grad = reduced.clone()
            else:
                # in place: keeps the optimizer's and hooks' view of .grad
                param.grad.copy_(reduced)
            offset += n


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


_EXACT_INTEGERS = {torch.float32: 2**24, torch.float64: 2**53}


def _one_buffer_fits(params: list[torch.nn.Parameter], integers: list[int], world: int) -> bool:
    """One collective works when every gradient shares a device and a float type that holds the sums
    exactly."""
    kinds = {(p.device, p.dtype) for p in params}
    if len(kinds) > 1:
        return False
    dtype = next(iter(kinds))[1] if kinds else torch.float32
    limit = _EXACT_INTEGERS.get(dtype)
    return limit is not None and max(integers, default=0) * world < limit


def _finish_cuda(buffers: list[torch.Tensor]) -> None:
    """CUDA collectives return before they finish; a timer around them must see their end."""
    for buffer in buffers:
        if buffer.is_cuda:
            torch.cuda.current_stream(buffer.device).synchronize()


def broadcast_int(value: int, src: int = 0, group: dist.ProcessGroup | None = None) -> int:
    """Rank ``src``'s ``value`` on every rank (``src`` is a global rank); ``value`` itself without a
    group."""
    if world_size(group) == 1:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=collective_device(group))
    dist.broadcast(box, src=src, group=group)
    return int(box.item())


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
