"""The run's report: PNG plots and a Markdown summary, written where the user can open them.

* ``throughput.png``: each worker's measured throughput over time, its
  nominal speed from the scenario on the node it ran on (dashed), and a
  marker for every verdict (red), command (green) and placement (blue) that
  concerned it;
* ``progress.png``: cumulative samples trained against the ideal (and, from
  ``antdt bench``, every plan on the same axes);
* ``loss.png``: the shared model's held-out loss (and accuracy) over time,
  every plan on the same axes, and the scenario's ``target_loss`` dashed;
* ``summary.md``: the scenario, the figures, the model's held-out quality
  and the time it took to reach the target loss, the commands, the audit and
  the ledger.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from antdt.demo.convergence import time_to_target  # noqa: E402
from antdt.demo.harness import RunResult  # noqa: E402
from antdt.demo.placement import node_at  # noqa: E402
from antdt.demo.services import service_settings  # noqa: E402

MARKER_COLOURS = {"verdict": "red", "command": "green", "placement": "blue"}


def save(figure, path: Path) -> Path:
    """Lay the figure out, write it to ``path`` and free it."""
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def cumulative(result: RunResult) -> tuple[list[float], list[float]]:
    """(times, samples trained by then) from every worker's reports."""
    tracks, _ = result.timeline.snapshot()
    points = sorted((p.t, p.samples) for track in tracks.values() for p in track.points)
    times, totals, done = [0.0], [0.0], 0
    for t, samples in points:
        done += samples
        times.append(max(0.0, t))
        totals.append(done)
    return times, totals


def reactions(result: RunResult) -> list[dict]:
    """For each slowdown the scenario injects: how long until the first verdict and the first
    command on that worker.

    Onsets are the starts of episodes, and time 0 for a worker slower than
    the base speed throughout. None means nothing came (before the run ended).
    """
    rows = []
    markers = sorted(result.timeline.markers, key=lambda m: m.t)
    for worker in result.scenario.workers:
        node = result.scenario.node(result.scenario.home(worker.name))
        onsets = ([0.0] if node.speed < 1 else []) + [
            e.start_s for e in node.episodes if e.start_s < result.wall_s
        ]
        mine = [m for m in markers if m.worker == worker.name]
        for onset in onsets:
            verdict = next(
                (
                    m.t
                    for m in mine
                    if m.kind == "verdict" and "straggler" in m.label and m.t >= onset
                ),
                None,
            )
            command = next((m.t for m in mine if m.kind == "command" and m.t >= onset), None)
            rows.append(
                {
                    "worker": worker.name,
                    "onset_s": onset,
                    "verdict_after_s": None if verdict is None else round(verdict - onset, 3),
                    "command_after_s": None if command is None else round(command - onset, 3),
                }
            )
    return rows


def command_counts(result: RunResult) -> dict:
    """How many commands each worker got, against the speed changes the scenario made during the
    run.

    A speed change is the start (workers differ from the first step) and
    every episode boundary or noise redraw before the run ended: each is one
    real reason to rebalance. Rejected commands are listed with the reason
    the agent gave (in normal operation there should be none).
    """
    _, commands = result.timeline.snapshot()
    per_worker: dict[str, int] = {}
    for line in commands:
        per_worker[line.worker] = per_worker.get(line.worker, 0) + 1
    changes = len([p for p in result.scenario.change_points(result.wall_s) if p < result.wall_s])
    return {
        "per_worker": per_worker,
        "speed_changes": changes,
        "max_per_worker_per_change": round(
            max(per_worker.values(), default=0) / max(1, changes), 3
        ),
        "rejected": [
            f"{line.worker} {line.text}: {reason}"
            for line in commands
            for reason in line.rejections
        ],
    }


SPLIT = ("compute", "data_wait", "sync_wait")


def worker_splits(result: RunResult) -> dict[str, dict[str, float]]:
    """Per worker, seconds of paced compute, waiting for data (shards) and waiting at the barrier.

    Only the scenario's workers: a parameter server's agent has a track too, but trains nothing.
    """
    tracks, _ = result.timeline.snapshot()
    workers = {w.name for w in result.scenario.workers}
    return {
        worker: {name: round(getattr(track, f"{name}_s"), 3) for name in SPLIT}
        for worker, track in tracks.items()
        if worker in workers
    }


def time_split(result: RunResult) -> dict[str, float]:
    """:func:`worker_splits` averaged over the workers."""
    splits = worker_splits(result)
    return {
        name: round(sum(s[name] for s in splits.values()) / max(1, len(splits)), 3)
        for name in SPLIT
    }


def plot_throughput(result: RunResult, path: Path) -> Path:
    scenario = result.scenario
    tracks, _ = result.timeline.snapshot()
    names = [w.name for w in scenario.workers]
    figure, axes = plt.subplots(
        len(names), 1, sharex=True, figsize=(10, 1.4 * len(names) + 1), squeeze=False
    )
    end = max(result.wall_s, 1.0)
    grid = [end * i / 400 for i in range(401)]
    for name, axis in zip(names, axes[:, 0]):
        track = tracks.get(name)
        if track is not None and track.points:
            axis.plot(
                [p.t for p in track.points],
                [p.samples_per_s for p in track.points],
                lw=1,
                label="measured",
            )
        nominal = [scenario.node_speed(node_at(scenario, name, result.moves, t), t) for t in grid]
        axis.plot(grid, nominal, ls="--", lw=0.8, color="grey", label="nominal")
        for marker in result.timeline.markers:
            if marker.worker == name and 0 <= marker.t <= end * 1.05:
                colour = MARKER_COLOURS[marker.kind]
                axis.axvline(
                    marker.t, color=colour, lw=0.8, ls=":" if marker.kind == "command" else "-"
                )
                axis.annotate(
                    marker.label,
                    (marker.t, 0),
                    xytext=(2, 2),
                    textcoords="offset points",
                    fontsize=6,
                    color=colour,
                    rotation=90,
                    va="bottom",
                )
        axis.set_ylabel(name, rotation=0, ha="right", va="center")
        axis.set_ylim(bottom=0)
    axes[0, 0].set_title(
        f"{scenario.name} / {result.plan.label}: samples/s per worker "
        "(red: verdicts, green: commands, dashed: nominal speed)",
        fontsize=9,
    )
    axes[-1, 0].set_xlabel("seconds since start")
    return save(figure, path)


def plot_progress(results: list[RunResult], path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(9, 5))
    scenario = results[0].scenario
    longest = max(r.wall_s for r in results)
    ideal = scenario.ideal_curve(longest)
    axis.plot(
        [t for t, _ in ideal],
        [s for _, s in ideal],
        color="black",
        ls="--",
        label=f"ideal ({results[0].ideal_s:.1f} s)",
    )
    for result in results:
        times, totals = cumulative(result)
        axis.plot(
            times,
            totals,
            label=(
                f"{result.plan.label} ({result.wall_s:.1f} s, efficiency {result.efficiency:.2f})"
            ),
        )
    axis.axhline(scenario.total_samples, color="grey", lw=0.5)
    axis.set_xlabel("seconds since start")
    axis.set_ylabel("samples trained")
    axis.set_title(f"{scenario.name}: cumulative samples against the ideal")
    axis.legend(fontsize=8)
    return save(figure, path)


def plot_loss(results: list[RunResult], path: Path) -> Path:
    figure, (loss_axis, accuracy_axis) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for result in results:
        curve = result.loss_curve
        label = result.plan.label
        if result.heldout is not None:
            label += f" (final loss {result.heldout[0]:.3f}, accuracy {result.heldout[1]:.3f})"
        loss_axis.plot([t for t, _, _ in curve], [loss for _, loss, _ in curve], label=label)
        accuracy_axis.plot(
            [t for t, _, _ in curve], [acc for _, _, acc in curve], label=result.plan.label
        )
    target = results[0].scenario.target_loss
    if target is not None:
        loss_axis.axhline(target, color="grey", ls="--", lw=0.8, label=f"target loss {target:g}")
    loss_axis.set_ylabel("held-out loss")
    loss_axis.set_title(f"{results[0].scenario.name}: the shared model on held-out samples")
    loss_axis.legend(fontsize=7)
    accuracy_axis.set_ylabel("held-out accuracy")
    accuracy_axis.set_xlabel("seconds since start")
    accuracy_axis.set_ylim(0, 1)
    return save(figure, path)


def heldout_text(result: RunResult) -> str:
    if result.heldout is None:
        return "the final model could not be read"
    return f"loss {result.heldout[0]:.3f}, accuracy {result.heldout[1]:.3f}"


def target_text(result: RunResult) -> str | None:
    """When the held-out loss first reached the scenario's target (None without a target)."""
    target = result.scenario.target_loss
    if target is None:
        return None
    reached = time_to_target(
        result.loss_curve,
        target,
        result.wall_s,
        None if result.heldout is None else result.heldout[0],
    )
    if reached is None:
        return f"held-out loss {target:g} not reached"
    return (
        f"held-out loss {target:g} reached after {reached:.1f} s (first evaluation at or below it)"
    )


def ledger_text(result: RunResult) -> str:
    check = result.ledger
    if check.ok:
        agreed = (
            f", agreeing with the log for epoch(s) {check.compared_epochs}"
            if check.compared_epochs
            else ""
        )
        return f"all ones ({len(check.files)} file(s)){agreed}"
    return "FAILED: " + "; ".join(check.findings[:5])


def audit_text(result: RunResult) -> str:
    if result.audit is None:
        return "no sharder (static sharding): nothing to audit"
    if result.audit_ok:
        epochs = result.audit["epochs"]
        once = sum(e["samples_done_once"] for e in epochs)
        return (
            f"clean: every sample trained exactly once in each of {len(epochs)} epoch(s) "
            f"({once:,} samples in all)"
        )
    if result.audit["violations"]:
        return "VIOLATIONS: " + "; ".join(result.audit["violations"][:5])
    return "job not finished: the log has no end"


def audit_word(ok: bool | None) -> str:
    """The audit column: ``-`` without a sharder, else clean or FAILED."""
    return "-" if ok is None else ("clean" if ok else "FAILED")


def results_table(results: list[RunResult], baseline: RunResult | None = None) -> list[str]:
    lines = [
        (
            "| plan | wall time | ideal | efficiency | speedup over baseline | held-out loss "
            "| held-out accuracy | commands | restarts | audit | ledger |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        speedup = r.speedup_over(baseline)
        loss, accuracy = (
            ("-", "-") if r.heldout is None else (f"{r.heldout[0]:.3f}", f"{r.heldout[1]:.3f}")
        )
        lines.append(
            f"| {r.plan.label} | {r.wall_s:.1f} s | {r.ideal_s:.1f} s | {r.efficiency:.3f} | "
            f"{'-' if speedup is None else f'{speedup:.2f}x'} | {loss} | {accuracy} | "
            f"{r.commands} | {r.restarts} | {audit_word(r.audit_ok)} | "
            f"{'ones' if r.ledger.ok else 'FAILED'} |"
        )
    return lines


def ideal_definition(scenario) -> str:
    """What the ideal time means for this scenario, in the report's words."""
    if scenario.nodes:
        return (
            "the total work over the summed speed the cluster's hardware, spares included, could "
            "deliver at each moment with the best placement (the parameter servers on healthy "
            "nodes, the workers on the fastest of the rest; integrated over the episodes and noise)"
        )
    return (
        "the total work over the workers' summed speed (integrated over the scenario's episodes "
        "and noise)"
    )


def write_summary(
    results: list[RunResult], out_dir: Path, images: list[Path], baseline: RunResult | None = None
) -> Path:
    scenario = results[0].scenario
    lines = [
        f"# antdt run: {scenario.name}",
        "",
        scenario.description,
        "",
        f"{len(scenario.workers)} workers, base rate {scenario.base_rate:g} samples/s, "
        f"{scenario.dataset_size:,} samples x {scenario.epochs} epoch(s) in shards of "
        f"{scenario.shard_size}, noise ±{scenario.noise.amplitude:.0%} every "
        f"{scenario.noise.period_s:g} s. "
        "Each step is real torch work plus a calibrated pause to the scenario's speed "
        "(see antdt/demo/pacing.py). Every plan trains one shared model: asynchronous plans "
        f"through {scenario.parameter_servers} parameter-server shard(s), synchronous ones kept "
        "identical by the all-reduce.",
        "",
        "| node | starts with | hardware speed | episodes |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {node} | {who} | {speed} | {episodes} |"
        for node, who, speed, episodes in scenario.summary_rows()
    ]
    lines += [
        "",
        "## Results",
        "",
        *results_table(results, baseline),
        "",
        f"Ideal time: {ideal_definition(scenario)}; efficiency = ideal / wall time.",
        "",
    ]
    for result in results:
        changed = "; ".join(
            f"{service}: " + ", ".join(f"{k}={v}" for k, v in values.items())
            for service, values in service_settings(result.plan, result.scenario).items()
            if values
        )
        target = target_text(result)
        lines += [
            f"## {result.plan.label}",
            "",
            f"- job id: `{result.job_id}`",
            f"- service settings other than the defaults: {changed or 'none'}",
            f"- samples trained: {result.samples:,}; verdicts: {result.timeline.verdicts}; "
            f"commands: {result.commands}; restarts: {result.restarts}",
            f"- held-out: {heldout_text(result)}",
            *([f"- target: {target}"] if target else []),
            f"- audit: {audit_text(result)}",
            f"- ledger: {ledger_text(result)}",
            "",
        ]
        gap = (
            largest_loss_gap(result, baseline)
            if baseline is not None and baseline is not result
            else None
        )
        if gap is not None:
            lines.append(
                f"- training loss per step against {baseline.plan.label} (same global batch, "
                f"{SMOOTH_STEPS}-step means, by samples trained): largest gap {gap[0]:.4f} "
                f"after {gap[1]} global batches"
            )
        split = time_split(result)
        lines.append(
            f"- per worker, on average: {split['compute']:.1f} s computing, "
            f"{split['data_wait']:.2f} s waiting for data, "
            f"{split['sync_wait']:.2f} s waiting at the barrier"
        )
        for row in reactions(result):
            verdict = (
                "no verdict"
                if row["verdict_after_s"] is None
                else f"verdict after {row['verdict_after_s']:.1f} s"
            )
            command = (
                "no command"
                if row["command_after_s"] is None
                else f"command after {row['command_after_s']:.1f} s"
            )
            lines.append(f"- {row['worker']} slowed at {row['onset_s']:g} s: {verdict}, {command}")
        lines.append("")
        lines += [f"- placed again at {m.t:.1f} s: {m.describe()}" for m in result.moves]
        if result.timeline.commands:
            lines += ["| at | worker | command | acks |", "|---|---|---|---|"]
            lines += [
                f"| {c.t:.1f} s | {c.worker} | {c.text} | {c.acks_text()} |"
                for c in result.timeline.commands
            ]
            lines.append("")
    lines += ["## Plots", ""] + [f"![{image.stem}]({image.name})" for image in images]
    path = out_dir / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


SMOOTH_STEPS = 10


def smoothed(curve: list[tuple[int, float]], width: int = SMOOTH_STEPS) -> dict[int, float]:
    """Step -> the mean loss of the ``width`` steps ending there (single steps differ by which
    samples they hold)."""
    out, window = {}, []
    for step, loss in curve:
        window = (window + [loss])[-width:]
        if len(window) == width:
            out[step] = sum(window) / width
    return out


def largest_loss_gap(result: RunResult, baseline: RunResult) -> tuple[float, int] | None:
    """The largest gap between two runs' smoothed loss-per-step curves over their common steps, and
    where."""
    ours, theirs = smoothed(result.loss_per_step), smoothed(baseline.loss_per_step)
    common = sorted(set(ours) & set(theirs))
    if not common:
        return None
    step = max(common, key=lambda s: abs(ours[s] - theirs[s]))
    return abs(ours[step] - theirs[step]), step


def plot_loss_per_step(results: list[RunResult], path: Path) -> Path | None:
    """Synchronous plans keep one global batch: their training loss per step should overlay."""
    synchronous = [r for r in results if r.loss_per_step]
    if not synchronous:
        return None
    figure, axis = plt.subplots(figsize=(9, 4))
    for result in synchronous:
        curve = smoothed(result.loss_per_step)
        axis.plot(list(curve), list(curve.values()), label=result.plan.label)
    axis.set_xlabel("samples trained, in global batches")
    axis.set_ylabel(f"training loss (mean of {SMOOTH_STEPS} steps)")
    axis.set_title(
        f"{results[0].scenario.name}: loss per step of the synchronous plans (one global batch)"
    )
    axis.legend(fontsize=8)
    return save(figure, path)


def write_report(
    results: list[RunResult], out_dir: Path, baseline: RunResult | None = None
) -> list[Path]:
    """Every file of the report, in ``out_dir``; returns their paths (summary first)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    images = [
        plot_progress(results, out_dir / "progress.png"),
        plot_loss(results, out_dir / "loss.png"),
    ]
    per_step = plot_loss_per_step(results, out_dir / "loss-per-step.png")
    images += [per_step] if per_step is not None else []
    for result in results:
        suffix = "" if len(results) == 1 else f"-{result.plan.name}"
        images.append(plot_throughput(result, out_dir / f"throughput{suffix}.png"))
    return [write_summary(results, out_dir, images, baseline), *images]
