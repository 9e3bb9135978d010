"""How many shards an ElasticJob rank holds (enough for the feed's two batches and one more), and a
new job's first checkpoint and its heap frozen while it trains."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from antdt.schemas.models import ShardTransition
from antdt.worker import Agent
from antdt.worker.elastic.job import SHARDS_HELD, ElasticJob, shards_held
from tests.services.sharder.harness import job_log, running_sharder


@given(st.integers(1, 4096), st.integers(1, 4096))
def test_the_shards_held_cover_two_batches_and_one_being_granted(batch, shard):
    held = shards_held(batch, shard)
    assert held >= SHARDS_HELD
    assert (held - 1) * shard >= 2 * batch  # the feed's buffer, without the one being granted
    assert held == SHARDS_HELD or (held - 2) * shard < 2 * batch  # and no more than that


def test_default_shards_of_four_batches_or_more_are_held_two_at_a_time():
    assert shards_held(32, 128) == shards_held(512, 2048) == 2
    assert shards_held(34, 16) == 6  # the demo's 16-sample shards under a 34-sample batch


@pytest.fixture
def one_rank_group(tmp_path):
    """This process as the one rank of a gloo group (as torchrun with one process), gone after."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_new_job_s_first_checkpoint_asks_the_sharder_nothing_and_a_restart_resumes_from_it(
    settings, topics, tmp_path, one_rank_group
):
    """A new job's first checkpoint stores the version of its first request's answer: no
    CHECKPOINT request in the log before training. A process that then trains, dies before the
    next checkpoint and starts again resumes from it, and every sample is trained exactly once in
    the model that ends (the ledger)."""
    samples = [(torch.tensor([float(i)]), torch.tensor([0.0])) for i in range(96)]
    path = tmp_path / "ckpt.pt"
    frozen = []  # objects the collector's passes skip while each job trains

    def run(steps: int | None) -> ElasticJob:
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        agent = Agent("job-first-ckpt", "w0", settings=settings, listen_for_commands=False)
        job = ElasticJob(model, optimizer, samples, batch_size=8, checkpoint=path, agent=agent)
        with job:
            frozen.append(gc.get_freeze_count())
            for done, (x, y) in enumerate(job.batches()):
                if done == steps:
                    return job  # dies before its next checkpoint: none falls due in a second
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
        return job

    with running_sharder(settings):
        first = run(steps=5)
        kinds = [event.transition for event in job_log(settings, "job-first-ckpt")]
        resumed = run(steps=None)
    # trained before it died (and the rewind takes that back), never asked for a version
    assert ShardTransition.APPLIED in kinds and ShardTransition.CHECKPOINT not in kinds
    assert first.restored_step is None and resumed.restored_step == 0
    assert resumed.finished and (resumed.ledger.counts == 1).all()
    # the heap built before training is out of the collector's full passes while the job runs,
    # and back under it once the job is closed (the DDP model's cycles must be collectable)
    assert all(count > 0 for count in frozen) and gc.get_freeze_count() == 0
