"""AntDT-DD's weighted average inside DDP's own all-reduce, through a communication hook.

Torch's ``DistributedDataParallel`` all-reduces gradient buckets while the
backward pass still runs, and divides by the world size. With per-rank batch
sizes ``b_i`` (a straggler's smaller, a leader's bigger) the global-batch
gradient is ``sum_i (b_i / B) g_i`` (docs of :mod:`~antdt.worker.ddp`).
:class:`WeightedReduce` registers a hook that scales each bucket by
``b_i / B`` before DDP's all-reduce of it, so DDP's overlap of communication
with the backward pass is kept and a framework that wraps DDP (Lightning,
Accelerate) can use the same hook.

``B`` must be known before the first bucket is ready, so each step starts
with one small integer all-reduce, launched when the step's batch is handed
out and finished while the forward pass runs (:meth:`WeightedReduce.begin`):
``[b_i, counters, ledger slots]`` summed over the ranks. The control numbers
of the loop (which ranks still have data, a checkpoint due, resize offers)
and the ledger's slots ride in it, so a step costs the same collectives on
every rank whatever its batch.

A rank with no samples this step (its shards not granted yet, its data over
before the others') still joins the step's collectives:
:meth:`WeightedReduce.idle_step` shadows the forward pass's and the bucket
all-reduces with zero gradients, as DDP's own ``join()`` does for uneven
inputs (the same reducer calls), then sets the reduced gradients on its
replica so the optimizer step keeps it equal to the others'.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from antdt.errors import AntdtError
from antdt.worker.ddp import collect_cycles_before_exit, collective_device
from antdt.worker.steps import settle_device

#: Bucket dtypes scaled in place; others (half precision) are scaled in float32 and rounded once.
_FULL_PRECISION = (torch.float32, torch.float64)


class WeightedReduce:
    """DDP's gradient all-reduce weighted by batch size, with the step's control numbers alongside.

    Per step, on every rank: :meth:`begin` with this rank's batch (0 when it
    has none), then either the user's backward pass through the DDP model
    (the hook reduces each bucket) or :meth:`idle_step`, then :meth:`sums`.
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
        self.local = 0
        self.control_wait_s = 0.0  # this step's wait for the control all-reduce (for the others)
        self.backward_done_at: float | None = None  # when this step's last bucket was handed over
        self.buckets = 0  # buckets reduced this step
        self._control: torch.Tensor | None = None
        self._work = None
        self._weight: torch.Tensor | None = None
        self._sums: list[int] | None = None
        ddp.register_comm_hook(self, _weighted_hook)
        collect_cycles_before_exit()

    def begin(self, local_batch: int, integers: Sequence[int]) -> None:
        """Start the step: launch the sum over the ranks of ``[local_batch, *integers]``."""
        self.local, self.control_wait_s = local_batch, 0.0
        self.backward_done_at, self.buckets = None, 0
        self._weight = self._sums = None
        self._control = torch.tensor(
            [local_batch, *integers], dtype=torch.int64, device=self.device
        )
        self._work = dist.all_reduce(self._control, group=self.group, async_op=True)

    def weight(self) -> torch.Tensor:
        """``b_i / B`` as a tensor on the gradients' device (no host round trip on CUDA)."""
        if self._weight is None:
            self._finish_control()
            self._weight = self.local / self._control[0].clamp(min=1).to(torch.float64)
        return self._weight

    def sums(self) -> list[int]:
        """The step's ``[B, *integers]`` summed over the ranks."""
        if self._sums is None:
            self._finish_control()
            self._sums = self._control.tolist()
        return self._sums

    def _finish_control(self) -> None:
        if self._control is None:
            raise AntdtError("a step's gradients were reduced before its begin()")
        if self._work is None:
            return
        began = time.perf_counter()
        self._work.wait()
        self._work = None
        self.control_wait_s += time.perf_counter() - began

    def scale(self, bucket) -> torch.Tensor:
        """The bucket's gradients times ``b_i / B``, in place."""
        buffer, weight = bucket.buffer(), self.weight()
        if buffer.dtype in _FULL_PRECISION:
            buffer.mul_(weight.to(buffer.dtype))
        else:
            buffer.copy_(buffer.float().mul_(weight.float()))
        self.buckets += 1
        if bucket.is_last():
            settle_device()  # on CUDA the backward's kernels are this step's compute
            self.backward_done_at = time.perf_counter()
        return buffer

    # ------------------------------------------------------------ a rank without samples

    def idle_step(self) -> None:
        """Join this step's DDP collectives with zero gradients; the replica's ``.grad`` becomes
        the reduced gradient.

        The forward pass's collectives (bucket rebuild, buffer broadcasts)
        and one all-reduce per bucket, in the reducer's order: what DDP's
        ``join()`` shadows for a rank out of inputs, without join's own
        per-step collective (this rank's having no data is already in
        :meth:`begin`'s sums).
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
            future.wait()
            for param, reduced in zip(bucket.parameters(), bucket.gradients()):
                if param.grad is None:
                    param.grad = reduced.detach().clone()
                else:
                    param.grad.copy_(reduced)
        if ddp.find_unused_parameters:
            ddp._match_unused_params_allreduce()
        reducer._push_all_rebuilt_params()


def _weighted_hook(state, bucket):
    """DDP's communication hook (no annotations: DDP checks them by identity)."""
    buffer = state.scale(bucket)
    future = dist.all_reduce(buffer, group=state.group, async_op=True).get_future()
    return future.then(lambda done: done.value()[0])
