"""A parameter-server shard's checkpoints, named by the log seq of the CHECKPOINT they were taken
at.

Every shard saves at the same CHECKPOINT events of the shard log, so a seq
names a state that exists on every shard: a rollback to it is consistent
across the model. Files are written aside and renamed (a crash leaves no torn
file); the newest few are kept, and every one of the last minutes.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from antdt.errors import AntdtError
from antdt.worker.checkpoint import save_atomically

_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


class CheckpointStore:
    def __init__(self, directory: str | Path, keep: int = 4, keep_s: float = 300.0):
        """The newest ``keep`` are kept, and every one younger than ``keep_s``: a shard that was
        down that long still finds the version the others go back to."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep, self.keep_s = keep, keep_s

    def versions(self) -> list[int]:
        return sorted(
            int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name))
        )

    def latest(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def save(self, version: int, state: dict) -> Path:
        path = save_atomically(state, self.directory / f"ckpt-{version}.pt", durable=False)
        now = time.time()
        for old in self.versions()[: -self.keep]:
            stale = self.directory / f"ckpt-{old}.pt"
            if now - stale.stat().st_mtime > self.keep_s:
                stale.unlink(missing_ok=True)
        return path

    def load(self, version: int) -> dict:
        path = self.directory / f"ckpt-{version}.pt"
        if not path.exists():
            raise AntdtError(
                f"no checkpoint at version {version} in {self.directory} (have {self.versions()})"
            )
        return torch.load(path, weights_only=True)

    def forget_after(self, version: int) -> None:
        """Drop checkpoints of a timeline a rewind abandoned."""
        for newer in (v for v in self.versions() if v > version):
            (self.directory / f"ckpt-{newer}.pt").unlink(missing_ok=True)
