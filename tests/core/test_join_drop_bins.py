"""A Join's side of a rescale step (replistream/replica/rescale.py): ``drop_bins`` forgets both
inputs' buffered tuples of the bins given away, and nothing else. A bin given away and taken back
within the window (a later rescale) must match as if it had never left: rows left behind would
pair twice."""
from __future__ import annotations

import numpy as np

from replistream.operators.base import bin_of
from replistream.operators.join import JoinLogic
from replistream.schema import Schema

BITS = 3
L = Schema({"k": "i8", "v": "i8"})


def _join():
    return JoinLogic("j", [L, L], window=1_000, left_key="k", right_key="k")


def _rows(ts, k, id0):
    n = len(ts)
    return L.from_columns({"ts": ts, "k": k, "v": np.arange(n)}, ids=np.arange(id0, id0 + n, dtype=np.uint64))


def _pairs(out):
    return sorted((int(r["ts"]), int(r["k_l"]), int(r["v_l"]), int(r["v_r"])) for o in out for r in o)


def test_a_bin_given_away_and_taken_back_pairs_as_if_it_never_left():
    rng = np.random.default_rng(4)
    left, right = _rows(np.arange(100, 300), rng.integers(0, 40, 200), 0), _rows(np.arange(100, 300), rng.integers(0, 40, 200), 1000)
    moved, stay = _join(), _join()
    for j in (moved, stay):
        j.process(0, left)
        j.process(1, right)
    hashes = moved.bin_keys(0, left)
    b = int(bin_of(hashes, BITS)[0])
    state = moved.checkpoint(BITS, [b])
    assert state.rows() > 0
    dropped = moved.drop_bins(BITS, [b])
    assert dropped == state.rows()
    assert moved.checkpoint(BITS, [b]).rows() == 0
    # the other bins untouched
    others = [x for x in range(1 << BITS) if x != b]
    assert moved.checkpoint(BITS, others).rows() == stay.checkpoint(BITS, others).rows()
    moved.install_bins(state, [b])  # (taken back, as a later rescale would)
    probe = _rows(np.arange(400, 500), rng.integers(0, 40, 100), 5000)
    assert _pairs(moved.process(1, probe)) == _pairs(stay.process(1, probe))
