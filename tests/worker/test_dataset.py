"""ShardedDataset with the real sharder: samples tagged, committed at the step, every one exactly
once per epoch."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace

import pytest
import torch

from antdt.errors import ShardStateLost
from antdt.schemas.models import AssignmentStatus, DatasetSpec, ProgressKind
from antdt.services.sharder.audit import audit_log
from antdt.settings import load_settings
from antdt.worker import Agent
from antdt.worker.agent import EXIT_STATE_LOST
from antdt.worker.dataset import ShardedDataset, loader
from antdt.worker.provenance import Tagged
from antdt.worker.shard_client import NoAnswer, RequestRefused, ShardClient
from tests.services.sharder.harness import assert_exactly_once, job_log, running_sharder
from tests.worker.test_sent_commits import answer


def spec(size: int, shard_size: int, epochs: int) -> DatasetSpec:
    return DatasetSpec(
        name="ds",
        size=size,
        shard_size=shard_size,
        epochs=epochs,
        shuffle_seed=5,
        max_attempts=3,
        lease_s=60,
    )


def train(settings, job, worker, dataset_spec, num_workers, seen: Counter, failures: list) -> None:
    """A training loop as the agent's docstring shows it: iterate, step (which commits), until
    finished."""
    try:
        _train(settings, job, worker, dataset_spec, num_workers, seen)
    except BaseException as exc:  # noqa: BLE001 - the test reports it
        failures.append(exc)


def _train(settings, job, worker, dataset_spec, num_workers, seen: Counter) -> None:
    with Agent(job, worker, settings=settings, listen_for_commands=False) as agent:
        data = agent.shards(torch.arange(dataset_spec.size), dataset_spec)
        batches = loader(data, batch_size=7, num_workers=num_workers)
        while not data.finished:
            for batch in agent.iterate(batches):
                seen.update((tag.epoch, tag.index) for tag in agent.pending_tags)
                assert sorted(int(i) for i in batch) == sorted(
                    tag.index for tag in agent.pending_tags
                )
                agent.step(samples=len(batch))
        data.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("trainers", "num_workers"),
    [(2, 0), (2, 2)],
    ids=["2-trainers-in-process", "2-trainers-2-loader-processes-each"],
)
def test_every_sample_exactly_once_per_epoch(settings, topics, trainers, num_workers):
    dataset_spec = spec(size=600, shard_size=25, epochs=2)
    job = f"job-ds-{num_workers}"
    seen: Counter = Counter()
    failures: list[BaseException] = []
    with running_sharder(settings):
        threads = [
            threading.Thread(
                target=train,
                args=(settings, job, f"w{k}", dataset_spec, num_workers, seen, failures),
                daemon=True,
            )
            for k in range(trainers)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 150
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not failures, f"a trainer failed: {failures[0]!r}"
        assert not any(thread.is_alive() for thread in threads), (
            "a trainer did not finish within 150 s"
        )
    assert seen == Counter({(epoch, i): 1 for epoch in range(2) for i in range(600)})
    events = job_log(settings, job)
    assert_exactly_once(job, dataset_spec, events)
    assert all(epoch.counts == [1] * 600 for epoch in audit_log(events).epochs)


def test_the_dataset_size_must_match_the_spec(settings):
    with pytest.raises(ValueError, match="has 10 samples but the spec says 600"):
        ShardedDataset(
            list(range(10)), spec(600, 25, 1), settings=settings, job_id="j", worker_id="w"
        )


def test_within_shard_order_is_shuffled_deterministically_and_applied_samples_are_skipped(settings):
    again = ShardedDataset(
        list(range(100)),
        spec(size=100, shard_size=50, epochs=1),
        settings=settings,
        job_id="x",
        worker_id="w",
    )
    shard = type("S", (), {"start": 0, "length": 50, "shard_id": 0, "done": []})()
    assert again._positions(0, shard) == again._positions(0, shard) != list(range(50))
    assert sorted(again._positions(0, shard)) == list(range(50))
    shard.done = [3, 4, 40]
    assert sorted(again._positions(0, shard)) == sorted(set(range(50)) - {3, 4, 40})


def test_samples_come_tagged_with_their_grant(settings, topics):
    with (
        running_sharder(settings),
        Agent("job-tags", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data = agent.shards(list(range(100)), spec(size=100, shard_size=50, epochs=1))
        first = next(iter(data))
        data.close()
    assert isinstance(first, Tagged) and len(first.tags) == 1
    tag = first.tags[0]
    assert (tag.epoch, tag.attempt, tag.holder) == (0, 0, "w0") and first.data == tag.index
    assert tag.shard_id * 50 <= tag.index < (tag.shard_id + 1) * 50


@pytest.mark.slow
def test_a_commit_the_bus_loses_is_sent_again_and_the_epoch_still_ends_exactly_once(
    settings, topics
):
    """The first commit report never reaches the sharder: the next answer shows it missing, the
    worker sends it again.

    Without that the shard stays held, read to the end, never DONE: the
    worker would wait for it for ever, its requests renewing the lease.
    """
    dataset_spec = spec(size=200, shard_size=20, epochs=1)
    seen: Counter = Counter()
    failures: list[BaseException] = []

    def lossy_training():
        try:
            with Agent("job-lossy", "w0", settings=settings, listen_for_commands=False) as agent:
                lose_the_first_commit(agent.shard_client)
                data = agent.shards(list(range(200)), dataset_spec)
                while not data.finished:
                    for batch in agent.iterate(loader(data, batch_size=7)):
                        seen.update((tag.epoch, tag.index) for tag in agent.pending_tags)
                        agent.step(samples=len(batch))
                data.close()
                failures.append(agent.shard_client.recommitted)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    with running_sharder(settings):
        trainer = threading.Thread(target=lossy_training, daemon=True)
        trainer.start()
        trainer.join(90)
        assert not trainer.is_alive(), "the worker waits for a commit the bus lost"
    [recommitted] = failures
    assert recommitted >= 1, recommitted
    assert seen == Counter({(0, i): 1 for i in range(200)})
    assert_exactly_once("job-lossy", dataset_spec, job_log(settings, "job-lossy"))


def lose_the_first_commit(client) -> None:
    """The bus loses the client's first COMMIT report (it is produced nowhere)."""
    produce, lost = client._produce, []

    def lossy(value: bytes) -> None:
        if not lost and client.codec.decode(value).kind is ProgressKind.COMMIT:
            lost.append(value)
            return
        produce(value)

    client._produce = lossy


def test_a_silent_sharder_ends_the_wait_with_a_clear_error(settings, topics):
    """No sharder running: each request times out and is asked again, until the bound, then NoAnswer
    names it."""
    with Agent("job-silent", "w0", settings=settings, listen_for_commands=False) as agent:
        data = agent.shards(
            list(range(100)),
            spec(size=100, shard_size=50, epochs=1),
            request_timeout_s=0.3,
            sharder_timeout_s=1.0,
        )
        with pytest.raises(NoAnswer, match=r"worker w0: no answer from the sharder for \d+ s"):
            next(iter(data))
        data.close()


def test_checkpoint_then_restore_retrains_exactly_what_the_model_has_not_seen(
    settings, topics, tmp_path
):
    dataset_spec = spec(size=200, shard_size=20, epochs=1)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before, after_restore = [], []
    with (
        running_sharder(settings),
        Agent("job-ckpt", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data = agent.shards(list(range(200)), dataset_spec, shuffle=False)
        stream = agent.iterate(iter(data))
        for _ in range(50):  # fifty steps of one sample: committed, in the model
            before.append(next(stream))
            agent.step()
        version = agent.save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, data)
        for _ in range(30):  # thirty more the model will "lose"
            before.append(next(stream))
            agent.step()
        stream.close()
        agent.restore_checkpoint(tmp_path / "ckpt.pt", model, optimizer, data)
        assert agent.step_count == 50
        while not data.finished:
            for sample in agent.iterate(data):
                after_restore.append(sample)
                agent.step()
        data.close()
    assert version > 0
    # the rest of the epoch, exactly once
    assert sorted(before[:50] + after_restore) == list(range(200))
    assert set(before[50:]) <= set(after_restore)  # what the model lost is trained again


def test_the_version_prepare_answers_with_rewinds_a_new_job_to_its_start(settings, topics):
    """A new job's first checkpoint stores the version of its first request's answer (no round
    trip to ask for one): trained on and rewound to it, the job gives back every shard, and the
    epoch is trained again whole, exactly once (what the model at that checkpoint has seen:
    nothing)."""
    dataset_spec = spec(size=120, shard_size=20, epochs=1)
    after_rewind = []
    with (
        running_sharder(settings),
        Agent("job-first-version", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data = agent.shards(list(range(120)), dataset_spec, shuffle=False)
        version = data.prepare()
        stream = agent.iterate(iter(data))
        for _ in range(50):  # committed, then lost with the model
            next(stream)
            agent.step()
        agent.commit_trained()
        stream.close()
        agent.shard_client.flush()
        data.rewind(version)
        while not data.finished:
            for sample in agent.iterate(data):
                after_rewind.append(sample)
                agent.step()
        data.close()
        log = job_log(settings, "job-first-version")
    assert version > 0
    assert sorted(after_rewind) == list(range(120))
    report = audit_log(log, "job-first-version")  # the rewind is in the log: the audit agrees
    assert report.ok and report.finished, report.violations
    assert [e.samples_done_once for e in report.epochs] == [120]


def test_a_worker_that_a_rewind_leaves_in_a_later_epoch_goes_back_to_the_rewound_one(
    settings, topics
):
    """Another process (a parameter server back from its checkpoint) rewinds the job to before this
    worker's epoch ended.

    The sharder is back in epoch 0 and answers this worker's requests for
    epoch 1 with epoch 0: the worker must follow it there, or it waits for
    ever while the shards the rewind reopened stay TODO.
    """
    dataset_spec = spec(size=100, shard_size=50, epochs=2)
    trained: list[tuple[int, int]] = []
    with (
        running_sharder(settings),
        Agent("job-back", "w0", settings=settings, listen_for_commands=False) as agent,
        ShardClient(settings, "job-back", "ps-0", dataset_spec) as server,
    ):
        data = agent.shards(list(range(100)), dataset_spec, shuffle=False)
        stream = agent.iterate(iter(data))
        for _ in range(50):  # the first shard, committed
            next(stream)
            agent.step()
        stream.close()
        version = data.checkpoint_version()
        while data.epoch == 0:  # the rest of epoch 0: the sharder opens epoch 1
            for _ in agent.iterate(data):
                agent.step()
        assert server.rewind(1, version).epoch == 0

        def rest():
            while not data.finished:
                for _ in agent.iterate(data):
                    trained.extend((tag.epoch, tag.index) for tag in agent.pending_tags)
                    agent.step()

        worker = threading.Thread(target=rest, daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), (
            "the worker waits in epoch 1 while the rewind reopened epoch 0"
        )
        data.close()
    assert sorted(trained) == [(0, i) for i in range(50, 100)] + [(1, i) for i in range(100)]
    # shard 1's first DONE was undone: audit, not DONE counts
    report = audit_log(job_log(settings, "job-back"), "job-back")
    assert report.ok and report.finished, report.violations
    assert [e.samples_done_once for e in report.epochs] == [100, 100]


def test_one_shard_at_a_time_a_pass_goes_on_until_the_sharder_really_has_nothing(settings, topics):
    """With quota 1 the prefetched answer can never hold the next shard (the current one was unread
    when it was asked): it is asked again at once, not taken for "nothing now", which would end the
    pass and have a synchronous feed hand out short batches at every shard's end."""
    with (
        running_sharder(settings),
        Agent("job-one", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data = agent.shards(list(range(100)), spec(size=100, shard_size=10, epochs=1))
        data.quota = 1
        first_pass = list(iter(data))
        data.close()
    assert sorted(item.data for item in first_pass) == list(range(100))


def test_an_epoch_s_first_answer_is_handed_on_whole_not_one_round_trip_per_shard(settings, topics):
    """Every rank starts an epoch at once: the quota's shards of its first answer are handed on
    together, with one prefetch as the last starts; later answers a shard each."""
    with (
        running_sharder(settings),
        Agent("job-quota", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data = agent.shards(list(range(100)), spec(size=100, shard_size=10, epochs=1))
        data.quota = 4
        client = agent.shard_client
        answers_waited = []
        waiting = client.wait_answer
        client.wait_answer = lambda *a, **k: answers_waited.append(a[0]) or waiting(*a, **k)
        grants = data.grants()
        first = [next(grants) for _ in range(4)]
        assert len(answers_waited) == 1, "the epoch's first shards came one answer at a time"
        fifth = next(grants)
        assert len(answers_waited) == 2
        sixth = next(grants)
        assert len(answers_waited) == 3, "a later answer's shards came together"
        rest = list(grants)
        data.close()
    every = [p for grant in [*first, fifth, sixth, *rest] for p in grant.positions]
    assert sorted(every) == list(range(100))


def requests_asked(client: ShardClient) -> list[int]:
    """The quota of each request ``client`` waits on from now, in order."""
    asked: list[int] = []
    asking = client.request
    client.request = lambda *a, **k: asked.append(k.get("quota")) or asking(*a, **k)
    return asked


def prepared(agent: Agent) -> tuple[ShardedDataset, list[int]]:
    """A 10-shard dataset holding 2 shards, prepared, and the quota of each request asked from
    before its prepare()."""
    data = agent.shards(list(range(100)), spec(size=100, shard_size=10, epochs=1))
    data.quota = 2
    asked = requests_asked(agent.shard_client)
    data.prepare()
    return data, asked


def test_the_answer_prepare_waited_for_is_the_first_one_reading_uses(settings, topics):
    """prepare()'s request defines the dataset before training; its answer hands on the first
    shards, with no second round trip."""
    with (
        running_sharder(settings),
        Agent("job-prepared", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data, asked = prepared(agent)
        grants = data.grants()
        first = [next(grants), next(grants)]
        assert asked == [2], "the first shards were asked for again"
        rest = list(grants)
        data.close()
    every = [p for grant in [*first, *rest] for p in grant.positions]
    assert sorted(every) == list(range(100))


@pytest.mark.parametrize("since", ["quota changed", "too old to trust"])
def test_an_answer_prepare_waited_for_is_asked_for_again_once_stale(settings, topics, since):
    """A quota changed since prepare(), or an answer older than a prefetched one may be: the
    first shards are asked for again."""
    with (
        running_sharder(settings),
        Agent("job-stale", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data, asked = prepared(agent)
        if since == "quota changed":
            data.quota = 3
        else:
            data._prepared = replace(data._prepared, at=time.monotonic() - data.keepalive_s)
        next(data.grants())
        data.close()
    assert asked == [2, 3 if since == "quota changed" else 2]


def test_a_refused_rewind_ends_the_restore_naming_the_cause(settings, topics):
    """A rank restoring a checkpoint whose version the sharder cannot rewind to must not train on:
    the shard state would disagree with the model, and only the ledger would tell, at the end.
    (Before, the refusal was ignored.)"""
    dataset_spec = spec(size=100, shard_size=50, epochs=1)
    with (
        running_sharder(settings),
        Agent("job-refused", "w0", settings=settings, listen_for_commands=False) as agent,
    ):
        data = agent.shards(list(range(100)), dataset_spec, shuffle=False)
        stream = agent.iterate(iter(data))
        next(stream)  # the job is defined at the sharder
        stream.close()
        with pytest.raises(
            ShardStateLost,
            match=r"refused to rewind job job-refused to version 1000000 \(version 1000000 does "
            r"not exist",
        ) as lost:
            data.rewind(1_000_000)
    assert lost.value.exit_code == EXIT_STATE_LOST == 78


def test_a_worker_whose_dataset_disagrees_with_the_job_s_is_told_why_at_once(settings, topics):
    """Its request used to be dead-lettered and never answered: it heard nothing until its
    sharder timeout (120 s), then 'no answer'."""
    with (
        running_sharder(settings),
        Agent("job-disagree", "w0", settings=settings, listen_for_commands=False) as first,
        Agent("job-disagree", "w1", settings=settings, listen_for_commands=False) as second,
    ):
        stream = first.iterate(iter(first.shards(list(range(100)), spec(100, 50, 1))))
        next(stream)  # the job is sharded as 100 samples
        stream.close()
        other = second.shards(list(range(120)), spec(120, 50, 1))
        began = time.monotonic()
        with pytest.raises(RequestRefused, match=r"refused its request .* is sharded as"):
            next(second.iterate(iter(other)))
        assert time.monotonic() - began < 60  # not the 120 s of silence


class _AnswersInTurn:
    """A sharder client that answers from a script (no bus: the dataset's own waits are under
    test). Each answer is ``(status, call)``: ``call`` runs while the request is out."""

    worker_id, job_id = "w0", "job-wake"

    def __init__(self, script):
        self.script, self.requests = list(script), 0

    def request(self, epoch, quota=None, timeout_s=10.0, read_shards=()):
        self.requests += 1
        status, during = self.script.pop(0)
        during()
        return answer(self.requests, {}, status=status)

    def resend_lost_commits(self, answer) -> None:
        pass


def test_a_wake_while_a_request_is_out_asks_again_at_once_not_after_the_pause():
    """The worker's last commits go out while its request is on the way (an epoch's end): the
    answer predates them, so the wake they bring must end the pause that follows it. Lost, the
    rank waited out the pause (up to 160 ms at an epoch's end) before learning the job ended."""
    data = None
    client = _AnswersInTurn(
        [
            (AssignmentStatus.WAIT, lambda: data.ask_again()),  # nothing for us yet
            (AssignmentStatus.FINISHED, lambda: None),
        ]
    )
    data = ShardedDataset(
        torch.arange(10),
        spec(10, 10, 1),
        settings=load_settings(bootstrap_servers="127.0.0.1:9"),
        job_id=client.job_id,
        worker_id=client.worker_id,
        wait_s=60.0,  # the pause a lost wake would wait out
        client=client,
    )
    failed: list[BaseException] = []

    def read() -> None:
        try:
            assert list(data.grants()) == []
        except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
            failed.append(exc)

    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    reading.join(20.0)
    assert not reading.is_alive(), "the wake was lost: the pause of 60 s ran"
    assert not failed, failed
    assert client.requests == 2 and data.finished
