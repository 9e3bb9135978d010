"""How partial-reduce groups exchange their models: point to point, pre-created subgroups, or a
group per step.

Spawns WORLD gloo ranks on this machine. Every round, the ranks split into
disjoint groups of P (a fresh random split, as first-come-first-served
grouping gives) and each group averages a model of N floats:

* ``p2p``: members send to the leader, which averages and sends back
  (:class:`antdt.worker.preduce.averaging.GroupAverager`, what antdt uses);
* ``subgroups``: one process group per possible group, created up front
  (C(WORLD, P) of them), an all-reduce inside the group's own;
* ``new_group``: a process group created for each group as it forms.
  ``torch.distributed.new_group`` must be called by every rank of the job,
  so this is a global barrier per round, which is what partial reduce avoids.

Reports per method the median, min and max seconds per round (on rank 0)
and the set-up time. ``--json`` for JSON.

    .venv/bin/python bench/preduce_exchange_bench.py --json
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from antdt.schemas.models import GroupFormed, GroupReason
from antdt.schemas.types import utc_now
from antdt.worker.preduce.averaging import GroupAverager


def splits(world: int, size: int, rounds: int, seed: int) -> list[list[list[int]]]:
    """Per round, a random split of the ranks into groups of ``size`` (the last may be smaller)."""
    rng = random.Random(seed)
    result = []
    for _ in range(rounds):
        ranks = list(range(world))
        rng.shuffle(ranks)
        result.append([sorted(ranks[i : i + size]) for i in range(0, world, size)])
    return result


def mine(groups: list[list[int]], rank: int) -> list[int]:
    return next(g for g in groups if rank in g)


def p2p_round(averager: GroupAverager, groups: list[list[int]], rank: int, round_id: int) -> None:
    members = mine(groups, rank)
    averager.average(
        GroupFormed(
            job_id="bench",
            worker_id=f"w{rank}",
            group_id=round_id,
            generation=0,
            reason=GroupReason.QUORUM,
            members=[f"w{r}" for r in members],
            ranks=members,
            in_reply_to=1,
            waited_ms=0,
            timestamp=utc_now(),
        )
    )


def rank_main(
    rank: int, world: int, size: int, floats: int, rounds: int, init: str, out: str
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    model = torch.nn.Linear(floats, 1, bias=False)
    plan = splits(world, size, rounds, seed=7)
    times: dict[str, list[float]] = {}
    setup: dict[str, float] = {}

    averager = GroupAverager(model)
    dist.barrier()
    times["p2p"] = timed(lambda i: p2p_round(averager, plan[i], rank, i), rounds)

    began = time.perf_counter()
    everyone = {
        tuple(g): dist.new_group(list(g))
        for n in {size, world % size} - {0}
        for g in itertools.combinations(range(world), n)
    }
    setup["subgroups"] = time.perf_counter() - began
    flat = torch.zeros(floats)
    times["subgroups"] = timed(
        lambda i: dist.all_reduce(flat, group=everyone[tuple(mine(plan[i], rank))]), rounds
    )

    def fresh(i: int) -> None:
        # every rank must create every group
        handles = {tuple(g): dist.new_group(g) for g in plan[i]}
        dist.all_reduce(flat, group=handles[tuple(mine(plan[i], rank))])

    times["new_group"] = timed(fresh, rounds)
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "setup": setup}))
    dist.destroy_process_group()


def timed(round_fn, rounds: int) -> list[float]:
    dist.barrier()
    spent = []
    for i in range(rounds):
        began = time.perf_counter()
        round_fn(i)
        spent.append(time.perf_counter() - began)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument(
        "--floats", type=int, default=2762, help="model size (the demo's MLP has 2,762 parameters)"
    )
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        mp.spawn(
            rank_main,
            args=(
                args.world,
                args.group_size,
                args.floats,
                args.rounds,
                str(Path(tmp) / "init"),
                str(out),
            ),
            nprocs=args.world,
            join=True,
        )
        measured = json.loads(out.read_text())
    report = {
        "world": args.world,
        "group_size": args.group_size,
        "floats": args.floats,
        "rounds": args.rounds,
        "seconds_per_round": {
            name: {
                "median": round(statistics.median(v), 5),
                "min": round(min(v), 5),
                "max": round(max(v), 5),
            }
            for name, v in measured["times"].items()
        },
        "setup_s": {name: round(v, 3) for name, v in measured["setup"].items()},
    }
    print(json.dumps(report, indent=2) if args.json else report, flush=True)


if __name__ == "__main__":
    main()
