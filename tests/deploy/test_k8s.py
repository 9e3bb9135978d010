"""The Kubernetes manifests (deploy/k8s), checked statically: schemas, kustomize, semantics.

No cluster, kubectl or kustomize is needed: every document is validated
against the vendored schema of its kind, each overlay is rendered by the small
kustomize model in ``tests/deploy/kustomize.py`` and the rendering is checked
for what would otherwise only fail at deploy time (a selector that picks no
pod, a Secret key that does not exist, a setting antdt rejects, RBAC that
names a missing role, topics that drifted from the registry).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path, PurePosixPath

import pytest

from antdt import __version__
from antdt.errors import ConfigError
from antdt.services.controller.k8s import KubernetesSettings
from antdt.settings import Settings, load_settings
from antdt.topics import TOPICS
from antdt.worker.agent import EXIT_RESTART
from antdt.worker.injection import parse_slowdown
from tests.deploy import k8s_objects as k8s
from tests.deploy.k8s_schemas import REPO, kustomization_errors, schema_errors
from tests.deploy.kustomize import KUSTOMIZATION_FILE, build, load_documents, read_kustomization
from tests.deploy.test_compose import cli_params

K8S = REPO / "deploy" / "k8s"
REMEDIATION = K8S / "components" / "remediation"
EXAMPLE = K8S / "examples" / "training-job"
IMAGE = "ghcr.io/antdt/antdt"
NAMESPACE = "antdt"

#: Each rendering the tests check: an overlay, optionally with extra components.
RENDERINGS = {
    "strimzi": ("overlays/strimzi", ()),
    "existing-kafka": ("overlays/existing-kafka", ()),
    "strimzi+remediation": ("overlays/strimzi", (REMEDIATION,)),
    "existing-kafka+remediation": ("overlays/existing-kafka", (REMEDIATION,)),
    # The example job runs next to the Strimzi overlay and reads its objects.
    "strimzi+example": ("overlays/strimzi", ()),
}
REMEDIATED = [name for name in RENDERINGS if name.endswith("+remediation")]
SETTINGS_NAMES = {f"ANTDT_{name.upper()}" for name in Settings.model_fields}
ANTDT_K8S_NAMES = {f"ANTDT_K8S_{name.upper()}" for name in KubernetesSettings.model_fields}
#: What services/controller/k8s.py calls: (resource, role kind) -> verbs.
ACTUATOR_RULES = {
    ("pods", "Role"): {"get", "list", "delete"},
    ("nodes", "ClusterRole"): {"get", "patch"},
}
PROBE_PATHS = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}

render_names = pytest.mark.parametrize("name", list(RENDERINGS))


@cache
def rendered(name: str) -> tuple[dict, ...]:
    """The objects of one rendering (cached, so never mutated by a test)."""
    overlay, extra = RENDERINGS[name]
    objects = build(K8S / overlay, extra)
    if name.endswith("+example"):
        objects += build(EXAMPLE)
    return tuple(objects)


def objects_of(name: str) -> list[dict]:
    return list(rendered(name))


def label(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def kustomizations() -> dict[Path, dict]:
    """Every kustomization under deploy/k8s, by directory."""
    return {path.parent: load_documents(path)[0] for path in sorted(K8S.rglob(KUSTOMIZATION_FILE))}


def listed_paths(directory: Path, kustomization: dict, *fields: str) -> list[Path]:
    entries = []
    for field in fields:
        entries += [
            entry["path"] if field == "patches" else entry for entry in kustomization.get(field, [])
        ]
    return [(directory / entry).resolve() for entry in entries]


def patch_files() -> set[Path]:
    return {
        path
        for directory, k in kustomizations().items()
        for path in listed_paths(directory, k, "patches")
    }


def manifest_files() -> list[Path]:
    return sorted(path for path in K8S.rglob("*.yaml") if path.name != KUSTOMIZATION_FILE)


def antdt_containers(objects: list[dict]):
    """(pod template, container) for every container running the antdt image."""
    for template in k8s.pod_templates(objects):
        for container in template.containers:
            if container["image"].startswith(IMAGE + ":"):
                yield template, container


# ------------------------------------------------------------ schemas, files


@pytest.mark.parametrize("path", manifest_files(), ids=relative)
def test_every_manifest_document_validates_against_its_vendored_schema(path: Path):
    """Patches are partial objects, checked without `required`; their rendering gets the full
    check."""
    partial = path.resolve() in patch_files()
    documents = load_documents(path)
    assert documents, f"{relative(path)} holds no YAML document"
    for document in documents:
        where = f"{relative(path)}: {document.get('apiVersion')} {document.get('kind')}"
        try:
            errors = schema_errors(document, partial=partial)
        except FileNotFoundError as exc:
            pytest.fail(
                f"{where}: {exc} (vendor it under deploy/schemas/k8s, "
                "record it in deploy/schemas/README.md)"
            )
        assert not errors, f"{where} violates its schema:\n" + "\n".join(errors)


@pytest.mark.parametrize("directory", list(kustomizations()), ids=relative)
def test_every_kustomization_validates_and_lists_existing_paths(directory: Path):
    kustomization = kustomizations()[directory]
    errors = kustomization_errors(kustomization)
    assert not errors, f"{relative(directory)}: kustomization schema violated:\n" + "\n".join(
        errors
    )
    listed = listed_paths(directory, kustomization, "resources", "components", "patches")
    missing = [relative(path) for path in listed if not path.exists()]
    assert not missing, f"{relative(directory)}/{KUSTOMIZATION_FILE} lists missing paths {missing}"
    for component in kustomization.get("components", []):
        read_kustomization(directory / component, "Component")  # raises unless it is a Component


def test_no_manifest_is_left_out_of_every_kustomization():
    """A YAML file no kustomization lists is never deployed: dead or forgotten."""
    listed = {
        path
        for directory, kustomization in kustomizations().items()
        for path in listed_paths(directory, kustomization, "resources", "patches")
    }
    orphans = [relative(path) for path in manifest_files() if path.resolve() not in listed]
    assert not orphans, f"manifests no kustomization lists: {orphans}"


def test_the_base_renders_on_its_own():
    kinds = sorted(obj["kind"] for obj in build(K8S / "base"))
    assert kinds == ["ConfigMap", *["Deployment"] * 4, "Secret", *["Service"] * 4]


@render_names
def test_rendered_objects_validate_against_their_schemas(name: str):
    for obj in objects_of(name):
        errors = schema_errors(obj)
        assert not errors, f"[{name}] {label(obj)} violates its schema:\n" + "\n".join(errors)


@render_names
def test_every_namespaced_object_lands_in_the_overlay_namespace(name: str):
    namespaces = {obj["metadata"]["name"] for obj in k8s.of_kind(objects_of(name), "Namespace")}
    assert namespaces == {NAMESPACE}, (
        f"[{name}] expected the Namespace {NAMESPACE}, got {namespaces}"
    )
    for obj in objects_of(name):
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"].get("namespace") == NAMESPACE, (
                f"[{name}] {label(obj)} is not in {NAMESPACE}"
            )


# ------------------------------------------------------------ workloads


@render_names
def test_deployment_and_statefulset_selectors_match_their_pod_template_labels(name: str):
    objects = objects_of(name)
    for workload in [*k8s.of_kind(objects, "Deployment"), *k8s.of_kind(objects, "StatefulSet")]:
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert k8s.matches(selector, labels), (
            f"[{name}] {label(workload)}: selector {selector} misses labels {labels}"
        )


@render_names
def test_every_service_selects_a_pod_template_with_its_target_ports(name: str):
    objects = objects_of(name)
    for service in k8s.of_kind(objects, "Service"):
        selector = service["spec"]["selector"]
        templates = [t for t in k8s.pod_templates(objects) if k8s.matches(selector, t.labels)]
        assert templates, f"[{name}] {label(service)} selects no pod template ({selector})"
        for template in templates:
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                named = isinstance(target, str)
                declared = (
                    k8s.container_port_names(template)
                    if named
                    else k8s.container_port_numbers(template)
                )
                assert target in declared, (
                    f"[{name}] {label(service)} targets {target!r}, undeclared in {template.name}"
                )


@render_names
def test_probes_use_declared_container_ports(name: str):
    for template in k8s.pod_templates(objects_of(name)):
        names, numbers = k8s.container_port_names(template), k8s.container_port_numbers(template)
        for container in template.containers:
            for probe_name in PROBE_PATHS:
                port = container.get(probe_name, {}).get("httpGet", {}).get("port")
                if port is not None:
                    declared = names if isinstance(port, str) else numbers
                    assert port in declared, (
                        f"[{name}] {template.name} {probe_name} uses undeclared port {port!r}"
                    )


@pytest.mark.parametrize(
    "component,port",
    [("sharder", 9402), ("monitor", 9403), ("controller", 9404), ("grouper", 9406)],
)
def test_each_service_runs_with_probes_metrics_and_its_port(component: str, port: int):
    deployment = k8s.find(objects_of("strimzi"), "Deployment", f"antdt-{component}")
    assert deployment is not None, f"no Deployment antdt-{component}"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [component, "--http-port", str(port)], (
        f"antdt-{component} args {container['args']}"
    )
    expected_ports = [{"name": "http-metrics", "containerPort": port, "protocol": "TCP"}]
    assert container["ports"] == expected_ports, f"antdt-{component} ports {container['ports']}"
    paths = {probe: container[probe]["httpGet"]["path"] for probe in PROBE_PATHS}
    assert paths == PROBE_PATHS, f"antdt-{component} probes {paths}"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    expected = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    assert annotations == expected, f"antdt-{component} scrape annotations {annotations}"


@render_names
def test_every_workload_runs_locked_down_with_resources(name: str):
    for template in k8s.pod_templates(objects_of(name)):
        assert template.spec["securityContext"].get("runAsNonRoot") is True, (
            f"[{name}] {template.name} may run as root"
        )
        for container in template.containers:
            where = f"[{name}] {template.name} container {container['name']}"
            context = container.get("securityContext", {})
            assert context.get("readOnlyRootFilesystem") is True, (
                f"{where}: root filesystem is writable"
            )
            assert context.get("allowPrivilegeEscalation") is False, (
                f"{where}: privilege escalation allowed"
            )
            assert context.get("capabilities", {}).get("drop") == ["ALL"], (
                f"{where}: capabilities not all dropped"
            )
            tmp = next(
                (m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"), None
            )
            assert tmp and "emptyDir" in (template.volume(tmp["name"]) or {}), (
                f"{where}: /tmp is no writable emptyDir"
            )
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), (
                f"{where}: missing cpu/memory requests"
            )
            assert "memory" in resources.get("limits", {}), f"{where}: missing a memory limit"


@render_names
def test_every_antdt_container_runs_this_version_of_the_image(name: str):
    images = {container["image"] for _, container in antdt_containers(objects_of(name))}
    expected = f"{IMAGE}:{__version__}"
    assert images == {expected}, (
        f"[{name}] images {images}, expected {expected} (the pyproject version)"
    )


@render_names
def test_each_service_runs_two_replicas_that_split_the_jobs(name: str):
    """Either replica takes the other's jobs over (tests/loadgen/test_scale_out.py shows it on a
    real broker)."""
    for service in ("monitor", "controller", "sharder"):
        deployment = k8s.find(objects_of(name), "Deployment", f"antdt-{service}")
        assert deployment["spec"]["replicas"] == 2, (
            f"[{name}] {service}: one replica leaves its jobs unserved while it restarts"
        )


# ------------------------------------------------------------ references, settings


@render_names
def test_every_configmap_and_secret_reference_exists_with_its_key(name: str):
    """Operator-made Secrets (Strimzi's cluster CA, KafkaUser) count as existing: the rendering
    creates their owners."""
    objects = objects_of(name)
    available = k8s.available_keys(objects)
    for template in k8s.pod_templates(objects):
        for kind, ref_name, key, where in k8s.key_references(template):
            keys = available.get((kind, ref_name))
            assert keys is not None, (
                f"[{name}] {where} reads {kind} {ref_name!r}, which the overlay does not create"
            )
            assert key is None or key in keys, (
                f"[{name}] {where} reads key {key!r}, missing from {kind} {ref_name!r}"
            )
    for user in k8s.of_kind(objects, "KafkaUser"):
        ref = user["spec"]["authentication"]["password"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in available.get(("Secret", ref["name"]), set()), (
            f"[{name}] KafkaUser password from {ref}"
        )


@render_names
def test_every_antdt_variable_is_a_known_setting(name: str):
    """antdt ignores unknown ANTDT_* variables (extra="ignore"), so a misspelt one is caught only
    here."""
    objects = objects_of(name)
    for template, container in antdt_containers(objects):
        names = set(k8s.resolved_env(container, objects)) | shell_variables(container)
        unknown = {n for n in names if n.startswith("ANTDT_")} - SETTINGS_NAMES - ANTDT_K8S_NAMES
        assert not unknown, (
            f"[{name}] {template.name} sets unknown antdt variables {sorted(unknown)}"
        )


def shell_variables(container: dict) -> set[str]:
    """ANTDT_* names a shell command line exports (the example job's straggler switch)."""
    words = (
        " ".join([*container.get("command", []), *container.get("args", [])])
        .replace("=", " ")
        .split()
    )
    return {word.strip("${}\"'") for word in words if "ANTDT_" in word}


@render_names
def test_every_antdt_container_environment_is_accepted_by_settings(name: str):
    objects = objects_of(name)
    for template, container in antdt_containers(objects):
        where = f"[{name}] {template.name} container {container['name']}"
        env = k8s.resolved_env(container, objects)
        # the file exists only in the pod: checked below
        ca_path = env.pop("ANTDT_TLS_CA_PATH", None)
        try:
            load_settings(**fields_with_prefix(env, "ANTDT_", exclude="ANTDT_K8S_"))
            KubernetesSettings(**fields_with_prefix(env, "ANTDT_K8S_"))
        except (ConfigError, ValueError) as exc:
            pytest.fail(f"{where}: antdt would refuse to start: {exc}")
        if ca_path:
            provided = k8s.mounted_file(template, container, ca_path)
            assert provided, (
                f"{where}: ANTDT_TLS_CA_PATH={ca_path}, but no secret volume mounts that file"
            )
            secret, key = provided
            assert key in k8s.available_keys(objects).get(("Secret", secret), set()), (
                f"{where}: CA from missing {provided}"
            )


def fields_with_prefix(
    env: dict[str, str], prefix: str, exclude: str | None = None
) -> dict[str, str]:
    """Settings keyword arguments from the environment variables that carry ``prefix``."""
    return {
        key.removeprefix(prefix).lower(): value
        for key, value in env.items()
        if key.startswith(prefix) and not (exclude and key.startswith(exclude))
    }


# ------------------------------------------------------------ RBAC and remediation


@pytest.mark.parametrize("name", REMEDIATED)
def test_rbac_bindings_refer_to_existing_roles_and_service_accounts(name: str):
    objects = objects_of(name)
    for binding in [
        *k8s.of_kind(objects, "RoleBinding"),
        *k8s.of_kind(objects, "ClusterRoleBinding"),
    ]:
        role_ref = binding["roleRef"]
        assert k8s.find(objects, role_ref["kind"], role_ref["name"]), (
            f"[{name}] {label(binding)}: no {role_ref}"
        )
        for subject in binding["subjects"]:
            account = k8s.find(objects, subject["kind"], subject["name"])
            assert account, (
                f"[{name}] {label(binding)}: subject "
                f"{subject['kind']}/{subject['name']} does not exist"
            )
            default = binding["metadata"].get("namespace")
            actual, wanted = subject.get("namespace", default), account["metadata"]["namespace"]
            assert actual == wanted, (
                f"[{name}] {label(binding)}: subject in namespace {actual}, its account in {wanted}"
            )


@pytest.mark.parametrize("name", REMEDIATED)
def test_remediation_gives_the_controller_exactly_what_the_actuator_calls(name: str):
    objects = objects_of(name)
    spec = k8s.find(objects, "Deployment", "antdt-controller")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert k8s.resolved_env(container, objects).get("ANTDT_K8S_REMEDIATION") == "true", (
        f"[{name}] remediation is off"
    )
    assert spec.get("automountServiceAccountToken") is True, (
        f"[{name}] the controller gets no API token"
    )
    account = spec.get("serviceAccountName")
    assert k8s.find(objects, "ServiceAccount", account), (
        f"[{name}] ServiceAccount {account!r} does not exist"
    )
    granted = granted_rules(objects, account)
    assert granted == ACTUATOR_RULES, (
        f"[{name}] the controller may do {granted}, the actuator needs {ACTUATOR_RULES}"
    )


def granted_rules(objects: list[dict], account: str) -> dict[tuple[str, str], set[str]]:
    """(resource, role kind) -> verbs granted to a ServiceAccount through its bindings."""
    granted: dict[tuple[str, str], set[str]] = {}
    for binding in [
        *k8s.of_kind(objects, "RoleBinding"),
        *k8s.of_kind(objects, "ClusterRoleBinding"),
    ]:
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            role = k8s.find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
            for rule in role["rules"]:
                for resource in rule["resources"]:
                    granted.setdefault((resource, role["kind"]), set()).update(rule["verbs"])
    return granted


@pytest.mark.parametrize("name", [name for name in RENDERINGS if name not in REMEDIATED])
def test_without_remediation_no_pod_gets_an_api_token(name: str):
    for template in k8s.pod_templates(objects_of(name)):
        assert template.spec.get("automountServiceAccountToken") is False, (
            f"[{name}] {template.name} mounts an API token"
        )


# ------------------------------------------------------------ Strimzi


def strimzi() -> tuple[list[dict], dict, dict[str, str]]:
    """The Strimzi rendering, its Kafka, and the services' settings."""
    objects = objects_of("strimzi")
    (kafka,) = k8s.of_kind(objects, "Kafka")
    return objects, kafka, k8s.find(objects, "ConfigMap", "antdt-config")["data"]


def test_strimzi_kafka_is_kraft_with_a_dual_role_node_pool():
    objects, kafka, _ = strimzi()
    annotations = kafka["metadata"]["annotations"]
    assert annotations == {"strimzi.io/kraft": "enabled", "strimzi.io/node-pools": "enabled"}, (
        f"annotations {annotations}"
    )
    assert "zookeeper" not in kafka["spec"], "KRaft clusters have no ZooKeeper"
    cluster = kafka["metadata"]["name"]
    pools = [
        pool
        for pool in k8s.of_kind(objects, "KafkaNodePool")
        if pool["metadata"]["labels"][k8s.STRIMZI_CLUSTER_LABEL] == cluster
    ]
    roles = {role for pool in pools for role in pool["spec"]["roles"]}
    assert {"controller", "broker"} <= roles, f"the node pools of {cluster} have roles {roles}"
    operators = set(kafka["spec"]["entityOperator"])
    assert operators >= {"topicOperator", "userOperator"}, (
        f"KafkaTopic and KafkaUser need both operators: {operators}"
    )


def test_services_connect_to_the_strimzi_tls_listener_with_scram():
    _, kafka, config = strimzi()
    listeners = kafka["spec"]["kafka"]["listeners"]
    (listener,) = [item for item in listeners if item["authentication"]["type"] == "scram-sha-512"]
    assert listener["tls"] is True and listener["type"] == "internal", (
        f"expected an internal TLS listener: {listener}"
    )
    bootstrap = f"{kafka['metadata']['name']}-kafka-bootstrap:{listener['port']}"
    assert config["ANTDT_BOOTSTRAP_SERVERS"] == bootstrap, (
        f"the services must bootstrap from {bootstrap}"
    )
    security = (config["ANTDT_SECURITY_PROTOCOL"], config["ANTDT_SASL_MECHANISM"])
    assert security == ("SASL_SSL", "SCRAM-SHA-512"), (
        f"TLS + scram-sha-512 needs SASL_SSL/SCRAM-SHA-512, got {security}"
    )


def test_the_kafka_user_is_the_services_sasl_user_with_prefix_acls():
    objects, kafka, config = strimzi()
    (user,) = k8s.of_kind(objects, "KafkaUser")
    username = k8s.secret_value(k8s.find(objects, "Secret", "antdt-secrets"), "sasl-username")
    assert user["metadata"]["name"] == username, (
        f"the SCRAM user is the KafkaUser's name; services log in as {username!r}"
    )
    assert user["metadata"]["labels"][k8s.STRIMZI_CLUSTER_LABEL] == kafka["metadata"]["name"], (
        "KafkaUser of another cluster"
    )
    assert kafka["spec"]["kafka"]["authorization"]["type"] == "simple", (
        "KafkaUser ACLs need simple authorization"
    )
    prefix = config["ANTDT_TOPIC_PREFIX"] + "."
    resources = {
        acl["resource"]["type"]: acl["resource"] for acl in user["spec"]["authorization"]["acls"]
    }
    assert set(resources) == {"topic", "group", "cluster"}, (
        f"ACL resource types {sorted(resources)}"
    )
    for kind in ("topic", "group"):
        pattern = (resources[kind]["name"], resources[kind]["patternType"])
        assert pattern == (prefix, "prefix"), (
            f"{kind} ACL {pattern} does not cover the topic prefix {prefix!r}"
        )


def test_kafka_topics_equal_the_registry():
    objects, kafka, config = strimzi()
    prefix = config["ANTDT_TOPIC_PREFIX"]
    topics = {
        t["spec"].get("topicName", t["metadata"]["name"]): t
        for t in k8s.of_kind(objects, "KafkaTopic")
    }
    expected = {spec.full_name(prefix): spec for spec in TOPICS}
    assert set(topics) == set(expected), (
        f"KafkaTopics {sorted(topics)} differ from the registry {sorted(expected)}"
    )
    brokers = sum(
        p["spec"]["replicas"]
        for p in k8s.of_kind(objects, "KafkaNodePool")
        if "broker" in p["spec"]["roles"]
    )
    min_isr = int(kafka["spec"]["kafka"]["config"]["min.insync.replicas"])
    for topic_name, spec in expected.items():
        topic = topics[topic_name]["spec"]
        partitions = (topic["partitions"], spec.partitions)
        assert partitions[0] == partitions[1], (
            f"{topic_name}: partitions (KafkaTopic, registry) = {partitions}"
        )
        assert topic["config"] == spec.configs, (
            f"{topic_name}: configs {topic['config']}, registry {spec.configs}"
        )
        replicas = topic["replicas"]
        assert min_isr < replicas <= brokers, (
            f"{topic_name}: {replicas} replicas, {brokers} brokers, min ISR {min_isr}"
        )
        cluster = topics[topic_name]["metadata"]["labels"][k8s.STRIMZI_CLUSTER_LABEL]
        assert cluster == kafka["metadata"]["name"], f"{topic_name} belongs to cluster {cluster}"


# ------------------------------------------------------------ monitoring


@pytest.mark.parametrize("name", ["strimzi", "existing-kafka"])
def test_the_service_monitor_selects_every_service_on_a_named_port(name: str):
    objects = objects_of(name)
    (monitor,) = k8s.of_kind(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [
        s
        for s in k8s.of_kind(objects, "Service")
        if k8s.matches(selector, s["metadata"].get("labels", {}))
    ]
    selected = {s["metadata"]["name"] for s in services}
    assert selected == {"antdt-sharder", "antdt-monitor", "antdt-controller", "antdt-grouper"}, (
        f"[{name}] ServiceMonitor selects {selected}"
    )
    for endpoint in monitor["spec"]["endpoints"]:
        for service in services:
            ports = {port.get("name") for port in service["spec"]["ports"]}
            assert endpoint["port"] in ports, (
                f"[{name}] {label(service)} has no port named {endpoint['port']!r}"
            )


@render_names
def test_prometheus_annotations_point_at_a_declared_port(name: str):
    for template in k8s.pod_templates(objects_of(name)):
        annotations = template.template.get("metadata", {}).get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            port = int(annotations["prometheus.io/port"])
            assert port in k8s.container_port_numbers(template), (
                f"[{name}] {template.name} scrapes undeclared {port}"
            )
            assert annotations["prometheus.io/path"] == "/metrics", (
                f"[{name}] {template.name} scrape path"
            )


# ------------------------------------------------------------ topics Job, example job


def test_existing_kafka_creates_topics_with_a_job_and_strimzi_does_not():
    jobs = k8s.of_kind(objects_of("existing-kafka"), "Job")
    assert [job["metadata"]["name"] for job in jobs] == ["antdt-topics"], (
        "existing Kafka needs the topics Job"
    )
    (container,) = jobs[0]["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["topics", "--create"], f"topics Job args {container['args']}"
    assert not k8s.of_kind(objects_of("strimzi"), "Job"), (
        "with Strimzi the KafkaTopics create the topics"
    )


def example_worker() -> tuple[dict, dict]:
    job = k8s.find(objects_of("strimzi+example"), "Job", "antdt-example-training")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return job, container


def test_example_workers_are_identified_by_pod_and_node_names():
    _, container = example_worker()
    sources = {
        var["name"]: var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for var in container["env"]
    }
    assert sources["ANTDT_WORKER_ID"] == "metadata.name", (
        "the actuator deletes the pod named after the worker id"
    )
    assert sources["ANTDT_NODE_ID"] == "spec.nodeName", (
        "the actuator labels the node named by the node id"
    )
    assert "exec antdt worker" in container["args"][0], (
        "the example's pods must run the antdt worker"
    )


def test_example_pods_avoid_nodes_marked_degraded():
    """The workers' replacements, and the parameter server a slow node would slow for everyone."""
    degraded = KubernetesSettings().degraded_label
    expected = {"key": degraded, "operator": "NotIn", "values": ["true"]}
    templates = k8s.pod_templates(build(EXAMPLE))
    assert {t.owner["kind"] for t in templates} == {"Job", "StatefulSet"}, [
        t.name for t in templates
    ]
    for template in templates:
        affinity = template.spec["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms and all(expected in term["matchExpressions"] for term in terms), (
            f"{template.name}: every term must exclude {degraded}=true"
        )


def test_example_restarts_do_not_count_as_failures_and_one_worker_straggles():
    job, container = example_worker()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed", "the straggler is chosen by JOB_COMPLETION_INDEX"
    assert spec["template"]["spec"]["restartPolicy"] == "Never", (
        "podFailurePolicy requires restartPolicy Never"
    )
    rules = spec["podFailurePolicy"]["rules"]
    ignored = [
        rule["onExitCodes"]["values"]
        for rule in rules
        if rule["action"] == "Ignore" and "onExitCodes" in rule
    ]
    assert [EXIT_RESTART] in ignored, (
        f"exit code {EXIT_RESTART} (RESTART) must not count against backoffLimit"
    )
    env = {var["name"]: var.get("value") for var in container["env"]}
    assert 0 <= int(env["STRAGGLER_INDEX"]) < spec["completions"], (
        "the straggler index must be one of the job's"
    )
    assert parse_slowdown(env["STRAGGLER_SLOWDOWN"]).factor_at(0) > 1, (
        "the straggler must be slowed"
    )


# ------------------------------------------------------------ example job: parameter server


def example_parameter_server() -> tuple[list[dict], dict, dict, dict]:
    """The example rendering, its parameter-server StatefulSet and container, and that container's
    parsed args."""
    objects = objects_of("strimzi+example")
    (statefulset,) = k8s.of_kind(objects, "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return objects, statefulset, container, cli_params(k8s.expanded_args(container, objects))


def test_the_parameter_server_is_part_of_the_example_job_only():
    assert [label(s) for s in k8s.of_kind(build(EXAMPLE), "StatefulSet")] == [
        "StatefulSet/antdt-ps"
    ]
    for name in RENDERINGS:
        if not name.endswith("+example"):
            assert not k8s.of_kind(objects_of(name), "StatefulSet"), (
                f"[{name}] the parameter server belongs to a job"
            )


def test_each_shard_is_a_pod_of_the_statefulset_numbered_by_its_index():
    """Kubernetes numbers the pods 0..replicas-1 (antdt-ps-<K>); the args take K from the pod-index
    label."""
    _, statefulset, container, params = example_parameter_server()
    assert "--shard" in container["args"], "the shard number must be given, not left to its default"
    shard_env = {
        var["name"]: var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for var in container["env"]
    }
    shard_ref = container["args"][container["args"].index("--shard") + 1]
    assert (
        shard_env.get(shard_ref.strip("$()")) == "metadata.labels['apps.kubernetes.io/pod-index']"
    ), f"--shard {shard_ref} is not the pod's index"
    assert params["shards"] == statefulset["spec"]["replicas"], (
        "--shards must equal the StatefulSet's replicas"
    )
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel", (
        "shards are peers: start them all at once"
    )


def test_a_shard_is_identified_by_its_pod_and_node_so_the_remediation_can_move_it():
    _, _, container, _ = example_parameter_server()
    sources = {
        var["name"]: var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for var in container["env"]
    }
    assert sources["ANTDT_WORKER_ID"] == "metadata.name", (
        "a RESTART of a slow shard deletes the pod it names"
    )
    assert sources["ANTDT_NODE_ID"] == "spec.nodeName", (
        "the node marked degraded is the shard's node"
    )


def test_the_parameter_server_runs_with_probes_metrics_and_its_ports():
    _, statefulset, container, params = example_parameter_server()
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"ps": params["port"], "http-metrics": params["http_port"]}, (
        f"antdt-ps ports {ports}"
    )
    for probe, path in PROBE_PATHS.items():
        assert container[probe]["httpGet"] == {"path": path, "port": "http-metrics"}, (
            f"antdt-ps {probe}"
        )
    annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(params["http_port"]), (
        f"antdt-ps scrape annotations {annotations}"
    )


def test_the_headless_service_names_every_shard_on_the_parameter_server_port():
    objects, statefulset, container, params = example_parameter_server()
    service = k8s.find(objects, "Service", statefulset["spec"]["serviceName"])
    assert service is not None, (
        f"no Service {statefulset['spec']['serviceName']} (the StatefulSet's serviceName)"
    )
    assert service["spec"]["clusterIP"] == "None", (
        "pods get DNS names (antdt-ps-<K>.antdt-ps) only from a headless Service"
    )
    assert k8s.matches(
        service["spec"]["selector"], statefulset["spec"]["template"]["metadata"]["labels"]
    )
    (port,) = [port for port in service["spec"]["ports"] if port["targetPort"] == "ps"]
    assert port["port"] == params["port"], (
        f"the Service publishes {port['port']}, the server listens on {params['port']}"
    )


def test_example_workers_reach_every_shard_in_order_and_keep_no_checkpoint():
    objects, statefulset, _, params = example_parameter_server()
    _, worker = example_worker()
    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    shards = [
        f"{name}-{k}.{service}:{params['port']}" for k in range(statefulset["spec"]["replicas"])
    ]
    words = k8s.exec_command(worker["args"][0])
    assert words[0] == "antdt", f"the workers exec {words}"
    worker_params = cli_params(words[1:])
    assert worker_params["ps"].split(",") == shards, (
        f"workers --ps {worker_params['ps']}, shards {shards}"
    )
    assert worker_params["checkpoint"] is None, (
        "--checkpoint is unused with --ps (the server holds the model)"
    )


def test_the_parameter_servers_checkpoints_are_on_its_persistent_volume_claim():
    """A restarted shard rebuilds its state from its checkpoints: they must outlive the pod."""
    _, statefulset, container, params = example_parameter_server()
    template = k8s.PodTemplate(statefulset, statefulset["spec"]["template"])
    claims = {
        claim["metadata"]["name"]: claim["spec"]
        for claim in statefulset["spec"]["volumeClaimTemplates"]
    }
    mounts = {PurePosixPath(mount["mountPath"]): mount for mount in container["volumeMounts"]}
    for field in ("checkpoint_dir", "out"):
        directory = PurePosixPath(params[field])
        covering = [path for path in mounts if directory.is_relative_to(path)]
        assert covering, f"antdt-ps: {field} {directory} is on the read-only root filesystem"
        mount = mounts[max(covering, key=lambda path: len(path.parts))]
        assert mount["name"] in claims, (
            f"antdt-ps: {directory} is on volume {mount['name']!r}, not a claim template"
        )
        assert template.volume(mount["name"]) is None, (
            f"a pod volume {mount['name']!r} would shadow the claim"
        )
        assert not mount.get("readOnly"), f"antdt-ps: {directory} is mounted read-only"
        claim = claims[mount["name"]]
        assert (
            "ReadWriteOnce" in claim["accessModes"] and claim["resources"]["requests"]["storage"]
        ), claim
    assert statefulset["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001, (
        "the claim must be writable"
    )
    retention = statefulset["spec"].get("persistentVolumeClaimRetentionPolicy", {})
    assert retention.get("whenDeleted", "Retain") == "Retain", (
        "deleting the StatefulSet must keep the checkpoints"
    )


def test_the_parameter_server_belongs_to_the_workers_job_and_bus():
    """The same ANTDT_JOB_ID, Kafka settings and signing key; only the ids of the process differ."""
    objects, _, container, _ = example_parameter_server()
    _, worker = example_worker()
    own = {"ANTDT_WORKER_ID", "ANTDT_NODE_ID", "ANTDT_CLIENT_ID"}

    def shared(env: dict[str, str]) -> dict[str, str]:
        return {
            key: value for key, value in env.items() if key.startswith("ANTDT_") and key not in own
        }

    ps_env, worker_env = k8s.resolved_env(container, objects), k8s.resolved_env(worker, objects)
    assert shared(ps_env) == shared(worker_env), (
        f"antdt-ps {shared(ps_env)}, workers {shared(worker_env)}"
    )
    assert ps_env["ANTDT_JOB_ID"] == "example-training"
