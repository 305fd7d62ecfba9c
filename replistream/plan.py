"""The physical plan: which replicas run where, and which stream replicas join them (Hwang §II-B).

A *logical* query (:class:`~replistream.query.Query`) becomes a *physical*
plan once a placement says on which servers each node runs:

* a *replica group* per node: ``"entry"`` (one group hosts the entry points
  of every source, as each engine runs them), one per operator, one per
  application (one replica, or several on Ray: ``deploy(..., app_replicas=)``);
* a :class:`ReplicaId` per replica, labelled ``"entry#0"``, ``"join#1"`` or,
  for an application, its name (further replicas ``"app#1"``, ...);
* a :class:`StreamEdge` per *stream replica*: every replica of an upstream
  group feeds every replica of each downstream node, on the input port the
  query gives, as the ``channel``-th input of that port (the upstream
  replica's index).

Every engine (in-process, Ray, simulator), the garbage collector's snapshots
(:mod:`replistream.gc`) and placement (:mod:`replistream.placement`) read
this one description instead of building their own.

>>> from replistream import Query
>>> q = Query(); s = q.source("s", {"x": "i8"})
>>> s.filter(lambda b: b["x"] > 0, name="f").sink("app")
'app'
>>> plan = PhysicalPlan(q.build(), {"entry": ["a", "b"], "f": ["b", "c"], "app": ["c"]})
>>> [r.label for r in plan.replicas("f")], plan.channels("f"), plan.server("f#1")
(['f#0', 'f#1'], [2], 'c')
>>> [e.id for e in plan.streams()][:2]
['entry#0->f#0:0', 'entry#0->f#1:0']
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ENTRY", "ReplicaId", "StreamEdge", "PhysicalPlan", "group_of", "replica_index", "is_stateful"]

#: Name of the replica group that hosts the entry points of every source.
ENTRY = "entry"

#: Spec classes whose replicas hold state a new replica must be handed (docs/handover.md).
STATEFUL_SPECS = ("JoinSpec", "TimeWindowSpec", "CountWindowSpec", "CustomSpec")


def group_of(query, node: str) -> str:
    """The replica group producing ``node``'s stream: :data:`ENTRY` for a source, else ``node``.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.sink("app")
    >>> group_of(q, "s"), group_of(q, "app")
    ('entry', 'app')
    """
    return ENTRY if query.spec(node).kind == "source" else node


def is_stateful(query, node: str) -> bool:
    """Whether a new replica of ``node`` needs a peer's state (Join, Aggregates, user operators).

    A node a running change wrapped (:mod:`replistream.replica.changes`) counts as what it wraps.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"}); _ = s.window(size=5, name="w").sink("app")
    >>> is_stateful(q, "w"), is_stateful(q, "app")
    (True, False)
    """
    spec = query.spec(node)
    inner = getattr(spec, "inner", None)
    while inner is not None:  # a change wraps the spec it changes
        spec, inner = inner, getattr(inner, "inner", None)
    return type(spec).__name__ in STATEFUL_SPECS


def replica_index(label: str) -> int | None:
    """The replica number in a label ``"op#3"`` (None for an application's label).

    >>> replica_index("join#12"), replica_index("alerts")
    (12, None)
    """
    head, sep, tail = label.rpartition("#")
    return int(tail) if sep and tail.isdigit() else None


def label_group(label: str) -> str:
    """The copies a replica label belongs to: ``"agg.1"`` for ``"agg.1#0"`` (partition 1 of a
    partitioned operator), ``"join"`` for ``"join#2"``, an application's label itself. Replicas
    of one group are copies of one another (each processes the same input); a node's name never
    holds a dot or a ``#``.

    >>> label_group("agg.1#0"), label_group("join#2"), label_group("alerts")
    ('agg.1', 'join', 'alerts')
    """
    head, sep, tail = label.rpartition("#")
    return head if sep and tail.isdigit() else label


def replica_partition(label: str) -> int | None:
    """The partition of a replica label (``"agg.1#0"``: 1), None for an unpartitioned operator's.

    >>> replica_partition("agg.1#0"), replica_partition("join#2"), replica_partition("entry#0")
    (1, None, None)
    """
    head, sep, tail = label_group(label).rpartition(".")
    return int(tail) if sep and head and tail.isdigit() else None


@dataclass(frozen=True, order=True)
class ReplicaId:
    """One replica: its group (``node``: an operator, :data:`ENTRY`, or an application) and index.

    >>> ReplicaId("join", 1).label, ReplicaId("alerts", 0, application=True).label
    ('join#1', 'alerts')
    """

    node: str
    index: int
    application: bool = False
    #: the partition of a partitioned operator (``parallelism=``, issue #41), else None
    partition: int | None = None

    @property
    def label(self) -> str:
        """``"node#index"``; an application's first replica is labelled by its name, its further
        ones (``deploy(..., app_replicas=)``) ``"app#1"``, ``"app#2"``, ...; replica ``index`` of
        partition ``P`` of a partitioned operator ``"node.P#index"``.

        >>> ReplicaId("alerts", 1, application=True).label, ReplicaId("agg", 0, partition=1).label
        ('alerts#1', 'agg.1#0')
        """
        if self.partition is not None:  # a partition's replicas, an application's too: "out.1#0"
            return f"{self.node}.{self.partition}#{self.index}"
        if self.application:
            return self.node if self.index == 0 else f"{self.node}#{self.index}"
        return f"{self.node}#{self.index}"

    @property
    def group(self) -> str:
        """The replicas that are copies of one another: ``node``, or ``"node.P"`` for a partition.

        >>> ReplicaId("agg", 0, partition=1).group, ReplicaId("agg", 0).group
        ('agg.1', 'agg')
        """
        return self.node if self.partition is None else f"{self.node}.{self.partition}"

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class StreamEdge:
    """One stream replica: ``src``'s output ``stream`` into input ``port`` of ``dst``, as its
    ``channel``-th input there (the duplicate filter's channel).

    >>> e = StreamEdge(ReplicaId("entry", 1), ReplicaId("join", 0), 1, "pings", 1)
    >>> e.id
    'entry#1->join#0:1'
    """

    src: ReplicaId
    dst: ReplicaId
    port: int
    stream: str
    channel: int

    @property
    def id(self) -> str:
        """``"src->dst:port"``, the id :class:`~replistream.gc.StreamReplica` uses too."""
        return f"{self.src.label}->{self.dst.label}:{self.port}"


class PhysicalPlan:
    """Replicas of every node on their servers, and the stream replicas between them.

    ``placement``: ``{node: [server, ...]}``, with :data:`ENTRY` for the entry
    points and one server per application replica; replica ``i`` of a node runs on
    ``placement[node][i]``. Checked on construction (a ``ValueError`` names
    the node): every operator, the entry points and every application are
    placed, nothing else is, a node's replicas are on distinct servers, an
    application has at least one; with ``k``, every operator and the entry
    points have exactly ``k`` replicas; with ``servers``, only those servers
    are used.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.sink("app")
    >>> PhysicalPlan(q.build(), {"entry": ["a", "a"], "app": ["b"]})
    Traceback (most recent call last):
    ...
    ValueError: placement puts two replicas of 'entry' on one server: ['a', 'a'] (a node's replicas need distinct servers)
    """

    def __init__(self, query, placement: Mapping[str, Sequence[str]], *, k: int | None = None,
                 servers: Sequence[str] | None = None, parallelism: Mapping[str, int] | None = None,
                 bits: int | None = None, keep_single: bool = False, entry_partitions: int | None = None,
                 applications: bool = False):
        from .partition import DEFAULT_BITS, check_parallelism, parse_partition_label

        self.query = query
        self.bits = DEFAULT_BITS if bits is None else int(bits)
        #: the entry points' partitions (``parallelism={"entry": p}``, issue #41): 1, unpartitioned
        #: (``entry#R``), or ``p > 1`` partitions of ``k`` replicas each (``entry.P#R``), every
        #: partition on the entry points' servers
        self.entry_partitions = int(entry_partitions or 1)
        if entry_partitions is not None and self.entry_partitions < 1:
            raise ValueError(f"entry_partitions must be >= 1, got {entry_partitions}")
        #: ``{operator: p}`` for the partitioned operators (p >= 2), checked (:func:`~replistream.partition.check_parallelism`;
        #: with ``applications``, partitioned applications too: ``k`` replicas per partition, ``"out.P#R"``)
        self.parallelism: dict[str, int] = check_parallelism(query, parallelism, self.bits, keep_single, applications)
        nodes = [ENTRY, *query.operators, *query.sinks]
        known = set(nodes)
        per_part: dict[str, dict[int, list[str]]] = {}
        for node, where in placement.items():
            base, part = parse_partition_label(node)
            if part is not None and base in self.parallelism:
                if part >= self.parallelism[base]:
                    raise ValueError(f"placement names {node!r}, but {base!r} has {self.parallelism[base]} "
                                     f"partitions (0..{self.parallelism[base] - 1})")
                per_part.setdefault(base, {})[part] = where
            elif node not in known:
                raise ValueError(f"placement names {node!r}, which is not an operator, application or "
                                 f"{ENTRY!r} of query {query.name!r}")
            if isinstance(where, str):
                raise ValueError(f"placement of {node!r} must be a list of servers, got the string {where!r}")
            if servers is not None:
                for s in where:
                    if s not in servers:
                        raise ValueError(f"placement puts {node!r} on unknown server {s!r}")
            if len(set(where)) != len(where):
                raise ValueError(f"placement puts two replicas of {node!r} on one server: {list(where)} "
                                 f"(a node's replicas need distinct servers)")
        for node in [ENTRY, *query.operators]:
            where = placement.get(node)
            if node in self.parallelism and where is None and len(per_part.get(node, {})) == self.parallelism[node]:
                continue  # every partition placed on its own
            if not where or (k is not None and len(where) != k):
                want = f"exactly k={k} distinct servers" if k is not None else "at least one server"
                raise ValueError(f"placement must give {node!r} {want}, got {None if where is None else list(where)}")
        for node, parts in per_part.items():
            for part, where in parts.items():
                if not where or (k is not None and len(where) != k):
                    want = f"exactly k={k} distinct servers" if k is not None else "at least one server"
                    raise ValueError(f"placement must give {node}.{part} {want}, got {list(where)}")
        for node in query.sinks:
            where = placement.get(node)
            if node in self.parallelism and (where or len(per_part.get(node, {})) == self.parallelism[node]):
                if where and k is not None and len(where) != k and len(per_part.get(node, {})) < self.parallelism[node]:
                    raise ValueError(f"placement must give the partitioned application {node!r} exactly k={k} distinct "
                                     f"servers (each partition runs k replicas), got {list(where)}")
                continue
            if not where:
                raise ValueError(f"placement must give application {node!r} at least one server, "
                                 f"got {None if where is None else list(where)}")
        self.placement: dict[str, list[str]] = {n: list(placement[n]) for n in nodes if n in placement}
        #: per partitioned operator, the servers of each partition's replicas (``placement["op.P"]``,
        #: else ``placement["op"]`` for every partition)
        self.partition_placement: dict[str, list[list[str]]] = {
            n: [list(per_part.get(n, {}).get(i, placement.get(n, ()))) for i in range(p)]
            for n, p in self.parallelism.items()}
        self.nodes = nodes
        self._replicas: dict[str, list[ReplicaId]] = {}
        self._server: dict[str, str] = {}
        for n in nodes:
            if n == ENTRY and self.entry_partitions > 1:
                reps = [ReplicaId(n, i, False, part) for part in range(self.entry_partitions)
                        for i in range(len(self.placement[n]))]
                for r in reps:
                    self._server[r.label] = self.placement[n][r.index]
            elif n in self.parallelism:
                reps = [ReplicaId(n, i, n in query.sinks, part) for part, where in enumerate(self.partition_placement[n])
                        for i in range(len(where))]
                for r in reps:
                    self._server[r.label] = self.partition_placement[n][r.partition][r.index]
            else:
                reps = [ReplicaId(n, i, n in query.sinks) for i in range(len(self.placement[n]))]
                for r in reps:
                    self._server[r.label] = self.placement[n][r.index]
            self._replicas[n] = reps
        #: each replica's position among its node's replicas: its channel at every receiver
        self._position = {r.label: i for n in nodes for i, r in enumerate(self._replicas[n])}

    def require_one_replica_per_application(self, engine: str) -> None:
        """Raise ``ValueError`` if some application has several replicas (``engine`` runs one each;
        application replicas run on Ray).

        >>> from replistream import Query
        >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.sink("app")
        >>> PhysicalPlan(q.build(), {"entry": ["a"], "app": ["a", "b"]}).require_one_replica_per_application("the simulator")
        Traceback (most recent call last):
        ...
        ValueError: the simulator runs one replica per application: placement gives 'app' 2 servers (exactly one server per application here; application replicas run on Ray)
        """
        for app in self.query.sinks:
            if app in self.parallelism:
                continue  # a partitioned application runs k replicas per partition, like an operator
            n = len(self.placement[app])
            if n != 1:
                raise ValueError(f"{engine} runs one replica per application: placement gives {app!r} {n} servers "
                                 f"(exactly one server per application here; application replicas run on Ray)")

    # -- replicas ------------------------------------------------------------------------
    def replicas(self, node: str | None = None) -> list[ReplicaId]:
        """The replicas of ``node`` (a group name; a source's name means :data:`ENTRY`; ``"op.P"``
        one partition of a partitioned operator; a partitioned operator's name every partition's,
        partition by partition), or of every node."""
        if node is None:
            return [r for n in self.nodes for r in self._replicas[n]]
        if node not in self._replicas and not self.query.has_node(node):
            from .partition import parse_partition_label

            base, part = parse_partition_label(node)
            if part is not None and base in self.parallelism and part < self.parallelism[base]:
                return [r for r in self._replicas[base] if r.partition == part]
            if part is not None and base == ENTRY and part < self.entry_partitions:
                return [r for r in self._replicas[base] if r.partition == part]
        return list(self._replicas[self.group(node)])

    def position(self, replica) -> int:
        """A replica's position among its node's replicas (partition by partition): its channel
        at every downstream duplicate filter (:attr:`StreamEdge.channel`)."""
        return self._position[replica.label if isinstance(replica, ReplicaId) else replica]

    def partitions(self, node: str) -> int:
        """How many partitions ``node`` runs as (1: not partitioned).

        >>> from replistream import Query
        >>> q = Query(); s = q.source("s", {"k": "i8"}); _ = s.window(10, by="k", name="w").sink("app")
        >>> plan = PhysicalPlan(q.build(), {"entry": ["a", "b"], "w": ["a", "b"], "app": ["a"]}, parallelism={"w": 2})
        >>> plan.partitions("w"), [r.label for r in plan.replicas("w")], plan.channel_groups("app")
        (2, ['w.0#0', 'w.0#1', 'w.1#0', 'w.1#1'], [[0, 0, 1, 1]])
        >>> plan = PhysicalPlan(q.build(), {"entry": ["a", "b"], "w": ["a"], "app": ["a"]}, entry_partitions=2)
        >>> plan.partitions("entry"), [r.label for r in plan.replicas("entry")], plan.channel_groups("w")
        (2, ['entry.0#0', 'entry.0#1', 'entry.1#0', 'entry.1#1'], [[0, 0, 1, 1]])
        """
        if node == ENTRY:
            return self.entry_partitions
        return self.parallelism.get(node, 1)

    def channel_groups(self, node: str) -> list[list[int] | None]:
        """Per input port of ``node``: None when its upstream is not partitioned, else the upstream
        partition of each of its channels (a :class:`~replistream.operators.dupfilter.DuplicateFilter`'s
        ``groups``)."""
        out: list[list[int] | None] = []
        for u in self.query.inputs_of(node):
            g = self.group(u)
            parted = g in self.parallelism or (g == ENTRY and self.entry_partitions > 1)
            out.append([r.partition for r in self._replicas[g]] if parted else None)
        return out

    def server(self, replica) -> str:
        """The server of a replica (a :class:`ReplicaId` or its label)."""
        return self._server[replica.label if isinstance(replica, ReplicaId) else replica]

    def group(self, node: str) -> str:
        """:func:`group_of` ``node`` in this plan's query."""
        if node == ENTRY:
            return ENTRY
        return group_of(self.query, node)

    def channels(self, node: str) -> list[int]:
        """Stream replicas feeding each input port of ``node``: its upstream group's replica count."""
        return [len(self._replicas[self.group(u)]) for u in self.query.inputs_of(node)]

    def stateful(self, node: str) -> bool:
        """:func:`is_stateful` ``node``."""
        return node != ENTRY and is_stateful(self.query, node)

    # -- stream replicas -------------------------------------------------------------------
    def streams(self) -> list[StreamEdge]:
        """Every stream replica, by upstream node in topological order, then upstream replica,
        downstream node and port, then downstream replica."""
        out = []
        q = self.query
        for node in q.topological():
            if q.spec(node).kind == "sink":
                continue
            ups = self._replicas[self.group(node)]
            for v, port in q.outputs_of(node):
                for ch, up in enumerate(ups):
                    for down in self._replicas[v]:
                        out.append(StreamEdge(up, down, port, node, ch))
        return out

    def in_streams(self, replica: ReplicaId) -> list[StreamEdge]:
        """The stream replicas into ``replica``, by port then channel."""
        q = self.query
        out = []
        for port, u in enumerate(q.inputs_of(replica.node)):
            for ch, up in enumerate(self._replicas[self.group(u)]):
                out.append(StreamEdge(up, replica, port, u, ch))
        return out

    def out_streams(self, replica: ReplicaId) -> list[StreamEdge]:
        """The stream replicas out of ``replica`` (for an entry replica: of every source)."""
        q = self.query
        streams = q.sources if replica.node == ENTRY else [replica.node]
        ch = self._position.get(replica.label, replica.index)  # a replica added since: its index
        return [StreamEdge(replica, down, port, s, ch)
                for s in streams for v, port in q.outputs_of(s) for down in self._replicas[v]]

    def __repr__(self) -> str:
        return f"PhysicalPlan({self.query.name!r}, {self.placement})"
