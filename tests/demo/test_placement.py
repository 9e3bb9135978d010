"""The harness's placement: a replaced process goes to a spare or free node, never to a degraded one
or back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from antdt.demo.cluster import NodeSpec
from antdt.demo.placement import Placement
from antdt.demo.scenario import Scenario, WorkerSpec


def cluster(spares: int = 2, free: int = 0) -> Scenario:
    nodes = [NodeSpec(name=f"n{i}") for i in range(4)] + [
        NodeSpec(name=f"free{i}") for i in range(free)
    ]
    nodes += [NodeSpec(name=f"spare{i}", spare=True) for i in range(spares)]
    return Scenario(
        name="p",
        dataset_size=300,
        shard_size=10,
        parameter_servers=1,
        nodes=tuple(nodes),
        server_nodes=("n3",),
        workers=tuple(WorkerSpec(name=f"w{i}", node=f"n{i}") for i in range(3)),
    )


def test_a_restarted_worker_goes_to_a_spare_and_the_move_says_why():
    told = []
    placement = Placement(cluster(free=1), on_move=told.append)
    placement.mark_degraded("n1")
    move = placement.replace("w1", 12.0, "RESTART: persistent straggler")
    assert (move.source, move.target, move.helped) == ("n1", "spare0", True)
    assert (
        move.describe()
        == "w1: n1 -> spare0 (RESTART: persistent straggler; spare spare0, n1 marked degraded)"
    )
    assert placement.where["w1"] == "spare0" and placement.moves == told == [move]


def test_a_parameter_server_is_placed_like_a_worker():
    placement = Placement(cluster())
    assert placement.replace("ps-0", 1.0, "RESTART").target == "spare0"


def test_without_a_free_healthy_node_the_process_stays_and_the_move_says_it_did_not_help():
    placement = Placement(cluster(spares=1))
    placement.replace("w0", 1.0, "RESTART")  # takes the only spare
    placement.mark_degraded("n0")
    move = placement.replace("w2", 2.0, "RESTART")
    assert not move.helped and "no free healthy node: stays on n2" in move.reason


@given(
    st.lists(st.tuples(st.sampled_from(["mark", "replace"]), st.integers(0, 7)), max_size=30),
    st.integers(0, 3),
    st.integers(0, 3),
)
def test_one_process_per_node_and_never_onto_a_degraded_node_or_back(steps, spares, free):
    scenario = cluster(spares, free)
    placement = Placement(scenario)
    processes, nodes = sorted(placement.where), [n.name for n in scenario.cluster]
    for action, pick in steps:
        if action == "mark":
            placement.mark_degraded(nodes[pick % len(nodes)])
            continue
        spares_left = [
            n.name
            for n in scenario.cluster
            if n.spare
            and n.name not in placement.where.values()
            and n.name not in placement.degraded
        ]
        move = placement.replace(processes[pick % len(processes)], 0.0, "RESTART")
        assert len(set(placement.where.values())) == len(placement.where)
        if move.helped:
            assert move.target not in placement.degraded
            assert move.target in spares_left or not spares_left  # a spare whenever one was left
