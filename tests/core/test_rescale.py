"""Bins that move between partitions at logical times (a rescale, replistream/replica/rescale.py),
checked without an engine: one core per partition, each fed its share of the stream through a
:class:`~replistream.partition.Router` with the rescale's :class:`~replistream.partition.Switch`,
the moved state handed over after a random delay; the partitions' outputs together must equal the
reference run exactly, for keyed windows, count windows and a keyed join, with all-at-once and
step-by-step (fluid) moves, growing 1 -> 2 -> 4 and shrinking 4 -> 3 -> 1 (the leaving partitions'
bins go back into those that stay)."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query, seconds
from replistream.partition import BinMap, Router, Switch
from replistream.replica import ReplicaCore
from replistream.replica.rescale import Move, Moves
from replistream.schema import Punctuation
from replistream.testing import assert_same_output, run_reference

BITS = 6


def window_query():
    q = Query("w")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(3), slide=seconds(1), by="k", aggs={"n": "count", "t": ("v", "sum")}, name="op").sink("out")
    return q.build()


def count_query():
    q = Query("c")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.count_window(3, by="k", aggs={"n": "count", "t": ("v", "sum")}, name="op").sink("out")
    return q.build()


def inputs(seed, n=3000, keys=50, span=20):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span), n))
    return {"s": [{"ts": ts[a:a + 100], "k": rng.integers(0, keys, 100), "v": rng.normal(size=100)}
                  for a in range(0, n, 100)]}


def _switches(n_bins, plan, fluid):
    """``plan``: [(at, p_from, p_to)] rescales; fluid moves each bin at its own time after ``at``.
    Returns (switches, steps)."""
    switches, steps, cur = [], [], BinMap.even(1, BITS)
    for r, (at, p0, p1) in enumerate(plan):
        assert cur.partitions == p0
        new = BinMap.even(p1, BITS)
        moves = cur.moves(new)
        times = []
        by_pair: dict = {}
        for b, src, dst in moves:
            by_pair.setdefault((src, dst), []).append(b)
        i = 0
        for (src, dst), bins in sorted(by_pair.items()):
            groups = [[b] for b in bins] if fluid else [bins]
            for g in groups:
                t = at + (i * seconds(0.05) if fluid else 0)
                i += 1
                times += [(b, t) for b in g]
                steps.append(Move(f"r{r}/{i}", "op", t, tuple(g), BITS, src, dst))
        switches.append(Switch.between(cur, new, times))
        cur = new
    return switches, steps


GROW = [(seconds(6), 1, 2), (seconds(12), 2, 4)]
#: growing, then shrinking: 4 -> 3 (uneven: partition 3's bins spread over 0..2), then 3 -> 1
GROW_SHRINK = [(seconds(4), 1, 2), (seconds(7), 2, 4), (seconds(11), 4, 3), (seconds(15), 3, 1)]


@pytest.mark.parametrize("fluid", [False, True], ids=["all-at-once", "fluid"])
@pytest.mark.parametrize("make", [window_query, count_query], ids=["window", "count_window"])
@pytest.mark.parametrize("seed,plan", [(0, GROW), (1, GROW), (2, GROW_SHRINK)], ids=["grow-0", "grow-1", "shrink"])
def test_partitions_with_moving_bins_give_the_reference_output(make, fluid, seed, plan):
    q = make()
    data = inputs(seed)
    ref = run_reference(q, data)
    switches, steps = _switches(1 << BITS, plan, fluid)
    for r, (_, p0, p1) in enumerate(plan):  # fewer partitions: bins go only from those leaving to those staying
        assert p1 > p0 or all(m.src >= p1 > m.dst for m in steps if m.id.startswith(f"r{r}/"))
    router = Router(q, "op", BinMap.even(1, BITS), switches)
    cores = [ReplicaCore(q, "op", channels=[1]) for _ in range(4)]
    for p, c in enumerate(cores):
        c.moves = Moves(steps, partition=p)
    entry = q.build_entry("s")
    rng = np.random.default_rng(seed + 10)
    pending, out = [], []

    def deliver(force=False):
        keep, now = [], {}
        for due, dst, mid, st in pending:
            if force or due <= 0 or rng.random() < 0.3:
                now.setdefault(dst, []).append((mid, st))
            else:
                keep.append((due - 1, dst, mid, st))
        pending[:] = keep
        for dst, steps in now.items():  # (what arrives at once is installed in one call, as on Ray)
            out.extend(cores[dst].moves.install_many(cores[dst], steps))

    for chunk in data["s"] + [None]:
        items = entry.push(chunk) if chunk is not None else entry.close()
        for it in items:
            shares = router.route(0, [it])
            for p, share in enumerate(shares):
                for x in share:
                    out.extend(cores[p].process(0, 0, x))
                    for group, st in cores[p].moves.shipped:
                        pending.append((int(rng.integers(0, 4)), group[0].dst, tuple(m.id for m in group), st))
                    cores[p].moves.shipped.clear()
            deliver()
    deliver(force=True)
    assert all(c.moves.idle for c in cores), [(c.moves.give, c.moves.take, c.moves.waiting) for c in cores]
    got = np.concatenate([x for x in out if isinstance(x, np.ndarray) and len(x)])
    assert_same_output(ref.outputs["out"], got)


def _through(q, data, router, cores, hand_over) -> np.ndarray:
    """Feed ``data`` through ``router`` to ``cores``, one per partition; ``hand_over(group, state)``
    delivers what a core gave and returns the outputs. All the output tuples."""
    entry, out = q.build_entry("s"), []
    for chunk in data["s"] + [None]:
        for it in (entry.push(chunk) if chunk is not None else entry.close()):
            for p, share in enumerate(router.route(0, [it])):
                for x in share:
                    out.extend(cores[p].process(0, 0, x))
                    for group, st in cores[p].moves.shipped:
                        out.extend(hand_over(group, st))
                    cores[p].moves.shipped.clear()
    return np.concatenate([x for x in out if isinstance(x, np.ndarray) and len(x)])


def test_a_bin_moved_without_its_state_is_caught():
    """Negative control: installing nothing for the moved bins loses their windows' earlier
    tuples, and the comparison fails."""
    q = window_query()
    data = inputs(3)
    ref = run_reference(q, data)
    switches, steps = _switches(1 << BITS, [(seconds(6), 1, 2)], False)
    router = Router(q, "op", BinMap.even(1, BITS), switches)
    cores = [ReplicaCore(q, "op", channels=[1]) for _ in range(2)]
    for p, c in enumerate(cores):
        c.moves = Moves(steps, partition=p)
    def nothing(group, st):
        dst = cores[group[0].dst]
        return dst.moves.install_many(dst, [(tuple(m.id for m in group), st.select([]))])

    got = _through(q, data, router, cores, nothing)
    with pytest.raises(AssertionError):
        assert_same_output(ref.outputs["out"], got)


@pytest.mark.parametrize("install_after", range(8))
def test_the_new_owner_goes_on_through_quiet_punctuations_and_judges_held_tuples_as_they_came(install_after):
    """A time window's new owner takes punctuations up to its next window's end without the moving
    bins' state (``quiet_until``); a held tuple that came after a punctuation at or above its ts is
    late as in one partition, whenever the state arrives (after each item in turn)."""
    q = Query("w")
    s = q.source("s", {"k": "i8"})
    s.window(size=10, by="k", name="op").sink("out")
    q = q.build()
    schema = q.schema_of("s")
    ids = iter(range(1, 10_000))

    def rows(ts, k):
        return schema.from_columns({"ts": ts, "k": k}, ids=[next(ids) for _ in ts])

    keys = np.arange(64)
    items = [rows([1, 2, 1], [0, 1, 2]), Punctuation(3), rows(list(range(4, 4 + 64)), keys), Punctuation(6),
             rows([5] * 64, keys), rows([7] * 64, keys), Punctuation(8), Punctuation(12), rows([13] * 64, keys),
             Punctuation(30)]
    ref = ReplicaCore(q, "op", channels=[1])
    want = [x for it in items for x in ref.process(0, 0, it) if isinstance(x, np.ndarray) and len(x)]
    switches, steps = _switches(1 << BITS, [(3, 1, 2)], False)
    router = Router(q, "op", BinMap.even(1, BITS), switches)
    cores = [ReplicaCore(q, "op", channels=[1]) for _ in range(2)]
    for p, c in enumerate(cores):
        c.moves = Moves(steps, partition=p)
    out, shipped = [], []
    for i, it in enumerate(items):
        for p, share in enumerate(router.route(0, [it])):
            for x in share:
                out.extend(cores[p].process(0, 0, x))
                shipped.extend(cores[p].moves.shipped)
                cores[p].moves.shipped.clear()
        if i == 3:  # punctuation 6 is quiet for the taker (its first window ends at 9): it went through
            assert cores[1].moves.blocked_at is None and cores[1].logic.watermark == 6
        if i >= install_after:
            for group, st in shipped:
                out.extend(cores[group[0].dst].moves.install_many(cores[group[0].dst], [(tuple(m.id for m in group), st)]))
            shipped.clear()
    assert all(c.moves.idle for c in cores)
    got = np.concatenate([x for x in out if isinstance(x, np.ndarray) and len(x)])
    assert_same_output(np.concatenate(want), got)
    late = [c.filters[0].late_count + c.logic.late_count for c in (*cores, ref)]
    assert sum(late[:2]) == late[2] == 64, late  # (the duplicate filter judges a channel's late tuples)


def test_a_second_copy_given_in_other_groups_installs_only_what_is_missing():
    """Replicas of an old owner may give a rescale's steps in different groups (their punctuations
    come apart): the taker installs a step's bins once, whichever copy brings them first."""
    q = window_query()
    data = inputs(7)
    ref = run_reference(q, data)
    cur, new = BinMap.even(1, BITS), BinMap.even(2, BITS)
    bins = [b for b, _, _ in cur.moves(new)]
    at = seconds(6)
    steps = [Move("a", "op", at, tuple(bins[::2]), BITS, 0, 1), Move("b", "op", at, tuple(bins[1::2]), BITS, 0, 1)]
    router = Router(q, "op", cur, [Switch.between(cur, new, [(b, at) for b in bins])])
    cores = [ReplicaCore(q, "op", channels=[1]) for _ in range(2)]
    for p, c in enumerate(cores):
        c.moves = Moves(steps, partition=p)
    def twice(group, st):
        assert [m.id for m in group] == ["a", "b"]  # given at once
        first = st.select(steps[0].bins)  # another replica's copy of step a alone
        return cores[1].moves.install_many(cores[1], [(("a",), first), (("a", "b"), st)])

    got = _through(q, data, router, cores, twice)
    assert all(c.moves.idle for c in cores)
    assert_same_output(ref.outputs["out"], got)
