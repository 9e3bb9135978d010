"""DDP with antdt's communication hook gives the update of one process on the whole batch.

Two real gloo ranks train a float64 model with BatchNorm (buffers DDP
broadcasts) over several small buckets, with different batch sizes per
step, each rank sitting out one step with no samples (its collectives
shadowed as DDP's ``join()`` does), one step with no samples anywhere, and
one whose batches changed size after they were announced (recounted).
Every rank's final parameters must equal single-process training on the
concatenated batch, and the control numbers sent with each step (in the
first bucket, or alone in the empty step) must come back summed. Where a GPU
is present the same steps run with the model and batches on it (gloo reduces
CUDA tensors; both ranks share the one device).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.parallel import DistributedDataParallel

from antdt.errors import AntdtError
from antdt.worker.ddp_hook import LIMIT, WeightedReduce, decode_limbs, encode_limbs
from tests.worker.groups import ON_EACH_DEVICE, join_gloo

# per rank, per step: the batch size (0: the rank has no samples that step)
SIZES = {0: [3, 0, 5, 0, 4, 7], 1: [5, 6, 0, 0, 4, 2]}
STEPS = len(SIZES[0])
# ... and the size announced a step ahead: at step 4 a new split cut the batches taken for it
# (6 and 2) to 4 and 4 after they were announced, and every rank recounts that step
ANNOUNCED = {0: [3, 0, 5, 0, 6, 7], 1: [5, 6, 0, 0, 2, 2]}
RECOUNTED = {4}


def new_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 64),
        torch.nn.BatchNorm1d(64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Linear(64, 1),
    ).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def batch(step: int, rank: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 * step + rank)
    size = SIZES[rank][step]
    return (
        torch.randn(size, 4, generator=generator, dtype=torch.float64).to(device),
        torch.randn(size, 1, generator=generator, dtype=torch.float64).to(device),
    )


def rank_main(rank: int, init_file: str, out_dir: str, device: str) -> None:
    join_gloo(init_file, rank)
    model, optimizer = new_model()
    ddp = DistributedDataParallel(model.to(device), bucket_cap_mb=0.01)  # several buckets
    reduce = WeightedReduce(ddp)
    reduce.prime(ANNOUNCED[rank][0])
    sums = []
    for step in range(STEPS):
        inputs, targets = batch(step, rank, device)
        following = ANNOUNCED[rank][step + 1] if step + 1 < STEPS else 0
        reduce.begin(following, [int(len(inputs) > 0), 10 + rank])
        if step in RECOUNTED:
            assert reduce.recount(len(inputs)) == sum(s[step] for s in SIZES.values())
        if reduce.total:
            optimizer.zero_grad(set_to_none=True)
            if len(inputs):
                F.mse_loss(ddp(inputs), targets).backward()
            else:
                reduce.idle_step()
            optimizer.step()
        sums.append(reduce.sums())
    torch.save(
        {"params": [p.detach().cpu() for p in model.parameters()], "sums": sums},
        Path(out_dir) / f"rank-{rank}.pt",
    )
    dist.destroy_process_group()


def single_process() -> list[torch.Tensor]:
    """The same steps on one process: each rank's batch normalised on its own (as BatchNorm does
    per replica), the loss the mean over every sample of the step."""
    model, optimizer = new_model()
    for step in range(STEPS):
        parts = [batch(step, rank) for rank in SIZES if SIZES[rank][step]]
        if not parts:
            continue
        total = sum(len(inputs) for inputs, _ in parts)
        loss = sum(F.mse_loss(model(x), y) * len(x) for x, y in parts) / total
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


@ON_EACH_DEVICE
def test_weighted_ddp_steps_with_an_idle_rank_equal_one_process_on_the_whole_batch(
    tmp_path: Path, device: str
):
    mp.spawn(rank_main, args=(str(tmp_path / "init"), str(tmp_path), device), nprocs=2)
    expected = single_process()
    for rank in SIZES:
        result = torch.load(tmp_path / f"rank-{rank}.pt")
        for got, want in zip(result["params"], expected):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
        assert result["sums"] == [
            [
                sum(s[step + 1] for s in ANNOUNCED.values()) if step + 1 < STEPS else 0,
                sum(s[step] > 0 for s in SIZES.values()),
                21,
            ]
            for step in range(STEPS)
        ]


def test_a_model_not_wrapped_in_ddp_is_refused_with_how_to_wrap_it():
    with pytest.raises(AntdtError, match="DistributedDataParallel"):
        WeightedReduce(torch.nn.Linear(2, 1))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, LIMIT - 1), min_size=3, max_size=3), min_size=1, max_size=64),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_control_integers_summed_in_limbs_come_back_exact(ranks: list[list[int]], dtype):
    """Each rank's integers (up to 2**36) in float limbs, summed as an all-reduce would: exact."""
    summed = sum(torch.tensor(encode_limbs(values), dtype=dtype) for values in ranks)
    assert decode_limbs(summed.tolist()) == [sum(column) for column in zip(*ranks)]


def test_a_control_integer_out_of_range_is_refused():
    with pytest.raises(AntdtError, match="2\\*\\*36"):
        encode_limbs([LIMIT])


def test_a_model_on_the_cpu_never_waits_for_a_gpu(tmp_path, monkeypatch):
    """The hook waits for the GPU's stream only where the gradients are: a framework that
    initialised CUDA on a GPU host (Lightning does) must not cost a CPU model a sync a step."""
    waited: list = []
    monkeypatch.setattr(
        "antdt.worker.ddp_hook.settle_device", lambda device=None: waited.append(device)
    )
    join_gloo(str(tmp_path / "init"), 0, world=1)
    try:
        model, optimizer = new_model()
        reduce = WeightedReduce(DistributedDataParallel(model, bucket_cap_mb=0.01))
        reduce.prime(4)
        reduce.begin(4)
        inputs, targets = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 1).double()
        F.mse_loss(reduce.ddp(inputs), targets).backward()
        assert reduce.sums()[0] == 4 and reduce.backward_done_at is not None
    finally:
        dist.destroy_process_group()
    assert waited == []


def test_work_while_reducing_runs_once_a_backward_with_every_bucket_on_its_way(tmp_path):
    """The job reads its next batch while the last bucket is all-reduced: the hook's
    ``while_reducing`` runs once per backward pass, after the all-reduce of every bucket (several
    here) has started and before the backward pass ends."""
    started: list[int] = []

    class CountedGroup:
        """The process group, its all-reduces counted as the hook starts them."""

        def __init__(self, group):
            self.group = group

        def allreduce(self, tensors):
            started.append(1)
            return self.group.allreduce(tensors)

    join_gloo(str(tmp_path / "init"), 0, world=1)
    try:
        model, _ = new_model()
        reduce = WeightedReduce(DistributedDataParallel(model, bucket_cap_mb=0.01))
        seen: list[int] = []  # the all-reduces started when it ran, once a step
        reduce.while_reducing = lambda: seen.append(len(started))
        reduce.prime(4)
        reduce.group = CountedGroup(reduce.group)
        inputs, targets = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 1).double()
        per_step = []  # the all-reduces each backward pass started
        for _ in range(3):
            started.clear()
            reduce.begin(4)
            F.mse_loss(reduce.ddp(inputs), targets).backward()
            per_step.append(len(started))
            reduce.sums()
        assert seen == per_step
        assert per_step[-1] > 1  # several buckets once DDP has rebuilt them (after the first step)
    finally:
        dist.destroy_process_group()
