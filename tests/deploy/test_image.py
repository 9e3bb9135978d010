"""The Dockerfile and .dockerignore, checked statically (no Docker engine here).

A small parser turns the Dockerfile into instructions the way the builder
reads them (comments dropped, line continuations joined, ARG defaults
substituted); the tests then check what a real build and a real cluster
depend on: a python:3.11 slim base, a non-root numeric user, the torch pin and
its wheel-index argument, the console script as entrypoint, the services'
health ports exposed, and every source directory copied into the build.
"""

from __future__ import annotations

import inspect
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from antdt.cli import controller_cmd, grouper_cmd, monitor_cmd, sharder_cmd

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

#: The long-running services of the image and their CLI entry points.
SERVICE_COMMANDS = {
    "sharder": sharder_cmd.sharder,
    "monitor": monitor_cmd.monitor,
    "controller": controller_cmd.controller,
    "grouper": grouper_cmd.grouper,
}


def default_http_port(command) -> int:
    """The default of a service command's --http-port option, read from its signature."""
    return inspect.signature(command).parameters["http_port"].default.default


def service_default_ports() -> dict[str, int]:
    """Service name -> the port its /healthz, /readyz and /metrics listen on by default."""
    return {name: default_http_port(command) for name, command in SERVICE_COMMANDS.items()}


# ------------------------------------------------------------------ the parser


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    arguments: str  # continuations joined, ${ARG} left as written
    stage: int  # index of the FROM this instruction belongs to


def logical_lines(text: str) -> list[str]:
    """Lines as the builder sees them: comments dropped, backslash continuations joined."""
    lines, pending = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comments and blank lines also end nowhere inside a continuation
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, f"dangling line continuation: {pending!r}"
    return lines


def parse_dockerfile(text: str) -> list[Instruction]:
    """Every instruction, tagged with its build stage (-1 for ARGs before the first FROM)."""
    instructions, stage = [], -1
    for line in logical_lines(text):
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        stage += keyword == "FROM"
        instructions.append(Instruction(keyword, arguments.strip(), stage))
    return instructions


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    """ARG name -> default value (the last declaration wins)."""
    defaults = {}
    for instruction in instructions:
        if instruction.keyword == "ARG":
            name, _, value = instruction.arguments.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
    return defaults


def substitute(text: str, variables: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced by the ARG defaults, as the builder would."""
    return re.sub(
        r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), text
    )


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final_stage(instructions) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def only(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


# ---------------------------------------------------------------- the parser's own tests


def test_parser_joins_continuations_and_drops_comments():
    text = (
        "# syntax=docker/dockerfile:1\nARG BASE=python:3.11-slim\nFROM ${BASE} AS build\n"
        "RUN a \\\n  # inside\n  && b\nfrom scratch\nUSER 1\n"
    )
    parsed = parse_dockerfile(text)
    assert [(i.keyword, i.arguments, i.stage) for i in parsed] == [
        ("ARG", "BASE=python:3.11-slim", -1),
        ("FROM", "${BASE} AS build", 0),
        ("RUN", "a && b", 0),
        ("FROM", "scratch", 1),
        ("USER", "1", 1),
    ]
    assert substitute(parsed[1].arguments, arg_defaults(parsed)) == "python:3.11-slim AS build"


# ---------------------------------------------------------------- the Dockerfile


def test_every_stage_is_a_python_3_11_slim_image(instructions):
    variables = arg_defaults(instructions)
    bases = [substitute(i.arguments, variables).split()[0] for i in only(instructions, "FROM")]
    assert len(bases) >= 1
    for base in bases:
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-[a-z]+)?", base), base


def test_runs_as_a_numeric_non_root_user_before_the_entrypoint(final_stage):
    keywords = [i.keyword for i in final_stage]
    users = only(final_stage, "USER")
    assert users, "the runtime stage never leaves root"
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")
    user, _, group = users[-1].arguments.partition(":")
    # Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
    assert user.isdigit() and int(user) != 0 and (not group or int(group) != 0)
    created = " ".join(i.arguments for i in only(final_stage, "RUN"))
    assert f"--uid {user}" in created, "the USER uid is not the one the image creates"


def test_torch_comes_from_the_index_the_build_argument_names(instructions):
    variables = arg_defaults(instructions)
    assert variables["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    torch_runs = [i.arguments for i in only(instructions, "RUN") if "torch==" in i.arguments]
    assert len(torch_runs) == 1
    assert '--index-url "${TORCH_INDEX_URL}"' in torch_runs[0]
    makefile_pin = re.search(r"torch==([0-9.]+)", (ROOT / "Makefile").read_text()).group(1)
    assert substitute(torch_runs[0], variables).count(f"torch=={makefile_pin}") == 1


def test_cuda_build_argument_is_a_declared_arg_of_the_build_stage(instructions):
    torch_run = next(i for i in only(instructions, "RUN") if "torch==" in i.arguments)
    declared_in_stage = {
        i.arguments.partition("=")[0]
        for i in only(instructions, "ARG")
        if i.stage == torch_run.stage
    }
    # An ARG declared only before FROM is not visible inside the stage.
    assert {"TORCH_INDEX_URL", "TORCH_VERSION"} <= declared_in_stage


def test_entrypoint_is_the_console_script_and_the_default_is_help(final_stage):
    (entrypoint,) = only(final_stage, "ENTRYPOINT")
    (cmd,) = only(final_stage, "CMD")
    assert json.loads(entrypoint.arguments) == ["antdt"]  # exec form: signals reach antdt
    assert json.loads(cmd.arguments) == ["--help"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "antdt" in scripts


def test_exposes_exactly_the_services_health_ports(final_stage):
    exposed = {
        int(port.split("/")[0]) for i in only(final_stage, "EXPOSE") for port in i.arguments.split()
    }
    assert exposed == set(service_default_ports().values())


def test_installs_the_project_from_every_source_directory_pyproject_names(instructions):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    sources = package_dirs | {"pyproject.toml", pyproject["project"]["readme"]}
    copied = {
        Path(part).as_posix()
        for i in only(instructions, "COPY")
        if "--from" not in i.arguments
        for part in i.arguments.split()[:-1]
    }
    assert sources <= copied, f"not copied into the build: {sorted(sources - copied)}"
    assert any(re.search(r"\bpip install \.(\s|$)", i.arguments) for i in only(instructions, "RUN"))


def test_runtime_stage_takes_only_the_built_environment_from_the_build_stage(final_stage):
    copies = only(final_stage, "COPY")
    assert copies and all(i.arguments.startswith("--from=build ") for i in copies)


# ---------------------------------------------------------------- .dockerignore


def dockerignore_patterns() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def glob_regex(glob: str) -> re.Pattern[str]:
    """A .dockerignore glob as a regex: ``*`` and ``?`` stay within one path segment, ``**/`` spans
    any."""
    regex, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif glob[i] == "[":
            end = glob.index("]", i)
            regex, i = regex + glob[i : end + 1], end + 1
        else:
            regex, i = regex + {"*": "[^/]*", "?": "[^/]"}.get(glob[i], re.escape(glob[i])), i + 1
    return re.compile(regex)


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path, or a folder above it, decides."""
    parts = Path(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for pattern in patterns:
        regex = glob_regex(pattern.removeprefix("!").rstrip("/"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            ignored = not pattern.startswith("!")
    return ignored


def context_files(source: str) -> list[str]:
    """The files a COPY of ``source`` takes from the checkout (build litter aside)."""
    root = ROOT / source
    files = [root] if root.is_file() else [f for f in root.rglob("*") if f.is_file()]
    litter = ("__pycache__", ".egg-info", ".pyc")
    return [
        f.relative_to(ROOT).as_posix()
        for f in files
        if not any(mark in f.as_posix() for mark in litter)
    ]


def test_dockerignore_keeps_every_file_the_build_copies(instructions):
    patterns = dockerignore_patterns()
    sources = [
        part
        for i in only(instructions, "COPY")
        if "--from" not in i.arguments
        for part in i.arguments.split()[:-1]
    ]
    files = [path for source in sources for path in context_files(source)]
    assert any(path.endswith(".avsc") for path in files)  # package data travels too
    dropped = [path for path in files if is_ignored(path, patterns)]
    assert not dropped, f"copied by the Dockerfile but dropped by .dockerignore: {dropped[:5]}"


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "deploy/.env",
        "antdt/__pycache__/main.cpython-311.pyc",
        "antdt.egg-info/PKG-INFO",
    ],
)
def test_dockerignore_keeps_secrets_and_local_state_out_of_the_context(path):
    assert is_ignored(path, dockerignore_patterns())
