"""The files the harness and its workers meet through: a worker waits for the start within a
bound."""

from __future__ import annotations

import pytest

from antdt.demo.handshake import give_start, wait_for_start
from antdt.errors import AntdtError


def test_a_worker_reads_the_start_the_harness_gave(tmp_path):
    give_start(tmp_path, 1_700_000_000.25)
    assert wait_for_start(tmp_path, within_s=0.0) == 1_700_000_000.25


def test_a_worker_whose_harness_never_starts_the_run_gives_up_naming_the_file(tmp_path):
    with pytest.raises(AntdtError, match=r"did not start within 0.05 s \(.*/go never appeared\)"):
        wait_for_start(tmp_path, within_s=0.05)
