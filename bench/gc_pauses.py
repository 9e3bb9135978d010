"""The cyclic collector's pauses per process, from what ``bench/gc_probe`` wrote.

    PYTHONPATH=bench/gc_probe GC_PROBE_DIR=/tmp/gc .venv/bin/python bench/soak_bench.py ...
    .venv/bin/python bench/gc_pauses.py /tmp/gc [--json]

Per process (named by its command: ``antdt sharder``, a script's name): its full passes (count,
total, median and max milliseconds) and its younger passes slower than the probe's 3 ms.
docs/reliability.md ("The sharder's collector") reads a soak with it.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchlib import emit


def process_name(command: str) -> str:
    """``antdt <subcommand>`` for antdt's own processes, else the script or module run."""
    words = command.split()
    if "antdt.cli.main" in words:
        after = words[words.index("antdt.cli.main") + 1 :]
        return f"antdt {after[0]}" if after else "antdt"
    if "-m" in words:
        return words[words.index("-m") + 1]
    scripts = [w for w in words[1:] if w.endswith(".py")]
    return Path(scripts[0]).name if scripts else Path(words[0]).name if words else "?"


def pauses(lines: list[str]) -> dict:
    """One process's probe lines summed up."""
    rows = [line.split() for line in lines if line.strip()]
    full = [float(row[2]) for row in rows if row[1] == "2"]
    slow_young = [float(row[2]) for row in rows if row[1] != "2"]
    return {
        "full_passes": len(full),
        "full_total_ms": round(sum(full), 1),
        "full_median_ms": round(statistics.median(full), 1) if full else None,
        "full_max_ms": round(max(full), 1) if full else None,
        "young_over_3ms": len(slow_young),
    }


def read_probe(folder: Path) -> list[dict]:
    """Every probed process that collected anything worth a line, by name."""
    found = []
    for command_file in sorted(folder.glob("*.cmd")):
        lines_file = command_file.with_suffix(".txt")
        lines = lines_file.read_text().splitlines() if lines_file.exists() else []
        if lines:
            name = process_name(command_file.read_text())
            found.append({"process": name, "pid": int(command_file.stem), **pauses(lines)})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the probe's GC_PROBE_DIR")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder")
    emit({"processes": read_probe(args.folder)}, args.json)


if __name__ == "__main__":
    main()
