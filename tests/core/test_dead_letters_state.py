"""Dead letters are state (docs/design.md, decisions 7 and 9; issue 28, point 4).

A replica built from a checkpoint skips every tuple the checkpoint reflects, so it would never set
aside what its peer set aside among them: the checkpoint carries the peer's dead letters and the
new replica reports them as its own, each set-aside tuple once. These tests take checkpoints of a
keyed join whose predicate raises on a seeded seventh of the pairs (its letters are the joined
tuples), move them whole, through bytes, in the shape of an older replistream, in binned steps
from one peer and then another (Megaphone §3.3), and into a dormant copy (Del Monte 2017); every
time the receiver ends with exactly the ideal run's letters.
"""
from __future__ import annotations

import dataclasses
import pickle
from collections import Counter

import numpy as np
import pytest

from replistream import Punctuation, Query
from replistream.errors import DeadLetter
from replistream.operators.keyed import KeyedCount
from replistream.replica import ReplicaCheckpoint, ReplicaCore, StagedReplica
from replistream.replica.dormant import DormantReplica
from replistream.replica.transfer import plan_transfer
from replistream.sources import source_streams
from replistream.testing import chunked, run_reference


def predicate(left, right):
    """Keeps pairs of equal parity; raises on pairs whose sum is a multiple of 7."""
    if ((left["x"] + right["y"]) % 7 == 0).any():
        raise ValueError("sum divisible by 7")
    return (left["x"] - right["y"]) % 2 == 0


def join_query() -> Query:
    q = Query("letters")
    l = q.source("l", {"key": "i8", "x": "i8"}, punctuate_every=10)
    r = q.source("r", {"key": "i8", "y": "i8"}, punctuate_every=10)
    l.join(r, window=20, on="key", predicate=predicate, name="j").sink("out")
    return q.build()


def join_inputs(seed: int = 1, n: int = 200) -> dict:
    rng = np.random.default_rng(seed)

    def recs(field):
        ts = np.sort(rng.integers(0, 400, n))
        return [{"ts": int(t), "key": int(rng.integers(0, 8)), field: int(rng.integers(0, 100))} for t in ts]

    return {"l": chunked(recs("x"), 4), "r": chunked(recs("y"), 4)}


def join_items(q: Query, inputs: dict, seed: int = 2) -> list[tuple[int, object]]:
    """The entry points' output of both sources, interleaved at random (seeded): (port, item)."""
    streams, _ = source_streams(q, inputs)
    rng = np.random.default_rng(seed)
    cursors, out = [0, 0], []
    per_port = [streams["l"], streams["r"]]
    while any(c < len(s) for c, s in zip(cursors, per_port)):
        open_ = [p for p in (0, 1) if cursors[p] < len(per_port[p])]
        p = open_[int(rng.integers(0, len(open_)))]
        out.append((p, per_port[p][cursors[p]]))
        cursors[p] += 1
    return out


def keys(letters) -> Counter:
    """Set-aside tuples as a multiset of (where, reason, id)."""
    return Counter((d.where, d.reason, int(i)) for d in letters for i in d.batch["id"])


@pytest.fixture(scope="module")
def case():
    q, inputs = join_query(), join_inputs()
    expected = keys(run_reference(q, inputs).dead_letters)
    assert sum(expected.values()) > 20, "the predicate raises on too few pairs: a vacuous case"
    assert max(expected.values()) == 1
    return q, join_items(q, inputs), expected


def test_a_replica_built_from_a_checkpoint_reports_its_peers_dead_letters(case):
    q, items, expected = case
    peer = ReplicaCore(q, "j", channels=[1, 1], retain=True)
    half = len(items) // 2
    for port, it in items[:half]:
        peer.process(port, 0, it)
    ck = ReplicaCheckpoint.from_bytes(peer.checkpoint().to_bytes())
    assert keys(ck.dead_letters) == keys(peer.dead_letters())
    before = keys(ck.dead_letters)
    assert 0 < sum(before.values()) < sum(expected.values())
    assert ck.summary()["dead_letters"] == sum(before.values())
    new = ReplicaCore.from_checkpoint(q, ck, channels=[1, 1])
    assert keys(new.dead_letters()) == before
    for port, it in items:  # a replay of everything from the start: the checkpoint's part is dropped
        new.process(port, 0, it)
    for port, it in items[half:]:
        peer.process(port, 0, it)
    assert new.logic.watermark == peer.logic.watermark
    assert keys(new.dead_letters()) == expected == keys(peer.dead_letters())
    # the new replica set aside only what came after the checkpoint: without the letters it restored,
    # the ones before would be lost
    assert not keys(new.logic.dead_letters) & before
    assert keys(new.logic.dead_letters) + before == expected


def test_letters_survive_a_chain_of_hand_overs_each_once(case):
    q, items, expected = case
    cuts = [len(items) // 4, len(items) // 2, 3 * len(items) // 4]
    core = ReplicaCore(q, "j", channels=[1, 1], retain=True)
    done = 0
    for cut in cuts:
        for port, it in items[done:cut]:
            core.process(port, 0, it)
        core = ReplicaCore.from_checkpoint(q, ReplicaCheckpoint.from_bytes(core.checkpoint().to_bytes()),
                                           channels=[1, 1])
        done = cut
    for port, it in items:
        core.process(port, 0, it)
    letters = core.dead_letters()
    assert keys(letters) == expected
    assert [(d.where, d.reason) for d in letters] == [("j", "predicate raised ValueError: sum divisible by 7")]


def test_a_checkpoint_pickled_before_dead_letters_existed_loads_with_none(case):
    q, items, _ = case
    core = ReplicaCore(q, "j", channels=[1, 1], retain=True)
    for port, it in items[:len(items) // 3]:
        core.process(port, 0, it)
    ck = core.checkpoint()
    assert ck.dead_letters
    old = pickle.dumps(ck, protocol=5)
    state = dict(ck.__dict__)
    del state["dead_letters"]
    legacy = ReplicaCheckpoint.__new__(ReplicaCheckpoint)
    legacy.__dict__.update(state)  # what an older replistream pickled: no such attribute
    loaded = ReplicaCheckpoint.from_bytes(pickle.dumps(legacy, protocol=5))
    assert loaded.dead_letters == [] and loaded.version == ck.version
    restored = ReplicaCore.from_checkpoint(q, loaded, channels=[1, 1])
    assert restored.dead_letters() == []
    assert keys(ReplicaCheckpoint.from_bytes(old).dead_letters) == keys(ck.dead_letters)


def test_restored_letters_merge_with_the_replicas_own_by_id():
    s = Query()
    src = s.source("s", {"x": "i8"})
    src.filter(lambda b: b["x"] > 0, name="f").sink("out")
    q = s.build()
    core = ReplicaCore(q, "f", channels=[1])
    b = np.zeros(3, dtype=[("ts", "i8"), ("id", "u8"), ("x", "i8")])
    b["ts"], b["id"] = [1, 2, 3], [7, 8, 9]
    core.restore_letters([DeadLetter("f", "bad", b[:2])])
    core.restore_letters([DeadLetter("f", "bad", b[1:]), DeadLetter("f", "worse", b[:1])])
    assert keys(core.dead_letters()) == Counter({("f", "bad", 7): 1, ("f", "bad", 8): 1, ("f", "bad", 9): 1,
                                                 ("f", "worse", 7): 1})


def run_staged(q, items, steps_from, bits=2, strip_after_first=False):
    """Two full peers A and B process ``items``; a StagedReplica receives ``2**bits`` bins one step
    at a time, step ``i`` taken right after the punctuation numbered ``steps_from[i][1]`` by peer
    ``steps_from[i][0]`` ("A" or "B"; A stops at its last step, as if it died). The receiver gets
    every item on its own channels, eight items behind the peers. ``strip_after_first`` drops the
    letters of every step after the first: the negative control."""
    peers = {"A": ReplicaCore(q, "j", channels=[1, 1], retain=True),
             "B": ReplicaCore(q, "j", channels=[1, 1], retain=True)}
    last_a = max(i for i, (who, _) in enumerate(steps_from) if who == "A")
    recv = StagedReplica(q, "j", channels=[1, 1], bits=bits)
    plan = plan_transfer("fluid", bits)
    assert len(plan) == len(steps_from)
    step, puncts, lag = 0, 0, 8
    for n, (port, it) in enumerate(items):
        for who, core in peers.items():
            if who == "A" and step > last_a:
                continue  # A died after its last step
            core.process(port, 0, it)
        if isinstance(it, Punctuation):
            puncts += 1
            while step < len(plan) and steps_from[step][1] <= puncts:
                ck = peers[steps_from[step][0]].checkpoint(bits, plan[step])
                ck = ReplicaCheckpoint.from_bytes(ck.to_bytes())
                if strip_after_first and step > 0:
                    ck = dataclasses.replace(ck, dead_letters=[])
                recv.install_step(ck, plan[step])
                step += 1
        if n >= lag:
            recv.process(*_delivery(items[n - lag]))
    for n in range(max(0, len(items) - lag), len(items)):
        recv.process(*_delivery(items[n]))
    assert step == len(plan) and recv.complete
    return recv, peers


def _delivery(item):
    port, it = item
    return port, 0, it


@pytest.mark.parametrize("steps_from", [
    [("A", 3), ("A", 8), ("A", 14), ("A", 20)],  # one peer, steps spread over the run
    [("A", 3), ("A", 6), ("B", 15), ("B", 22)],  # A dies after step 2: the transfer restarts from B
    [("A", 2), ("B", 2), ("B", 30), ("B", 31)],
])
def test_a_staged_transfer_in_bins_carries_the_letters_once(case, steps_from):
    q, items, expected = case
    recv, peers = run_staged(q, items, steps_from)
    letters = recv.core.dead_letters()
    assert keys(letters) == expected == keys(peers["B"].dead_letters())
    assert keys(recv.dead_letters()) == expected
    assert [(d.where, d.count) for d in letters] == [("j", sum(expected.values()))]  # each tuple once


def test_letters_only_in_the_first_step_would_lose_some(case):
    """The negative control: the peer keeps processing between steps, so the letters of a bin's
    tuples it applies before that bin's step come only with later steps."""
    q, items, expected = case
    recv, _ = run_staged(q, items, [("A", 3), ("A", 8), ("A", 14), ("A", 20)], strip_after_first=True)
    got = keys(recv.core.dead_letters())
    assert got < expected


def test_a_dormant_replica_revives_with_the_live_replicas_letters():
    """A keyed count (no user function to raise) holding letters it was handed over, some before the
    dormant copy was made, some after its refresh: the revived replica reports all of them."""
    q = Query("dormant")
    q.source("s", {"k": "i8"}, punctuate_every=4).apply(KeyedCount(by="k", bits=3), name="c").sink("out")
    q = q.build()
    rng = np.random.default_rng(7)
    streams, _ = source_streams(q, {"s": [{"ts": t, "k": int(rng.integers(0, 6))} for t in range(120)]})
    items = streams["s"]

    def letter(ids):
        b = np.zeros(len(ids), dtype=[("ts", "i8"), ("id", "u8"), ("k", "i8")])
        b["id"] = ids
        return DeadLetter("upstream", "set aside", b)

    live = ReplicaCore(q, "c", channels=[1], retain=True)
    live.restore_letters([letter([1, 2])])
    third = len(items) // 3
    for it in items[:third]:
        live.process(0, 0, it)
    dormant = DormantReplica(q, live.checkpoint(3), live.logic.version())
    live.restore_letters([letter([2, 3])])
    for it in items[third:2 * third]:
        live.process(0, 0, it)
    ck, bins, v = live.delta_checkpoint(dormant.version)
    dormant.refresh(ck, bins, v)
    live.restore_letters([letter([4])])
    for it in items[2 * third:]:
        live.process(0, 0, it)
    ck, bins, v = live.delta_checkpoint(dormant.version)
    core = dormant.revive(ck, bins, v, channels=[1])
    assert keys(core.dead_letters()) == keys(live.dead_letters()) == Counter(
        {("upstream", "set aside", i): 1 for i in (1, 2, 3, 4)})
