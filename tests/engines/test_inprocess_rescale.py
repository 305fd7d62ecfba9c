"""Live rescaling on the in-process engine (issue #41): a :class:`~replistream.sources.Rescale`
sentinel changes a partitioned operator's number of partitions mid-stream
(replistream/engines/inprocess_rescale.py over replistream/replica/rescale.py and the
partition module's Switch and Router). The output equals the reference run exactly for a keyed
sliding window, a keyed count window and a stateless filter, through 1 -> 2 -> 4 -> 3 -> 1
partitions with each strategy (and for Megaphone's running count, a keyed operator), with random crashes and the per-replica audit; with a replica of
a giving partition killed in the middle of a fluid move (to more partitions and to fewer); and
the comparison fails when the switch is broken (negative controls). A key-equality join too:
each input's punctuation is held at the first step's time not done (without it, pairs are lost:
a negative control)."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query, QueryError, seconds
from replistream.engines.inprocess import InProcessEngine, ReplicaDivergence
from replistream.sources import KillReplica, Rescale
from replistream.testing import assert_same_output, run_reference, run_replicated

BITS = 4  # 16 bins: 1 -> 2 moves 8, 2 -> 4 moves 8 (two per pair), 4 -> 3 moves 4, 3 -> 1 moves 10 (6, 5, 5 bins)
SEQUENCE = (2, 4, 3, 1)


def columns(ts, chunk, **cols):
    return [{"ts": ts[a:a + chunk], **{k: v[a:a + chunk] for k, v in cols.items()}} for a in range(0, len(ts), chunk)]


def stream(rng, n, keys, span_s=40, chunk=6):
    ts = np.sort(rng.integers(0, seconds(span_s), n))
    return columns(ts, chunk, k=rng.integers(0, keys, n), v=np.round(rng.normal(size=n) * 100, 3))


def window_case(seed):
    q = Query("keyed_window")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(4), slide=seconds(2), by="k", aggs={"n": "count", "t": ("v", "sum")}, name="op").sink("out")
    return q.build(), {"s": stream(np.random.default_rng(seed), 360, 25)}


def count_case(seed):
    q = Query("keyed_count")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.count_window(size=3, slide=2, by="k", aggs={"t": ("v", "sum")}, name="op").sink("out")
    return q.build(), {"s": stream(np.random.default_rng(seed), 360, 25)}


def join_case(seed):
    q = Query("keyed_join")
    a = q.source("a", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    b = q.source("b", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    a.join(b, window=seconds(2), on="k", name="op").sink("out")
    rng = np.random.default_rng(seed)
    return q.build(), {"a": stream(rng, 200, 30), "b": stream(rng, 200, 30)}


def keyed_case(seed):
    """Megaphone's running count (a keyed operator's state, KeyedState): a step gives its bins'
    rows away as dead rows (``drop_bins``); 4 -> 3 -> 1 gives bins back to partitions that gave
    them earlier, so their dead rows must not be found again."""
    from replistream.operators.keyed import KeyedCount

    q = Query("keyed_running")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.apply(KeyedCount(by="k", bits=BITS), name="op").sink("out")
    return q.build(), {"s": stream(np.random.default_rng(seed), 360, 25)}


def keyed_epochs_case(seed):
    """The running count per epoch of 1.5 s: a step's bins carry the open epoch's tuples to the new
    owner, so the old owner may give later steps at a later watermark only within that epoch
    (``frozen_until``)."""
    from replistream.operators.keyed import KeyedCount

    q = Query("keyed_epochs")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.apply(KeyedCount(by="k", bits=BITS, every=seconds(1.5)), name="op").sink("out")
    # (dense enough that a moving bin holds tuples of the open epoch when a step crosses its end)
    return q.build(), {"s": stream(np.random.default_rng(seed), 1500, 25, chunk=20)}


CASES = {"window": window_case, "count_window": count_case, "join": join_case, "keyed": keyed_case,
         "keyed_epochs": keyed_epochs_case}


def with_events(data, events, source=None):
    """``data`` with each ``(fraction, sentinel)`` of ``events`` placed at that fraction of the
    chunks of ``source`` (default the first)."""
    src = source or next(iter(data))
    chunks = list(data[src])
    for frac, ev in sorted(events, key=lambda e: -e[0]):
        chunks.insert(int(len(chunks) * frac), ev)
    return {**data, src: chunks}


def check(q, data, **kw):
    ref = run_reference(q, data)
    got = run_replicated(q, data, **kw)
    assert got.complete
    assert len(ref.outputs["out"]), "a vacuous case"
    assert_same_output(ref.outputs["out"], got.outputs["out"])
    return got


def sequence_events(strategy, gap=seconds(0.05), span=0.5):
    per = 3 if strategy == "batched" else None
    # (spread over the first ``span`` of the first source's chunks: the seeded scheduler feeds sources at
    # their own speeds, so a join's other input may have ended well before the first source does,
    # and the in-process engine skips a rescale once an input of the operator is at END ("the
    # operator's stream had ended"; T0 takes the largest upstream punctuation))
    return [(span * (i + 1) / (len(SEQUENCE) + 1), Rescale("op", p, strategy, bins_per_step=per, gap=gap))
            for i, p in enumerate(SEQUENCE)]


@pytest.mark.parametrize("strategy", ["fluid", "batched", "all-at-once"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_one_two_four_three_one_partitions_equal_the_reference(case, strategy, seed):
    q, data = CASES[case](seed)
    got = check(q, with_events(data, sequence_events(strategy)), k=2, seed=seed, crash=True, audit=True,
                parallelism={"op": 1}, bits=BITS)
    recs = got.stats["harness"].rescales
    assert [(r["from"], r["to"]) for r in recs] == [(1, 2), (2, 4), (4, 3), (3, 1)]
    assert [r["bins_moved"] for r in recs] == [8, 8, 4, 10]
    assert all("skipped" not in r for r in recs), recs
    # (one step per pair of partitions all at once; batched: three bins a step, per pair)
    steps = {"fluid": [8, 8, 4, 10], "batched": [3, 4, 3, 4], "all-at-once": [1, 4, 3, 2]}[strategy]
    assert [r["steps"] for r in recs] == steps
    assert sorted(recs[1]["new_replicas"]) == ["op.2#0", "op.2#1", "op.3#0", "op.3#1"]
    assert sorted(recs[2]["retired_replicas"]) == ["op.3#0", "op.3#1"]
    assert sorted(recs[3]["retired_replicas"]) == ["op.1#0", "op.1#1", "op.2#0", "op.2#1"]
    assert all(r["sent"] > 0 for r in recs), recs


@pytest.mark.parametrize("case", list(CASES))
def test_a_giving_replica_killed_during_a_fluid_move_to_more_partitions(case):
    """1 -> 2 fluid with a second of event time between steps (8 steps: 8 s), partition 0's replica 1
    killed half a second of event time after the switch: every step after it is given by replica 0
    alone; the rescale is not finished when the kill runs."""
    q, data = CASES[case](2)
    src = next(iter(data))
    chunks = data[src]
    at = len(chunks) // 3
    script = {**data, src: chunks[:at] + [Rescale("op", 2, "fluid", gap=seconds(1))] + chunks[at:at + 1]
              + [KillReplica("op.0", 1)] + chunks[at + 1:]}
    eng = InProcessEngine(q, k=2, seed=5, audit=True, parallelism={"op": 1}, bits=BITS)
    kills = []
    run_event = eng._run_event

    def spy(ev):  # the steps still to give when the kill runs
        if isinstance(ev, KillReplica):
            kills.append(sorted(s.id for r in eng.groups["op"] if r.partition == 0 and r.core.moves
                                for s in r.core.moves.give))
        run_event(ev)

    eng._run_event = spy
    got = eng.run(script)
    ref = run_reference(q, script)
    assert_same_output(ref.outputs["out"], got.outputs["out"])
    assert got.stats["harness"].crashed == ["op.0#1"]
    assert len(kills) == 1 and len(kills[0]) >= 4, kills  # killed in the middle of the move
    (rec,) = got.stats["harness"].rescales
    assert rec["steps"] == 8


@pytest.mark.parametrize("case", ["window", "count_window"])
def test_a_leaving_replica_killed_during_a_fluid_move_to_fewer_partitions(case):
    """4 -> 2 all at once, then 2 -> 1 fluid with partition 1 (the one that gives and retires)
    losing replica 0 in the middle: its peer gives the rest and closes the partition."""
    q, data = CASES[case](3)
    src = next(iter(data))
    chunks = data[src]
    a, b = len(chunks) // 4, len(chunks) // 2
    script = {**data, src: chunks[:a] + [Rescale("op", 2, "all-at-once")] + chunks[a:b]
              + [Rescale("op", 1, "fluid", gap=seconds(1))] + chunks[b:b + 1] + [KillReplica("op.1", 0)]
              + chunks[b + 1:]}
    got = check(q, script, k=2, seed=6, audit=True, parallelism={"op": 4}, bits=BITS)
    h = got.stats["harness"]
    assert h.crashed == ["op.1#0"]
    assert [(r["from"], r["to"], sorted(r["retired_replicas"])) for r in h.rescales] == [
        (4, 2, ["op.2#0", "op.2#1", "op.3#0", "op.3#1"]), (2, 1, ["op.1#0", "op.1#1"])]


def test_a_stateless_operator_rescales_by_a_switch_alone():
    q = Query("stateless")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.filter(lambda b: b["v"] > 0, name="op").sink("out")
    data = {"s": stream(np.random.default_rng(4), 300, 25)}
    got = check(q, with_events(data, sequence_events("fluid")), k=2, seed=2, crash=True, audit=True,
                parallelism={"op": 1}, bits=BITS)
    assert [(r["strategy"], r["steps"]) for r in got.stats["harness"].rescales] == [("all-at-once", 1), ("all-at-once", 4),
                                                                                    ("all-at-once", 3), ("all-at-once", 2)]


def test_a_rescale_while_one_moves_starts_after_its_steps_and_one_at_the_end_completes():
    """The second rescale fires right after the first: its steps come after the first's last one
    (a slow replica may not have given those yet). The third fires when the first entry copy
    reaches the end of the input."""
    q, data = window_case(6)
    chunks = data["s"]
    script = {"s": chunks[:10] + [Rescale("op", 2, "fluid", gap=seconds(2)), Rescale("op", 4, "all-at-once")]
              + chunks[10:] + [Rescale("op", 1)]}
    got = check(q, script, k=2, seed=7, audit=True, parallelism={"op": 1}, bits=BITS)
    first, second, last = got.stats["harness"].rescales
    assert second["harness_step"] == first["harness_step"] and second["at"] == first["at"] + 7 * seconds(2) + 1
    assert (last["from"], last["to"], last["steps"]) == (4, 1, 12) and "skipped" not in last


def test_a_join_without_its_inputs_punctuation_held_at_a_step_loses_pairs(monkeypatch):
    """Negative control for joins: with each input's punctuation given to the logic as it comes
    (not held at the first step's time not done: Moves._capped), one input's punctuation purges
    rows a tuple of the other input, routed to the new owner, still needed: pairs are lost."""
    from replistream.schema import Punctuation
    from replistream.replica.rescale import Moves

    def uncapped(self, core):
        out = []
        for i, p in sorted(self._real.items()):
            if core.logic.in_punct[i] < p:
                out.extend(core.logic.process(i, Punctuation(p)))
        return out

    monkeypatch.setattr(Moves, "_capped", uncapped)
    lost = 0
    for seed in range(4):
        q, data = join_case(seed)
        script = with_events(data, sequence_events("fluid"))
        ref = run_reference(q, script)
        got = run_replicated(q, script, k=2, seed=seed, parallelism={"op": 1}, bits=BITS)
        lost += len(ref.outputs["out"]) - len(got.outputs["out"])
    assert lost > 0


@pytest.mark.parametrize("event, error, match", [
    (Rescale("nope", 2), QueryError, "'nope' is not an operator"),
    (Rescale("op", 2, "lumpy"), ValueError, "unknown strategy 'lumpy'"),
    (Rescale("op", 2, "batched", bins_per_step=0), ValueError, "bins_per_step must be >= 1"),
    (Rescale("op", 0), ValueError, "integer >= 1"),
    (Rescale("op", 17), ValueError, "cannot share 2\\*\\*4 bins"),
])
def test_bad_rescales_are_refused_before_the_run(event, error, match):
    q, data = window_case(0)
    with pytest.raises(error, match=match):
        run_replicated(q, {"s": [event] + data["s"]}, k=2, parallelism={"op": 1}, bits=BITS)


def test_rescaling_an_unpartitioned_operator_or_restarting_a_retired_partition_is_refused():
    q, data = window_case(0)
    with pytest.raises(QueryError, match=r"not partitioned; run it with parallelism=\{'op': 1\}"):
        run_replicated(q, {"s": [Rescale("op", 2)] + data["s"]}, k=2)
    with pytest.raises(QueryError, match="would start op.1 again"):
        run_replicated(q, {"s": [Rescale("op", 1), Rescale("op", 2)] + data["s"]}, k=2, parallelism={"op": 2})


def test_a_kill_may_name_a_partition_a_rescale_starts():
    q, data = window_case(8)
    chunks = data["s"]
    script = {"s": chunks[:10] + [Rescale("op", 3, "all-at-once")] + chunks[10:30] + [KillReplica("op.2", 1)]
              + chunks[30:]}
    got = check(q, script, k=2, seed=1, audit=True, parallelism={"op": 1}, bits=BITS)
    assert got.stats["harness"].crashed == ["op.2#1"]


def test_the_deployment_is_told_to_call_rescale_itself():
    with pytest.raises(NotImplementedError, match=r"deployment.rescale\('op', 2, strategy='fluid'\)"):
        Rescale("op", 2).apply(object())


# -- negative controls: the switch broken, the comparison fails ------------------------------------

def test_a_switch_one_tick_early_breaks_the_output(monkeypatch):
    """Tuples at a step's time sent to the new owner (``ts >= at`` instead of ``ts > at``): the old
    owner has already counted some of them or gives a window the new owner counts again."""
    from replistream import partition

    def early(self, port, batch):
        bins = self.bins(port, batch)
        owner = self.binmap.owner[bins]
        for m in self.moves:
            owner = np.where(batch["ts"] >= m.at[bins], m.owner[bins], owner)
        return owner

    monkeypatch.setattr(partition.Router, "partition_of", early)
    q, data = window_case(0)
    # every step's time is a timestamp some tuple has: T0 (the largest routed) with all at once
    script = with_events(data, sequence_events("all-at-once", span=1.0))
    with pytest.raises((AssertionError, ReplicaDivergence, RuntimeError)):
        check(q, script, k=2, seed=0, audit=True, parallelism={"op": 1}, bits=BITS)


def test_a_switch_before_the_largest_routed_time_breaks_the_output(monkeypatch):
    """``T0`` taken a second before the largest timestamp routed: copies of tuples a slow sender has
    not sent yet go to the new owner while the fast sender's went to the old one."""
    from replistream.engines import inprocess_rescale

    monkeypatch.setattr(inprocess_rescale.Rescaler, "_t0", lambda self, node: self.e.routers[node].max_ts - seconds(1))
    q, data = window_case(0)
    with pytest.raises((AssertionError, ReplicaDivergence, RuntimeError)):
        check(q, with_events(data, sequence_events("fluid")), k=2, seed=0, audit=True, parallelism={"op": 1},
              bits=BITS)


def test_a_time_windows_fluid_steps_across_window_ends_are_given_one_at_a_time(monkeypatch):
    """A time window's bin changes with no tuple of its own: a window that closes between two
    steps' times emits from the old owner and leaves its state. So the old owner may not give a
    later step's bins early (its ``frozen_until`` promises nothing past ``at``). Eight fluid steps
    0.1 s apart, with a second of stream per chunk (each punctuation passes several steps at once),
    cross an end of the half-second slides: equal to the reference as it is; when the window
    claims its bins frozen like a keyed count's (a negative control), the output differs from the
    reference, and with the per-replica audit on, the replicas from each other."""
    from replistream.operators.aggregate import TimeWindowAggregateLogic
    from replistream.schema import END

    q = Query("short_windows")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(1), slide=seconds(0.5), by="k", aggs={"n": "count", "t": ("v", "sum")},
             name="op").sink("out")
    q = q.build()
    data = {"s": stream(np.random.default_rng(11), 1500, 12, span_s=10, chunk=150)}
    script = with_events(data, [(0.3, Rescale("op", 2, "fluid", gap=seconds(0.1)))])
    got = check(q, script, k=2, seed=3, audit=True, parallelism={"op": 1}, bits=BITS)
    (rec,) = got.stats["harness"].rescales
    assert rec["steps"] == 8 and rec["bins_moved"] == 8

    monkeypatch.setattr(TimeWindowAggregateLogic, "frozen_until", lambda self, at: END - 1)
    with pytest.raises(AssertionError):
        check(q, script, k=2, seed=3, parallelism={"op": 1}, bits=BITS)
    with pytest.raises(ReplicaDivergence):
        check(q, script, k=2, seed=3, audit=True, parallelism={"op": 1}, bits=BITS)


def test_a_batched_rescale_without_a_batch_size_moves_its_bins_in_about_16_steps():
    """``strategy="batched"`` with no ``bins_per_step`` is a batched move of about 16 steps (as a
    replica's batched move), not a refusal: the output still equals the reference."""
    from replistream.partition import BinMap
    from replistream.replica.rescale import plan_steps

    steps, times = plan_steps("op", BinMap.even(2, bits=BITS), BinMap.even(3, bits=BITS), 0, "batched", None, 1)
    assert len(times) == len(BinMap.even(2, bits=BITS).moves(BinMap.even(3, bits=BITS)))
    assert len(steps) <= 16 + 2  # (cut per pair of partitions: at most one short step more each)
    q, data = window_case(1)
    script = {"s": data["s"][:20] + [Rescale("op", 2, "batched")] + data["s"][20:]}
    ref = run_reference(q, script)
    got = run_replicated(q, script, k=2, seed=1, parallelism={"op": 1}, bits=BITS)
    assert_same_output(ref.outputs["out"], got.outputs["out"])
