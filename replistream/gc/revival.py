"""Reviving replicas when delays appear, and proactively under the cost target (Hwang §V-C).

**On delays** (:func:`plan_revival`). A live replica whose observed input
delay exceeds ``threshold_s`` (paper: 10 s) is *hindered*. An upstream
replica is *functioning* when it is live and not hindered itself. For each
hindered replica, upstream first, the policy takes the first step that applies
(the paper's order), one step per hindered replica per call; a problem that
persists escalates at the next call, because the earlier steps find nothing
left to revive:

1. ``revive-stream``: revive a discarded input stream replica from a
   functioning upstream replica;
2. ``revive-replica``: failing that, revive a dormant upstream replica (one
   that has a discarded stream replica to the hindered one) and connect it;
3. failing that (the paper: "if the problem persists"), ``create-replica`` or ``replace-replica``: if some input port
   of the hindered replica has no functioning upstream replica (or it is an
   application), create a new upstream replica for that port on the server
   chosen by the ``place`` callback (the runtime wires it to Algorithm 5);
   otherwise its inputs are fine and the replica itself (its server or its
   links) is the problem: revive a dormant peer, or create one with
   ``place``, give it the hindered replica's downstream connections, and
   discard the hindered replica.

Decisions where the paper is silent:

* Entry-point replicas have no input stream replicas: a delay reported for
  one only marks it as not functioning (no event of its own).
* A replica that an earlier decision of the same call gave a new input waits
  for the next observation (its delay was measured before the fix): event
  ``none``. A dormant replica reported hindered (e.g. one just replaced) is
  not revived.
* Ports without a functioning live input ("starved") are served first; then
  the lowest-latency candidate wins (ties: lower cost, then id/label).
* A revived or created replica is fed by *every* functioning live upstream
  replica on each port (as at deployment, every upstream replica feeds every
  downstream replica; the collector trims later when cost exceeds theta).
  A revived/created upstream replica feeds only the hindered replica; a peer
  that replaces one feeds everything the hindered replica fed.
* A revived or created stateful replica (Join, Aggregate, user-defined) is
  listed in ``handover``: it must install a checkpoint from a live peer
  (docs/design.md, decision 7) before it emits.
* New stream replicas take the rate of their logical stream and the latency
  from ``latency(src_server, dst_server)``; without it, the latency of a known
  stream replica between the same servers (either direction), else the mean
  latency of the logical stream's replicas, else 0.

**Proactive** (:func:`revive_proactively`). When the total cost is below the
budget (default ``theta``), dormant items are revived, the most useful per
unit of cost first (the mirror image of Algorithm 6, so that what is revived
is not the collector's next victim), as long as the total cost stays at most
the budget. Items: a dormant stream replica between two live replicas, or a
dormant (not failed) replica with all its dormant stream replicas to and from
live replicas (it needs one from a functioning replica on every input port
and one to a live replica). Estimated utility: a stream replica gets the
share ``w / (w + sum of the live siblings' w)`` (equal shares when all are 0)
of its destination's utility; a replica's group counts, like Algorithm 6's
``utility(D)``, its outputs' estimates plus, per input port, the same total
again. Because revival stops at the budget, the collector does not fire
right after: no oscillation.

>>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
>>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("entry#1", "entry", "b", "entry"),
...                  OperatorReplica("f#0", "f", "c"), OperatorReplica("app", "app", "d", "application")],
...                 [StreamReplica("entry#0", "f#0", latency_ms=10), StreamReplica("entry#1", "f#0", latency_ms=20, live=False),
...                  StreamReplica("f#0", "app", latency_ms=5)], theta=20)
>>> [e.describe() for e in plan_revival(snap, {"f#0": 12.0})]
['f#0 hindered (delay 12 s > 10 s): revive-stream entry#1->f#0:0; cost 15 -> 35 (theta 20); functioning upstream entry#1 has a discarded stream replica to f#0 (latency 20 ms)']
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace

from .snapshot import OperatorReplica, Snapshot, StreamReplica, replica_index
from .utility import shares, utilities

__all__ = ["ACTIONS", "RevivalEvent", "RevivalPolicy", "RevivalDamper", "plan_revival", "revive_proactively",
           "apply_revival", "PlaceFn", "LatencyFn"]

#: Kinds of revival decision.
ACTIONS = ("revive-stream", "revive-replica", "create-replica", "replace-replica", "none")

#: ``place(operator, snapshot, hindered_label) -> server or None``: where a new replica of ``operator`` goes.
PlaceFn = Callable[[str, Snapshot, str], "str | None"]
#: ``latency(src_server, dst_server) -> ms``.
LatencyFn = Callable[[str, str], float]


@dataclass(frozen=True)
class RevivalEvent:
    """One revival decision, explained and ready to apply (:func:`apply_revival`).

    ``action`` is one of :data:`ACTIONS`; ``trigger`` ``"delay"`` (then
    ``replica`` is the hindered replica, with its ``delay_s`` and
    ``threshold_s``) or ``"proactive"``. What changes: stream replicas and
    replicas to revive, replicas and stream replicas to create, stream
    replicas and replicas to discard (a replaced replica), and ``handover``:
    revived or new stateful replicas that need a checkpoint from a live peer.
    Figures: estimated ``utility`` (proactive), ``cost`` added, total cost
    before and after, ``theta``; ``reason`` says why.

    >>> e = RevivalEvent("revive-stream", "delay", "f#0", "why", revive_streams=("entry#1->f#0:0",))
    >>> e.to_dict()["revive_streams"]
    ['entry#1->f#0:0']
    """

    action: str
    trigger: str
    replica: str | None
    reason: str
    revive_streams: tuple[str, ...] = ()
    revive_replicas: tuple[str, ...] = ()
    new_replicas: tuple[OperatorReplica, ...] = ()
    new_streams: tuple[StreamReplica, ...] = ()
    discard_streams: tuple[str, ...] = ()
    discard_replicas: tuple[str, ...] = ()
    handover: tuple[str, ...] = ()
    delay_s: float | None = None
    threshold_s: float | None = None
    utility: float | None = None
    cost: float = 0.0
    cost_before: float = 0.0
    cost_after: float = 0.0
    theta: float = math.inf

    def describe(self) -> str:
        """One line: trigger, action, what changes, cost, reason."""
        if self.trigger == "delay":
            head = f"{self.replica} hindered (delay {self.delay_s:.6g} s > {self.threshold_s:.6g} s): {self.action}"
        else:
            head = f"{self.trigger} {self.action}"
        what = list(self.revive_replicas) + list(self.revive_streams)
        what += [f"new {r.label} on {r.server}" for r in self.new_replicas] + [f"new {s.id}" for s in self.new_streams]
        what += [f"discard {x}" for x in list(self.discard_replicas) + list(self.discard_streams)]
        util = f", estimated utility {self.utility:.4g}" if self.utility is not None else ""
        body = f" {', '.join(what)}" if what else ""
        return (f"{head}{body}{util}; cost {self.cost_before:.6g} -> {self.cost_after:.6g} "
                f"(theta {self.theta:.6g}); {self.reason}")

    def to_dict(self) -> dict:
        """JSON-ready (``theta`` None when infinite)."""
        d = asdict(self)
        for k in ("revive_streams", "revive_replicas", "discard_streams", "discard_replicas", "handover"):
            d[k] = list(getattr(self, k))
        d["new_replicas"] = [asdict(r) for r in self.new_replicas]
        d["new_streams"] = [asdict(s) for s in self.new_streams]
        d["theta"] = None if math.isinf(self.theta) else self.theta
        return d


def apply_revival(snapshot: Snapshot, events: RevivalEvent | Iterable[RevivalEvent]) -> Snapshot:
    """The snapshot after applying one or more revival events, in order.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("app", "app", "b", "application")],
    ...                 [StreamReplica("entry#0", "app")])
    >>> new = OperatorReplica("entry#1", "entry", "c", "entry")
    >>> e = RevivalEvent("create-replica", "delay", "app", "", new_replicas=(new,),
    ...                  new_streams=(StreamReplica("entry#1", "app", latency_ms=3),))
    >>> apply_revival(snap, e).total_cost()
    3.0
    """
    if isinstance(events, RevivalEvent):
        events = [events]
    snap = snapshot
    for e in events:
        if e.action == "none":
            continue
        if any(snap.replica(r).state == "failed" for r in e.revive_replicas):
            raise ValueError(f"cannot revive failed replica(s) in {e.revive_replicas}")
        # switch off first, then add and revive, so the snapshot stays consistent
        snap = snap.evolve(streams_live={s: False for s in e.discard_streams},
                           states={r: "dormant" for r in e.discard_replicas})
        snap = snap.evolve(states={r: "live" for r in e.revive_replicas}, add_replicas=e.new_replicas)
        snap = snap.evolve(streams_live={s: True for s in e.revive_streams}, add_streams=e.new_streams)
    return snap


class _Planner:
    """Working state of one plan_revival call: the snapshot so far and the observed delays."""

    def __init__(self, snapshot: Snapshot, delays: Mapping[str, float], threshold_s: float,
                 place: PlaceFn | None, latency: LatencyFn | None):
        self.snap = snapshot
        self.delays = delays
        self.threshold = threshold_s
        self.place = place
        self.latency = latency

    def hindered(self, label: str) -> bool:
        return self.delays.get(label, 0.0) > self.threshold

    def functioning(self, label: str) -> bool:
        return self.snap.replica(label).live and not self.hindered(label)

    def slow_port(self, label: str) -> str | None:
        """For a dormant replica: the first input port whose every stream replica from a functioning
        replica is slower than the threshold by itself (it would be hindered as soon as revived)."""
        limit = 1000.0 * self.threshold
        for p in self.snap.ports(label):
            feeds = self.feeds(label, p)
            if feeds and all(s.latency_ms > limit for s in feeds):
                return f"port {p}: >= {min(s.latency_ms for s in feeds):.6g} ms"
        return None

    def repaired_upstream(self, label: str, repaired: set) -> list[str]:
        """The hindered feeders of ``label`` that this round already repaired, if some input port
        of ``label`` has live feeders, every one of them hindered and repaired: the delay of
        ``label`` is theirs, passed on, and a decision for ``label`` itself (reviving another
        port's upstream, replacing it) cannot help before their repair shows. Empty otherwise."""
        out = []
        for p in self.snap.ports(label):
            live = {s.src for s in self.snap.in_streams(label, p) if self.snap.replica(s.src).live}
            if live and all(self.hindered(x) and x in repaired for x in live):
                out += sorted(live)
        return out

    def feeds(self, label: str, port: int) -> list[StreamReplica]:
        """Stream replicas (live or discarded) into ``label`` on ``port`` whose source is functioning."""
        return [s for s in self.snap.in_streams(label, port, live=None) if self.functioning(s.src)]

    def stream_latency(self, src_server: str, dst_server: str, like: Iterable[StreamReplica]) -> float:
        if self.latency is not None:
            return float(self.latency(src_server, dst_server))
        srv = {r.label: r.server for r in self.snap.replicas}
        back = None
        for s in self.snap.streams:
            a, b = srv[s.src], srv[s.dst]
            if (a, b) == (src_server, dst_server):
                return s.latency_ms
            if back is None and (a, b) == (dst_server, src_server):
                back = s.latency_ms
        if back is not None:
            return back
        like = list(like)
        return math.fsum(s.latency_ms for s in like) / len(like) if like else 0.0

    def logical(self, operator: str, port: int) -> list[StreamReplica]:
        """Every stream replica (any state) of the logical stream into ``port`` of ``operator``."""
        return [s for r in self.snap.replicas_of(operator) for s in self.snap.in_streams(r.label, port, live=None)]

    def new_label(self, operator: str) -> str:
        idx = [replica_index(r.label) for r in self.snap.replicas_of(operator)]
        label = f"{operator}#{max((i for i in idx if i is not None), default=-1) + 1}"
        while self.snap.has_replica(label):  # hand-built labels may not follow op#i
            label += "'"
        return label

    def inputs_for(self, label: str, operator: str, server: str, existing: bool) -> tuple[list, list, str]:
        """Input stream replicas for a revived (``existing``) or new replica of ``operator``:
        (stream ids to revive, new StreamReplicas, problem or "")."""
        revive, new = [], []
        for q in self.snap.ports(operator):
            up = self.snap.upstream_operator(operator, q)
            if existing:
                cands = [s for s in self.feeds(label, q) if not s.live]
                if not cands:
                    return [], [], f"no functioning upstream replica has a stream replica to {label} on port {q}"
                revive += [s.id for s in cands]
            else:
                srcs = [r for r in self.snap.replicas_of(up, "live") if not self.hindered(r.label)]
                srcs = srcs or self.snap.replicas_of(up, "live")
                if not srcs:
                    return [], [], f"{up!r} has no live replica to feed port {q} of a new {operator!r} replica"
                like = self.logical(operator, q)
                for r in srcs:
                    new.append(StreamReplica(r.label, label, q, like[0].rate if like else 1.0,
                                             self.stream_latency(r.server, server, like), 0.0, True,
                                             like[0].stream if like else up))
        return revive, new, ""

    def event(self, action: str, h: str, reason: str, **kw) -> RevivalEvent:
        before = self.snap.total_cost()
        e = RevivalEvent(action, "delay", h, reason, delay_s=float(self.delays[h]), threshold_s=self.threshold,
                         theta=self.snap.theta, cost_before=before, cost_after=before, **kw)
        if action != "none":
            after_snap = apply_revival(self.snap, e)
            after = after_snap.total_cost()
            e = replace(e, cost=after - before, cost_after=after)
            self.snap = after_snap
        return e

    def handover(self, labels: Iterable[str], new: Iterable[OperatorReplica] = ()) -> tuple[str, ...]:
        out = [lab for lab in labels if self.snap.replica(lab).stateful]
        out += [r.label for r in new if r.stateful]
        return tuple(out)

    # -- the three steps ------------------------------------------------------------
    def step(self, h: str) -> RevivalEvent:
        snap = self.snap
        r = snap.replica(h)
        ports = snap.ports(h)
        if not ports:
            return self.event("none", h, "no input stream replicas to revive")
        starved = [p for p in ports if not any(s.live for s in self.feeds(h, p))]
        order = {p: (p not in starved, p) for p in ports}

        # 1. a discarded input stream replica from a functioning upstream replica: one on each
        # port whose live inputs are all slower than the threshold by themselves (the fastest there),
        # else the fastest of all (starved ports first)
        cands = [s for p in ports for s in self.feeds(h, p) if not s.live]
        if cands:
            limit = 1000.0 * self.threshold
            best = lambda c: min(c, key=lambda s: (order[s.port], s.latency_ms, s.cost, s.id))  # noqa: E731
            slow = [p for p in sorted(ports, key=order.get)
                    if not any(s.live and s.latency_ms <= limit for s in self.feeds(h, p))]
            picks = [best(c) for c in ([s for s in cands if s.port == p] for p in slow) if c] or [best(cands)]
            why = "; ".join(f"functioning upstream {s.src} has a discarded stream replica to {h} "
                            f"(latency {s.latency_ms:.6g} ms)" for s in picks)
            if len(picks) > 1:
                why += f"; ports {', '.join(str(s.port) for s in picks)} had no live input under the threshold"
            for s in picks:
                if s.port in starved:
                    why += f"; port {s.port} had no functioning input"
            return self.event("revive-stream", h, why, revive_streams=tuple(s.id for s in picks))

        # 2. a dormant upstream replica, connected to h
        best = None
        for p in starved or ports:  # a starved port's delay is not helped by another port's upstream
            up = snap.upstream_operator(r.operator, p)
            for u in snap.replicas_of(up, "dormant"):
                if self.hindered(u.label):
                    continue  # reported slow before it was discarded (e.g. just replaced)
                link = [s for s in snap.in_streams(h, p, live=None) if s.src == u.label]
                if not link:
                    continue
                revive, _, problem = self.inputs_for(u.label, up, u.server, existing=True)
                if problem:
                    continue
                key = (order[p], link[0].latency_ms, u.label)
                if best is None or key < best[0]:
                    best = (key, u, link[0], revive)
        if best is not None:
            _, u, link, revive = best
            why = (f"no functioning upstream replica has a discarded stream replica to {h}; dormant {u.label} on "
                   f"{u.server} can be fed on every port (latency to {h} {link.latency_ms:.6g} ms)")
            return self.event("revive-replica", h, why, revive_replicas=(u.label,),
                              revive_streams=tuple([link.id] + revive), handover=self.handover([u.label]))

        # 3a. a new upstream replica for a starved port (or for an application)
        if starved or r.kind == "application":
            p = starved[0] if starved else ports[0]
            up = snap.upstream_operator(r.operator, p)
            return self.create_upstream(h, p, up, "port %d has no functioning upstream replica" % p if starved else
                                        "application hindered although every input has a functioning upstream "
                                        "replica")
        # 3b. the inputs are fine: replace the hindered replica
        return self.replace(h)

    def create_upstream(self, h: str, p: int, up: str, why: str) -> RevivalEvent:
        r = self.snap.replica(h)
        server = self.place(up, self.snap, h) if self.place is not None else None
        if server is None:
            return self.event("none", h, f"{why}; nothing left to revive and no server for a new {up!r} replica "
                              f"({'place() returned None' if self.place else 'no place callback'})")
        if any(x.server == server for x in self.snap.replicas_of(up, "live")):
            return self.event("none", h, f"{why}; place() chose {server!r}, which already runs a live {up!r} replica")
        label = self.new_label(up)
        like = self.snap.replicas_of(up)
        new_rep = OperatorReplica(label, up, server, like[0].kind if like else "operator", "live",
                                  like[0].stateful if like else False)
        _, ins, problem = self.inputs_for(label, up, server, existing=False)
        if problem:
            return self.event("none", h, f"{why}; {problem}")
        out_like = self.logical(r.operator, p)
        out = StreamReplica(label, h, p, out_like[0].rate if out_like else 1.0,
                            self.stream_latency(server, r.server, out_like), 0.0, True,
                            out_like[0].stream if out_like else up)
        return self.event("create-replica", h, f"{why}; nothing left to revive: new {label} on {server}",
                          new_replicas=(new_rep,), new_streams=tuple(ins + [out]),
                          handover=self.handover([], [new_rep]))

    def replace(self, h: str) -> RevivalEvent:
        snap = self.snap
        r = snap.replica(h)
        outs = snap.out_streams(h)
        why = "every input port has a functioning upstream replica, so the replica or its links are slow"
        if not outs:
            return self.event("none", h, f"{why}; it has no live output to hand to a replacement")
        drop = tuple(s.id for s in snap.in_streams(h) + outs)
        best = None
        slow_peers = []
        for peer in snap.replicas_of(r.operator, "dormant"):
            if self.hindered(peer.label):
                continue
            revive, _, problem = self.inputs_for(peer.label, r.operator, peer.server, existing=True)
            if problem:
                continue
            slow = self.slow_port(peer.label)
            if slow is not None:  # it would be hindered at once (e.g. its links are the congested ones)
                slow_peers.append(f"{peer.label} ({slow})")
                continue
            links = []
            for o in outs:
                link = [s for s in snap.out_streams(peer.label, live=None) if s.dst == o.dst and s.port == o.port]
                if not link:
                    break
                links.append(link[0])
            else:
                lat = math.fsum(s.latency_ms for s in links) / len(links)
                key = (lat, peer.label)
                if best is None or key < best[0]:
                    best = (key, peer, revive + [s.id for s in links])
        if best is not None:
            _, peer, revive = best
            return self.event("replace-replica", h, f"{why}; dormant peer {peer.label} on {peer.server} takes over",
                              revive_replicas=(peer.label,), revive_streams=tuple(revive),
                              discard_streams=drop, discard_replicas=(h,), handover=self.handover([peer.label]))
        if slow_peers:
            why += f"; dormant peer(s) passed over, every link into a port above the threshold: {', '.join(slow_peers)}"
        server = self.place(r.operator, snap, h) if self.place is not None else None
        if server is None:
            return self.event("none", h, f"{why}; no dormant peer can take over and no server for a new one "
                              f"({'place() returned None' if self.place else 'no place callback'})")
        if any(x.server == server for x in snap.replicas_of(r.operator, "live") if x.label != h):
            return self.event("none", h, f"{why}; place() chose {server!r}, which already runs a live "
                              f"{r.operator!r} replica")
        label = self.new_label(r.operator)
        new_rep = OperatorReplica(label, r.operator, server, r.kind, "live", r.stateful)
        _, ins, problem = self.inputs_for(label, r.operator, server, existing=False)
        if problem:
            return self.event("none", h, f"{why}; {problem}")
        srv = {x.label: x.server for x in snap.replicas}
        new_outs = [StreamReplica(label, o.dst, o.port, o.rate, self.stream_latency(server, srv[o.dst], [o]),
                                  0.0, True, o.stream) for o in outs]
        return self.event("replace-replica", h, f"{why}; no dormant peer can take over: new {label} on {server}",
                          new_replicas=(new_rep,), new_streams=tuple(ins + new_outs), discard_streams=drop,
                          discard_replicas=(h,), handover=self.handover([], [new_rep]))


def plan_revival(snapshot: Snapshot, delays: Mapping[str, float], threshold_s: float = 10.0,
                 place: PlaceFn | None = None, latency: LatencyFn | None = None) -> list[RevivalEvent]:
    """Revival decisions for the replicas whose observed input delay (seconds) exceeds
    ``threshold_s`` (Hwang §V-C), one per hindered replica, upstream replicas first.

    ``delays`` maps replica labels to their observed input delay; replicas
    not listed count as functioning, dormant or failed ones are ignored.
    ``place(operator, snapshot, hindered) -> server | None`` chooses the server
    of a new replica; ``latency(src_server, dst_server) -> ms`` prices new
    stream replicas. Each event is planned on the snapshot left by the
    previous ones; apply them all with :func:`apply_revival`.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"),
    ...                  OperatorReplica("f#0", "f", "b"), OperatorReplica("app", "app", "c", "application")],
    ...                 [StreamReplica("entry#0", "f#0"), StreamReplica("f#0", "app")])
    >>> [e.action for e in plan_revival(snap, {"app": 30.0}, place=lambda op, s, h: "d")]
    ['create-replica']
    >>> plan_revival(snap, {"app": 30.0}, place=lambda op, s, h: "d")[0].new_replicas[0].label
    'f#1'
    """
    if not (threshold_s >= 0):
        raise ValueError(f"threshold_s must be >= 0, got {threshold_s!r}")
    for label, d in delays.items():
        snapshot.replica(label)
        if not (isinstance(d, (int, float)) and d >= 0):
            raise ValueError(f"delay of {label!r} must be a number >= 0 (seconds), got {d!r}")
    planner = _Planner(snapshot, delays, float(threshold_s), place, latency)
    rank = {op: i for i, op in enumerate(snapshot.topological())}
    order = sorted((label for label in delays if planner.hindered(label) and snapshot.replica(label).kind != "entry"),
                   key=lambda lab: (rank[snapshot.replica(lab).operator], lab))
    events = []
    for h in order:
        if not planner.snap.replica(h).live:
            continue  # replaced by an earlier event
        fed = {s.dst for e in events for s in e.new_streams} | {snapshot.stream(s).dst for e in events
                                                                  for s in e.revive_streams if snapshot.has_stream(s)}
        if h in fed:
            events.append(planner.event("none", h, "an earlier decision of this round gave it a new input; "
                                                   "waiting for the next observation"))
            continue
        upstream = planner.repaired_upstream(h, {e.replica for e in events if e.action != "none"})
        if upstream:
            events.append(planner.event("none", h, f"every live feeder of a port is hindered and was repaired "
                                                   f"earlier in this round ({', '.join(upstream)}); its delay is "
                                                   f"theirs: waiting for the next observation"))
            continue
        events.append(planner.step(h))
    return events


def _estimate(snap: Snapshot, utils, s: StreamReplica) -> float:
    siblings = snap.in_streams(s.dst, s.port)
    share = shares([x.weight for x in siblings] + [s.weight])[-1]
    return share * utils.replicas.get(s.dst, 0.0)


def revive_proactively(snapshot: Snapshot, budget: float | None = None, max_items: int | None = None,
                       delays: Mapping[str, float] | None = None, threshold_s: float = 10.0) -> list[RevivalEvent]:
    """Proactive revival while the total cost is below ``budget`` (default ``theta``; Hwang §V-C):
    dormant items with the highest estimated utility per unit of cost first, each
    only if the total cost stays at most the budget. Upstream replicas
    whose delay in ``delays`` exceeds ``threshold_s`` are not used as feeds.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("entry#1", "entry", "b", "entry"),
    ...                  OperatorReplica("app", "app", "c", "application")],
    ...                 [StreamReplica("entry#0", "app", latency_ms=5, weight=2),
    ...                  StreamReplica("entry#1", "app", latency_ms=8, weight=2, live=False)], theta=20)
    >>> [(e.action, e.revive_streams, e.utility) for e in revive_proactively(snap)]
    [('revive-stream', ('entry#1->app:0',), 0.5)]
    >>> revive_proactively(snap.evolve(theta=12))       # 5 + 8 > 12
    []
    """
    budget = snapshot.theta if budget is None else float(budget)
    delays = dict(delays or {})
    before = snapshot.total_cost()
    if not before < budget:
        return []
    utils = utilities(snapshot)
    ok = lambda lab: snapshot.replica(lab).live and delays.get(lab, 0.0) <= threshold_s  # noqa: E731
    items = []  # (sort key, action, streams, replicas, utility, cost)
    for s in snapshot.streams:
        if not s.live and ok(s.src) and snapshot.replica(s.dst).live:
            u = _estimate(snapshot, utils, s)
            items.append((s.cost, "revive-stream", (s.id,), (), u, s.id))
    for r in snapshot.replicas:
        if r.state != "dormant":
            continue
        ins = [s for s in snapshot.in_streams(r.label, live=None) if ok(s.src)]
        outs = [s for s in snapshot.out_streams(r.label, live=None) if snapshot.replica(s.dst).live]
        ports = snapshot.ports(r.label)
        if not outs or any(not any(s.port == p for s in ins) for p in ports):
            continue
        u_r = math.fsum(_estimate(snapshot, utils, s) for s in outs)
        u = u_r * (1 + len(ports))
        cost = math.fsum(s.cost for s in ins + outs)
        items.append((cost, "revive-replica", tuple(s.id for s in ins + outs), (r.label,), u, r.label))
    ratio = lambda u, c: u / c if c > 0 else math.inf  # noqa: E731
    items.sort(key=lambda it: (-ratio(it[4], it[0]), it[0], it[5]))
    events = []
    snap = snapshot
    for cost, action, streams, reps, u, _ in items:
        if max_items is not None and len(events) >= max_items:
            break
        now = snap.total_cost()
        if now + cost > budget:
            continue
        e = RevivalEvent(action, "proactive", None,
                         f"total cost {now:.6g} < budget {budget:.6g}; estimated utility/cost "
                         f"{ratio(u, cost):.4g}, the highest left among {len(items)} dormant item(s), and the cost "
                         f"stays within the budget",
                         revive_streams=streams, revive_replicas=reps,
                         handover=tuple(x for x in reps if snap.replica(x).stateful), utility=u, theta=snap.theta)
        new = apply_revival(snap, e)
        after = new.total_cost()
        events.append(replace(e, cost=after - now, cost_before=now, cost_after=after))
        snap = new
    return events


@dataclass
class RevivalDamper:
    """Damping with hysteresis for delay-triggered revival (Hwang §V-C: revival must not
    oscillate with garbage collection). Our reading of what the paper leaves open:

    * **persistence**: a replica counts as hindered for :func:`plan_revival` only after
      ``persist`` consecutive observations (coordinator periods) with a delay above
      ``threshold_s``; a transient spike revives nothing;
    * **hysteresis**: the count is reset only by a delay below ``clear_s`` (default
      half of ``threshold_s``); between ``clear_s`` and ``threshold_s`` it is kept
      but not increased. A replica not observed in a period is reset too. After a
      replica's revival event fires, its count restarts from 0, so escalation (the
      next step of §V-C) needs the delay to persist again;
    * **hold**: every stream replica and replica an event revives or creates is held
      for ``hold_s``: :meth:`held` lists them and the collector gets them as ``keep``
      (:func:`~replistream.gc.collect_garbage`), so the next collection does not
      discard them at once.

    ``persist=1, clear_s=threshold_s, hold_s=0`` is undamped (plain :func:`plan_revival`).
    ``hold_s`` defaults to 0 (no hold): a held item makes the collector reach theta by
    discarding *other* groups, and in the simulated Fig. 5 (6 h, kmax 3) that discarded
    paths the next outage needed (maximum latency 0.341 s -> 111 s); persistence and
    hysteresis alone cut the revivals without that (docs/experiments.md, Fig. 5).
    Stateful (the counts and holds); time is whatever the caller passes (simulated
    or monotonic seconds), never read from a clock here.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("entry#1", "entry", "b", "entry"),
    ...                  OperatorReplica("f#0", "f", "c"), OperatorReplica("app", "app", "d", "application")],
    ...                 [StreamReplica("entry#0", "f#0", latency_ms=10), StreamReplica("entry#1", "f#0", latency_ms=20, live=False),
    ...                  StreamReplica("f#0", "app", latency_ms=5)])
    >>> d = RevivalDamper(threshold_s=10, persist=2, hold_s=600)
    >>> d.plan(0.0, snap, {"f#0": 12.0})          # first observation above 10 s: not yet
    []
    >>> [e.revive_streams for e in d.plan(10.0, snap, {"f#0": 12.0})]
    [('entry#1->f#0:0',)]
    >>> sorted(d.held(20.0)), sorted(d.held(700.0))
    (['entry#1->f#0:0'], [])
    """

    threshold_s: float = 10.0
    clear_s: float | None = None
    persist: int = 2
    hold_s: float = 0.0
    _streak: dict = field(default_factory=dict, init=False, repr=False)
    _until: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if self.clear_s is None:
            self.clear_s = self.threshold_s / 2
        if not (self.threshold_s >= 0 and 0 <= self.clear_s <= self.threshold_s):
            raise ValueError(f"need 0 <= clear_s <= threshold_s, got clear_s={self.clear_s!r}, "
                             f"threshold_s={self.threshold_s!r}")
        if not (isinstance(self.persist, int) and self.persist >= 1):
            raise ValueError(f"persist must be an int >= 1, got {self.persist!r}")
        if not self.hold_s >= 0:
            raise ValueError(f"hold_s must be >= 0, got {self.hold_s!r}")

    def observe(self, delays: Mapping[str, float]) -> dict[str, float]:
        """Count one observation per replica; the delays to plan with: a persistent one as
        observed, any other capped at ``threshold_s`` (not hindered).

        >>> d = RevivalDamper(threshold_s=1.0, clear_s=0.5, persist=2)
        >>> d.observe({"x": 3.0}), d.observe({"x": 0.8}), d.observe({"x": 3.0})   # 0.8 s keeps the count
        ({'x': 1.0}, {'x': 0.8}, {'x': 3.0})
        """
        for lab in [lab for lab in self._streak if lab not in delays]:
            del self._streak[lab]
        out = {}
        for lab, d in delays.items():
            n = self._streak.get(lab, 0)
            if d > self.threshold_s:
                n += 1
            elif d < self.clear_s:
                n = 0
            self._streak[lab] = n
            out[lab] = float(d) if n >= self.persist else min(float(d), self.threshold_s)
        return out

    def streak(self, label: str) -> int:
        """Consecutive observations above the threshold counted for ``label`` (0 if none).

        >>> d = RevivalDamper(threshold_s=1.0); _ = d.observe({"x": 2.0}); d.streak("x"), d.streak("y")
        (1, 0)
        """
        return self._streak.get(label, 0)

    def fired(self, now: float, events: Iterable[RevivalEvent]) -> None:
        """Record applied events at time ``now``: hold what they revive or create until
        ``now + hold_s``, and restart the count of each event's hindered replica.

        >>> d = RevivalDamper(hold_s=5.0)
        >>> d.fired(1.0, [RevivalEvent("revive-stream", "delay", "f#0", "", revive_streams=("a->f#0:0",))])
        >>> sorted(d.held(5.9)), sorted(d.held(6.0))
        (['a->f#0:0'], [])
        """
        for e in events:
            if e.action == "none":
                continue
            if e.replica is not None:
                self._streak[e.replica] = 0
            items = list(e.revive_streams) + list(e.revive_replicas)
            items += [r.label for r in e.new_replicas] + [x.id for x in e.new_streams]
            for x in items:
                self._until[x] = max(self._until.get(x, -math.inf), now + self.hold_s)

    def held(self, now: float) -> frozenset[str]:
        """Stream replica ids and replica labels still within their hold at ``now`` (for
        ``collect_garbage(..., keep=...)``); expired holds are forgotten.

        >>> RevivalDamper().held(0.0)
        frozenset()
        """
        for x in [x for x, u in self._until.items() if u <= now]:
            del self._until[x]
        return frozenset(self._until)

    def plan(self, now: float, snapshot: Snapshot, delays: Mapping[str, float], place: PlaceFn | None = None,
             latency: LatencyFn | None = None) -> list[RevivalEvent]:
        """:meth:`observe`, then :func:`plan_revival` on the damped delays, then
        :meth:`fired` with its events (the caller applies them all, or calls
        :meth:`fired` itself for the ones it applies and uses :meth:`observe` +
        :func:`plan_revival` directly)."""
        events = plan_revival(snapshot, self.observe(delays), self.threshold_s, place, latency)
        self.fired(now, events)
        return events


@dataclass
class RevivalPolicy:
    """The coordinator's revival policy (Hwang §V-C): delay-triggered revival with
    ``threshold_s`` (paper: 10 s), then, if the cost is below ``theta`` and
    ``proactive``, proactive revival (at most ``max_proactive`` items).

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("app", "app", "c", "application")],
    ...                 [StreamReplica("entry#0", "app")])
    >>> RevivalPolicy(threshold_s=5).decide(snap, {"app": 1.0})
    []
    """

    threshold_s: float = 10.0
    proactive: bool = True
    place: PlaceFn | None = None
    latency: LatencyFn | None = None
    max_proactive: int | None = None
    budget: float | None = field(default=None)
    damper: RevivalDamper | None = None

    def decide(self, snapshot: Snapshot, delays: Mapping[str, float], now: float = 0.0) -> list[RevivalEvent]:
        """Delay-triggered events, then proactive ones planned on the snapshot they leave.
        With a ``damper`` (:class:`RevivalDamper`, its own ``threshold_s``), the delay-triggered
        ones are damped and held from ``now`` on (pass the coordinator's time); without
        one, as before (``now`` unused)."""
        if self.damper is not None:
            events = self.damper.plan(now, snapshot, delays, self.place, self.latency)
        else:
            events = plan_revival(snapshot, delays, self.threshold_s, self.place, self.latency)
        if self.proactive:
            snap = apply_revival(snapshot, events)
            events += revive_proactively(snap, self.budget, self.max_proactive, delays, self.threshold_s)
        return events
