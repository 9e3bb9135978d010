"""Provenance travels with samples: grouping into commits, and DataLoader collation (no Kafka)."""

from __future__ import annotations

import torch

from antdt.worker.provenance import SampleTag, Tagged, collate, commits_by_epoch


def test_tags_are_grouped_by_grant_and_epoch_and_static_tags_are_left_out():
    tags = [
        SampleTag(0, 5, 1, 0, "w0"),
        SampleTag(0, 3, 1, 0, "w0"),
        SampleTag(0, 20, 2, 1, "w0.loader1"),
        SampleTag(1, 7, 1, 0, "w0"),
        SampleTag(0, 99),
    ]
    grouped = commits_by_epoch(tags)
    assert sorted(grouped) == [0, 1]
    assert [(c.holder, c.shard_id, c.attempt, c.samples) for c in grouped[0]] == [
        ("w0", 1, 0, [5, 3]),
        ("w0.loader1", 2, 1, [20]),
    ]
    assert [(c.shard_id, c.samples) for c in grouped[1]] == [(1, [7])]
    assert commits_by_epoch([SampleTag(0, 1)]) == {}


def test_collate_keeps_every_tag_beside_the_batch():
    items = [
        Tagged((torch.tensor([float(i)]), torch.tensor(i)), (SampleTag(0, i, 0, 0, "w"),))
        for i in range(3)
    ]
    batch = collate(items)
    inputs, labels = batch.data
    assert inputs.shape == (3, 1) and labels.tolist() == [0, 1, 2]
    assert [t.index for t in batch.tags] == [0, 1, 2]
    custom = collate(items, inner=lambda samples: len(samples))
    assert custom.data == 3 and len(custom.tags) == 3
