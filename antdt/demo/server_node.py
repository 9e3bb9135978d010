"""One demo parameter-server shard: ``antdt ps`` on a scenario node, working at that node's speed.

Forked by the harness (:mod:`antdt.demo.services`, through the fork server
of :mod:`antdt.demo.launcher`, so a replacement starts in a moment) with the
``antdt ps`` options the demo uses plus ``--scenario``, ``--node`` and
``--handshake``. Each piece of
the shard's work (a pull, a gradient received, an update applied) lasts
``ps_work_s`` divided by the node's relative speed at that moment (seconds
since the run's start signal; 0 before it), one piece at a time: on a
contended node the shard serves fewer updates per second and every worker
waits for it, as with a real overloaded server. With ``ps_work_s: 0`` the
shard is not paced at all.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from antdt.demo.scenario import Scenario
from antdt.settings import load_settings


class NodePace:
    """``ServerSpec.pace`` for a shard on ``node``: the seconds a piece of work lasts there now."""

    WORK = ("pull", "prepare", "apply")

    def __init__(self, scenario: Scenario, node: str, handshake: Path):
        self.scenario, self.node, self.go = scenario, node, handshake / "go"
        self.start: float | None = None

    def now_s(self, wall: float) -> float:
        if self.start is None and self.go.exists():
            self.start = float(self.go.read_text())
        return 0.0 if self.start is None else max(0.0, wall - self.start)

    def __call__(self, work: str) -> float:
        if work not in self.WORK or not self.scenario.ps_work_s:
            return 0.0
        relative = (
            self.scenario.node_speed(self.node, self.now_s(time.time())) / self.scenario.base_rate
        )
        return self.scenario.ps_work_s / relative


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="antdt demo parameter-server shard (started by the harness)"
    )
    parser.add_argument("command", choices=("ps",))
    for name, kind, default in (
        ("--shard", int, 0),
        ("--shards", int, 1),
        ("--port", int, 0),
        ("--lr", float, 0.05),
        ("--checkpoint-every", float, 2.0),
        ("--http-port", int, 0),
    ):
        parser.add_argument(name, type=kind, default=default)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--scenario", type=Path, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--handshake", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from antdt.cli.ps_cmd import serve
    from antdt.cli.serving import configure_logging
    from antdt.worker.ps.server import ServerSpec

    args = parse_args(argv)
    configure_logging(args.log_level)
    settings = load_settings()
    scenario = Scenario.load(args.scenario)
    spec = ServerSpec(
        job_id=settings.job_id,
        checkpoint_dir=args.checkpoint_dir,
        shard=args.shard,
        shards=args.shards,
        port=args.port,
        out_dir=args.out,
        lr=args.lr,
        checkpoint_every_s=args.checkpoint_every,
        pace=NodePace(scenario, args.node, args.handshake),
    )
    serve(settings, spec, args.http_port)


def forked(argv: list[str]) -> int:
    """The fork server's entry (:mod:`antdt.demo.launcher`): a RESTART or EVICT exits with the
    agent's code."""
    main(argv)
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
