"""A demo worker's asynchronous training (AntDT-ND's shared cluster): dynamic shards, one parameter
server.

Each step pulls the parameters, computes the gradient of the batch (real
torch work, then paced to the speed of the node it runs on; the pull and
the push are not part of that, so a slow server adds to every step), and
pushes it as an update
that the parameter server applies once the shard log records its commit.
The worker never waits for another: a slow one simply pulls fewer shards.
"""

from __future__ import annotations

from antdt.demo.phases import Phase
from antdt.worker.agent import Agent
from antdt.worker.example import batches
from antdt.worker.ps.client import ParameterClient


def train_async(worker, agent: Agent, addresses: list[str]) -> None:
    data = agent.shards(worker.source, worker.spec)
    data.prepare()  # the job's first contact with the sharder, before the clock starts
    server = ParameterClient(agent, addresses, worker.trainer.model).start()
    try:
        pacer = worker.ready_and_wait()
        trained = _steps(worker, agent, data, server, pacer)
        worker.finish(agent, pacer, trained)
    finally:
        server.close()
        data.close()


def _steps(worker, agent: Agent, data, server: ParameterClient, pacer) -> int:
    """Pull, compute, push until the sharder says every epoch is done; returns the samples
    trained."""
    trained = 0
    while not data.finished:
        for inputs, labels in batches(agent, iter(data)):
            pushed = False
            while not pushed:  # a push refused for staleness is recomputed on fresh parameters
                server.pull()
                # the node's speed paces the computation, not the wait for the server
                started = pacer.now_s()
                worker.trainer.backward(inputs, labels)
                pacer.pace(len(labels), started)
                with worker.phases.during(Phase.PUSH):
                    pushed = server.push()
            trained += len(labels)
            agent.step(samples=len(labels))
    return trained
