"""What a soak's grants say beyond their percentiles: the grants a broker roll held, and the steady
tail away from them.

    .venv/bin/python bench/soak_grants.py grants.csv [--window-s 300] [--json]

reads the CSV ``bench/soak_bench.py --grants-csv`` writes (the soak's own windows carry the same
figures). A roll holds every worker's open request until the sharder answers from the new bus, so
about one grant per worker per roll waits for the roll's seconds, far past the steady p99 (about
0.2 s on this machine); the grants past :data:`HELD_S` are counted as held, and the p99 of the
rest, with how many of them passed :data:`SLOW_S`, is the tail a window has without its rolls.
Held grants further apart than :data:`ROLL_GAP_S` belong to different rolls: per roll, how many
it held and for how long (median). The steady grants are also binned by the seconds since the
last roll began (the embedded broker's log, and with it a fetch's cost, grows between rolls).
docs/reliability.md reads a failed soak with these.
"""

from __future__ import annotations

import bisect
import csv
import statistics
from pathlib import Path

from benchlib import emit, percentile, spread

#: A grant past this was held by a roll (the steady p99 is about 0.2 s, a roll holds 0.8-2.8 s).
HELD_S = 0.7
#: A steady grant past this is the slow tail that sets a window's p99 apart from the baseline's.
SLOW_S = 0.3
#: Held grants asked further apart than this were held by different rolls (rolls come a minute
#: or more apart at the default roll size).
ROLL_GAP_S = 10.0
#: The bins of seconds since the last roll that :func:`since_roll` sorts the steady grants into.
SINCE_ROLL_S = (0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0)


def tail(read_s: list[float]) -> dict:
    """The held grants (count and share) and the steady ones' p99 and count past ``SLOW_S``."""
    steady = [s for s in read_s if s <= HELD_S]
    held = len(read_s) - len(steady)
    return {
        "grants_held": held,
        "held_percent": round(100.0 * held / len(read_s), 2) if read_s else 0.0,
        "steady_p99_ms": round(percentile(steady, 0.99) * 1000, 1) if steady else None,
        "steady_over_300ms": sum(s > SLOW_S for s in steady),
    }


def held_clusters(grants: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The held grants ``(asked_s, read_s)``, by when they were asked, one cluster a roll."""
    clusters: list[list[tuple[float, float]]] = []
    for asked, read in sorted((asked, read) for asked, read in grants if read > HELD_S):
        if not clusters or asked - clusters[-1][-1][0] > ROLL_GAP_S:
            clusters.append([])
        clusters[-1].append((asked, read))
    return clusters


def roll_starts(grants: list[tuple[float, float]]) -> list[float]:
    """When each roll began: the asking of its first held grant (s into the run), in order."""
    return [cluster[0][0] for cluster in held_clusters(grants)]


def rolls_held(grants: list[tuple[float, float]]) -> dict:
    """How many grants each roll held, and the spread of the rolls' median holds (s)."""
    clusters = [[read for _, read in cluster] for cluster in held_clusters(grants)]
    if not clusters:
        return {"rolls": 0}
    return {
        "rolls": len(clusters),
        "held_per_roll": [len(c) for c in clusters],
        "median_hold_s": spread([statistics.median(c) for c in clusters], 2),
        "longest_hold_s": round(max(max(c) for c in clusters), 2),
    }


def since_roll(
    grants: list[tuple[float, float]], bins_s: tuple[float, ...] = SINCE_ROLL_S
) -> list[dict]:
    """The steady grants (not held) by the seconds between the last roll's first held grant and
    their asking, in ``bins_s`` (the last bin open-ended, its end None): count, p50, p99 and the
    share past ``SLOW_S``. The grants before the first roll are a bin of their own (``since_s``
    None)."""
    starts = roll_starts(grants)
    binned: dict[int | None, list[float]] = {}
    for asked, read in grants:
        if read > HELD_S:
            continue
        last = bisect.bisect_right(starts, asked) - 1
        if last < 0:
            binned.setdefault(None, []).append(read)
            continue
        since = asked - starts[last]  # past the last bin's start: the last bin
        binned.setdefault(bisect.bisect_right(bins_s, since) - 1, []).append(read)
    rows = [{"since_s": None, **_spread_of(binned[None])}] if None in binned else []
    for key, start in enumerate(bins_s):
        if key in binned:
            end = bins_s[key + 1] if key + 1 < len(bins_s) else None
            rows.append({"since_s": [start, end], **_spread_of(binned[key])})
    return rows


def onsets_by_roll(
    onsets: list[tuple[float, float | None]], grants: list[tuple[float, float]]
) -> list[dict]:
    """Each straggler's onset ``(onset_s, to_command_s)`` (None: never commanded), by when, with
    the seconds since the last roll began before it (None: before the first roll) and whether a
    roll began between the onset and its command: a roll restarts the monitor's windows, so an
    onset it caught is commanded seconds later than one it did not."""
    starts = roll_starts(grants)
    rows = []
    for onset, to_command in sorted(onsets):
        last = bisect.bisect_right(starts, onset) - 1
        until = onset + (to_command if to_command is not None else float("inf"))
        rows.append(
            {
                "onset_s": round(onset, 2),
                "to_command_s": None if to_command is None else round(to_command, 2),
                "since_roll_s": round(onset - starts[last], 2) if last >= 0 else None,
                "roll_before_command": any(onset <= start <= until for start in starts),
            }
        )
    return rows


def _spread_of(read_s: list[float]) -> dict:
    return {
        "grants": len(read_s),
        "p50_ms": round(percentile(read_s, 0.5) * 1000, 1),
        "p99_ms": round(percentile(read_s, 0.99) * 1000, 1),
        "over_300ms_percent": round(100.0 * sum(r > SLOW_S for r in read_s) / len(read_s), 2),
    }


def read_grants(path: Path) -> list[tuple[float, float]]:
    """``(asked_s, read_s)`` of every grant in a ``--grants-csv`` file."""
    with path.open(newline="") as rows:
        return [(float(r["asked_s"]), float(r["read_ms"]) / 1000) for r in csv.DictReader(rows)]


def by_window(grants: list[tuple[float, float]], window_s: float) -> list[dict]:
    """Each window of ``window_s`` from the run's start: its grants, p50 and p99, and its
    :func:`tail`."""
    result = []
    last = max((asked for asked, _ in grants), default=0.0)
    for number in range(int(last // window_s) + 1):
        lo, hi = number * window_s, (number + 1) * window_s
        read_s = [read for asked, read in grants if lo <= asked < hi]
        result.append(
            {
                "seconds": [lo, hi],
                "grants": len(read_s),
                "p50_ms": round(percentile(read_s, 0.5) * 1000, 1) if read_s else None,
                "p99_ms": round(percentile(read_s, 0.99) * 1000, 1) if read_s else None,
                **tail(read_s),
            }
        )
    return result


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, help="a soak's --grants-csv file")
    parser.add_argument("--window-s", type=float, default=300.0, help="window length (the soak's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.window_s <= 0:
        parser.error("--window-s must be positive")
    if not args.csv.is_file():
        parser.error(f"{args.csv}: no such file")
    grants = read_grants(args.csv)
    report = {"windows": by_window(grants, args.window_s), **rolls_held(grants)}
    emit({**report, "since_roll": since_roll(grants)}, args.json)


if __name__ == "__main__":
    main()
