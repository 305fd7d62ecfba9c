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
        if as_multiset(expected) == as_multiset(actual):
            raise AssertionError("same tuples, different order")
    missing, extra = multiset_diff(expected, actual)
    if len(missing) or len(extra):
        dup = sum(max(0, n - as_multiset(expected).get(k, 0)) for k, n in as_multiset(actual).items()
                  if k in as_multiset(expected))
        raise AssertionError(
            f"output differs from reference: {len(missing)} lost, {len(extra)} extra "
            f"({dup} of them duplicates)\n  lost: {missing[:5].tolist()}\n  extra: {extra[:5].tolist()}")


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
