"""Model checkpoints that carry the sharder's shard-state version.

The model, the optimizer and the shard-state version (the sharder's answer to
CHECKPOINT) are written together in one file, so a restored model always
resumes with the data position it was trained to: after loading, the agent
sends REWIND with :attr:`CheckpointInfo.shard_version` (docs/sharding.md).

The file is written beside its final name and moved over it with
``os.replace``: a crash mid-write leaves the previous checkpoint intact, never
a torn one. Loading uses ``torch.load(weights_only=True)``, which refuses
arbitrary pickled objects, so the metadata is restricted to plain types.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from antdt.errors import AntdtError

FORMAT = "antdt-checkpoint"
FORMAT_VERSION = 1

_PLAIN = (type(None), bool, int, float, str, bytes, torch.Tensor)


class CheckpointError(AntdtError):
    """A checkpoint is missing, unreadable, not an antdt checkpoint, or does not fit the model."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint holds besides the weights."""

    shard_version: int
    step: int
    extra: dict[str, Any] = field(default_factory=dict)


def _check_plain(value: Any, where: str) -> None:
    """Refuse at save time what weights_only loading would refuse later (an unloadable
    checkpoint)."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(
                    f"{where} has a key of type {type(key).__name__}; use str or int keys"
                )
            _check_plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where} is a {type(value).__name__}; checkpoint metadata must be plain types")


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    shard_version: int,
    step: int,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write model, optimizer, shard version, step and ``extra`` to ``path`` atomically; returns the
    path."""
    _check_count("shard_version", shard_version)
    _check_count("step", step)
    extra = dict(extra or {})
    _check_plain(extra, "extra")
    path = Path(path)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "shard_version": shard_version,
        "step": step,
        "extra": extra,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_atomically(payload, path)


def save_atomically(obj, path: Path, durable: bool = True) -> Path:
    """``torch.save`` to a temporary file beside ``path``, then rename: a reader never sees half a
    file.

    ``durable``: fsync the file and its directory, so a power cut leaves the old file or the new
    one.
    """
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(obj, file)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if durable:
        _fsync_dir(path.parent)
    return path


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _read(path: Path, map_location: Any) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch.load fails in many ways; all mean "unreadable"
        raise CheckpointError(f"checkpoint {path} is unreadable: {_first_line(error)}") from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an antdt checkpoint")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {payload.get('format_version')!r}; "
            f"this antdt reads {FORMAT_VERSION}"
        )
    return payload


def _check_fits(path: Path, model: torch.nn.Module, saved: Mapping[str, Any]) -> None:
    """Compare before loading, so a mismatch leaves the model untouched (load_state_dict may
    half-load)."""
    current = model.state_dict()
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not fit the model: {len(missing)} missing keys "
            f"(first: {missing[:1]}), "
            f"{len(unexpected)} unexpected (first: {unexpected[:1]})"
        )
    for key, value in current.items():
        other = saved[key]
        if (
            isinstance(value, torch.Tensor)
            and isinstance(other, torch.Tensor)
            and value.shape != other.shape
        ):
            raise CheckpointError(
                f"checkpoint {path} does not fit the model: "
                f"{key} is {tuple(other.shape)} there, {tuple(value.shape)} here"
            )


def _check_optimizer_fits(path: Path, optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """The checks Optimizer.load_state_dict makes, done before the model is touched."""
    if saved is None:
        raise CheckpointError(f"checkpoint {path} holds no optimizer state")
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list):
        raise CheckpointError(f"checkpoint {path} has a malformed optimizer state")
    ours = [len(group["params"]) for group in optimizer.param_groups]
    theirs = [len(group.get("params", ())) for group in groups]
    if ours != theirs:
        raise CheckpointError(
            f"checkpoint {path} does not fit the optimizer: parameter groups "
            f"of sizes {theirs} there, {ours} here"
        )


def load_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: Any = None,
    only_if: Callable[[CheckpointInfo], bool] | None = None,
) -> CheckpointInfo | None:
    """Load ``path`` into ``model`` (and ``optimizer`` if given); returns the shard version, step
    and extra.

    With ``only_if``, a checkpoint it refuses (another job's, say) is left
    unloaded and None returned: the model is not touched.
    """
    path = Path(path)
    payload = _read(path, map_location)
    try:
        shard_version, step, extra = payload["shard_version"], payload["step"], payload["extra"]
        model_state, optimizer_state = payload["model"], payload["optimizer"]
    except KeyError as error:
        raise CheckpointError(f"checkpoint {path} lacks {error.args[0]!r}") from None
    info = CheckpointInfo(shard_version=shard_version, step=step, extra=extra)
    if only_if is not None and not only_if(info):
        return None
    _check_fits(path, model, model_state)
    if optimizer is not None:
        _check_optimizer_fits(path, optimizer, optimizer_state)
    try:
        model.load_state_dict(model_state)
    except (RuntimeError, ValueError, KeyError) as error:
        raise CheckpointError(
            f"checkpoint {path} does not fit the model: {_first_line(error)}"
        ) from error
    if optimizer is not None:
        try:
            optimizer.load_state_dict(optimizer_state)
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(
                f"checkpoint {path} does not fit the optimizer: {_first_line(error)}"
            ) from error
    return info
