"""``ShardedDataset``: a torch ``IterableDataset`` fed by the sharder.

It wraps any indexable dataset. Iterating it asks the sharder for shards (up
to the worker's quota, its prefetch depth), yields the samples of each
(in a per-epoch, per-shard shuffled order when ``shuffle=True``), and reports
STARTED before the first sample and DONE after the last. One iteration is
one epoch: it ends when the sharder says the epoch is complete.

DONE is reported once a shard's last sample has been handed out and the
consumer comes back for more, or takes a checkpoint (which happens at a step
boundary, after the step that consumed it).

DataLoader worker processes (``num_workers > 0``): each loader process is its
own sharder client, named ``<worker>.loader<k>``, with its own quota; it pulls
and reports its shards itself, so no shard is read twice and no coordination
with the main process is needed. DONE is reported when a shard's last sample
has been handed to the DataLoader; samples still in the loader's prefetch
queue when a process dies were reported DONE but not trained. Restoring a
checkpoint (REWIND) covers that exactly; without one, at most
``prefetch_factor x num_workers`` batches are affected.

Two DataLoader settings matter with loader processes (:func:`loader` sets both):

* ``in_order=False``: shards are pulled dynamically, so one loader process
  may wait for shards another holds. A DataLoader that insists on taking
  batches from its processes in turn would wait for the waiting one while the
  other's queue is full: a deadlock at the end of every epoch.
* ``multiprocessing_context="spawn"`` (or "forkserver"): the default fork
  copies a process whose Kafka client threads may hold locks at that instant,
  and the child can hang on them.

Epochs: with ``num_workers=0`` the dataset moves to the next epoch by itself;
with loader processes call :meth:`set_epoch` before each epoch, as with
``DistributedSampler`` (the loader processes get a copy of the dataset).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence

from torch.utils.data import IterableDataset, get_worker_info

from antdt.schemas.models import AssignmentStatus, DatasetSpec
from antdt.settings import Settings
from antdt.worker.shard_client import NoAnswer, ShardClient


class ShardedDataset(IterableDataset):
    """Yields the samples of the shards the sharder grants this worker (one pass = one epoch)."""

    def __init__(self, source: Sequence, spec: DatasetSpec, *, settings: Settings, job_id: str, worker_id: str,
                 quota: int = 2, shuffle: bool = True, request_timeout_s: float = 10.0, wait_s: float = 0.02,
                 prefetch: bool = True):
        if len(source) != spec.size:
            raise ValueError(f"the dataset has {len(source)} samples but the spec says {spec.size}")
        self.source, self.spec, self.settings = source, spec, settings
        self.job_id, self.worker_id = job_id, worker_id
        self.quota, self.shuffle, self.prefetch = quota, shuffle, prefetch
        #: True while the sharder has nothing for this worker yet (others hold the epoch's last shards).
        self.waiting = False
        self.request_timeout_s, self.wait_s = request_timeout_s, wait_s
        self.epoch = 0
        self.finished = False
        self._client: ShardClient | None = None
        self._client_pid: int | None = None
        self._handed_out: tuple[int, int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator:
        client = self._client_for_this_process()
        epoch = self.epoch
        keepalive_s = self.spec.lease_s / 4
        for shard, sample_epoch in self._shards(client, epoch):
            client.started(sample_epoch, shard.shard_id, shard.attempt)
            positions = self._positions(sample_epoch, shard)
            renew_at = time.monotonic() + keepalive_s
            for position in positions[:-1]:
                yield self.source[position]
                if time.monotonic() >= renew_at:  # a slow consumer must not lose the shard it is reading
                    client.started(sample_epoch, shard.shard_id, shard.attempt)
                    renew_at = time.monotonic() + keepalive_s
            # The last sample: once the consumer asks for more (or takes a
            # checkpoint), the whole shard has been handed out.
            self._handed_out = (sample_epoch, shard.shard_id, shard.attempt)
            yield self.source[positions[-1]]
            self._report_handed_out()
        if get_worker_info() is None:
            self.epoch = epoch + 1

    def _report_handed_out(self) -> None:
        """DONE for the shard whose last sample was handed out, if not reported yet."""
        if self._handed_out is not None:
            epoch, shard_id, attempt = self._handed_out
            self._handed_out = None
            self._client.done(epoch, shard_id, attempt)

    def _shards(self, client: ShardClient, epoch: int):
        """Granted shards of ``epoch``, each once, until the sharder ends the epoch.

        With ``prefetch`` the next request is sent as a shard starts, so its
        answer is usually waiting when the shard is finished and reading
        never stalls on the round trip to the sharder. An answer older than a
        quarter of the lease is not trusted (a long stall may have cost a
        prefetched shard its lease): the request is made again.
        """
        seen: set[tuple[int, int]] = set()
        ahead: tuple[int, float] | None = None  # (seq, sent at) of the request sent as the last shard started
        while True:
            early = ahead is not None and time.monotonic() - ahead[1] < self.spec.lease_s / 4
            try:
                if early:
                    answer = client.wait_answer(ahead[0], self.request_timeout_s, flush=False)
                else:
                    answer = client.request(epoch, quota=self.quota, timeout_s=self.request_timeout_s)
            except NoAnswer:
                ahead = None
                continue  # the sharder is restarting or taking the job over: ask again
            ahead = None
            if answer.status is AssignmentStatus.FINISHED:
                self.finished = True
                return
            if answer.status is AssignmentStatus.EPOCH_END or answer.epoch > epoch:
                return
            fresh = [s for s in answer.shards if (s.shard_id, s.attempt) not in seen]
            if not fresh:
                if not early:  # an early answer predates the last DONE: ask again at once
                    self.waiting = True
                    time.sleep(self.wait_s)  # WAIT: others hold the last shards of the epoch
                continue
            self.waiting = False
            # One shard per answer: the next answer (at most lease/4 old, see above)
            # re-confirms what is still held, so a shard whose lease ran out is never read.
            shard = fresh[0]
            seen.add((shard.shard_id, shard.attempt))
            if self.prefetch:
                ahead = (client.ask(epoch, quota=self.quota), time.monotonic())
            yield shard, answer.epoch

    def _positions(self, epoch: int, shard) -> list[int]:
        positions = list(range(shard.start, shard.start + shard.length))
        if self.shuffle:
            random.Random((self.spec.shuffle_seed, epoch, shard.shard_id).__hash__()).shuffle(positions)
        return positions

    def _client_for_this_process(self) -> ShardClient:
        """One client per process: the main one, or each DataLoader worker process."""
        import os

        if self._client is None or self._client_pid != os.getpid():
            info = get_worker_info()
            identity = self.worker_id if info is None else f"{self.worker_id}.loader{info.id}"
            self._client = ShardClient(self.settings, self.job_id, identity, self.spec)
            self._client_pid = os.getpid()
        return self._client

    def prepare(self, timeout_s: float = 60.0) -> None:
        """Ask the sharder once before training starts.

        The first request of a job defines its dataset and makes a sharder
        its writer (an election read back through the log), which takes a
        moment; doing it here keeps that out of the first training step.
        The shards granted stay held and are the first ones read.
        """
        self._client_for_this_process().request(self.epoch, quota=self.quota, timeout_s=timeout_s)

    def checkpoint_version(self, step: int | None = None) -> int:
        """The shard-state version to store with a model checkpoint (reports flushed first)."""
        client = self._client_for_this_process()
        self._report_handed_out()  # the step that consumed its last sample is complete
        client.flush()
        return client.checkpoint(self.epoch, step)

    def rewind(self, version: int) -> None:
        """Restore the job's shard state to ``version`` (after loading the model checkpoint)."""
        answer = self._client_for_this_process().rewind(self.epoch, version)
        self.epoch = answer.epoch
        self.finished = False

    @property
    def deadlettered(self) -> int:
        """Records on this worker's key that were no usable answer, as this process's open client counted them."""
        return self._client.deadlettered if self._client is not None else 0

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None  # a Kafka client does not cross a process boundary
        state["_handed_out"] = None
        return state


def loader(dataset: ShardedDataset, batch_size: int, num_workers: int = 0, **options):
    """A DataLoader configured for dynamic sharding (see the module docstring)."""
    from torch.utils.data import DataLoader

    if num_workers:
        options.setdefault("in_order", False)
        options.setdefault("multiprocessing_context", "spawn")
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **options)
