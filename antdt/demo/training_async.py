"""A demo worker's asynchronous training (AntDT-ND's shared cluster): the user's loop over the
public :class:`~antdt.worker.ps.job.ParameterServerJob`.

Each step pulls the parameters, computes the gradient of the batch and
pushes it as an update that the parameter servers apply once the shard log
records its commit; the worker never waits for another, and a slow one
simply reads fewer shards. The demo adds what it adds to the synchronous
loop (:class:`~antdt.demo.training_sync.DemoSteps`: pacing of the
computation, not of the pull and push, so a slow server adds to every
step; the phase file, ``PUSH`` from the backward to the next batch; the
step trace). The ``static-async`` baseline is the same job on static
shards (each worker reads only its own).
"""

from __future__ import annotations

from antdt.demo.training_sync import DemoSteps, job_options
from antdt.worker.agent import Agent
from antdt.worker.ps.job import ParameterServerJob


def train_async(worker, agent: Agent, addresses: list[str]) -> None:
    options = job_options(worker, agent, checkpoint=None)
    with ParameterServerJob(
        worker.trainer.model,
        worker.source,
        servers=addresses,
        owners=worker.spec.owners,
        **options,
    ) as job:
        steps = DemoSteps(worker, agent)
        for inputs, labels in job.batches():
            steps.stepped(agent.batch_size)  # the step before this one
            steps.train(worker.trainer.model, inputs, labels)
        steps.stepped(agent.batch_size)
    steps.finish()
