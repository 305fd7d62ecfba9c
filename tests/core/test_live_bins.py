"""Join and time-window Aggregate keep their state in live bins (issue #30 item 1; Megaphone §3.3-3.4).

Seeded (derandomized) hypothesis properties:

* a live-binned logic and its unbinned twin (the layout built at checkpoint time by one hash
  pass over the state) emit the same outputs, and their checkpoints, at any number of bins and
  for any subset of bins, hold the same rows bin by bin, each in the bin of its key's hash;
* a logic rebuilt from some bins with the rest installed into it while it runs
  (``install_bins``) holds the same state and emits the same outputs as the original;
* a staged transfer (all-at-once, batched, fluid) to a :class:`StagedReplica` whose parts merge
  by installing bins into a running logic gives the reference engine's output and dead letters.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream import Punctuation, Query
from replistream.errors import merge_dead_letters
from replistream.ids import hash_columns
from replistream.operators.base import CheckpointError, OperatorState, bin_of
from replistream.operators.keyed import KeyedCount
from replistream.replica import ReplicaCore, StagedReplica, plan_transfer, splittable
from replistream.schema import ID, TS
from replistream.sources import source_streams
from replistream.testing import assert_same_output, run_reference

PROPS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
KINDS = ("join", "join2", "sliding", "tumbling", "count")
WINDOW = 20


def _predicate(left, right):
    """A join predicate that raises on some rows (their pairs are dead-lettered)."""
    if (left["a"] % 23 == 7).any():
        raise ValueError("a is 7 mod 23")
    return (left["a"] + right["b"]) % 5 != 0


def build(kind: str) -> tuple[Query, str]:
    q = Query()
    if kind.startswith("join"):
        left = q.source("l", {"k": "i8", "a": "i8"})
        right = q.source("r", {"k": "i4", "b": "i8"})
        if kind == "join":
            left.join(right, window=WINDOW, on="k", name="op").sink("out")
        else:
            left.join(right, window=WINDOW, on="k", predicate=_predicate, name="op").sink("out")
    elif kind == "sliding":
        q.source("s", {"k": "i8", "x": "f8"}).window(
            size=30, slide=10, by="k", aggs={"n": "count", "m": ("x", "mean"), "hi": ("x", "max")}, name="op").sink("out")
    elif kind == "count":
        q.source("s", {"k": "i8", "x": "f8"}).count_window(size=4, slide=3, by="k", aggs={"s": ("x", "sum")},
                                                           name="op").sink("out")
    elif kind == "tumbling":
        q.source("s", {"k": "i8", "x": "f8"}).window(size=15, by="k", aggs={"s": ("x", "sum"), "lo": ("x", "min")},
                                                     name="op").sink("out")
    else:  # a keyed operator, whose state was live-binned before (KeyedState)
        q.source("s", {"k": "i8", "x": "f8"}).apply(KeyedCount(by="k", bits=3), name="op").sink("out")
    return q.build(), "op"


def records(kind: str, seed: int, n: int, keys: int) -> dict:
    """Per source, ``n`` records in ts order with punctuations between them."""
    rng = np.random.default_rng(seed)
    out = {}
    for src in (("l", "r") if kind.startswith("join") else ("s",)):
        ts = np.sort(rng.integers(0, 300, n))
        k = rng.integers(0, keys, n)
        recs: list = []
        for i in range(n):
            if i and ts[i] > ts[i - 1] and rng.random() < 0.3:
                recs.append(Punctuation(int(ts[i]) - 1))
            r = {"ts": int(ts[i]), "k": int(k[i])}
            if src == "l":
                r["a"] = int(rng.integers(0, 1000))
            elif src == "r":
                r["b"] = int(rng.integers(0, 1000))
            else:
                r["x"] = float(rng.normal(0, 1e3)) if rng.random() < 0.9 else float(rng.integers(-5, 5))
            recs.append(r)
        out[src] = recs
    return out


def items_of(q: Query, inputs: dict, rng) -> list[tuple[int, object]]:
    """The entry points' streams as (port, item): batches split at random, the ports interleaved
    at random (each port's own order kept)."""
    streams, _ = source_streams(q, inputs)
    ports = []
    for port, src in enumerate(q.inputs_of("op")):
        seq = []
        for it in streams[src]:
            if isinstance(it, np.ndarray):
                cuts = np.sort(rng.choice(np.arange(1, max(len(it), 2)), size=min(len(it) // 8, 40), replace=False)) \
                    if len(it) > 8 else []
                seq.extend((port, part) for part in np.split(it, cuts) if len(part))
            else:
                seq.append((port, it))
        ports.append(seq)
    out, pos = [], [0] * len(ports)
    while any(p < len(s) for p, s in zip(pos, ports)):
        live = [i for i, s in enumerate(ports) if pos[i] < len(s)]
        i = live[int(rng.integers(0, len(live)))]
        out.append(ports[i][pos[i]])
        pos[i] += 1
    return out


def unbinned(logic):
    """The same logic with its state binned only at checkpoint time (one hash pass over it)."""
    if hasattr(logic, "_hashed"):
        logic._hashed = False  # a Join searching by the raw key, as before live bins
    logic.live_bins = False
    return logic


def key_hash(t: str, cols: dict, logic) -> np.ndarray:
    """The key hash of each row of table ``t`` of a checkpoint, recomputed from the row."""
    if t in ("left", "right"):
        return hash_columns(cols["rows"], logic.keys[0 if t == "left" else 1])
    if "rows" in cols:  # a count window's unreleased input or pending tuples
        return hash_columns(cols["rows"], logic.by)
    if cols["group"].dtype == np.uint64:  # a count window's groups: their hashes
        return cols["group"]
    return hash_columns(cols["group"], logic.by)


def _pad(a: np.ndarray, w: int) -> np.ndarray:
    return np.pad(a, ((0, 0), (0, w - a.shape[1]))) if a.ndim == 2 and a.shape[1] < w else a


def same_bins(a: OperatorState, b: OperatorState, logic) -> None:
    """Bin by bin the same rows (in any order within a bin), every row in its key's bin."""
    assert (a.kind, a.params, tuple(a.in_punct), a.watermark, a.bits) == \
        (b.kind, b.params, tuple(b.in_punct), b.watermark, b.bits)
    assert sorted(a.tables) == sorted(b.tables)
    for t in a.tables:
        np.testing.assert_array_equal(a.offsets[t], b.offsets[t])
        ca, cb = a.tables[t], b.tables[t]
        assert sorted(ca) == sorted(cb)
        n = int(a.offsets[t][-1])
        if not n:
            continue
        bins = np.repeat(np.arange(a.n_bins), np.diff(a.offsets[t]))
        if a.bits:
            np.testing.assert_array_equal(bin_of(key_hash(t, ca, logic), a.bits), bins)
        ident = (lambda c: c["rows"][ID]) if "rows" in ca else (lambda c: c["key"]) if "key" in ca else \
            (lambda c: c["group"])
        oa, ob = np.lexsort((ident(ca), bins)), np.lexsort((ident(cb), bins))
        for c in ca:
            x, y = ca[c][oa], cb[c][ob]
            w = max(x.shape[1], y.shape[1]) if x.ndim == 2 else 0
            np.testing.assert_array_equal(_pad(x, w), _pad(y, w), err_msg=f"table {t!r} column {c!r}")


def by_id(batches: list) -> np.ndarray:
    rows = np.concatenate(batches)
    return rows[np.argsort(rows[ID], kind="stable")]


@PROPS
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 200),
       bits=st.lists(st.integers(0, 10), min_size=1, max_size=3))
def test_live_bins_checkpoint_bin_by_bin_as_the_unbinned_logic(kind, seed, keys, bits):
    q, node = build(kind)
    rng = np.random.default_rng(seed)
    items = items_of(q, records(kind, seed, 150, keys), rng)
    live, twin = q.build_logic(node), unbinned(q.build_logic(node))
    assert live.live_bins and not twin.live_bins
    checks = set(rng.integers(0, len(items), 4).tolist())
    for i, (port, it) in enumerate(items):
        a, b = live.process(port, it), twin.process(port, it)
        ta = [x for x in a if isinstance(x, np.ndarray)]
        tb = [x for x in b if isinstance(x, np.ndarray)]
        assert [x for x in a if isinstance(x, Punctuation)] == [x for x in b if isinstance(x, Punctuation)]
        if ta or tb:
            np.testing.assert_array_equal(by_id(ta or [twin.out_schema.empty()]), by_id(tb or [twin.out_schema.empty()]))
        if i in checks:
            for bb in bits:
                same_bins(live.checkpoint(bb), twin.checkpoint(bb), live)
                some = rng.choice(1 << bb, size=int(rng.integers(0, (1 << bb) + 1)), replace=False).tolist()
                same_bins(live.checkpoint(bb, some), twin.checkpoint(bb, some), live)
                same_bins(live.checkpoint(bb, some), live.checkpoint(bb).select(some), live)


@PROPS
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 200),
       bits=st.integers(0, 8), parts=st.integers(2, 6))
def test_bins_installed_into_a_running_logic_give_the_original_state_and_outputs(kind, seed, keys, bits, parts):
    q, node = build(kind)
    rng = np.random.default_rng(seed)
    items = items_of(q, records(kind, seed, 150, keys), rng)
    cut = int(rng.integers(0, len(items)))
    orig = q.build_logic(node)
    for port, it in items[:cut]:
        orig.process(port, it)
    whole = orig.checkpoint(bits)
    owner = rng.integers(0, parts, 1 << bits)
    chosen = [np.flatnonzero(owner == p) for p in range(parts)]
    moved = q.build_logic(node).restore(whole.select(chosen[0]))
    for p in range(1, parts):
        moved.install_bins(orig.checkpoint(bits, chosen[p]), chosen[p])
    same_bins(moved.checkpoint(bits), whole, orig)
    for port, it in items[cut:]:
        a, b = orig.process(port, it), moved.process(port, it)
        ta = [x for x in a if isinstance(x, np.ndarray)]
        tb = [x for x in b if isinstance(x, np.ndarray)]
        assert [x for x in a if isinstance(x, Punctuation)] == [x for x in b if isinstance(x, Punctuation)]
        if ta or tb:
            np.testing.assert_array_equal(by_id(ta or [orig.out_schema.empty()]), by_id(tb or [orig.out_schema.empty()]))


def transfer(q: Query, node: str, items: list, bits: int, strategy: str, rng) -> tuple[np.ndarray, StagedReplica, list]:
    """A live peer runs the input; a new replica fed the same input (from the start, as a replay)
    receives the state in steps the peer takes at its punctuations, one per punctuation. Returns
    the new replica's output (its adopted log and what it emitted after), deduplicated by id as
    a downstream duplicate filter would, the StagedReplica, and its dead letters."""
    nports = len(q.in_schemas(node))
    peer = ReplicaCore(q, node, channels=[1] * nports, retain=True)
    new = StagedReplica(q, node, channels=[1] * nports, bits=bits)
    steps = list(plan_transfer(strategy, bits, int(rng.integers(1, 4)), splittable(q, node)))
    later: list = []
    i = j = 0
    head = int(rng.integers(0, len(items) // 2 + 1))  # the peer runs alone for a while first
    while i < len(items) or j < len(items):
        if i < len(items) and (j >= len(items) or i < head or rng.random() < 0.5):
            out = peer.process(items[i][0], 0, items[i][1])
            i += 1
            if steps and (any(isinstance(x, Punctuation) for x in out) or i == len(items)):
                for bins in (steps if i == len(items) else steps[:1]):
                    new.install_step(peer.checkpoint(bits, bins), bins)
                steps = [] if i == len(items) else steps[1:]
        else:
            later.extend(new.process(items[j][0], 0, items[j][1]))
            j += 1
    assert new.complete, new.stats()
    log, _ = new.final_output()
    got = [x for x in log + later if isinstance(x, np.ndarray) and len(x)]
    rows = np.concatenate(got) if got else q.schema_of(node).empty()
    _, first = np.unique(rows[ID], return_index=True)
    return rows[np.sort(first)], new, new.dead_letters()


@PROPS
@given(kind=st.sampled_from(KINDS + ("keyed",)), seed=st.integers(0, 2**31 - 1), keys=st.integers(1, 100),
       bits=st.integers(0, 6), strategy=st.sampled_from(("all-at-once", "batched", "fluid")))
def test_a_staged_transfer_installing_live_bins_gives_the_reference_output(kind, seed, keys, bits, strategy):
    q, node = build(kind)
    inputs = records(kind, seed, 120, keys)
    rng = np.random.default_rng(seed)
    got, new, letters = transfer(q, node, items_of(q, inputs, rng), bits, strategy, rng)
    ref = run_reference(q, inputs)
    assert_same_output(ref.outputs["out"], got)
    want = {(d.where, d.reason, i) for d in merge_dead_letters(ref.dead_letters) for i in d.batch[ID].tolist()}
    have = {(d.where, d.reason, i) for d in letters for i in d.batch[ID].tolist()}
    assert have == want
    if new.steps > 1:  # the parts merged by installing bins into a running logic
        assert new.stats()["live_merges"] >= 1
        assert new.stats()["live_merges"] == new.stats()["merges"]


def test_a_join_moved_fluidly_at_2_pow_12_bins_with_a_full_window_gives_the_reference_output():
    """Issue #30's case: a keyed Join's full window moved one bin per step at 4096 bins."""
    q, node = build("join")
    inputs = records("join", 3, 1500, 5000)
    rng = np.random.default_rng(3)
    got, new, _ = transfer(q, node, items_of(q, inputs, rng), 12, "fluid", rng)
    assert_same_output(run_reference(q, inputs).outputs["out"], got)
    assert new.steps > 1 and new.stats()["live_merges"] == new.stats()["merges"] >= 1


def test_install_bins_refuses_bins_taken_at_other_punctuations():
    q, node = build("join")
    a, b = q.build_logic(node), q.build_logic(node)
    rows = q.in_schemas(node)[0].from_columns({"ts": [5, 6], "k": [1, 2], "a": [0, 0]}, ids=[1, 2])
    a.process(0, rows)
    a.process(0, Punctuation(4))
    with pytest.raises(CheckpointError, match="punctuations"):
        b.install_bins(a.checkpoint(2, [0, 1, 2, 3]), [0, 1, 2, 3])


def test_a_step_of_one_bin_reads_only_that_bin():
    """A step's checkpoint of a keyed Join or Aggregate never hashes the state (the hashes are
    kept as the logic runs): the rows of a bin come from binary searches."""
    for kind in ("join", "sliding"):
        q, node = build(kind)
        logic = q.build_logic(node)
        for port, it in items_of(q, records(kind, 1, 400, 300), np.random.default_rng(1)):
            if not isinstance(it, Punctuation) or it.p < 250:
                logic.process(port, it)
        calls = []
        import replistream.operators.join as join_mod
        import replistream.operators.aggregate as agg_mod
        real = hash_columns

        def counting(batch, fields):
            calls.append(len(batch))
            return real(batch, fields)

        join_mod.hash_columns = agg_mod.hash_columns = counting
        try:
            st_ = logic.checkpoint(8, [17])
        finally:
            join_mod.hash_columns = agg_mod.hash_columns = real
        assert calls == [], calls
        assert 0 < sum(int(o[-1]) for o in logic.checkpoint(8).offsets.values())
        assert st_.nonempty_bins().tolist() in ([], [17])


def test_a_receiver_merges_each_steps_bins_into_its_state_once(monkeypatch):
    """A staged receiver whose logic installs bins in place (live bins, no sorter) merges every part
    that can into its largest at once, so each moved row is appended about twice (its step's part,
    then the running state), not once per doubling of a binary counter of parts: a fluid move of
    a million keys in 4,096 steps kept the receiver busy for most of the move in
    ``KeyedState._append`` (py-spy, ``bench/migration.py``). Output and state are unchanged."""
    from replistream.operators.keyed import KeyedState

    q, node = build("keyed")
    inputs = records("keyed", 11, 3000, 2000)
    items = items_of(q, inputs, np.random.default_rng(11))
    peer = ReplicaCore(q, node, channels=[1], retain=True)
    for port, it in items:
        peer.process(port, 0, it)
    bits = 8
    new = StagedReplica(q, node, channels=[1], bits=bits)
    appended = []
    real = KeyedState._append
    monkeypatch.setattr(KeyedState, "_append", lambda self, h, v: (appended.append(len(h)), real(self, h, v))[1])
    steps = list(plan_transfer("fluid", bits, 1, splittable(q, node)))
    for bins in steps:
        new.install_step(peer.checkpoint(bits, bins), bins)
    assert new.complete and len(steps) == 1 << bits
    rows = len(peer.logic.state)
    assert rows > 1000 and new.stats()["live_merges"] == new.stats()["merges"] >= 1
    assert sum(appended) <= 2.5 * rows, (sum(appended), rows)  # (binary-counter merging: about 5x here)
    h_new, c_new, _ = new.core.logic.state.snapshot()
    h_old, c_old, _ = peer.logic.state.snapshot()
    assert np.array_equal(h_new, h_old) and all(np.array_equal(c_new[c], c_old[c]) for c in c_old)
