"""How well the run's shared model does on held-out data, over time and at the end.

The harness reads the model as an observer while the run goes: from the
parameter server (asynchronous plans) or from the snapshot rank 0 leaves
every second (synchronous plans, where every rank holds the same model), and
measures loss and accuracy on samples of the same clusters that no worker
trains on. The curve goes into the report; the final figures into the
benchmark's JSON.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from antdt.demo.scenario import Scenario
from antdt.worker.example import SyntheticClassification, evaluate, make_model
from antdt.worker.ps.client import read_parameters

HELDOUT_SAMPLES = 2048

#: Puts the current shared model into the given module; False when it cannot be read now.
ModelSource = Callable[[torch.nn.Module], bool]


def from_servers(addresses: list[str]) -> ModelSource:
    return lambda model: read_parameters(addresses, model)


def from_file(path: Path) -> ModelSource:
    def read(model: torch.nn.Module) -> bool:
        try:
            model.load_state_dict(torch.load(path, weights_only=True))
        except (OSError, RuntimeError, EOFError):
            return False
        return True

    return read


class Evaluator:
    """Held-out loss and accuracy of the shared model, every ``every_s`` on a thread of its own."""

    def __init__(
        self,
        scenario: Scenario,
        source: ModelSource,
        clock: Callable[[], float],
        every_s: float = 1.0,
    ):
        self.heldout = SyntheticClassification(scenario.dataset_size, seed=scenario.seed).heldout(
            HELDOUT_SAMPLES
        )
        self.source, self.clock, self.every_s = source, clock, every_s
        self.model = make_model()
        self.curve: list[tuple[float, float, float]] = []  # (seconds since start, loss, accuracy)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="antdt-evaluator", daemon=True)

    def start(self) -> Evaluator:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.measure()

    def measure(self, source: ModelSource | None = None) -> tuple[float, float] | None:
        if not (source or self.source)(self.model):
            return None
        loss, accuracy = evaluate(self.model, self.heldout)
        self.curve.append((self.clock(), loss, accuracy))
        return loss, accuracy

    def final(
        self, source: ModelSource | None = None, attempts: int = 20
    ) -> tuple[float, float] | None:
        """Stop measuring over time; the figures of the final model (retried briefly if it cannot be
        read)."""
        self._stop.set()
        self._thread.join(5)
        for _ in range(attempts):
            figures = self.measure(source)
            if figures is not None:
                return figures
            time.sleep(0.1)
        return None
