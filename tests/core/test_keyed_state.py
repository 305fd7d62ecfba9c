"""KeyedState, the keyed operators' live store: rows appended in arrival order, found through sorted
runs of (hash, row). Checked against a plain dict model through random upserts, removals,
bin replacements, bins given away (dead rows, then deleted) and snapshots (seeded hypothesis), and for the bound on its runs that keeps a
growing state from paying its whole size per batch."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replistream.operators.base import bin_of
from replistream.operators import keyed
from replistream.operators.keyed import KeyedState

PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None)

OPS = st.lists(st.tuples(st.sampled_from(["upsert", "upsert", "upsert", "remove", "replace", "snapshot", "lookup",
                                          "drop", "drop"]),
                         st.lists(st.integers(0, 60), min_size=0, max_size=25), st.integers(0, 4)),
               min_size=1, max_size=40)


def _check_index(state: KeyedState) -> None:
    """The index's invariants: in hash order, the storage is the index (no run); else every live
    row has exactly one entry (hash -> row) in the runs, and no entry points at a dead row."""
    n = state._n
    if state._ordered:
        assert state._runs == [] and np.all(state.hash[1:] > state.hash[:-1])
        return
    dead = state._dead[:n] if state._n_dead else np.zeros(n, dtype=bool)
    rows = np.concatenate([r for _, r in state._runs]) if state._runs else np.zeros(0, np.int64)
    hs = np.concatenate([h for h, _ in state._runs]) if state._runs else np.zeros(0, np.uint64)
    valid = rows >= 0
    assert (rows[valid] < n).all() and not dead[rows[valid]].any()
    assert np.array_equal(state.hash[rows[valid]], hs[valid])
    assert np.array_equal(np.bincount(rows[valid], minlength=n), (~dead).astype(np.int64))
    assert int(np.count_nonzero(~valid)) == state._unlinked
    holes = np.concatenate(state._holes) if state._holes else np.zeros(0, np.int64)
    assert len(holes) == len(np.unique(holes)) == state._n_dead and dead[holes].all()  # the free slots


def _h(keys) -> np.ndarray:
    # spread small keys over the whole 64-bit range, so every bin count sees several bins
    return (np.asarray(sorted(set(keys)), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)


@PROPS
@given(ops=OPS, bits=st.integers(0, 4))
def test_keyed_state_behaves_as_a_dict_of_rows(ops, bits):
    _behaves_as_a_dict(ops, bits)


@PROPS
@given(ops=OPS, bits=st.integers(0, 4))
def test_keyed_state_behaves_as_a_dict_of_rows_while_merges_go_in_slices(ops, bits):
    """The same with merges of more than 4 entries going on in slices of 2 entries per run
    (lookups, removals, bins given away and snapshots meet a merge half done)."""
    old = keyed.MERGE_AT_ONCE, keyed.MERGE_STEP
    keyed.MERGE_AT_ONCE, keyed.MERGE_STEP = 4, 2
    try:
        _behaves_as_a_dict(ops, bits)
    finally:
        keyed.MERGE_AT_ONCE, keyed.MERGE_STEP = old


def _behaves_as_a_dict(ops, bits):
    state, model = KeyedState({"n": "i8", "tag": "S3"}, bits=bits), {}
    for i, (op, keys, b) in enumerate(ops):
        h = _h(keys)
        if op == "upsert":
            rows = state.upsert(h, {"tag": np.array([b"t%d" % (x % 10) for x in range(len(h))], dtype="S3")})
            for j, x in enumerate(h.tolist()):
                model.setdefault(x, [0, b"t%d" % (j % 10)])
                model[x][0] += i
            state.cols["n"][rows] += i
        elif op == "remove":
            rows = state.locate(h)
            state.remove(rows[rows >= 0])
            for x in h.tolist():
                model.pop(x, None)
        elif op == "replace":  # bin b (of 2**bits) holds exactly these keys afterwards
            b = b % (1 << bits)
            mine = h[bin_of(h, bits) == b]
            state.replace_bins([b], mine, {"n": np.full(len(mine), 7), "tag": np.full(len(mine), b"r", dtype="S3")})
            for x in [x for x in model if int(bin_of(np.array([x], dtype=np.uint64), bits)[0]) == b]:
                del model[x]
            for x in mine.tolist():
                model[x] = [7, b"r"]
        elif op == "drop":  # a rescale's step gives bins away (at some bin count): dead rows, then deleted
            sb = int(b)
            gone = sorted({int(x) % (1 << sb) for x in keys})
            want = [x for x in model if int(bin_of(np.array([x], dtype=np.uint64), sb)[0]) in gone]
            assert state.drop_bins(gone, sb) == len(want)
            for x in want:
                del model[x]
            # what is left, dead rows or not: found by no lookup, in no snapshot of some bins
            assert (state.locate(np.asarray(want, dtype=np.uint64)) < 0).all()
            every = list(range(1 << sb))
            assert state.snapshot(every, sb)[0].tolist() == sorted(model)
        elif op == "lookup":
            rows = state.locate(h)
            assert [r >= 0 for r in rows.tolist()] == [x in model for x in h.tolist()]
            assert state.cols["n"][rows[rows >= 0]].tolist() == [model[x][0] for x in h.tolist() if x in model]
        else:  # a snapshot of some bins, at some bin count: sorted, offsets per bin, the model's rows
            sb = int(b)
            chosen = sorted({int(x) % (1 << sb) for x in keys}) if keys else None
            got_h, cols, off = state.snapshot(chosen, sb)
            want = sorted(x for x in model if chosen is None or
                          int(bin_of(np.array([x], dtype=np.uint64), sb)[0]) in chosen)
            assert got_h.tolist() == want
            assert cols["n"].tolist() == [model[x][0] for x in want]
            assert cols["tag"].tolist() == [model[x][1] for x in want]
            assert len(off) == (1 << sb) + 1 and off[-1] == len(want)
            assert np.array_equal(np.diff(off), np.bincount(bin_of(got_h, sb), minlength=1 << sb))
        assert len(state) == len(model)
        _check_index(state)
        if state._ordered:  # what the slices of an ordered snapshot rely on; the storage is the index
            assert np.all(state.hash[1:] > state.hash[:-1]) and state._runs == []
    live = state.hash if not state._n_dead else state.hash[~state._dead[:state._n]]
    assert sorted(live.tolist()) == sorted(model)
    assert state.snapshot()[0].tolist() == sorted(model) and state._n_dead == 0


def test_a_growing_state_keeps_few_runs_and_a_full_snapshot_puts_it_in_order():
    """Each batch of new keys is appended and indexed as a run; runs merge as the logarithmic
    method merges them, so there are never more than log2(n) + 1 of them (a batch's lookups
    cost that many binary searches, its insertion its own keys, not the state's size)."""
    rng = np.random.default_rng(3)
    state = KeyedState({"n": "i8"}, bits=8)
    keys = rng.permutation(2**20).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    most = 0
    for i in range(0, 200_000, 1000):
        state.upsert(keys[i:i + 1000])
        most = max(most, len(state._runs))
    assert len(state) == 200_000 and most <= int(np.log2(200)) + 1
    h, cols, off = state.snapshot()
    assert np.all(h[1:] > h[:-1]) and state._runs == []  # the storage is its own index now
    assert np.array_equal(state.hash, h)  # the storage itself is in hash order now: bins are slices
    rows = state.locate(keys[:1000])
    assert np.array_equal(state.hash[rows], keys[:1000])
    # a receiver's steps in bin order append above every row: the storage stays in hash order
    fresh = KeyedState({"n": "i8"}, bits=8)
    for b in range(256):
        fresh.replace_bins([], h[off[b]:off[b + 1]], {"n": cols["n"][off[b]:off[b + 1]]})
    assert fresh._ordered and np.array_equal(fresh.hash, h)
    assert fresh._runs == []  # and its own index: no run merged at any step (a pause at 4M keys)
    assert np.array_equal(fresh.locate(keys[:1000]), state.locate(keys[:1000]))


def test_updates_never_copy_the_whole_state_once_it_stops_growing():
    """Issue #42: the storage was put in hash order by the first update after the state stopped
    growing, a copy of every row in the data path (0.37 s at a million keys of 112 bytes: the
    largest spike of ``bench/steady.py`` with no fault and no move). Updates now touch their own
    rows only: the columns stay the same arrays however many lookups follow; a full snapshot
    still orders them, and snapshots of bins are the same either way."""
    rng = np.random.default_rng(5)
    state = KeyedState({"n": "i8"}, bits=8)
    keys = rng.permutation(2**18).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for i in range(0, 50_000, 1000):
        state.upsert(keys[i:i + 1000])
    columns, hashes = state._cols["n"], state._hash
    for _ in range(40):  # lookups of far more than a 16th of the rows, no new key
        rows = state.upsert(rng.choice(keys[:50_000], 2000, replace=False))
        state.cols["n"][rows] += 1
    assert state._cols["n"] is columns and state._hash is hashes, "an update copied every row"
    some = [3, 77, 200]
    h_bins, c_bins, _ = state.snapshot(some)
    h_all, c_all, off = state.snapshot()  # orders the storage
    assert state._ordered and np.all(state.hash[1:] > state.hash[:-1])
    pick = np.concatenate([np.arange(off[b], off[b + 1]) for b in some])
    assert np.array_equal(h_bins, h_all[pick]) and np.array_equal(c_bins["n"], c_all["n"][pick])
    assert int(c_all["n"].sum()) == 40 * 2000


def test_installing_bins_the_state_does_not_hold_reads_none_of_its_rows(monkeypatch):
    """A transfer's receiver installs each step into a state that holds none of the step's bins:
    ``replace_bins`` looked up the bin of every row it held first (``bin_of`` over the whole
    state, per step), a cost in the receiver's size for each of up to 4,096 steps. Now the index
    says whether any row lies in those bins; rows are read only when some do, and the result is
    the same."""
    import replistream.operators.keyed as keyed

    rng = np.random.default_rng(9)
    keys = rng.permutation(2**16).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    state = KeyedState({"n": "i8"}, bits=8)
    held = bin_of(keys[:500], 8)
    free = np.setdiff1d(np.arange(256), held)[:3]
    state.upsert(keys[:500])
    passes = []
    real = keyed.bin_of
    monkeypatch.setattr(keyed, "bin_of", lambda h, b: (passes.append(len(h)), real(h, b))[1])
    assert len(free) and not state._holds_any(free, 8)
    incoming = keys[500:][np.isin(bin_of(keys[500:], 8), free)][:50]
    state.replace_bins(free, incoming, {"n": np.ones(len(incoming), dtype=np.int64)}, bits=8)
    assert len(state) == 500 + len(incoming) and len(incoming)
    assert max(passes, default=0) < len(state) - len(incoming), passes  # no pass over the rows it held
    # bins it holds: their rows are replaced, as before
    some = np.unique(held)[:2]
    mine = keys[:500][np.isin(held, some)]
    passes.clear()
    state.replace_bins(some, mine[:1], {"n": np.full(1, 7, dtype=np.int64)}, bits=8)
    assert max(passes) >= 500  # (it looked at the rows: some were in those bins)
    assert len(state) == 500 + len(incoming) - len(mine) + 1
    assert int(state.cols["n"][state.locate(mine[:1])[0]]) == 7 and (state.locate(mine[1:]) == -1).all()


def test_a_key_of_a_bin_given_away_comes_back_as_a_new_row_never_the_dead_one():
    """A step of a rescale gives bin 1 away: its rows stay as dead rows (free slots). Should a key
    of it ever be upserted again (a later rescale gives the bin back through ``replace_bins``,
    which deletes them first; anything else is not expected), it gets a fresh row (maybe a free
    slot), never the dead row's count."""
    state = KeyedState({"n": "i8"}, bits=1)
    h = _h(range(1, 30))
    first = state.upsert(h)
    state.cols["n"][first] = 5
    back = h[bin_of(h, 1) == 1][:3]
    assert state.drop_bins([1], 1) > 0 and state._n_dead > 0
    _check_index(state)
    rows = state.upsert(back)
    assert state.cols["n"][rows].tolist() == [0, 0, 0]
    assert len(state) == int((bin_of(h, 1) == 0).sum()) + 3
    state.cols["n"][rows] = 9
    assert state.snapshot([1], 1)[1]["n"].tolist() == [9, 9, 9]


def test_a_giving_state_never_copies_every_row_and_new_keys_take_the_free_slots(monkeypatch):
    """A fluid rescale's giver (bench/state_move.py): bins dropped one by one while new keys of the
    bins it keeps arrive. Nothing copies every live row (it did once a quarter of the rows were
    dead: 27 and 22 ms in process at 4M keys); the dead rows' index entries are cleared at once
    and new keys take their slots before the storage grows; every key keeps its value."""
    rng = np.random.default_rng(11)
    state = KeyedState({"n": "i8"}, bits=12)
    ints = rng.permutation(np.unique(rng.integers(1, 2**62, 23_000)))
    keys, fresh = (x.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) for x in (ints[:20_000], ints[20_000:]))
    model, by_bin = {}, {}

    def add(hs, values):
        model.update(zip(hs.tolist(), values))
        for x, b in zip(hs.tolist(), bin_of(hs, 12).tolist()):
            by_bin.setdefault(b, []).append(x)

    for a in range(0, len(keys), 2_000):  # loaded in batches, in no hash order: runs index it
        rows = state.upsert(keys[a:a + 2_000])
        state.cols["n"][rows] = np.arange(a, a + len(rows))
        add(keys[a:a + 2_000], range(a, a + len(rows)))
    assert not state._ordered
    n0 = state._n
    monkeypatch.setattr(state, "_keep", lambda keep: pytest.fail("a copy of every live row"))
    gone: list[int] = []
    for i, b in enumerate(range(4095, 4095 - 1500, -1)):  # 1,500 of 4,096 bins, one a step
        want = by_bin.pop(b, [])
        assert state.drop_bins([b]) == len(want)
        gone.append(b)
        for x in want:
            del model[x]
        new = fresh[2 * i:2 * i + 2]
        new = new[~np.isin(bin_of(new, 12), gone)]
        if len(new):
            rows = state.upsert(new)
            state.cols["n"][rows] = -i
            add(new, [-i] * len(new))
        if i % 100 == 0:
            _check_index(state)
            probe = np.asarray(list(model), dtype=np.uint64)
            assert state.cols["n"][state.locate(probe)].tolist() == list(model.values())
    _check_index(state)
    assert len(state) == len(model) and state._n == n0  # (the new keys took free slots)
    probe = np.asarray(list(model), dtype=np.uint64)
    assert state.cols["n"][state.locate(probe)].tolist() == list(model.values())
    h, cols, _ = state.snapshot(range(4096))
    assert h.tolist() == sorted(model)
    monkeypatch.undo()
    assert state.snapshot()[0].tolist() == sorted(model) and state._n == len(model)  # (a full one deletes them)


def test_a_large_index_merge_goes_in_slices_one_per_lookup(monkeypatch):
    """Issue #42: merging the index's runs into one was one step in the data path (a 4M-key
    count paused 50-156 ms for it, with no fault and no move). Past MERGE_AT_ONCE entries it goes
    in slices: each lookup while it lasts merges at most MERGE_STEP entries of each run, the
    lookups find every key meanwhile, and the index ends as one run."""
    monkeypatch.setattr(keyed, "MERGE_AT_ONCE", 1 << 12)
    monkeypatch.setattr(keyed, "MERGE_STEP", 1 << 10)
    rng = np.random.default_rng(21)
    keys = rng.permutation(1 << 16).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    state = KeyedState({"n": "i8"}, bits=6)
    state.upsert(keys[:40_000])
    state.cols["n"][state.locate(keys[:40_000])] = np.arange(40_000)
    state.upsert(keys[40_000:60_000])  # (a run half the size of the first: merged in slices)
    assert state._merge is not None
    sizes = []
    real = keyed._Merge.views

    def views(m):
        sizes.append(m.k)
        return real(m)
    monkeypatch.setattr(keyed._Merge, "views", views)
    steps = 0
    while state._merge is not None:
        probe = keys[rng.integers(0, 60_000, 500)]
        rows = state.locate(probe)
        assert (rows >= 0).all() and np.array_equal(state.hash[rows], probe)
        steps += 1
        assert steps < 1000
    assert steps >= 60_000 // (2 * (1 << 10)) and max(np.diff([0] + sizes)) <= 2 * (1 << 10)
    assert len(state._runs) == 1 and np.all(state._runs[0][0][1:] > state._runs[0][0][:-1])
    assert np.array_equal(state.cols["n"][state.locate(keys[:40_000])], np.arange(40_000))
    # negative control: at once when the runs are small enough
    monkeypatch.setattr(keyed, "MERGE_AT_ONCE", 1 << 20)
    small = KeyedState({"n": "i8"}, bits=6)
    small.upsert(keys[:40_000])
    small.upsert(keys[40_000:60_000])
    assert small._merge is None and len(small._runs) == 1
