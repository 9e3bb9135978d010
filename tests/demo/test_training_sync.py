"""The demo's process-group rendezvous file, wherever the run's directory is given."""

from __future__ import annotations

from pathlib import Path

from antdt.demo.training_sync import group_init_method


def test_a_relative_run_directory_gives_an_absolute_rendezvous_file(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # antdt demo's default out is relative (reports/...): as file://reports/... it named a host
    url = group_init_method(Path("reports/run/handshake"), 2)
    assert url == f"file://{tmp_path}/reports/run/handshake/group-2"
