"""The non-blocking shard buffer a job reads its batches from."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from antdt.errors import AntdtError
from antdt.worker.dataset import ShardGrant
from antdt.worker.feeds import ShardFeed
from tests.services.sharder.helpers import dataset


class Values:
    """A source whose sample ``i`` is ``(tensor([i.0]), tensor(i))``."""

    def __getitem__(self, index: int):
        return torch.tensor([float(index)]), torch.tensor(index)


class ScriptedDataset:
    """Stands in for a ShardedDataset (no bus here): epochs of samples granted as shards (split
    where a value is negative: the sharder has nothing until released), then finished."""

    def __init__(self, epochs: list[list[int]]):
        self.epochs = epochs
        self.finished = False
        self.waiting = False
        self.quota = 1
        self.release = threading.Event()
        self.closed = False
        self.source = Values()
        self.spec = SimpleNamespace(lease_s=60.0)
        self.keepalive_s = self.spec.lease_s / 4
        self.revoked: set = set()

    def read_in_background(self) -> None:
        """Nothing is booked here: there is no agent."""

    def grants(self):
        epoch = self.epochs.pop(0)
        shard: list[int] = []
        for value in [*epoch, None]:
            if value is None or value < 0:
                if shard:
                    yield ShardGrant(0, len(shard), 0, "w", shard)
                    shard = []
                if value is not None:  # the sharder has nothing now: wait until released
                    self.waiting = True
                    self.release.wait(10)
                    self.waiting = False
                continue
            shard.append(value)
        if not self.epochs:
            self.finished = True

    def keep_alive(self, grant) -> None:
        pass

    def close(self):
        self.closed = True


class Granting(ScriptedDataset):
    """Grants the given shards, then is finished; records what is given back."""

    def __init__(self, shards: list[list[int]]):
        super().__init__([])
        self.shards, self.given = shards, []

    def grants(self):
        for shard_id, positions in enumerate(self.shards):
            yield ShardGrant(0, shard_id, 0, "w", positions)
        self.finished = True

    def give_back(self, grants):
        self.given.extend(grants)


def drain(feed: ShardFeed, wanted: int) -> list[list[int]]:
    batches = []
    while not feed.exhausted:
        batch = feed.take(wanted)
        batches.append([] if batch is None else batch.data[1].tolist())
    return batches


def test_full_batches_across_epochs_then_exhausted():
    feed = ShardFeed(ScriptedDataset([[0, 1, 2, 3, 4], [5, 6, 7]]), capacity=4).start()
    batches = drain(feed, 3)
    feed.close()
    assert [x for batch in batches for x in batch] == list(range(8))
    assert batches[:2] == [[0, 1, 2], [3, 4, 5]]
    assert feed.dataset.closed


def test_a_waiting_sharder_yields_a_short_batch_instead_of_blocking_the_step():
    dataset = ScriptedDataset([[0, 1, -1, 2, 3]])
    feed = ShardFeed(dataset, capacity=8).start()
    first = feed.take(4)
    # short: the sharder said WAIT, the other ranks must not wait for us
    assert first.data[1].tolist() == [0, 1] and [t.index for t in first.tags] == [0, 1]
    assert feed.take(4) is None  # nothing buffered while still waiting
    dataset.release.set()
    rest = drain(feed, 4)
    feed.close()
    assert [x for batch in rest for x in batch] == [2, 3]


def test_a_batch_arriving_after_the_sharder_said_wait_is_waited_for_within_the_bound():
    """Once another rank's batch has opened an epoch, a rank told to wait takes its shards as they
    arrive (reserve does not wait while the sharder says wait; reserve_arriving does, bounded)."""
    dataset = ScriptedDataset([[-1, 0, 1, 2, 3]])
    feed = ShardFeed(dataset, capacity=8).start()
    with feed._changed:
        assert feed._changed.wait_for(lambda: dataset.waiting, timeout=10)
    assert feed.reserve(4) is None  # the sharder said wait: no step waits on it
    assert feed.reserve_arriving(4, 0.01) is None  # bounded: nothing came
    threading.Timer(0.05, dataset.release.set).start()
    arrived = feed.reserve_arriving(4, 30.0)
    assert labels(feed, arrived) == [0, 1, 2, 3]
    feed.close()


def test_buffered_grants_keep_their_leases_while_the_buffer_is_full():
    """A slow consumer must not lose the shards it holds unread: the feed renews each buffered
    grant every quarter lease while it waits for room."""

    class Leased(ScriptedDataset):
        def __init__(self, epochs):
            super().__init__(epochs)
            self.spec = SimpleNamespace(lease_s=0.2)
            self.keepalive_s = self.spec.lease_s / 4
            self.renewed = threading.Event()

        def keep_alive(self, grant) -> None:
            self.renewed.set()

    # two grants; the first fills the buffer, so the feed waits with it held
    dataset = Leased([[0, 1, 2, 3, -1, 4]])
    dataset.release.set()
    feed = ShardFeed(dataset, capacity=2).start()
    assert dataset.renewed.wait(5), "no lease renewed while the buffer stayed full"
    assert drain(feed, 4) == [[0, 1, 2, 3], [4]]
    feed.close()


def test_a_revoked_grants_samples_are_dropped_untrained():
    dataset = ScriptedDataset([[0, 1, 2, -1, 3, 4]])  # (the script names a grant by its length)
    feed = ShardFeed(dataset, capacity=8).start()
    assert feed.take(1).data[1].tolist() == [0]
    dataset.revoked.add((0, 3, 0))  # the first grant: its commits were refused
    dataset.release.set()
    assert [x for batch in drain(feed, 4) for x in batch] == [3, 4]
    feed.close()


def every_grant_buffered(values: list[int]) -> ShardFeed:
    """A feed that has buffered all of ``values``' grants (split where a value is negative)."""
    dataset = ScriptedDataset([values])
    dataset.release.set()
    feed = ShardFeed(dataset, capacity=len(values)).start()
    with feed._changed:
        assert feed._changed.wait_for(lambda: feed._source_done, timeout=10)
    return feed


def labels(feed: ShardFeed, reserved) -> list[int]:
    return feed.read(reserved).data[1].tolist()


def test_a_reserved_batch_cut_down_hands_its_last_samples_out_next():
    """A new split applied to the batch taken ahead: the samples cut from it, across a grant
    already read to its end, are the next ones handed out, each once, in order."""
    feed = every_grant_buffered([0, 1, 2, -1, 3, 4, 5, 6])
    reserved = feed.reserve(5)
    assert reserved.size == 5
    feed.resize(reserved, 1)
    assert reserved.size == 1 and labels(feed, reserved) == [0]
    assert drain(feed, 3) == [[1, 2, 3], [4, 5, 6]]
    feed.close()


def test_a_reserved_batch_grown_adds_what_is_buffered_without_waiting():
    feed = every_grant_buffered([0, 1, 2, -1, 3, 4, 5, 6])
    reserved = feed.reserve(2)
    feed.resize(reserved, 6)
    assert labels(feed, reserved) == [0, 1, 2, 3, 4, 5]
    last = feed.reserve(1)
    feed.resize(last, 4)  # only one more sample exists: short, not a wait
    assert labels(feed, last) == [6] and feed.exhausted
    feed.close()


def test_a_reserved_batch_put_back_whole_is_handed_out_next():
    feed = every_grant_buffered([0, 1, 2, -1, 3, 4])
    reserved = feed.reserve(4)
    feed.put_back(reserved)
    assert drain(feed, 2) == [[0, 1], [2, 3], [4]]
    feed.close()


def test_a_read_batch_keeps_its_size():
    feed = every_grant_buffered([0, 1, 2])
    reserved = feed.reserve(2)
    assert feed.read(reserved) is feed.read(reserved)  # read once
    with pytest.raises(ValueError, match="not read yet"):
        feed.resize(reserved, 1)
    assert drain(feed, 2) == [[2]]
    feed.close()


def test_a_quota_commanded_while_sitting_out_holds_once_sized_up_again(settings):
    """The controller's SET_SHARD_QUOTA sets the dataset's quota, the job's sizing the feed's: one
    value, so sitting out and back does not restore a stale one."""
    from antdt.worker.dataset import ShardedDataset

    data = ShardedDataset(
        list(range(10)),
        dataset(size=10, shard_size=5, epochs=1, lease_s=60),
        settings=settings,
        job_id="j",
        worker_id="w",
        quota=2,
    )
    feed = ShardFeed(data, capacity=4)
    with feed._changed:
        feed._sit_out(True)
    assert (data.asked_quota, data.quota) == (0, 2)
    data.quota = 5  # a SET_SHARD_QUOTA command, while the rank sits out
    assert data.asked_quota == 0
    with feed._changed:
        feed._sit_out(False)
    assert (feed.quota, data.asked_quota) == (5, 5)
    feed.quota = 3  # the job's sizing
    assert data.asked_quota == 3


def test_an_error_in_the_feed_reaches_the_training_thread():
    class Broken(ScriptedDataset):
        def grants(self):
            raise RuntimeError("sharder unreachable")
            yield  # unreachable: makes this a generator

    feed = ShardFeed(Broken([[0]]), capacity=4).start()
    with pytest.raises(RuntimeError, match="sharder unreachable"):
        feed.take(1)
    feed.close()


def test_a_rank_sized_to_0_gives_its_shards_back_and_the_others_train_them_exactly_once(
    settings, topics
):
    """Sitting out drops the buffer and returns the held shards (their progress kept); sized up, it
    reads again."""
    trained: list[int] = []

    def train_one_batch(agent, feed, size):
        batch = feed.take(size)
        _, labels = agent.untag(batch)
        trained.extend(labels.tolist())
        agent.step(samples=len(labels))

    with fed_and_other(settings, "job-sit", quota=1) as (sitter, feed, other):
        train_one_batch(sitter, feed, 4)
        assert feed.take(0) is None  # sits out: what it buffered is dropped
        train_one_batch(sitter, feed, 4)  # sized up again: it reads a shard again
        assert feed.take(0) is None
        worker = threading.Thread(target=train_the_rest, args=(other, trained), daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), "the other rank waits for shards the sitting-out rank kept"
        # it learns the job is finished while holding nothing (bounded: 200 x 50 ms)
        for _ in range(200):
            if feed.exhausted:
                break
            feed.take(0)
            threading.Event().wait(0.05)
        assert feed.exhausted
        feed.close()
    assert sorted(trained) == list(range(200))
    assert_audited_once(settings, "job-sit")


@contextmanager
def fed_and_other(settings, job: str, quota: int):
    """A running sharder; one rank reading through a ShardFeed (holding ``quota`` shards) and
    another rank's agent: ``(agent, feed, other agent)``."""
    from antdt.worker import Agent
    from tests.services.sharder.harness import running_sharder

    with (
        running_sharder(settings),
        Agent(job, "r0", settings=settings, listen_for_commands=False) as fed,
        Agent(job, "r1", settings=settings, listen_for_commands=False) as other,
    ):
        data = fed.shards(Labelled(200), dataset(size=200, shard_size=20, epochs=1, lease_s=60))
        data.quota = quota
        yield fed, ShardFeed(data, lambda: 8).start(), other


def train_the_rest(agent, trained: list[int], out_of_data: threading.Event | None = None):
    """A rank training sample by sample until the job is finished; ``out_of_data`` set whenever
    the sharder has nothing for it while others hold shards."""
    data = agent.shards(Labelled(200), dataset(size=200, shard_size=20, epochs=1, lease_s=60))
    while not data.finished:
        for sample in agent.iterate(data):
            trained.append(int(sample[1]))
            agent.step()
        if out_of_data is not None and data.waiting:
            out_of_data.set()
    data.close()


def assert_audited_once(settings, job: str) -> None:
    from antdt.services.sharder.audit import audit_log
    from tests.services.sharder.harness import job_log

    report = audit_log(job_log(settings, job), job)
    assert report.ok and report.finished, report.violations


class Labelled:
    """Samples (features, label) whose label is the sample's index."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        return torch.tensor([float(index)]), torch.tensor(index)


def test_the_feed_s_waits_for_the_others_shards_are_not_booked_on_the_training_thread_s_steps(
    settings, topics
):
    """While the sharder says wait, the feed's thread pauses between requests; those pauses are
    not the step's synchronisation (they made an epoch's end read as negative compute)."""
    from antdt.schemas.models import DatasetSpec
    from antdt.worker import Agent
    from tests.services.sharder.harness import running_sharder

    spec = DatasetSpec(
        name="wait", size=40, shard_size=20, epochs=1, shuffle_seed=1, max_attempts=3, lease_s=60
    )
    with (
        running_sharder(settings),
        Agent("job-wait", "r0", settings=settings, listen_for_commands=False) as holder,
        Agent("job-wait", "r1", settings=settings, listen_for_commands=False) as waiter,
    ):
        held = holder.shards(Labelled(40), spec)
        held.quota = 2
        grants = held.grants()
        first = next(grants)
        assert len(first.positions) == 20  # the holder holds both shards, commits nothing
        data = waiter.shards(Labelled(40), spec)
        feed = ShardFeed(data, lambda: 8).start()
        pauses = 0
        for _ in range(400):  # bounded: the sharder answers within a few ms each time
            assert feed.take(4) is None  # the others hold every shard
            pauses += data.waiting
            if pauses >= 100:
                break
            threading.Event().wait(0.005)
        assert pauses >= 100, "the sharder never said wait"
        record = waiter.step(samples=0)
        assert record.sync_wait_s == 0.0 and record.compute_s >= 0.0, record
        feed.close()
        held.close()


def test_grants_not_begun_are_given_back_and_the_one_waiting_for_room_too():
    """Only what no sample was handed out of goes back: the begun grant stays, the buffered
    unbegun one and the one waiting for room in the buffer are given back, and none of their
    samples is ever taken here."""

    def arriving(shard_id: int) -> bool:
        """Whether grant ``shard_id`` waits for room (bounded: 200 x 50 ms)."""
        for _ in range(200):
            if feed._arriving is not None and feed._arriving.shard_id == shard_id:
                return True
            threading.Event().wait(0.05)
        return False

    dataset = Granting([[0, 1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]])
    feed = ShardFeed(dataset, capacity=6).start()
    assert arriving(1)  # grant 0 fills the buffer
    assert feed.take(2).data[1].tolist() == [0, 1]  # grant 0 begun: room for grant 1
    assert arriving(2)
    assert feed.give_back_unbegun() == 5
    assert [grant.shard_id for grant in dataset.given] == [1, 2]
    rest = drain(feed, 4)
    feed.close()
    assert [x for batch in rest for x in batch] == [2, 3, 4, 5, 11]


def test_a_grant_only_the_batch_taken_ahead_began_is_given_back_too():
    """The batch taken ahead, not read yet, hands back its samples of a grant it began (not those
    of the grant begun before it), so that grant is given back with the unbegun ones."""
    dataset = Granting([[0, 1, 2], [3, 4, 5], [6]])
    feed = ShardFeed(dataset, capacity=7).start()
    with feed._changed:
        assert feed._changed.wait_for(lambda: feed._source_done, timeout=10)
    assert feed.take(2).data[1].tolist() == [0, 1]
    taken = feed.reserve(3)  # 2 of grant 0, and 3, 4 of grant 1
    assert feed.give_back_unbegun(taken) == 4
    assert [grant.shard_id for grant in dataset.given] == [1, 2]
    assert labels(feed, taken) == [2] and feed.exhausted
    feed.close()


def test_at_an_epoch_s_end_what_a_rank_has_not_begun_is_trained_by_the_rank_out_of_data(
    settings, topics
):
    """A rank out of data while another holds unbegun shards gets them through the sharder (the
    slow rank gives them back, as ElasticJob does when the step's sums count a rank out of data):
    every sample once, the give-backs in the audit."""
    from antdt.services.sharder.audit import audit_log
    from tests.services.sharder.harness import job_log

    trained: list[int] = []
    out_of_data = threading.Event()
    with fed_and_other(settings, "job-back", quota=4) as (slow, feed, fast):
        worker = threading.Thread(
            target=train_the_rest, args=(fast, trained, out_of_data), daemon=True
        )
        worker.start()
        given = 0
        for _ in range(2000):  # bounded: the slow rank's steps, 4 samples each
            batch = feed.take(4)
            if batch is not None:
                _, labels = slow.untag(batch)
                trained.extend(labels.tolist())
                slow.step(samples=len(labels))
            if feed.exhausted:
                break
            if out_of_data.is_set():
                given += feed.give_back_unbegun()
            threading.Event().wait(0.02)
        worker.join(60)
        assert not worker.is_alive() and feed.exhausted
        feed.close()
    assert sorted(trained) == list(range(200))
    assert_audited_once(settings, "job-back")
    assert given and audit_log(job_log(settings, "job-back"), "job-back").epochs[0].given_back


def test_a_pooled_tail_leaves_the_feed_and_a_share_is_handed_out_first_and_never_given_back():
    """``pool_out`` takes every position not handed out (of a begun grant and an unbegun one);
    a share taken back is handed out before what arrives later, is never given back to the
    sharder, and keeps the rank from sitting out (its holder could not grant it again)."""
    dataset = Granting([[0, 1, 2, 3], [4, 5]])
    feed = ShardFeed(dataset, capacity=6).start()
    with feed._changed:
        assert feed._changed.wait_for(lambda: feed._source_done, timeout=10)
    assert feed.take(1).data[1].tolist() == [0]
    left = feed.pool_out()
    assert [(grant.shard_id, grant.positions) for grant in left] == [(0, [1, 2, 3]), (1, [4, 5])]
    assert feed.buffered == 0 and feed.exhausted
    share = [ShardGrant(0, 0, 0, "w", [2, 3]), ShardGrant(0, 9, 1, "other", [7])]
    feed.take_pooled(share)
    assert feed.buffered == 3 and feed.give_back_unbegun() == 0 and not dataset.given
    with pytest.raises(AntdtError, match="pooled tail"):
        feed.take(0)
    taken = feed.take(3)
    assert taken.data[1].tolist() == [2, 3, 7]
    assert [(tag.shard_id, tag.holder) for tag in taken.tags] == [(0, "w"), (0, "w"), (9, "other")]
    feed.close()


def test_a_share_of_another_rank_s_grant_is_trained_here_and_committed_under_its_holder(
    settings, topics
):
    """Two ranks on the real sharder: r0 has begun a shard of 100 when r1 runs out; r0 pools the
    rest and each trains a share, r1 committing its share under r0's grant. Every sample once, the
    audit clean, the job finished."""
    from antdt.worker import Agent
    from antdt.worker.elastic.pooling import Offer, share_of
    from tests.services.sharder.harness import running_sharder

    spec = dataset(size=200, shard_size=100, epochs=1, lease_s=60)
    trained: list[int] = []

    def train(agent, feed, batch: int) -> None:
        taken = feed.take(batch)
        if taken is not None:
            trained.extend(agent.untag(taken)[1].tolist())
            agent.step(samples=len(taken.tags))

    with (
        running_sharder(settings),
        Agent("job-pool", "r0", settings=settings, listen_for_commands=False) as r0,
        Agent("job-pool", "r1", settings=settings, listen_for_commands=False) as r1,
    ):
        feeds = []
        for agent in (r0, r1):
            data = agent.shards(Labelled(200), spec)
            data.quota = 1
            feeds.append(ShardFeed(data, lambda: 200).start())
        train(r0, feeds[0], 10)
        for _ in range(10):  # r1's whole shard, then it is out of data
            train(r1, feeds[1], 10)
        offers = [Offer(10, tuple(feed.pool_out())) for feed in feeds]
        assert [offer.samples for offer in offers] == [90, 0]
        for rank, feed in enumerate(feeds):
            feed.take_pooled(share_of(offers, rank))
        for _ in range(5):
            for agent, feed in zip((r0, r1), feeds, strict=True):
                train(agent, feed, 10)
        for agent, feed in zip((r0, r1), feeds, strict=True):
            agent.commit_trained()
            feed.dataset.ask_again()
        for _ in range(400):  # bounded: 400 x 50 ms to learn the job is finished
            if all(feed.exhausted for feed in feeds):
                break
            threading.Event().wait(0.05)
        assert all(feed.exhausted for feed in feeds)
        for feed in feeds:
            feed.close()
    assert sorted(trained) == list(range(200))
    assert_audited_once(settings, "job-pool")
    from antdt.services.sharder.audit import audit_log
    from tests.services.sharder.harness import job_log

    # r1's share, applied under r0's grant, is what the audit counts as pooled
    assert audit_log(job_log(settings, "job-pool"), "job-pool").epochs[0].pooled == 45
