"""Step timing on a GPU: the clock is read after the queued kernels, not when they were queued."""

from __future__ import annotations

import pytest
import torch

from antdt.worker.steps import settle_device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_settling_waits_for_the_kernels_already_queued():
    torch.cuda.init()
    # a kernel spinning for about 0.1 s: still running when the call returns
    torch.cuda._sleep(200_000_000)
    queued = torch.cuda.Event()
    queued.record()
    assert not queued.query(), "the kernel finished before it could be waited for: lengthen it"
    settle_device()
    assert queued.query()
