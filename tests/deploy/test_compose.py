"""deploy/compose.yaml and deploy/.env.example, checked statically (no Docker engine here).

The file must be valid Compose (the vendored compose-spec JSON schema) and
must agree with the code it deploys: health-check ports with the services'
``--http-port``, commands with the CLI, Kafka's advertised listeners with the
bootstrap servers the services use, every ``ANTDT_*`` variable with a real
settings field. Interpolation (``${VAR:-default}``) is resolved here the way
Compose does it, from the variables of ``.env.example``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
import typer
import yaml

from antdt import __version__
from antdt.cli.main import app
from antdt.settings import ENV_PREFIX, Settings, load_settings
from tests.deploy.test_image import SERVICE_COMMANDS, default_http_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / ".env.example"
SCHEMAS = DEPLOY / "schemas"

#: Variables the Kubernetes controller actuator adds; checked with that work, not here.
K8S_PREFIX = "ANTDT_K8S_"
#: The subcommands of the example job (profile "workers"): its parameter server and its workers.
JOB_COMMANDS = {"ps", "worker"}
SECRET_NAME = re.compile(r"KEY|PASSWORD|SECRET|TOKEN|CREDENTIAL", re.IGNORECASE)
INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_]\w*))"
)


# ------------------------------------------------------------------ loading and interpolation


class MissingVariable(Exception):
    """A ``${VAR:?message}`` whose variable is unset: Compose refuses to start."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err},
    ${VAR?err}."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name, op = match["name"] or match["bare"], match["op"] or ""
        value = env.get(name)
        missing = value is None or (op.startswith(":") and value == "")
        if op.endswith("?") and missing:
            raise MissingVariable(f"{name}: {match['arg']}")
        if op.endswith("-") and missing:
            return match["arg"]
        return value or ""

    return INTERPOLATION.sub(replace, text)


def resolve(node: Any, env: dict[str, str]) -> Any:
    """The document with every string value interpolated."""
    if isinstance(node, dict):
        return {key: resolve(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    return interpolate(node, env) if isinstance(node, str) else node


def strings(node: Any) -> Iterator[str]:
    """Every string value in the document."""
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, str):
        yield node


def referenced_variables(document: Any) -> set[str]:
    return {
        m["name"] or m["bare"]
        for text in strings(document)
        for m in INTERPOLATION.finditer(text)
        if not m["escaped"]
    }


def env_example_assignments(commented: bool) -> dict[str, str]:
    """NAME -> value of the active lines, or (commented=True) also of the documented ``#
    NAME=value`` lines."""
    pattern = r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$"
    found = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(pattern, line.strip())
        if match and (commented or not match[1]):
            found[match[2]] = match[3].strip().strip("'\"")
    return found


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # YAML merge keys (<<) resolved, as Compose does


@pytest.fixture(scope="module")
def deployer_env() -> dict[str, str]:
    """A deployer's deploy/.env: the example with the one required secret filled in."""
    return {**env_example_assignments(commented=False), "ANTDT_SIGNING_KEY": "0" * 64}


@pytest.fixture(scope="module")
def resolved(compose, deployer_env) -> dict[str, Any]:
    return resolve(compose, deployer_env)


@pytest.fixture(scope="module")
def services(resolved) -> dict[str, dict[str, Any]]:
    return resolved["services"]


def antdt_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run the antdt image (built from the repository's Dockerfile)."""
    return {name: service for name, service in services.items() if "build" in service}


def option(command: list[str], name: str) -> str | None:
    """The value following ``name`` in an exec-form command, if present."""
    return command[command.index(name) + 1] if name in command else None


def running(services: dict[str, dict[str, Any]], subcommand: str) -> dict[str, dict[str, Any]]:
    """The antdt services whose command is ``antdt <subcommand>``."""
    return {
        name: service
        for name, service in antdt_services(services).items()
        if service["command"][0] == subcommand
    }


def published(service: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """Container port -> (host address, host port) of the short-syntax port mappings."""
    mappings = {}
    for entry in service.get("ports", []):
        host_ip, host_port, container_port = ([""] + str(entry).split(":"))[-3:]
        mappings[int(container_port)] = (host_ip, int(host_port))
    return mappings


# ------------------------------------------------------------------ the schema


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_compose_file_is_valid_compose(compose, resolved, validator):
    # as written (variables as strings), and as Compose runs it
    for document in (compose, resolved):
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(document)
        ]
        assert not errors, errors


def test_the_schema_has_teeth(compose, validator):
    """A misspelt key or a bad dependency condition fails validation, so the test above means
    something."""

    def with_service(name: str, **changes: Any) -> dict[str, Any]:
        return {
            **compose,
            "services": {**compose["services"], name: {**compose["services"][name], **changes}},
        }

    misspelt = with_service("sharder", healtcheck={})
    bad_condition = with_service(
        "monitor", depends_on={"topics": {"condition": "service_finished"}}
    )
    assert not validator.is_valid(misspelt) and not validator.is_valid(bad_condition)


def test_vendored_schema_matches_the_readme_record():
    readme = (SCHEMAS / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `compose-spec.json`"))
    assert "compose-spec/compose-spec" in row and "`schema/compose-spec.json`" in row
    assert re.search(r"`[0-9a-f]{40}`", row), "the row names no commit"
    assert hashlib.sha256((SCHEMAS / "compose-spec.json").read_bytes()).hexdigest() in row


# ------------------------------------------------------------------ dependencies and start order


def dependencies(service: dict[str, Any]) -> dict[str, str]:
    """Target -> condition, from either the short (list) or the long (mapping) syntax."""
    depends_on = service.get("depends_on", {})
    if isinstance(depends_on, list):
        return dict.fromkeys(depends_on, "service_started")
    return {target: spec["condition"] for target, spec in depends_on.items()}


def test_every_dependency_exists_and_its_condition_can_be_met(services):
    for name, service in services.items():
        for target, condition in dependencies(service).items():
            assert target in services, f"{name} depends on unknown service {target}"
            # A profiled target runs whenever the dependent does only if each profile of one is a
            # profile of the other.
            profiles, target_profiles = (
                set(service.get("profiles", [])),
                services[target].get("profiles"),
            )
            assert target_profiles is None or profiles and profiles <= set(target_profiles), (
                f"{name} depends on {target}, which a profile may leave out"
            )
            if condition == "service_healthy":
                assert "healthcheck" in services[target], (
                    f"{name} waits for {target} to be healthy; it has no healthcheck"
                )
            if condition == "service_completed_successfully":
                assert services[target]["restart"] == "no", (
                    f"{target} is waited on to finish; it must not restart"
                )


def test_topics_are_created_once_kafka_is_healthy_and_before_any_service(services):
    assert services["topics"]["command"] == ["topics", "--create"]
    assert dependencies(services["topics"]) == {"kafka": "service_healthy"}
    for name in antdt_services(services).keys() - {"topics"}:
        assert dependencies(services[name])["topics"] == "service_completed_successfully", name


def test_workers_and_parameter_servers_wait_for_a_ready_sharder(services):
    for name, service in antdt_services(services).items():
        if service["command"][0] in JOB_COMMANDS:
            assert dependencies(service)["sharder"] == "service_healthy", name


# ------------------------------------------------------------------ commands, ports, health checks


def cli_command(name: str):
    return typer.main.get_command(app).commands[name]


def cli_params(command: list[str]) -> dict[str, Any]:
    """An exec-form command's options as the CLI parses them: values converted, defaults filled
    in."""
    subcommand, *args = command
    return cli_command(subcommand).make_context(subcommand, list(args)).params


def test_every_command_and_probe_parses_with_the_cli(services):
    """Each exec-form command is a valid antdt invocation (options exist, values convert)."""
    for name, service in antdt_services(services).items():
        subcommand, *args = service["command"]
        cli_command(subcommand).make_context(subcommand, list(args))
        if "healthcheck" in service:
            cmd, program, probe, *probe_args = service["healthcheck"]["test"]
            assert (cmd, program, probe) == ("CMD", "antdt", "probe"), name
            cli_command("probe").make_context("probe", probe_args)


def test_each_service_runs_once_with_its_probe_on_its_http_port(services):
    runs = {service["command"][0]: name for name, service in antdt_services(services).items()}
    assert SERVICE_COMMANDS.keys() <= runs.keys()
    for subcommand, entry_point in SERVICE_COMMANDS.items():
        service = services[runs[subcommand]]
        port = int(option(service["command"], "--http-port") or default_http_port(entry_point))
        probe = service["healthcheck"]["test"]
        assert int(option(probe, "--port")) == port, subcommand
        assert option(probe, "--path") == "/readyz", subcommand
        assert port in published(service), f"{subcommand}: metrics port {port} not published"
        assert service["restart"] == "unless-stopped"


def test_published_ports_stay_on_the_hosts_loopback_and_never_collide(services):
    host_ports = [
        (ip, port) for service in services.values() for ip, port in published(service).values()
    ]
    assert all(ip == "127.0.0.1" for ip, _ in host_ports)
    assert len(host_ports) == len(set(host_ports))


def test_image_is_this_version_built_from_the_repository(compose):
    for name, service in antdt_services(compose["services"]).items():
        assert service["image"] == f"${{APP_IMAGE:-antdt:{__version__}}}", name
        build = service["build"]
        assert (
            COMPOSE.parent / build["context"] / build["dockerfile"]
        ).resolve() == ROOT / "Dockerfile", name


def test_third_party_images_are_pinned(services):
    for name, service in services.items():
        if "build" not in service:
            assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+", service["image"]), (
                f"{name}: {service['image']} is not pinned"
            )


# ------------------------------------------------------------------ kafka listeners


def listeners(spec: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    parsed = [re.fullmatch(r"(\w+)://([^:,]*):(\d+)", item.strip()) for item in spec.split(",")]
    assert all(parsed), spec
    return {m[1]: (m[2], int(m[3])) for m in parsed}


@pytest.fixture(scope="module")
def kafka(services) -> dict[str, Any]:
    return services["kafka"]


def test_kafka_runs_kraft_with_one_consistent_controller_quorum(kafka):
    env = kafka["environment"]
    bound = listeners(env["KAFKA_LISTENERS"])
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id, _, address = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    host, _, port = address.partition(":")
    assert int(node_id) == int(env["KAFKA_NODE_ID"])
    assert host in (kafka["hostname"], "kafka") and int(port) == bound[controller][1]
    cluster_id = base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")
    assert len(env["CLUSTER_ID"]) == 22 and len(cluster_id) == 16


def test_kafka_advertises_only_listeners_it_binds(kafka):
    env = kafka["environment"]
    bound, advertised = (
        listeners(env["KAFKA_LISTENERS"]),
        listeners(env["KAFKA_ADVERTISED_LISTENERS"]),
    )
    protocols = dict(
        item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    assert set(bound) == set(protocols)
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] not in advertised
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    for name, (_, port) in advertised.items():
        assert name in bound and bound[name][1] == port, (
            f"{name} is advertised on {port}, bound on {bound.get(name)}"
        )


def test_services_and_host_reach_kafka_on_an_advertised_listener(
    compose, kafka, services, deployer_env
):
    advertised = listeners(kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"])
    in_network = {
        f"{host}:{port}"
        for host, port in advertised.values()
        if host in (kafka["hostname"], "kafka")
    }
    with_defaults_only = resolve(compose, {"ANTDT_SIGNING_KEY": "0" * 64})["services"]
    for name in antdt_services(services):
        assert services[name]["environment"]["ANTDT_BOOTSTRAP_SERVERS"] in in_network, name
        assert with_defaults_only[name]["environment"]["ANTDT_BOOTSTRAP_SERVERS"] in in_network, (
            name
        )
    assert deployer_env["ANTDT_BOOTSTRAP_SERVERS"] in in_network
    host_side = {port for host, port in advertised.values() if host == "localhost"}
    assert host_side and all(
        published(kafka).get(port) == ("127.0.0.1", port) for port in host_side
    )
    health = kafka["healthcheck"]["test"]
    assert int(option(health, "--bootstrap-server").rpartition(":")[2]) in {
        port for _, port in advertised.values()
    }


def test_kafka_creates_no_topic_behind_antdts_back(kafka):
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


# ------------------------------------------------------------------ variables and secrets


def settings_variables() -> set[str]:
    return {f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields}


def antdt_variables(names: set[str]) -> set[str]:
    return {
        name for name in names if name.startswith(ENV_PREFIX) and not name.startswith(K8S_PREFIX)
    }


def test_every_antdt_variable_is_a_settings_field(compose):
    in_compose = referenced_variables(compose) | {
        key for service in compose["services"].values() for key in service.get("environment", {})
    }
    in_example = set(env_example_assignments(commented=True))
    unknown = antdt_variables(in_compose | in_example) - settings_variables()
    assert not unknown, f"not fields of antdt.settings.Settings: {sorted(unknown)}"


def test_env_example_documents_every_variable_compose_uses(compose):
    documented = set(env_example_assignments(commented=True))
    used = referenced_variables(compose) | {
        key
        for service in antdt_services(compose["services"]).values()
        for key in service["environment"]
    }
    assert used <= documented, (
        f"used in compose.yaml, missing from .env.example: {sorted(used - documented)}"
    )
    assert settings_variables() <= documented, (
        "every setting is documented (commented out where optional)"
    )


def test_env_example_values_are_valid_settings(monkeypatch):
    """Copied as is, the example gives valid settings; its empty values are the ones Compose insists
    on."""
    active = env_example_assignments(commented=False)
    for name in antdt_variables(set(active)):
        if active[name]:
            monkeypatch.setenv(name, active[name])
    settings = load_settings()
    assert settings.bootstrap_servers == active["ANTDT_BOOTSTRAP_SERVERS"]
    empty = {name for name, value in active.items() if not value}
    required = {
        m["name"]
        for text in strings(yaml.safe_load(COMPOSE.read_text()))
        for m in INTERPOLATION.finditer(text)
        if m["op"] == ":?"
    }
    assert empty == required == {"ANTDT_SIGNING_KEY"}


def test_compose_defaults_are_the_values_env_example_shows(compose):
    """Deleting a line from deploy/.env changes nothing: the example shows the defaults."""
    active = env_example_assignments(commented=False)
    defaults = {
        m["name"]: m["arg"]
        for text in strings(compose)
        for m in INTERPOLATION.finditer(text)
        if m["op"] == ":-"
    }
    assert defaults and all(active[name] == default for name, default in defaults.items()), (
        defaults,
        active,
    )


def test_compose_refuses_to_start_without_a_signing_key(compose):
    with pytest.raises(MissingVariable, match="ANTDT_SIGNING_KEY"):
        resolve(compose, env_example_assignments(commented=False))


def test_no_secret_is_written_down(compose):
    """Secret-looking variables are interpolated without a default in compose.yaml and empty in
    .env.example."""
    for service in compose["services"].values():
        for key, value in service.get("environment", {}).items():
            if SECRET_NAME.search(key):
                assert re.fullmatch(r"\$\{\w+(:?\?[^}]*)?\}", str(value)), (
                    f"{key} has a value in compose.yaml"
                )
    for name, value in env_example_assignments(commented=True).items():
        if SECRET_NAME.search(name):
            assert value == "", f"{name} has a value in .env.example"


# ------------------------------------------------------------------ example workers


def test_the_job_runs_only_in_the_workers_profile(services):
    """Workers and their parameter server start with `--profile workers`; nothing else does."""
    for name, service in services.items():
        in_job = service.get("command", [None])[0] in JOB_COMMANDS
        assert service.get("profiles") == (["workers"] if in_job else None), name


def test_workers_have_distinct_valid_ids_and_some_are_stragglers(services):
    workers = [s for s in services.values() if s.get("command", [None])[0] == "worker"]
    ids = [s["environment"]["ANTDT_WORKER_ID"] for s in workers]
    assert len(workers) >= 2 and len(set(ids)) == len(ids)
    for worker_id in ids:
        load_settings(worker_id=worker_id)
    slowdowns = [option(s["command"], "--slowdown") for s in workers]
    assert 1 <= sum(value is not None for value in slowdowns) < len(workers), (
        "need both stragglers and a baseline"
    )
    for worker in workers:
        load_settings(
            slowdown=option(worker["command"], "--slowdown"),
            slowdown_mode=option(worker["command"], "--slowdown-mode") or "sleep",
        )


# ------------------------------------------------------------------ the example job's parameter
# server


@pytest.fixture(scope="module")
def parameter_servers(services) -> dict[str, dict[str, Any]]:
    """The ps services, by shard number."""
    shards = {
        cli_params(s["command"])["shard"]: name for name, s in running(services, "ps").items()
    }
    return {shard: services[name] | {"name": name} for shard, name in sorted(shards.items())}


def test_the_parameter_server_shards_are_numbered_from_zero_and_agree_on_their_count(
    parameter_servers,
):
    assert parameter_servers, "the example job runs no parameter server"
    assert list(parameter_servers) == list(range(len(parameter_servers))), (
        f"shards {list(parameter_servers)}"
    )
    for service in parameter_servers.values():
        assert cli_params(service["command"])["shards"] == len(parameter_servers), service["name"]


def test_the_parameter_server_is_probed_on_its_http_port_and_always_restarted(parameter_servers):
    for service in parameter_servers.values():
        port = cli_params(service["command"])["http_port"]
        probe = service["healthcheck"]["test"]
        assert int(option(probe, "--port")) == port and option(probe, "--path") == "/readyz", (
            service["name"]
        )
        assert port in published(service), f"{service['name']}: metrics port {port} not published"
        assert service["restart"] == "unless-stopped", (
            "a shard serves until stopped, whatever ended it"
        )


def named_volume_mounts(service: dict[str, Any]) -> dict[PurePosixPath, tuple[str, bool]]:
    """Container path -> (source, read-only) of the short-syntax volume mounts."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target, *mode = str(entry).split(":")
        mounts[PurePosixPath(target)] = (source, "ro" in ",".join(mode).split(","))
    return mounts


def test_the_parameter_servers_checkpoints_and_ledgers_are_on_a_named_volume(
    resolved, parameter_servers
):
    """A restarted shard rebuilds its state from its checkpoints: they must outlive the
    container."""
    for service in parameter_servers.values():
        params, mounts = cli_params(service["command"]), named_volume_mounts(service)
        for field in ("checkpoint_dir", "out"):
            directory = PurePosixPath(params[field])
            assert directory.is_absolute(), (
                f"{service['name']}: {field} {directory} depends on the working directory"
            )
            covering = [target for target in mounts if directory.is_relative_to(target)]
            assert covering, f"{service['name']}: {field} {directory} is on no volume"
            source, read_only = mounts[max(covering, key=lambda target: len(target.parts))]
            assert source in resolved["volumes"], (
                f"{service['name']}: {directory} is on {source}, not a named volume"
            )
            assert not read_only, f"{service['name']}: {directory} is mounted read-only"


def test_workers_train_on_every_shard_once_it_is_healthy(services, parameter_servers):
    addresses = [
        f"{s['name']}:{cli_params(s['command'])['port']}" for s in parameter_servers.values()
    ]
    for name, worker in running(services, "worker").items():
        params = cli_params(worker["command"])
        assert params["ps"] and params["ps"].split(",") == addresses, (
            f"{name}: --ps {params['ps']}, shards {addresses}"
        )
        assert params["checkpoint"] is None, (
            f"{name}: --checkpoint is unused with --ps (the server holds the model)"
        )
        for shard in parameter_servers.values():
            assert dependencies(worker).get(shard["name"]) == "service_healthy", (
                f"{name} does not wait for {shard['name']}"
            )


def test_the_parameter_server_belongs_to_its_workers_job(services, parameter_servers):
    """The same job id, bus and signing key: everything but the worker's own id."""
    for name, worker in running(services, "worker").items():
        job_environment = {
            key: value for key, value in worker["environment"].items() if key != "ANTDT_WORKER_ID"
        }
        for shard in parameter_servers.values():
            assert shard["environment"] == job_environment, f"{shard['name']} and {name} differ"
