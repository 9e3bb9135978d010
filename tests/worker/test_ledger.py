"""The ledger: counts, files, the slots that carry it through an all-reduce, and the ranks' sum
(no Kafka)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from antdt.errors import AntdtError
from antdt.worker.ledger import SampleLedger, SyncedLedger, read_ledgers
from antdt.worker.provenance import SampleTag
from tests.worker.groups import join_gloo

# per rank: the samples it trains before each sum (uneven: rank 1 trains nothing before the first)
TRAINED = {0: [[(0, 1), (0, 2), (1, 0)], [(1, 5)]], 1: [[], [(0, 3), (1, 1), (1, 2)]]}


def test_counts_are_kept_per_epoch_and_written_as_one_array_per_epoch(tmp_path):
    ledger = SampleLedger(size=6, epochs=2)
    ledger.add(0, [0, 1, 2, 3, 4, 5])
    ledger.add_tags([SampleTag(1, 2), SampleTag(1, 2), SampleTag(0, 4)])
    paths = ledger.write(tmp_path)
    assert [p.name for p in paths] == ["ledger-epoch0.npy", "ledger-epoch1.npy"]
    found = read_ledgers(tmp_path)
    assert found[0].tolist() == [1, 1, 1, 1, 2, 1] and found[1].tolist() == [0, 0, 2, 0, 0, 0]
    assert found[0].dtype == np.int32


def test_a_ledger_restores_only_into_its_own_shape():
    ledger = SampleLedger(4, 1)
    ledger.add(0, [1])
    restored = SampleLedger(4, 1)
    restored.load_state_dict(ledger.state_dict())
    assert torch.equal(restored.counts, ledger.counts)
    with pytest.raises(AntdtError, match="does not fit"):
        SampleLedger(5, 1).load_state_dict(ledger.state_dict())


def synced_rank(rank: int, init_file: str, out_dir: str) -> None:
    join_gloo(init_file, rank)
    ledger = SyncedLedger(SampleLedger(6, 2))
    for trained in TRAINED[rank]:
        ledger.count([SampleTag(epoch, index) for epoch, index in trained])
        ledger.sum()
    torch.save(ledger.ledger.counts, Path(out_dir) / f"rank-{rank}.pt")
    torch.distributed.destroy_process_group()


def test_ranks_counting_their_own_samples_agree_on_every_rank_after_a_sum(tmp_path: Path):
    mp.spawn(synced_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    expected = SampleLedger(6, 2)
    expected.add_samples(pair for batches in TRAINED.values() for b in batches for pair in b)
    for rank in TRAINED:
        assert torch.equal(torch.load(tmp_path / f"rank-{rank}.pt"), expected.counts)


def test_one_process_sums_its_own_counts():
    ledger = SyncedLedger(SampleLedger(4, 1))
    ledger.count([SampleTag(0, 3), SampleTag(0, 3)])
    assert ledger.ledger.counts.sum() == 0  # counted, not summed yet
    ledger.sum()
    assert ledger.ledger.counts[0].tolist() == [0, 0, 0, 2]
