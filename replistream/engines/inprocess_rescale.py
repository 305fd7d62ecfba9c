"""Live rescaling on the in-process engine (issue #41; Megaphone, Hoffmann et al. 2019, §3.3): what
:class:`~replistream.engines.inprocess.InProcessEngine` does with a
:class:`~replistream.sources.Rescale` sentinel. The replica-side protocol (giving and taking bins
at a logical time, why the output stays exact) is :mod:`replistream.replica.rescale`, shared with
Ray; the routing change is :class:`~replistream.partition.Switch`; this module is the engine's
control side, as :mod:`replistream.engines.ray.rescale` is Ray's. Its engine-neutral part,
:class:`RescaleControl`, is shared with the simulator (:mod:`replistream.sim.rescale`):

1. ``T0`` is the largest timestamp any sender routed to the operator so far (:class:`TrackedRouter`;
   every sender shares one router in process), or the largest punctuation its upstream replicas
   passed, if larger: no copy of a tuple later than ``T0`` has been routed anywhere, so every
   sender routes every copy of a tuple alike;
2. the bins that change owner between the balanced maps (:func:`~replistream.partition.assign_bins`)
   are cut into steps (:func:`plan_steps`, as Ray cuts them), step ``i`` at ``T0 + i * gap``; the
   operator's router takes the :class:`~replistream.partition.Switch`;
3. more partitions: the new ones' ``k`` replicas start (on the servers of partition 0's replicas),
   fed by every live upstream replica and feeding every live downstream replica (new
   duplicate-filter channels in the new partitions' groups);
4. every replica of a giving or taking partition gets the steps (:class:`~replistream.replica.rescale.Moves`);
   a giving replica's state for a step (taken when its watermark passes the step's time) goes to
   every replica of the taking partition as a message the scheduler delivers at random, like a
   channel's head (:class:`StateMessage`; lost if its sender dies first: the giver's peers send
   theirs; the first copy installs);
5. fewer partitions: a leaving partition's replica *closes* once it gave every bin and its
   watermark reached the last step's time: it sends ``END`` downstream (the downstream duplicate
   filters stop waiting for its partition) and emits nothing more. It stays attached to its
   senders, so a straggling copy or a late tuple routed to it by its old bin meets its duplicate
   filter and logic (set aside as in the reference run) instead of vanishing.

A rescale that fires while another of the same operator is still moving bins (some replica, a slow
one, has not given or installed a step yet) starts at once: its steps are later than the other's,
and :class:`~replistream.replica.rescale.Moves` gives a bin only after taking it, and takes back a
bin it gave. One whose operator's stream already ended changes nothing (recorded with ``"skipped"``).

An operator with several inputs (a join) rescales too: the shared protocol holds each input's
punctuation at the first step's time not done (:meth:`~replistream.replica.rescale.Moves._capped`),
so no input's punctuation purges state a tuple of the other, routed to the new owner, still
needs. Not yet: starting again a partition
that a rescale to fewer partitions retired earlier in the run (a one-line error when it would),
random crashes (``crash=True``) of the replicas a rescale starts, hand-over (Revive, AddReplica)
next to a partitioned operator.

>>> from replistream import Query
>>> from replistream.sources import Rescale
>>> from replistream.testing import assert_same_output, chunked, run_reference, run_replicated
>>> q = Query(); s = q.source("s", {"k": "i8"}, punctuate_every=4)
>>> _ = s.window(size=8, by="k", name="w").sink("out")
>>> recs = [{"ts": t, "k": t % 7} for t in range(80)]
>>> data = {"s": chunked(recs[:20], 5) + [Rescale("w", 3, "all-at-once")] + chunked(recs[20:50], 5)
...         + [Rescale("w", 1, "batched", bins_per_step=2, gap=3)] + chunked(recs[50:], 5)}
>>> rep = run_replicated(q, data, k=2, seed=1, parallelism={"w": 1}, bits=3)
>>> assert_same_output(run_reference(q, data).outputs["out"], rep.outputs["out"])
>>> [(r["from"], r["to"], r["retired_replicas"]) for r in rep.stats["harness"].rescales]
[(1, 3, []), (3, 1, ['w.1#0', 'w.1#1', 'w.2#0', 'w.2#1'])]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np

from ..errors import QueryError
from ..operators.base import NO_PUNCTUATION
from ..partition import BinMap, Router, Switch, partition_label
from ..plan import is_stateful
from ..replica.core import ReplicaCore
from ..replica.rescale import Move, Moves, plan_steps
from ..schema import END, TS, Punctuation
from ..sources import Rescale

if TYPE_CHECKING:
    from .inprocess import InProcessEngine, HarnessReplica

__all__ = ["STRATEGIES", "GAP", "TrackedRouter", "StateMessage", "RescaleControl", "Rescaler", "plan_steps",
           "check_rescales"]

#: How the moving bins are cut into steps (as on Ray).
STRATEGIES = ("fluid", "batched", "all-at-once")

#: Event time between two steps of a fluid or batched rescale by default: 1 ms (Ray's ``GAP_US``).
GAP = 1_000


class TrackedRouter(Router):
    """A :class:`~replistream.partition.Router` that remembers the largest timestamp it routed
    (``max_ts``): a rescale's ``T0`` is at least that, so no copy of a later tuple was routed yet.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"}); _ = s.window(10, by="k", name="w").sink("o"); q = q.build()
    >>> r = TrackedRouter(q, "w", BinMap.even(2, bits=2))
    >>> _ = r.split(0, q.schema_of("s").from_columns({"ts": [4, 9], "k": [1, 2]}, ids=[1, 2])); r.max_ts
    9
    """

    max_ts: int = NO_PUNCTUATION

    def split(self, port: int, batch: np.ndarray) -> list[np.ndarray]:
        if len(batch):
            top = int(batch[TS].max())
            if top > self.max_ts:
                self.max_ts = top
        return super().split(port, batch)


def check_rescales(query, parallelism: dict, bits: int, events: Iterable[Rescale],
                   engine: str = "the in-process engine") -> dict[str, int]:
    """Check ``events`` (in the order they come) before a run; returns ``{operator: the most
    partitions it will have}``. A one-line ``QueryError`` (``ValueError`` for a wrong number)
    names the mistake and the fix; ``engine`` names the engine in a refusal of what it cannot do.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"}); _ = s.window(10, by="k", name="w").sink("o"); q = q.build()
    >>> check_rescales(q, {"w": 1}, 4, [Rescale("w", 4), Rescale("w", 2)])
    {'w': 4}
    >>> check_rescales(q, {}, 4, [Rescale("w", 2)])
    Traceback (most recent call last):
    ...
    replistream.errors.QueryError: Rescale: 'w' is not partitioned; run it with parallelism={'w': 1} (or more) to rescale it while it runs
    """
    now = dict(parallelism)
    most = dict(parallelism)
    retired: dict[str, set[int]] = {}
    for ev in events:
        node = ev.operator
        if node not in query.operators:
            raise QueryError(f"Rescale: {node!r} is not an operator of query {query.name!r} "
                             f"(operators: {', '.join(query.operators)})")
        if node not in now:
            raise QueryError(f"Rescale: {node!r} is not partitioned; run it with parallelism={{{node!r}: 1}} (or more) "
                             f"to rescale it while it runs")
        p = ev.p
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
            raise ValueError(f"Rescale: p (the number of partitions) must be an integer >= 1, got {p!r}")
        if p > 1 << bits:
            raise ValueError(f"Rescale: {p} partitions cannot share 2**{bits} bins; use at most {1 << bits}")
        if ev.strategy not in STRATEGIES:
            raise ValueError(f"Rescale: unknown strategy {ev.strategy!r}; choose one of {STRATEGIES}")
        if ev.strategy == "batched" and ev.bins_per_step is not None and int(ev.bins_per_step) < 1:
            raise ValueError(f"Rescale: bins_per_step must be >= 1 (bins moved per step; None: about 16 steps), "
                             f"got {ev.bins_per_step!r}")
        if isinstance(ev.gap, bool) or not isinstance(ev.gap, (int, np.integer)) or ev.gap < 1:
            raise ValueError(f"Rescale: gap (event time between steps) must be an integer >= 1, got {ev.gap!r}")
        _refuse_restart(node, now[node], p, retired.get(node, set()), engine)
        retired.setdefault(node, set()).update(range(p, now[node]))
        now[node] = p
        most[node] = max(most[node], p)
    return most


def _refuse_restart(node: str, old_p: int, p: int, retired: set[int], engine: str) -> None:
    again = sorted(set(range(old_p, p)) & retired)
    if again:
        raise QueryError(f"Rescale: {node!r} to {p} partitions would start {partition_label(node, again[0])} again after "
                         f"a rescale retired it; {engine} does not restart retired partitions yet: "
                         f"rescale to at most {min(again)} partitions")


@dataclass(eq=False)
class StateMessage:
    """The bins' state a giving replica sends a taking one: ``batch`` is ``[(step ids, state)]``
    (:meth:`~replistream.replica.rescale.Moves.install_many`), ``steps`` the steps it carries."""

    sender: "HarnessReplica"
    receiver: "HarnessReplica"
    batch: list
    steps: tuple

    def deliverable(self) -> bool:
        """The receiver gave every bin of these steps it was to give earlier. A slow replica may
        still hold a bin it gives at an earlier rescale's step when the bin comes back to its
        partition at a later one; installing the bin then would mix the two states. (On Ray a
        rescale waits until every replica gave its steps; here the next may start before.)"""
        m = self.receiver.core.moves
        if m is None or not m.give:
            return True
        for g in m.give:
            for s in self.steps:
                if g.at < s.at and not set(g.bins).isdisjoint(s.bins):
                    return False
        return True


class RescaleControl:
    """The engine-neutral control side of the rescales of one run of ``engine`` (an engine with
    ``query``, ``groups`` (node -> replicas with ``label``, ``partition``, ``alive``, ``core``),
    ``routers`` (:class:`TrackedRouter` per partitioned operator) and ``parallelism``): the steps,
    the routing switch, the replicas' :class:`~replistream.replica.rescale.Moves`, the state
    messages' grouping and bookkeeping, the retiring partitions' closing. The in-process engine
    (:class:`Rescaler`) and the simulator (:mod:`replistream.sim.rescale`) give the hooks: the
    rescale's ``T0`` (``_t0``), starting new partitions (``_start_partitions``), sending a
    :class:`StateMessage` (``_send``), emitting a replica's outputs (``_emit``), whether a replica
    still works (``_working``) and a new record (``_new_record``).

    ``records``: one dict per rescale (``from``, ``to``, ``strategy``, ``at`` (``T0``), ``steps``,
    ``bins_moved``, ``new_replicas``, ``retired_replicas``, ``sent``/``lost`` state messages);
    ``ever``: per operator, how many partitions it has had at most.

    >>> RescaleControl.engine_name
    'this engine'
    """

    #: the engine's name in a refusal of what it cannot do
    engine_name = "this engine"

    def __init__(self, engine):
        self.e = engine
        self.records: list[dict] = []
        self.ever: dict[str, int] = dict(engine.parallelism)
        self.retired: dict[str, set[int]] = {}
        self.closing: dict[int, int] = {}  # id(replica) -> the time its watermark must reach
        self.closed: set[int] = set()  # id(replica) of the closed ones
        self._steps: dict[str, list[Move]] = {}  # operator -> the steps of its current rescale
        self._switches: dict[str, list[Switch]] = {}
        self._record_of: dict[str, dict] = {}  # step id -> its rescale's record
        self._last_at: dict[str, int] = {}  # operator -> the time of its last rescale's last step

    # -- the engine's hooks -----------------------------------------------------------------------
    def _t0(self, node: str) -> int:
        raise NotImplementedError

    def _start_partitions(self, node: str, old_p: int, p: int) -> list[str]:
        raise NotImplementedError

    def _send(self, msg: StateMessage) -> None:
        raise NotImplementedError

    def _emit(self, r, out: list) -> None:
        raise NotImplementedError

    def _working(self, r) -> bool:
        return r.alive and r.core is not None

    def _new_record(self, rec: dict) -> None:
        pass

    # -- starting ------------------------------------------------------------------------------
    def begin(self, ev: Rescale) -> dict:
        """Run ``ev`` now; its record."""
        return self._begin(ev)

    def _begin(self, ev: Rescale) -> dict:
        e, q = self.e, self.e.query
        node, p = ev.operator, int(ev.p)
        old_p = e.parallelism[node]
        rec = {"operator": node, "from": old_p, "to": p, "strategy": ev.strategy, "at": None, "steps": 0,
               "bins_moved": 0, "new_replicas": [], "retired_replicas": [], "sent": 0, "lost": 0}
        self.records.append(rec)
        self._new_record(rec)
        if p == old_p:
            return rec
        t0 = self._t0(node)
        if node in self._last_at:  # after every step of the rescales before (a slow replica may not have taken them)
            t0 = max(t0, self._last_at[node] + 1)
        if t0 >= END:
            rec["skipped"] = "the operator's stream had ended"
            return rec
        _refuse_restart(node, old_p, p, self.retired.get(node, set()), self.engine_name)
        router = e.routers[node]
        current, bits = router.final(), router.binmap.bits
        new = BinMap.even(p, bits)
        strategy = ev.strategy if is_stateful(q, node) else "all-at-once"  # no state: one switch
        steps, times = plan_steps(node, current, new, t0, strategy, ev.bins_per_step, ev.gap,
                                  stamp=f"{node}@{t0}#{len(self.records)}")
        self._last_at[node] = max([t0, *(m.at for m in steps)])
        rec.update(at=t0, strategy=strategy, steps=len(steps), bins_moved=len(times))
        if p > old_p:  # every sender knows the new partitions (nothing routed to them yet), then they start
            rec["new_replicas"] = self._start_partitions(node, old_p, p)
        switches = [*router.moves, Switch.between(current, new, times)]
        tracked = TrackedRouter(q, node, router.binmap, switches)
        tracked.max_ts = router.max_ts
        e.routers[node] = tracked
        e.parallelism[node] = p
        self.ever[node] = max(self.ever.get(node, 1), p)
        if is_stateful(q, node):
            involved = {m.src for m in steps} | {m.dst for m in steps}
            for r in e.groups[node]:
                if r.partition in involved and r.core is not None and id(r) not in self.closed:
                    if r.core.moves is None:
                        r.core.moves = Moves(partition=r.partition)
                    r.core.moves.add(steps)
            self._steps[node] = steps
        self._record_of.update((m.id, rec) for m in steps)
        if p < old_p:
            last = self._last_at[node]
            self.retired.setdefault(node, set()).update(range(p, old_p))
            for r in e.groups[node]:
                if r.partition in range(p, old_p) and id(r) not in self.closed:
                    self.closing[id(r)] = last
                    rec["retired_replicas"].append(r.label)
            for r in list(e.groups[node]):
                if id(r) in self.closing and self._working(r):
                    self._emit(r, self._close_if_done(r, []))
        return rec

    # -- the data path ---------------------------------------------------------------------------
    def after(self, r, out: list) -> list:
        """What ``r`` emits of ``out`` (its core's outputs, a replica of a rescaled operator): its
        given bins' state goes out as messages; a closed replica emits nothing more; a leaving one
        closes when it can."""
        if id(r) in self.closed:
            if any(not isinstance(it, Punctuation) and len(it) for it in out):
                raise RuntimeError(f"{r.label} emitted tuples after its partition was retired by a rescale "
                                   f"(it had given every bin): {sum(len(it) for it in out if not isinstance(it, Punctuation))} lost")
            return []
        moves = r.core.moves
        if moves is not None and moves.shipped:
            per_dst: dict[int, list] = {}
            for group, state in moves.shipped:
                per_dst.setdefault(int(group[0].dst), []).append((group, state))
            moves.shipped.clear()
            for dst, given in per_dst.items():
                batch = [(tuple(m.id for m in group), state) for group, state in given]
                steps = tuple(m for group, _ in given for m in group)
                for t in self.e.groups[r.node]:
                    if t.partition == dst and t.alive and t.core is not None and id(t) not in self.closed:
                        self._send(StateMessage(r, t, batch, steps))
                        self._record(steps[0])["sent"] += 1
        out = self._close_if_done(r, out)
        return out

    def _record(self, step: Move) -> dict:
        return self._record_of.get(step.id, {"sent": 0, "lost": 0})

    def _close_if_done(self, r, out: list) -> list:
        after = self.closing.get(id(r))
        m = r.core.moves
        if after is None or r.core.logic.watermark < after or (m is not None and (m.give or m.take)):
            return out
        del self.closing[id(r)]
        self.closed.add(id(r))
        return [*out, Punctuation(END)]

    def install(self, msg: StateMessage) -> list:
        """Install ``msg`` at its receiver (deliverable, alive); what the receiver emits then."""
        r = msg.receiver
        core = r.core
        out = core.moves.install_many(core, msg.batch)
        if core.output_log is not None and out:
            core.output_log.append(out)
        return self.after(r, out)

    # -- the end ---------------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """What a run that ended left undone (steps not given or installed by a working replica,
        tuples held, partitions not closed): empty when all is done."""
        out = []
        for node in self._steps:
            for r in self.e.groups[node]:
                m = r.core.moves if self._working(r) else None
                if m is None:
                    continue
                if m.take or m.give or m.waiting:
                    out.append(f"{r.label}: {len(m.take)} step(s) to take, {len(m.give)} to give, "
                               f"{m.waiting} item(s) held")
        for node, group in self.e.groups.items():
            for r in group:
                if id(r) in self.closing and self._working(r):
                    out.append(f"{r.label}: its partition was to retire but never closed")
        return out

    def is_closed(self, r) -> bool:
        """``r``'s partition was retired by a rescale and ``r`` closed."""
        return id(r) in self.closed


class Rescaler(RescaleControl):
    """The rescales of one run of the in-process ``engine`` (made by the engine at the first
    :class:`Rescale`): :class:`RescaleControl` with the engine's hooks. ``inflight``: the state
    messages not delivered yet, which its scheduler delivers at random like a channel's head
    (:meth:`candidates`, :meth:`deliver`)."""

    engine_name = "the in-process engine"

    def __init__(self, engine: "InProcessEngine"):
        super().__init__(engine)
        self.inflight: list[StateMessage] = []

    def _new_record(self, rec: dict) -> None:
        rec["harness_step"] = self.e.stats.steps
        self.e.stats.rescales.append(rec)

    def _working(self, r: "HarnessReplica") -> bool:
        return r.ready

    def _emit(self, r: "HarnessReplica", out: list) -> None:
        self.e._emit(r, out)

    def _send(self, msg: StateMessage) -> None:
        self.inflight.append(msg)

    def _t0(self, node: str) -> int:
        """The largest timestamp routed to ``node`` so far, or punctuation its upstream replicas
        passed (an upper bound: an operator replica's watermark), whichever is larger."""
        e, q = self.e, self.e.query
        t0 = e.routers[node].max_ts
        for up in q.inputs_of(node):
            for u in e.groups[up]:
                if u.items is not None:  # an entry copy: the last punctuation it emitted
                    for it in reversed(u.items[:u.cursor]):
                        if isinstance(it, Punctuation):
                            t0 = max(t0, int(it.p))
                            break
                elif u.core is not None:
                    t0 = max(t0, int(u.core.logic.watermark))
        return max(t0, 0)

    def _start_partitions(self, node: str, old_p: int, p: int) -> list[str]:
        """``k`` replicas of each new partition, connected to every live upstream replica and every
        live downstream replica."""
        from .inprocess import HarnessChannel, HarnessReplica

        e, q = self.e, self.e.query
        servers = [r.server for r in e.groups[node] if r.partition == 0]
        labels = []
        for part in range(old_p, p):
            ins = [[u for u in e.groups[up] if u.alive] for up in q.inputs_of(node)]
            chans = [len(us) for us in ins]
            groups = [None if all(u.partition is None for u in us) else [u.partition for u in us] for us in ins]
            if any(c == 0 for c in chans):
                raise RuntimeError(f"rescale of {node!r}: an input has no live upstream replica to feed "
                                   f"{partition_label(node, part)}")
            for i, server in enumerate(servers):
                core = ReplicaCore(q, node, chans, e.strict, retain=True, groups=groups)
                new = HarnessReplica(node, i, core, server, history=[] if e.audit else None, partition=part)
                e.groups[node].append(new)
                for port, us in enumerate(ins):
                    for idx, u in enumerate(us):
                        ch = HarnessChannel(u, new, port, idx, e.erng.lognormvariate(0.0, e.speed_spread), partition=part)
                        u.out.append(ch)
                        e.channels.append(ch)
                for v, port in q.outputs_of(node):
                    for d in e.groups[v]:
                        if d.alive and d.core is not None:
                            idx = d.core.add_channel(port, part)
                            ch = HarnessChannel(new, d, port, idx, e.erng.lognormvariate(0.0, e.speed_spread),
                                          partition=d.partition)
                            new.out.append(ch)
                            e.channels.append(ch)
                labels.append(new.label)
        return labels

    def candidates(self) -> list[StateMessage]:
        """The state messages the scheduler may deliver now (those of a dead sender or to a dead
        receiver are lost and dropped)."""
        keep = []
        for msg in self.inflight:
            if msg.sender.alive and msg.receiver.alive:
                keep.append(msg)
            else:
                self._record(msg.steps[0])["lost"] += 1
        self.inflight = keep
        return [msg for msg in keep if msg.receiver.scheduled and msg.deliverable()]

    def deliver(self, msg: StateMessage) -> None:
        """Install a state message at its receiver and emit what it lets through."""
        self.inflight.remove(msg)
        self.e._emit(msg.receiver, self.install(msg))
