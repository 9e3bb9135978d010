"""Lookups over rendered Kubernetes objects, for the semantic checks of the manifests.

Why: the checks ask the questions an API server and kubelet would answer at
deploy time — which pods a selector picks, which Secret key an env var reads,
which file a mount provides — so the answers are computed here once, the same
way for every overlay.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

Object = dict[str, Any]

WORKLOAD_KINDS = {"Deployment", "Job", "StatefulSet", "DaemonSet"}
#: Values the downward API would give, to resolve fieldRef env vars in tests.
DOWNWARD_API_SAMPLES = {
    "metadata.name": "antdt-example-training-0-x7k2p",
    "metadata.namespace": "antdt",
    "spec.nodeName": "node-1.example.internal",
    # A StatefulSet pod's index (Kubernetes 1.28+): the first pod's.
    "metadata.labels['apps.kubernetes.io/pod-index']": "0",
}
#: ``$(VAR)`` in a container's command and args, which the kubelet expands from its env (``$$``
#: escapes).
ENV_REFERENCE = re.compile(r"\$\$|\$\((\w+)\)")
STRIMZI_CLUSTER_LABEL = "strimzi.io/cluster"


@dataclass(frozen=True)
class PodTemplate:
    """A workload's pod template, named after its owner for messages."""

    owner: Object
    template: Object

    @property
    def name(self) -> str:
        return f"{self.owner['kind']}/{self.owner['metadata']['name']}"

    @property
    def spec(self) -> Object:
        return self.template["spec"]

    @property
    def labels(self) -> dict[str, str]:
        return self.template.get("metadata", {}).get("labels", {})

    @property
    def containers(self) -> list[Object]:
        return [*self.spec.get("initContainers", []), *self.spec["containers"]]

    def volume(self, name: str) -> Object | None:
        return next((v for v in self.spec.get("volumes", []) if v["name"] == name), None)


def of_kind(objects: list[Object], kind: str) -> list[Object]:
    return [obj for obj in objects if obj["kind"] == kind]


def find(objects: list[Object], kind: str, name: str) -> Object | None:
    return next((obj for obj in of_kind(objects, kind) if obj["metadata"]["name"] == name), None)


def pod_templates(objects: list[Object]) -> list[PodTemplate]:
    return [
        PodTemplate(obj, obj["spec"]["template"])
        for obj in objects
        if obj["kind"] in WORKLOAD_KINDS
    ]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """An equality selector (matchLabels or a Service's selector) against labels."""
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def operator_secrets(objects: list[Object]) -> dict[str, set[str]]:
    """Secrets the Strimzi operators create for objects in the rendering, with their keys."""
    secrets = {
        f"{kafka['metadata']['name']}-cluster-ca-cert": {"ca.crt", "ca.p12", "ca.password"}
        for kafka in of_kind(objects, "Kafka")
    }
    for user in of_kind(objects, "KafkaUser"):
        if user["spec"].get("authentication", {}).get("type") == "scram-sha-512":
            secrets[user["metadata"]["name"]] = {"password", "sasl.jaas.config"}
    return secrets


def available_keys(objects: list[Object]) -> dict[tuple[str, str], set[str]]:
    """(kind, name) -> keys, for every ConfigMap and Secret that will exist."""
    keys = {
        ("ConfigMap", cm["metadata"]["name"]): set(cm.get("data", {}))
        | set(cm.get("binaryData", {}))
        for cm in of_kind(objects, "ConfigMap")
    }
    keys |= {
        ("Secret", s["metadata"]["name"]): set(s.get("data", {})) | set(s.get("stringData", {}))
        for s in of_kind(objects, "Secret")
    }
    keys |= {
        ("Secret", name): secret_keys for name, secret_keys in operator_secrets(objects).items()
    }
    return keys


def secret_value(secret: Object, key: str) -> str:
    """A key of a rendered Secret, from stringData or (base64) data."""
    if key in secret.get("stringData", {}):
        return secret["stringData"][key]
    return base64.b64decode(secret["data"][key]).decode()


def key_references(template: PodTemplate) -> Iterator[tuple[str, str, str | None, str]]:
    """(kind, name, key or None, where) for every ConfigMap/Secret the pod reads."""
    for container in template.containers:
        where = f"{template.name} container {container['name']}"
        for source in container.get("envFrom", []):
            for ref_field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                if ref_field in source:
                    yield kind, source[ref_field]["name"], None, f"{where} envFrom"
        for var in container.get("env", []):
            value_from = var.get("valueFrom", {})
            for ref_field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if ref_field in value_from:
                    ref = value_from[ref_field]
                    yield kind, ref["name"], ref["key"], f"{where} env {var['name']}"
    for volume in template.spec.get("volumes", []):
        for field, kind, name_field in (
            ("secret", "Secret", "secretName"),
            ("configMap", "ConfigMap", "name"),
        ):
            if field in volume:
                source = volume[field]
                keys = [item["key"] for item in source.get("items", [])] or [None]
                for key in keys:
                    yield kind, source[name_field], key, f"{template.name} volume {volume['name']}"


def resolved_env(container: Object, objects: list[Object]) -> dict[str, str]:
    """The environment a container will see, as far as the rendering determines it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= find(objects, "ConfigMap", source["configMapRef"]["name"]).get("data", {})
    for var in container.get("env", []):
        env[var["name"]] = _env_value(var, objects)
    return env


def _env_value(var: Object, objects: list[Object]) -> str:
    if "value" in var:
        return var["value"]
    value_from = var["valueFrom"]
    if "fieldRef" in value_from:
        return DOWNWARD_API_SAMPLES[value_from["fieldRef"]["fieldPath"]]
    if "configMapKeyRef" in value_from:
        ref = value_from["configMapKeyRef"]
        return find(objects, "ConfigMap", ref["name"])["data"][ref["key"]]
    ref = value_from["secretKeyRef"]
    return secret_value(find(objects, "Secret", ref["name"]), ref["key"])


def mounted_file(template: PodTemplate, container: Object, path: str) -> tuple[str, str] | None:
    """(Secret name, key) that provides file ``path`` in the container, if a secret volume does."""
    file = PurePosixPath(path)
    for mount in container.get("volumeMounts", []):
        if file.parent != PurePosixPath(mount["mountPath"]):
            continue
        secret = (template.volume(mount["name"]) or {}).get("secret")
        if secret is None:
            continue
        items = {item["path"]: item["key"] for item in secret.get("items", [])}
        key = items.get(file.name) if items else file.name
        if key is not None:
            return secret["secretName"], key
    return None


def container_port_names(template: PodTemplate) -> dict[str, int]:
    ports = [port for container in template.containers for port in container.get("ports", [])]
    return {port["name"]: port["containerPort"] for port in ports if "name" in port}


def container_port_numbers(template: PodTemplate) -> set[int]:
    return {port["containerPort"] for c in template.containers for port in c.get("ports", [])}


def expanded_args(container: Object, objects: list[Object]) -> list[str]:
    """A container's args as the kubelet passes them: each ``$(VAR)`` of its env replaced, others
    left as written."""
    env = resolved_env(container, objects)

    def expand(match: re.Match[str]) -> str:
        return "$" if match[0] == "$$" else env.get(match[1], match[0])

    return [ENV_REFERENCE.sub(expand, arg) for arg in container.get("args", [])]


def exec_command(script: str) -> list[str]:
    """The words after ``exec`` in a shell script's exec line (backslash continuations joined)."""
    lines = [line.strip() for line in script.replace("\\\n", " ").splitlines()]
    (line,) = [line for line in lines if line.startswith("exec ")]
    return shlex.split(line)[1:]
