"""Soak: hours of a job's bus traffic in half an hour on ``antdt up``, sampled every minute.

    .venv/bin/python bench/soak_bench.py [--workers 64] [--hours 8] [--minutes 30] [--json]
    [--plot soak.png]

``antdt up`` as a user starts it (the embedded broker, the monitor, the
sharder, the controller), then a fleet of simulated agents (:mod:`antdt.loadgen`,
one process, no torch) for one job of ``--workers`` workers whose every
cadence (metrics reports, heartbeats, steps, shards) runs ``--hours`` * 60 /
``--minutes`` times the real agent's: ``--minutes`` of wall time carry the
log volume of ``--hours`` of that job. A quarter of the workers turn 3x
slower, each at a random time, so straggler onset to command is measured
all along. Every minute:

* each process's CPU (percent of one core over the minute) and RSS;
* the grants asked in that minute (p50, p99 ms) and the onsets in it with the
  time to their first command;
* each service's consumer lag (committed offset behind the end of its input,
  read once a minute: on the embedded broker every such read lists the
  partition's whole log);
* how many times ``antdt up`` rolled the embedded broker (``--roll-at-mb``,
  :mod:`antdt.embedded.roll`).

The minutes are taken in windows of ``--baseline`` minutes (5), the first
window being the baseline: "flat" is the issue's "within 20 % of the first 5
minutes", each later window against the first. A window's grant p99 is
pooled over every grant asked in it, its bus CPU (the broker and the
services) is the mean of its minutes, and rolls count in every window alike:
at the default roll size the broker is rolled about once a minute here, so a
roll is the steady state, and a single minute's p99 on this saturated
2-core machine moved by more than 20 % between runs (224-411 ms in roll-free
minutes: docs/reliability.md), too few grants for a percentile to hold
still. The soak holds when every later window's grant p99 and bus CPU are
within 20 % of the baseline window's (grant p99 within 20 % or 5 ms, CPU
within 20 % or 5 points of a core, whichever is larger: a quiet baseline is
not held to its noise), no minute's grant p99 passes the agent's request
timeout (10 s: a slower answer is asked for again), and the broker's and
each service's RSS in the last minute is at most 1.5 times its highest in
the baseline. Exits 1 otherwise. The JSON keeps every minute's figures and
every window's, with the grants the rolls held and the steady tail without
them (:mod:`soak_grants`: a roll holds every worker's open request for
seconds, about one grant per worker per roll), the grants each roll held, and
each straggler's onset with the seconds since the last roll and whether a
roll came before its command (``onsets``); ``--grants-csv`` writes every
grant (asked at, s into the run; to its answer read and to the sharder's
stamp on it, ms), which ``bench/soak_grants.py`` reads again.
"""

from __future__ import annotations

import csv
import os
import sys
import threading
import time
from pathlib import Path

import psutil
from benchlib import UP_SERVICES, antdt_up, cpu_seconds, distribution, emit, up_processes
from confluent_kafka import KafkaException, TopicPartition
from scale_bench import GROUPS
from soak_grants import onsets_by_roll, rolls_held, tail

from antdt.bus.clients import make_consumer
from antdt.cli.up_cmd import ROLL_AT_MB
from antdt.loadgen.driver import FleetDriver
from antdt.loadgen.fleet import FleetSpec
from antdt.settings import load_settings
from antdt.topics import topic_spec

FLAT = 0.20  # within 20 % of the baseline
GRANT_FLOOR_MS, CPU_FLOOR = 5.0, 5.0
RSS_BOUND = 1.5
#: No minute's grant p99 past the agent's request timeout (a slower answer is asked for again).
REQUEST_TIMEOUT_MS = 10_000.0
#: A lag read that a roll interrupted is tried again this many times, this far apart.
LAG_TRIES, LAG_PAUSE_S = 3, 2.0
LOOK_EVERY_S = 2.0  # how often the processes' CPU is read (a rolled broker's last 2 s are lost)


def lag(settings) -> dict[str, int | None]:
    """Each service group's committed offsets behind the end of its input topics, records; None
    for a group whose offsets a roll kept unread through :data:`LAG_TRIES` tries."""
    return {name: lag_of(settings, group, topics) for name, (group, topics) in GROUPS.items()}


def lag_of(settings, group: str, topics) -> int | None:
    """One group's lag, tried again :data:`LAG_PAUSE_S` later where a roll had the broker gone
    (its clients' handles destroyed, or the topics not made again yet)."""
    partitions = [
        TopicPartition(settings.topic(c, n), p)
        for c, n in topics
        for p in range(topic_spec(c, n).partitions)
    ]
    for _ in range(LAG_TRIES):
        reader = make_consumer(settings, group_id=settings.group(group))
        try:
            total = 0
            for committed in reader.committed(partitions, timeout=10):
                _, end = reader.get_watermark_offsets(
                    TopicPartition(committed.topic, committed.partition), timeout=10
                )
                total += max(0, end - max(committed.offset, 0))
            return total
        except KafkaException as error:
            print(f"soak: {group}'s lag unread ({error}); again", file=sys.stderr, flush=True)
            time.sleep(LAG_PAUSE_S)
        finally:
            reader.close()
    return None


def fleet_spec(workers: int, speedup: float, seconds: float) -> FleetSpec:
    return FleetSpec(
        workers_per_job=workers,
        report_interval_s=1.0 / speedup,
        heartbeat_interval_s=5.0 / speedup,
        step_s=0.1 / speedup,
        shard_s=2.0 / speedup,
        stragglers=0.25,
        onset_from_s=60.0,
        onset_until_s=max(61.0, seconds - 60.0),
        job_prefix="soak",
    )


class Usage:
    """CPU seconds of ``antdt up``'s processes by name, looked at every few seconds: a roll
    replaces the broker process, and the CPU of each process it had counts up to its last look."""

    def __init__(self, up: psutil.Process, own: psutil.Process) -> None:
        self.up, self.own = up, own
        self.procs = up_processes(up)  # by name, as of the last look
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (name, CPU seconds at its last look)
        self.brokers: set[int] = set()
        self.look()

    def look(self) -> None:
        # a process not found now (the broker in the middle of a roll) stays as last seen
        fresh = self.procs | up_processes(self.up, required=False) | {"loadgen": self.own}
        for name, process in fresh.items():
            try:
                self.cpu[process.pid] = (name, cpu_seconds(process))
            except psutil.Error:  # gone between the listing and the look
                continue
        self.procs = fresh
        self.brokers.add(fresh["broker"].pid)

    def totals(self) -> dict[str, float]:
        summed: dict[str, float] = dict.fromkeys(self.procs, 0.0)
        for name, seconds in self.cpu.values():
            summed[name] += seconds
        return summed

    def rss_mb(self) -> dict[str, float]:
        """Each process's RSS; one gone since the last look (a rolled broker) counts as 0."""
        sizes = {}
        for name, process in self.procs.items():
            try:
                sizes[name] = round(process.memory_info().rss / 2**20, 1)
            except psutil.Error:
                sizes[name] = 0.0
        return sizes


def sample_minutes(driver, usage: Usage, settings, minutes: int, stop, up) -> list[dict]:
    """One sample a minute while the fleet runs: CPU and RSS per process, lag per service, and
    how many times the broker was rolled in it. Ends the soak if ``antdt up`` (``up``, its
    process) exits."""
    samples, began = [], time.monotonic()
    last, last_sent, last_brokers = usage.totals(), 0, len(usage.brokers)
    for minute in range(1, minutes + 1):
        end = began + 60.0 * minute
        while not stop.wait(max(0.0, min(LOOK_EVERY_S, end - time.monotonic()))):
            still_up(up, minute)
            usage.look()
            if time.monotonic() >= end:
                break
        if stop.is_set():
            break
        now = usage.totals()
        samples.append(
            {
                "minute": minute,
                "cpu_percent": {k: round(100 * (now[k] - last[k]) / 60, 1) for k in now},
                "rss_mb": usage.rss_mb(),
                "broker_rolls": len(usage.brokers) - last_brokers,
                "records_sent": driver.sent - last_sent,
                "lag": lag(settings),
            }
        )
        last, last_sent, last_brokers = now, driver.sent, len(usage.brokers)
        print(f"soak minute {minute}: {samples[-1]}", file=sys.stderr, flush=True)
    return samples


def still_up(up, minute: int) -> None:
    """Fail at once if ``antdt up`` exited (a service it runs died, or the broker): every later
    minute would measure a bus that is gone (one did, at length, on lag reads of a dead broker)."""
    code = up.poll()
    if code is not None:
        sys.exit(
            f"soak bench FAILED: antdt up exited (code {code}) in minute {minute}; "
            "its services' logs (--log-dir) say why"
        )


def add_latencies(samples: list[dict], seen, fleet) -> None:
    """Each minute's grants (by when asked) and onsets (by when they began)."""
    began = onsets(seen, fleet)
    for sample in samples:
        lo, hi = 60.0 * (sample["minute"] - 1), 60.0 * sample["minute"]
        sample["grant_ms"] = distribution([g.read_s * 1000 for g in asked(seen, lo, hi)], 2)
        commanded = [took for at, took in began if lo <= at < hi and took is not None]
        sample["onsets"] = sum(lo <= at < hi for at, _ in began)
        sample["onset_to_command_s"] = distribution(commanded, 2)


def onsets(seen, fleet) -> list[tuple[float, float | None]]:
    """Each straggler's onset (s into the run) and its onset to first command (None: none)."""
    return [
        (worker.onset - fleet.start, seen.first_command_s.get(key))
        for key, worker in fleet.workers.items()
        if worker.onset is not None
    ]


def asked(seen, lo: float, hi: float) -> list:
    """The grants asked from second ``lo`` to ``hi`` of the run."""
    return [g for g in seen.grants if lo <= g.sent_s < hi]


def write_grants(grants: list, path: Path) -> None:
    """Every grant: when it was asked (s into the run), to its answer read and to the sharder's
    stamp (ms)."""
    with path.open("w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["asked_s", "read_ms", "stamped_ms"])
        for grant in grants:
            ms = (round(grant.read_s * 1000, 2), round(grant.stamped_s * 1000, 2))
            rows.writerow([round(grant.sent_s, 3), *ms])


def bus_cpu(sample: dict) -> float:
    """The broker's and the services' CPU in a minute, percent of one core."""
    return sum(sample["cpu_percent"][k] for k in ("broker", *UP_SERVICES))


def windows(samples: list[dict], seen, size: int) -> list[dict]:
    """The minutes in consecutive windows of ``size`` (the last may be shorter): each window's
    grants pooled, its mean bus CPU and its rolls (module docstring)."""
    result = []
    for first in range(0, len(samples), size):
        minutes = samples[first : first + size]
        grants = asked(seen, 60.0 * (minutes[0]["minute"] - 1), 60.0 * minutes[-1]["minute"])
        result.append(
            {
                "minutes": [minutes[0]["minute"], minutes[-1]["minute"]],
                "grant_ms": distribution([g.read_s * 1000 for g in grants], 2),
                # from the request's send to the sharder's stamp on its answer: the grant less the
                # answer's way back to the fleet and the fleet's reading it
                "stamped_ms": distribution([g.stamped_s * 1000 for g in grants], 2),
                "bus_cpu_percent": round(sum(map(bus_cpu, minutes)) / len(minutes), 1),
                "broker_rolls": sum(s["broker_rolls"] for s in minutes),
                "load_cpu_ms_per_1k_records": load_cost(minutes),
                # a roll holds every worker's open request for seconds: how many it held sets where
                # the pooled p99 falls, and the rest's tail is the window's without its rolls
                **tail([g.read_s for g in grants]),
            }
        )
    return result


def load_cost(minutes: list[dict]) -> float | None:
    """The load generator's CPU per thousand records it sent (ms): a control for the machine's
    speed. Its work per record does not grow with the broker's log, so where it rises with the
    bus's own cost, the machine slowed (soak run 13: 26 % from the first window to the last, every
    process's cost with it), not the bus; the verdict stays the latency's and CPU's as measured."""
    sent = sum(m.get("records_sent", 0) for m in minutes)
    if not sent or any("loadgen" not in m["cpu_percent"] for m in minutes):
        return None
    cpu_s = sum(m["cpu_percent"]["loadgen"] * 60 / 100 for m in minutes)
    return round(cpu_s / sent * 1e6, 1)


def within(value: float, base: float, floor: float) -> bool:
    """``value`` at most 20 % over ``base``, or ``floor`` over it where that is more."""
    return value <= max(base * (1 + FLAT), base + floor)


def verdict(samples: list[dict], spans: list[dict], baseline: int) -> list[str]:
    """Where the soak left its baseline: each later window's grant p99 and bus CPU against the
    first window's, every minute's grant p99 against the request timeout, the last minute's RSS
    against the baseline's (module docstring)."""
    if len(spans) < 2:
        return [f"the run gave {len(samples)} minutes: not enough past the baseline"]
    base, problems = spans[0], []
    for span in spans[1:]:
        where = f"minutes {span['minutes'][0]}-{span['minutes'][1]}"
        p99 = span["grant_ms"].get("p99", float("inf"))
        if not within(p99, base["grant_ms"].get("p99", 0.0), GRANT_FLOOR_MS):
            problems.append(f"{where}: grant p99 {p99} ms (baseline {base['grant_ms'].get('p99')})")
        if not within(span["bus_cpu_percent"], base["bus_cpu_percent"], CPU_FLOOR):
            problems.append(
                f"{where}: bus CPU {span['bus_cpu_percent']} % of a core "
                f"(baseline {base['bus_cpu_percent']})"
            )
    for s in samples:
        if s["grant_ms"].get("p99", float("inf")) > REQUEST_TIMEOUT_MS:
            problems.append(f"minute {s['minute']}: grant p99 {s['grant_ms'].get('p99')} ms")
    for name in ("broker", *UP_SERVICES):
        top = max(s["rss_mb"][name] for s in samples[:baseline])
        if samples[-1]["rss_mb"][name] > RSS_BOUND * top:
            problems.append(f"{name} RSS {samples[-1]['rss_mb'][name]} MB > {RSS_BOUND}x {top} MB")
    return problems


def plot(samples: list[dict], spans: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["minute"] for s in samples]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for name in samples[0]["cpu_percent"]:
        axes[0][0].plot(minutes, [s["cpu_percent"][name] for s in samples], label=name)
        axes[0][1].plot(minutes, [s["rss_mb"][name] for s in samples], label=name)
    for q in ("p50", "p99"):
        axes[1][0].plot(minutes, [s["grant_ms"].get(q) for s in samples], label=f"grant {q}")
    for at, span in enumerate(spans):  # each window's pooled p99, the verdict's figure
        first, last = span["minutes"]
        label = None if at else "window p99 (pooled)"
        axes[1][0].hlines(span["grant_ms"].get("p99"), first - 0.5, last + 0.5, "k", label=label)
    for name in GROUPS:
        axes[1][1].plot(minutes, [s["lag"][name] for s in samples], label=name)
    titles = ("CPU, % of one core", "RSS, MiB", "grant latency, ms", "consumer lag, records")
    for ax, title in zip(axes.flat, titles):
        ax.set_title(title)
        ax.set_xlabel("minute")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--hours", type=float, default=8.0, help="the job's length to carry")
    parser.add_argument("--minutes", type=int, default=30, help="wall time (at least 7)")
    parser.add_argument(
        "--baseline",
        type=int,
        default=5,
        help="minutes in the baseline and in each window held to it",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, help="write the minutes' figures to this PNG")
    parser.add_argument("--log-dir", type=Path, default=Path("reports/soak-logs"))
    parser.add_argument("--grants-csv", type=Path, help="write every grant to this CSV")
    parser.add_argument(
        "--roll-at-mb", type=float, help="antdt up's --roll-at-mb (default: antdt up's own)"
    )
    args = parser.parse_args()
    if args.minutes <= args.baseline + 1 or args.workers < 4 or args.hours <= 0:
        parser.error("--minutes must exceed --baseline + 1, --workers >= 4, --hours > 0")
    speedup = args.hours * 60 / args.minutes
    seconds = 60.0 * args.minutes
    rolled = [] if args.roll_at_mb is None else ["--roll-at-mb", f"{args.roll_at_mb:g}"]
    with antdt_up(args.log_dir, ["--policy", "antdt-nd", *rolled]) as bus:
        os.environ.update(bus.exports)
        settings = load_settings()
        usage = Usage(psutil.Process(bus.process.pid), psutil.Process())
        driver = FleetDriver(settings, fleet_spec(args.workers, speedup, seconds))
        stop = threading.Event()
        seen: list = []
        runner = threading.Thread(target=lambda: seen.append(driver.run(seconds)), daemon=True)
        runner.start()
        samples = sample_minutes(driver, usage, settings, args.minutes, stop, bus.process)
        runner.join(120)
        stop.set()
        if not seen:
            sys.exit("soak bench FAILED: the fleet did not finish")
        add_latencies(samples, seen[0], driver.fleet)
        spans = windows(samples, seen[0], args.baseline)
        if args.grants_csv:
            write_grants(seen[0].grants, args.grants_csv)
    problems = verdict(samples, spans, args.baseline)
    grants = [(g.sent_s, g.read_s) for g in seen[0].grants]
    if args.plot:
        plot(samples, spans, args.plot)
    emit(
        {
            "workers": args.workers,
            "hours_carried": args.hours,
            "minutes": args.minutes,
            "speedup": round(speedup, 2),
            "roll_at_mb": args.roll_at_mb if args.roll_at_mb is not None else ROLL_AT_MB,
            "broker_rolls": sum(s["broker_rolls"] for s in samples),
            "records_sent": driver.sent,
            "records_dropped_at_rolls": driver.dropped,
            "requests_asked_again": seen[0].asked_again,
            "stragglers": driver.fleet.stragglers,
            "stragglers_commanded": len(seen[0].first_command_s),
            "rolls_held": rolls_held(grants),
            "onsets": onsets_by_roll(onsets(seen[0], driver.fleet), grants),
            "samples": samples,
            "windows": spans,
            "passed": not problems,
            "problems": problems,
        },
        args.json,
    )
    if problems:
        print("soak bench FAILED: " + "; ".join(problems[:5]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
