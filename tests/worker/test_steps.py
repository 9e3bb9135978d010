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


def test_a_summary_fills_every_step_field_of_a_metrics_report():
    from antdt.schemas.models import WorkerMetrics
    from antdt.worker.steps import StepRecord, summarize

    summary = summarize(
        [StepRecord(7, 0.2, 0.01, 0.03, 32, 32), StepRecord(8, 0.4, 0.0, 0.0, 30, 32)]
    )
    fields = summary.report_fields()
    assert set(fields) <= set(WorkerMetrics.model_fields)
    assert (fields["first_step"], fields["last_step"], fields["samples"]) == (7, 8, 62)
    assert fields["compute"].max_s == 0.4
