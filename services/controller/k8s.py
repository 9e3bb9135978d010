"""Optional node remediation on Kubernetes: the controller's commands, carried out on pods and
nodes.

Why: an agent can restart its own process, but a process restarted inside the
same pod stays on the same slow node. On Kubernetes the controller can do
better, and this actuator does, once it is switched on
(``ANTDT_K8S_REMEDIATION=true``, off by default):

- ``RESTART`` or ``EVICT`` of worker W deletes the pod named W (the agent's
  worker id is its pod name, set through the downward API), so the owning Job
  or StatefulSet creates a replacement, scheduled afresh;
- ``MARK_NODE_DEGRADED`` labels the node ``<degraded_label>=true``. The
  training pod template carries a required node affinity
  ``<degraded_label> NotIn [true]``, so the replacement lands elsewhere.

Dry-run commands change nothing. Calls run on one background thread with a
bounded queue, so a slow API server never stalls the controller's loop; a
failure is logged on one line and counted, never raised into the loop.
The RBAC it needs (pods get/delete in the namespace, nodes get/patch) is in
``deploy/k8s/components/remediation``.

The client is a few REST calls over ``urllib`` with the pod's service-account
token and CA, which keeps the official client and its dependencies out of
the image for three requests.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from urllib.parse import quote

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from antdt.errors import ConfigError
from antdt.schemas.models import CommandAction, MitigationCommand
from antdt.services.controller import metrics
from antdt.settings import describe_validation_error

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_LABEL_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class KubernetesSettings(BaseSettings):
    """The actuator's settings, each read from ``ANTDT_K8S_<FIELD NAME>``."""

    model_config = SettingsConfigDict(env_prefix="ANTDT_K8S_", extra="ignore", frozen=True)

    remediation: bool = Field(
        False, description="act on pods and nodes (needs the remediation RBAC)"
    )
    namespace: str | None = Field(
        None, description="the workers' namespace; default the controller pod's own"
    )
    degraded_label: str = Field("antdt.io/degraded", pattern=_LABEL_PATTERN, max_length=317)
    api_url: str | None = Field(
        None, description="API server; default from KUBERNETES_SERVICE_HOST/PORT"
    )
    service_account_dir: Path = Field(
        SERVICE_ACCOUNT, description="token, ca.crt and namespace of the pod"
    )
    timeout_s: float = Field(5.0, gt=0, le=60)


def load_kubernetes_settings() -> KubernetesSettings:
    """Read the actuator's settings, or raise a one-line ConfigError naming the variable."""
    try:
        return KubernetesSettings()
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, prefix="ANTDT_K8S_")) from None


class Outcome(str, Enum):
    """What one call achieved (the ``result`` label of the actions counter)."""

    DONE = "done"
    GONE = "gone"  # the pod was already deleted: nothing left to do
    FAILED = "failed"


@dataclass(frozen=True)
class Call:
    """One REST call the actuator makes for a command."""

    method: str
    path: str
    body: dict | None = None
    content_type: str = "application/json"


class KubernetesApi:
    """Authenticated JSON requests to the API server, as the pod's service account."""

    def __init__(self, url: str, token: str | None, ca_file: Path | None, timeout_s: float):
        self.url = url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s
        self._ssl = (
            ssl.create_default_context(cafile=str(ca_file))
            if ca_file and url.startswith("https")
            else None
        )

    @classmethod
    def from_settings(cls, settings: KubernetesSettings) -> KubernetesApi:
        account = settings.service_account_dir
        url = settings.api_url or _in_cluster_url()
        token_file, ca_file = account / "token", account / "ca.crt"
        token = token_file.read_text().strip() if token_file.is_file() else None
        return cls(url, token, ca_file if ca_file.is_file() else None, settings.timeout_s)

    def send(self, call: Call) -> int:
        """The HTTP status of ``call``; raises ``urllib.error.URLError`` only when the server is
        unreachable."""
        data = json.dumps(call.body).encode() if call.body is not None else None
        request = urllib.request.Request(self.url + call.path, data=data, method=call.method)
        request.add_header("Content-Type", call.content_type)
        request.add_header("Accept", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout_s, context=self._ssl
            ) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code


def _in_cluster_url() -> str:
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
    )
    if not host:
        raise ConfigError(
            "ANTDT_K8S_REMEDIATION is on but this is not a pod (no KUBERNETES_SERVICE_HOST); "
            "set ANTDT_K8S_API_URL"
        )
    return f"https://{host}:{port}"


def calls_for(command: MitigationCommand, namespace: str, degraded_label: str) -> list[Call]:
    """The REST calls that carry out ``command`` on the cluster (none for what agents do alone)."""
    if command.dry_run:
        return []
    if command.action in (CommandAction.RESTART, CommandAction.EVICT):
        pod = quote(command.target_worker, safe="")
        return [Call("DELETE", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{pod}")]
    node = command.parameters.get("node")
    if command.action is CommandAction.MARK_NODE_DEGRADED and node:
        patch = {"metadata": {"labels": {degraded_label: "true"}}}
        return [
            Call(
                "PATCH",
                f"/api/v1/nodes/{quote(node, safe='')}",
                patch,
                "application/merge-patch+json",
            )
        ]
    return []


class KubernetesActuator:
    """Carries out commands on the cluster from a background thread; see the module docstring."""

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        degraded_label: str = "antdt.io/degraded",
        queue_size: int = 1000,
    ):
        self.api = api
        self.namespace = namespace
        self.degraded_label = degraded_label
        self._queue: queue.Queue[tuple[MitigationCommand, list[Call]] | None] = queue.Queue(
            maxsize=queue_size
        )
        self._thread = threading.Thread(target=self._drain, name="antdt-k8s-actuator", daemon=True)

    @classmethod
    def from_settings(cls, settings: KubernetesSettings) -> KubernetesActuator | None:
        """The actuator, or None when remediation is off."""
        if not settings.remediation:
            return None
        namespace = settings.namespace or _own_namespace(settings.service_account_dir)
        return cls(KubernetesApi.from_settings(settings), namespace, settings.degraded_label)

    def start(self) -> KubernetesActuator:
        self._thread.start()
        log.info(
            "kubernetes remediation on: pods in %s, nodes labelled %s via %s",
            self.namespace,
            self.degraded_label,
            self.api.url,
        )
        return self

    def submit(self, command: MitigationCommand) -> None:
        """Queue ``command``; a full queue drops it (counted) rather than stall the controller."""
        calls = calls_for(command, self.namespace, self.degraded_label)
        if not calls:
            return
        try:
            self._queue.put_nowait((command, calls))
        except queue.Full:
            metrics.K8S_ACTIONS.labels(command.action.value, Outcome.FAILED.value).inc()
            log.error(
                "kubernetes: queue full, %s %s not carried out",
                command.action.value,
                command.target_worker,
            )

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish what is queued (up to ``timeout_s``) and stop."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)

    def act(self, command: MitigationCommand) -> list[Outcome]:
        """Carry out ``command`` now; one outcome per call, each counted."""
        return self._carry_out(command, calls_for(command, self.namespace, self.degraded_label))

    def _carry_out(self, command: MitigationCommand, calls: list[Call]) -> list[Outcome]:
        outcomes = [self._send(command, call) for call in calls]
        for outcome in outcomes:
            metrics.K8S_ACTIONS.labels(command.action.value, outcome.value).inc()
        return outcomes

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            self._carry_out(*item)

    def _send(self, command: MitigationCommand, call: Call) -> Outcome:
        try:
            status = self.api.send(call)
        except (OSError, ValueError) as exc:
            log.error("kubernetes: %s %s failed: %s", call.method, call.path, exc)
            return Outcome.FAILED
        if 200 <= status < 300:
            log.info("kubernetes: %s %s for command %s", call.method, call.path, command.command_id)
            return Outcome.DONE
        if status == 404 and call.method == "DELETE":
            return Outcome.GONE
        log.error(
            "kubernetes: %s %s answered %d (check the remediation RBAC)",
            call.method,
            call.path,
            status,
        )
        return Outcome.FAILED


def _own_namespace(account: Path) -> str:
    path = account / "namespace"
    if path.is_file():
        return path.read_text().strip()
    raise ConfigError(f"ANTDT_K8S_NAMESPACE is unset and {path} does not exist")
