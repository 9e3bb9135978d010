"""Checkpoints: model, optimizer and shard-state version together, written atomically."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from antdt.errors import AntdtError
from antdt.worker.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    load_checkpoint,
    save_checkpoint,
)


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model and an Adam optimizer with state (moments, step counts) after two steps."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_round_trip_restores_model_optimizer_version_step_and_extra(tmp_path: Path):
    model, optimizer = trained(0)
    extra = {
        "epoch": 3,
        "batch_sizes": [(5, 16), (10, 24)],
        "note": "before resize",
        "rng": torch.get_rng_state(),
    }
    path = save_checkpoint(
        tmp_path / "ckpt.pt", model, optimizer, shard_version=1234, step=77, extra=extra
    )
    assert path == tmp_path / "ckpt.pt"

    fresh, fresh_optimizer = trained(1)  # different weights and optimizer state
    info = load_checkpoint(path, fresh, fresh_optimizer)

    assert info == CheckpointInfo(shard_version=1234, step=77, extra=info.extra)
    assert info.extra.keys() == extra.keys() and info.extra["batch_sizes"] == [(5, 16), (10, 24)]
    assert torch.equal(info.extra["rng"], extra["rng"])
    assert_same(fresh.state_dict(), model.state_dict())
    assert_same(fresh_optimizer.state_dict(), optimizer.state_dict())


def test_load_without_optimizer_and_with_map_location(tmp_path: Path):
    model, optimizer = trained(0)
    save_checkpoint(tmp_path / "ckpt.pt", model, None, shard_version=0, step=0)
    fresh, _ = trained(1)
    assert load_checkpoint(tmp_path / "ckpt.pt", fresh, map_location="cpu") == CheckpointInfo(
        0, 0, {}
    )
    assert_same(fresh.state_dict(), model.state_dict())
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load_checkpoint(tmp_path / "ckpt.pt", fresh, optimizer)


def test_save_replaces_atomically_and_leaves_no_temp_file(tmp_path: Path):
    model, optimizer = trained(0)
    target = tmp_path / "nested" / "ckpt.pt"
    save_checkpoint(target, model, optimizer, shard_version=1, step=10)
    save_checkpoint(target, model, optimizer, shard_version=2, step=20)
    assert [p.name for p in target.parent.iterdir()] == ["ckpt.pt"]
    assert load_checkpoint(target, model).shard_version == 2


def test_a_failed_save_keeps_the_previous_checkpoint_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    model, optimizer = trained(0)
    target = tmp_path / "ckpt.pt"
    save_checkpoint(target, model, optimizer, shard_version=1, step=10)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(target, model, optimizer, shard_version=2, step=20)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert load_checkpoint(target, model).shard_version == 1


def test_missing_file_is_a_checkpoint_error(tmp_path: Path):
    model, _ = trained(0)
    with pytest.raises(CheckpointError, match="no checkpoint at") as caught:
        load_checkpoint(tmp_path / "absent.pt", model)
    assert isinstance(caught.value, AntdtError)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_file_is_a_one_line_checkpoint_error(tmp_path: Path, damage: str):
    model, optimizer = trained(0)
    path = save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, shard_version=5, step=1)
    data = path.read_bytes()
    path.write_bytes(
        {"truncate": data[: len(data) // 2], "garbage": b"not a checkpoint" * 10, "empty": b""}[
            damage
        ]
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="unreadable") as caught:
        load_checkpoint(path, model, optimizer)
    assert "\n" not in str(caught.value)
    assert_same(model.state_dict(), before)


def test_a_foreign_torch_file_is_refused(tmp_path: Path):
    model, _ = trained(0)
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="not an antdt checkpoint"):
        load_checkpoint(tmp_path / "plain.pt", model)


def test_a_checkpoint_of_another_model_is_refused_before_touching_the_model(tmp_path: Path):
    model, optimizer = trained(0)
    save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, shard_version=5, step=1)
    wider = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    other = torch.nn.Sequential(torch.nn.Linear(3, 4))
    for target in (wider, other):
        before = {k: v.clone() for k, v in target.state_dict().items()}
        with pytest.raises(CheckpointError, match="does not fit the model") as caught:
            load_checkpoint(tmp_path / "ckpt.pt", target)
        assert "\n" not in str(caught.value)
        assert_same(target.state_dict(), before)


def test_an_optimizer_that_does_not_fit_is_refused_before_touching_the_model(tmp_path: Path):
    model, optimizer = trained(0)
    save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, shard_version=5, step=1)
    fresh, _ = trained(1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    partial = torch.optim.Adam(list(fresh.parameters())[:2])
    with pytest.raises(CheckpointError, match="does not fit the optimizer"):
        load_checkpoint(tmp_path / "ckpt.pt", fresh, partial)
    assert_same(fresh.state_dict(), before)


def test_bad_metadata_is_refused_at_save_time(tmp_path: Path):
    model, optimizer = trained(0)
    with pytest.raises(TypeError, match="plain types"):
        save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, 1, 1, extra={"when": object()})
    with pytest.raises(TypeError, match="key"):
        save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, 1, 1, extra={"nested": {(1, 2): 3}})
    for version, step in [(-1, 0), (0, -1), (True, 0), (1.0, 0)]:
        with pytest.raises(ValueError):
            save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, version, step)
    assert not (tmp_path / "ckpt.pt").exists()
