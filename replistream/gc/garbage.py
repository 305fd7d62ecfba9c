"""Garbage collection of replicas: Algorithm 6 (Hwang §V-B).

``whenever cost(R) > theta``: for every live stream replica ``S`` compute
``dependents(S)``, the group that must be discarded with ``S``; among the
non-empty groups pick ``D*`` minimising ``utility(D) / cost(D)`` and discard it.

**dependents(S)** (Algorithm 6, lines 5-28) is computed as the least
fixpoint of two rules, starting from ``D = {S}``:

1. removing a stream replica re-checks its source replica, then its
   destination replica (lines 12 and 16);
2. a replica that must go takes all its live input and output stream
   replicas with it (lines 22-26); it must go when

   * it is not an application and has no live output stream replica outside
     ``D`` (the paper's "useless" replica), or
   * it is not an entry point and some input port has no live input stream
     replica outside ``D``. *The paper is silent here; we remove it:* such a
     replica cannot produce its whole output (a Union would miss a stream,
     a Join or Aggregate would never see that port's punctuations and never
     close a window), and keeping it would leave a live replica that cannot work.

The group is infeasible (the paper's empty result) when it would remove an
application (cut it off from its inputs) or leave fewer than ``kmin`` live
replicas of an operator (lines 20-21). Entry-point replicas count as one
operator (``"entry"``) for ``kmin``: each holds a copy of every input tuple.
*Refinement:* the paper tests ``|C(o; D)| < kmin`` whenever it visits ``o``;
we test it only for operators the group actually removes a replica of, so an
operator already below ``kmin`` after failures blocks the removal of its
replicas but not of its spare stream replicas. A group never makes an
operator drop below ``kmin`` (or below its current count if already lower).
Because both removal rules are monotone in ``D``, the fixpoint and the
feasibility verdict do not depend on the visiting order.

**Choosing D*.** ``utility(D)`` is the sum of the utilities (§V-B, see
:mod:`replistream.gc.utility`) of the stream replicas in ``D``, ``cost(D)``
the sum of their costs. Groups of zero cost are skipped (discarding them
does not lower the cost). Ties on the ratio go to the larger cost (more saved
per step), then to the lexicographically smallest tuple of stream ids, so the
choice is deterministic. Utilities are recomputed after every discard, with
the measured weights of the survivors (their shares renormalise).

**Periods.** :func:`collect_step` is one period of the paper's collector
(one discard if the cost exceeds ``theta``); :func:`collect_garbage` repeats
until the cost is at most ``theta`` or no feasible group is left.

>>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
>>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("f#0", "f", "b"),
...                  OperatorReplica("f#1", "f", "c"), OperatorReplica("app", "app", "d", "application")],
...                 [StreamReplica("entry#0", "f#0", latency_ms=10), StreamReplica("entry#0", "f#1", latency_ms=40),
...                  StreamReplica("f#0", "app", latency_ms=10, weight=9), StreamReplica("f#1", "app", latency_ms=40, weight=1)],
...                 kmin=1, theta=30)
>>> d = choose_discard(snap)
>>> d.replicas, d.streams
(('f#1',), ('entry#0->f#1:0', 'f#1->app:0'))
>>> result = collect_garbage(snap)
>>> result.cost_after, result.stopped
(20.0, 'cost 20 <= theta 30')
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

from .snapshot import Snapshot
from .utility import Utilities, utilities

__all__ = ["Group", "Discard", "GCResult", "dependents", "explain_dependents", "candidate_groups",
           "choose_discard", "discard", "collect_step", "collect_garbage"]


@dataclass(frozen=True)
class Group:
    """What goes with a stream replica: stream ids (sorted), replica labels (sorted) and,
    per replica, why it goes (``"no live output left"``, ``"no live input left on port 1"``).

    >>> Group(("f#1->app:0",), ()).streams
    ('f#1->app:0',)
    """

    streams: tuple[str, ...]
    replicas: tuple[str, ...]
    why: tuple[tuple[str, str], ...] = ()

    def cost(self, snapshot: Snapshot) -> float:
        """Network cost of the group's stream replicas in ``snapshot``."""
        return math.fsum(snapshot.stream(s).cost for s in self.streams)

    def utility(self, utils: Utilities) -> float:
        """Sum of the utilities of the group's stream replicas."""
        return math.fsum(utils.streams.get(s, 0.0) for s in self.streams)


@dataclass(frozen=True)
class Discard:
    """One garbage-collection decision, explained: the group ``D*`` (stream ids and the
    operator replicas that become dormant), its utility, cost and ratio, the
    total cost before and after, ``theta``, ``kmin``, how many feasible groups
    were compared and how many stream replicas could not go, and a sentence.

    >>> Discard(("x->app:0",), (), 0.1, 10.0, 0.01, 30.0, 20.0, 25.0, 1, 3, 0, "cost 30 > theta 25").ratio
    0.01
    """

    streams: tuple[str, ...]
    replicas: tuple[str, ...]
    utility: float
    cost: float
    ratio: float
    cost_before: float
    cost_after: float
    theta: float
    kmin: int
    candidates: int
    blocked: int
    reason: str
    why: tuple[tuple[str, str], ...] = ()
    action: str = field(default="discard")

    def describe(self) -> str:
        """One line: what goes, the figures, why."""
        reps = f" and replica(s) {', '.join(self.replicas)}" if self.replicas else ""
        return (f"discard {len(self.streams)} stream replica(s){reps}: utility {self.utility:.4g}, "
                f"cost {self.cost:.6g}, utility/cost {self.ratio:.4g}; total cost {self.cost_before:.6g} -> "
                f"{self.cost_after:.6g} (theta {self.theta:.6g}); {self.reason}")

    def to_dict(self) -> dict:
        """JSON-ready (``theta`` None when infinite)."""
        d = asdict(self)
        d["streams"], d["replicas"] = list(self.streams), list(self.replicas)
        d["why"] = [list(w) for w in self.why]
        d["theta"] = None if math.isinf(self.theta) else self.theta
        return d


@dataclass(frozen=True)
class GCResult:
    """What :func:`collect_garbage` did: the final snapshot, the decisions in order,
    the total cost before and after, and why it stopped.

    >>> GCResult(None, [], 5.0, 5.0, "cost 5 <= theta 10").steps
    0
    """

    snapshot: Snapshot
    decisions: list[Discard]
    cost_before: float
    cost_after: float
    stopped: str

    @property
    def steps(self) -> int:
        """Number of discards."""
        return len(self.decisions)

    def to_dict(self) -> dict:
        """JSON-ready summary (without the snapshot)."""
        return {"cost_before": self.cost_before, "cost_after": self.cost_after, "stopped": self.stopped,
                "decisions": [d.to_dict() for d in self.decisions]}


class _Index:
    """Live counts of one snapshot, shared by every dependents() call on it."""

    def __init__(self, snap: Snapshot):
        self.snap = snap
        self.rep = {r.label: r for r in snap.replicas if r.live}
        self.live_in: dict[str, list] = {lab: snap.in_streams(lab) for lab in self.rep}
        self.live_out: dict[str, list] = {lab: snap.out_streams(lab) for lab in self.rep}
        self.n_out = {lab: len(v) for lab, v in self.live_out.items()}
        self.n_in: Counter = Counter((s.dst, s.port) for lab in self.rep for s in self.live_in[lab])
        self.ports = {lab: snap.ports(lab) for lab in self.rep}
        self.count = Counter(r.operator for r in self.rep.values())
        self.streams = {s.id: s for s in snap.streams if s.live}


def _closure(ix: _Index, sid: str) -> tuple[Group | None, str]:
    """dependents(S) as a fixpoint; (None, why) when infeasible."""
    kmin = ix.snap.kmin
    in_d: set[str] = set()
    gone: dict[str, str] = {}
    out_left: dict[str, int] = {}
    in_left: dict[tuple[str, int], int] = {}
    removed: Counter = Counter()
    work = [sid]
    while work:
        s_id = work.pop()
        if s_id in in_d:
            continue
        in_d.add(s_id)
        s = ix.streams[s_id]
        out_left[s.src] = out_left.get(s.src, ix.n_out[s.src]) - 1
        key = (s.dst, s.port)
        in_left[key] = in_left.get(key, ix.n_in[key]) - 1
        for lab in (s.src, s.dst):  # source first (line 12), then destination (line 16)
            if lab in gone:
                continue
            r = ix.rep[lab]
            why = ""
            if r.kind != "application" and out_left.get(lab, ix.n_out[lab]) <= 0:
                why = "no live output left"
            elif r.kind != "entry":
                for p in ix.ports[lab]:
                    if in_left.get((lab, p), ix.n_in[(lab, p)]) <= 0:
                        why = f"no live input left on port {p}"
                        break
            if not why:
                continue
            if r.kind == "application":
                return None, f"application {lab!r} would be cut off ({why})"
            removed[r.operator] += 1
            left = ix.count[r.operator] - removed[r.operator]
            if left < ix.snap.kmin:
                return None, f"{r.operator!r} would keep {left} live replica(s) (kmin {kmin})"
            gone[lab] = why
            work.extend(x.id for x in ix.live_in[lab] + ix.live_out[lab] if x.id not in in_d)
    return Group(tuple(sorted(in_d)), tuple(sorted(gone)), tuple(sorted(gone.items()))), ""


def _check_live(snapshot: Snapshot, sid: str) -> None:
    if not snapshot.stream(sid).live:
        raise ValueError(f"stream replica {sid!r} is not live")


def dependents(snapshot: Snapshot, sid: str) -> Group | None:
    """The group that must be discarded with live stream replica ``sid`` (Algorithm 6,
    lines 5-28), or None when discarding it would cut an application off or leave
    fewer than ``kmin`` live replicas of an operator.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("f#0", "f", "b"),
    ...                  OperatorReplica("f#1", "f", "c"), OperatorReplica("app", "app", "d", "application")],
    ...                 [StreamReplica("entry#0", "f#0"), StreamReplica("entry#0", "f#1"),
    ...                  StreamReplica("f#0", "app"), StreamReplica("f#1", "app")], kmin=1)
    >>> dependents(snap, "f#1->app:0").replicas     # f#1 is left without outputs
    ('f#1',)
    >>> dependents(snap.evolve(kmin=2), "f#1->app:0") is None
    True
    """
    _check_live(snapshot, sid)
    return _closure(_Index(snapshot), sid)[0]


def explain_dependents(snapshot: Snapshot, sid: str) -> str:
    """Why ``dependents(sid)`` is what it is, in one sentence.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"),
    ...                  OperatorReplica("app", "app", "d", "application")], [StreamReplica("entry#0", "app")])
    >>> explain_dependents(snap, "entry#0->app:0")
    "cannot go: 'entry' would keep 0 live replica(s) (kmin 1)"
    """
    _check_live(snapshot, sid)
    group, why = _closure(_Index(snapshot), sid)
    if group is None:
        return f"cannot go: {why}"
    parts = [f"{lab} ({w})" for lab, w in group.why]
    return (f"goes with {len(group.streams) - 1} other stream replica(s)"
            + (f" and replica(s) {', '.join(parts)}" if parts else ""))


def candidate_groups(snapshot: Snapshot, keep: Iterable[str] = ()) -> tuple[list[Group], dict[str, str]]:
    """``C = {dependents(S) : S live} - {empty}`` (Algorithm 6, line 2), without repeats,
    and the stream replicas that cannot go, with the reason.

    ``keep``: stream replica ids and replica labels that must stay live (revived
    within their hold period, :class:`~replistream.gc.RevivalDamper`, §V-C); a group
    that would discard one of them is not a candidate.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("f#0", "f", "b"),
    ...                  OperatorReplica("f#1", "f", "c"), OperatorReplica("app", "app", "d", "application")],
    ...                 [StreamReplica("entry#0", "f#0"), StreamReplica("entry#0", "f#1"),
    ...                  StreamReplica("f#0", "app"), StreamReplica("f#1", "app")], kmin=1)
    >>> groups, blocked = candidate_groups(snap)
    >>> [g.replicas for g in groups], blocked
    ([('f#0',), ('f#1',)], {})
    >>> [g.replicas for g in candidate_groups(snap, keep={"f#1"})[0]]
    [('f#0',)]
    """
    keep = frozenset(keep)
    ix = _Index(snapshot)
    seen: dict[tuple[str, ...], Group] = {}
    blocked: dict[str, str] = {}
    for sid in sorted(ix.streams):
        group, why = _closure(ix, sid)
        if group is None:
            blocked[sid] = why
        elif keep and (keep.intersection(group.streams) or keep.intersection(group.replicas)):
            blocked[sid] = "held: it would discard a replica or stream replica revived within its hold period"
        else:
            seen.setdefault(group.streams, group)
    return list(seen.values()), blocked


def _best(snapshot: Snapshot, groups: list[Group], utils: Utilities):
    best = None
    for g in groups:
        cost = g.cost(snapshot)
        if not cost > 0:
            continue
        util = g.utility(utils)
        key = (util / cost, -cost, g.streams)
        if best is None or key < best[0]:
            best = (key, g, util, cost)
    return best


def choose_discard(snapshot: Snapshot, utils: Utilities | None = None, keep: Iterable[str] = ()) -> Discard | None:
    """``D*``: the feasible group with the least utility per unit of cost (Algorithm 6, line 3),
    as an explained :class:`Discard`, or None when no group of positive cost may go.

    It does not look at ``theta``: :func:`collect_step` does. Groups touching ``keep``
    (held revived items, see :func:`candidate_groups`) are not candidates.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("entry#1", "entry", "b", "entry"),
    ...                  OperatorReplica("app", "app", "c", "application")],
    ...                 [StreamReplica("entry#0", "app", latency_ms=5, weight=3), StreamReplica("entry#1", "app", latency_ms=8, weight=1)])
    >>> print(choose_discard(snap).describe())
    discard 1 stream replica(s) and replica(s) entry#1: utility 0.25, cost 8, utility/cost 0.03125; total cost 13 -> 5 (theta inf); least utility/cost of 2 feasible group(s)
    """
    utils = utilities(snapshot) if utils is None else utils
    groups, blocked = candidate_groups(snapshot, keep)
    best = _best(snapshot, groups, utils)
    if best is None:
        return None
    (ratio, _, _), g, util, cost = best
    before = snapshot.total_cost()
    going = set(g.streams)
    after = math.fsum(s.cost for s in snapshot.streams if s.live and s.id not in going)
    reason = f"least utility/cost of {len(groups)} feasible group(s)"
    if blocked:
        reason += (f"; {len(blocked)} stream replica(s) cannot go (kmin {snapshot.kmin}, an application cut off"
                   f"{' or held after revival' if keep else ''})")
    return Discard(g.streams, g.replicas, util, cost, ratio, before, after, snapshot.theta, snapshot.kmin,
                   len(groups), len(blocked), reason, g.why)


def discard(snapshot: Snapshot, what: Discard | Group | Iterable[str]) -> Snapshot:
    """The snapshot after discarding a group: its stream replicas stop, its operator
    replicas become dormant (kept for revival, §V-C).

    ``what`` is a :class:`Discard`, a :class:`Group` or stream ids (then the
    group is ``dependents`` of each, merged; a ``ValueError`` if infeasible).

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("entry#1", "entry", "b", "entry"),
    ...                  OperatorReplica("app", "app", "c", "application")],
    ...                 [StreamReplica("entry#0", "app"), StreamReplica("entry#1", "app")])
    >>> discard(snap, ["entry#1->app:0"]).replica("entry#1").state
    'dormant'
    """
    if isinstance(what, (Discard, Group)):
        return snapshot.evolve(streams_live={s: False for s in what.streams},
                               states={r: "dormant" for r in what.replicas})
    snap = snapshot
    for sid in what:
        if not snap.stream(sid).live:
            continue  # already gone with an earlier one
        g = dependents(snap, sid)
        if g is None:
            raise ValueError(f"stream replica {sid!r} {explain_dependents(snap, sid)}")
        snap = discard(snap, g)
    return snap


def _stop_reason(snapshot: Snapshot) -> str | None:
    cost = snapshot.total_cost()
    if not cost > snapshot.theta:
        return f"cost {cost:.6g} <= theta {snapshot.theta:.6g}"
    return None


def collect_step(snapshot: Snapshot, keep: Iterable[str] = ()) -> tuple[Snapshot, Discard | None]:
    """One period of Algorithm 6: if the total cost exceeds ``theta``, discard ``D*``
    (never a group touching ``keep``, see :func:`candidate_groups`).

    Returns the new snapshot and the decision (None if nothing was discarded).

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("entry#1", "entry", "b", "entry"),
    ...                  OperatorReplica("app", "app", "c", "application")],
    ...                 [StreamReplica("entry#0", "app", latency_ms=5), StreamReplica("entry#1", "app", latency_ms=8)], theta=20)
    >>> collect_step(snap)[1] is None        # cost 13 <= 20
    True
    """
    if _stop_reason(snapshot) is not None:
        return snapshot, None
    d = choose_discard(snapshot, keep=keep)
    if d is None:
        return snapshot, None
    d = replace(d, reason=f"total cost {d.cost_before:.6g} > theta {d.theta:.6g}: {d.reason}")
    return discard(snapshot, d), d


def collect_garbage(snapshot: Snapshot, max_steps: int | None = None, keep: Iterable[str] = ()) -> GCResult:
    """Algorithm 6 until the total cost is at most ``theta`` (or no feasible group is left,
    or ``max_steps`` discards were made). ``max_steps=1`` is one period, like :func:`collect_step`.
    ``keep``: stream replica ids and replica labels held after a revival (§V-C, Hwang;
    :meth:`~replistream.gc.RevivalDamper.held`): no discard touches them.

    The cost falls strictly with every discard; ``kmin`` is never violated.

    >>> from replistream.gc.snapshot import OperatorReplica, Snapshot, StreamReplica
    >>> snap = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("entry#1", "entry", "b", "entry"),
    ...                  OperatorReplica("app", "app", "c", "application")],
    ...                 [StreamReplica("entry#0", "app", latency_ms=5), StreamReplica("entry#1", "app", latency_ms=8)], theta=0)
    >>> r = collect_garbage(snap)
    >>> r.steps, r.cost_after, r.stopped
    (1, 5.0, "no feasible group: 1 stream replica(s) cannot go ('entry' would keep 0 live replica(s) (kmin 1))")
    """
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"max_steps must be >= 0 or None, got {max_steps}")
    before = snapshot.total_cost()
    decisions: list[Discard] = []
    snap = snapshot
    while True:
        stop = _stop_reason(snap)
        if stop is not None:
            break
        if max_steps is not None and len(decisions) >= max_steps:
            stop = f"max_steps {max_steps} reached (cost {snap.total_cost():.6g} > theta {snap.theta:.6g})"
            break
        new, d = collect_step(snap, keep)
        if d is None:
            groups, blocked = candidate_groups(snap, keep)
            if blocked:
                first = sorted(set(blocked.values()))
                stop = (f"no feasible group: {len(blocked)} stream replica(s) cannot go "
                        f"({'; '.join(first[:3])}{'; ...' if len(first) > 3 else ''})")
            else:
                stop = "no feasible group of positive cost"
            break
        decisions.append(d)
        snap = new
    return GCResult(snap, decisions, before, snap.total_cost(), stop)
