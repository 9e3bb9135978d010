"""One parameter-server shard's part of the model: parameters, optimizer, ledger, applied-update
count.

The shard's tensors live in one flat float32 parameter with its own
optimizer (SGD and the common optimizers act element by element, so a flat
tensor behaves as the tensors would). An update is applied together with the
ledger count of its samples, under one lock, so a checkpoint or a pull never
sees one without the other.
"""

from __future__ import annotations

import threading

import torch

from antdt.errors import AntdtError
from antdt.worker.ledger import SampleLedger


class ShardModel:
    def __init__(self, lr: float, momentum: float = 0.0):
        self.lr, self.momentum = lr, momentum
        self.lock = threading.Lock()
        self.flat: torch.nn.Parameter | None = None
        self.signature: list | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.ledger: SampleLedger | None = None
        self.version = 0  # updates applied

    @property
    def initialized(self) -> bool:
        return self.flat is not None

    def initialize(self, signature: list, values: torch.Tensor) -> bool:
        """Take the first worker's initial values; False (and nothing changed) if already
        initialized."""
        with self.lock:
            if self.flat is not None:
                if signature != self.signature:
                    raise AntdtError(
                        f"this shard holds {self.signature}; a worker sent {signature}"
                    )
                return False
            self._create(signature, values.clone())
            return True

    def _create(self, signature: list, values: torch.Tensor) -> None:
        self.signature = signature
        self.flat = torch.nn.Parameter(values)
        self.optimizer = torch.optim.SGD([self.flat], lr=self.lr, momentum=self.momentum)

    def define_ledger(self, size: int, epochs: int) -> None:
        with self.lock:
            if self.ledger is None:
                self.ledger = SampleLedger(size, epochs)

    def apply(self, gradient: torch.Tensor, epoch: int, samples: list[int]) -> None:
        """One update into the parameters, and its samples into the ledger, together."""
        with self.lock:
            if gradient.numel() != self.flat.numel():
                raise AntdtError(
                    f"an update of {gradient.numel()} values for a shard of {self.flat.numel()}"
                )
            self.flat.grad = gradient.view_as(self.flat)
            self.optimizer.step()
            self.flat.grad = None
            if self.ledger is not None:
                self.ledger.add(epoch, samples)
            self.version += 1

    def values(self) -> tuple[int, torch.Tensor]:
        """(version, a copy of the parameters) for a pull."""
        with self.lock:
            return self.version, self.flat.detach().clone()

    def state_dict(self) -> dict:
        with self.lock:
            return {
                "signature": self.signature,
                "values": self.flat.detach().clone(),
                "optimizer": self.optimizer.state_dict(),
                "version": self.version,
                "ledger": self.ledger.state_dict() if self.ledger is not None else None,
            }

    def load_state_dict(self, state: dict) -> None:
        with self.lock:
            self._create(state["signature"], state["values"].clone())
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = state["version"]
            if state["ledger"] is not None:
                counts = state["ledger"]["counts"]
                self.ledger = SampleLedger(counts.shape[1], counts.shape[0])
                self.ledger.load_state_dict(state["ledger"])
