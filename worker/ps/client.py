"""A worker's side of the parameter server: pull the parameters, push gradients as pending updates.

A push sends each shard its slice of the gradients (``prepare``: held, not
applied), then asks the sharder to commit the update's samples
(:meth:`antdt.worker.commits.Committer.request`); the shards apply it when
they read the commit in the log. The commit's answer is collected at a later
push (at most ``max_outstanding`` are in flight), so training never waits a
round trip for it; a refusal revokes the grants it named, and those samples
are granted again.

Every blocking call is bounded: a shard that is down or recovering is
retried (reconnecting) for up to ``timeout_s``, then :class:`ServerUnavailable`
names it.
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
from collections import deque

import torch

from antdt.errors import AntdtError
from antdt.worker.agent import Agent
from antdt.worker.commits import PendingUpdate
from antdt.worker.ps import wire
from antdt.worker.ps.layout import Layout
from antdt.worker.shard_client import NoAnswer

log = logging.getLogger(__name__)

RETRY_S = 0.05
#: Gradient bytes a worker may have held on the servers, waiting for their commits' answers: the
#: answers take a bus round trip (tens of ms), so on short steps a few updates must be in flight
#: or every push waits for one; on a big model fewer, so the servers' memory stays bounded.
HELD_BYTES = 64 << 20
OUTSTANDING = (2, 32)


def outstanding_for(update_bytes: int) -> int:
    """How many updates may await their commit's answer: ``HELD_BYTES`` of them, within
    ``OUTSTANDING``."""
    low, high = OUTSTANDING
    return max(low, min(high, HELD_BYTES // max(1, update_bytes)))


class ServerUnavailable(AntdtError):
    """A parameter-server shard did not serve within the time allowed."""


class ParameterClient:
    """Connections to every shard of the job's parameter server, for one worker's model."""

    def __init__(
        self,
        agent: Agent,
        addresses: list[str],
        model: torch.nn.Module,
        *,
        timeout_s: float = 120.0,
        max_outstanding: int | None = None,
        answer_timeout_s: float = 10.0,
    ):
        if not addresses:
            raise AntdtError("no parameter-server address given")
        self.agent, self.addresses, self.timeout_s = agent, list(addresses), timeout_s
        self.layout = Layout.of(model, len(addresses))
        named = dict(model.named_parameters())
        self.params = [named[name] for name in self.layout.names]
        self.versions = [0] * len(addresses)
        update_bytes = 4 * sum(self.layout.size(shard) for shard in range(len(addresses)))
        self.max_outstanding = max_outstanding or outstanding_for(update_bytes)
        self.answer_timeout_s = answer_timeout_s
        self.pushed = self.stale = 0
        self._sockets: list[socket.socket | None] = [None] * len(addresses)
        self._outstanding: deque[PendingUpdate] = deque()
        self._numbers = itertools.count(1)

    # ------------------------------------------------------------ requests with bounded retries

    def _call(
        self,
        shard: int,
        header: dict,
        payload: torch.Tensor | None = None,
        deadline: float | None = None,
    ) -> tuple[dict, torch.Tensor | None]:
        """One request to ``shard``, retried (reconnecting) while the shard is away or not ready."""
        deadline = deadline or time.monotonic() + self.timeout_s
        why = "no answer"
        while time.monotonic() < deadline:
            try:
                sock = self._socket(shard, deadline)
                wire.send(sock, header, payload)
                reply, values = wire.receive(sock)
            except wire.WireError as exc:
                why = str(exc)
                self._drop(shard)
                time.sleep(RETRY_S)
                continue
            if reply.get("ok") or not reply.get("retry"):
                if "error" in reply:
                    raise AntdtError(f"parameter server {self.addresses[shard]}: {reply['error']}")
                return reply, values
            why = reply.get("reason", "not ready")
            time.sleep(RETRY_S)
        raise ServerUnavailable(
            f"parameter server {self.addresses[shard]} (shard {shard}) did not serve "
            f"{header['op']} within {self.timeout_s:.0f} s: {why}"
        )

    def _socket(self, shard: int, deadline: float) -> socket.socket:
        if self._sockets[shard] is None:
            self._sockets[shard] = wire.connect(
                self.addresses[shard], max(1.0, min(30.0, deadline - time.monotonic()))
            )
        return self._sockets[shard]

    def _drop(self, shard: int) -> None:
        if self._sockets[shard] is not None:
            self._sockets[shard].close()
            self._sockets[shard] = None

    # ------------------------------------------------------------ the model

    def start(self) -> ParameterClient:
        """Offer this worker's initial values (the first offer per shard wins), then pull the
        server's."""
        for shard in range(len(self.addresses)):
            hello, _ = self._call(shard, {"op": "hello"})
            job = self.agent.spec.job_id
            if hello.get("job", job) != job:
                raise AntdtError(
                    f"{self.addresses[shard]} serves job {hello['job']!r}, this worker is job "
                    f"{job!r}: set ANTDT_JOB_ID to the servers' job (antdt up prints it)"
                )
            if hello["shards"] != len(self.addresses) or hello["shard"] != shard:
                raise AntdtError(
                    f"{self.addresses[shard]} is shard {hello['shard']} of {hello['shards']}, "
                    f"not shard {shard} of {len(self.addresses)}: check the order of the addresses"
                )
            values = self.layout.gather([p.detach() for p in self.params], shard)
            self._call(
                shard,
                {
                    "op": "init",
                    "signature": self.layout.signature(shard),
                    "worker": self.agent.spec.worker_id,
                },
                values,
            )
        self.pull()
        return self

    def pull(self) -> None:
        """The server's current parameters into the model, in place (booked as synchronisation)."""
        with self.agent.sync_wait():
            for shard in range(len(self.addresses)):
                reply, values = self._call(shard, {"op": "pull"})
                self.versions[shard] = reply["version"]
                self.layout.scatter(values, shard, self.params)

    def push(self) -> bool:
        """Send the model's gradients as an update of the samples iterated since the last step.

        False if a shard refused it for staleness (``antdt ps --max-staleness``):
        nothing was committed and the samples stay with the agent, so the
        caller pulls, recomputes the gradient and pushes again.
        """
        with self.agent.sync_wait():
            self._settle(block=len(self._outstanding) >= self.max_outstanding)
            update_id = (
                f"{self.agent.spec.worker_id}/{self.agent.incarnation[:12]}/{next(self._numbers)}"
            )
            samples = len(self.agent.pending_tags)
            if not self._prepare_everywhere(update_id, samples):
                self.stale += 1
                return False
            pending = self.agent.committer.request(
                self.agent.take_tags(), update_id, self.agent.step_count
            )
            if pending is not None:
                self._outstanding.append(pending)
            self.pushed += 1
            return True

    def _prepare_everywhere(self, update_id: str, samples: int) -> bool:
        grads = [p.grad for p in self.params]
        accepted = []
        for shard in range(len(self.addresses)):
            header = {
                "op": "prepare",
                "update_id": update_id,
                "base_version": self.versions[shard],
                "samples": samples,
            }
            reply, _ = self._call(shard, header, self.layout.gather(grads, shard))
            if not reply.get("ok"):
                self._abort(update_id, accepted)
                return False
            accepted.append(shard)
        return True

    def _abort(self, update_id: str, shards) -> None:
        for shard in shards:
            try:
                self._call(
                    shard, {"op": "abort", "update_id": update_id}, deadline=time.monotonic() + 5.0
                )
            except AntdtError:
                pass  # it expires there anyway

    def _settle(self, block: bool) -> None:
        """Collect the answers to earlier commits (waiting for the oldest if ``block``)."""
        client = self.agent.shard_client
        while self._outstanding:
            oldest = self._outstanding[0]
            answer = self._wait_for(oldest) if block else client.answer_if_ready(oldest.seq)
            if answer is None:
                return
            self._outstanding.popleft()
            block = False
            if not self.agent.committer.settle(oldest, answer):
                log.info("update %s refused: %s", oldest.update_id, answer.reason)
                self._abort(oldest.update_id, range(len(self.addresses)))

    def _wait_for(self, pending: PendingUpdate):
        """The answer to a commit, asked again every ``answer_timeout_s`` (an answer lost on the
        bus) for ``timeout_s``."""
        client, deadline = self.agent.shard_client, time.monotonic() + self.timeout_s
        while True:
            try:
                return client.wait_answer(pending.seq, self.answer_timeout_s, flush=False)
            except NoAnswer:
                if time.monotonic() >= deadline:
                    raise NoAnswer(
                        f"worker {self.agent.spec.worker_id}: no answer from the sharder "
                        f"to the commit of update {pending.update_id} for {self.timeout_s:.0f} s "
                        "(is the sharder running and the bus reachable?)"
                    ) from None
                log.warning(
                    "update %s: no answer to its commit yet, asking again", pending.update_id
                )
                pending = self.agent.committer.resend(pending)
                self._outstanding[0] = pending

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Collect the answers still outstanding, for at most ``timeout_s``; whether none is
        left."""
        deadline = time.monotonic() + timeout_s
        while self._outstanding and time.monotonic() < deadline:
            self._settle(block=False)
            time.sleep(0.01)
        return not self._outstanding

    def close(self, timeout_s: float = 10.0) -> None:
        """Collect what is still outstanding (bounded), then close the connections."""
        self.flush(timeout_s)
        for shard in range(len(self.addresses)):
            self._drop(shard)


def read_parameters(addresses: list[str], model: torch.nn.Module, timeout_s: float = 5.0) -> bool:
    """The servers' current parameters into ``model`` (an observer's read: no agent, no retries);
    False if any shard is away."""
    layout = Layout.of(model, len(addresses))
    named = dict(model.named_parameters())
    params = [named[name] for name in layout.names]
    for shard, address in enumerate(addresses):
        try:
            with wire.connect(address, timeout_s) as sock:
                wire.send(sock, {"op": "pull"})
                reply, values = wire.receive(sock)
        except wire.WireError:
            return False
        if not reply.get("ok") or values is None:
            return False
        layout.scatter(values, shard, params)
    return True
