"""A shard's applied samples: the array behaves as the dict it replaced."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from antdt.services.sharder.applied import Applied

START, LENGTH = 100, 12
samples = st.lists(st.integers(START, START + LENGTH - 1), max_size=LENGTH)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("record"), samples, st.integers(1, 50)),
        st.tuples(st.just("record_all"), st.just([]), st.integers(1, 50)),
        st.tuples(st.just("keep_up_to"), st.just([]), st.integers(0, 50)),
    ),
    max_size=12,
)


def apply_to_dict(model: dict[int, int], step) -> None:
    """The dict semantics the sharder's fold had."""
    kind, chosen, seq = step
    if kind == "record":
        for sample in chosen:
            model.setdefault(sample, seq)
    elif kind == "record_all":
        model.clear()
        model.update(dict.fromkeys(range(START, START + LENGTH), seq))
    else:
        for sample in [s for s, recorded in model.items() if recorded > seq]:
            del model[sample]


@given(steps)
def test_it_folds_as_a_dict_of_sample_to_first_seq(steps):
    applied, model = Applied(START, LENGTH), {}
    for step in steps:
        kind, chosen, seq = step
        if kind == "record":
            applied.record(chosen, seq)
        elif kind == "record_all":
            applied.record_all(seq)
        else:
            applied.keep_up_to(seq)
        apply_to_dict(model, step)
        assert applied == model and dict(applied.items()) == model and len(applied) == len(model)
        assert list(applied) == sorted(model)
        assert applied.missing() == [i for i in range(START, START + LENGTH) if i not in model]
        assert applied.complete == (len(model) == LENGTH)
        assert all((sample in applied) == (sample in model) for sample in range(90, 120))
    groups = applied.groups()
    assert [seq for seq, _ in groups] == sorted({*model.values()})
    assert sorted(s for _, group in groups for s in group) == sorted(model)


def test_copies_and_pickles_are_equal_and_independent():
    applied = Applied(START, LENGTH)
    applied.record([START, START + 3], 7)
    twin, shipped = applied.copy(), pickle.loads(pickle.dumps(applied))
    assert twin == applied == shipped == {START: 7, START + 3: 7}
    twin.record([START + 1], 9)
    assert START + 1 not in applied and applied != twin
    assert Applied(START, LENGTH) == Applied(START, LENGTH) == {}


def test_a_sample_outside_the_shard_or_a_seq_below_one_is_refused():
    applied = Applied(START, LENGTH)
    with pytest.raises(ValueError, match=r"not in shard \[100, 112\)"):
        applied.record([START + LENGTH], 3)
    with pytest.raises(ValueError, match="start at 1"):
        applied.record([START], 0)
    with pytest.raises(KeyError):
        applied[START]
    assert "x" not in applied and START - 1 not in applied
