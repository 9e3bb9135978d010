"""The parameter-server example under torchrun with ``antdt up --mode async``: one rank slowed,
every sample once.

Real torchrun, the parameter server ``antdt up`` starts for the job, the
sharder's log audited against the server's ledger: what a user runs with
``torchrun ... examples/ps_antdt.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from antdt.worker.ledger import read_ledgers
from tests.cli.test_up_cmd import serving
from tests.worker.elastic.test_torchrun import assert_audit_clean, finish, torchrun, until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).parents[3] / "examples" / "ps_antdt.py"
JOB = "tr-async"


@pytest.fixture(scope="module")
def bus(tmp_path_factory):
    """``antdt up --mode async``: the broker, the three services and the job's parameter server."""
    logs = tmp_path_factory.mktemp("up")
    with serving(
        "--mode", "async", "--job", JOB, "--ps-lr", "0.02", "--log-dir", str(logs), last="ps-0"
    ) as settings:
        yield settings, logs / "ledger" / "ps-0"


def test_with_a_rank_slowed_every_sample_is_in_the_servers_model_once_and_the_log_audits_clean(
    bus, tmp_path
):
    settings, ledger = bus
    run = torchrun(
        settings,
        JOB,
        tmp_path,
        "--standalone",
        "--nproc-per-node",
        "3",
        samples=6000,
        example=EXAMPLE,
        checkpointed=False,
        ANTDT_SLOWDOWN="3",
        ANTDT_SLOWDOWN_RANKS="2",
    )
    assert finish(run, tmp_path) == 0
    log = (tmp_path / "torchrun-n.log").read_text()
    assert "held-out accuracy" in log, log[-2000:]
    assert_audit_clean(settings, JOB)
    # the server writes an epoch's ledger when it reads the epoch's close, a moment after the
    # sharder logged it
    until(lambda: (ledger / "ledger-epoch1.npy").exists(), "the server's last ledger", 30.0)
    ledgers = read_ledgers(ledger)
    assert sorted(ledgers) == [0, 1]
    assert all(np.all(counts == 1) for counts in ledgers.values()), {
        epoch: int(np.sum(counts != 1)) for epoch, counts in ledgers.items()
    }
