"""Scenarios: loading with one-line errors, speeds, noise, and the exact ideal time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from antdt.demo.scenario import ClusterMode, Episode, Noise, Scenario, WorkerSpec
from antdt.errors import ConfigError


def scenario(**fields) -> Scenario:
    base = {
        "name": "t",
        "workers": (WorkerSpec(name="a"), WorkerSpec(name="b")),
        "dataset_size": 1000,
        "shard_size": 10,
        "base_rate": 100.0,
    }
    return Scenario(**{**base, **fields})


def test_the_shipped_scenarios_load_and_the_standard_one_is_what_the_issue_asks():
    standard = Scenario.load("standard")
    assert len(standard.workers) == 8
    speeds = sorted(w.speed for w in standard.workers)
    assert speeds[0] == 0.25 and not standard.workers[-1].episodes  # one persistently 4x slower
    transient = [w for w in standard.workers if w.episodes]
    assert len(transient) == 1 and {e.factor for e in transient[0].episodes} == {3.0}
    assert {e.cause for e in transient[0].episodes} == {"sleep", "cpu"}
    assert standard.noise.amplitude == pytest.approx(0.10)
    assert Scenario.load("short").mode is ClusterMode.ND


def test_the_target_loss_is_optional_and_positive():
    assert Scenario.load("standard").target_loss == pytest.approx(0.25)
    assert Scenario.load("short").target_loss is None
    with pytest.raises(ValueError, match="greater than 0"):
        scenario(target_loss=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: x\nworkers: []\ndataset_size: 10\nshard_size: 1\n",
            "workers: Tuple should have at least 1 item",
        ),
        (
            "name: x\nworkers: [{name: a}]\ndataset_size: 10\nshard_size: 1\nbogus: 1\n",
            "bogus: Extra inputs are not permitted",
        ),
        (
            "name: x\nworkers: [{name: a}, {name: b}]\ndataset_size: 11\nshard_size: 1\n",
            "must split evenly over 2 workers",
        ),
        (
            "name: x\nworkers: [{name: a, episodes: [{start_s: 5, end_s: 2, factor: 2}]}]\n"
            "dataset_size: 10\nshard_size: 1\n",
            "end must be after start",
        ),
        (
            "name: x\nworkers: [{name: a, episodes: [{start_s: 0, end_s: 5, factor: 2}, "
            "{start_s: 4, end_s: 6, factor: 2}]}]\n"
            "dataset_size: 10\nshard_size: 1\n",
            "overlap",
        ),
        (
            "name: x\n"
            "workers: [{name: a, episodes: [{start_s: 0, end_s: 5, factor: 2, cause: disk}]}]\n"
            "dataset_size: 10\nshard_size: 1\n",
            "cause",
        ),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_scenario_is_one_line_naming_the_problem(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        Scenario.load(path)
    message = str(error.value)
    assert expected in message and "\n" not in message


def test_a_missing_scenario_lists_the_shipped_ones():
    with pytest.raises(
        ConfigError, match="shipped scenarios: bursty, contention, fixed-cost, short, standard"
    ):
        Scenario.load("no-such-scenario")


def test_json_scenarios_load_too(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(scenario().model_dump_json())
    assert Scenario.load(path) == scenario()


def test_speed_follows_episodes():
    s = scenario(
        workers=(
            WorkerSpec(name="a", speed=0.5, episodes=(Episode(start_s=2, end_s=4, factor=3),)),
            WorkerSpec(name="b"),
        )
    )
    assert s.speed_at(0, 1.9) == pytest.approx(50)
    assert s.speed_at(0, 2.0) == pytest.approx(50 / 3)
    assert s.speed_at(0, 4.0) == pytest.approx(50)
    assert s.speed_at(1, 3.0) == pytest.approx(100)


def test_noise_is_bounded_seeded_and_held_for_its_period():
    s = scenario(noise=Noise(amplitude=0.1, period_s=5))
    values = [s.noise_at(0, t) for t in range(0, 100)]
    assert all(0.9 <= v <= 1.1 for v in values)
    assert (
        s.noise_at(0, 0.0)
        == s.noise_at(0, 4.99)
        == scenario(noise=Noise(amplitude=0.1, period_s=5)).noise_at(0, 1)
    )
    assert len(set(values)) > 10  # redrawn every period
    assert s.noise_at(0, 3) != s.noise_at(1, 3)  # per worker


def test_ideal_time_of_constant_speeds_is_work_over_summed_speed():
    s = scenario(workers=(WorkerSpec(name="a"), WorkerSpec(name="b", speed=0.25)), epochs=3)
    assert s.ideal_time_s() == pytest.approx(3000 / 125)


def test_ideal_time_integrates_an_episode():
    # a: 100/s, b: 100/s but 4x slower during [0, 10): 125/s for 10 s (1250 samples), then 200/s.
    s = scenario(
        workers=(
            WorkerSpec(name="a"),
            WorkerSpec(name="b", episodes=(Episode(start_s=0, end_s=10, factor=4),)),
        ),
        dataset_size=2000,
    )
    assert s.ideal_time_s() == pytest.approx(10 + 750 / 200)


def test_a_fixed_cost_lengthens_every_step_and_the_ideal_by_the_share_it_takes():
    # a: 100/s, b: 25/s; each step pays 0.1 s on a speed-1.0 worker: 10 samples' worth, on top of a
    # batch of 40.
    s = scenario(
        workers=(WorkerSpec(name="a"), WorkerSpec(name="b", speed=0.25)),
        batch_size=40,
        step_fixed_s=0.1,
    )
    assert s.step_s(0, 0.0, 40) == pytest.approx(0.5) and s.step_s(1, 0.0, 40) == pytest.approx(2.0)
    # at a global batch of 80 the best split trains 80 samples per (80 + 2 x 10) / 125 s: 4/5 of the
    # summed speed
    assert s.ideal_time_s() == pytest.approx(1000 / 125 / 0.8)
    assert (
        Scenario.load("fixed-cost").fixed_samples / (32 + Scenario.load("fixed-cost").fixed_samples)
        >= 0.30
    )


def test_the_ideal_leaves_out_a_worker_whose_fixed_part_alone_outlasts_the_others_step():
    # three at 100/s and one at 25/s; 15 samples' worth of fixed cost on a batch of 32 (global 128)
    s = scenario(
        workers=(
            *(WorkerSpec(name=f"w{i}") for i in range(3)),
            WorkerSpec(name="slow", speed=0.25),
        ),
        batch_size=32,
        step_fixed_s=0.15,
        dataset_size=1200,
    )
    # all four busy: a (128 + 4 x 15) / 325 s step, in which the slow one could not even pay its 0.6
    # s fixed part
    with_all = 32 / 47 * 325
    without = 128 / ((128 + 3 * 15) / 300)  # the three alone: a 0.577 s step
    assert s.rate_at(0) == pytest.approx(without) and without > with_all


@hsettings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.1, 2.0), min_size=2, max_size=6), st.integers(1, 4), st.floats(0, 0.3))
def test_the_ideal_curve_reaches_the_total_work_exactly_at_the_ideal_time(
    speeds, epochs, amplitude
):
    workers = tuple(
        WorkerSpec(name=f"w{i}", speed=v, episodes=(Episode(start_s=1, end_s=3, factor=2),))
        for i, v in enumerate(speeds)
    )
    s = scenario(
        workers=workers,
        dataset_size=600 * len(speeds),
        epochs=epochs,
        noise=Noise(amplitude=amplitude, period_s=2),
    )
    ideal = s.ideal_time_s()
    curve = s.ideal_curve(ideal)
    assert all(b[1] >= a[1] and b[0] > a[0] for a, b in zip(curve, curve[1:]))
    assert curve[-1][1] == pytest.approx(s.total_samples, rel=1e-9)
    assert s.ideal_curve(ideal * 0.99)[-1][1] < s.total_samples


def test_with_workers_trims_or_extends_and_keeps_the_dataset_even():
    s = Scenario.load("standard")
    three = s.with_workers(3)
    assert [w.name for w in three.workers] == ["w0", "w1", "w2"] and three.dataset_size % 3 == 0
    ten = s.with_workers(10)
    assert len(ten.workers) == 10 and ten.workers[-1].speed == 1.0 and ten.dataset_size % 10 == 0
    assert math.isclose(ten.dataset_size, s.dataset_size, rel_tol=0.001)
