"""``ParameterServerJob``'s bad input (one clear error before anything starts) and how its waits are
booked (its training is in test_server.py and, under torchrun, test_torchrun.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from antdt.errors import AntdtError
from antdt.worker.example import SyntheticClassification, make_model
from antdt.worker.ps.job import REFUSALS_IN_A_ROW, ParameterServerJob, _addresses


def test_without_servers_given_or_configured_it_says_how_to_give_them(monkeypatch):
    monkeypatch.delenv("ANTDT_PS_SERVERS", raising=False)
    with pytest.raises(AntdtError, match="ANTDT_PS_SERVERS.*antdt up --mode async"):
        ParameterServerJob(make_model(), SyntheticClassification(64), batch_size=8)


def test_a_ddp_model_is_refused_naming_the_module_to_pass_instead():
    class Wrapped(torch.nn.parallel.DistributedDataParallel):
        def __init__(self):  # no process group needed to be one
            torch.nn.Module.__init__(self)

    with pytest.raises(AntdtError, match="pass the module itself"):
        ParameterServerJob(Wrapped(), SyntheticClassification(64), batch_size=8, servers="h:1")


@pytest.mark.parametrize(
    ("given", "configured", "expected"),
    [
        ("a:1, b:2", None, ["a:1", "b:2"]),
        (["a:1", "b:2"], "c:3", ["a:1", "b:2"]),
        (None, "c:3,d:4", ["c:3", "d:4"]),
    ],
)
def test_the_servers_given_win_over_the_configured_ones_in_shard_order(given, configured, expected):
    assert _addresses(given, configured) == expected


def test_a_configured_address_that_is_not_host_port_is_one_line_naming_the_variable(monkeypatch):
    from antdt.errors import ConfigError
    from antdt.settings import load_settings

    monkeypatch.setenv("ANTDT_PS_SERVERS", "ps-0")
    with pytest.raises(ConfigError, match="^ANTDT_PS_SERVERS: expected host:port"):
        load_settings()


class EpochEndFeed:
    """A feed with nothing for ``empty`` takes (the sharder saying wait: the others hold the
    epoch's last shards), then one batch."""

    def __init__(self, empty: int):
        self.empty = empty
        self.exhausted = False

    def take(self, wanted: int):
        if self.empty:
            self.empty -= 1
            return None
        return "batch"


def test_waiting_for_the_others_at_an_epoch_s_end_is_booked_as_synchronisation_not_data():
    """Booked as data, an epoch's end made every waiting worker look slow per sample to the monitor
    (and, once the window moved on, everyone a leader)."""
    from antdt.worker import Agent

    agent = Agent("job-book", "w0", listen_for_commands=False)
    job = SimpleNamespace(
        agent=agent, feed=EpochEndFeed(empty=4), data=SimpleNamespace(waiting=True)
    )
    assert ParameterServerJob._next_batch(job) == "batch"
    record = agent.step(samples=32)
    assert record.sync_wait_s >= 4 * 0.05 > record.data_wait_s, record


def test_a_batch_refused_as_stale_time_after_time_ends_the_job_naming_the_setting():
    """A worker slower than the servers' --max-staleness would recompute its batch for ever."""
    pushes = []
    job = SimpleNamespace(
        _next_batch=lambda: "batch",
        agent=SimpleNamespace(untag=lambda batch: ("inputs", "labels")),
        server=SimpleNamespace(pull=lambda: None, push=lambda: pushes.append(1) and False),
        model=torch.nn.Linear(1, 1),
        refused=0,
    )
    with pytest.raises(AntdtError, match=f"refused as stale {REFUSALS_IN_A_ROW} times in a row"):
        for _ in ParameterServerJob.batches(job):
            pass
    assert len(pushes) == job.refused == REFUSALS_IN_A_ROW
