"""Issue #41: a feeder restored after its host was lost, with entry partitions, cuts the source
anew (a paced feed's pieces are cut by wall time, so they never fall where the lost host's did)
and still sends every record exactly once: the records some partition took are known from the
ranges each partition remembers (:class:`~replistream.operators.entry.TakenRows`), the others are
sent to a partition that stands before them (:meth:`Feeder._destination`).

Each case cuts a source at random, routes it through a real :class:`Feeder`'s split with the
entry partitions' logic run in process, stops each partition after a random prefix of what it was
sent (the host's loss), then resumes with a feeder that cuts the same source at other random
places. The records emitted, the late records and every partition's punctuation contract
(nothing below a punctuation it already passed on) must equal the unpartitioned entry point's run."""
from __future__ import annotations

import numpy as np
import pytest

from replistream.engines.ray.feeder import Feeder
from replistream.operators.entry import EntryLogic, TakenRows
from replistream.schema import ID, TS, Punctuation, Schema

SCHEMA = Schema({"x": "i8"})
PARTS = 3


def entry() -> EntryLogic:
    return EntryLogic("s", SCHEMA, punctuate_every=10, max_disorder=5, on_malformed="dead_letter")


def source(rng, n: int = 3000) -> dict:
    """``n`` rows, ts rising with disorder up to 20 (some rows late against max_disorder 5)."""
    ts = np.arange(n) * 2 + rng.integers(-20, 1, n)
    return {"ts": ts, "x": np.arange(n)}


def cuts(rng, data: dict, most: int) -> list[dict]:
    n, out, a = len(data["ts"]), [], 0
    while a < n:
        b = min(n, a + int(rng.integers(1, most + 1)))
        out.append({k: v[a:b] for k, v in data.items()})
        a = b
    return out


def feeder(parts=None) -> tuple[Feeder, list[list]]:
    """A feeder whose sends are recorded per partition (no actors)."""
    f = Feeder(None, lambda ts0: None, lambda s: None, lambda lb, why: None, entry_partitions=PARTS,
               entry_of=lambda src: entry())
    sent: list[list] = [[] for _ in range(PARTS)]
    f._send_to = lambda group, src, seq, chunk, start: sent[int(group.rpartition(".")[2])].append((seq, chunk, start))
    f._settle = lambda *a: None
    f.t0, f.seqs = 0.0, {"s": 0}
    f._split(["s"], parts)
    return f, sent


class Partition:
    """One entry partition's furthest replica: its entry logic and what it passed on."""

    def __init__(self):
        self.logic, self.expected = entry(), 0
        self.ids: list[int] = []
        self.violations: list[tuple[int, int]] = []
        self.passed = -(2 ** 63)

    def take(self, seq: int, chunk, start) -> None:
        assert seq == self.expected, (seq, self.expected)  # a partition's chunks arrive numbered in order
        self.expected += 1
        items = self.logic.close() if chunk is None else self.logic.push(chunk, start=start)
        for it in items:
            if isinstance(it, Punctuation):
                self.passed = max(self.passed, it.p)
            else:
                self.violations += [(int(t), self.passed) for t in it[TS] if t <= self.passed]
                self.ids += it[ID].tolist()

    def position(self) -> dict:
        e = self.logic
        return {"seq": self.expected, "rows": e.seq, "closed": e.closed, "taken": list(e.taken), "complete": True,
                "punct": int(e.position().punct)}


def run_resumed(seed: int, destination=None) -> tuple[list[Partition], EntryLogic]:
    rng = np.random.default_rng(seed)
    data = source(rng)
    ref = entry()
    ref.push(data)
    ref.close()
    first, sent = feeder()
    for chunk in cuts(rng, data, 40):  # the lost host's cuts
        first._send("s", chunk)
    parts = [Partition() for _ in range(PARTS)]
    for p, items in zip(parts, sent):  # each took a prefix of what it was sent, the host then lost
        for item in items[:int(rng.integers(0, len(items) // 2 + 1))]:
            p.take(*item)
    again, sent = feeder([{"s": p.position()} for p in parts])
    if destination is not None:
        again._destination = destination.__get__(again)
    for chunk in cuts(rng, data, 25):  # cut anew
        again._send("s", chunk)
    again._send("s", None)
    for p, items in zip(parts, sent):
        for item in items:
            p.take(*item)
    return parts, ref


@pytest.mark.parametrize("seed", range(6))
def test_a_resumed_feed_cut_anew_sends_every_record_once(seed):
    parts, ref = run_resumed(seed)
    ids = [i for p in parts for i in p.ids]
    want = entry().push({"ts": source(np.random.default_rng(seed))["ts"], "x": np.zeros(3000, "i8")})[0][ID]
    assert len(ids) == len(set(ids)) == len(want)
    assert sorted(ids) == sorted(want.tolist())
    assert sum(p.logic.late_count for p in parts) == ref.late_count > 0
    assert all(not p.violations for p in parts), [p.violations[:3] for p in parts]
    assert all(p.logic.closed for p in parts)


def test_negative_control_records_sent_to_the_partition_they_are_routed_to_break_its_punctuation():
    """Without :meth:`Feeder._destination` (records no partition took sent wherever the new cut
    routes them), some go to a partition that already passed on a punctuation above them."""
    broken = 0
    for seed in range(6):
        parts, _ = run_resumed(seed, destination=lambda self, part, src, item, start: part)
        broken += sum(len(p.violations) for p in parts)
    assert broken > 0


def test_taken_rows_agree_with_what_the_partitions_took():
    """Every record is classified as taken exactly when some partition took it, whatever the cuts."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        n = 2000
        bounds = np.unique(np.r_[0, rng.integers(1, n, 80), n])
        chunks = list(zip(bounds[:-1], bounds[1:]))
        took = np.zeros(n, bool)
        positions = []
        for i in range(PARTS):  # chunks go round-robin; each partition took a prefix of its own
            mine = chunks[i::PARTS]
            k = int(rng.integers(0, len(mine) + 1))
            for a, b in mine[:k]:
                took[a:b] = True
            positions.append({"rows": int(mine[k - 1][1]) if k else 0, "taken": [tuple(map(int, c)) for c in mine[:k]]})
        got = np.zeros(n, bool)
        for lo, hi, t in TakenRows.of(positions).segments(0, n):
            got[lo:hi] = t
        assert (got == took).all(), seed


def test_a_partition_that_forgot_ranges_above_the_floor_is_refused():
    with pytest.raises(RuntimeError, match="entry partition 1 remembers only"):
        TakenRows.of([{"rows": 10, "taken": [(0, 10)], "complete": True},
                      {"rows": 90, "taken": [(50, 90)], "complete": False}])
