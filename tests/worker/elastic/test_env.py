"""Identity under torchrun: read from torchrun's variables, stable across restarts, a clear error
when broken."""

from __future__ import annotations

import pytest

from antdt.errors import ConfigError
from antdt.settings import load_settings
from antdt.worker.agent import AgentSpec
from antdt.worker.elastic.env import TorchrunEnv

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "run-7",
    "RANK": "4",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "6",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "2",
    "GROUP_WORLD_SIZE": "3",
    "TORCHELASTIC_RESTART_COUNT": "1",
    "TORCHELASTIC_MAX_RESTARTS": "3",
}


@pytest.fixture
def under_torchrun(monkeypatch):
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NODE_NAME", "gpu-node-3")


def test_nothing_to_read_outside_torchrun():
    assert TorchrunEnv.detect({"RANK": "0"}) is None


def test_torchruns_variables_are_read():
    env = TorchrunEnv.detect(TORCHRUN)
    assert env == TorchrunEnv("run-7", 4, 1, 6, 2, 2, 3, 1, 3)
    assert env.named_run and env.worker_id("gpu-node-3") == "gpu-node-3-1"
    assert not TorchrunEnv.detect({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}).named_run


@pytest.mark.parametrize("variable, value", [("RANK", "x"), ("LOCAL_RANK", "-1")])
def test_a_broken_variable_is_named(variable, value):
    with pytest.raises(ConfigError, match=variable):
        TorchrunEnv.detect({**TORCHRUN, variable: value})


def test_the_agent_takes_its_identity_from_torchrun(under_torchrun):
    spec = AgentSpec.from_settings(load_settings())
    assert (spec.job_id, spec.worker_id, spec.rank, spec.world_size) == (
        "run-7",
        "gpu-node-3-1",
        4,
        6,
    )
    assert spec.launch.restart_count == 1


def test_what_the_user_set_wins(under_torchrun, monkeypatch):
    monkeypatch.setenv("ANTDT_JOB_ID", "resnet")
    monkeypatch.setenv("ANTDT_WORKER_ID", "w9")
    spec = AgentSpec.from_settings(load_settings())
    assert (spec.job_id, spec.worker_id) == ("resnet", "w9")


def test_an_unnamed_run_keeps_the_default_job(under_torchrun, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert AgentSpec.from_settings(load_settings()).job_id == "default"
