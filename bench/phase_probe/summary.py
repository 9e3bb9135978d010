"""The phase probe's files summed: per mode, each phase's CPU and wall microseconds per call.

    python bench/phase_probe/summary.py DIR [--json]

``DIR`` holds what ``bench/phase_probe/sitecustomize.py`` wrote; each figure is
the median over the files of a mode (every rank of every run), with its min
and max; beside the phases, the main thread's CPU seconds and its wait for a
core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def _phase(runs: list[dict], label: str) -> dict:
    """A phase's CPU and wall microseconds a call, spread over the files that timed it."""
    timed = [run["phases"][label] for run in runs if label in run["phases"]]
    return {key: spread([times[key] for times in timed]) for key in ("cpu_us", "wall_us")}


def summarise(folder: Path) -> dict:
    """Per mode: its files, and per phase the spread of its CPU and wall microseconds a call."""
    by_mode: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*.json")):
        figures = json.loads(path.read_text())
        by_mode[figures["mode"]].append(figures)
    summary = {}
    for mode, runs in by_mode.items():
        labels = dict.fromkeys(label for run in runs for label in run["phases"])
        summary[mode] = {
            "files": len(runs),
            "phases": {label: _phase(runs, label) for label in labels},
            **_main_thread(runs),
        }
    return summary


def _main_thread(runs: list[dict]) -> dict:
    """The main thread's CPU seconds and its wait for a core (where the probe could read it),
    spread over the files."""
    figures = {"main_cpu_s": spread([run["main_cpu_s"] for run in runs])}
    waits = [run["main_core_wait_s"] for run in runs if run.get("main_core_wait_s") is not None]
    if waits:
        figures["main_core_wait_s"] = spread(waits)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    summary = summarise(args.folder)
    if not summary:
        print(f"no probe files in {args.folder}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    for mode, figures in summary.items():
        print(f"{mode} ({figures['files']} ranks' files): phase, CPU us a call, wall us a call")
        for key, what in (("main_cpu_s", "CPU"), ("main_core_wait_s", "wait for a core")):
            if key in figures:
                value = figures[key]
                print(
                    f"  main thread's {what}, s: {value['median']} ({value['min']}-{value['max']})"
                )
        for label, times in figures["phases"].items():
            cpu, wall = times["cpu_us"], times["wall_us"]
            print(
                f"  {label:20s} {cpu['median']:8.1f} ({cpu['min']}-{cpu['max']})"
                f" {wall['median']:8.1f} ({wall['min']}-{wall['max']})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
