"""What every benchmark script shares: percentiles, a broker with fresh settings, output."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.embedded.broker import EmbeddedBroker
from antdt.settings import BrokerProfile, Settings, load_settings


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in [0, 1])."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def distribution(values: list[float], digits: int = 3) -> dict[str, float]:
    """n, min, p50, p90, p99 and max of ``values``."""
    if not values:
        return {"n": 0}
    summary = {
        name: percentile(values, q) for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
    }
    return {
        "n": len(values),
        "min": round(min(values), digits),
        **{k: round(v, digits) for k, v in summary.items()},
        "max": round(max(values), digits),
    }


def cpu_seconds(process) -> float:
    """User and system CPU seconds of a ``psutil.Process`` so far."""
    times = process.cpu_times()
    return times.user + times.system


#: The services ``antdt up`` starts for every policy.
UP_SERVICES = ("monitor", "sharder", "controller")


def up_processes(up, required: bool = True) -> dict:
    """``antdt up``'s broker and services (``psutil.Process`` each) by name, from their command
    lines; a missing one is an error if ``required`` (during a roll the broker is briefly not
    there)."""
    import psutil

    found = {}
    for child in up.children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:  # gone, or a rolled broker not reaped yet (a zombie)
            continue
        if "tansu" in command:
            found["broker"] = child
        for name in UP_SERVICES:
            if f"antdt.cli.main {name}" in command or command.endswith(f"antdt {name}"):
                found[name] = child
    missing = {"broker", *UP_SERVICES} - set(found)
    if missing and required:
        raise RuntimeError(f"antdt up's children lack {', '.join(sorted(missing))}")
    return found


def spread(values: list[float], digits: int = 3) -> dict[str, float]:
    """Median, min and max of repeated runs' figures (the house rule for anything timed)."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def fresh_settings(broker: EmbeddedBroker, create_topics: bool = True) -> Settings:
    """Settings for ``broker`` under a prefix of their own (topics created)."""
    settings = load_settings(
        bootstrap_servers=broker.bootstrap_servers,
        broker_profile=BrokerProfile.EMBEDDED,
        topic_prefix=f"bench{uuid.uuid4().hex[:8]}",
    )
    if create_topics:
        ensure_topics(make_admin(settings), settings)
    return settings


@contextmanager
def embedded_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        yield broker


def stop_process(process, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if ``process`` is still there after ``grace_s``."""
    import subprocess

    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def bench_parser(doc: str, parts: str) -> argparse.ArgumentParser:
    """The options every script has: ``--json`` and ``--only`` (comma-separated parts)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--only", default=parts, help=f"comma-separated subset of: {parts}")
    return parser


def numbers(parser: argparse.ArgumentParser, option: str, text: str, kind: type = int) -> list:
    """A comma-separated option's values, or the parser's one-line error naming the option."""
    try:
        return [kind(part) for part in text.split(",")]
    except ValueError:
        parser.error(f"{option} takes comma-separated {kind.__name__}s, not {text!r}")


def emit(report: dict, as_json: bool) -> None:
    print(json.dumps(report, indent=2) if as_json else report, flush=True)


#: How long each of ``antdt up``'s services may take to be ready (past it, antdt up exits).
READY_WITHIN_S = 90


@dataclass
class Bus:
    """A running ``antdt up``: the environment it exports, and its process (for its CPU)."""

    exports: dict[str, str]
    process: subprocess.Popen | None = None

    def cpu_s(self) -> float | None:
        """CPU seconds used so far by ``antdt up`` and everything it started (None: no bus)."""
        if self.process is None:
            return None
        import psutil

        total = 0.0
        root = psutil.Process(self.process.pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                total += cpu_seconds(process)
            except psutil.NoSuchProcess:
                continue
        return total

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds used so far by the broker and each service, by name (empty: no bus): which
        of them a run's ``cpu_s`` went to."""
        if self.process is None:
            return {}
        import psutil

        by_name = {}
        for name, process in up_processes(psutil.Process(self.process.pid), False).items():
            try:
                by_name[name] = cpu_seconds(process)
            except psutil.NoSuchProcess:
                continue
        return by_name


@contextmanager
def antdt_up(log_dir: Path, options: list[str]):
    """``antdt up OPTIONS`` as a user starts it; yields the :class:`Bus`."""
    command = [sys.executable, "-m", "antdt.cli.main", "up", *options]
    process = subprocess.Popen(
        [*command, "--ready-within", str(READY_WITHIN_S), "--log-dir", str(log_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    exports: dict[str, str] = {}
    try:
        # bounded by antdt up itself: a service not ready within READY_WITHIN_S ends it (EOF)
        for line in process.stdout:
            if line.startswith("export"):
                exports.update(re.findall(r"(\w+)=(\S+)", line.split("#")[0]))
            if "Ctrl-C stops everything" in line:
                break
        else:
            raise RuntimeError(f"antdt up exited with code {process.wait()} before it was ready")
        yield Bus(exports, process)
    finally:
        stop_process(process, 30)
