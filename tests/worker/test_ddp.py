"""Different local batch sizes under DDP give the update of one process on the whole batch.

The equivalence tests spawn real gloo process groups (2 and 3 ranks), train a
small float64 model for a few SGD steps with local batch sizes that change at
agreed steps (one rank pausing with batch 0 and NaN in its stale gradients),
and compare every rank's final parameters with single-process training on the
concatenated batch. The same all-reduce carries each rank's samples into the
ledger: every rank ends with the same counts, each sample of every step once.
"""

from __future__ import annotations

import contextlib
import datetime
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from antdt.worker.ddp import (
    CollectiveTimeout,
    DistributedError,
    StepSizedTimeout,
    WeightedGradientAverager,
    agreed_checkpoint_version,
    wait_within,
    world_size,
)
from antdt.worker.ledger import LedgerSlots, SampleLedger
from antdt.worker.provenance import SampleTag
from tests.worker.groups import join_gloo

STEPS = 6
FEATURES = 4
RARE = 1.5  # samples with x[0] above this reach the rare head

# Per world size: the initial local sizes and the changes, {effective step: sizes}.
PLANS = {
    2: ([3, 5], {2: [6, 2], 4: [0, 8]}),
    3: ([3, 5, 8], {2: [5, 0, 11], 3: [5, 0, 11], 4: [8, 5, 3]}),
}


class Net(torch.nn.Module):
    """A small MLP plus a head that only rare samples reach, so some ranks (and some steps) have no
    gradient for it."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
        self.rare = torch.nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        mask = x[:, 0] > RARE
        if mask.any():
            out = out.clone()
            rare = self.rare.weight.dtype  # float32 in the mixed-precision variant
            out[mask] = out[mask] + self.rare(x[mask].to(rare)).to(out.dtype)
        return out


def new_model(mixed: bool = False) -> tuple[Net, torch.optim.Optimizer]:
    """float64 throughout (one collective per sync), or a float32 head (the two-collective path)."""
    torch.manual_seed(1234)
    model = Net().double()
    if mixed:
        model.rare.float()
    # Weight decay and momentum make a zero gradient differ from a missing one: None must stay None.
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)


def size_at(world: int, rank: int, step: int) -> int:
    """The rank's local batch size at ``step``: its initial one, or the latest change at or before
    it."""
    initial, changes = PLANS[world]
    latest = [sizes for at, sizes in sorted(changes.items()) if at <= step]
    return (latest[-1] if latest else initial)[rank]


def batch(world: int, step: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The global batch of ``step`` (the same in every process) and each rank's local size."""
    sizes = [size_at(world, rank, step) for rank in range(world)]
    generator = torch.Generator().manual_seed(100 * world + step)
    x = torch.randn(sum(sizes), FEATURES, generator=generator, dtype=torch.float64)
    y = torch.randn(sum(sizes), 1, generator=generator, dtype=torch.float64)
    return x, y, sizes


def train_step(model: Net, x: torch.Tensor, y: torch.Tensor) -> None:
    torch.nn.functional.mse_loss(model(x), y).backward()  # the MEAN over the batch


def reference(world: int, mixed: bool) -> dict[str, torch.Tensor]:
    """Single-process training on the concatenated batches."""
    model, optimizer = new_model(mixed)
    for step in range(STEPS):
        x, y, _ = batch(world, step)
        optimizer.zero_grad()
        train_step(model, x, y)
        optimizer.step()
    return model.state_dict()


def rank_main(
    rank: int, world: int, init_file: str, out_dir: str, mixed: bool, device: str = "cpu"
) -> None:
    join_gloo(init_file, rank, world)
    try:
        timed = []

        def timer_named(name):
            @contextlib.contextmanager
            def timer():
                timed.append(name)
                yield

            return timer

        ledger = SampleLedger(STEPS * 100, 1)
        averager = WeightedGradientAverager(
            sync_timer=timer_named("default"),
            ledger=LedgerSlots(ledger, world, rank, cap=32),
            timeout=StepSizedTimeout(),
        )
        model, optimizer = new_model(mixed)
        model.to(device)
        global_batches, counted = [], []
        for step in range(STEPS):
            x, y, sizes = batch(world, step)
            x, y = x.to(device), y.to(device)
            start = sum(sizes[:rank])
            optimizer.zero_grad()
            if sizes[rank]:
                train_step(model, x[start : start + sizes[rank]], y[start : start + sizes[rank]])
            else:  # paused: stale garbage in the gradients must not leak into the update
                for param in model.parameters():
                    param.grad = torch.full_like(param, math.nan)
            this_call = timer_named("per call") if step % 2 else None
            # sample = place in the step
            tags = [SampleTag(0, step * 100 + start + i) for i in range(sizes[rank])]
            if step % 3:
                global_batches.append(averager.sync(model, sizes[rank], this_call, tags=tags))
            else:  # with counters riding along: each rank adds rank + 1
                total, sums = averager.sync_counting(
                    model, sizes[rank], [rank + 1, 0], this_call, tags=tags
                )
                global_batches.append(total)
                counted.append(sums)
            optimizer.step()

        flushed = []
        # only rank 0 asks
        version = agreed_checkpoint_version(lambda: flushed.append(1), lambda: 41 + rank)
        try:
            agreed_checkpoint_version(lambda: None, lambda: 1 // 0)
            failure = None
        except ZeroDivisionError:
            failure = "asked and failed"
        except DistributedError:
            failure = "told"
        torch.save(
            {
                "state": {name: value.cpu() for name, value in model.state_dict().items()},
                "global_batches": global_batches,
                "timed": timed,
                "counted": counted,
                "version": version,
                "flushed": len(flushed),
                "failure": failure,
                "ledger": ledger.counts,
            },
            Path(out_dir) / f"rank{rank}.pt",
        )
        dist.barrier()  # nobody tears the group down while a peer is still in the last collective
    finally:
        dist.destroy_process_group()


ON_A_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "mixed", "device"),
    [
        (2, False, "cpu"),
        (3, False, "cpu"),
        (3, True, "cpu"),
        # CUDA gradients over gloo (every rank on one device: NCCL refuses two ranks per GPU)
        pytest.param(2, False, "cuda", marks=ON_A_GPU),
        pytest.param(3, True, "cuda", marks=ON_A_GPU),
    ],
)
def test_weighted_average_equals_single_process_on_the_whole_batch(
    world: int, mixed: bool, device: str, tmp_path: Path
):
    mp.spawn(
        rank_main,
        args=(world, str(tmp_path / "init"), str(tmp_path), mixed, device),
        nprocs=world,
        join=True,
    )
    expected = reference(world, mixed)
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for name, value in expected.items():
            tolerance = 1e-5 if mixed else 1e-10  # the float32 head rounds what flows through it
            torch.testing.assert_close(
                got["state"][name], value, atol=tolerance, rtol=0, msg=f"rank {rank} {name}"
            )
        assert got["counted"] == [[world * (world + 1) // 2, 0]] * len(range(0, STEPS, 3))
        assert got["global_batches"] == [sum(batch(world, step)[2]) for step in range(STEPS)]
        expected_counts = torch.zeros(STEPS * 100, dtype=torch.int32)
        for step in range(STEPS):
            expected_counts[step * 100 : step * 100 + sum(batch(world, step)[2])] = 1
        assert torch.equal(got["ledger"][0], expected_counts), f"rank {rank}'s ledger"
        assert got["timed"] == ["default", "per call"] * (STEPS // 2)
        assert got["version"] == 41 and got["flushed"] == 1
        assert got["failure"] == ("asked and failed" if rank == 0 else "told")


def stuck_rank_main(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 1 stops taking part after three steps (stuck, not dead); rank 0 must give up on its
    own."""
    join_gloo(init_file, rank)
    model, _ = new_model()
    averager = WeightedGradientAverager(
        timeout=StepSizedTimeout(floor_s=1.0, factor=4.0, first_s=30.0)
    )
    outcome = Path(out_dir) / f"rank-{rank}.txt"
    try:
        for step in range(5):
            if rank == 1 and step == 3:
                outcome.write_text("stuck")
                import time

                time.sleep(20)  # longer than rank 0's bound; the test does not wait for it
                return
            x, y, _ = batch(2, 0)
            train_step(model, x[:3], y[:3])
            averager.sync(model, 3)
        outcome.write_text("finished")
    except CollectiveTimeout as exc:
        outcome.write_text(str(exc))
    finally:
        if rank == 0:
            import os

            # the group is unusable: leave without the collective clean-up, as a real rank must
            os._exit(0)


def test_a_stuck_rank_is_noticed_within_the_step_sized_bound(tmp_path: Path):
    context = mp.start_processes(
        stuck_rank_main,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    try:
        rank0 = context.processes[0]
        rank0.join(timeout=25)
        assert rank0.exitcode == 0, "rank 0 did not give up on the stuck rank"
        message = (tmp_path / "rank-0.txt").read_text()
        assert (
            message.startswith("the all-reduce of step 3 waited")
            and "a rank is dead or stuck" in message
        )
        assert "limit 1.0 s" in message  # 4x steps of milliseconds is below the floor
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


class Unfinished:
    """A collective that never finishes: its wait raises what the backend raises past the
    timeout."""

    def __init__(self, text: str):
        self.text = text

    def wait(self, timeout: datetime.timedelta) -> None:
        raise RuntimeError(self.text)


@pytest.mark.parametrize(
    "text",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Timed out waiting 1000ms for recv operation to complete",
        "[PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=1000) "
        "ran for 1003 milliseconds before timing out.",
    ],
)
def test_either_backends_timeout_is_a_collective_timeout(text: str):
    with pytest.raises(
        CollectiveTimeout, match="the all-reduce of step 3 waited .* a rank is dead or stuck"
    ):
        wait_within([Unfinished(text)], 1.0, "the all-reduce of step 3")


def test_another_failure_of_a_collective_is_not_called_a_timeout():
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        wait_within(
            [
                Unfinished(
                    "[gloo/transport/tcp/pair.cc:598] Connection closed by peer: "
                    "Connection reset by peer"
                )
            ],
            1.0,
            "the all-reduce of step 3",
        )


def test_the_bound_follows_the_slowest_recent_step():
    bound = StepSizedTimeout(floor_s=1.0, factor=5.0, window=3, first_s=60.0)
    assert bound.limit_s() == 60.0
    for now in (0.0, 0.1, 0.2, 2.2, 2.3, 2.4, 2.5):
        bound.completed(now)
    # the 2 s period has left the window of three; 5 x 0.1 s is below the floor
    assert bound.limit_s() == 1.0
    bound.completed(5.5)
    assert bound.limit_s() == pytest.approx(15.0)


def test_plans_exercise_what_they_claim():
    """Guards the scenario itself: sizes change and some rank pauses with batch 0."""
    for world in PLANS:
        sizes = [batch(world, step)[2] for step in range(STEPS)]
        assert len({tuple(s) for s in sizes}) > 2
        assert any(0 in s for s in sizes)
        rare = []  # per step, how many rare samples each rank holds
        for step in range(STEPS):
            x, _, local = batch(world, step)
            hits = (x[:, 0] > RARE).tolist()
            rare.append(
                [sum(hits[sum(local[:rank]) : sum(local[: rank + 1])]) for rank in range(world)]
            )
        assert any(not any(step) for step in rare), (
            "a step where no rank has a gradient for the rare head"
        )
        assert any(step.count(0) == 1 for step in rare), (
            "a step where some ranks have one and some not"
        )


# ------------------------------------------------------------------ one process


def test_without_distributed_sync_is_a_no_op():
    assert world_size() == 1
    model, _ = new_model()
    x, y, _ = batch(2, 0)
    train_step(model, x, y)
    before = {
        name: param.grad.clone()
        for name, param in model.named_parameters()
        if param.grad is not None
    }
    identities = {name: id(param.grad) for name, param in model.named_parameters()}
    assert WeightedGradientAverager().sync(model, 8) == 8
    for name, param in model.named_parameters():
        assert id(param.grad) == identities[name]
        if name in before:
            assert torch.equal(param.grad, before[name])


def test_sync_refuses_a_bad_batch_size():
    model, _ = new_model()
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError):
            WeightedGradientAverager().sync(model, bad)


def test_checkpoint_version_without_distributed_flushes_then_asks():
    calls = []
    assert (
        agreed_checkpoint_version(lambda: calls.append("flush"), lambda: calls.append("ask") or 7)
        == 7
    )
    assert calls == ["flush", "ask"]
