"""The epoch edge a keyed operator forwards (#44: "overflow encountered in scalar multiply" at
keyed.py's forward_punctuation). The overflow came from END + 1 wrapping round; np.where dropped
that result, so no input gave a wrong edge. Checked against exact Python integers over the whole
int64 range (the boundaries, and random values), for scalars and arrays, with warnings as errors."""
import warnings

import numpy as np
import pytest

from replistream import END, Schema
from replistream.operators.base import NO_PUNCTUATION
from replistream.operators.keyed import KeyedCountLogic

EVERY = [1, 2, 7, 10, 1_000_000, 2**40 + 3, 2**62 + 1, END]


def exact(w: int, every: int) -> int:
    if every == 1 or w == END or w <= NO_PUNCTUATION + every:
        return w
    return (w + 1) // every * every - 1


def values(every: int) -> list[int]:
    rng = np.random.default_rng(every % 2**32)
    edges = [END, END - 1, END - every, END - every + 1, NO_PUNCTUATION, NO_PUNCTUATION + 1,
             NO_PUNCTUATION + every, NO_PUNCTUATION + every + 1, -1, 0, 1, every - 1, every, every + 1]
    edges = [v for v in edges if NO_PUNCTUATION <= v <= END]
    return edges + rng.integers(NO_PUNCTUATION, END, 200, dtype=np.int64, endpoint=True).tolist()


@pytest.mark.parametrize("every", EVERY)
def test_every_edge_is_exact_and_nothing_overflows(every):
    logic = KeyedCountLogic("c", [Schema({"k": "i8"})], by="k", every=every)
    ws = values(every)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow is a RuntimeWarning: it fails the test
        scalars = [logic.forward_punctuation(w) for w in ws]
        array = logic.forward_punctuation(np.array(ws, dtype=np.int64))
    want = [exact(w, every) for w in ws]
    assert scalars == want
    assert array.tolist() == want
    # an edge is the end of an epoch: one less than a multiple of every, at or below the watermark
    for w, e in zip(ws, want):
        assert e <= w and (e == w or (e + 1) % every == 0)
