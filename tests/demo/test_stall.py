"""A stalled run's description: the sharder's view of the job, from its state."""

from __future__ import annotations

from antdt.demo.stall import one_line, stall_summary
from antdt.schemas.models import ProgressKind as K
from tests.services.sharder.helpers import dataset, new_core, report


def test_a_stall_names_the_open_shards_with_their_holders_and_leases():
    core, _ = new_core(dataset(size=400, shard_size=100, epochs=1, lease_s=10.0))
    granted = core.on_progress(report(K.REQUESTED, "w1", 0, 0, quota=2), 0).assignment.shards
    first = granted[0]
    core.on_progress(
        report(K.DONE, "w1", 0, 1000, shard_id=first.shard_id, attempt=first.attempt), 1000
    )
    summary = stall_summary(core.state, now_ms=4000)
    assert summary["shards"] == {"DONE": 1, "DOING": 1, "TODO": 2}
    [doing] = [entry for entry in summary["open"] if entry["state"] == "DOING"]
    assert doing["worker"] == "w1" and doing["shard"] == granted[1].shard_id
    assert doing["lease_left_s"] == 6.0  # granted at 0 with a 10 s lease, looked at 4 s on
    assert summary["held"] == {"w1": [granted[1].shard_id]}
    line = one_line(summary)
    assert "epoch 0 open with 2 TODO, 1 DOING, 1 DONE (doing: w1: 1)" in line


def test_a_finished_job_says_so():
    core, _ = new_core(dataset(size=100, shard_size=100, epochs=1))
    core.state.finished = True
    assert one_line(stall_summary(core.state, 0)) == "the shard log has job job-t finished"


def test_a_stalled_job_is_described_from_the_shard_log_on_the_bus(settings, topics, tmp_path):
    import json

    from antdt.demo.stall import describe_stall
    from antdt.worker.shard_client import ShardClient
    from tests.services.sharder.harness import running_sharder

    spec = dataset(size=400, shard_size=100, epochs=1, lease_s=60.0)
    with running_sharder(settings), ShardClient(settings, "job-s", "w1", spec) as client:
        held = client.request(0, quota=1).shards
    counters = {"grouper": {"antdt_grouper_announcements_total": 0.0}}
    line = describe_stall(settings, "job-s", tmp_path, {"w1": "OTHER"}, counters)
    assert "epoch 0 open with 3 TODO, 1 DOING (doing: w1: 1)" in line
    report = json.loads((tmp_path / "stall.json").read_text())
    assert report["phases"] == {"w1": "OTHER"}
    assert report["services"] == counters
    assert report["sharder"]["held"] == {"w1": [held[0].shard_id]}
