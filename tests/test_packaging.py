"""Packaging: every package in the source tree is listed in pyproject.toml.

The repository keeps the design card's layout (services/, worker/, schemas/
at the top) mapped into the ``antdt`` namespace; a package missing from the
list would work in an editable install and vanish from a wheel.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_package_is_declared():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    found = set()
    for package, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    assert found == declared


def test_layout_of_the_design_card():
    for folder in (
        "services/monitor",
        "services/controller",
        "services/sharder",
        "worker",
        "schemas",
        "deploy",
        "tests",
        "bench",
    ):
        assert (ROOT / folder).is_dir(), folder


def test_readme_opens_with_the_two_commands():
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.strip()]
    block = lines[lines.index("```sh") + 1 : lines.index("```")]
    assert block == ["make demo", "make test"]


def _layout_row(folder: str) -> str:
    readme = (ROOT / "README.md").read_text().splitlines()
    return next(line for line in readme if line.startswith(f"| `{folder}` |"))


def test_the_readme_layout_names_every_part_of_the_ground_floor():
    row = _layout_row("antdt/")
    parts = [p.name + "/" for p in (ROOT / "antdt").iterdir() if (p / "__init__.py").is_file()]
    parts += [p.name for p in (ROOT / "antdt").glob("*.py") if p.name != "__init__.py"]
    missing = [part for part in parts if f"`{part}`" not in row]
    assert not missing, f"README layout table lacks {missing}"


def test_the_readme_layout_names_nothing_that_is_not_there():
    row = _layout_row("antdt/")
    named = [n for n in re.findall(r"`([a-z_]+(?:\.py|/))`", row) if n != "antdt/"]
    assert named and all((ROOT / "antdt" / name).exists() for name in named), named
