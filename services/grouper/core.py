"""The grouper's decisions, without Kafka: which ready workers average their models together, and
when.

Per job, workers announce readiness after each local step
(:class:`~antdt.schemas.models.GroupReady`). :class:`GroupFormer` keeps them
in arrival order and forms a group

* of the first ``group_size`` (P) ready workers (QUORUM), first come first served;
* of whoever waits once the first of them has waited ``deadline_s``
  (DEADLINE; a group of one means "go on without averaging"), so nobody
  waits for ever for peers that are busy;
* of whoever waits when every worker that could still come is waiting
  (NO_MORE: the others have no data left);
* of every rank, every ``checkpoint_every_s`` (CHECKPOINT: the models are
  averaged over all ranks and saved) and when every rank has run out of
  data (FINAL). While a checkpoint is due no partial group is formed.

Groups never mix generations of a job's process group: an announcement
from a newer generation (the group was restarted) drops everything waiting
from the older one, and older announcements are ignored.

A rank that announces again the step its group was formed for never got its
group (the record was lost: a bus reset failed its delivery); it is answered
again with the same group (``resent_to``), not grouped twice, or it would
wait for an answer that never comes.

State machine of one rank, per generation::

    (not waiting) --ready--> WAITING --group formed--> (not waiting)
    (not waiting) --ready(finished)--> FINISHED --FINAL--> (not waiting)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from antdt.control.topic import refuse_broken
from antdt.schemas.models import WHOLE_GROUP_REASONS, GroupReady, GroupReason


@dataclass(frozen=True)
class GrouperConfig:
    """P, how long the first of a group may wait for the others, and how often every rank
    checkpoints."""

    group_size: int = 2
    deadline_s: float = 0.05
    checkpoint_every_s: float = 60.0  # 0: no checkpoints

    def __post_init__(self) -> None:
        refuse_broken(
            "grouper config",
            (
                (self.group_size < 2, "group_size must be >= 2"),
                (self.deadline_s < 0, "deadline_s must be >= 0"),
                (self.checkpoint_every_s < 0, "checkpoint_every_s must be >= 0"),
            ),
        )


@dataclass(frozen=True)
class Waiting:
    """A rank's announcement, as the grouper holds it until its group forms."""

    rank: int
    worker_id: str
    incarnation: str
    seq: int
    since: float
    finished: bool


@dataclass(frozen=True)
class Formed:
    """A group: its id, generation, why, and its members in rank order."""

    job_id: str
    group_id: int
    generation: int
    reason: GroupReason
    members: tuple[Waiting, ...]
    at: float
    resent_to: int | None = None  # a rank's record sent again: only this rank's

    @property
    def ranks(self) -> list[int]:
        return [m.rank for m in self.members]


@dataclass
class JobGroups:
    """One job's waiting ranks and the time of its last whole-group average."""

    generation: int
    world: int
    last_whole_at: float
    waiting: dict[int, Waiting] = field(default_factory=dict)  # insertion order is arrival order
    last_group: dict[int, Formed] = field(default_factory=dict)  # rank -> its last group
    next_id: int = 1

    def last_grouped(self, rank: int) -> Waiting | None:
        """The rank's announcement its last group answered (incarnation and seq), if any."""
        group = self.last_group.get(rank)
        return next(m for m in group.members if m.rank == rank) if group else None


class GroupFormer:
    """Forms every job's groups. Time is passed in (seconds, any monotonic clock)."""

    def __init__(self, config: GrouperConfig | None = None, first_id: int = 1):
        """``first_id``: the first group id of a job (a restarted grouper starts above its
        predecessor's)."""
        self.config = config or GrouperConfig()
        self.first_id = first_id
        self.jobs: dict[str, JobGroups] = {}
        self.ignored = 0  # announcements of an older generation

    def ready(self, event: GroupReady, now: float) -> list[Formed]:
        """Take one announcement; the groups it completes."""
        job = self.jobs.get(event.job_id)
        if job is None or event.generation > job.generation:
            job = self.jobs[event.job_id] = JobGroups(
                event.generation,
                event.world_size,
                now,
                next_id=job.next_id if job else self.first_id,
            )
        elif event.generation < job.generation:
            self.ignored += 1
            return []
        if self._already_grouped(job, event):
            return self._answer_again(job, event)
        job.world = event.world_size
        previous = job.waiting.get(event.rank)
        if previous is None or (previous.incarnation, previous.seq) != (
            event.incarnation,
            event.seq,
        ):
            # sent again, an announcement keeps its place in the queue
            job.waiting.pop(event.rank, None)
            job.waiting[event.rank] = Waiting(
                event.rank, event.worker_id, event.incarnation, event.seq, now, event.finished
            )
        return self._form(event.job_id, job, now)

    @staticmethod
    def _already_grouped(job: JobGroups, event: GroupReady) -> bool:
        """An announcement sent again after its group formed (its answer was slow to arrive): not a
        new one."""
        grouped = job.last_grouped(event.rank)
        return (
            grouped is not None
            and grouped.incarnation == event.incarnation
            and event.seq <= grouped.seq
        )

    @staticmethod
    def _answer_again(job: JobGroups, event: GroupReady) -> list[Formed]:
        """The group of the rank's last grouped step, for that rank only; nothing for an older step
        or while the rank waits for a newer one (it has moved on: the announcement was slow)."""
        if event.seq != job.last_grouped(event.rank).seq or event.rank in job.waiting:
            return []
        return [replace(job.last_group[event.rank], resent_to=event.rank)]

    def tick(self, now: float) -> list[Formed]:
        """The groups whose deadline or checkpoint time has come."""
        return [
            formed for job_id, job in self.jobs.items() for formed in self._form(job_id, job, now)
        ]

    def _form(self, job_id: str, job: JobGroups, now: float) -> list[Formed]:
        whole = self._whole(job, now)
        if whole is not None:
            return [self._group(job_id, job, list(job.waiting.values()), whole, now)]
        if self._checkpoint_due(job, now):
            return []  # everyone gathers for it
        formed = []
        candidates = [w for w in job.waiting.values() if not w.finished]
        while len(candidates) >= self.config.group_size:
            formed.append(
                self._group(
                    job_id, job, candidates[: self.config.group_size], GroupReason.QUORUM, now
                )
            )
            candidates = candidates[self.config.group_size :]
        if candidates:
            still_coming = job.world - sum(1 for w in job.waiting.values() if w.finished)
            if len(candidates) == still_coming:
                formed.append(self._group(job_id, job, candidates, GroupReason.NO_MORE, now))
            elif now - candidates[0].since >= self.config.deadline_s:
                formed.append(self._group(job_id, job, candidates, GroupReason.DEADLINE, now))
        return formed

    def _whole(self, job: JobGroups, now: float) -> GroupReason | None:
        """FINAL or CHECKPOINT when every rank is waiting for it, else None."""
        if len(job.waiting) < job.world:
            return None
        if all(w.finished for w in job.waiting.values()):
            return GroupReason.FINAL
        return GroupReason.CHECKPOINT if self._checkpoint_due(job, now) else None

    def _checkpoint_due(self, job: JobGroups, now: float) -> bool:
        every = self.config.checkpoint_every_s
        return (
            bool(every)
            and now - job.last_whole_at >= every
            and not any(w.finished for w in job.waiting.values())
        )

    def _group(
        self, job_id: str, job: JobGroups, members: list[Waiting], reason: GroupReason, now: float
    ) -> Formed:
        for member in members:
            del job.waiting[member.rank]
        if reason in WHOLE_GROUP_REASONS:
            job.last_whole_at = now
        formed = Formed(
            job_id,
            job.next_id,
            job.generation,
            reason,
            tuple(sorted(members, key=lambda m: m.rank)),
            now,
        )
        job.next_id += 1
        for member in members:
            job.last_group[member.rank] = formed
        return formed
