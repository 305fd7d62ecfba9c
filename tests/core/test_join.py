"""Windowed join, Algorithm 2 (Hwang §IV-E), against a brute-force nested-loop join."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream.errors import SchemaError, UserFunctionError
from replistream.ids import mix
from replistream.operators.join import JoinLogic, join_schema
from replistream.schema import END, Punctuation, Schema

PROPS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])

L = Schema({"k": "i8", "s": "U3", "m": "i2", "a": "f8"})
R = Schema({"k": "i8", "s": "U3", "m": "i8", "b": "i8"})


def make(schema, rng, n, t_max, id_base):
    ts = sorted(rng.randrange(0, t_max) for _ in range(n))
    cols = {"ts": ts, "k": [rng.randrange(0, 4) for _ in range(n)],
            "s": [rng.choice(["x", "yy", "zzz"]) for _ in range(n)], "m": [rng.randrange(0, 2) for _ in range(n)]}
    if "a" in schema:
        cols["a"] = [rng.choice([0.5, -1.25, 3.0, 1e10]) for _ in range(n)]
    else:
        cols["b"] = [rng.randrange(-5, 5) for _ in range(n)]
    if n == 0:
        return schema.empty()
    return schema.from_columns(cols, ids=[id_base + i for i in range(n)])


def brute(left, right, window, lkey, rkey, pred, out_schema, lmap, rmap):
    rows = []
    for i in range(len(left)):
        for k in range(len(right)):
            l, r = left[i], right[k]
            if abs(int(l["ts"]) - int(r["ts"])) >= window:
                continue
            if lkey and any(l[a] != r[b] for a, b in zip(lkey, rkey)):
                continue
            if pred is not None and not pred(left[i:i + 1], right[k:k + 1])[0]:
                continue
            out = np.zeros(1, dtype=out_schema.dtype)
            out["ts"] = max(l["ts"], r["ts"])
            out["id"] = mix(np.uint64(l["id"]), np.uint64(r["id"]))
            for n, o in lmap:
                out[o] = l[n]
            for n, o in rmap:
                out[o] = r[n]
            rows.append(out)
    return np.concatenate(rows) if rows else out_schema.empty()


def as_rows(batches, schema):
    b = [x for x in batches if not isinstance(x, Punctuation)]
    arr = np.concatenate(b) if b else schema.empty()
    return sorted(arr.tolist())


def side_items(batch, rng, max_disorder):
    """One input stream: the tuples shuffled within max_disorder, split into chunks, with valid punctuations."""
    n = len(batch)
    order = sorted(range(n), key=lambda i: int(batch["ts"][i]) + rng.uniform(0, max_disorder))
    items, i = [], 0
    while i < n:
        m = rng.randint(1, 5)
        items.append(batch[order[i:i + m]])
        i += m
        rest = batch["ts"][order[i:]]
        if len(rest) and rng.random() < 0.5:
            items.append(Punctuation(int(rest.min()) - 1))
    items.append(Punctuation(END))
    return items


def run_join(j, left_items, right_items, rng, check_buffers=None):
    queues = [list(left_items), list(right_items)]
    out = []
    delivered = ([], [])
    while queues[0] or queues[1]:
        port = rng.choice([p for p in (0, 1) if queues[p]])
        item = queues[port].pop(0)
        if not isinstance(item, Punctuation):
            delivered[port].extend(item["ts"].tolist())
        out.extend(j.process(port, item))
        if check_buffers:
            check_buffers(j, delivered)
    return out


def buffers_are_purged(j, delivered):
    for side in (0, 1):
        p = j.in_punct[1 - side]
        if p == np.iinfo(np.int64).min:
            want = len(delivered[side])
        else:
            want = sum(t > p + 1 - j.window for t in delivered[side])
        assert j.buffered[side] == want


CASES = {
    "no key": dict(left_key=None, right_key=None, predicate=None),
    "int key": dict(left_key="k", right_key="k", predicate=None),
    "string key": dict(left_key="s", right_key="s", predicate=None),
    "two int keys": dict(left_key=("k", "m"), right_key=("k", "m"), predicate=None),
    "predicate": dict(left_key=None, right_key=None, predicate=lambda l, r: l["a"] > r["b"]),
    "key and predicate": dict(left_key="k", right_key="k", predicate=lambda l, r: l["s"] != r["s"]),
}


@PROPS
@given(st.sampled_from(sorted(CASES)), st.integers(0, 2**32), st.integers(0, 25), st.integers(0, 25),
       st.integers(1, 30), st.integers(0, 10))
def test_join_matches_nested_loop(case, seed, nl, nr, window, disorder):
    rng = random.Random(seed)
    kw = CASES[case]
    left, right = make(L, rng, nl, 60, 1000), make(R, rng, nr, 60, 5000)
    j = JoinLogic("j", [L, R], window=window, **kw)
    _, lmap, rmap = join_schema(L, R)
    lkey = (kw["left_key"],) if isinstance(kw["left_key"], str) else kw["left_key"]
    rkey = (kw["right_key"],) if isinstance(kw["right_key"], str) else kw["right_key"]
    want = brute(left, right, window, lkey, rkey, kw["predicate"], j.out_schema, lmap, rmap)
    out = run_join(j, side_items(left, rng, disorder), side_items(right, rng, disorder), rng, buffers_are_purged)
    assert as_rows(out, j.out_schema) == sorted(want.tolist())
    assert j.buffered == (0, 0)
    assert out[-1] == Punctuation(END)
    assert j.late_count == 0


@PROPS
@given(st.integers(0, 2**32), st.integers(1, 20))
def test_join_interleavings_give_same_multiset(seed, window):
    rng = random.Random(seed)
    left, right = make(L, rng, 20, 40, 1), make(R, rng, 20, 40, 100)
    results = []
    for trial in range(3):
        r2 = random.Random(seed * 7 + trial)
        j = JoinLogic("j", [L, R], window=window, left_key="k", right_key="k")
        out = run_join(j, side_items(left, r2, 8), side_items(right, r2, 8), r2)
        results.append(as_rows(out, j.out_schema))
    assert results[0] == results[1] == results[2]


def test_output_ts_is_max_and_id_is_mixed():
    j = JoinLogic("j", [L, R], window=10, left_key="k", right_key="k")
    assert j.process(0, L.from_columns({"ts": [100], "k": [1], "s": ["a"], "m": [0], "a": [0.5]}, ids=[1])) == []
    (out,) = j.process(1, R.from_columns({"ts": [93, 105, 110], "k": [1, 1, 1], "s": ["b", "c", "d"],
                                          "m": [0, 0, 0], "b": [7, 8, 9]}, ids=[2, 3, 4]))
    assert out["ts"].tolist() == [100, 105]  # |100 - 110| == window: no match
    assert out["id"].tolist() == [int(mix(np.uint64(1), np.uint64(2))), int(mix(np.uint64(1), np.uint64(3)))]
    assert out.dtype.names == ("ts", "id", "k_l", "s_l", "m_l", "a", "k_r", "s_r", "m_r", "b")
    assert out[["s_l", "s_r", "b"]].tolist() == [("a", "b", 7), ("a", "c", 8)]
    # left tuple arriving later matches buffered right tuples, output ts still max
    (out,) = j.process(0, L.from_columns({"ts": [104], "k": [1], "s": ["e"], "m": [0], "a": [1.0]}, ids=[5]))
    assert sorted(out["ts"].tolist()) == [105, 110]


def test_punctuation_purges_other_buffer():
    A = Schema({"x": "i8"})
    j = JoinLogic("j", [A, A], window=5)
    j.process(0, A.from_columns({"ts": [1, 5, 6, 10], "x": [0] * 4}, ids=[1, 2, 3, 4]))
    j.process(1, A.from_columns({"ts": [20], "x": [0]}, ids=[9]))
    assert j.buffered == (4, 1)
    # no future right tuple has ts <= 9, so left tuples with ts <= 9 + 1 - 5 = 5 can never match
    j.process(1, Punctuation(9))
    assert j.buffered == (2, 1)
    j.process(0, Punctuation(14))  # purges right tuples with ts <= 10
    assert j.buffered == (2, 1)
    j.process(0, Punctuation(24))  # purges right tuples with ts <= 20
    assert j.buffered == (2, 0)
    j.process(0, A.from_columns({"ts": [30], "x": [0]}, ids=[5]))
    assert j.buffered == (3, 0)
    j.process(1, Punctuation(40))  # purges left tuples with ts <= 36
    assert j.buffered == (0, 0)


def test_a_window_loaded_at_once_is_not_copied_at_every_punctuation():
    """A chunk of the window (here 100,000 tuples with ts 0..99,999, loaded in one batch) expires
    lazily: punctuations one unit apart copy it only when half of its remaining time span has
    expired, about log2(span) times instead of once per punctuation, while what the Join holds
    and gives out (``buffered``, checkpoints) is exactly what an eager purge would leave, and its
    output is the same."""
    A = Schema({"x": "i8"})
    j = JoinLogic("j", [A, A], window=1000)
    n = 100_000
    j.process(0, A.from_columns({"ts": np.arange(n), "x": np.arange(n) % 50}, ids=np.arange(n)))  # no key: a band join
    buf = j.buffers[0]
    copies, last = 0, buf.chunks[0]
    for p in range(1000, n + 1000, 97):
        j.process(1, Punctuation(p))
        if buf.chunks and buf.chunks[0] is not last:
            copies, last = copies + 1, buf.chunks[0]
        assert j.buffered[0] == int(np.sum(np.arange(n) > p + 1 - 1000))
        if p % 9991 == 0:  # a checkpoint holds exactly the live rows
            rows = j.checkpoint().tables["left"]["rows"]
            assert sorted(rows["ts"].tolist()) == list(range(p + 2 - 1000, n))
    assert copies <= 20, copies
    # a probe after the purges (above the last punctuation) joins the live rows in its window
    ts = p + 1
    out = j.process(1, A.from_columns({"ts": [ts], "x": [7]}, ids=[10**6]))
    got = np.concatenate(out)
    assert len(got) == sum(1 for t in range(n) if abs(t - ts) < 1000) == 88 and set(got["ts"].tolist()) == {ts}


def test_tuple_that_can_no_longer_match_is_not_buffered():
    A = Schema({"x": "i8"})
    j = JoinLogic("j", [A, A], window=5)
    j.process(1, Punctuation(9))  # future right tuples have ts >= 10: left ts <= 5 cannot match
    j.process(0, A.from_columns({"ts": [3, 5, 6], "x": [0] * 3}, ids=[1, 2, 3]))
    assert j.buffered == (1, 0)
    out = j.process(1, A.from_columns({"ts": [10], "x": [0]}, ids=[4]))
    assert [b["ts"].tolist() for b in out] == [[10]]


def test_join_end_punctuation_with_window_one():
    A = Schema({"x": "i8"})
    j = JoinLogic("j", [A, A], window=1)
    j.process(0, A.from_columns({"ts": [5], "x": [0]}, ids=[1]))
    assert j.process(1, Punctuation(END)) == []
    assert j.buffered == (0, 0)
    # port 0 made no promise: a new left tuple is accepted, matches nothing and is not buffered
    assert j.process(0, A.from_columns({"ts": [6], "x": [0]}, ids=[2])) == []
    assert j.late_count == 0 and j.buffered == (0, 0)


def test_join_validation():
    with pytest.raises(ValueError, match="window"):
        JoinLogic("j", [L, R], window=0)
    with pytest.raises(ValueError, match="exactly 2"):
        JoinLogic("j", [L], window=3)
    with pytest.raises(ValueError, match="left_key and right_key"):
        JoinLogic("j", [L, R], window=3, left_key="k")
    with pytest.raises(SchemaError, match="right key 'nope'"):
        JoinLogic("j", [L, R], window=3, left_key="k", right_key="nope")


def test_join_bad_predicate_names_join():
    j = JoinLogic("pairs", [L, R], window=10, predicate=lambda l, r: l["a"])
    j.process(0, L.from_columns({"ts": [1], "k": [1], "s": ["a"], "m": [0], "a": [0.5]}, ids=[1]))
    with pytest.raises(UserFunctionError, match="operator 'pairs': join predicate"):
        j.process(1, R.from_columns({"ts": [2], "k": [1], "s": ["a"], "m": [0], "b": [1]}, ids=[2]))


def test_join_nan_keys_never_match_and_signed_zero_keys_do():
    A = Schema({"f": "f8"})
    j = JoinLogic("j", [A, A], window=10, left_key="f", right_key="f")
    j.process(0, A.from_columns({"ts": [1, 1], "f": [np.nan, -0.0]}, ids=[1, 2]))
    out = j.process(1, A.from_columns({"ts": [2, 2], "f": [np.nan, 0.0]}, ids=[3, 4]))
    rows = as_rows(out, j.out_schema)
    assert len(rows) == 1 and rows[0][0] == 2


def test_multi_key_with_a_string_field():
    j = JoinLogic("j", [L, R], window=10, left_key=("k", "s"), right_key=("k", "s"))
    j.process(0, L.from_columns({"ts": [1, 1], "k": [1, 1], "s": ["ab", "c"], "m": [0, 0], "a": [0.5, 1.5]},
                                ids=[1, 2]))
    out = j.process(1, R.from_columns({"ts": [2], "k": [1], "s": ["ab"], "m": [0], "b": [3]}, ids=[3]))
    rows = as_rows(out, j.out_schema)
    assert [r[1] for r in rows] == [int(mix(np.uint64(1), np.uint64(3)))]


def test_multi_key_with_string_fields_of_different_widths():
    A = Schema({"s": "U2", "n": "i8"})
    B = Schema({"s": "U6", "n": "i8"})
    j = JoinLogic("j", [A, B], window=10, left_key=("s", "n"), right_key=("s", "n"))
    j.process(0, A.from_columns({"ts": [1], "s": ["xy"], "n": [1]}, ids=[1]))
    out = j.process(1, B.from_columns({"ts": [2], "s": ["xy"], "n": [1]}, ids=[2]))
    assert len(as_rows(out, j.out_schema)) == 1


def test_single_string_key_of_different_widths_matches():
    A = Schema({"s": "U2"})
    B = Schema({"s": "U6"})
    j = JoinLogic("j", [A, B], window=10, left_key="s", right_key="s")
    j.process(0, A.from_columns({"ts": [1], "s": ["xy"]}, ids=[1]))
    out = j.process(1, B.from_columns({"ts": [2], "s": ["xy"]}, ids=[2]))
    assert len(as_rows(out, j.out_schema)) == 1


def test_a_probe_gives_one_batch_whatever_the_chunks_it_meets():
    # the right buffer holds two chunks (the second less than half the first: not merged); a left
    # tuple matching rows of both comes out as one batch, the first chunk's pairs first
    S = Schema({"k": "i8"})
    j = JoinLogic("j", [S, S], window=100, left_key="k", right_key="k")
    j.process(1, S.from_columns({"ts": [10, 11, 12, 13], "k": [1, 1, 1, 2]}, ids=[1, 2, 3, 4]))
    j.process(1, S.from_columns({"ts": [20], "k": [1]}, ids=[5]))
    assert len(j.buffers[1].chunks) == 2
    out = j.process(0, S.from_columns({"ts": [30], "k": [1]}, ids=[9]))
    assert len(out) == 1
    assert out[0]["ts"].tolist() == [30] * 4
    assert out[0]["id"].tolist() == mix(np.uint64(9), np.array([1, 2, 3, 5], dtype=np.uint64)).tolist()


def test_concat_rows_is_numpys_concatenate():
    from replistream.operators.join import concat_rows

    a = np.array([(1, 2.5, "x")], dtype=[("ts", "i8"), ("v", "f8"), ("s", "U2")])
    assert concat_rows([a, a[:0], a]).tolist() == np.concatenate([a, a]).tolist()
    wide = a.astype([("ts", "i8"), ("v", "f8"), ("s", "U4")])  # another dtype: numpy's own casts
    assert concat_rows([a, wide]).dtype == np.concatenate([a, wide]).dtype
    o = np.array([(1, {"k": 1})], dtype=[("ts", "i8"), ("o", "O")])  # Python objects: never as raw bytes
    got = concat_rows([o, o])
    assert got["o"][1] is o["o"][0]


def test_a_probe_copies_what_it_matches_not_the_buffered_columns():
    """A few pairs from a large buffered chunk gather only their rows: ``ndarray.take`` on a field
    of a structured array copies the whole column first (17.6 MB for 200,000 88-byte tags, per
    probe), indexing does not. Measured as memory allocated during the probe (tracemalloc sees
    numpy's buffers), not time."""
    import tracemalloc

    L, R = Schema({"k": "i8", "tag": "S88"}), Schema({"k": "i8"})
    j = JoinLogic("j", [L, R], window=10**9, left_key="k", right_key="k")
    n = 200_000
    j.process(0, L.from_columns({"ts": np.arange(n), "k": np.arange(n), "tag": np.full(n, b"x" * 88)},
                                ids=np.arange(n)))
    j.process(1, R.from_columns({"ts": [n], "k": [3]}, ids=[n]))  # (builds the chunk's probe index, once)
    probe = R.from_columns({"ts": [n, n + 1], "k": [7, 99_999]}, ids=[n + 1, n + 2])
    tracemalloc.start()
    try:
        out = j.process(1, probe)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sorted(out[0]["k_l"].tolist()) == [7, 99_999]
    assert peak < 1_000_000, f"the probe allocated {peak:,} bytes for 2 pairs"


def test_a_transfer_step_copies_its_bins_rows_not_a_chunk_that_straddles_the_window():
    """A step of a transfer asks the Join's buffer for the rows of a few bins. A buffered chunk whose
    oldest rows have left the window (the bound lies inside it, purged lazily) was copied whole to
    drop them before its bins were selected: 200,000 rows of 88-byte tags per step. The bins' rows
    are now selected first: the same rows, in the same order, and the step allocates under 1 MB."""
    import tracemalloc

    from replistream.operators.base import concat_ranges
    from replistream.operators.keyed import bin_ranges

    L, R = Schema({"k": "i8", "tag": "S88"}), Schema({"k": "i8"})
    j = JoinLogic("j", [L, R], window=1_000, left_key="k", right_key="k")
    n = 200_000
    j.process(0, L.from_columns({"ts": np.arange(n), "k": np.arange(n) % 50_000, "tag": np.full(n, b"x" * 88)},
                                ids=np.arange(n)))
    for port in (0, 1):
        j.process(port, Punctuation(n // 2))
    buf = j.buffers[0]
    assert any(t <= buf.bound for t in buf.tmin) and len(buf) < n  # a chunk straddles the bound
    bins = np.array([5, 77, 4_000])
    want_rows, want_keys = [], []  # the old way: every chunk without its expired rows, then the bins
    for c, k in buf.live():
        idx = concat_ranges(*bin_ranges(k, 12, bins))
        want_rows.append(c[idx])
        want_keys.append(k[idx])
    tracemalloc.start()
    try:
        rows, keys = buf.rows_in_bins(12, bins)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) > 0 and (rows["ts"] > buf.bound).all()
    assert rows.tolist() == np.concatenate(want_rows).tolist()
    assert keys.tolist() == np.concatenate(want_keys).tolist()
    assert peak < 1_000_000, f"a step of 3 bins allocated {peak:,} bytes"
