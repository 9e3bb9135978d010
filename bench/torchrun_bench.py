"""A user's own script under torchrun: plain DDP against antdt, healthy and with one rank slowed.

Runs ``bench/user_job.py`` (an MLP written once as plain DDP with
``DistributedSampler`` and once through ``ElasticJob``) under
``torchrun --standalone`` with no ``--max-restarts``, as a script author
would. antdt runs get ``antdt up --policy antdt-dd``, started fresh for each
run: the embedded broker's CPU grows with its log (issue 38), and a bus
carried from run to run would measure that, not the job. Plain DDP runs get
no bus at all.

``--modes`` picks what is compared with plain DDP: ``dd`` (the script
through ``ElasticJob``), ``preduce`` (through ``PartialReduceJob``, with
``antdt up --mode preduce``: the grouper too), ``ps`` (through
``ParameterServerJob``, with ``antdt up --mode async``: the job's parameter
server; its ledger read from the server's files), ``hook`` (plain DDP with
antdt's communication hook alone, no bus) and ``beside`` (plain DDP with
``antdt up`` idle beside it: what the services cost the ranks by sharing
their cores), and ``lightning-dd`` (the model fitted by Lightning's
``Trainer`` with ``AntdtStrategy``), compared with Lightning's own DDP
instead of plain DDP, and ``hf-dd`` (transformers' ``Trainer`` as
``AntdtTrainer``), compared with transformers' own ``Trainer``.

Each (mode, health) is run ``--repeat`` times, in rounds that run every mode
once in turn (round ``k`` from its ``k``-th mode on, so that none always runs
first), so that the machine's drift within an hour falls on both sides of a
ratio; the JSON gives the training
time (rank 0: process group up to the end, set-up included) as median, min
and max, the CPU seconds the job's processes used (torchrun and its ranks,
start to exit: ``job_cpu_s``) and, for modes with ``antdt up``, those its
services and broker used meanwhile (``services_cpu_s``, and by process:
``services_cpu_by_process_s``): on a machine whose
cores the ranks fill, every CPU second beside the ranks' compute is time
they wait for a core (docs/torchrun.md); the overhead of each antdt mode
over plain DDP healthy and its speedup with the slowed rank (the ratio of
the medians, and ``paired_overhead`` / ``paired_speedup``: each round's
pair's ratio as median, min and max); and each run's
exit code and, for antdt runs, whether its ledger is all ones. A run that
fails (an exit code other than 0, or a sample not trained exactly once)
fails the benchmark (exit 1), and so does a figure past the targets given;
but a plain DDP run that finished training and then aborted at exit (torch
and gloo's teardown, "terminate called without an active exception", seen in
1 of 16 plain runs here) is counted in ``aborted_at_exit`` and timed: it is
the baseline users get (antdt's own runs must exit 0).

    python bench/torchrun_bench.py --ranks 2 --repeat 3 --json
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchlib import Bus, antdt_up, bench_parser, numbers, spread

HERE = Path(__file__).parent
SCRIPT = HERE / "user_job.py"
#: The bench's modes that run with ``antdt up`` (the others get no bus): ``beside`` is plain DDP
#: with antdt's services idle beside it, their share of the cores measured alone.
NEEDS_BUS = {
    "dd",
    "preduce",
    "ps",
    "beside",
    "lightning-dd",
    "hf-dd",
    "lightning-beside",
    "hf-beside",
}
#: The user script's mode for each bench mode (the same name, unless here).
SCRIPT_MODE = {"beside": "plain", "lightning-beside": "lightning", "hf-beside": "hf"}
MODES = {"dd", "preduce", "ps", "hook", *NEEDS_BUS}
#: What each mode is compared with: what its users would otherwise run (``plain``: torch's DDP with
#: ``DistributedSampler``, unless here).
BASELINE = {
    "lightning-dd": "lightning",
    "hf-dd": "hf",
    "lightning-beside": "lightning",
    "hf-beside": "hf",
}
#: ``antdt up``'s options for each bench mode (``--mode sync`` unless here): partial reduce needs
#: the grouper, asynchronous training the job's parameter server (SGD as the script's optimizer).
UP_OPTIONS = {
    "preduce": ["--mode", "preduce"],
    "ps": ["--mode", "async", "--ps-lr", "0.05", "--ps-momentum", "0.9"],
}
#: How long the servers may take to write the last epoch's ledger once the job has ended.
LEDGER_WITHIN_S = 30.0


def children_cpu_s() -> float:
    """CPU seconds of this process's waited-for descendants (a torchrun and its ranks, once
    exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_job(mode: str, ranks: int, args, slow: bool, workdir: Path, env: dict, bus: Bus) -> dict:
    """One torchrun of the user script; its rank 0's figures and the CPU used, or the failure."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        str(SCRIPT),
        "--mode",
        SCRIPT_MODE.get(mode, mode),
        "--samples",
        str(args.samples),
        "--hidden",
        str(args.hidden),
        "--batch-size",
        str(args.batch_size),
        "--sizing",
        args.sizing,
        "--checkpoint",
        str(workdir / f"{uuid.uuid4().hex[:8]}.pt"),
    ]
    if slow:
        command += ["--slow-rank", "1", "--slow-factor", str(args.slow_factor)]
    began, job_cpu, bus_cpu = time.perf_counter(), children_cpu_s(), bus.cpu_s()
    each_before = bus.cpu_by_process()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=args.run_limit_s, cwd=workdir
    )
    wall_s = time.perf_counter() - began
    cpu = {"job_cpu_s": round(children_cpu_s() - job_cpu, 2)}
    if bus_cpu is not None:
        cpu["services_cpu_s"] = round(bus.cpu_s() - bus_cpu, 2)
        each_after = bus.cpu_by_process()
        cpu["services_cpu_by_process_s"] = {
            name: round(each_after[name] - each_before[name], 2)
            for name in sorted(each_after.keys() & each_before.keys())
        }
    figures = [line for line in done.stdout.splitlines() if line.startswith('{"train_s"')]
    run = {"exit": done.returncode, "finished": bool(figures), "wall_s": round(wall_s, 2), **cpu}
    if figures:
        run |= json.loads(figures[-1])
    # an antdt run also proves exactly once (its ledger); a plain run cannot
    run["ok"] = done.returncode == 0 and bool(figures) and run.get("ledger_all_ones", True)
    if not run["ok"]:
        run["tail"] = (done.stdout + done.stderr).strip().splitlines()[-8:]
    return run


def run_once(mode: str, ranks: int, slow: bool, args, workdir: Path) -> dict:
    """One run of ``mode``: with a fresh ``antdt up`` for the modes that need the bus."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANTDT_")}
    base["OMP_NUM_THREADS"] = "1"
    if mode not in NEEDS_BUS:
        return progress(run_job(mode, ranks, args, slow, workdir, base, Bus({})), mode)
    logs = workdir / f"up-{uuid.uuid4().hex[:6]}"
    job = f"bench-{uuid.uuid4().hex[:8]}"
    options = UP_OPTIONS.get(mode, ["--mode", "sync"])
    if mode == "ps":
        options = [*options, "--job", job]  # the servers serve this job
    with antdt_up(logs, ["--policy", "antdt-dd", *options]) as bus:
        environment = base | bus.exports | {"ANTDT_JOB_ID": job}
        run = run_job(mode, ranks, args, slow, workdir, environment, bus)
        if mode == "ps" and run["finished"]:  # the servers' ledger: exactly once
            run["ledger_all_ones"] = servers_ledger(logs / "ledger")
            run["ok"] = run["ok"] and run["ledger_all_ones"]
    return progress(run, mode)


def interleaved(modes: list[str], ranks: int, slow: bool, args, workdir: Path) -> dict[str, list]:
    """``--repeat`` rounds, each running every mode once in turn: this machine's speed drifts by
    more than 10 % within an hour, and a baseline's runs all taken before or after the compared
    ones would carry that drift into the ratio; in turns, run ``k`` of each mode meets the same
    hour. Round ``k`` starts ``k`` modes further on, so that no mode always runs first (right
    after another mode's teardown) or last."""
    runs: dict[str, list] = {mode: [] for mode in modes}
    for k in range(args.repeat):
        shift = k % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            runs[mode].append(run_once(mode, ranks, slow, args, workdir))
    return runs


def summary(mode: str, ranks: int, slow: bool, runs: list[dict]) -> dict:
    """One mode's runs as median, min and max, with its failures counted."""
    times = [r["train_s"] for r in runs if r["finished"]]
    return {
        "mode": mode,
        "ranks": ranks,
        "slowed": slow,
        "train_s": spread(times) if times else None,
        **cpu_spreads(runs),
        "failed": sum(not r["ok"] for r in runs),
        "aborted_at_exit": sum(r["finished"] and not r["ok"] for r in runs),
        "runs": runs,
    }


def compare(ours: dict, plain: dict, slow: bool) -> tuple[str, float] | None:
    """The overhead (healthy) or speedup (slowed) of ``ours`` over its baseline, as the ratio of
    the medians; the ratios of each round's pair go beside it (``paired_<name>``: median, min
    and max), which a drift between rounds does not move. None if either has no time."""
    if not (plain["train_s"] and ours["train_s"]):
        return None
    name = "speedup" if slow else "overhead"

    def figure(ours_s: float, plain_s: float) -> float:
        return plain_s / ours_s if slow else ours_s / plain_s

    value = round(figure(ours["train_s"]["median"], plain["train_s"]["median"]), 3)
    ours[name] = value
    pairs = [
        figure(o["train_s"], p["train_s"])
        for o, p in zip(ours["runs"], plain["runs"])
        if o["finished"] and p["finished"]
    ]
    if pairs:
        ours[f"paired_{name}"] = spread(pairs)
    return name, value


def progress(run: dict, mode: str) -> dict:
    """``run``, after a line on stderr saying how it went (a run of minutes shows it moves)."""
    print(f"{mode}: exit {run['exit']}, train {run.get('train_s')} s", file=sys.stderr, flush=True)
    return run


def cpu_spreads(runs: list[dict]) -> dict:
    """Median, min and max of each CPU figure the runs have; the services' also by process (the
    broker, each service), which is where the cores a healthy run shares with them go."""
    spreads = {
        key: spread([r[key] for r in runs])
        for key in ("job_cpu_s", "services_cpu_s")
        if runs and all(key in r for r in runs)
    }
    each = [r.get("services_cpu_by_process_s") or {} for r in runs]
    names = set.intersection(*(set(e) for e in each)) if each else set()
    if names:
        spreads["services_cpu_by_process_s"] = {
            name: spread([e[name] for e in each]) for name in sorted(names)
        }
    return spreads


def servers_ledger(ledger: Path, epochs: int = 1) -> bool:
    """Whether every shard's ledger is all ones, once the servers have written every epoch's
    (within ``LEDGER_WITHIN_S``; the user job trains one epoch)."""
    import numpy as np

    def written() -> list[Path]:
        shards = sorted(ledger.glob("ps-*"))
        paths = [shard / f"ledger-epoch{e}.npy" for shard in shards for e in range(epochs)]
        return paths if shards and all(p.exists() for p in paths) else []

    deadline = time.monotonic() + LEDGER_WITHIN_S
    while not (paths := written()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return bool(paths) and all((np.load(p) == 1).all() for p in paths)


def failures(result: dict) -> int:
    """Runs that count against the benchmark: any failed antdt run; a run of a framework's own DDP
    (a baseline, or one with ``antdt up`` idle beside it) only if it did not finish training
    (torch's own abort at exit is reported, not ours to fail on)."""
    if SCRIPT_MODE.get(result["mode"], result["mode"]) in ("plain", *BASELINE.values()):
        return result["failed"] - result["aborted_at_exit"]
    return result["failed"]


def main() -> int:
    parser = bench_parser(__doc__, "healthy,slow")
    parser.add_argument("--ranks", default="2", help="comma-separated world sizes")
    parser.add_argument(
        "--modes",
        default="dd",
        help="modes to compare with plain DDP: dd, preduce (partial reduce), hook (its all-reduce "
        "alone), beside (plain DDP with antdt up idle beside it); lightning-dd (AntdtStrategy), "
        "hf-dd (AntdtTrainer), lightning-beside and hf-beside (the framework's own DDP with antdt "
        "up idle beside it) are compared with their framework's own DDP",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=96_000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank, at the start")
    parser.add_argument(
        "--sizing",
        default="commands",
        choices=["commands", "in-band"],
        help="dd's batch sizing: the controller's commands, or in-band (ElasticJob sizing)",
    )
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--run-limit-s", type=float, default=900.0)
    parser.add_argument("--max-overhead", type=float, default=None, help="fail above this")
    parser.add_argument("--min-speedup", type=float, default=None, help="fail below this")
    parser.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="run only the antdt modes (long runs that check that every run finishes)",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/antdt-torchrun-bench"))
    args = parser.parse_args()
    ranks_list = numbers(parser, "--ranks", args.ranks)
    unknown = set(args.modes.split(",")) - MODES
    if unknown:
        parser.error(f"--modes takes {', '.join(sorted(MODES))}, not {', '.join(sorted(unknown))}")
    parts = args.only.split(",")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results, verdicts = [], []
    antdt_modes = args.modes.split(",")
    for ranks in ranks_list:
        for slow in [False, True]:
            if ("slow" if slow else "healthy") not in parts:
                continue
            baselines = [BASELINE.get(m, "plain") for m in antdt_modes] if args.baseline else []
            order = list(dict.fromkeys([*baselines, *antdt_modes]))
            runs = interleaved(order, ranks, slow, args, args.workdir)
            summaries = {mode: summary(mode, ranks, slow, runs[mode]) for mode in order}
            results.extend(summaries.values())
            for mode in antdt_modes if args.baseline else []:
                compared = compare(summaries[mode], summaries[BASELINE.get(mode, "plain")], slow)
                if compared is None:
                    continue
                name, value = compared
                limit = args.min_speedup if slow else args.max_overhead
                if limit is not None and (value < limit if slow else value > limit):
                    verdicts.append(f"{mode} {ranks} ranks: {name} {value} (limit {limit})")
    failed = [
        f"{r['mode']} {r['ranks']} ranks: {failures(r)} failed" for r in results if failures(r)
    ]
    report = {
        "settings": {
            "samples": args.samples,
            "hidden": args.hidden,
            "batch_size": args.batch_size,
            "sizing": args.sizing,
            "slow_factor": args.slow_factor,
            "repeat": args.repeat,
            "order": "interleaved: each round runs every mode once, round k from the k-th on",
            "cores": os.cpu_count(),
        },
        "results": results,
        "ok": not (failed or verdicts),
        "problems": failed + verdicts,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for r in results:
            extra = {k: r[k] for k in ("overhead", "speedup") if k in r}
            print(r["mode"], r["ranks"], "slow" if r["slowed"] else "healthy", r["train_s"], extra)
        for problem in report["problems"]:
            print("FAILED:", problem)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
