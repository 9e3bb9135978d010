"""``antdt control set/show`` and ``antdt replay --log commands`` against the real broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from antdt.bus.clients import producing
from antdt.cli.main import run
from antdt.control.epoch import epoch_claim
from antdt.runtime.launch import settings_env
from antdt.schemas.codec import SingleObjectCodec
from antdt.services.controller.core import ControllerCore
from tests.services.controller.helpers import verdict


@pytest.fixture
def env(settings, topics, monkeypatch):
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    return settings


def shown(capsys) -> dict:
    capsys.readouterr()
    assert run(["control", "show", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_set_then_show(env, capsys):
    assert shown(capsys) == {"controller_epoch": 0, "settings": []}
    assert run(["control", "set", "monitor.straggler_ratio=1.5", "controller.dry_run=true"]) == 0
    assert run(["control", "set", "controller.policy=antdt-dd", "--job", "j1"]) == 0
    settings = shown(capsys)["settings"]
    assert {(s["job"], s["key"], s["value"]) for s in settings} == {
        ("*", "monitor.straggler_ratio", 1.5),
        ("*", "controller.dry_run", True),
        ("j1", "controller.policy", "antdt-dd"),
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["monitor.k"], "is not KEY=VALUE"),
        (["k=2"], "keys must start with monitor. or controller."),
        (["controller.epoch=9"], "claimed by controllers"),
        (["monitor.k=two"], "is not an integer"),
        (["monitor.clear_ratio=1.4"], "clear_ratio < straggler_ratio"),
        (["controller.policy=nope"], "unknown policy"),
    ],
)
def test_bad_changes_get_one_line_and_write_nothing(env, capsys, argv, message):
    code = run(["control", "set", *argv])
    err = capsys.readouterr().err
    assert code in (1, 2) and message in err and len(err.strip().splitlines()) == 1
    assert shown(capsys)["settings"] == []


def test_the_epoch_is_shown(env, capsys):
    with producing(env) as producer:
        producer.produce(
            env.topic("control", "config"),
            key=b"*",
            value=SingleObjectCodec().encode(epoch_claim(4, "c1")),
        )
    assert shown(capsys)["controller_epoch"] == 4


def test_replay_lists_the_commands_of_a_job(env, capsys):
    core = ControllerCore()
    commands = [
        c
        for w in ("w1", "w2")
        for c in core.on_verdict(verdict(w, job="jr"), datetime.now(UTC)).commands
    ]
    commands += core.on_verdict(verdict("w1", job="other"), datetime.now(UTC)).commands
    codec = SingleObjectCodec()
    with producing(env) as producer:
        for command in commands:
            producer.produce(
                env.topic("controller", "commands"),
                key=f"{command.job_id}/{command.target_worker}".encode(),
                value=codec.encode(command),
            )
    capsys.readouterr()
    assert run(["replay", "--log", "commands", "--job", "jr", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(c["target_worker"] for c in listed) == ["w1", "w2"]
    assert all(c["verdict_id"] and c["reason"] and c["policy"] == "antdt-nd" for c in listed)
