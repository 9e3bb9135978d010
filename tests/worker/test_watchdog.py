"""The watchdog bounds DDP's waits inside backward(): a slow but beating rank is waited for, a
stopped one ends its peers' wait naming it. Real gloo groups, DDP with antdt's hook, a real
store's heartbeats (the rule itself: test_liveness.py)."""

from __future__ import annotations

import datetime
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from antdt.worker.ddp_hook import WeightedReduce
from antdt.worker.liveness import PeerLiveness
from antdt.worker.watchdog import StepWatch
from tests.waiting import wait_until
from tests.worker.groups import join_gloo, rank_0_outcome


def rank_main(rank: int, init_file: str, out_dir: str, fault: str) -> None:
    """Rank 1 misbehaves before its backward pass at step 3 (``fault``: ``slow`` sleeps 3 s,
    ``stop`` sends itself SIGSTOP); the watch's limit is 1 s, its cap on live ranks 2 s, but step
    3's wait has none (as the set-up's: a long checkpoint load); a silent rank is one that did
    not beat for 3 s."""
    join_gloo(init_file, rank)
    outcome = Path(out_dir) / f"rank-{rank}.txt"

    def hung(reason: str) -> None:
        outcome.write_text(reason)
        os._exit(0)  # the group is unusable: no collective clean-up

    peers = PeerLiveness.of_default_group(interval_s=0.2)
    watch = StepWatch(peers, limit_s=lambda: 1.0, on_hung=hung, cap_s=2.0)
    ddp = DistributedDataParallel(torch.nn.Linear(4, 2))
    reduce = WeightedReduce(ddp)
    reduce.prime(3)
    for step in range(6):
        watch.waiting(f"step {step}", cap_s=math.inf if step == 3 else None)
        reduce.begin(3)
        loss = ddp(torch.ones(3, 4)).sum()
        if rank == 1 and step == 3:
            if fault == "slow":
                time.sleep(3.0)
            else:
                os.kill(os.getpid(), signal.SIGSTOP)
        loss.backward()
        reduce.sums()
        watch.done()
    outcome.write_text("finished")
    peers.close()
    os._exit(0)


def run_pair(tmp_path: Path, fault: str) -> str:
    return rank_0_outcome(rank_main, tmp_path, fault)


def test_a_rank_slow_inside_the_step_but_beating_is_waited_for_past_the_watch_s_cap(tmp_path: Path):
    assert run_pair(tmp_path, "slow") == "finished"


def test_a_rank_stopped_before_its_backward_ends_the_wait_naming_it(tmp_path: Path):
    message = run_pair(tmp_path, "stop")
    assert message.startswith("step 3 waited"), message
    assert "rank(s) 1 stopped beating: dead or stopped" in message


STORE_HOST = """
import sys, time, datetime
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=60))
print(store.port, flush=True)
time.sleep(120)
"""


def test_a_store_whose_host_stopped_does_not_silence_the_watch():
    """The heartbeats wait on the store (up to the group's timeout: 60 s here); the watch's checks
    do not, so a stopped store's host (rank 0's, without torchrun's agent) reads as every peer
    silent and the wait ends past its limit."""
    host = subprocess.Popen([sys.executable, "-c", STORE_HOST], stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())
        store = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
        )
        peers = PeerLiveness(store, rank=0, world=2, interval_s=0.1).start()
        verdicts: list[str] = []
        watch = StepWatch(peers, limit_s=lambda: 0.5, on_hung=verdicts.append)
        watch.waiting("step 1")
        os.kill(host.pid, signal.SIGSTOP)
        wait_until(lambda: verdicts, timeout_s=20)
        assert verdicts[0].startswith("step 1 waited"), verdicts
        assert "rank(s) 1 stopped beating" in verdicts[0]
    finally:
        host.kill()
        host.wait()
    peers.close()  # its beat, blocked on the stopped host, ends with the host
