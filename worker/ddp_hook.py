"""AntDT-DD's weighted average inside DDP's own all-reduce, through a communication hook.

Torch's ``DistributedDataParallel`` all-reduces gradient buckets while the
backward pass still runs, and divides by the world size. With per-rank batch
sizes ``b_i`` (a straggler's smaller, a leader's bigger) the global-batch
gradient is ``sum_i (b_i / B) g_i`` (docs of :mod:`~antdt.worker.ddp`).
:class:`WeightedReduce` registers a hook that scales each bucket by
``b_i / B`` before DDP's all-reduce of it, so DDP's overlap of communication
with the backward pass is kept and a framework that wraps DDP (Lightning,
Accelerate) can use the same hook.

No collective of its own in steady state: ``B`` must be known before the
first bucket is ready, so each rank announces its *next* step's batch in
this step's all-reduce (the batch is taken one step ahead), and the loop's
control numbers (which ranks still have data, a checkpoint due, resize
offers) ride with it: appended to the first bucket (the first one DDP
reduces), as integers in 12-bit limbs so that their sums stay exact in
float32 (:func:`encode_limbs`). A step in which no rank has samples (every
rank waiting for shards, say) has no backward pass: its numbers go in one
small all-reduce of their own. Only the first step's ``B`` needs one before
training (:meth:`WeightedReduce.prime`). One collective per bucket per step,
as plain DDP: measured on the user-style job (docs/torchrun.md), a separate
control all-reduce per step cost 25 % on 2 ms steps.

A rank with no samples this step (its shards not granted yet, its data over
before the others') still joins the step's collectives:
:meth:`WeightedReduce.idle_step` shadows the forward pass's and the bucket
all-reduces with zero gradients, as DDP's own ``join()`` does for uneven
inputs (the same reducer calls), then sets the reduced gradients on its
replica so the optimizer step keeps it equal to the others'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from antdt.errors import AntdtError
from antdt.worker.ddp import collect_cycles_before_exit, collective_device
from antdt.worker.steps import settle_device

#: Control integers travel as LIMBS limbs of LIMB_BITS bits each: a limb summed over up to
#: 2**(24 - LIMB_BITS) ranks stays below 2**24, exact in float32 (and float64).
LIMB_BITS, LIMBS = 12, 3
#: The largest control integer: 2**36 - 1 (steps, sizes; far past any job's).
LIMIT = 1 << (LIMB_BITS * LIMBS)
_HIGH, _MID = 2 * LIMB_BITS, LIMB_BITS  # the three limbs' shifts (the low one's is 0)
_MASK = (1 << LIMB_BITS) - 1
#: Buckets that carry the limbs exactly in their own dtype; a half-precision first bucket is
#: reduced in float32 (the carrier), and rounded back once.
_CARRIES_LIMBS = (torch.float32, torch.float64)


def encode_limbs(values: Sequence[int]) -> list[int]:
    """Non-negative integers below :data:`LIMIT` as ``LIMBS`` limbs each, most significant first
    (plain Python, the three limbs written out: a few numbers a step, each step; a loop over the
    shifts cost 3.8 against 1.2 us for ten numbers)."""
    limbs: list[int] = []
    for value in values:
        if not 0 <= value < LIMIT:
            raise AntdtError(f"control integers must be in [0, 2**36): got {value}")
        limbs += (value >> _HIGH, (value >> _MID) & _MASK, value & _MASK)
    return limbs


def decode_limbs(summed: Sequence[float]) -> list[int]:
    """The integers whose limbs were summed (the carries of summed limbs included)."""
    limb = iter(summed)
    return [
        (round(high) << _HIGH) + (round(mid) << _MID) + round(low)
        for high, mid, low in zip(limb, limb, limb)
    ]


class WeightedReduce:
    """DDP's gradient all-reduce weighted by batch size, with the step's control numbers alongside.

    Once, on every rank: :meth:`prime` with this rank's first batch. Then per
    step: :meth:`begin` with the batch this rank will have *next* step (0 if
    none) and the loop's integers; then, if :attr:`total` (this step's global
    batch) is not 0, either the user's backward pass through the DDP model
    (a rank with samples) or :meth:`idle_step` (a rank without); then
    :meth:`sums`, the next step's global batch and the integers, summed.
    """

    def __init__(self, ddp: DistributedDataParallel):
        if not isinstance(ddp, DistributedDataParallel):
            raise AntdtError(
                "with more than one rank, pass the model wrapped in "
                "torch.nn.parallel.DistributedDataParallel: antdt weights DDP's own all-reduce"
            )
        self.ddp = ddp
        self.group = ddp.process_group
        self.device = collective_device(self.group, list(ddp.module.parameters()))
        self.local = 0  # this rank's batch this step
        self.total: int | None = None  # the global batch this step, agreed a step ahead
        self.backward_done_at: float | None = None  # when this step's last bucket was handed over
        self._next_local = 0
        self._next_total: int | None = None
        self._control: list[int] | None = None  # this step's integers, to be summed
        self._late: Callable[[], Sequence[int]] | None = None  # ... and those asked for when sent
        self._summed: torch.Tensor | None = None  # their limbs, summed by the first bucket
        self._carrier: _Carrier | None = None
        self._sums: list[int] | None = None
        #: Work for the time the last bucket's all-reduce is in flight, which the backward pass
        #: otherwise spends waiting (the job reads its next batch there); None: none.
        self.while_reducing: Callable[[], None] | None = None
        ddp.register_comm_hook(self, _weighted_hook)
        collect_cycles_before_exit()

    def prime(self, first_batch: int) -> int:
        """Agree the first step's global batch (a collective); returns it."""
        summed = torch.tensor([first_batch], dtype=torch.int64, device=self.device)
        dist.all_reduce(summed, group=self.group)
        self._next_local, self._next_total = first_batch, int(summed.item())
        return self._next_total

    def begin(
        self,
        next_batch: int,
        integers: Sequence[int] = (),
        late: Callable[[], Sequence[int]] | None = None,
    ) -> None:
        """Start a step: the batch announced last step is this one's; announce ``next_batch``.

        ``late``: more integers, asked for only when they are sent (the first
        bucket's hook, inside the backward pass): figures of this step itself,
        such as its compute time so far.
        """
        if self._next_total is None:
            raise AntdtError("WeightedReduce.prime(first_batch) must run before the first step")
        self.local, self.total = self._next_local, self._next_total
        self._next_local = next_batch
        self.backward_done_at = None
        self._summed = self._sums = None
        self._control = [next_batch, *integers]
        self._late = late

    def recount(self, local: int) -> int:
        """This step's batch here is ``local`` after all, not the size announced last step (a new
        split applied to the batch taken ahead): the step's global batch summed again, before
        its backward pass (a collective: every rank recounts the same step). Returns it."""
        summed = torch.tensor([local], dtype=torch.int64, device=self.device)
        dist.all_reduce(summed, group=self.group)
        self.local, self.total = local, int(summed.item())
        return self.total

    def sums(self) -> list[int]:
        """The step's ``[next step's global batch, *integers]`` summed over the ranks.

        With no samples on any rank this step, that is this step's one
        collective; otherwise the first bucket carried them.
        """
        if self._sums is None and self._summed is not None:
            self._sums = decode_limbs(self._summed.tolist())
        if self._sums is None:
            if self.total:
                raise AntdtError(
                    "each step needs one loss.backward() through the DistributedDataParallel "
                    "model (its gradients were not all-reduced)"
                )
            carrier = torch.tensor(
                encode_limbs(self._take_control()), dtype=torch.float64, device=self.device
            )
            dist.all_reduce(carrier, group=self.group)
            self._sums = decode_limbs(carrier.tolist())
        self._next_total = self._sums[0]
        return self._sums

    def _take_control(self) -> list[int]:
        if self._control is None:
            raise AntdtError("a step's gradients were reduced before its begin()")
        control, self._control = self._control, None
        return control if self._late is None else [*control, *self._late()]

    # ------------------------------------------------------------ the hook's parts

    def weight(self) -> float:
        """``b_i / B`` for this step."""
        return self.local / self.total if self.total else 0.0

    def launch(self, bucket) -> torch.futures.Future:
        """Scale the bucket by ``b_i / B`` and all-reduce it; the first bucket carries the control
        numbers. Once the last bucket's all-reduce is on its way, :attr:`while_reducing` runs."""
        buffer, weight = bucket.buffer(), self.weight()
        last = bucket.is_last()
        if last:
            if buffer.is_cuda:  # the backward's kernels are this step's compute
                settle_device(buffer.device.index)
            # (a model on the CPU waits for no GPU, even where a framework initialised CUDA:
            # that sync cost 1.4 ms a step under Lightning on a GPU host)
            self.backward_done_at = time.perf_counter()
        if bucket.index() == 0:
            future = self._launch_first(buffer, weight)
        else:
            buffer.mul_(weight)
            # the group's own all-reduce (a sum), as DDP's reducer calls it: torch.distributed's
            # Python wrapper around it cost 18 us a step (a one-rank loop of the user job's
            # model: 774 against 756 us of CPU a step)
            work = self.group.allreduce([buffer])
            future = work.get_future().then(lambda done: done.value()[0])
        if last and self.while_reducing is not None:
            self.while_reducing()
        return future

    def _launch_first(self, buffer: torch.Tensor, weight: float) -> torch.futures.Future:
        """The first bucket's all-reduce, the step's limbs appended to its gradients."""
        limbs = encode_limbs(self._take_control())
        carrier = self._carrier_for(buffer, len(limbs))
        torch.mul(buffer, weight, out=carrier.gradients)
        carrier.write_limbs(limbs)
        work = self.group.allreduce([carrier.whole])
        return work.get_future().then(lambda done: self._unpack(buffer, carrier))

    def _carrier_for(self, buffer: torch.Tensor, limbs: int) -> _Carrier:
        """The first bucket's carrier, kept from step to step (a fresh one each step cost an
        allocation the size of the bucket)."""
        dtype = buffer.dtype if buffer.dtype in _CARRIES_LIMBS else torch.float32
        carrier = self._carrier
        if carrier is None or not carrier.fits(buffer, limbs, dtype):
            carrier = self._carrier = _Carrier(buffer, limbs, dtype)
        return carrier

    def _unpack(self, buffer: torch.Tensor, carrier: _Carrier) -> torch.Tensor:
        """The bucket's reduced gradients (DDP copies them into ``.grad``); the summed limbs kept
        for :meth:`sums` (read there, after the backward pass: no host sync in the hook)."""
        self._summed = carrier.limbs
        return carrier.gradients.to(buffer.dtype)

    # ------------------------------------------------------------ a rank without samples

    def idle_step(self) -> None:
        """Join this step's DDP collectives with zero gradients; the replica's ``.grad`` becomes
        the reduced gradient.

        The forward pass's collectives (bucket rebuild, buffer broadcasts)
        and one all-reduce per bucket, in the reducer's order: what DDP's
        ``join()`` shadows for a rank out of inputs, without join's own
        per-step collective (this rank's having no data was announced a step
        ahead).
        """
        ddp, reducer = self.ddp, self.ddp.reducer
        if not ddp._lazy_init_ran:
            ddp._lazy_init()
        reducer._rebuild_buckets()
        if ddp._check_sync_bufs_pre_fwd():
            ddp._sync_buffers()
        if ddp._check_sync_bufs_post_fwd():
            ddp._sync_buffers()
        buckets = reducer._get_zeros_like_grad_buckets()
        pending = [reducer._run_comm_hook(bucket) for bucket in buckets]
        for bucket, future in zip(buckets, pending):
            reduced = future.wait()
            if reduced.data_ptr() != bucket.buffer().data_ptr():
                bucket.buffer().copy_(reduced)  # the first bucket's came back in its carrier
            for param, reduced in zip(bucket.parameters(), bucket.gradients()):
                if param.grad is None:
                    param.grad = reduced.detach().clone()
                else:
                    param.grad.copy_(reduced)
        if ddp.find_unused_parameters:
            ddp._match_unused_params_allreduce()
        reducer._push_all_rebuilt_params()


class _Carrier:
    """The first bucket's all-reduce buffer: its gradients, then the step's limbs; the two views
    made once (slicing a tensor each step cost a few microseconds a view)."""

    def __init__(self, buffer: torch.Tensor, limbs: int, dtype: torch.dtype):
        count = buffer.numel()
        self.whole = torch.empty(count + limbs, dtype=dtype, device=buffer.device)
        self.gradients, self.limbs = self.whole[:count], self.whole[count:]
        # on the CPU the limbs are written through numpy: a tensor made from a list and copied
        # in cost about 50 microseconds a step, a tenth of a small model's step
        self._host_limbs = self.limbs.numpy() if self.whole.device.type == "cpu" else None

    def fits(self, buffer: torch.Tensor, limbs: int, dtype: torch.dtype) -> bool:
        shape = (self.gradients.numel(), self.limbs.numel(), self.whole.dtype, self.whole.device)
        return shape == (buffer.numel(), limbs, dtype, buffer.device)

    def write_limbs(self, limbs: list[int]) -> None:
        if self._host_limbs is not None:
            self._host_limbs[:] = limbs
        else:
            self.limbs.copy_(torch.tensor(limbs, dtype=self.whole.dtype))


def _weighted_hook(state, bucket):
    """DDP's communication hook (no annotations: DDP checks them by identity)."""
    return state.launch(bucket)
