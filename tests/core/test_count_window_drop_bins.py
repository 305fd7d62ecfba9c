"""A count window's aggregate's side of a rescale step (replistream/replica/rescale.py):
``drop_bins`` forgets the groups of the bins given away (their counts and pending tuples), and
nothing else; a group given away and taken back (a later rescale) counts on as if it had never
left: an index entry left behind for it would list it twice in a checkpoint."""
from __future__ import annotations

import numpy as np

from replistream.operators.aggregate import CountWindowAggregateLogic
from replistream.operators.base import bin_of
from replistream.schema import Punctuation, Schema

BITS = 3
S = Schema({"k": "i8", "v": "i8"})


def _agg():
    return CountWindowAggregateLogic("c", [S], size=3, slide=2, by="k", aggs={"s": ("v", "sum")})


def _rows(ts, k, id0):
    n = len(ts)
    return S.from_columns({"ts": ts, "k": k, "v": np.arange(id0, id0 + n)}, ids=np.arange(id0, id0 + n, dtype=np.uint64))


def _out(items):
    return sorted(tuple(r.tolist()) for o in items if isinstance(o, np.ndarray) for r in o)


def test_a_group_given_away_and_taken_back_counts_on_as_if_it_never_left():
    rng = np.random.default_rng(9)
    moved, stay = _agg(), _agg()
    first = _rows(np.arange(1, 201), rng.integers(0, 30, 200), 0)
    for c in (moved, stay):
        c.process(0, first)
        c.process(0, Punctuation(200))
    b = int(bin_of(moved.bin_keys(0, first), BITS)[0])
    state = moved.checkpoint(BITS, [b])
    groups = state.tables["groups"]["group"]
    assert len(groups) > 0
    assert moved.drop_bins(BITS, [b]) == len(groups)
    assert moved.checkpoint(BITS, [b]).rows() == 0
    others = [x for x in range(1 << BITS) if x != b]
    assert moved.checkpoint(BITS, others).rows() == stay.checkpoint(BITS, others).rows()
    moved.install_bins(state, [b])  # (taken back, as a later rescale would)
    back = moved.checkpoint(BITS, [b])
    assert sorted(back.tables["groups"]["group"].tolist()) == sorted(groups.tolist())  # each once
    more = _rows(np.arange(201, 401), rng.integers(0, 30, 200), 1000)
    got = moved.process(0, more) + moved.process(0, Punctuation(400))
    want = stay.process(0, more) + stay.process(0, Punctuation(400))
    assert _out(got) == _out(want)
    assert moved.checkpoint(BITS).rows() == stay.checkpoint(BITS).rows()
