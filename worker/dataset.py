"""``ShardedDataset``: a torch ``IterableDataset`` fed by the sharder.

It wraps any indexable dataset. Iterating it asks the sharder for shards (up
to the worker's quota, its prefetch depth) and yields the samples of each
that are not in the model yet (a shard granted again after its holder died
has some already), in a per-epoch, per-shard shuffled order when
``shuffle=True``. Each sample comes as a :class:`~antdt.worker.provenance.Tagged`
naming its epoch, index and grant; :meth:`Agent.iterate` takes the tags off
and the agent commits them once the step that trained them is applied. The
sharder counts a shard DONE when every sample of it is committed, so a
sample handed out but lost (a crash before the step, samples waiting in a
DataLoader queue) is simply granted again.

A pass ends when the sharder's epoch ends (or a rewind by another process,
such as a parameter server back from its checkpoint, takes the job back to
an earlier epoch), or when the sharder has nothing
for this worker right now and the pass has handed something out: the
consumer can then train and commit what it holds (the last partial batch
included), and iterates again, which resumes the same epoch. Loop with
``while not data.finished: for batch in agent.iterate(loader): ...``.

DataLoader worker processes (``num_workers > 0``): each loader process is its
own sharder client, named ``<worker>.loader<k>``, with its own quota; it pulls
its shards itself, so no shard is read twice and no coordination with the
main process is needed; the tags name the loader process as the holder of
the grant, and the main process commits for it. Use :func:`loader`, which
sets what dynamic sharding needs:

* ``collate_fn``: :func:`~antdt.worker.provenance.collate`, which keeps the
  tags beside the batch (wrapping a ``collate_fn`` you pass);
* ``in_order=False``: shards are pulled dynamically, so one loader process
  may wait for shards another holds. A DataLoader that insists on taking
  batches from its processes in turn would wait for the waiting one while the
  other's queue is full: a deadlock at the end of every epoch;
* ``multiprocessing_context="spawn"`` (or "forkserver"): the default fork
  copies a process whose Kafka client threads may hold locks at that instant,
  and the child can hang on them;
* ``persistent_workers=True``: passes end whenever the sharder has nothing
  for a while; the loader processes stay up between them.

With loader processes call :meth:`set_epoch` when an epoch ends, as with
``DistributedSampler`` (the loader processes get a copy of the dataset).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.utils.data import IterableDataset, get_worker_info

from antdt.errors import ShardStateLost
from antdt.schemas.models import AssignmentStatus, DatasetSpec, ShardAssignment, loader_holder
from antdt.settings import Settings
from antdt.worker.provenance import SampleTag, Tagged, collate
from antdt.worker.shard_client import NoAnswer, RequestRefused, ShardClient

_EPOCH, _FINISHED = 0, 1


def shards_holding(samples: int, shard_size: int) -> int:
    """The fewest whole shards that hold ``samples`` samples: what a quota counts for a batch.
    Each training job sets its quota from it by its own rule (a partial-reduce rank, one batch's;
    an elastic rank, its feed's two batches and one more being granted)."""
    return -(-samples // shard_size)


#: How often a worker holding nothing by choice (quota 0) asks again, to learn of an epoch's end.
IDLE_POLL_S = 0.25
#: The longest pause between requests while the sharder has nothing: the pause doubles from
#: ``wait_s`` up to this, so a job's workers waiting at an epoch's end do not queue up requests
#: ahead of the commits that would end the wait.
MAX_WAIT_S = 0.16


@dataclass(frozen=True)
class ShardGrant:
    """One granted shard: its samples not in the model yet, in this epoch's order, and whose grant
    they are read under."""

    epoch: int
    shard_id: int
    attempt: int
    holder: str
    positions: list[int]
    #: A part of a begun grant shared among a synchronous job's ranks at an epoch's end
    #: (:mod:`~antdt.worker.elastic.pooling`): never given back, and renewed only by its holder.
    pooled: bool = False

    @property
    def key(self) -> tuple[int, int, int]:
        """(epoch, shard, attempt), as :attr:`ShardedDataset.revoked` names grants."""
        return (self.epoch, self.shard_id, self.attempt)

    def tag(self, position: int) -> SampleTag:
        return SampleTag(self.epoch, position, self.shard_id, self.attempt, self.holder)

    def tags(self, positions: list[int]) -> tuple[SampleTag, ...]:
        """The tags of ``positions``, the grant's fields read once (a step of 512 samples makes
        512 tags)."""
        epoch, shard, attempt, holder = self.epoch, self.shard_id, self.attempt, self.holder
        return tuple(SampleTag(epoch, position, shard, attempt, holder) for position in positions)


@dataclass(frozen=True)
class _Prepared:
    """The answer to :meth:`ShardedDataset.prepare`'s request: when it came, the quota asked, and
    the client that asked (its answer is for that client's worker only)."""

    answer: ShardAssignment
    at: float
    asked: int
    client: ShardClient


def positions_in(grants: Iterable[ShardGrant]) -> int:
    """The samples the grants name, all together."""
    return sum(len(grant.positions) for grant in grants)


class ShardedDataset(IterableDataset):
    """Yields the samples of the shards the sharder grants this worker, tagged with their
    provenance."""

    def __init__(
        self,
        source: Sequence,
        spec: DatasetSpec,
        *,
        settings: Settings,
        job_id: str,
        worker_id: str,
        quota: int = 2,
        shuffle: bool = True,
        request_timeout_s: float = 10.0,
        wait_s: float = 0.02,
        prefetch: bool = True,
        client: ShardClient | None = None,
        sharder_timeout_s: float = 120.0,
        waiting_for_others=None,
    ):
        """``client``: the process's sharder client to share (the agent's), else one is made per
        process.

        ``sharder_timeout_s``: how long the sharder may stay silent (each
        request timing out after ``request_timeout_s`` and asked again, as
        while it restarts) before iterating raises :class:`NoAnswer`.

        ``waiting_for_others``: a context manager factory that books the time
        the sharder has nothing for this worker (others hold the epoch's last
        shards) as waiting for them, not for data (the agent's ``sync_wait``):
        a worker idle at an epoch's end is not slow.
        """
        if len(source) != spec.size:
            raise ValueError(f"the dataset has {len(source)} samples but the spec says {spec.size}")
        self.source, self.spec, self.settings = source, spec, settings
        self.job_id, self.worker_id = job_id, worker_id
        self._quota, self._holding, self._woken = quota, True, threading.Event()
        self._waiting_for_others = waiting_for_others
        self.shuffle, self.prefetch = shuffle, prefetch
        #: True while the sharder has nothing for this worker yet (others hold the epoch's last
        #: shards).
        self.waiting = False
        self.request_timeout_s, self.wait_s, self.sharder_timeout_s = (
            request_timeout_s,
            wait_s,
            sharder_timeout_s,
        )
        #: Grants (epoch, shard, attempt) whose commits were refused: their samples are not read any
        #: further.
        self.revoked: set[tuple[int, int, int]] = set()
        self._epoch, self._finished = 0, False
        # [epoch, finished] in shared memory, when DataLoader processes read for us
        self._shared = None
        self._client = client
        self._client_pid = os.getpid() if client is not None else None
        self._owns_client = client is None
        # shard -> attempt: held grants read to the end, this epoch (passes included)
        self._read: dict[int, int] = {}
        self._read_epoch = 0
        self._prepared: _Prepared | None = None  # prepare()'s answer, not used yet

    # ------------------------------------------------------------ how much to hold

    @property
    def quota(self) -> int:
        """Shards to read at once while :attr:`holding`. 0: hold nothing (the sharder takes back
        what is held) until it is raised again. The controller's SET_SHARD_QUOTA sets it."""
        return self._quota

    @quota.setter
    def quota(self, value: int) -> None:
        self._hold(value, self._holding)

    @property
    def holding(self) -> bool:
        """False while the worker sits steps out (a rank sized to 0): it asks for no shard then,
        whatever its quota, and asks for its quota again once holding."""
        return self._holding

    @holding.setter
    def holding(self, value: bool) -> None:
        self._hold(self._quota, value)

    @property
    def asked_quota(self) -> int:
        """The quota asked of the sharder: 0 while not holding."""
        return self._quota if self._holding else 0

    def _hold(self, quota: int, holding: bool) -> None:
        held_nothing = not self.asked_quota
        self._quota, self._holding = quota, holding
        if self.asked_quota and held_nothing:
            # not known yet: the sharder has not answered a request for shards since
            self.waiting = False
        # a wait between requests ends now, so a raised quota is asked for at once
        self._woken.set()

    # ------------------------------------------------------------ epoch and end, as the sharder
    # says

    @property
    def epoch(self) -> int:
        return int(self._shared[_EPOCH]) if self._shared is not None else self._epoch

    @property
    def finished(self) -> bool:
        """Every epoch is complete (learnt by whichever process reads the shards)."""
        return bool(self._shared[_FINISHED]) if self._shared is not None else self._finished

    def _learn(self, epoch: int | None = None, finished: bool | None = None) -> None:
        if epoch is not None:
            self._epoch = epoch
            if self._shared is not None:
                self._shared[_EPOCH] = epoch
        if finished is not None:
            self._finished = finished
            if self._shared is not None:
                self._shared[_FINISHED] = int(finished)

    def set_epoch(self, epoch: int) -> None:
        """The epoch to ask for next (the sharder moves on by itself; kept for
        DistributedSampler-style loops)."""
        self._learn(epoch=epoch)

    def share_progress(self, context) -> None:
        """Keep epoch and end in shared memory, so DataLoader processes tell the main process
        (``loader`` calls it)."""
        if self._shared is None:
            self._shared = context.Array("q", [self._epoch, int(self._finished)], lock=False)

    # ------------------------------------------------------------ reading

    def __iter__(self) -> Iterator[Tagged]:
        """The samples of this pass's grants, one at a time, each tagged (module docstring)."""
        keepalive_s = self.keepalive_s
        for grant in self.grants():
            renew_at = time.monotonic() + keepalive_s
            for position in grant.positions:
                if grant.key in self.revoked:
                    break
                yield Tagged(self.source[position], (grant.tag(position),))
                # a slow consumer must not lose the shard it is reading
                if time.monotonic() >= renew_at:
                    self.keep_alive(grant)
                    renew_at = time.monotonic() + keepalive_s

    def grants(self) -> Iterator[ShardGrant]:
        """This pass's grants, each once, with the samples of it not in the model yet.

        A grant counts as read once the next one is asked for: a consumer
        that takes a whole grant at once (:class:`~antdt.worker.feeds.ShardFeed`)
        keeps its lease alive itself (:meth:`keep_alive`) while it holds
        samples of it.
        """
        client = self._client_for_this_process()
        epoch = self.epoch
        handed_out = False
        if self._read_epoch != epoch:
            self._read, self._read_epoch = {}, epoch
        # The lambda reads handed_out as the loop below sets it, on purpose.
        for shard, sample_epoch in self._shards(client, epoch, lambda: handed_out):  # noqa: B023
            client.started(sample_epoch, shard.shard_id, shard.attempt)
            grant = ShardGrant(
                sample_epoch,
                shard.shard_id,
                shard.attempt,
                client.worker_id,
                self._positions(sample_epoch, shard),
            )
            handed_out = handed_out or bool(grant.positions)
            yield grant
            self._read[shard.shard_id] = shard.attempt

    @property
    def keepalive_s(self) -> float:
        """A quarter of the lease: how often a grant being read is renewed, and how old a
        prefetched answer may be and still be trusted."""
        return self.spec.lease_s / 4

    def read_in_background(self) -> None:
        """A feed's thread reads this dataset from now on: its waits for the others' shards are not
        the training thread's, so they are not booked on the agent's step (they once made the
        steps of an epoch's end read as negative compute, and skewed DD's sizing there)."""
        self._waiting_for_others = None

    def ask_again(self) -> None:
        """End a wait between requests now: what the sharder waited for (this worker's last
        commits, say) was just sent, and the next answer may differ."""
        self._woken.set()

    def give_back(self, grants: list[ShardGrant]) -> None:
        """Give back held grants of which the consumer read nothing (a feed does, at an epoch's
        end, for workers out of data): the sharder grants them to others. They were handed out
        already, so no answer hands them out again."""
        by_epoch: dict[int, list[tuple[int, int]]] = {}
        for grant in grants:
            by_epoch.setdefault(grant.epoch, []).append((grant.shard_id, grant.attempt))
        client = self._client_for_this_process()
        for epoch, refs in by_epoch.items():
            client.give_back(epoch, refs)

    def keep_alive(self, grant: ShardGrant) -> None:
        """Renew the lease of a grant whose samples are still being read (a share of another
        rank's grant is that rank's to renew: its reports do)."""
        client = self._client_for_this_process()
        if grant.holder == client.worker_id:
            client.started(grant.epoch, grant.shard_id, grant.attempt)

    def _shards(self, client: ShardClient, epoch: int, handed_out):
        """Granted shards of ``epoch``, each once, until the sharder ends the epoch or the pass
        (module docstring).

        With ``prefetch`` the next request is sent as a shard starts, so its
        answer is usually waiting when the shard is finished and reading
        never stalls on the round trip to the sharder. An answer older than a
        quarter of the lease is not trusted (a long stall may have cost a
        prefetched shard its lease): the request is made again.
        """
        # (seq, sent at) of the request sent as the last shard started
        ahead: tuple[int, float] | None = None
        answered_at = time.monotonic()
        pause_s = self.wait_s
        whole = not self._read  # nothing of the epoch read yet: its first answer, whole
        # the answer to prepare()'s request, if it is this one's (no round trip for it again)
        prepared = self._take_prepared(client, epoch)
        while True:
            early = ahead is not None and time.monotonic() - ahead[1] < self.keepalive_s
            if prepared is not None:
                answer, answered_at, asked = prepared.answer, prepared.at, prepared.asked
                prepared = None
            else:
                try:
                    if early:
                        answer = client.wait_answer(ahead[0], self.request_timeout_s, flush=False)
                    else:
                        asked = self.asked_quota
                        self._woken.clear()  # a wake from now on is news this answer may lack
                        answer = client.request(
                            epoch,
                            quota=asked,
                            timeout_s=self.request_timeout_s,
                            read_shards=sorted(self._read),
                        )
                except NoAnswer:
                    ahead = None
                    silent_s = time.monotonic() - answered_at
                    if silent_s >= self.sharder_timeout_s:
                        raise NoAnswer(
                            f"worker {client.worker_id}: no answer "
                            f"from the sharder for {silent_s:.0f} s "
                            f"(is the sharder running and the bus reachable?)"
                        ) from None
                    continue  # the sharder is restarting or taking the job over: ask again
                ahead, answered_at = None, time.monotonic()
            _raise_if_refused(client, answer)
            # a commit lost on the bus would leave its shard held for ever
            client.resend_lost_commits(answer)
            if answer.status is AssignmentStatus.FINISHED:
                self._learn(finished=True)
                return
            if answer.status is AssignmentStatus.EPOCH_END or answer.epoch > epoch:
                self._learn(epoch=max(answer.epoch, epoch + 1))
                return
            # another process rewound the job into an epoch this worker had left
            if answer.epoch < epoch:
                self._learn(epoch=answer.epoch)
                return
            held = {s.shard_id: s.attempt for s in answer.shards}
            # Read grants no longer held are DONE (or reclaimed); a held one is never read twice,
            # pass after pass.
            self._read = {
                shard: attempt
                for shard, attempt in self._read.items()
                if held.get(shard) == attempt
            }
            fresh = [s for s in answer.shards if self._read.get(s.shard_id) != s.attempt]
            if not fresh:
                if early:
                    continue  # the prefetched answer predates the last reads: ask again at once
                if handed_out():
                    self.waiting = True
                    # nothing for us now: the consumer trains and commits what it has, then comes
                    # back
                    return
                # (an answer to a request for nothing says nothing about shards)
                self.waiting = asked > 0
                with self._waiting_for_others() if self._waiting_for_others else nullcontext():
                    # WAIT: others hold the epoch's last shards. A wake since the request was sent
                    # (this worker's last commits, say) ends it at once: the answer predates them
                    woken = self._woken.wait(pause_s if asked else IDLE_POLL_S)
                # woken (ask_again, a new quota): something changed, back to short pauses
                pause_s = self.wait_s if woken else min(2 * pause_s, max(MAX_WAIT_S, self.wait_s))
                continue
            self.waiting, pause_s = False, self.wait_s
            # One shard per answer: the next answer (at most lease/4 old, see above) re-confirms
            # what is still held, so a shard whose lease ran out is never read. But the first of
            # an epoch is handed on whole (while that young): every rank starts an epoch at
            # once, and a round trip per shard there delays its first step. (At an epoch's end
            # a whole answer of given-back shards would go to the first rank to ask.)
            count = len(fresh) if whole else 1
            whole = False
            for index, shard in enumerate(fresh[:count]):
                if index and time.monotonic() - answered_at >= self.keepalive_s:
                    break
                if self.prefetch and index == count - 1:
                    ahead = (
                        client.ask(epoch, quota=self.asked_quota, read_shards=sorted(self._read)),
                        time.monotonic(),
                    )
                yield shard, answer.epoch

    def _positions(self, epoch: int, shard) -> list[int]:
        """The shard's samples not in the model yet, in this epoch's order: a permutation drawn
        from (seed, epoch, shard) by torch, off the interpreter's lock (``random.shuffle`` in
        Python held it 430 us for a shard of 2,048 on the feed's thread, time the training
        thread waited for it; now 47 us)."""
        done = set(getattr(shard, "done", ()))
        if self.shuffle:
            seed = (self.spec.shuffle_seed, epoch, shard.shard_id).__hash__()
            order = torch.randperm(shard.length, generator=torch.Generator().manual_seed(seed))
            positions = (order + shard.start).tolist()
        else:
            positions = list(range(shard.start, shard.start + shard.length))
        return [i for i in positions if i not in done] if done else positions

    def _client_for_this_process(self) -> ShardClient:
        """One client per process: the main one (the agent's, when given), or each DataLoader worker
        process's."""
        if self._client is None or self._client_pid != os.getpid():
            info = get_worker_info()
            identity = self.worker_id if info is None else loader_holder(self.worker_id, info.id)
            self._client = ShardClient(self.settings, self.job_id, identity, self.spec)
            self._client_pid = os.getpid()
            self._owns_client = True
        return self._client

    def prepare(self, timeout_s: float = 60.0) -> int:
        """Ask the sharder once before training starts; returns the answer's shard-state version.

        The first request of a job defines its dataset and makes a sharder
        its writer (an election read back through the log), which takes a
        moment; doing it here keeps that out of the first training step.
        The shards granted stay held and are the first ones read, and its
        answer is the first one reading uses, with no second round trip
        (:meth:`_take_prepared`; 15-20 ms of set-up on the embedded broker).
        The version is the log's position at the answer, after the dataset's
        definition: before a new job's first commit, a checkpoint's version
        as good as one :meth:`checkpoint_version` asks for.
        """
        client = self._client_for_this_process()
        asked = self.asked_quota
        answer = client.request(self.epoch, quota=asked, timeout_s=timeout_s)
        _raise_if_refused(client, answer)
        self._prepared = _Prepared(answer, time.monotonic(), asked, client)
        return answer.seq

    def _take_prepared(self, client: ShardClient, epoch: int) -> _Prepared | None:
        """The answer to :meth:`prepare`'s request as the first answer of ``epoch``'s shards,
        once: if this client asked it (not a loader process's own), for this epoch and the quota
        asked now, and it is young enough to trust (a quarter of the lease, as a prefetched
        answer). Else None: ask again."""
        prepared, self._prepared = self._prepared, None
        if (
            prepared is None
            or prepared.client is not client
            or prepared.answer.epoch != epoch
            or prepared.asked != self.asked_quota
            or time.monotonic() - prepared.at >= self.keepalive_s
        ):
            return None
        return prepared

    def checkpoint_version(self, step: int | None = None) -> int:
        """The shard-state version to store with a model checkpoint (the commits sent so far flushed
        first)."""
        client = self._client_for_this_process()
        client.flush()
        return client.checkpoint(self.epoch, step)

    def rewind(self, version: int) -> None:
        """Restore the job's shard state to ``version`` (after loading the model checkpoint).

        :class:`ShardStateLost` if the sharder refuses: training on would
        take as done what the model lost with its checkpoint, or train again
        what it has, and the ledger would only tell at the end.
        """
        client = self._client_for_this_process()
        answer = client.rewind(self.epoch, version)
        if answer.status is AssignmentStatus.REFUSED:
            raise ShardStateLost(
                f"the sharder refused to rewind job {client.job_id} to version {version} "
                f"({answer.reason}): the job's shard state is lost, and a restart cannot "
                "recover it; start the job again"
            )
        self._learn(epoch=answer.epoch, finished=False)
        self.revoked.clear()

    @property
    def deadlettered(self) -> int:
        """Records on this worker's key that were no usable answer, as this process's open client
        counted them."""
        return self._client.deadlettered if self._client is not None else 0

    def close(self) -> None:
        if self._client is not None and self._owns_client:
            self._client.close()
        self._client = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None  # a Kafka client does not cross a process boundary
        state["_owns_client"] = True
        state["_woken"] = None  # nor does an Event: each process gets its own
        state["_waiting_for_others"] = None  # a loader process books into no agent
        state["_prepared"] = None  # the answer to this process's client, not a loader's
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._woken = threading.Event()


def _raise_if_refused(client: ShardClient, answer) -> None:
    if answer.status is AssignmentStatus.REFUSED:
        raise RequestRefused(
            f"worker {client.worker_id}: the sharder refused its request for shards of job "
            f"{client.job_id}: {answer.reason}"
        )


def loader(dataset: ShardedDataset, batch_size: int, num_workers: int = 0, **options):
    """A DataLoader configured for dynamic sharding and provenance (see the module docstring)."""
    import multiprocessing

    from torch.utils.data import DataLoader

    inner = options.pop("collate_fn", None)
    options["collate_fn"] = collate if inner is None else _Collate(inner)
    if num_workers:
        options.setdefault("in_order", False)
        options.setdefault("multiprocessing_context", "spawn")
        options.setdefault("persistent_workers", True)
        context = options["multiprocessing_context"]
        dataset.share_progress(
            multiprocessing.get_context(context) if isinstance(context, str) else context
        )
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **options)


class _Collate:
    """A user's ``collate_fn`` with the tags kept beside its batch (picklable, for loader
    processes)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, items):
        return collate(items, self.inner)
