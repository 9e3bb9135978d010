"""The live view of a demo run: per worker, the commands as they are issued, the epoch's
progress."""

from __future__ import annotations

from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from antdt.demo.placement import node_at
from antdt.demo.scenario import Scenario
from antdt.demo.timeline import Timeline

COMMAND_LINES = 8


class Dashboard:
    """Renders a :class:`Timeline` every tick; use it as a context manager around the run."""

    def __init__(self, scenario: Scenario, title: str, console=None):
        self.scenario, self.title = scenario, title
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
        )
        self.task = self.progress.add_task("epoch 1", total=scenario.total_samples, detail="")
        self.live = Live(
            self._render(None, 0.0), console=console, refresh_per_second=4, transient=False
        )

    def __enter__(self) -> Dashboard:
        self.live.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self.live.__exit__(*exc_info)

    def tick(self, timeline: Timeline, elapsed_s: float) -> None:
        self.live.update(self._render(timeline, elapsed_s))

    def _render(self, timeline: Timeline | None, elapsed_s: float):
        workers = Table(title=self.title, expand=True)
        for column in (
            "worker",
            "speed now",
            "samples/s",
            "batch",
            "shards held",
            "samples",
            "verdict",
        ):
            workers.add_column(
                column, justify="left" if column in ("worker", "verdict") else "right"
            )
        commands = Table(title="commands issued", expand=True, show_edge=False)
        for column in ("at", "worker", "command", "acks"):
            commands.add_column(column)
        if timeline is None:
            return Group(workers, commands, self.progress)
        tracks, lines = timeline.snapshot()
        for spec in self.scenario.workers:
            track = tracks.get(spec.name)
            if track is None:
                continue
            node = node_at(self.scenario, spec.name, list(timeline.moves), elapsed_s)
            nominal = self.scenario.node_speed(node, elapsed_s) / self.scenario.base_rate
            verdict = (
                f"[red]{escape(track.verdict)}[/red]"
                if "straggler" in track.verdict
                else escape(track.verdict)
            )
            workers.add_row(
                spec.name,
                f"{nominal:.2f}x",
                f"{track.throughput:.0f}",
                str(track.batch_size or "-"),
                str(track.held),
                f"{track.samples:,}",
                verdict,
            )
        for line in lines[-COMMAND_LINES:]:
            commands.add_row(
                f"{line.t:6.1f} s", line.worker, escape(line.text), line.acks_text(none="...")
            )
        done = sum(t.samples for t in tracks.values())
        epoch_now = min(
            self.scenario.epochs,
            done * self.scenario.epochs // max(1, self.scenario.total_samples) + 1,
        )
        self.progress.update(
            self.task,
            completed=done,
            description=f"epoch {epoch_now}/{self.scenario.epochs}",
            detail=f"{done:,}/{self.scenario.total_samples:,} samples, {len(lines)} commands",
        )
        return Group(workers, Panel(commands) if lines else commands, self.progress)
