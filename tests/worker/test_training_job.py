"""What every mode's set-up shares: its collectives are watched, so a rank that stops there ends
its peers' wait in seconds rather than the process group's timeout. Real gloo groups and a real
store's heartbeats (the modes themselves: elastic/, preduce/)."""

from __future__ import annotations

import os
import signal
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

from antdt.worker import training_job
from antdt.worker.ddp import broadcast_int
from antdt.worker.training_job import TrainingJob
from tests.worker.groups import join_gloo, rank_0_outcome


def set_up_main(rank: int, init_file: str, out_dir: str, fault: str) -> None:
    """Both ranks run one set-up collective through a job's own path (the rest of the job stood
    in); with ``fault`` ``stop`` rank 1 sends itself SIGSTOP first. Unstepped waits are questioned
    after 1 s here (120 s by default)."""
    join_gloo(init_file, rank)
    outcome = Path(out_dir) / f"rank-{rank}.txt"
    training_job.UNSTEPPED_LIMIT_S = 1.0
    job = TrainingJob.__new__(TrainingJob)
    job.agent, job.peers, job.watch = SimpleNamespace(sync_wait=nullcontext), None, None
    job._end_broken = lambda exc: (outcome.write_text(str(exc)), os._exit(0))
    job._watch_peers()
    if rank == 1 and fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    agreed = job._set_up(lambda: broadcast_int(7 + rank))
    outcome.write_text(f"agreed {agreed}")
    job.peers.close()
    os._exit(0)


def test_a_rank_stopped_in_the_set_up_ends_its_peers_wait_naming_it(tmp_path: Path):
    message = rank_0_outcome(set_up_main, tmp_path, "stop")
    assert message.startswith("set-up waited"), message
    assert "rank(s) 1 stopped beating: dead or stopped" in message
