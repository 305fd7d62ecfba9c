"""Which punctuations end a paced piece (``Query.release_grid``): the window ends, and every
punctuation of the source when an operator downstream waits on each one (a user operator such as
``KeyedCount``, a count window, a sorted input, an ordered application); a paced replay then sends
the row that raises one at its own time, so a result never waits for the rest of its piece
(issue #42: the keyed count's steady maximum was two punctuation intervals, not one)."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query
from replistream.operators.keyed import KeyedCount
from replistream.sources import paced_pieces, release_rule


def _grid(build, every=20):
    q = Query("g")
    s = q.source("s", {"k": "i8"}, punctuate_every=every)
    build(q, s)
    return q.build().release_grid("s")


def test_the_release_grid_by_what_waits_downstream():
    assert _grid(lambda q, s: s.filter(lambda b: b["k"] > 0).sink("a")) is None  # nothing waits
    assert _grid(lambda q, s: s.window(size=100).sink("a")) == 100  # finer punctuations release nothing
    assert _grid(lambda q, s: s.window(size=100, slide=30).sink("a")) == 10
    assert _grid(lambda q, s: s.apply(KeyedCount(by="k")).sink("a")) == 20
    assert _grid(lambda q, s: s.map(lambda b: b).apply(KeyedCount(by="k")).sink("a"), every=30) == 30
    assert _grid(lambda q, s: (s.window(size=100).sink("a"), s.apply(KeyedCount(by="k")).sink("b"))) == 20
    assert _grid(lambda q, s: (s.window(size=50).sink("a"), s.apply(KeyedCount(by="k")).sink("b")), every=20) == 10
    assert _grid(lambda q, s: s.count_window(size=5).sink("a")) == 20
    assert _grid(lambda q, s: s.sink("a", ordered=True)) == 20
    assert _grid(lambda q, s: s.apply(KeyedCount(by="k")).sink("a"), every=None) is None  # none declared


def test_a_paced_piece_ends_at_the_row_that_releases_a_keyed_count_once_per_span():
    q = Query("g")
    s = q.source("s", {"k": "i8"}, punctuate_every=20)
    s.apply(KeyedCount(by="k")).sink("a")
    grid = q.build().release_grid("s")
    chunks = [{"ts": np.arange(t, t + 20, 4), "k": np.zeros(5, dtype=np.int64)} for t in range(0, 60, 20)]
    pieces = [p["ts"].tolist() for p in paced_pieces(iter(chunks), 20, release_rule(grid, min_gap=20))]
    # each chunk's first row raises the punctuation to the end of the chunk before: it leaves alone,
    # at its own time, instead of with the rest of its chunk
    assert pieces == [[0], [4, 8, 12, 16], [20], [24, 28, 32, 36], [40], [44, 48, 52, 56]]
    assert [p["ts"].tolist() for p in paced_pieces(iter(chunks), 20, None)] == [c["ts"].tolist() for c in chunks]
    # a span of 40 (k=2 entry replicas): a punctuation ends a piece once per 40, never more often
    one = [{"ts": np.arange(0, 120, 4), "k": np.zeros(30, dtype=np.int64)}]
    pieces = [p["ts"].tolist() for p in paced_pieces(iter(one), 40, release_rule(grid, min_gap=40))]
    assert [p[-1] for p in pieces] == [0, 40, 80, 116] and all(p[-1] - p[0] <= 40 for p in pieces)


def test_release_rule_refuses_a_bad_grid():
    with pytest.raises(ValueError, match="grid must be > 0"):
        release_rule(0)
