"""Keyed state in bins (issue #8 item 1; Megaphone §3.4, Del Monte 2017): per-bin snapshot, restore and
incremental delta round-trips, as seeded (derandomized) hypothesis properties."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream import Punctuation, Schema
from replistream.operators.base import NO_PUNCTUATION as NO_PUNCT, OperatorState, bin_of
from replistream.schema import END
from replistream.operators.keyed import KeyedCountLogic, KeyedState

PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
SCHEMA = Schema({"k": "i8", "v": "i8"})


def batches(seed: int, n: int, keys: int, start: int = 0):
    """Batches of 1-30 tuples, each followed by a punctuation leaving a few tuples above it."""
    rng = np.random.default_rng(seed)
    out, t, i = [], start, 0
    while i < n:
        m = int(rng.integers(1, 30))
        ts = t + np.sort(rng.integers(0, 20, m))
        out.append(SCHEMA.from_columns({"ts": ts, "k": rng.integers(0, keys, m), "v": rng.integers(0, 99, m)},
                                       ids=np.arange(start * 1000 + i, start * 1000 + i + m)))
        i += m
        t += 10
        out.append(Punctuation(t - 5))
    return out


def feed(op, items):
    out = []
    for it in items:
        out.extend(x for x in op.process(0, it) if not isinstance(x, Punctuation))
    return np.concatenate(out) if out else op.out_schema.empty()


def same_state(a: OperatorState, b: OperatorState) -> bool:
    if (a.in_punct, a.watermark, a.bits) != (b.in_punct, b.watermark, b.bits):
        return False
    for t in a.tables:
        if not np.array_equal(a.offsets[t], b.offsets[t]):
            return False
        for c in a.tables[t]:
            if not np.array_equal(a.tables[t][c], b.tables[t][c]):
                return False
    return True


@PROPS
@given(seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 300), bits=st.integers(0, 8),
       store_bits=st.integers(0, 12), parts=st.integers(1, 6))
def test_bins_partitioned_at_random_merge_back_to_the_whole_state(seed, keys, bits, store_bits, parts):
    op = KeyedCountLogic("c", [SCHEMA], by="k", keep=("v",), bits=store_bits, every=3)
    feed(op, batches(seed, 200, keys))
    whole = op.checkpoint(bits)
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, parts, 1 << bits)
    pieces = [op.checkpoint(bits, np.flatnonzero(owner == p)) for p in range(parts)]
    # each piece holds exactly the rows of its bins, sorted by key hash
    for p, piece in enumerate(pieces):
        h = piece.tables["state"]["hash"]
        assert np.all(np.isin(bin_of(h, bits), np.flatnonzero(owner == p)))
        assert np.all(h[1:] >= h[:-1])
    merged = OperatorState.merge(pieces[::-1])
    assert same_state(merged, whole)
    assert same_state(whole.select(range(1 << bits)), whole)


@PROPS
@given(seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 200), bits=st.integers(0, 6), cut=st.integers(0, 150))
def test_a_restored_count_continues_exactly_like_the_original(seed, keys, bits, cut):
    items = batches(seed, 250, keys)
    cut = min(cut, len(items))
    a = KeyedCountLogic("c", [SCHEMA], by="k", keep=("v",), bits=bits)
    feed(a, items[:cut])
    rng = np.random.default_rng(seed)
    order = rng.permutation(1 << bits)
    halves = [a.checkpoint(bits, order[: len(order) // 2]), a.checkpoint(bits, order[len(order) // 2:])]
    b = KeyedCountLogic("c", [SCHEMA], by="k", keep=("v",), bits=bits).restore(OperatorState.merge(halves))
    assert np.array_equal(feed(a, items[cut:]), feed(b, items[cut:]))


@PROPS
@given(seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 400), bits=st.integers(0, 10),
       first=st.integers(0, 120), second=st.integers(0, 120))
def test_incremental_deltas_bring_a_dormant_copy_up_to_date(seed, keys, bits, first, second):
    """Del Monte: a copy restored at version v, given the delta since v (only the bins changed since),
    equals the active replica, and continues like it."""
    items = batches(seed, 400, keys)
    first = min(first, len(items))
    second = min(first + second, len(items))
    a = KeyedCountLogic("c", [SCHEMA], by="k", bits=bits)
    feed(a, items[:first])
    copy = KeyedCountLogic("c", [SCHEMA], by="k", bits=bits).restore(a.checkpoint(bits))
    v = a.version()
    feed(a, items[first:second])
    delta, changed = a.delta(v)
    assert set(changed.tolist()) == set(np.flatnonzero(a.state.versions > v).tolist())
    # the delta ships only changed bins
    assert delta.rows("state") <= len(a.state)
    if second == first:
        assert len(changed) == 0
    copy.apply_delta(delta, changed)
    assert same_state(copy.checkpoint(bits), a.checkpoint(bits))
    assert np.array_equal(feed(a, items[second:]), feed(copy, items[second:]))


@PROPS
@given(hashes=st.lists(st.integers(0, 2**64 - 1), min_size=0, max_size=200, unique=True),
       bits=st.integers(0, 12), snap_bits=st.integers(0, 12), chosen=st.lists(st.integers(0, 4095), max_size=20))
def test_keyed_state_snapshot_holds_exactly_the_chosen_bins(hashes, bits, snap_bits, chosen):
    st_ = KeyedState({"n": "i8"}, bits)
    h = np.array(hashes, dtype=np.uint64)
    rows = st_.upsert(h)
    st_.cols["n"][rows] = np.arange(len(h))
    st_.touch(h)
    bins = [c % (1 << snap_bits) for c in chosen]
    got_h, cols, off = st_.snapshot(bins, snap_bits)
    want = np.sort(h[np.isin(bin_of(h, snap_bits), bins)])
    assert np.array_equal(got_h, want)
    assert off[-1] == len(want) and len(off) == (1 << snap_bits) + 1
    assert np.array_equal(st_.cols["n"][st_.locate(got_h)], cols["n"])
    if len(h):
        assert set(st_.changed_since(0).tolist()) == set(bin_of(h, bits).tolist())


@PROPS
@given(seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 300), bits=st.integers(0, 10),
       cuts=st.lists(st.integers(0, 80), min_size=1, max_size=4))
def test_a_dormant_replica_revived_from_its_last_delta_continues_like_the_active_one(seed, keys, bits, cuts):
    """Del Monte: full checkpoint, then refreshes by deltas, then revival from one last delta (its filter
    state and changed bins): the revived replica and the active one emit the same from then on."""
    from replistream import Query
    from replistream.replica import DormantReplica, ReplicaCore
    from replistream.operators.keyed import KeyedCount

    q = Query()
    q.source("s", SCHEMA).apply(KeyedCount(by="k", keep=("v",), bits=bits), name="c").sink("out")
    q = q.build()
    items = batches(seed, 300, keys)
    live = ReplicaCore(q, "c", channels=[1], retain=True)
    pos = 0

    def advance(n):
        nonlocal pos
        for it in items[pos:pos + n]:
            live.process(0, 0, it)
        pos = min(len(items), pos + n)

    advance(cuts[0])
    dormant = DormantReplica(q, live.checkpoint(bits), live.logic.version())
    for c in cuts[1:-1]:
        advance(c)
        dormant.refresh(*live.delta_checkpoint(dormant.version))
    advance(cuts[-1] if len(cuts) > 1 else 0)
    ck, changed, v = live.delta_checkpoint(dormant.version)
    revived = dormant.revive(ck, changed, v, channels=[1])
    rest = items[max(0, pos - 4):]  # a replay overlapping what the checkpoint already reflects
    a = [x for it in rest for x in live.process(0, 0, it) if not isinstance(x, Punctuation)]
    b = [x for it in rest for x in revived.process(0, 0, it) if not isinstance(x, Punctuation)]
    cat = lambda xs: np.concatenate(xs) if xs else SCHEMA.empty()[:0]
    assert np.array_equal(cat(a), cat(b))


@PROPS
@given(seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 50), every=st.integers(1, 7))
def test_the_vectorised_count_equals_one_update_per_epoch(seed, keys, every):
    class PerEpoch(KeyedCountLogic):
        def update_epochs(self, state, rows, batch, epoch):
            return KeyedCountLogic.__mro__[1].update_epochs(self, state, rows, batch, epoch)

    items = batches(seed, 200, keys)
    a = KeyedCountLogic("c", [SCHEMA], by="k", keep=("v",), bits=3, every=every)
    b = PerEpoch("c", [SCHEMA], by="k", keep=("v",), bits=3, every=every)
    x, y = feed(a, items), feed(b, items)
    key = lambda arr: sorted(map(tuple, arr.tolist()))
    assert key(x) == key(y) and len(x) > 0


@PROPS
@given(seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 20), every=st.integers(1, 7))
def test_a_keyed_operator_never_emits_below_a_punctuation_it_forwarded(seed, keys, every):
    """With epochs of ``every`` > 1 units, an epoch completes only when the watermark reaches its
    end, so the punctuation forwarded is the end of the last complete epoch, not the watermark:
    an output of the open epoch comes later and must not be below what was promised."""
    op = KeyedCountLogic("c", [SCHEMA], by="k", keep=("v",), bits=3, every=every)
    promised, outputs = NO_PUNCT, 0
    for item in batches(seed, 200, keys):
        for out in op.process(0, item):
            if isinstance(out, Punctuation):
                assert out.p > promised
                promised = out.p
            else:
                assert (out["ts"] > promised).all(), (out["ts"].min(), promised, every)
                outputs += len(out)
    for out in op.process(0, Punctuation(END)):
        if not isinstance(out, Punctuation):
            assert (out["ts"] > promised).all()
            outputs += len(out)
    assert outputs > 0
