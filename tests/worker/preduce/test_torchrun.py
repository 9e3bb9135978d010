"""The partial-reduce example under torchrun with ``antdt up --mode preduce``: one rank slowed,
every sample once.

Real torchrun, gloo, the grouper ``antdt up`` starts, the sharder's log
audited: what a user runs with ``torchrun ... examples/preduce_antdt.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_up_cmd import serving
from tests.worker.elastic.test_torchrun import (
    assert_audit_clean,
    assert_ledger_all_ones,
    finish,
    torchrun,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).parents[3] / "examples" / "preduce_antdt.py"


@pytest.fixture(scope="module")
def bus():
    """``antdt up --mode preduce``: the broker, the three services and the grouper."""
    with serving("--mode", "preduce", last="grouper") as settings:
        yield settings


def test_with_a_rank_slowed_every_sample_is_in_the_model_once_and_the_log_audits_clean(
    bus, tmp_path
):
    run = torchrun(
        bus,
        "tr-preduce",
        tmp_path,
        "--standalone",
        "--nproc-per-node",
        "3",
        samples=6000,
        example=EXAMPLE,
        ANTDT_SLOWDOWN="3",
        ANTDT_SLOWDOWN_RANKS="2",
    )
    assert finish(run, tmp_path) == 0
    assert_ledger_all_ones(tmp_path)
    assert_audit_clean(bus, "tr-preduce")
    log = (tmp_path / "torchrun-n.log").read_text()
    assert "held-out accuracy" in log, log[-2000:]
