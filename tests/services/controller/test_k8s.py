"""The Kubernetes actuator: which REST calls each command makes, and how answers are handled.

The API server is :class:`~tests.services.controller.k8s_api.RecordingApiServer`
on localhost.
"""

from __future__ import annotations

import pytest

from antdt.errors import ConfigError
from antdt.schemas.examples import mitigation_command
from antdt.schemas.models import CommandAction
from antdt.services.controller import metrics
from antdt.services.controller.k8s import (
    KubernetesActuator,
    KubernetesApi,
    KubernetesSettings,
    Outcome,
    calls_for,
    load_kubernetes_settings,
)
from tests.services.controller.k8s_api import RecordingApiServer


@pytest.fixture
def api_server():
    server = RecordingApiServer()
    yield server
    server.close()


def command(action: CommandAction, **changes):
    return mitigation_command().model_copy(
        update={"action": action, "target_worker": "train-0-abcde", **changes}
    )


def actuator_for(server: RecordingApiServer, token: str | None = "t0ken") -> KubernetesActuator:
    return KubernetesActuator(
        KubernetesApi(server.url, token, None, timeout_s=5), "training", "antdt.io/degraded"
    )


def counted(action: CommandAction, outcome: Outcome) -> float:
    return metrics.K8S_ACTIONS.labels(action.value, outcome.value)._value.get()


@pytest.mark.parametrize("action", [CommandAction.RESTART, CommandAction.EVICT])
def test_restart_and_evict_delete_the_workers_pod(api_server, action):
    before = counted(action, Outcome.DONE)
    assert actuator_for(api_server).act(command(action)) == [Outcome.DONE]
    (request,) = api_server.requests
    assert (request["method"], request["path"]) == (
        "DELETE",
        "/api/v1/namespaces/training/pods/train-0-abcde",
    )
    assert request["headers"]["Authorization"] == "Bearer t0ken"
    assert counted(action, Outcome.DONE) == before + 1


def test_a_degraded_node_gets_the_label_the_pod_template_avoids(api_server):
    marked = command(CommandAction.MARK_NODE_DEGRADED, parameters={"node": "gpu-node-7"})
    assert actuator_for(api_server).act(marked) == [Outcome.DONE]
    (request,) = api_server.requests
    assert (request["method"], request["path"]) == ("PATCH", "/api/v1/nodes/gpu-node-7")
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
    assert request["body"] == {"metadata": {"labels": {"antdt.io/degraded": "true"}}}


@pytest.mark.parametrize(
    "changes",
    [
        {"action": CommandAction.RESTART, "dry_run": True},
        {"action": CommandAction.ADJUST_BATCH_SIZE},
        {"action": CommandAction.SET_SHARD_QUOTA},
        {"action": CommandAction.MARK_NODE_DEGRADED, "parameters": {}},
    ],
)
def test_dry_runs_and_what_agents_do_alone_make_no_call(changes):
    assert calls_for(command(**changes), "training", "antdt.io/degraded") == []


def test_a_pod_already_gone_is_not_a_failure(api_server):
    api_server.statuses[("DELETE", "/api/v1/namespaces/training/pods/train-0-abcde")] = 404
    assert actuator_for(api_server).act(command(CommandAction.RESTART)) == [Outcome.GONE]


def test_a_forbidden_call_is_logged_and_counted_not_raised(api_server, caplog):
    api_server.statuses[("PATCH", "/api/v1/nodes/n1")] = 403
    before = counted(CommandAction.MARK_NODE_DEGRADED, Outcome.FAILED)
    marked = command(CommandAction.MARK_NODE_DEGRADED, parameters={"node": "n1"})
    assert actuator_for(api_server).act(marked) == [Outcome.FAILED]
    assert counted(CommandAction.MARK_NODE_DEGRADED, Outcome.FAILED) == before + 1
    assert "answered 403 (check the remediation RBAC)" in caplog.text


def test_an_unreachable_api_server_is_a_counted_failure(api_server):
    url = api_server.url
    api_server.close()
    actuator = KubernetesActuator(KubernetesApi(url, None, None, timeout_s=1), "training")
    assert actuator.act(command(CommandAction.EVICT)) == [Outcome.FAILED]


def test_submitted_commands_are_carried_out_in_order_off_the_callers_thread(api_server):
    actuator = actuator_for(api_server).start()
    actuator.submit(command(CommandAction.MARK_NODE_DEGRADED, parameters={"node": "n1"}))
    actuator.submit(command(CommandAction.RESTART))
    actuator.submit(command(CommandAction.ADJUST_BATCH_SIZE))  # nothing to do on the cluster
    actuator.close()
    assert [(r["method"], r["path"]) for r in api_server.wait_for(2)] == [
        ("PATCH", "/api/v1/nodes/n1"),
        ("DELETE", "/api/v1/namespaces/training/pods/train-0-abcde"),
    ]


def test_remediation_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv("ANTDT_K8S_REMEDIATION", raising=False)
    assert KubernetesActuator.from_settings(load_kubernetes_settings()) is None


def test_in_cluster_defaults_come_from_the_service_account(tmp_path, monkeypatch):
    (tmp_path / "namespace").write_text("ml-team\n")
    (tmp_path / "token").write_text("sa-token\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    actuator = KubernetesActuator.from_settings(
        KubernetesSettings(remediation=True, service_account_dir=tmp_path)
    )
    assert (actuator.namespace, actuator.api.url) == ("ml-team", "https://10.0.0.1:6443")


def test_outside_a_pod_without_an_api_url_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="not a pod .* set ANTDT_K8S_API_URL"):
        KubernetesActuator.from_settings(
            KubernetesSettings(remediation=True, namespace="x", service_account_dir=tmp_path)
        )


def test_a_bad_setting_names_its_variable(monkeypatch):
    monkeypatch.setenv("ANTDT_K8S_DEGRADED_LABEL", "not a label!")
    with pytest.raises(ConfigError, match="^ANTDT_K8S_DEGRADED_LABEL: "):
        load_kubernetes_settings()
