"""Hand-over at the operator and replica level (docs/design.md, decision 7; Megaphone §3.4 for bins).

Every operator logic restored from a checkpoint taken at any point of its input
continues exactly as the original does; checkpoints survive pickling and being
split into bins and reassembled in any order; duplicate filters restored from a
checkpoint drop exactly what the peer already applied; the output log keeps
what a new downstream replica still needs; bad checkpoints are refused.
"""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream import Punctuation, Query, Schema, Summary
from replistream.replica import CHECKPOINT_VERSION, ReplayLog, ReplicaCheckpoint, ReplicaCore
from replistream.sources import source_streams
from replistream.operators import FilterLogic, OperatorLogic
from replistream.operators.aggregate import CountWindowAggregateLogic, TimeWindowAggregateLogic
from replistream.operators.base import CheckpointError, OperatorState, bin_of
from replistream.operators.dupfilter import DuplicateFilter, FilterState
from replistream.operators.join import JoinLogic
from replistream.operators.sorter import SorterLogic
from replistream.testing import (AddReplica, Revive, as_multiset, assert_same_output, run_reference,
                                 run_replicated, with_punctuations)

PROPS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

L = Schema({"key": "i8", "x": "i8"})
R = Schema({"key": "i8", "y": "f8"})
S = Schema({"key": "i8", "x": "i8", "v": "f8"})


def stream(schema: Schema, n: int, seed: int, name: str = "s") -> list:
    """Entry-point output for ``n`` random records: batches with ids, and punctuations."""
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    ts = np.sort(rng.integers(0, 400, n)) + rng.integers(-8, 9, n)
    recs = []
    for i in range(n):
        r = {"ts": int(ts[i]), "key": int(rng.integers(0, 4))}
        for f in schema.names[1:]:
            r[f] = int(rng.integers(-100, 100)) if schema[f].kind == "i" else float(
                rng.normal() * 10.0 ** rng.integers(-8, 12))
        recs.append(r)
    q = Query()
    q.source(name, dict(zip(schema.names, (str(schema[f]) for f in schema.names))),
             punctuate_every=40, max_disorder=8).filter(lambda b: b["ts"] >= 0).sink("out")
    streams, _ = source_streams(q.build(), {name: with_punctuations(recs, 5, prng)})
    return streams[name]


def interleave(per_port: list[list], rng: random.Random) -> list[tuple[int, object]]:
    cursors = [0] * len(per_port)
    out = []
    while any(c < len(p) for c, p in zip(cursors, per_port)):
        port = rng.choice([i for i, p in enumerate(per_port) if cursors[i] < len(p)])
        out.append((port, per_port[port][cursors[port]]))
        cursors[port] += 1
    return out


def shuffle_bins(state: OperatorState, rng: random.Random) -> OperatorState:
    bins = list(range(state.n_bins))
    rng.shuffle(bins)
    return OperatorState.merge([state.select([b]) for b in bins])


def continue_both(make, seq, cut: int, bits: int, rng: random.Random):
    """Run the original to ``cut``, hand over to a fresh logic, run both on the rest; return both outputs."""
    a = make()
    for port, item in seq[:cut]:
        a.process(port, item)
    state = pickle.loads(pickle.dumps(a.checkpoint(bits), protocol=5))
    if bits:
        state = shuffle_bins(state, rng)
    b = make().restore(state)
    outs = ([], [])
    for port, item in seq[cut:]:
        for logic, out in zip((a, b), outs):
            out.extend(logic.process(port, item))
    return outs


def assert_same_items(x: list, y: list) -> None:
    px = [it.p for it in x if isinstance(it, Punctuation)]
    py = [it.p for it in y if isinstance(it, Punctuation)]
    assert px == py
    bx = [it for it in x if not isinstance(it, Punctuation)]
    by = [it for it in y if not isinstance(it, Punctuation)]
    if bx or by:
        assert_same_output(np.concatenate(bx), np.concatenate(by))


def _agg_logics():
    aggs = {"n": "count", "sx": ("x", "sum"), "sv": ("v", "sum"), "mv": ("v", "mean"), "lo": ("v", "min"),
            "hi": ("x", "max"), "first": ("v", Summary(lambda v: v[0], "f8")),
            "rows": ("*", Summary(lambda r: int(r["x"].sum()), "i8"))}
    return {
        "tumbling": lambda: TimeWindowAggregateLogic("agg", [S], size=50, by="key", aggs=aggs),
        "sliding": lambda: TimeWindowAggregateLogic("agg", [S], size=90, slide=20, by="key", aggs=aggs),
        "ungrouped": lambda: TimeWindowAggregateLogic("agg", [S], size=70, slide=30, aggs={"sv": ("v", "sum")}),
        "count": lambda: CountWindowAggregateLogic(
            "agg", [S], size=4, slide=3, by="key",
            aggs={"n": "count", "sv": ("v", "sum"), "mx": ("x", "mean"),
                  "seq": ("x", Summary(lambda v: int(np.dot(v, np.arange(1, len(v) + 1))), "i8"))}),
        "count_ungrouped": lambda: CountWindowAggregateLogic("agg", [S], size=3, aggs={"sv": ("v", "sum")}),
        "sorter": lambda: SorterLogic("sort", [S]),
        "filter": lambda: FilterLogic("f", [S], lambda b: b["x"] > 0),
    }


@PROPS
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(0, 80), where=st.floats(0, 1),
       kind=st.sampled_from(sorted(_agg_logics())), bits=st.sampled_from([0, 1, 4]))
def test_single_input_logic_continues_after_restore(seed, n, where, kind, bits):
    make = _agg_logics()[kind]
    seq = [(0, it) for it in stream(S, n, seed)]
    a, b = continue_both(make, seq, int(where * len(seq)), bits, random.Random(seed))
    assert_same_items(a, b)


@PROPS
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(0, 60), where=st.floats(0, 1), keyed=st.booleans(),
       window=st.integers(1, 150), bits=st.sampled_from([0, 2, 6]))
def test_join_continues_after_restore(seed, n, where, keyed, window, bits):
    def make():
        if keyed:
            return JoinLogic("j", [L, R], window=window, left_key="key", right_key="key")
        return JoinLogic("j", [L, R], window=window, predicate=lambda l, r: (l["x"] % 3) != r["key"])

    rng = random.Random(seed)
    seq = interleave([stream(L, n, seed, "l"), stream(R, n, seed + 1, "r")], rng)
    a, b = continue_both(make, seq, int(where * len(seq)), bits, rng)
    assert_same_items(a, b)


def test_join_bins_keep_a_keys_tuples_of_both_sides_together():
    """Megaphone needs a key's state in one bin: the left and right tuples of a key share it."""
    j = JoinLogic("j", [L, R], window=10**6, left_key="key", right_key="key")
    j.process(0, L.from_columns({"ts": np.arange(50), "key": np.arange(50) % 7, "x": np.zeros(50, np.int64)},
                                ids=np.arange(50)))
    j.process(1, R.from_columns({"ts": np.arange(50), "key": np.arange(50) % 7, "y": np.zeros(50)},
                                ids=np.arange(50, 100)))
    state = j.checkpoint(bits=3)
    for b in range(state.n_bins):
        part = state.select([b])
        lk, rk = set(part.tables["left"]["rows"]["key"].tolist()), set(part.tables["right"]["rows"]["key"].tolist())
        assert lk == rk
    assert sum(bool(state.bin_rows("left")[b]) for b in range(8)) > 1  # the keys really spread


def test_bins_split_by_group_and_merge_back():
    a = TimeWindowAggregateLogic("agg", [S], size=100, slide=25, by="key", aggs={"sv": ("v", "sum")})
    b = stream(S, 200, 3)
    for it in b[: len(b) // 2]:
        a.process(0, it)
    state = a.checkpoint(bits=5)
    assert state.offsets["windows"][-1] == a.open_windows
    assert (np.diff(state.offsets["windows"]) >= 0).all()
    groups = state.tables["windows"]["group"]["key"]
    for k in np.unique(groups):  # all windows of a group in one bin
        bins = {int(np.searchsorted(state.offsets["windows"], i, "right") - 1) for i in np.flatnonzero(groups == k)}
        assert len(bins) == 1
    whole = state.merge([state.select(range(0, 32, 2)), state.select(range(1, 32, 2))])
    for t in state.tables:
        for c in state.tables[t]:
            np.testing.assert_array_equal(whole.tables[t][c], state.tables[t][c])


def test_bin_of_uses_the_high_bits():
    h = np.array([0, 1, 2**62, 2**63 + 5], dtype=np.uint64)
    assert bin_of(h, 1).tolist() == [0, 0, 0, 1]
    assert bin_of(h, 2).tolist() == [0, 0, 1, 2]
    with pytest.raises(ValueError):
        bin_of(h, 40)


def test_exact_sums_travel_compactly():
    """A float sum's 70 limbs travel as a band of the non-zero ones: far below 560 bytes a window."""
    a = TimeWindowAggregateLogic("agg", [S], size=10, by="key", aggs={"sv": ("v", "sum")})
    n = 20_000
    rng = np.random.default_rng(0)
    a.process(0, S.from_columns({"ts": np.arange(n) * 10, "key": np.zeros(n, np.int64), "x": np.zeros(n, np.int64),
                                 "v": rng.normal(size=n) * 1e3}, ids=np.arange(n)))
    state = a.checkpoint()
    assert a.open_windows == n
    per_window = len(pickle.dumps(state, protocol=5)) / n
    assert per_window < 120, per_window


# -- duplicate filter and output log ---------------------------------------------------------------

def test_filter_checkpoint_is_p_and_the_applied_ids_above_it():
    s = Schema({"x": "i8"})
    f = DuplicateFilter(2, s)
    f.on_batch(0, s.from_columns({"ts": [1, 5, 8], "x": [0, 0, 0]}, ids=[1, 2, 3]))
    f.on_punctuation(0, 5)
    f.on_batch(1, s.from_columns({"ts": [9], "x": [0]}, ids=[4]))
    st_ = f.checkpoint()
    assert st_.max_punct == 5 and sorted(st_.applied_ids.tolist()) == [3, 4]
    g = DuplicateFilter(3, s).restore(pickle.loads(pickle.dumps(st_)))
    replay = s.from_columns({"ts": [5, 8, 9, 10], "x": [0, 0, 0, 0]}, ids=[2, 3, 4, 5])
    assert g.on_batch(2, replay)[0]["id"].tolist() == [5]
    assert g.on_punctuation(2, 5) == [] and g.on_punctuation(2, 9) == [Punctuation(9)]
    assert g.stats()["tracked_ids"] == 1  # 3 and 4 forgotten at 9, as the peer would


def test_filter_restore_needs_a_fresh_filter():
    s = Schema({"x": "i8"})
    f = DuplicateFilter(1, s)
    f.on_punctuation(0, 3)
    with pytest.raises(CheckpointError):
        f.restore(FilterState(1, np.zeros(0, np.int64), np.zeros(0, np.uint64)))


def test_output_log_keeps_late_tuples_emitted_before_a_punctuation():
    """An operator may emit ts=9 before punctuation 6; trimming at 6 must keep it (by ts, not position)."""
    s = Schema({"x": "i8"})
    log = ReplayLog()
    log.append([s.from_columns({"ts": [3, 9], "x": [0, 1]}), Punctuation(6),
                s.from_columns({"ts": [7], "x": [2]}), Punctuation(8)])
    log.trim(6)
    kept = log.items()
    assert [it.p for it in kept if isinstance(it, Punctuation)] == [8]
    assert sorted(int(t) for it in kept if not isinstance(it, Punctuation) for t in it["ts"]) == [7, 9]
    log.trim(5)  # acknowledgements never go back
    assert log.acked == 6 and log.tuples == 2
    log.trim(9)
    assert log.items() == []


# -- replica checkpoints -----------------------------------------------------------------------------

def _window_query():
    q = Query("w")
    q.source("s", {"key": "i8", "x": "i8", "v": "f8"}, punctuate_every=20).window(
        size=40, slide=10, by="key", aggs={"sv": ("v", "sum")}, name="w").sink("out")
    return q.build()


def test_replica_checkpoint_round_trip_and_refusals():
    q = _window_query()
    core = ReplicaCore(q, "w", channels=[2], retain=True)
    for it in stream(S, 50, 1)[:20]:
        core.process(0, 0, it)
    ck = ReplicaCheckpoint.from_bytes(core.checkpoint().to_bytes())
    assert ck.version == CHECKPOINT_VERSION and ck.summary()["state_rows"] == core.logic.open_windows
    new = ReplicaCore.from_checkpoint(q, ck, channels=[3])
    assert [f.n_channels for f in new.filters] == [3]
    assert new.output_log.items() == [] or len(new.output_log) == len(core.output_log)
    with pytest.raises(CheckpointError):
        ReplicaCore.from_checkpoint(q, ReplicaCheckpoint(**{**ck.__dict__, "version": 99}), channels=[1])
    other = Query("w")
    other.source("s", {"key": "i8", "x": "i8", "v": "f8"}).window(size=40, by="key", aggs={"sv": ("v", "sum")},
                                                                   name="w").sink("out")
    with pytest.raises(CheckpointError, match="parameters"):
        ReplicaCore.from_checkpoint(other.build(), ck, channels=[1])
    used = ReplicaCore(q, "w", channels=[1])
    used.process(0, 0, Punctuation(5))
    with pytest.raises(CheckpointError, match="fresh"):
        used.logic.restore(ck.logic)
    with pytest.raises(CheckpointError):
        ReplicaCore(q, "w", channels=None).checkpoint()


def test_stateful_custom_operator_without_hooks_refuses_checkpoint():
    class Counter(OperatorLogic):
        def __init__(self, name, in_schemas, strict=False):
            super().__init__(name, in_schemas, in_schemas[0], strict)
            self.n = 0

        def _on_batch(self, port, batch):
            self.n += len(batch)
            return [batch]

    with pytest.raises(NotImplementedError, match="does not support hand-over"):
        Counter("c", [S]).checkpoint()


def test_sorted_inputs_hand_over_with_the_sorter():
    """A custom order-sensitive operator: its Sorter's buffer travels in the checkpoint."""

    class Ranked(OperatorLogic):
        """Stateless but order sensitive: fine only because its input is sorted (Hwang §IV-C)."""
        stateless = True

        def _on_batch(self, port, batch):
            return [batch]

    q = Query("sorted")
    s = q.source("s", {"key": "i8", "x": "i8", "v": "f8"}, punctuate_every=50, max_disorder=10)
    s.apply(lambda n, ins, strict=False: Ranked(n, ins, ins[0], strict), order_sensitive=True,
            name="ranked").sink("out", ordered=True)
    q.build()
    assert q.sorted_inputs("ranked")
    rng, prng = np.random.default_rng(4), random.Random(4)
    recs = [{"ts": int(t), "key": 0, "x": int(i), "v": 0.5} for i, t in enumerate(np.sort(rng.integers(0, 300, 60)))]
    feed = with_punctuations(recs, 6, prng)
    inputs = {"s": feed[:len(feed) // 2] + [Revive("ranked", 0, peer=1), AddReplica("ranked", delay=7)]
              + feed[len(feed) // 2:]}
    for seed in range(4):
        rep = run_replicated(q, inputs, k=2, seed=seed, crash=True, audit=True)
        assert_same_output(run_reference(q, inputs).outputs["out"], rep.outputs["out"], ordered=True)
        assert len(rep.stats["harness"].handovers) == 2


def test_revive_names_an_operator():
    q = _window_query()
    with pytest.raises(Exception, match="not an operator"):
        run_replicated(q, {"s": [Revive("nope", 0)]}, k=2)


def test_audit_does_not_perturb_the_schedule():
    """The audit only observes: same seed, same delivery, crashes, splits and re-sends."""
    q = _window_query()
    recs = [{"ts": t, "key": t % 3, "x": t, "v": 0.25 * t} for t in range(200)]
    feed = with_punctuations(recs, 3, random.Random(1))
    a = run_replicated(q, {"s": feed}, k=3, seed=5, crash=True)
    b = run_replicated(q, {"s": feed}, k=3, seed=5, crash=True, audit=True)
    assert a.stats["harness"] == b.stats["harness"]
    assert as_multiset(a.outputs["out"]) == as_multiset(b.outputs["out"])


def _same_tables(a: OperatorState, b: OperatorState) -> None:
    assert (a.in_punct, a.watermark, a.bits, sorted(a.tables)) == (b.in_punct, b.watermark, b.bits, sorted(b.tables))
    for t in a.tables:
        np.testing.assert_array_equal(a.offsets[t], b.offsets[t])
        assert sorted(a.tables[t]) == sorted(b.tables[t])
        for c in a.tables[t]:
            np.testing.assert_array_equal(a.tables[t][c], b.tables[t][c])


@pytest.mark.parametrize("kind", ["join", "unkeyed join", "time aggregate", "count aggregate"])
@pytest.mark.parametrize("bits", [1, 3, 6])
def test_a_step_checkpoint_of_some_bins_equals_the_whole_checkpoint_selected(kind, bits):
    """checkpoint(bits, bins) lays out only the rows of ``bins`` (what a batched or fluid step of
    a Join or Aggregate ships) and must equal checkpoint(bits).select(bins) exactly."""
    rng = random.Random(bits)
    if kind.endswith("join"):
        keyed = kind == "join"
        op = JoinLogic("j", [L, R], window=60, left_key="key" if keyed else None,
                       right_key="key" if keyed else None)
        items = interleave([stream(L, 150, bits, "l"), stream(R, 150, bits + 1, "r")], rng)
    elif kind == "time aggregate":
        op = TimeWindowAggregateLogic("agg", [S], size=100, slide=25, by="key", aggs={"sv": ("v", "sum")})
        items = [(0, it) for it in stream(S, 200, bits)]
    else:
        op = CountWindowAggregateLogic("agg", [S], size=5, by="key", aggs={"sv": ("v", "sum")})
        items = [(0, it) for it in stream(S, 200, bits)]
    for port, it in items[: len(items) // 2]:
        op.process(port, it)
    whole = op.checkpoint(bits)
    assert any(len(next(iter(c.values()))) for c in whole.tables.values())  # there is state to split
    for bins in ([0], list(range(0, 1 << bits, 2)), [(1 << bits) - 1], [], list(range(1 << bits))):
        _same_tables(op.checkpoint(bits, bins), whole.select(bins))
