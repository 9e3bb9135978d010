"""A demo worker's partial-reduce training: the user's loop over the public
:class:`~antdt.worker.preduce.job.PartialReduceJob`.

Each rank trains its own replica; the job commits each step's samples,
then averages the replica with the group the grouper forms, takes the
grouper's checkpoints and ends in the FINAL group of every rank. The demo
adds what it adds to the synchronous loop (:class:`~antdt.demo.training_sync.DemoSteps`:
pacing, the phase file, the step trace, rank 0's snapshots); a broken
group restarts as there (exit 77, a new generation restores the job's
checkpoint).
"""

from __future__ import annotations

from antdt.demo.training_sync import DemoSteps, job_options, run_in_group
from antdt.settings import Settings
from antdt.worker.agent import Agent
from antdt.worker.preduce.job import PartialReduceJob

CHECKPOINT = "preduce-checkpoint.pt"


def run_preduce(worker, settings: Settings, started: float) -> None:
    run_in_group(worker, settings, started, lambda agent: train_preduce(worker, agent))


def train_preduce(worker, agent: Agent) -> None:
    trainer = worker.trainer
    with PartialReduceJob(
        trainer.model,
        trainer.optimizer,
        worker.source,
        generation=worker.args.generation,
        **job_options(worker, agent, CHECKPOINT),
    ) as job:
        steps = DemoSteps(worker, agent)
        for inputs, labels in job.batches():
            steps.stepped(agent.batch_size)  # the step before this one
            steps.train(trainer.model, inputs, labels)
        steps.stepped(agent.batch_size)
    print(
        f"generation {worker.args.generation}: rank {worker.rank}: {agent.step_count} steps, "
        f"groups {job.reasons}",
        flush=True,
    )
    steps.finish()
