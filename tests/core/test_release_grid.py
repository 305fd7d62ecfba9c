"""Which punctuations end a paced piece (``Query.release_grid``): the window ends, and every
punctuation of the source when an operator downstream waits on each one (a user operator such as
``KeyedCount``, a count window, a sorted input, an ordered application); a paced replay then sends
the row that raises one at its own time, so a result never waits for the rest of its piece
(issue #42: the keyed count's steady maximum was two punctuation intervals, not one)."""
from __future__ import annotations

import numpy as np

from replistream import Query
from replistream.operators.keyed import KeyedCount
from replistream.sources import paced_pieces, window_close_rule


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


def test_a_paced_piece_ends_at_the_row_that_releases_a_keyed_count():
    q = Query("g")
    s = q.source("s", {"k": "i8"}, punctuate_every=20)
    s.apply(KeyedCount(by="k")).sink("a")
    rule = window_close_rule(q.build().release_grid("s"))
    chunks = [{"ts": np.arange(t, t + 20, 4), "k": np.zeros(5, dtype=np.int64)} for t in range(0, 60, 20)]
    pieces = [p["ts"].tolist() for p in paced_pieces(iter(chunks), 1_000, rule)]
    # each chunk's first row raises the punctuation to the end of the chunk before: it leaves alone,
    # at its own time, instead of with the rest of its chunk (1,000 us of span would hold them all)
    assert pieces == [[0], [4, 8, 12, 16], [20], [24, 28, 32, 36], [40], [44, 48, 52, 56]]
    assert [p["ts"].tolist() for p in paced_pieces(iter(chunks), 1_000, None)] == [c["ts"].tolist() for c in chunks]
