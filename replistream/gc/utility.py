"""Replica utility (Hwang §V-B, "Measuring the Utility of Each Replica").

The utility of a replica is its share of the data flow towards the
applications. It is computed from the applications upstream over the *live*
replica graph, in reverse topological order:

* ``utility(o) = 1`` for an application;
* ``utility(o) = sum(utility(S) for S in out(o))`` otherwise (the live output
  stream replicas of ``o``);
* for the live input stream replicas ``S_1..S_k`` of ``o`` on one input port,
  ``utility(S_i) = w(S_i) / sum_j w(S_j) * utility(o)``, where ``w`` is the
  duplicate filter's accumulated weight (``1/j`` for the j-th copy of each tuple).

Decisions where the paper is silent:

* **Each input port gets the whole utility of its replica.** A Join replica
  needs both inputs; the paper's formula is per group of stream replicas that
  "commonly feed" a replica, i.e. per port. So the input stream replicas on
  each port of ``o`` sum to ``utility(o)``.
* **All weights zero on a port** (nothing measured yet, or every copy arrived
  through dormant streams): the utility is split equally among that port's
  live stream replicas.
* Dormant and failed replicas and stream replicas have no utility (they are
  absent from the result); a live replica with no live output has utility 0.

>>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
>>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("f#0", "f", "b"),
...                  OperatorReplica("f#1", "f", "c"), OperatorReplica("app", "app", "d", "application")],
...                 [StreamReplica("entry#0", "f#0"), StreamReplica("entry#0", "f#1"),
...                  StreamReplica("f#0", "app", weight=3), StreamReplica("f#1", "app", weight=1)])
>>> u = utilities(snap)
>>> u.replicas["f#0"], u.streams["entry#0->f#1:0"], u.replicas["entry#0"]
(0.75, 0.25, 1.0)
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from .snapshot import Snapshot, StreamReplica

__all__ = ["Utilities", "utilities", "shares"]


@dataclass(frozen=True)
class Utilities:
    """Utilities of the live operator replicas (``replicas``, by label) and live
    stream replicas (``streams``, by id) of one snapshot.

    >>> Utilities({"app": 1.0}, {}).of(["x->app:0"])
    0.0
    """

    replicas: dict[str, float]
    streams: dict[str, float]

    def of(self, stream_ids: Iterable[str]) -> float:
        """Sum of the utilities of the given stream replicas (0 for those not live)."""
        get = self.streams.get
        return float(sum(get(s, 0.0) for s in stream_ids))


def shares(weights: list[float]) -> list[float]:
    """Each stream replica's share of its port: ``w_i / sum(w)``, equal shares when every weight is 0.

    >>> shares([3.0, 1.0]), shares([0.0, 0.0, 0.0])
    ([0.75, 0.25], [0.3333333333333333, 0.3333333333333333, 0.3333333333333333])
    """
    total = sum(weights)
    if total > 0:
        return [w / total for w in weights]
    return [1.0 / len(weights)] * len(weights) if weights else []


def utilities(snapshot: Snapshot) -> Utilities:
    """Utility of every live replica and live stream replica (Hwang §V-B), from the applications upstream.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"),
    ...                  OperatorReplica("a1", "a1", "b", "application"), OperatorReplica("a2", "a2", "b", "application")],
    ...                 [StreamReplica("entry#0", "a1"), StreamReplica("entry#0", "a2")])
    >>> utilities(snap).replicas["entry#0"]     # feeds two applications
    2.0
    """
    live = [r.label for r in snapshot.replicas if r.live]
    g = nx.DiGraph()
    g.add_nodes_from(live)
    g.add_edges_from((s.src, s.dst) for s in snapshot.streams if s.live)
    order = {label: i for i, label in enumerate(live)}
    rep_u: dict[str, float] = {}
    str_u: dict[str, float] = {}
    for label in reversed(list(nx.lexicographical_topological_sort(g, key=order.__getitem__))):
        r = snapshot.replica(label)
        if r.kind == "application":
            u = 1.0
        else:
            u = float(sum(str_u[s.id] for s in snapshot.out_streams(label)))
        rep_u[label] = u
        by_port: dict[int, list[StreamReplica]] = {}
        for s in snapshot.in_streams(label):
            by_port.setdefault(s.port, []).append(s)
        for group in by_port.values():
            for s, share in zip(group, shares([s.weight for s in group])):
                str_u[s.id] = share * u
    return Utilities(rep_u, str_u)
