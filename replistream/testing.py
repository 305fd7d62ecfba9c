"""Testing tools for replistream users and for replistream itself.

* :func:`run_reference` (the ideal, non-replicated run) and :func:`run_replicated`
  (every operator replicated in process, with crashes and hand-overs), re-exported
  from :mod:`replistream.engines`;
* sentinels that script events at a point of a source's input
  (:class:`KillReplica`, :class:`StopReplica`, :class:`KillServer`, :class:`Pause`, :class:`Call`,
  :class:`Revive`, :class:`AddReplica`, placed by event time with
  :class:`inject_at`), re-exported from :mod:`replistream.sources`;
* :func:`as_multiset`, :func:`multiset_diff`, :func:`assert_same_output`: compare
  outputs as multisets of (id, ts, values), bit for bit;
* :func:`chunked`, :func:`with_punctuations`: shape in-memory source data.

>>> from replistream import Query
>>> q = Query(); s = q.source("s", {"x": "i8"}, punctuate_every=4)
>>> _ = s.window(size=4, aggs={"n": "count"}).sink("counts")
>>> data = {"s": chunked([{"ts": t, "x": t} for t in range(12)], 5)}
>>> ref = run_reference(q.build(), data)
>>> rep = run_replicated(q, data, k=3, seed=1, crash=True)
>>> assert_same_output(ref.outputs["counts"], rep.outputs["counts"])
>>> rep.complete
True
"""
from __future__ import annotations

import random
from typing import Mapping, Sequence

import numpy as np

from .engines.inprocess import HarnessStats, ReplicaDivergence, run_replicated
from .engines.reference import run_reference
from .engines.result import as_multiset, multiset_diff
from .schema import Punctuation
from .sources import AddReplica, Call, KillReplica, KillServer, Pause, Revive, Sentinel, StopReplica, inject_at

__all__ = ["run_reference", "run_replicated", "as_multiset", "assert_same_output", "multiset_diff",
           "chunked", "with_punctuations", "HarnessStats", "Sentinel", "KillReplica", "StopReplica", "KillServer",
           "Pause", "Call", "Revive", "AddReplica", "ReplicaDivergence", "inject_at"]


# -- comparing outputs ----------------------------------------------------------

def assert_same_output(expected: np.ndarray, actual: np.ndarray, ordered: bool = False) -> None:
    """Raise ``AssertionError`` unless ``actual`` equals ``expected`` as a multiset
    (or, with ``ordered=True``, as a sequence), showing what is lost and what is extra.
    """
    if expected.dtype != actual.dtype:
        raise AssertionError(f"dtypes differ: expected {expected.dtype}, got {actual.dtype}")
    if ordered:
        if len(expected) == len(actual) and expected.tobytes() == actual.tobytes():
            return
        if _same_multiset(expected, actual):
            raise AssertionError("same tuples, different order")
    elif _same_multiset(expected, actual):
        return
    missing, extra = multiset_diff(expected, actual)
    if len(missing) or len(extra):
        want, got = as_multiset(expected), as_multiset(actual)
        dup = sum(n - want[k] for k, n in got.items() if k in want and n > want[k])
        raise AssertionError(
            f"output differs from reference: {len(missing)} lost, {len(extra)} extra "
            f"({dup} of them duplicates)\n  lost: {missing[:5].tolist()}\n  extra: {extra[:5].tolist()}")


def _same_multiset(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` hold the same rows, bit for bit, with the same multiplicities:
    both sorted by a 64-bit hash of each row's bytes and compared whole, in C. Equal rows have
    equal hashes, so equal multisets come out equal; the comparison is of the rows themselves,
    so different ones never do. Two different rows with one hash may leave equal multisets in
    different orders: then the rows are counted one by one (:func:`as_multiset`). Millions of
    rows take a second or two, where counting them takes minutes.

    >>> x = np.array([(2, 0.5), (1, 0.25), (2, 0.5)], dtype=[("ts", "i8"), ("v", "f8")])
    >>> _same_multiset(x, x[::-1].copy()), _same_multiset(x, x[:2].copy())
    (True, False)
    """
    if len(a) != len(b):
        return False
    if a.dtype.hasobject:
        return as_multiset(a) == as_multiset(b)
    if not len(a):
        return True

    def by_hash(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raw = np.ascontiguousarray(x).view(np.uint8).reshape(len(x), x.dtype.itemsize)
        pad = -x.dtype.itemsize % 8
        if pad:
            raw = np.hstack([raw, np.zeros((len(x), pad), dtype=np.uint8)])
        words = np.ascontiguousarray(raw).view(np.uint64)
        h = np.zeros(len(x), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for j in range(words.shape[1]):  # splitmix64's finaliser over each word in turn
                z = (h ^ words[:, j]) + np.uint64(0x9E3779B97F4A7C15)
                z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                h = z ^ (z >> np.uint64(31))
        order = np.argsort(h, kind="stable")
        return h[order], words[order]

    (ha, wa), (hb, wb) = by_hash(a), by_hash(b)
    if not np.array_equal(ha, hb):
        return False
    if np.array_equal(wa, wb):
        return True
    return as_multiset(a) == as_multiset(b)  # rows of one hash in different orders (a collision)


# -- shaping inputs ---------------------------------------------------------------

def chunked(records: Sequence[Mapping], size: int) -> list[list[Mapping]]:
    """Split a list of records into chunks of ``size`` (the batches a source delivers).

    >>> [len(c) for c in chunked([{}] * 5, 2)]
    [2, 2, 1]
    """
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [list(records[i:i + size]) for i in range(0, len(records), size)]


def with_punctuations(records: Sequence[Mapping], every: int, rng: random.Random | None = None,
                      max_chunk: int = 8) -> list:
    """Chunk time-ordered ``records`` at random sizes and insert explicit punctuations.

    After a chunk whose last timestamp is ``t``, a punctuation ``t - 1`` is
    inserted with probability ``1/every`` (never violating the contract for
    records sorted by ts).
    """
    rng = rng or random.Random(0)
    out: list = []
    i = 0
    last_p = None
    while i < len(records):
        n = rng.randint(1, max_chunk)
        chunk = list(records[i:i + n])
        i += n
        out.append(chunk)
        if i < len(records) and rng.random() < 1.0 / every:
            p = int(records[i]["ts"]) - 1
            if last_p is None or p > last_p:
                out.append(Punctuation(p))
                last_p = p
    return out
