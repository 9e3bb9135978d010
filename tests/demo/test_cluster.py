"""Nodes: speed belongs to the machine, and the ideal places every process on the best hardware
there is."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from antdt.demo.cluster import Episode, NodeSpec, best_speeds
from antdt.demo.scenario import Scenario, WorkerSpec
from antdt.errors import ConfigError


def on_nodes(nodes, workers=("a", "b"), servers=("s0",), **fields) -> Scenario:
    return Scenario(
        name="n",
        base_rate=100.0,
        dataset_size=1000,
        shard_size=10,
        parameter_servers=len(servers),
        nodes=tuple(NodeSpec(**n) for n in nodes),
        server_nodes=servers,
        workers=tuple(WorkerSpec(name=w, node=f"n-{w}") for w in workers),
        **fields,
    )


HEALTHY = [{"name": "n-a"}, {"name": "n-b"}, {"name": "s0"}]


def test_an_episode_without_an_end_lasts_to_the_end_of_the_run():
    episode = Episode(start_s=5, factor=4)
    assert not episode.covers(4.9) and episode.covers(5) and episode.covers(1e9)
    assert episode.describe() == "5-end s x4 (sleep)"


def test_a_process_runs_at_the_speed_of_the_node_it_is_on():
    scenario = on_nodes(
        [
            {"name": "n-a", "episodes": [{"start_s": 10, "factor": 4}]},
            {"name": "n-b", "speed": 0.5},
            {"name": "s0"},
            {"name": "spare", "spare": True},
        ]
    )
    assert (
        scenario.speed_at(0, 0) == 100
        and scenario.speed_at(0, 10) == 25
        and scenario.speed_at(1, 0) == 50
    )
    assert scenario.step_s(0, 10, 32) == pytest.approx(32 / 25)
    # moved: the spare's speed
    assert scenario.step_s(0, 10, 32, node="spare") == pytest.approx(32 / 100)


def test_the_ideal_counts_the_spares_the_best_placement_would_use():
    contended = [
        {"name": "n-a", "episodes": [{"start_s": 0, "factor": 4}]},
        {"name": "n-b"},
        {"name": "s0"},
    ]
    without = on_nodes(contended)
    with_spare = on_nodes([*contended, {"name": "spare", "spare": True}])
    assert without.worker_speeds(1) == [100, 25]
    # a on the spare: the cluster could deliver that
    assert with_spare.worker_speeds(1) == [100, 100]
    assert with_spare.ideal_time_s() == pytest.approx(1000 / 200)


def test_the_parameter_servers_get_healthy_nodes_and_the_workers_the_fastest_of_the_rest():
    assert best_speeds([100, 100, 25, 300], [True, True, False, True], workers=2, servers=1) == [
        300,
        100,
    ]
    # no healthy node: the PS takes the best
    assert best_speeds([50, 25], [False, False], workers=1, servers=1) == [25]


@given(st.lists(st.floats(1, 400), min_size=3, max_size=12), st.data())
def test_the_best_placement_never_uses_more_nodes_than_there_are(speeds, data):
    servers = data.draw(st.integers(0, len(speeds) - 1))
    workers = data.draw(st.integers(1, len(speeds) - servers))
    healthy = data.draw(st.lists(st.booleans(), min_size=len(speeds), max_size=len(speeds)))
    best = best_speeds(speeds, healthy, workers, servers)
    assert len(best) == workers and sum(best) <= sum(sorted(speeds, reverse=True)[:workers]) + 1e-9


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"server_nodes": ()}, "server_nodes must name a node for each"),
        ({"server_nodes": ("nowhere",)}, "ps-0 must run on one of the scenario's nodes"),
        ({"server_nodes": ("n-a",)}, "two processes start on one node"),
        ({"server_nodes": ("spare",)}, "spares start empty"),
    ],
)
def test_placements_that_cannot_be_are_refused(change, expected):
    fields = on_nodes([*HEALTHY, {"name": "spare", "spare": True}]).model_dump()
    with pytest.raises(ValueError, match=expected):
        Scenario.model_validate({**fields, **change})


def test_a_worker_on_a_node_cannot_have_a_speed_of_its_own(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: x\nnodes: [{name: n}]\nserver_nodes: [n]\n"
        "workers: [{name: a, node: n, speed: 0.5}]\n"
        "dataset_size: 10\nshard_size: 1\n"
    )
    with pytest.raises(ConfigError, match="belong to the node"):
        Scenario.load(path)


def test_a_scenario_without_nodes_gives_each_process_a_node_of_its_own():
    scenario = Scenario.load("standard")
    assert scenario.home("w7") == "node-w7" and scenario.node("node-w7").speed == 0.25
    assert scenario.home("ps-0") == "node-ps-0"
    assert scenario.worker_speeds(0) == [scenario.speed_at(rank, 0) for rank in range(8)]


def test_the_contention_scenario_is_the_one_the_issue_describes():
    scenario = Scenario.load("contention")
    spares = [n for n in scenario.cluster if n.spare]
    assert (
        len(scenario.workers) == 8
        and scenario.parameter_servers == 2
        and len(scenario.cluster) == 12
    )
    assert len(spares) == 2
    worker_nodes = [scenario.node(scenario.home(w.name)) for w in scenario.workers]
    assert sum(1 for n in worker_nodes if n.speed < 1) == 1  # slow hardware
    endless = [n for n in worker_nodes if any(e.end_s is None for e in n.episodes)]
    passing = [n for n in worker_nodes if any(e.end_s is not None for e in n.episodes)]
    # contended from early on to the end; one transient episode
    assert len(endless) == 1 and len(passing) == 1
    server_nodes = [scenario.node(n) for n in scenario.server_nodes]
    # one server node contended for a long stretch
    assert sum(1 for n in server_nodes if n.episodes) == 1
    # nothing tuned for it that a plan would not use everywhere
    assert not scenario.monitor and not scenario.controller
