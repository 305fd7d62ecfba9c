"""Garbage collection and revival per partition replica (issue #41 point 5; Hwang §V-B, §V-C).

A partitioned operator (``parallelism={op: p}``) runs as ``p`` partitions ``op.0 .. op.{p-1}``,
each with its own replicas ``op.P#R``: the replicas of one partition are copies of one another,
those of two partitions are not (each holds its own bins of keys). The collector and the revival
policy reason about *operators* whose replicas are copies, and about *input ports* each fed by one
upstream operator. :func:`partition_view` gives them a snapshot where that holds again:

* every partition is an operator of its own (``OperatorReplica.operator`` is ``"op.P"``): ``kmin``
  counts per partition, so garbage collection never takes a partition below ``kmin`` (never its
  last live replica), utility is computed per partition replica, and revival revives, replaces or
  creates replicas of the hindered replica's partition;
* an input port of a replica fed by a partitioned operator becomes one *input* per upstream
  partition, numbered ``port + n x P`` (``n``: the receiving operator's number of ports, ``P``: the
  upstream partition; port ``port`` itself for an unpartitioned upstream): a replica needs a live
  feeder from every upstream partition (each carries its own tuples), so losing all of one
  partition's streams makes the replica go with them (Algorithm 6's dependents), and each input
  gets the whole utility of its replica, as each port of a Join does (docs/gc.md).

The decisions made on the view are translated back (:meth:`PartitionView.discard`,
:meth:`PartitionView.event`, :meth:`PartitionView.stream_id`) before the engine applies them:
the stream replicas then carry their real ports and the replicas their operator's name. Without
partitioned replicas the view is the snapshot itself and every translation the identity.

>>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
>>> reps = [OperatorReplica("entry#0", "entry", "a", "entry")]
>>> reps += [OperatorReplica(f"w.{p}#{r}", "w", "b") for p in (0, 1) for r in (0, 1)]
>>> reps += [OperatorReplica("app", "app", "c", "application")]
>>> streams = [StreamReplica("entry#0", f"w.{p}#{r}") for p in (0, 1) for r in (0, 1)]
>>> streams += [StreamReplica(f"w.{p}#{r}", "app") for p in (0, 1) for r in (0, 1)]
>>> v = partition_view(Snapshot(reps, streams, kmin=1))
>>> v.snapshot.operators, v.snapshot.ports("app")
(['entry', 'w.0', 'w.1', 'app'], (0, 1))
>>> v.stream_id("w.1#0->app:1")
'w.1#0->app:0'
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from ..plan import label_group, replica_partition
from .garbage import Discard
from .revival import RevivalEvent
from .snapshot import OperatorReplica, Snapshot, StreamReplica

__all__ = ["PartitionView", "partition_view"]


def _split_id(sid: str) -> tuple[str, str, int]:
    head, _, port = sid.rpartition(":")
    src, _, dst = head.partition("->")
    return src, dst, int(port)


@dataclass(frozen=True)
class PartitionView:
    """A snapshot in which every partition of a partitioned operator is an operator and every
    (port, upstream partition) an input (``snapshot``), with the translations back to the
    deployment's own labels and ports (see the module doc).

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> s = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("app", "app", "b", "application")],
    ...              [StreamReplica("entry#0", "app")])
    >>> v = partition_view(s); v.snapshot is s, v.partitioned
    (True, False)
    """

    snapshot: Snapshot
    #: the receiving group's number of real input ports (a virtual input ``i`` is real port ``i % n``)
    n_ports: dict = field(default_factory=dict)
    #: group (``"op.P"``) -> its operator (``"op"``), for partitioned groups only
    node_of: dict = field(default_factory=dict)

    @property
    def partitioned(self) -> bool:
        """Whether any replica belongs to a partition (else the view is the snapshot itself)."""
        return bool(self.node_of)

    def port(self, dst: str, vport: int) -> int:
        """The real input port of ``dst`` that virtual input ``vport`` stands for."""
        n = self.n_ports.get(label_group(dst))
        return vport % n if n else vport

    def stream_id(self, vid: str) -> str:
        """The deployment's id of the stream replica the view calls ``vid``.

        >>> PartitionView(None, {"app": 2}, {"w.1": "w"}).stream_id("w.1#0->app:3")
        'w.1#0->app:1'
        """
        if not self.partitioned:
            return vid
        src, dst, vport = _split_id(vid)
        return f"{src}->{dst}:{self.port(dst, vport)}"

    def stream(self, s: StreamReplica) -> StreamReplica:
        """A stream replica of the view with its real port."""
        return replace(s, port=self.port(s.dst, s.port)) if self.partitioned else s

    def replica(self, r: OperatorReplica) -> OperatorReplica:
        """A replica of the view with its operator's own name (``"op"`` for ``"op.P"``)."""
        return replace(r, operator=self.node_of[r.operator]) if r.operator in self.node_of else r

    def discard(self, d: Discard) -> Discard:
        """An Algorithm 6 decision made on the view, with the deployment's stream ids."""
        if not self.partitioned:
            return d
        return replace(d, streams=tuple(self.stream_id(s) for s in d.streams))

    def event(self, e: RevivalEvent) -> RevivalEvent:
        """A revival decision made on the view, with the deployment's stream ids, ports and operators."""
        if not self.partitioned:
            return e
        ids = lambda xs: tuple(self.stream_id(x) for x in xs)  # noqa: E731
        return replace(e, revive_streams=ids(e.revive_streams), discard_streams=ids(e.discard_streams),
                       new_replicas=tuple(self.replica(r) for r in e.new_replicas),
                       new_streams=tuple(self.stream(s) for s in e.new_streams))


def partition_view(snapshot: Snapshot) -> PartitionView:
    """The view of ``snapshot`` in which garbage collection and revival work per partition
    replica (see the module doc); ``snapshot`` itself when no replica belongs to a partition.

    >>> from replistream.gc import collect_garbage
    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> reps = [OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("app", "app", "c", "application")]
    >>> reps += [OperatorReplica("w.0#0", "w", "b"), OperatorReplica("w.0#1", "w", "c"), OperatorReplica("w.1#0", "w", "d")]
    >>> streams = [StreamReplica("entry#0", r.label, latency_ms=10) for r in reps[2:]]
    >>> streams += [StreamReplica(r.label, "app", latency_ms=10) for r in reps[2:]]
    >>> v = partition_view(Snapshot(reps, streams, kmin=1, theta=0))
    >>> [v.discard(d).replicas for d in collect_garbage(v.snapshot).decisions]   # w.1#0 is its partition's last
    [('w.0#0',)]
    """
    reps = snapshot.replicas
    node_of = {}
    for r in reps:
        if replica_partition(r.label) is not None:
            node_of[label_group(r.label)] = r.operator
    if not node_of:
        return PartitionView(snapshot)
    n_ports: dict[str, int] = defaultdict(int)
    for s in snapshot.streams:
        g = label_group(s.dst)
        n_ports[g] = max(n_ports[g], s.port + 1)
    vreps = [replace(r, operator=label_group(r.label)) if replica_partition(r.label) is not None else r
             for r in reps]
    vstreams = [replace(s, port=s.port + n_ports[label_group(s.dst)] * (replica_partition(s.src) or 0))
                for s in snapshot.streams]
    view = Snapshot(vreps, vstreams, snapshot.kmin, snapshot.theta)
    return PartitionView(view, dict(n_ports), node_of)
