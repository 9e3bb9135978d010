"""The examples people copy: the antdt script is the plain DDP one plus a few lines, and the plain
one runs."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


def logical_lines(path: Path) -> list[str]:
    """The file's logical lines (a call spread over several lines by the formatter is one),
    whitespace collapsed, comments left out."""
    lines, current = [], []
    with path.open() as source:
        for token in tokenize.generate_tokens(source.readline):
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                if current:
                    lines.append(" ".join(current))
                current = []
            elif token.type not in (
                tokenize.NL,
                tokenize.COMMENT,
                tokenize.INDENT,
                tokenize.DEDENT,
            ):
                current.append(token.string)
    return lines


@pytest.mark.parametrize(
    ("plain_example", "example"),
    [
        ("ddp_plain.py", "ddp_antdt.py"),
        ("ddp_plain.py", "preduce_antdt.py"),
        ("ddp_plain.py", "ps_antdt.py"),
        ("lightning_plain.py", "lightning_antdt.py"),
        ("hf_plain.py", "hf_antdt.py"),
        ("accelerate_plain.py", "accelerate_antdt.py"),
    ],
)
def test_an_antdt_example_adds_at_most_ten_lines_to_the_plain_one(plain_example, example):
    plain, antdt = (
        logical_lines(EXAMPLES / plain_example),
        logical_lines(EXAMPLES / example),
    )
    added = [
        line
        for line in difflib.unified_diff(plain, antdt, lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert 0 < len(added) <= 10, added


@pytest.mark.slow
def test_the_plain_ddp_example_trains_under_torchrun(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTDT_")} | {
        "OMP_NUM_THREADS": "1"
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(EXAMPLES / "ddp_plain.py"),
            "--samples",
            "3000",
            "--checkpoint",
            str(tmp_path / "plain.pt"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    accuracy = float(done.stdout.split("held-out accuracy")[1].split()[0])
    assert accuracy > 0.5  # ten classes: chance is 0.1


@pytest.mark.parametrize(
    ("doc", "job", "example"),
    [
        ("README.md", "ElasticJob(", "ddp_antdt.py"),
        ("docs/torchrun.md", "ElasticJob(", "ddp_antdt.py"),
        ("docs/partial-reduce.md", "PartialReduceJob(", "preduce_antdt.py"),
        ("docs/parameter-server.md", "ParameterServerJob(", "ps_antdt.py"),
        ("docs/frameworks.md", "AntdtStrategy(", "lightning_antdt.py"),
        ("docs/frameworks.md", "AntdtTrainer(", "hf_antdt.py"),
        ("docs/frameworks.md", "ElasticJob(", "accelerate_antdt.py"),
    ],
)
def test_the_docs_show_the_antdt_example_s_own_loop(doc: str, job: str, example: str):
    """The docs' block with the job is an excerpt of its example, indentation aside."""
    text = (EXAMPLES.parent / doc).read_text()
    blocks = [b for b in text.split("```python\n")[1:] if job in b.split("```")[0]]
    assert len(blocks) == 1, f"{doc}: one {job} block expected"
    shown = [line.strip() for line in blocks[0].split("```")[0].splitlines() if line.strip()]
    example = [line.strip() for line in (EXAMPLES / example).read_text().splitlines()]
    starts = [i for i, line in enumerate(example) if line == shown[0]]
    assert any(example[i : i + len(shown)] == shown for i in starts), f"{doc} drifted"
