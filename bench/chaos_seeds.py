"""Many drawn chaos schedules per training mode: runs with lost or duplicated samples, hung runs,
the faults injected and the time each cost.

Each run is ``antdt chaos --seed N --training MODE --json`` as a user would
start it, in a process group of its own with a wall-clock bound: a run past
it (or one whose harness gave up at its own deadline, naming the shards it
stalled on) counts as hung and is killed whole. Lost and duplicated samples
come from the run's ledgers (the model's own count of every sample), the
faults from the run's record of what it injected. Progress goes to stderr,
one line a run; the report to stdout, and after every run to
``<out>/report.json`` (each run's figures to ``<out>/<mode>-<seed>/``).
Exits 1 if any run did not pass. ``--resume`` keeps the figures of runs already in ``<out>``
(a sweep stopped early, or run in parts, on the same code) and runs only the others.

    python bench/chaos_seeds.py --modes sync,preduce,async --seeds 1-30 --json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchlib import bench_parser, emit, spread

MODES = ("sync", "preduce", "async")
#: A run past this is hung (the harness's own bound for the standard scenario is about 7 minutes).
RUN_BOUND_S = 900.0


def seed_range(text: str) -> list[int]:
    """``1-30`` or ``3,5,8`` -> the seeds."""
    first, dash, last = text.partition("-")
    if dash:
        return list(range(int(first), int(last) + 1))
    return [int(part) for part in text.split(",")]


def run_one(mode: str, seed: int, out: Path, extra: list[str], bound_s: float) -> dict:
    """One chaos run: its figures, with ``outcome`` passed, hung or failed."""
    argv = [sys.executable, "-m", "antdt.cli.main", "chaos", "--json", "--out", str(out)]
    argv += ["--training", mode, "--seed", str(seed), *extra]
    started = time.monotonic()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return {"mode": mode, "seed": seed, "outcome": "hung", "why": f"past {bound_s:g} s"}
    took = round(time.monotonic() - started, 1)
    try:
        figures = json.loads(stdout)
    except json.JSONDecodeError:
        last = (stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        hung = "did not finish within" in stderr
        return {
            "mode": mode,
            "seed": seed,
            "outcome": "hung" if hung else "failed",
            "why": last[:400],
            "exit": process.returncode,
            "took_s": took,
        }
    (out / "figures.json").write_text(stdout)
    return judged(mode, seed, figures, process.returncode == 0, took_s=took)


def kept_run(mode: str, seed: int, out: Path) -> dict | None:
    """A run an earlier sweep left in ``out`` (its figures), or None: hung runs left none."""
    saved = out / "figures.json"
    if not saved.exists():
        return None
    return judged(mode, seed, json.loads(saved.read_text()), True, kept=True)


def judged(mode: str, seed: int, figures: dict, exited_ok: bool, **extra) -> dict:
    """A finished run: passed or failed (with why) by its figures and exit."""
    outcome = "passed" if exited_ok and figures["passed"] else "failed"
    run = {"mode": mode, "seed": seed, "outcome": outcome, **extra, "figures": figures}
    if outcome == "failed":
        run["why"] = why_failed(figures)
    return run


def why_failed(figures: dict) -> str:
    """The first things a failed run's figures say went wrong."""
    reasons = [
        f"{k['action']} {k['target']} at {k['at_s']} s not back"
        for k in figures["killed"]
        if k["lost_s"] is None
    ]
    reasons += figures["ledger"]["findings"][:2]
    if not figures["audit_clean"]:
        reasons.append("audit not clean")
    return "; ".join(reasons) or "exit code"


def summary(runs: list[dict]) -> dict:
    """Per mode: runs, outcomes, lost/duplicated runs by the ledger, faults by kind, time lost."""
    faults: dict[str, int] = {}
    lost_s: dict[str, list[float]] = {}
    lost = duplicated = not_back = 0
    for run in runs:
        figures = run.get("figures")
        if figures is None:
            continue
        for label, n in figures["faults"].items():
            faults[label] = faults.get(label, 0) + n
        for label, seconds in figures["lost_s_by_fault"].items():
            lost_s.setdefault(label, []).extend(seconds)
        lost += figures["ledger"]["never_trained"] > 0
        duplicated += figures["ledger"]["trained_twice"] > 0
        not_back += figures["survived"] < figures["kills"]
    return {
        "runs": len(runs),
        "passed": sum(run["outcome"] == "passed" for run in runs),
        "hung": sum(run["outcome"] == "hung" for run in runs),
        "failed": sum(run["outcome"] == "failed" for run in runs),
        "runs_with_lost_samples": lost,
        "runs_with_duplicated_samples": duplicated,
        "runs_with_a_victim_not_back": not_back,
        "faults": dict(sorted(faults.items())),
        "lost_s_by_fault": {
            label: {"n": len(values), **spread(values, 2)}
            for label, values in sorted(lost_s.items())
        },
        "wall_s": spread([run["figures"]["wall_s"] for run in runs if "figures" in run] or [0.0]),
        "not_passed": [
            {k: run[k] for k in ("seed", "outcome", "why") if k in run}
            for run in runs
            if run["outcome"] != "passed"
        ],
    }


def progress(run: dict) -> str:
    figures = run.get("figures")
    if figures is None:
        return f"{run['mode']} seed {run['seed']}: {run['outcome']} ({run.get('why', '')})"
    ledger = figures["ledger"]
    kept = " (kept from an earlier sweep)" if run.get("kept") else ""
    return (
        f"{run['mode']} seed {run['seed']}: {run['outcome']}{kept} in {figures['wall_s']:.0f} s, "
        f"{figures['survived']}/{figures['kills']} faults back "
        f"({', '.join(f'{n} {k}' for k, n in figures['faults'].items())}), "
        f"lost {ledger['never_trained']}, duplicated {ledger['trained_twice']}"
    )


def main() -> int:
    parser = bench_parser(__doc__, ",".join(MODES))
    parser.add_argument("--seeds", default="1-5", help="1-30, or 3,5,8")
    parser.add_argument("--modes", default=",".join(MODES), help="sync,preduce,async")
    parser.add_argument("--scenario", default="standard")
    parser.add_argument("--faults", type=int, default=None, help="faults per run (antdt's default)")
    parser.add_argument("--bound", type=float, default=RUN_BOUND_S, help="a run past this is hung")
    parser.add_argument("--out", default="reports/chaos-seeds", help="run folders go here")
    parser.add_argument(
        "--resume", action="store_true", help="keep the runs already in --out, run the others"
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"--modes: unknown {', '.join(unknown)} (choose from {', '.join(MODES)})")
    try:
        seeds = seed_range(args.seeds)
    except ValueError:
        parser.error(f"--seeds takes 1-30 or 3,5,8, not {args.seeds!r}")
    extra = ["--scenario", args.scenario]
    if args.faults is not None:
        extra += ["--faults", str(args.faults)]
    by_mode: dict[str, list[dict]] = {}
    out = Path(args.out)
    for mode in modes:
        for seed in seeds:
            folder = out / f"{mode}-{seed}"
            run = (args.resume and kept_run(mode, seed, folder)) or run_one(
                mode, seed, folder, extra, args.bound
            )
            print(progress(run), file=sys.stderr, flush=True)
            by_mode.setdefault(mode, []).append(run)
            report = {
                "command": " ".join(sys.argv),
                "seeds": seeds,
                "scenario": args.scenario,
                "modes": {mode: summary(runs) for mode, runs in by_mode.items()},
            }
            # so far, for a sweep stopped early
            (out / "report.json").write_text(json.dumps(report, indent=2))
    emit(report, args.json)
    return 0 if all(s["passed"] == s["runs"] for s in report["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
