"""The integration without its framework: one clear error naming the extra."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from antdt.worker.frameworks import MissingExtra, require


def test_a_missing_framework_names_the_extra_to_install():
    with pytest.raises(MissingExtra, match=r"pip install 'antdt\[nope\]'"):
        require("antdt_no_such_framework", "nope")


@pytest.mark.parametrize(
    ("integration", "framework", "extra"),
    [
        ("antdt.worker.lightning", "lightning", "lightning"),
        ("antdt.worker.hf", "transformers", "hf"),
        ("antdt.worker.hf", "accelerate", "hf"),
    ],
)
def test_importing_an_integration_without_its_framework_is_one_import_error(
    integration, framework, extra
):
    blocked = f"import sys; sys.modules[{framework!r}] = None; import {integration}"
    result = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"antdt.worker.frameworks.MissingExtra: this antdt integration needs {framework}: "
        f"pip install 'antdt[{extra}]'"
    )


def test_the_base_install_pulls_no_framework_and_each_extra_its_own():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    assert not {"lightning", "transformers", "accelerate"} & set(re.findall(r"[a-z-]+", base))
    extras = project["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["lightning"]] == ["lightning"]
    assert [r.split(">")[0] for r in extras["hf"]] == ["transformers", "accelerate"]
