"""A snapshot of a replicated deployment, as plain data (Hwang §V-A, §V-B).

What the garbage collector (Algorithm 6) and the revival policy (§V-C) read
and write. No Ray inside: the runtime's coordinator builds one from what its
actors report, the simulator from its own state, tests by hand.

* An :class:`OperatorReplica` is one copy of a node: an entry point replica
  (``"entry#0"``: one replica of *all* the query's entry points, as the
  runtime runs them), an operator replica (``"join#1"``) or an application
  (labelled by its name, one replica). Its ``state`` is ``"live"``,
  ``"dormant"`` (discarded by the collector; can be revived on its server) or
  ``"failed"`` (its actor or server died; never revived, a new replica is
  created instead).
* A :class:`StreamReplica` is one copy of a stream, from one upstream replica
  to one downstream replica on an input ``port`` of the latter, with its
  ``rate`` (tuples/s), ``latency_ms``, network cost ``rate x latency`` (the
  bandwidth-delay product of §V-A) and the duplicate-filter weight ``w(S)``
  (the j-th copy of a tuple adds ``1/j``, §V-B; ``DuplicateFilter.weights``
  accumulates it per input channel). ``live=False`` means discarded (dormant).
* A :class:`Snapshot` holds both, with ``kmin`` (the fewest live replicas any
  operator may keep) and ``theta`` (the target network cost). It is immutable:
  changes return a new snapshot (:meth:`Snapshot.evolve`).

Invariants checked on construction (a ``ValueError`` names the culprit):
unique labels and stream ids; streams join known replicas; entry replicas
have no inputs, applications no outputs; a live stream joins two live
replicas; the replicas of one operator share its kind; every input port of an
operator is fed by one upstream operator; the operator graph is acyclic;
rates, latencies and weights are finite and >= 0.

>>> snap = Snapshot(
...     [OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("f#0", "f", "b"),
...      OperatorReplica("f#1", "f", "c"), OperatorReplica("app", "app", "d", "application")],
...     [StreamReplica("entry#0", "f#0", rate=2, latency_ms=5), StreamReplica("entry#0", "f#1", rate=2, latency_ms=30),
...      StreamReplica("f#0", "app", rate=1, latency_ms=10), StreamReplica("f#1", "app", rate=1, latency_ms=20)],
...     kmin=1, theta=50)
>>> snap.total_cost(), [s.id for s in snap.in_streams("app")]
(100.0, ['f#0->app:0', 'f#1->app:0'])
>>> Snapshot.from_json(snap.to_json()) == snap
True
"""
from __future__ import annotations

import json
import math
import numbers
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import networkx as nx

from ..plan import ENTRY, PhysicalPlan, replica_index

__all__ = ["ENTRY", "KINDS", "STATES", "OperatorReplica", "StreamReplica", "Snapshot", "snapshot_from_plan",
           "replica_index"]

#: Kinds of operator replica.
KINDS = ("entry", "operator", "application")
#: States of an operator replica.
STATES = ("live", "dormant", "failed")


@dataclass(frozen=True)
class OperatorReplica:
    """One replica of a node: ``label`` (``"join#1"``), ``operator`` (``"join"``), ``server``,
    ``kind`` (``"entry"``, ``"operator"`` or ``"application"``), ``state``
    (``"live"``, ``"dormant"``, ``"failed"``) and whether reviving it needs a
    state hand-over (``stateful``: Join, Aggregate, user-defined operators;
    docs/design.md, decision 7).

    >>> r = OperatorReplica("join#1", "join", "tokyo", stateful=True)
    >>> r.live, r.kind
    (True, 'operator')
    """

    label: str
    operator: str
    server: str
    kind: str = "operator"
    state: str = "live"
    stateful: bool = False

    @property
    def live(self) -> bool:
        """True when the replica runs (state ``"live"``)."""
        return self.state == "live"


@dataclass(frozen=True)
class StreamReplica:
    """One stream replica ``src -> dst`` on input ``port`` of ``dst`` (labels of operator replicas).

    ``rate`` in tuples/s, ``latency_ms`` one way, ``weight`` the duplicate
    filter's accumulated contribution ``w(S)`` (§V-B), ``live`` False once
    discarded; ``stream`` names the logical stream (the upstream node; the
    source's name for entry-point streams). Its ``cost`` is ``rate x
    latency_ms`` (Hwang §V-A).

    >>> s = StreamReplica("entry#0", "join#1", port=1, rate=20, latency_ms=35, weight=3.5, stream="pings")
    >>> s.id, s.cost
    ('entry#0->join#1:1', 700.0)
    """

    src: str
    dst: str
    port: int = 0
    rate: float = 1.0
    latency_ms: float = 0.0
    weight: float = 0.0
    live: bool = True
    stream: str = ""

    def __post_init__(self):
        for end in ("src", "dst"):
            if not isinstance(getattr(self, end), str) or not getattr(self, end):
                raise ValueError(f"stream replica: {end} must be a replica label, got {getattr(self, end)!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, numbers.Integral) or self.port < 0:
            raise ValueError(f"stream replica {self.id!r}: port must be an integer >= 0, got {self.port!r}")
        object.__setattr__(self, "port", int(self.port))
        for what in ("rate", "latency_ms", "weight"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"stream replica {self.id!r}: {what} must be finite and >= 0, got {v!r}")
            object.__setattr__(self, what, float(v))

    @property
    def id(self) -> str:
        """``"src->dst:port"``: unique within a snapshot."""
        return f"{self.src}->{self.dst}:{self.port}"

    @property
    def cost(self) -> float:
        """Network cost: bandwidth-delay product ``rate x latency_ms`` (Hwang §V-A)."""
        return self.rate * self.latency_ms


@dataclass(frozen=True)
class Snapshot:
    """Operator replicas, stream replicas, ``kmin`` and ``theta`` of one deployment at one time.

    Read with :meth:`replica`, :meth:`stream`, :meth:`in_streams`,
    :meth:`out_streams`, :meth:`ports`, :meth:`live_count`,
    :meth:`total_cost`; change with :meth:`evolve`, :meth:`with_weights`,
    :meth:`with_failed`; serialise with :meth:`to_json`/:meth:`from_json`.

    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"),
    ...                  OperatorReplica("app", "app", "b", "application")],
    ...                 [StreamReplica("entry#0", "app", rate=3, latency_ms=4)], kmin=1)
    >>> snap.total_cost(), snap.live_count("entry"), snap.theta
    (12.0, 1, inf)
    """

    replicas: tuple[OperatorReplica, ...]
    streams: tuple[StreamReplica, ...]
    kmin: int = 1
    theta: float = math.inf
    # indexes built on construction (not compared, not serialised)
    _by_label: dict = field(init=False, repr=False, compare=False)   # label -> OperatorReplica
    _by_id: dict = field(init=False, repr=False, compare=False)      # stream id -> StreamReplica
    _ins: dict = field(init=False, repr=False, compare=False)        # label -> [StreamReplica] (every state)
    _outs: dict = field(init=False, repr=False, compare=False)       # label -> [StreamReplica] (every state)
    _ports: dict = field(init=False, repr=False, compare=False)      # operator -> (port, ...)
    _port_up: dict = field(init=False, repr=False, compare=False)    # (operator, port) -> upstream operator
    _order: tuple = field(init=False, repr=False, compare=False)     # operators, topologically sorted

    def __post_init__(self):
        reps = tuple(self.replicas)
        streams = tuple(self.streams)
        object.__setattr__(self, "replicas", reps)
        object.__setattr__(self, "streams", streams)
        kmin = self.kmin
        if isinstance(kmin, bool) or not isinstance(kmin, numbers.Integral) or kmin < 1:
            raise ValueError(f"kmin must be an integer >= 1, got {kmin!r}")
        object.__setattr__(self, "kmin", int(kmin))
        theta = float(self.theta)
        if math.isnan(theta) or theta < 0:
            raise ValueError(f"theta must be >= 0 (or inf), got {self.theta!r}")
        object.__setattr__(self, "theta", theta)
        by_label: dict[str, OperatorReplica] = {}
        kind_of: dict[str, str] = {}
        for r in reps:
            if not isinstance(r, OperatorReplica):
                raise ValueError(f"replicas must be OperatorReplica, got {type(r).__name__}")
            if r.label in by_label:
                raise ValueError(f"replica label {r.label!r} is repeated")
            if r.kind not in KINDS:
                raise ValueError(f"replica {r.label!r}: kind must be one of {KINDS}, got {r.kind!r}")
            if r.state not in STATES:
                raise ValueError(f"replica {r.label!r}: state must be one of {STATES}, got {r.state!r}")
            if kind_of.setdefault(r.operator, r.kind) != r.kind:
                raise ValueError(f"replicas of {r.operator!r} have kinds {kind_of[r.operator]!r} and {r.kind!r}")
            by_label[r.label] = r
        by_id: dict[str, StreamReplica] = {}
        ins: dict[str, list] = {r.label: [] for r in reps}
        outs: dict[str, list] = {r.label: [] for r in reps}
        port_up: dict[tuple[str, int], str] = {}
        for s in streams:
            if not isinstance(s, StreamReplica):
                raise ValueError(f"streams must be StreamReplica, got {type(s).__name__}")
            sid = s.id
            if sid in by_id:
                raise ValueError(f"stream replica {sid!r} is repeated")
            for end in (s.src, s.dst):
                if end not in by_label:
                    raise ValueError(f"stream replica {sid!r} names unknown replica {end!r}")
            up, down = by_label[s.src], by_label[s.dst]
            if down.kind == "entry":
                raise ValueError(f"stream replica {sid!r}: entry replica {s.dst!r} takes no input streams")
            if up.kind == "application":
                raise ValueError(f"stream replica {sid!r}: application {s.src!r} has no output streams")
            if s.live and not (up.live and down.live):
                dead = s.src if not up.live else s.dst
                raise ValueError(f"stream replica {sid!r} is live but replica {dead!r} is {by_label[dead].state}")
            prev = port_up.setdefault((down.operator, s.port), up.operator)
            if prev != up.operator:
                raise ValueError(f"port {s.port} of {down.operator!r} is fed by both {prev!r} and {up.operator!r}")
            by_id[sid] = s
            ins[s.dst].append(s)
            outs[s.src].append(s)
        ports: dict[str, list[int]] = defaultdict(list)
        for (op, p) in sorted(port_up):
            ports[op].append(p)
        g = nx.DiGraph()
        g.add_nodes_from(kind_of)
        g.add_edges_from((u, op) for (op, _), u in port_up.items())
        if not nx.is_directed_acyclic_graph(g):
            cyc = " -> ".join(e[0] for e in nx.find_cycle(g))
            raise ValueError(f"the operators of the snapshot form a cycle: {cyc}")
        first = {op: i for i, op in enumerate(kind_of)}
        object.__setattr__(self, "_order", tuple(nx.lexicographical_topological_sort(g, key=first.__getitem__)))
        object.__setattr__(self, "_by_label", by_label)
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_ins", ins)
        object.__setattr__(self, "_outs", outs)
        object.__setattr__(self, "_ports", {op: tuple(ps) for op, ps in ports.items()})
        object.__setattr__(self, "_port_up", port_up)

    # -- reading ------------------------------------------------------------------
    def replica(self, label: str) -> OperatorReplica:
        """The operator replica labelled ``label`` (``KeyError`` naming it if unknown)."""
        try:
            return self._by_label[label]
        except KeyError:
            raise KeyError(f"no replica {label!r} in the snapshot") from None

    def stream(self, sid: str) -> StreamReplica:
        """The stream replica with id ``"src->dst:port"``."""
        try:
            return self._by_id[sid]
        except KeyError:
            raise KeyError(f"no stream replica {sid!r} in the snapshot") from None

    def has_replica(self, label: str) -> bool:
        """True if a replica labelled ``label`` exists (in any state)."""
        return label in self._by_label

    def has_stream(self, sid: str) -> bool:
        """True if a stream replica with id ``sid`` exists (live or not)."""
        return sid in self._by_id

    def in_streams(self, label: str, port: int | None = None, live: bool | None = True) -> list[StreamReplica]:
        """Input stream replicas of ``label`` (on ``port`` if given); ``live=None`` for every state."""
        return [s for s in self._ins[label]
                if (port is None or s.port == port) and (live is None or s.live == live)]

    def out_streams(self, label: str, live: bool | None = True) -> list[StreamReplica]:
        """Output stream replicas of ``label``; ``live=None`` for every state."""
        return [s for s in self._outs[label] if live is None or s.live == live]

    def ports(self, label_or_operator: str) -> tuple[int, ...]:
        """Input ports of an operator (or of a replica's operator): every port any of its replicas is fed on."""
        op = self._by_label[label_or_operator].operator if label_or_operator in self._by_label else label_or_operator
        return self._ports.get(op, ())

    def upstream_operator(self, operator: str, port: int) -> str:
        """The operator feeding ``port`` of ``operator`` (``"entry"`` for a source)."""
        return self._port_up[(operator, port)]

    @property
    def operators(self) -> list[str]:
        """Operator names (including ``"entry"`` and applications), in order of first replica."""
        return list(dict.fromkeys(r.operator for r in self.replicas))

    def topological(self) -> list[str]:
        """Operator names in topological order (upstream first; ties in order of first replica)."""
        return list(self._order)

    def replicas_of(self, operator: str, state: str | None = None) -> list[OperatorReplica]:
        """Replicas of ``operator`` (in ``state`` if given), in snapshot order."""
        return [r for r in self.replicas if r.operator == operator and (state is None or r.state == state)]

    def live_count(self, operator: str) -> int:
        """Number of live replicas of ``operator``."""
        return sum(1 for r in self.replicas if r.operator == operator and r.live)

    def live_streams(self) -> list[StreamReplica]:
        """Every live stream replica, in snapshot order."""
        return [s for s in self.streams if s.live]

    def total_cost(self) -> float:
        """Network cost of the live stream replicas: sum of rate x latency (Hwang §V-A)."""
        return math.fsum(s.cost for s in self.streams if s.live)

    # -- changing -------------------------------------------------------------------
    def evolve(self, *, streams_live: Mapping[str, bool] | None = None, states: Mapping[str, str] | None = None,
               add_replicas: Iterable[OperatorReplica] = (), add_streams: Iterable[StreamReplica] = (),
               weights: Mapping[str, float] | None = None, **fields) -> "Snapshot":
        """A new snapshot with stream replicas switched live/dormant, replica states changed,
        replicas and streams added, weights replaced, or ``kmin``/``theta`` changed.

        >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"),
        ...                  OperatorReplica("app", "app", "b", "application")],
        ...                 [StreamReplica("entry#0", "app", rate=3, latency_ms=4)])
        >>> snap.evolve(streams_live={"entry#0->app:0": False}, theta=5).total_cost()
        0.0
        """
        streams_live = dict(streams_live or {})
        states = dict(states or {})
        weights = dict(weights or {})
        for sid in list(streams_live) + list(weights):
            self.stream(sid)
        for label in states:
            self.replica(label)
        reps = [replace(r, state=states[r.label]) if r.label in states else r for r in self.replicas]
        reps.extend(add_replicas)
        streams = []
        for s in self.streams:
            sid = s.id
            if sid in streams_live or sid in weights:
                s = replace(s, live=bool(streams_live.get(sid, s.live)), weight=float(weights.get(sid, s.weight)))
            streams.append(s)
        streams.extend(add_streams)
        return Snapshot(reps, streams, fields.pop("kmin", self.kmin), fields.pop("theta", self.theta), **fields)

    def with_weights(self, weights: Mapping[str, float]) -> "Snapshot":
        """The snapshot with the duplicate-filter weights of the given stream replicas replaced.

        >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"),
        ...                  OperatorReplica("app", "app", "b", "application")], [StreamReplica("entry#0", "app")])
        >>> snap.with_weights({"entry#0->app:0": 7.5}).stream("entry#0->app:0").weight
        7.5
        """
        return self.evolve(weights=weights)

    def with_failed(self, labels: Iterable[str]) -> "Snapshot":
        """The snapshot with the given replicas failed and their stream replicas no longer live.

        >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"),
        ...                  OperatorReplica("app", "app", "b", "application")], [StreamReplica("entry#0", "app")])
        >>> snap.with_failed(["entry#0"]).live_streams()
        []
        """
        labels = list(labels)
        off = {s.id: False for lab in labels for s in self._ins[lab] + self._outs[lab]}
        return self.evolve(streams_live=off, states={lab: "failed" for lab in labels})

    # -- serialising ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"kmin", "theta" (None for inf), "replicas": [...], "streams": [...]}``."""
        return {"kmin": self.kmin, "theta": None if math.isinf(self.theta) else self.theta,
                "replicas": [asdict(r) for r in self.replicas], "streams": [asdict(s) for s in self.streams]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Snapshot":
        """Inverse of :meth:`to_dict`."""
        theta = d.get("theta")
        return cls([OperatorReplica(**r) for r in d["replicas"]], [StreamReplica(**s) for s in d["streams"]],
                   int(d.get("kmin", 1)), math.inf if theta is None else float(theta))

    def to_json(self, **kw) -> str:
        """:meth:`to_dict` as JSON."""
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text: str) -> "Snapshot":
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    def describe(self) -> str:
        """One line per live stream replica with rate, latency, cost and weight, after a summary line."""
        live = self.live_streams()
        lines = [f"{sum(r.live for r in self.replicas)} live replica(s) of {len(self.operators)} operator(s), "
                 f"{len(live)} live stream replica(s), cost {self.total_cost():.6g}, theta {self.theta:.6g}, "
                 f"kmin {self.kmin}"]
        lines += [f"  {s.id:<32} rate {s.rate:<8.4g} latency {s.latency_ms:<8.4g} cost {s.cost:<10.4g} "
                  f"w {s.weight:.4g}" for s in live]
        return "\n".join(lines)



def _latency_fn(latency) -> Callable[[str, str], float]:
    if latency is None:
        return lambda a, b: 0.0
    if callable(latency):
        return lambda a, b: float(latency(a, b))
    if isinstance(latency, Mapping):
        return lambda a, b: 0.0 if a == b and (a, b) not in latency else float(latency[(a, b)])
    raise TypeError(f"latency must be None, a callable (src, dst) -> ms or a mapping {{(src, dst): ms}}, "
                    f"got {type(latency).__name__}")


def snapshot_from_plan(query, plan: Mapping[str, list], *, rates: Mapping[str, float] | None = None,
                       latency=None, weights: Mapping[str, float] | None = None, kmin: int = 1,
                       theta: float = math.inf) -> Snapshot:
    """The snapshot of a fresh deployment of ``query`` on ``plan`` (every stream replica live).

    ``plan`` is ``{node: [server, ...]}`` as ``replistream.deploy`` takes it:
    ``"entry"`` for the k entry-point replicas, k servers per operator, one per
    application. Every upstream replica feeds every downstream replica (§II-B).
    Labels follow the runtime: ``"entry#i"``, ``"op#i"``, the application's name.

    * ``rates``: tuples/s of each node's output stream, by node name (a
      source's name for its stream); default 1.0;
    * ``latency``: ``(server_a, server_b) -> ms``, or a mapping
      ``{(a, b): ms}``; default 0 (e.g. ``lambda a, b:
      problem.latency[problem.index[a], problem.index[b]]`` for a
      :class:`~replistream.placement.PlacementProblem`);
    * ``weights``: duplicate-filter weights by stream id; default 0 (not
      measured yet: utility then splits equally).

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> s.filter(lambda b: b["x"] > 0, name="f").sink("app")
    'app'
    >>> snap = snapshot_from_plan(q.build(), {"entry": ["a", "b"], "f": ["b", "c"], "app": ["c"]},
    ...                           rates={"s": 10, "f": 5}, latency=lambda a, b: 0 if a == b else 20)
    >>> len(snap.streams), snap.total_cost()      # 2x2 entry->f, 2 f->app
    (6, 700.0)
    """
    lat = _latency_fn(latency)
    rates = dict(rates or {})
    weights = dict(weights or {})
    if ENTRY not in plan or not plan[ENTRY]:
        raise ValueError(f"plan needs the entry points' servers under {ENTRY!r}")
    physical = PhysicalPlan(query, plan)
    kinds = {ENTRY: "entry", **{n: "operator" for n in query.operators}, **{n: "application" for n in query.sinks}}
    reps = [OperatorReplica(r.label, r.node, physical.server(r), kinds[r.node], stateful=physical.stateful(r.node))
            for r in physical.replicas()]
    streams: list[StreamReplica] = []
    for e in physical.streams():
        rate = float(rates.get(e.stream, 1.0))
        s = StreamReplica(e.src.label, e.dst.label, e.port, rate, lat(physical.server(e.src), physical.server(e.dst)),
                          0.0, True, e.stream)
        streams.append(replace(s, weight=float(weights.get(s.id, 0.0))))
    return Snapshot(reps, streams, kmin, theta)
