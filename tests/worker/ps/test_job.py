"""``ParameterServerJob``'s bad input: one clear error before anything starts (its training is in
test_server.py and, under torchrun, test_torchrun.py)."""

from __future__ import annotations

import pytest
import torch

from antdt.errors import AntdtError
from antdt.worker.example import SyntheticClassification, make_model
from antdt.worker.ps.job import ParameterServerJob, _addresses


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
