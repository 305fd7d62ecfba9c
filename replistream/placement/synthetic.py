"""Synthetic queries and source locations for placement experiments and benchmarks.

:func:`random_query` builds a seeded random query DAG of Filters and Unions
(the operators whose placement matters here are only nodes and streams with
rates); :func:`random_sources` puts its sources on seeded random servers.

>>> q = random_query(20, n_sources=8, seed=1)
>>> len(q.operators), len(q.sources)
(20, 8)
>>> random_query(20, n_sources=8, seed=1).describe() == q.describe()
True
"""
from __future__ import annotations

import random

import numpy as np

from ..query import Query

__all__ = ["random_query", "random_sources", "random_selectivity"]

_SCHEMA = {"key": "i8", "x": "f8"}


def random_query(n_operators: int = 20, n_sources: int = 10, seed: int = 0, union_share: float = 0.4,
                 name: str | None = None) -> Query:
    """A random DAG of ``n_operators`` operators over ``n_sources`` sources (seeded, reproducible).

    Each operator is a Union of 2-3 existing streams (probability
    ``union_share``) or a Filter of one, preferring streams nobody consumes
    yet so that the DAG stays connected; every stream left unconsumed feeds
    an application.

    >>> q = random_query(5, n_sources=2, seed=3)
    >>> sorted(q.spec(n).kind for n in q.topological())[:3]
    ['operator', 'operator', 'operator']
    """
    if n_operators < 1 or n_sources < 1:
        raise ValueError("random_query needs at least one operator and one source")
    rng = random.Random(seed)
    q = Query(name or f"random{n_operators}x{n_sources}s{seed}")
    streams = [q.source(f"src_{i}", _SCHEMA, punctuate_every=1_000_000) for i in range(n_sources)]
    fresh = list(streams)  # not consumed yet
    for i in range(n_operators):
        union = len(streams) >= 2 and rng.random() < union_share
        want = rng.choice((2, 3)) if union else 1
        picks = []
        pool = fresh if fresh else streams
        while len(picks) < want:
            cand = rng.choice(pool if len(picks) < len(pool) else streams)
            if cand not in picks:
                picks.append(cand)
        for s in picks:
            if s in fresh:
                fresh.remove(s)
        if union:
            out = q.union(*picks, name=f"op_{i}")
        else:
            threshold = rng.random()
            out = picks[0].filter(lambda b, t=threshold: b["x"] > t, name=f"op_{i}")
        streams.append(out)
        fresh.append(out)
    for j, s in enumerate(fresh):
        s.sink(f"app_{j}")
    return q.build()


def random_sources(query: Query, servers, seed: int = 0) -> dict[str, str]:
    """Each source of ``query`` on a seeded random server.

    >>> from replistream.network import default_servers
    >>> random_sources(random_query(3, 2, seed=0), default_servers(5), seed=2) == random_sources(random_query(3, 2, seed=0), default_servers(5), seed=2)
    True
    """
    names = [getattr(s, "name", s) for s in servers]
    rng = np.random.default_rng(seed)
    return {src: names[int(rng.integers(len(names)))] for src in query.sources}


def random_selectivity(query: Query, seed: int = 0, low: float = 0.1, high: float = 1.0) -> dict[str, float]:
    """A seeded selectivity in ``[low, high)`` for every Filter (Unions pass everything).

    >>> s = random_selectivity(random_query(4, 2, seed=0), seed=0)
    >>> all(0.1 <= v < 1.0 for v in s.values())
    True
    """
    rng = np.random.default_rng(seed)
    out = {}
    for n in query.operators:
        if type(query.spec(n)).__name__ == "FilterSpec":
            out[n] = float(rng.uniform(low, high))
    return out
