"""Time to a target held-out loss: when a run's shared model first became good enough.

Wall time says when a plan finished its epochs; plans that update the model
differently (asynchronous against the parameter server, synchronous at one
global batch) can reach the same quality at different times, so ``antdt
bench`` also reports when each run's held-out loss first reached the
scenario's ``target_loss``.
"""

from __future__ import annotations

from collections.abc import Sequence


def time_to_target(
    curve: Sequence[tuple[float, float, float]],
    target: float | None,
    wall_s: float,
    final_loss: float | None,
) -> float | None:
    """Seconds since the start until the held-out loss was first at or below ``target``; None if
    never (or no target).

    ``curve`` is the evaluator's (seconds, loss, accuracy), in time order. The
    time is that of the first measured point at or below the target, not an
    interpolation: measurements are about a second apart, so the figure can
    be up to the evaluator's interval late, alike for every plan. A run whose
    curve never reaches the target but whose final model does (measured once
    more at the end) reached it at its wall time.
    """
    if target is None:
        return None
    reached = next((t for t, loss, _ in curve if loss <= target), None)
    if reached is not None:
        return reached
    return wall_s if final_loss is not None and final_loss <= target else None
