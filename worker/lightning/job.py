"""The :class:`~antdt.worker.elastic.driven.DrivenJob` under PyTorch Lightning: what differs is
only where checkpoints live.

Lightning's ``ModelCheckpoint(save_last=True)`` keeps ``last.ckpt``: a
first start saves it before training, and a first start that finds one of
the same job refuses to train its samples again on a fresh model.
antdt's state lives under ``checkpoint["antdt"]`` (:data:`CHECKPOINT_KEY`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from antdt.worker.elastic.driven import DrivenJob

#: The key of antdt's state in a Lightning checkpoint.
CHECKPOINT_KEY = "antdt"


def checkpoint_job(path: Path) -> str | None:
    """The job id of antdt's state in the Lightning checkpoint at ``path`` (None: none)."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    return saved.get(CHECKPOINT_KEY, {}).get("job_id")


class LightningJob(DrivenJob):
    """One rank's synchronous job under a Lightning ``Trainer`` (module docstring)."""

    def __init__(self, ddp, optimizer, dataset, **options):
        super().__init__(ddp, optimizer, dataset, leftover_job=checkpoint_job, **options)
