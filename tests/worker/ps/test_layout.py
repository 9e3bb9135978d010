"""How a model is split between parameter-server shards, and the wire between them (no Kafka)."""

from __future__ import annotations

import socket

import pytest
import torch

from antdt.errors import AntdtError
from antdt.worker.ps import wire
from antdt.worker.ps.layout import Layout


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def test_tensors_are_spread_by_size_and_every_worker_computes_the_same_split():
    layout = Layout.of(model(), 2)
    assert layout == Layout.of(model(), 2)
    assert sorted(i for k in range(2) for i in layout.members(k)) == list(range(4))
    # the largest tensor alone, the rest on the other
    assert abs(layout.size(0) - layout.size(1)) <= 64 * 32
    assert layout.size(0) + layout.size(1) == sum(p.numel() for p in model().parameters())


def test_gather_and_scatter_round_trip_and_a_missing_gradient_is_zero():
    source, target = model(), model()
    for p in target.parameters():
        p.data.zero_()
    layout = Layout.of(source, 3)
    params = list(source.parameters())
    for shard in range(3):
        layout.scatter(layout.gather(params, shard), shard, list(target.parameters()))
    for a, b in zip(source.parameters(), target.parameters()):
        assert torch.equal(a, b)
    assert layout.gather([None] * 4, 0).abs().sum() == 0


def test_only_float32_parameters_are_held():
    with pytest.raises(AntdtError, match="float32"):
        Layout.of(model().double(), 1)


def test_a_frame_carries_a_header_and_a_tensor_and_a_closed_peer_is_an_error():
    left, right = socket.socketpair()
    with left, right:
        wire.send(left, {"op": "prepare", "n": 3}, torch.arange(5, dtype=torch.float32))
        header, payload = wire.receive(right)
        assert header == {"op": "prepare", "n": 3} and payload.tolist() == [0, 1, 2, 3, 4]
        wire.send(left, {"op": "pull"})
        assert wire.receive(right) == ({"op": "pull"}, None)
        left.close()
        with pytest.raises(wire.WireError, match="closed"):
            wire.receive(right)
