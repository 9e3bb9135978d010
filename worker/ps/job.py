"""Asynchronous training on parameter servers under torchrun: what a script swaps in.

Each rank is a worker of the job's parameter servers (``antdt ps``, or
``antdt up --mode async``): it pulls the servers' parameters, computes one
batch's gradient and pushes it, at its own pace; no rank ever waits for
another, so a slow rank slows nobody but itself and simply reads fewer
shards. The servers hold the shared model and apply each update with
their optimizer (SGD, ``antdt ps --lr --momentum``) exactly when the shard
log records its commit (docs/parameter-server.md).

The rest is every job's (:class:`~antdt.worker.training_job.TrainingJob`),
in the parameter server's form:

* **dynamic shards**, read one batch ahead (:class:`~antdt.worker.feeds.ShardFeed`);
* **checkpoints and the ledger are the servers'**: they save them at the
  log's checkpoints and write the ledger as each epoch closes, so the job
  needs no checkpoint file of its own, and a rank restarted by torchrun
  simply pulls the model again (its unfinished shards are granted again);
* **a refused push is recomputed**: a server that refuses a gradient as
  too stale (``--max-staleness``) gets the same batch again, computed on
  fresh parameters, never the next one (its samples are not committed
  until a push of theirs is accepted);
* every wait is bounded (a server away: the client's ``timeout_s``; a
  commit's answer: the same).

The loop has no optimizer step (the servers apply the update)::

    with ParameterServerJob(model, dataset, batch_size=32) as job:
        for inputs, labels in job.batches():
            loss_fn(model(inputs), labels).backward()

After the loop the model holds the servers' parameters as this rank left
them. The process group torchrun sets up is not needed (nor used).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence

import torch

from antdt.errors import AntdtError
from antdt.worker.feeds import ShardFeed
from antdt.worker.ps.client import ParameterClient
from antdt.worker.training_job import TrainingJob, require_module_itself

#: While the sharder says wait (others hold the epoch's last shards), how often to look again.
WAIT_POLL_S = 0.05
#: A batch refused as stale this many times in a row ends the job: this worker computes a batch
#: slower than the servers' ``--max-staleness`` lets it, and would recompute it for ever.
REFUSALS_IN_A_ROW = 100


class ParameterServerJob(TrainingJob):
    """One rank's part of an asynchronous job (module docstring). Use as a context manager."""

    def __init__(
        self,
        model: torch.nn.Module,
        dataset,
        *,
        batch_size: int,
        servers: str | Sequence[str] | None = None,
        epochs: int = 1,
        shard_size: int | None = None,
        seed: int = 0,
        name: str = "dataset",
        owners: Sequence[str] = (),
        agent=None,
        server_timeout_s: float = 120.0,
    ):
        """``model``: this rank's copy, the module itself; ``servers``: the shards' addresses in
        shard order (default ``ANTDT_PS_SERVERS``); ``owners``: static shards, each read only by
        its owner (the static baseline; default: dynamic); ``server_timeout_s``: how long a server
        may be away before the job fails naming it. The rest as
        :class:`~antdt.worker.training_job.TrainingJob` takes them."""
        require_module_itself(
            model, "ParameterServerJob pushes each rank's own gradient to the servers"
        )
        super().__init__(
            model,
            None,
            dataset,
            batch_size=batch_size,
            checkpoint=None,
            epochs=epochs,
            shard_size=shard_size,
            seed=seed,
            name=name,
            agent=agent,
        )
        if owners:
            self.spec = self.spec.model_copy(update={"owners": list(owners)})
        self.addresses = _addresses(servers, self.agent.settings.ps_servers)
        self.server_timeout_s = server_timeout_s
        self.server: ParameterClient | None = None
        self.refused = 0  # pushes refused as stale, each batch computed again

    # ------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        self.data.prepare()  # every worker may define the dataset: the sharder keeps the first
        self.server = ParameterClient(
            self.agent, self.addresses, self.model, timeout_s=self.server_timeout_s
        ).start()
        self.feed = ShardFeed(self.data, lambda: self.agent.batch_size).start()

    def _close_mode(self) -> None:
        if self.server is not None:
            self.server.close()

    # ------------------------------------------------------------ the loop

    def batches(self) -> Iterator[tuple]:
        """This rank's batches until every epoch is done, each on freshly pulled parameters with
        zeroed gradients; after each, the job pushes the gradient (a batch refused as stale comes
        again)."""
        while (batch := self._next_batch()) is not None:
            inputs, labels = self.agent.untag(batch)
            for refusals in itertools.count():
                if refusals == REFUSALS_IN_A_ROW:
                    raise AntdtError(
                        f"a batch was refused as stale {refusals} times in a row: this worker "
                        "computes a batch while the servers take more updates than their "
                        "--max-staleness allows (raise it, or leave it unset)"
                    )
                self.server.pull()
                self.model.zero_grad(set_to_none=True)
                yield inputs, labels
                if self.server.push():
                    break
                self.refused += 1  # computed on parameters too old: again on fresh ones
            self.samples += len(labels)
            self.agent.step(samples=len(labels))
        with self.agent.sync_wait():
            self.server.flush()
            self.server.pull()  # the model as this rank leaves it
        self.finished = True

    def _next_batch(self):
        """The next batch (short while the sharder has no more now), or None once every epoch is
        done; while the sharder says wait, look again shortly.

        That pause is booked as waiting for the others (they hold the epoch's
        last shards), not for data: booked as data, a whole epoch's end
        raised every worker's time per sample in the monitor's window, and
        the workers that had waited read as leaders against it.
        """
        while True:
            with self.agent.data_wait():
                batch = self.feed.take(self.agent.batch_size)
            if batch is not None or self.feed.exhausted:
                return batch
            with self.agent.sync_wait() if self.data.waiting else self.agent.data_wait():
                time.sleep(WAIT_POLL_S)


def _addresses(servers: str | Sequence[str] | None, configured: str | None) -> list[str]:
    """The shards' addresses, given or configured; AntdtError saying how to give them if none."""
    given = servers if servers is not None else configured
    if isinstance(given, str):
        given = [address.strip() for address in given.split(",")]
    addresses = [address for address in given or () if address]
    if not addresses:
        raise AntdtError(
            "no parameter servers: pass servers= or set ANTDT_PS_SERVERS to their host:port,... "
            "in shard order (antdt up --mode async starts them and prints it)"
        )
    return addresses
