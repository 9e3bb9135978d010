"""Averaging a model with the members of a partial-reduce group, without a process group per group.

Partial reduce (Miao et al., SIGMOD 2021) averages *models*, not
gradients: each worker applies its own step to its replica, then the P
members of a group replace their replicas by the group's mean. Equal
weights make the mixing doubly stochastic, so the mean of all replicas is
unchanged by an average: every sample's update enters the mean model with
the same weight, whichever worker trained it and whichever group it
joined (unbiased). A straggler's replica is pulled toward its group's.

The exchange is point to point inside the job's one process group: the members send their flattened
replica to the leader (the lowest rank), which averages and sends the mean back; a pair swaps
replicas both ways at once. Disjoint groups exchange at the same time over disjoint pairs, nobody
creates a process group, and no rank outside the group takes part. A group of every rank (a
checkpoint, the end) uses one all-reduce instead, and sums the ranks' ledgers in it.

A CUDA model under gloo travels through the host (gloo moves no CUDA
tensor point to point); under NCCL it stays on its device.

Every wait is bounded (:func:`~antdt.worker.ddp.wait_within`): a member
that does not send within the bound (dead or stuck) raises
:class:`~antdt.worker.ddp.CollectiveTimeout`, which ends the generation
like a broken all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from antdt.errors import AntdtError
from antdt.schemas.models import WHOLE_GROUP_REASONS, GroupFormed
from antdt.worker.ddp import collective_device, wait_within


class GroupAverager:
    """Replaces a model's parameters (and floating buffers) by their mean over a group's members."""

    def __init__(self, model: torch.nn.Module, timeout_s: float = 30.0):
        self.tensors = [p for p in model.parameters()] + [
            b for b in model.buffers() if b.is_floating_point()
        ]
        kinds = {(t.device, t.dtype) for t in self.tensors}
        if len(kinds) != 1:
            raise AntdtError(
                "partial reduce averages a model on one device with one dtype, "
                f"not {sorted(map(str, kinds))}"
            )
        self.timeout_s = timeout_s

    def average(
        self, group: GroupFormed, ledger: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Average with ``group``'s members; for a group of every rank, ``ledger`` summed over them
        too."""
        if group.reason in WHOLE_GROUP_REASONS:
            return self._all_ranks(ledger)
        mean = self.mean_of(group, self.flat())
        if mean is not None:
            self._put(mean)
        return None

    def mean_of(self, group: GroupFormed, flat: torch.Tensor) -> torch.Tensor | None:
        """The mean of the members' ``flat`` replicas (this rank's given, changed in place), point
        to point; None for a group of one. Only the members take part: a background thread may
        run it while the training thread computes (``flat`` is then a snapshot)."""
        if len(group.ranks) < 2:
            return None
        return self._point_to_point(group, flat)

    def add(self, delta: torch.Tensor) -> None:
        """Add a flat ``delta`` (a group's mean less the snapshot it averaged) to the model."""
        with torch.no_grad():
            for tensor, part in self._parts(delta):
                tensor.add_(part.to(tensor.device))

    def _all_ranks(self, ledger: torch.Tensor | None) -> torch.Tensor | None:
        flat = self.flat()
        works = [dist.all_reduce(flat, async_op=True)]
        summed = None
        if ledger is not None:
            # int32 sums could overflow at scale
            summed = ledger.to(collective_device(), dtype=torch.int64)
            works.append(dist.all_reduce(summed, async_op=True))
        self._wait(works, "the all-ranks average")
        self._put(flat.div_(dist.get_world_size()))
        return None if summed is None else summed.cpu()

    def _point_to_point(self, group: GroupFormed, flat: torch.Tensor) -> torch.Tensor:
        me, leader, tag = dist.get_rank(), group.leader, group.group_id % (2**31)
        # a pair swaps replicas both ways at once: one transfer's time, not two
        if len(group.ranks) == 2:
            other = group.ranks[1] if me == leader else leader
            theirs = torch.empty_like(flat)
            self._wait(
                [dist.isend(flat, other, tag=tag), dist.irecv(theirs, other, tag=tag)],
                f"group {group.group_id}: swapping with rank {other}",
            )
            return flat.add_(theirs).div_(2)  # a + b == b + a: both hold the same mean
        if me != leader:
            self._wait(
                [dist.isend(flat, leader, tag=tag)],
                f"group {group.group_id}: sending to rank {leader}",
            )
            self._wait(
                [dist.irecv(flat, leader, tag=tag)],
                f"group {group.group_id}: the mean from rank {leader}",
            )
            return flat
        others = [r for r in group.ranks if r != me]
        parts = [torch.empty_like(flat) for _ in others]
        self._wait(
            [dist.irecv(part, r, tag=tag) for part, r in zip(parts, others)],
            f"group {group.group_id}: the replicas of ranks {others}",
        )
        for part in parts:
            flat.add_(part)
        flat.div_(len(group.ranks))
        self._wait(
            [dist.isend(flat, r, tag=tag) for r in others],
            f"group {group.group_id}: sending the mean",
        )
        return flat

    def flat(self) -> torch.Tensor:
        """The replica's parameters and floating buffers, flattened into a new tensor (on the
        exchange's device)."""
        return torch.cat([t.detach().reshape(-1) for t in self.tensors]).to(self._exchange_device())

    def _exchange_device(self) -> torch.device:
        """The model's own device under NCCL; the host under gloo, which aborts the process sending
        a CUDA tensor."""
        here = self.tensors[0].device
        if here.type == "cpu" or "nccl" in str(dist.get_backend()).lower():
            return here
        return torch.device("cpu")

    def _put(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for tensor, part in self._parts(flat):
                tensor.copy_(part)

    def _parts(self, flat: torch.Tensor):
        """Each of the model's tensors with its part of a flat tensor (as :meth:`flat` lays them
        out), shaped like it."""
        offset = 0
        for tensor in self.tensors:
            n = tensor.numel()
            yield tensor, flat[offset : offset + n].view_as(tensor)
            offset += n

    def _wait(self, works: list, what: str) -> None:
        wait_within(works, self.timeout_s, f"{what}:")
        if self.tensors[0].is_cuda:
            torch.cuda.current_stream(self.tensors[0].device).synchronize()
