"""Sorter (Hwang §IV-C): buffer, and on punctuation p release ts <= p in (ts, id) order."""
from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream.operators.sorter import SorterLogic, canonical_order
from replistream.schema import END, Punctuation, Schema

S = Schema({"x": "i8"})
PROPS = settings(max_examples=80, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


def batch(ts, ids):
    return S.from_columns({"ts": ts, "x": list(range(len(ts)))}, ids=ids)


def test_canonical_order_breaks_ties_by_id():
    b = batch([2, 1, 1, 2], [5, 9, 3, 1])
    assert canonical_order(b).tolist() == [2, 1, 3, 0]


def test_releases_up_to_punctuation_in_ts_id_order():
    so = SorterLogic("sort", [S])
    assert so.process(0, batch([5, 3, 9, 3], [1, 8, 3, 2])) == []
    assert so.process(0, batch([4, 12], [7, 6])) == []
    assert so.buffered == 6
    out = so.process(0, Punctuation(5))
    assert isinstance(out[-1], Punctuation) and out[-1] == Punctuation(5)
    rel = out[0]
    assert list(zip(rel["ts"].tolist(), rel["id"].tolist())) == [(3, 2), (3, 8), (4, 7), (5, 1)]
    assert so.buffered == 2
    out = so.process(0, Punctuation(9))
    assert list(zip(out[0]["ts"].tolist(), out[0]["id"].tolist())) == [(9, 3)]
    out = so.process(0, Punctuation(END))
    assert out[0]["ts"].tolist() == [12] and out[-1] == Punctuation(END)
    assert so.buffered == 0


def test_punctuation_with_nothing_ready_emits_only_punctuation():
    so = SorterLogic("sort", [S])
    so.process(0, batch([10], [1]))
    assert so.process(0, Punctuation(3)) == [Punctuation(3)]
    assert so.process(0, Punctuation(3)) == []  # repeated promise
    assert so.buffered == 1


def test_late_tuples_dead_lettered_not_sorted_in():
    so = SorterLogic("sort", [S])
    so.process(0, Punctuation(10))
    assert so.process(0, batch([10, 11], [1, 2])) == []
    assert so.late_count == 1 and so.buffered == 1
    assert so.dead_letters[0].batch["id"].tolist() == [1]


def test_rows_are_kept_whole():
    so = SorterLogic("sort", [S])
    b = S.from_columns({"ts": [3, 1, 2], "x": [30, 10, 20]}, ids=[1, 2, 3])
    so.process(0, b)
    out = so.process(0, Punctuation(3))[0]
    assert out.tolist() == [(1, 2, 10), (2, 3, 20), (3, 1, 30)]


@PROPS
@given(st.integers(0, 2**32), st.integers(0, 80))
def test_any_batching_gives_sorted_prefixes(seed, n):
    rng = random.Random(seed)
    ts = [rng.randrange(0, 50) for _ in range(n)]
    ids = rng.sample(range(1, 10**6), n)
    # deliver in random order, but respect punctuations: only punctuate below what is still to come
    order = list(range(n))
    rng.shuffle(order)
    so = SorterLogic("sort", [S])
    released = []
    i, last_p = 0, None
    while i < n:
        m = rng.randint(1, 7)
        idx = order[i:i + m]
        i += m
        out = so.process(0, batch([ts[j] for j in idx], [ids[j] for j in idx]))
        assert out == []
        rest = [ts[j] for j in order[i:]]
        if rest and rng.random() < 0.5:
            p = min(rest) - 1
            out = so.process(0, Punctuation(p))
            if last_p is None or p > last_p:
                assert out[-1] == Punctuation(p)
                last_p = p
            for b in out[:-1]:
                assert (b["ts"] <= p).all()
                released.append(b)
            # nothing with ts <= p is left behind
            delivered = [ts[j] for j in order[:i]]
            assert sum(len(b) for b in released) == sum(t <= (last_p if last_p is not None else p) for t in delivered)
            assert so.buffered == len(delivered) - sum(len(b) for b in released)
    out = so.process(0, Punctuation(END))
    released.extend(b for b in out if not isinstance(b, Punctuation))
    allrel = np.concatenate(released) if released else S.empty()
    pairs = list(zip(allrel["ts"].tolist(), allrel["id"].tolist()))
    assert pairs == sorted(zip(ts, ids))
