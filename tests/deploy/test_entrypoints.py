"""Every antdt entry point that compose or Kubernetes starts exists in the installed CLI and answers
``--help``.

The image's ENTRYPOINT is ``antdt``; compose passes the subcommand as its
``command``, Kubernetes as a container's ``args`` (or, in the example Job, a
shell line that ends in ``exec antdt <subcommand>``), and health checks run
``antdt probe``. A renamed or removed subcommand would otherwise surface
only as a crash-looping pod.
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import ANTDT
from tests.deploy.k8s_objects import pod_templates
from tests.deploy.kustomize import build

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
RENDERINGS = [
    (K8S / "overlays" / "strimzi", [K8S / "components" / "remediation"]),
    (K8S / "overlays" / "existing-kafka", []),
    (K8S / "examples" / "training-job", []),
]
SHELL_CALL = re.compile(r"\bantdt\s+([a-z][a-z-]*)")


def compose_entrypoints() -> dict[str, str]:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    found = {}
    for name, service in services.items():
        if str(service.get("image", "")).startswith("apache/kafka"):
            continue
        found[service["command"][0]] = f"compose service {name}"
        probe = service.get("healthcheck", {}).get("test", [])
        if probe[1:3] == ["antdt", "probe"]:
            found["probe"] = f"compose health check of {name}"
    return found


def kubernetes_entrypoints() -> dict[str, str]:
    found = {}
    for directory, components in RENDERINGS:
        for template in pod_templates(build(directory, components)):
            for container in template.containers:
                if "antdt" not in container["image"]:
                    continue
                where = f"{directory.relative_to(DEPLOY)}: {template.name}"
                if "command" in container:  # a shell wrapper: the antdt calls in its script
                    for subcommand in SHELL_CALL.findall(" ".join(container.get("args", []))):
                        found[subcommand] = where
                else:
                    found[container["args"][0]] = where
    return found


def answers_help(subcommand: str) -> subprocess.CompletedProcess:
    return subprocess.run([ANTDT, subcommand, "--help"], capture_output=True, text=True, timeout=60)


def test_deploy_files_name_the_services_and_the_worker():
    named = compose_entrypoints().keys() | kubernetes_entrypoints().keys()
    assert {"sharder", "monitor", "controller", "worker", "topics", "probe"} <= named


@pytest.mark.slow
def test_every_entrypoint_answers_help():
    named = {**compose_entrypoints(), **kubernetes_entrypoints()}
    with ThreadPoolExecutor(4) as pool:
        answers = dict(zip(named, pool.map(answers_help, named)))
    for subcommand, answer in answers.items():
        assert answer.returncode == 0, (
            f"antdt {subcommand} (from {named[subcommand]}): {answer.stderr.strip()}"
        )
        assert f"Usage: antdt {subcommand}" in " ".join(answer.stdout.split()), answer.stdout
