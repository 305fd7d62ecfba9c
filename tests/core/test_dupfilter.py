"""Duplicate filter, Algorithm 1 (Hwang §IV-B)."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream.errors import PunctuationViolation, SchemaError
from replistream.operators.dupfilter import DuplicateFilter
from replistream.schema import Punctuation, Schema

S = Schema({"x": "i8"})
PROPS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


def batch(ts, ids, x=None):
    if not len(ids):
        return S.empty()
    return S.from_columns({"ts": ts, "x": list(ids) if x is None else x}, ids=ids)


def ids_of(out):
    return [i for b in out if not isinstance(b, Punctuation) for i in b["id"].tolist()]


def test_first_copy_passes_later_copies_dropped():
    f = DuplicateFilter(3, S)
    b = batch([1, 2, 3], [10, 11, 12])
    out = f.on_batch(1, b)
    assert len(out) == 1 and out[0].tobytes() == b.tobytes()
    assert f.on_batch(0, b) == []
    assert f.on_batch(2, b) == []
    assert f.stats()["passed"] == 3 and f.stats()["duplicates"] == 6


def test_partial_overlap_passes_only_new_ids():
    f = DuplicateFilter(2, S)
    f.on_batch(0, batch([1, 2], [10, 11]))
    out = f.on_batch(1, batch([2, 1, 5], [11, 10, 13]))
    assert ids_of(out) == [13]
    out = f.on_batch(0, batch([5, 6], [13, 14]))
    assert ids_of(out) == [14]


def test_same_values_different_ids_are_different_tuples():
    f = DuplicateFilter(1, S)
    out = f.on_batch(0, S.from_columns({"ts": [1, 1], "x": [5, 5]}, ids=[1, 2]))
    assert ids_of(out) == [1, 2]


def test_late_copy_after_max_punctuation_is_a_duplicate():
    f = DuplicateFilter(2, S)
    f.on_batch(0, batch([5, 9], [1, 2]))
    assert f.on_punctuation(0, 9) == [Punctuation(9)]
    # the slow replica delivers its copies after the fast replica's punctuation
    assert f.on_batch(1, batch([5, 9], [1, 2])) == []
    st_ = f.stats()
    assert st_["duplicates"] == 2 and st_["late"] == 0 and f.dead_letters == []
    # a tuple above the punctuation from the slow replica still passes
    assert ids_of(f.on_batch(1, batch([10], [3]))) == [3]


@pytest.mark.parametrize("ts", [7, 8])
def test_tuple_at_or_below_own_channel_punctuation_is_dead_lettered(ts):
    f = DuplicateFilter(2, S, name="df")
    f.on_punctuation(0, 8)
    out = f.on_batch(0, batch([ts, 20], [1, 2]))
    assert ids_of(out) == [2]
    assert f.late_count == 1 and f.stats()["late"] == 1
    (dl,) = f.dead_letters
    assert dl.count == 1 and dl.batch["id"].tolist() == [1]
    assert "df channel 0" in dl.where and "late" in dl.reason


def test_own_channel_violation_raises_in_strict_mode():
    f = DuplicateFilter(2, S, name="df", strict=True)
    f.on_punctuation(1, 8)
    with pytest.raises(PunctuationViolation, match="df channel 1.*ts=8.*8"):
        f.on_batch(1, batch([8], [1]))
    # another channel has made no promise: ts 8 passes there
    assert ids_of(f.on_batch(0, batch([9], [2]))) == [2]


def test_other_channel_behind_max_punctuation_is_not_a_violation_in_strict_mode():
    f = DuplicateFilter(2, S, strict=True)
    f.on_punctuation(0, 8)
    assert f.on_batch(1, batch([3], [1])) == []  # a late duplicate, not an error
    assert f.late_count == 0


def test_same_channel_retransmission_dropped():
    f = DuplicateFilter(2, S)
    b = batch([1, 2], [10, 11])
    assert ids_of(f.on_batch(0, b)) == [10, 11]
    assert f.on_batch(0, b) == []  # re-sent on the same replica (reconnection replay)
    assert f.on_batch(1, b) == []
    assert f.on_batch(1, b) == []


def test_within_batch_repeat():
    f = DuplicateFilter(1, S)
    out = f.on_batch(0, batch([1, 2, 1, 3, 2], [10, 11, 10, 12, 11]))
    assert ids_of(out) == [10, 11, 12]
    assert f.stats()["duplicates"] == 2
    assert f.weights.tolist() == [1 + 1 + 0.5 + 1 + 0.5]


def test_state_forgotten_after_punctuation():
    f = DuplicateFilter(2, S)
    f.on_batch(0, batch([1, 5, 10, 15], [1, 2, 3, 4]))
    assert f.stats()["tracked_ids"] == 4
    f.on_punctuation(1, 5)
    assert f.stats()["tracked_ids"] == 2
    f.on_punctuation(0, 14)
    assert f.stats()["tracked_ids"] == 1
    f.on_punctuation(0, 20)
    assert f.stats()["tracked_ids"] == 0
    # forgotten ids below the punctuation still never pass again
    assert f.on_batch(1, batch([1, 15], [1, 4])) == []


def test_weights_by_arrival_rank():
    f = DuplicateFilter(3, S)
    b = batch([1], [7])
    f.on_batch(2, b)
    f.on_batch(0, b)
    f.on_batch(1, b)
    assert f.weights.tolist() == [1 / 2, 1 / 3, 1.0]
    c = batch([2, 3], [8, 9])
    f.on_batch(1, c)
    f.on_batch(0, c)
    assert f.weights.tolist() == [1 / 2 + 2 * (1 / 2), 1 / 3 + 2.0, 1.0]
    assert f.copies.tolist() == [3, 3, 1]


def test_weights_ignore_copies_behind_max_punctuation():
    f = DuplicateFilter(2, S)
    f.on_batch(0, batch([1], [7]))
    f.on_punctuation(0, 5)
    f.on_batch(1, batch([1], [7]))
    assert f.weights.tolist() == [1.0, 0.0]


def test_punctuation_forwarded_only_when_new_maximum():
    f = DuplicateFilter(2, S)
    assert f.on_punctuation(0, 5) == [Punctuation(5)]
    assert f.on_punctuation(1, 3) == []
    assert f.on_punctuation(1, 5) == []
    assert f.on_punctuation(0, 5) == []
    assert f.on_punctuation(1, 9) == [Punctuation(9)]
    assert f.process(0, Punctuation(12)) == [Punctuation(12)]
    assert f.stats()["max_punctuation"] == 12


def test_lower_punctuation_still_raises_own_channel_bar():
    f = DuplicateFilter(2, S)
    f.on_punctuation(0, 10)
    assert f.on_punctuation(1, 4) == []
    f.on_batch(1, batch([4], [1]))
    assert f.late_count == 1  # channel 1 promised nothing at or below 4


def test_add_channel():
    f = DuplicateFilter(1, S)
    b = batch([5], [1])
    f.on_batch(0, b)
    c = f.add_channel()
    assert c == 1 and f.n_channels == 2
    assert f.weights.tolist() == [1.0, 0.0]
    assert f.on_batch(c, b) == []
    assert ids_of(f.on_batch(c, batch([6], [2]))) == [2]
    assert f.weights.tolist() == [1.0, 1.5]
    assert f.on_punctuation(c, 6) == [Punctuation(6)]
    f.on_batch(c, batch([6], [3]))
    assert f.late_count == 1


def test_schema_checked_and_constructor_validates():
    f = DuplicateFilter(1, S, name="df")
    bad = np.zeros(1, dtype=[("ts", "i8"), ("id", "u8")])
    with pytest.raises(SchemaError, match="df channel 0.*'x'"):
        f.on_batch(0, bad)
    with pytest.raises(ValueError, match="at least one"):
        DuplicateFilter(0, S)


def test_empty_batch():
    f = DuplicateFilter(1, S)
    assert f.on_batch(0, S.empty()) == []


@PROPS
@given(st.integers(0, 2**32), st.integers(1, 4), st.integers(0, 40))
def test_theorem_1_each_tuple_exactly_once(seed, k, n):
    """k replicas of one stream, each split, re-sent and punctuated differently, interleaved at random:
    the filter passes every tuple exactly once and forwards increasing punctuations."""
    rng = random.Random(seed)
    ts = sorted(rng.randrange(0, 100) for _ in range(n))
    ids = rng.sample(range(1, 10**9), n)
    stream = batch(ts, ids)
    replicas = []
    for _ in range(k):
        # a replica: the same tuples, shuffled within disorder 5, with punctuations it may send
        order = sorted(range(n), key=lambda i: ts[i] + rng.uniform(-5, 5))
        items, i = [], 0
        while i < n:
            m = rng.randint(1, 6)
            chunk = stream[order[i:i + m]]
            items.append(chunk)
            if rng.random() < 0.2:
                items.append(chunk)  # retransmission
            i += m
            rest = stream[order[i:]]
            if len(rest) and rng.random() < 0.4:
                p = int(rest["ts"].min()) - 1
                items.append(Punctuation(p))
        items.append(Punctuation(1000))
        replicas.append(items)
    f = DuplicateFilter(k, S)
    cursors = [0] * k
    out, puncts = [], []
    while any(c < len(r) for c, r in zip(cursors, replicas)):
        ch = rng.choice([i for i in range(k) if cursors[i] < len(replicas[i])])
        item = replicas[ch][cursors[ch]]
        cursors[ch] += 1
        for o in f.process(ch, item):
            (puncts if isinstance(o, Punctuation) else out).append(o)
    got = Counter(ids_of(out))
    assert got == Counter(ids)
    assert [p.p for p in puncts] == sorted({p.p for p in puncts})
    assert f.late_count == 0
    assert f.stats()["tracked_ids"] == 0
    assert f.stats()["passed"] == n
    assert f.weights.sum() >= n - 1e-9  # every first copy contributes 1


# -- the bulk path (on_rows): the batched simulator's ----------------------------------------------

def _replica_packets(rng, stream, ts, n):
    """One stream replica: the tuples shuffled within disorder 5, in packets of 1-6, some
    re-sent, each packet followed by a punctuation its replica may send (NO: none)."""
    order = sorted(range(n), key=lambda i: ts[i] + rng.uniform(-5, 5))
    packets, i = [], 0
    while i < n:
        m = rng.randint(1, 6)
        chunk = stream[order[i:i + m]]
        i += m
        if rng.random() < 0.2:
            packets.append((chunk, None))  # a retransmission
        rest = stream[order[i:]]
        p = int(rest["ts"].min()) - 1 if len(rest) else 1000
        packets.append((chunk, p if (not len(rest) or rng.random() < 0.4) else None))
    return packets


def _by_rounds(f, rows, chan, before):
    """What the batched simulator did before on_rows existed: late copies counted by hand, then
    round j (the j-th copy of every id) through on_batch one channel at a time."""
    ts = rows["ts"]
    late = ts <= np.maximum(before, f.max_punct)
    for c in np.unique(chan[late]).tolist():
        f.copies[c] += int((late & (chan == c)).sum())
    f.duplicates += int(late.sum())
    kk = np.flatnonzero(~late)
    ids = rows["id"][kk]
    o = np.argsort(ids, kind="stable")
    s = ids[o]
    start = np.r_[True, s[1:] != s[:-1]] if len(s) else np.zeros(0, bool)
    rank = np.empty(len(ids), dtype=np.int64)
    rank[o] = np.arange(len(s)) - np.maximum.accumulate(np.where(start, np.arange(len(s)), 0))
    passed = np.zeros(len(rows), dtype=bool)
    for j in range(int(rank.max()) + 1 if len(rank) else 0):
        rj = np.flatnonzero(rank == j)
        cj = chan[kk][rj]
        for c in np.unique(cj).tolist():
            sel = rj[cj == c]
            out = f.on_batch(c, rows[kk[sel]])
            if j == 0 and out:
                passed[kk[sel][np.isin(ids[sel], out[0]["id"])]] = True
    return passed


@PROPS
@given(st.integers(0, 2**32), st.integers(1, 4), st.integers(1, 40))
def test_bulk_rows_equal_rounds_and_packet_by_packet(seed, k, n):
    """on_rows over many packets gives the passed copies, counters and state of on_batch packet by
    packet (punctuations in between), and weights bit-identical to the per-round on_batch calls."""
    import copy

    rng = random.Random(seed)
    ts = sorted(rng.randrange(0, 100) for _ in range(n))
    stream = batch(ts, rng.sample(range(1, 10**9), n))
    arrivals = []  # (channel, rows, punctuation) in arrival order
    queues = [_replica_packets(rng, stream, ts, n) for _ in range(k)]
    while any(queues):
        ch = rng.choice([i for i in range(k) if queues[i]])
        rows, p = queues[ch].pop(0)
        arrivals.append((ch, rows, p))
    cut = rng.randrange(len(arrivals))  # packets before the cut reach the filter one by one first
    f = DuplicateFilter(k, S)
    for ch, rows, p in arrivals[:cut]:
        f.on_batch(ch, rows)
        if p is not None:
            f.on_punctuation(ch, p)
    bulk, rounds, single = f, copy.deepcopy(f), copy.deepcopy(f)
    rest = arrivals[cut:]
    # one packet after another, punctuations in between
    single_ids = []
    for ch, rows, p in rest:
        single_ids += ids_of(single.on_batch(ch, rows))
        if p is not None:
            single.on_punctuation(ch, p)
    # all at once: the punctuation in force before each packet
    pun = np.array([-2**63 if p is None else p for _, _, p in rest], dtype=np.int64)
    run = np.maximum.accumulate(np.maximum(pun, f.max_punct))
    before_pk = np.r_[f.max_punct, run[:-1]]
    sizes = [len(r) for _, r, _ in rest]
    rows = np.concatenate([r for _, r, _ in rest])
    chan = np.repeat([c for c, _, _ in rest], sizes)
    before = np.repeat(before_pk, sizes)
    got = bulk.on_rows(rows, chan, before)
    want = _by_rounds(rounds, rows, chan, before)
    assert got.tolist() == want.tolist()
    assert sorted(rows["id"][got].tolist()) == sorted(single_ids)
    for g in (bulk, rounds):
        best = {}
        for c, _, p in rest:
            if p is not None:
                best[c] = max(best.get(c, p), p)
        for c, p in sorted(best.items(), key=lambda x: (x[1], x[0])):
            g.on_punctuation(c, p)
    assert bulk.weights.tolist() == rounds.weights.tolist()  # bit for bit
    assert np.allclose(bulk.weights, single.weights, rtol=1e-12, atol=0)
    for other in (rounds, single):
        assert bulk.copies.tolist() == other.copies.tolist()
        assert (bulk.passed, bulk.duplicates, bulk.late_count) == (other.passed, other.duplicates, other.late_count)
        assert (bulk.max_punct, bulk.seen) == (other.max_punct, other.seen)
        a, b = bulk.checkpoint(), other.checkpoint()
        assert sorted(zip(a.applied_ts.tolist(), a.applied_ids.tolist())) == \
            sorted(zip(b.applied_ts.tolist(), b.applied_ids.tolist()))


def test_bulk_rows_dead_letter_a_broken_contract_and_check_channels():
    f = DuplicateFilter(2, S)
    f.on_punctuation(1, 5)
    rows = batch([4, 6, 3], [1, 2, 3])
    assert f.on_rows(rows, [0, 1, 1]).tolist() == [False, True, False]
    assert f.late_count == 1 and f.dead_letters[0].batch["id"].tolist() == [3]
    assert f.duplicates == 1  # ts 4 <= 5 from channel 0: a late copy, not a violation
    with pytest.raises(ValueError, match="2 stream replica"):
        f.on_rows(rows, [0, 2, 1])
    strict = DuplicateFilter(2, S, strict=True)
    strict.on_punctuation(1, 5)
    with pytest.raises(PunctuationViolation, match="channel 1"):
        strict.on_rows(rows, [0, 1, 1])
    order = np.array([2, 0])  # copies rows[2], rows[0] in that arrival order
    g = DuplicateFilter(2, S)
    assert g.on_rows(rows, [1, 0], order=order).tolist() == [True, True]


def test_id_counts_agree_with_a_dictionary():
    """The vectorised id bookkeeping (sorted runs, merged as they grow) against a plain dict, over
    random batches of new and known ids and punctuations that forget ids in bulk."""
    from replistream.operators.dupfilter import IdCounts

    rng = np.random.default_rng(11)
    c, ref, ts_of = IdCounts(), {}, {}
    pool = rng.integers(0, 2**64 - 1, 5_000, dtype=np.uint64)
    for step in range(300):
        ids = np.unique(rng.choice(pool, rng.integers(1, 200)))
        prev, where = c.lookup(ids)
        assert prev.tolist() == [ref.get(i, 0) for i in ids.tolist()]
        add = rng.integers(1, 4, len(ids))
        c.bump(where, add)
        miss = prev == 0
        ts = rng.integers(step, step + 50, len(ids))
        c.insert(ids[miss], add[miss], ts[miss])
        for i, a, t, m in zip(ids.tolist(), add.tolist(), ts.tolist(), miss.tolist()):
            ref[i] = ref.get(i, 0) + a
            if m:
                ts_of[i] = t
        if step % 17 == 0:
            p = step - 5
            c.expire(p)
            ref = {i: n for i, n in ref.items() if ts_of[i] > p}
        assert c.as_dict() == ref and len(c) == len(ref)
    assert len(c._ids) <= 12  # runs stay few (each at least twice the next)
