"""The parameter-server client against the real sharder and broker: a commit whose answer is lost is
asked again."""

from __future__ import annotations

from antdt.schemas.models import AssignmentStatus, DatasetSpec
from antdt.schemas.models import ShardTransition as T
from antdt.worker import Agent
from antdt.worker.example import make_model
from antdt.worker.ps.client import ParameterClient
from tests.services.sharder.harness import job_log, running_sharder

SPEC = DatasetSpec(
    name="lost", size=64, shard_size=16, epochs=1, shuffle_seed=1, max_attempts=3, lease_s=30
)


def test_a_commit_whose_answer_was_lost_is_asked_again_and_recorded_once(settings, topics):
    settings = settings.model_copy(update={"job_id": "job-lost-answer"})
    with (
        running_sharder(settings),
        Agent(settings=settings, worker_id="w0", listen_for_commands=False) as agent,
    ):
        data = agent.shards(list(range(SPEC.size)), SPEC, shuffle=False)
        samples = iter(agent.iterate(data))
        for _ in range(8):
            next(samples)
        pending = agent.committer.request(agent.take_tags(), "w0/update-1")
        # the answer arrives, and nobody is told: as if lost
        agent.shard_client.wait_answer(pending.seq, 10.0)
        client = ParameterClient(
            agent, ["127.0.0.1:9"], make_model(), timeout_s=30, answer_timeout_s=1.0
        )
        client._outstanding.append(pending)
        answer = client._wait_for(pending)  # the first wait runs out; the commit is sent again
        data.close()
    assert answer.status is AssignmentStatus.GRANTED and client._outstanding[0].seq != pending.seq
    applied = [e for e in job_log(settings, settings.job_id) if e.transition is T.APPLIED]
    assert [e.update_id for e in applied] == ["w0/update-1"]  # recorded once, not twice
    assert sum(len(c.samples) for c in applied[0].commits) == 8
