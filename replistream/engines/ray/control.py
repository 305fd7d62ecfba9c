"""Garbage collection and revival on Ray: the coordinator's loop (Hwang §V-B, §V-C).

The *decisions* are the pure functions of :mod:`replistream.gc` (utility,
Algorithm 6, the revival policy). This module measures what they need on a
running :class:`~replistream.engines.ray.deployment.Deployment`, calls them, and
applies what they return to the actors.

**Its walls.** It reads and changes the replicas and stream replicas through
the deployment's :class:`~replistream.engines.ray.topology.Topology` (its
snapshots are built from it), asks the deployment to start, retire and report
replicas (``start_replica``, ``retire``, ``mark_failed``), talks to actors
through their public methods, and takes peer choices from
:mod:`replistream.replica.handover`. Its ``lock`` is the outermost lock of the
driver (see :mod:`replistream.engines.ray`).

**Where the loop runs.** In a thread of the driver, owned by the
deployment (:class:`ReplicaManager`), not inside the ``CoordinatorActor``:
the driver already holds every actor handle, the network conditions that
failure injection edits, and the feeder that must know the live entry
replicas; a Ray actor that blocks on other actors' calls for seconds (a
revival starts actors and moves checkpoints) would also stall the
coordinator's other methods. Every decision is also reported to the
coordinator actor (``report("gc" | "revival", ...)``), so its log has them.

**Every utility period** (``utility_period_s``; paper 30 s) the loop

1. asks every live actor for its :meth:`gc_report` (duplicate-filter weights
   per input channel, tuples flushed per output stream, input delay);
2. builds a :class:`~replistream.gc.Snapshot`: the replicas and stream
   replicas as the loop last left them, each stream replica with its logical
   stream's rate (tuples/s since the run started, the largest over the
   stream's live producers: every replica of a stream carries the same
   tuples), the emulated latency between the two servers *now* (injected
   delays included; a cut link counts as 60 s) and the weight ``w(S)`` its
   destination's filter gave it *during the last period* (so utility follows
   current conditions);
3. records the network cost (``Deployment.network_cost_history()``); sets
   ``theta`` from ``theta_fraction`` of the first positive cost if no
   absolute ``theta`` was given;
4. every ``gc_period_s`` (paper 5 min), if the cost exceeds ``theta``, runs
   Algorithm 6 for up to ``max_steps`` discards (:func:`~replistream.gc.collect_garbage`)
   and applies them;
5. with revival on, first replaces at once every *link-bound* hindered
   replica (:meth:`ReplicaManager.link_bound`: its inputs are functioning but
   every link into its server is slower than the threshold, so reviving a
   stream or an upstream replica there cannot help) on a server whose links
   are all fast; otherwise runs the :class:`~replistream.gc.RevivalPolicy` on
   the replicas' input delays (threshold ``threshold_s``, paper 10 s; then
   proactive revival while the cost is below ``theta``) and applies it.

**Applying a discard.** Each discarded stream replica is removed from its
source's outbox (the sender stops sending; the destination's duplicate
filter keeps the channel, which never holds back progress: the filter passes
a punctuation as soon as any channel brings it). A replica left dormant is
an operator replica: its actor is killed (what is needed to revive it is its
server, kept in the snapshot, and a live peer's checkpoint plus the
upstream retention logs); or an entry replica: it keeps running and being
fed by the feeder (its input cannot be replayed later), without output links,
its retention trimmed to what the live entry replicas' consumers acknowledged.

**Applying a revival** (revive a stream replica, revive a dormant replica,
create one, replace one). A replica to start is created *pending* on its
server; every upstream replica feeding it adds a link and replays its
retention log; then a live peer gives a checkpoint
(:meth:`~replistream.replica.ReplicaCore.checkpoint`: state, maximum
punctuation ``p`` per port, ids with ``ts > p`` already applied, and the
peer's retained output) which the new replica installs before processing
what it buffered, so it applies only what the checkpoint does not reflect
(docs/design.md, decision 7). The subscription comes first and the peer is chosen
so that on every port one of the new replica's feeders also feeds the peer:
that feeder's retention log then holds every tuple above the peer's ``p``.
Then its output links are added (new channels at the destinations, replaying
the adopted output), then revived stream replicas between running replicas
get a new channel and a replay, and last what a replacement discards goes.
Every (re)connection uses a new filter channel, so a replay never breaks a
channel's punctuation order.

>>> GCConfig(utility_period_s=1, gc_period_s=5, theta_fraction=0.5).validate().cooldown()
2.0
"""
from __future__ import annotations

import json
import math
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any


from . import lockorder
from ...gc import ENTRY, PartitionView, RevivalPolicy, Snapshot, collect_garbage
from ...plan import label_group, replica_partition
from .common import json_default
from .handover import HandOver
from .meter import CUT_MS, Meter

__all__ = ["CUT_MS", "GCConfig", "ReplicaManager"]


@dataclass
class GCConfig:
    """Settings of the coordinator's garbage collection and revival loop (Hwang §V-B, §V-C).

    * ``utility_period_s``: how often utilities, cost and delays are measured (paper 30 s);
    * ``gc_period_s``: how often Algorithm 6 may discard (paper 5 min); ``gc=False`` never;
    * ``theta`` (absolute, tuples/s x ms) or ``theta_fraction`` (of the first measured
      cost): the target network cost; neither: no target (nothing is discarded);
    * ``kmin``: fewest live replicas an operator keeps (Algorithm 6 never goes below); None
      (default): ``min(2, k)``, so one crash per operator stays masked after collection;
    * ``max_steps``: discards per GC period (paper 1; None: until cost <= theta);
    * ``revival``, ``threshold_s`` (paper 10 s), ``proactive`` (revive while cost < theta),
      ``max_proactive`` items per period;
    * ``cooldown_s``: a replica involved in a delay-triggered revival is not judged again
      for this long (default two utility periods), so it is not escalated before the
      fix shows;
    * ``d_min_ms``: Algorithm 5's minimum latency between peers for a new replica;
    * ``rate_window_s``: a stream's rate is what its busiest producer flushed over the
      last this many seconds (default ten utility periods); a producer started later
      (revived, new) is measured from its own start, and a stream whose producers are all
      new keeps its last rate until one of them has been measured;
    * ``log_path``: also write every event as one JSON line there;
    * ``rebalance``: each utility period, measure every replica's load (its share of a core:
      processing time, stretched on a slowed server, per second) and, when a server's load
      passes ``alpha`` x its capacity (Algorithm 5's load bound, Hwang §V-A), move its busiest
      operator replica live (``move_strategy``, Megaphone §3.3) to the server Algorithm 5
      chooses among those that stay within the bound with it; then wait
      ``rebalance_cooldown_s`` (default two utility periods) before the next move, so the
      loads are measured again first. Every decision is logged with its reason.
    * ``dormant_every_s``: once an operator runs on one live replica (collection went down to
      ``kmin=1``, or its peers failed), that replica sends the coordinator a checkpoint this
      often, at a punctuation, and its upstream replicas keep their output since that
      checkpoint; if the last replica is lost too, a new one is revived from the checkpoint and
      that output (Rhino's dormant replica, Del Monte 2017, on Ray) instead of the run ending.
      With ``parallelism=``, each partition of an operator counts on its own: a partition down
      to one live replica gets a dormant checkpoint of its own (kept under ``"op.P"``).
      None: no dormant checkpoints.

    >>> GCConfig(theta=100.0, revival=True, threshold_s=2).validate().threshold_s
    2
    >>> GCConfig(kmin=0).validate()
    Traceback (most recent call last):
    ...
    ValueError: GCConfig.kmin must be an integer >= 1, got 0
    """

    utility_period_s: float = 30.0
    gc_period_s: float = 300.0
    theta: float | None = None
    theta_fraction: float | None = None
    kmin: int | None = None
    gc: bool = True
    max_steps: int | None = 1
    revival: bool = False
    threshold_s: float = 10.0
    proactive: bool = True
    max_proactive: int | None = 1
    cooldown_s: float | None = None
    d_min_ms: float = 0.0
    rate_window_s: float | None = None
    log_path: str | None = None
    rebalance: bool = False
    alpha: float = 0.8
    move_strategy: str = "fluid"
    rebalance_cooldown_s: float | None = None
    dormant_every_s: float | None = 1.0

    def validate(self) -> "GCConfig":
        """Raise ``ValueError`` naming the bad setting; returns self."""
        for name in ("utility_period_s", "gc_period_s", "threshold_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"GCConfig.{name} must be a finite number > 0 (seconds), got {v!r}")
        if self.kmin is not None and (not isinstance(self.kmin, int) or isinstance(self.kmin, bool) or self.kmin < 1):
            raise ValueError(f"GCConfig.kmin must be an integer >= 1, got {self.kmin!r}")
        if self.theta is not None and not (self.theta >= 0):
            raise ValueError(f"GCConfig.theta must be >= 0, got {self.theta!r}")
        if self.theta_fraction is not None and not (self.theta_fraction >= 0):
            raise ValueError(f"GCConfig.theta_fraction must be >= 0, got {self.theta_fraction!r}")
        if self.theta is not None and self.theta_fraction is not None:
            raise ValueError("give GCConfig.theta or GCConfig.theta_fraction, not both")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"GCConfig.max_steps must be >= 1 or None, got {self.max_steps!r}")
        if self.cooldown_s is not None and self.cooldown_s < 0:
            raise ValueError(f"GCConfig.cooldown_s must be >= 0, got {self.cooldown_s!r}")
        if not (isinstance(self.alpha, (int, float)) and self.alpha > 0 and math.isfinite(self.alpha)):
            raise ValueError(f"GCConfig.alpha must be a finite number > 0 (a fraction of capacity), got {self.alpha!r}")
        if self.move_strategy not in ("all-at-once", "batched", "fluid"):
            raise ValueError(f"GCConfig.move_strategy must be 'all-at-once', 'batched' or 'fluid', got "
                             f"{self.move_strategy!r}")
        if self.rebalance_cooldown_s is not None and not (self.rebalance_cooldown_s >= 0):
            raise ValueError(f"GCConfig.rebalance_cooldown_s must be >= 0, got {self.rebalance_cooldown_s!r}")
        if self.dormant_every_s is not None and not (isinstance(self.dormant_every_s, (int, float))
                                                     and self.dormant_every_s > 0 and math.isfinite(self.dormant_every_s)):
            raise ValueError(f"GCConfig.dormant_every_s must be a finite number > 0 (seconds) or None, got "
                             f"{self.dormant_every_s!r}")
        if self.rate_window_s is not None and not (self.rate_window_s > 0 and math.isfinite(self.rate_window_s)):
            raise ValueError(f"GCConfig.rate_window_s must be a finite number > 0 (seconds), got "
                             f"{self.rate_window_s!r}")
        return self

    def rate_window(self) -> float:
        """Seconds over which stream rates are measured (default ten utility periods)."""
        return 10.0 * self.utility_period_s if self.rate_window_s is None else float(self.rate_window_s)

    def cooldown(self) -> float:
        """Seconds a revived replica's delay is ignored (default two utility periods)."""
        return 2.0 * self.utility_period_s if self.cooldown_s is None else float(self.cooldown_s)


class ReplicaManager:
    """The coordinator loop of one deployment (see the module doc); a driver-side thread.

    Created by ``deploy(..., gc=GCConfig(...))`` and started when feeding
    starts (or by ``dep.control_loop()``, then only applying requests). Read it
    through the deployment: ``dep.gc_events()``, ``dep.network_cost_history()``,
    ``dep.manager.snapshot()``.

    ``dep`` is the :class:`~replistream.engines.ray.deployment.Deployment`; the loop
    uses its public surface only: ``topology`` (read and changed under its own lock),
    ``query``, ``servers``, ``conditions``, ``feeder.done_wall``, ``coordinator``,
    ``now()``, ``start_replica``, ``retire``, ``mark_failed`` and ``delay_link``.
    ``lock`` (re-entrant) is held for every period and every request.

    >>> dep = rs.deploy(query, servers=6, k=2, gc=GCConfig(utility_period_s=1, gc_period_s=2,
    ...                                                   theta_fraction=0.5))   # doctest: +SKIP
    >>> dep.run(inputs, pace=1.0); dep.gc_events()[0]["action"]                # doctest: +SKIP
    'discard'
    """

    def __init__(self, dep, config: GCConfig):
        self.dep = dep
        self.cfg = config.validate()
        #: fewest live replicas per operator: the config's, else min(2, k) (docs/reliability.md)
        self.kmin = config.kmin if config.kmin is not None else min(2, dep.k)
        self.topology = dep.topology  # the replicas and stream replicas, with their filter channels
        self.reported_failures: set[str] = set()  # failed replicas already logged
        self.theta = math.inf if config.theta is None else float(config.theta)
        self.events: list[dict] = []
        self.history: list[dict] = []
        self.weights_prev: dict[tuple[str, int, int], float] = {}
        self.rates: dict[str, float] = {}
        # (producer label, stream) -> samples (seconds since t0, tuples flushed), the rate window's
        self.flushed: dict[tuple[str, str], deque] = {}
        self.last_snapshot: Snapshot | None = None
        #: the translation of :attr:`last_snapshot`'s partitions back to the deployment's labels and ports
        self.view: PartitionView | None = None
        self.delays: dict[str, float] = {}
        self.cooling: dict[str, float] = {}  # label -> time (since t0) until which its delay is ignored
        self.hold_gc_until = 0.0  # no discard before this time: revived replicas first get measured weights
        self._asked: dict[str, Any] = {}  # label -> its gc report asked for and not answered yet
        self.unanswered: set[str] = set()  # replicas whose report did not come within the last period
        self.overloaded: set[str] = set()  # servers over the load bound: their replicas hand over last
        self.loads: dict[str, float] = {}  # label -> share of a core in the last period (work: busy + slowed)
        self.own_loads: dict[str, float] = {}  # label -> its own processing only (what it brings to a server)
        self._work_prev: dict[str, tuple[float, float, float]] = {}  # label -> (wall, busy_s, work_s)
        self.next_move = 0.0  # no rebalancing move before this time (cooldown)
        self._last_none: dict[str, str] = {}
        self.transfers: list[dict] = []  # staged transfers (transfer.py): progress, one dict each
        # per replica started for a staged transfer without replay: per input port, the largest
        # connect mark of its upstream links (_start), the gate of its steps (transfer.py)
        self.connect_marks: dict[str, list[int]] = {}
        self.lock = lockorder.rlock("ReplicaManager.lock", 1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.next_gc = None
        self.ticks = 0
        self.errors = 0
        self.meter = Meter(self)  # what each utility period measures (meter.py)
        self.handover = HandOver(self)  # hand-overs applied (handover.py)
        self.policy = RevivalPolicy(threshold_s=config.threshold_s, proactive=config.proactive,
                                    place=self._place, latency=self.meter._latency, max_proactive=config.max_proactive)

    # -- the thread ------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or restart) the loop; the first utility period ends ``utility_period_s`` from now."""
        self.stop()
        self._stop.clear()
        self.next_gc = self.now() + self.cfg.gc_period_s
        self._thread = threading.Thread(target=self._loop, daemon=True, name="replistream-gc")
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop (waits for a period in progress)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=120)
        self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.utility_period_s):
            try:
                self.tick()
            except Exception as e:  # recorded, never fatal to the run
                self.errors += 1
                self.record({"kind": "error", "action": "error", "error": repr(e),
                             "traceback": traceback.format_exc(limit=5)})

    def now(self) -> float:
        """Seconds since the run started (the deployment's ``t0``)."""
        return self.dep.now()

    def rebalance(self, snap: Snapshot) -> dict | None:
        """Move one operator replica off a server whose measured load passes ``alpha`` x its
        capacity (Algorithm 5's load bound, Hwang §V-A, with loads measured at run time), live,
        with ``move_strategy`` (Megaphone §3.3). The replica moved is the busiest operator replica
        there; the target is Algorithm 5's cheapest server (lines 7-9) among those without a live
        replica of the operator that stay within the bound with the replica's own load. Logs
        the decision (``kind="rebalance"``) with its reason, or why nothing could move; returns
        the move's event, or None.

        >>> GCConfig(rebalance=True, alpha=0.8).validate().rebalance
        True
        """
        now = self.now()
        if now < self.next_move or not self.loads:
            return None
        loads = self.meter.server_loads()
        cap = {s: float(self.dep.servers[s].capacity) for s in loads}
        over = sorted((s for s in loads if loads[s] > self.cfg.alpha * cap[s]), key=lambda s: -loads[s] / cap[s])
        if not over:
            return None
        server = over[0]
        movable = [(self.loads.get(label, 0.0), label) for label, _ in self.topology.running()
                   if self.topology.server(label) == server and self.topology.replica(label).kind == "operator"]
        reason = (f"server {server} load {loads[server]:.2f} > alpha {self.cfg.alpha:g} x capacity {cap[server]:g}")
        self.next_move = now + (2.0 * self.cfg.utility_period_s if self.cfg.rebalance_cooldown_s is None
                                else float(self.cfg.rebalance_cooldown_s))
        for _, label in sorted(movable, reverse=True):
            op = snap.replica(label).operator if snap.has_replica(label) else self.topology.replica(label).operator
            own = self.own_loads.get(label, 0.0)
            fits = [s for s in self.dep.servers if s != server and loads[s] + own < self.cfg.alpha * cap[s]]
            target = self._place(op, snap, label, among=fits) if fits else None
            if target is None:
                continue
            self.record({"kind": "rebalance", "action": "move", "replica": label, "from": server, "to": target,
                         "server_loads": {s: round(v, 3) for s, v in loads.items()}, "replica_load": round(own, 3),
                         "text": f"move {label} from {server} to {target}: {reason}; {target} stays within the "
                                 f"bound with it ({loads[target]:.2f} + {own:.2f})"})
            self.overloaded = set(over)  # a peer elsewhere hands the state over
            try:
                ev = self.handover.replace_replica(label, server=target, strategy=self.cfg.move_strategy)
            finally:
                self.overloaded = set()
            self._work_prev.clear()  # measure again from here
            self.loads.clear()
            return ev
        self.record({"kind": "rebalance", "action": "none", "server": server,
                     "server_loads": {s: round(v, 3) for s, v in loads.items()},
                     "text": f"{reason}, but no operator replica there can move to a server that stays within "
                             f"the bound (or none runs there)"})
        return None

    def snapshot(self) -> Snapshot | None:
        """The snapshot of the last utility period (None before the first)."""
        return self.last_snapshot

    # -- one period ----------------------------------------------------------------------------
    def tick(self) -> None:
        """One utility period: measure, record the cost, maybe collect garbage, maybe revive."""
        with self.lock:
            self.ticks += 1
            snap = self.meter.measure()
            cost = snap.total_cost()
            if math.isinf(self.theta) and self.cfg.theta_fraction is not None and cost > 0:
                self.theta = self.cfg.theta_fraction * cost
                snap = snap.evolve(theta=self.theta)
                self.record({"kind": "theta", "action": "theta", "theta": self.theta, "cost": cost,
                             "text": f"theta = {self.cfg.theta_fraction:g} x first measured cost {cost:.6g} "
                                     f"= {self.theta:.6g}"})
            self.history.append({"t": round(self.now(), 3), "network_cost": cost,
                                 "theta": None if math.isinf(self.theta) else self.theta,
                                 "live_stream_replicas": len(snap.live_streams()),
                                 "live_replicas": sum(r.live for r in snap.replicas),
                                 "min_live": {op: snap.live_count(op) for op in snap.operators},
                                 "max_delay_s": max(self.delays.values(), default=0.0)})
            if getattr(self.dep, "rescaling", None) is not None and self.dep.rescaling.is_set():
                return  # a rescale builds its partitions from the topology: no discard, revival or move meanwhile
            if self.cfg.gc and self.now() >= self.next_gc:
                self.next_gc = self.now() + self.cfg.gc_period_s
                if cost > self.theta and self.now() >= self.hold_gc_until:
                    snap = self.collect(snap)
            if self.cfg.revival:
                self.revive(snap)
            if self.cfg.rebalance:
                self.rebalance(snap)

    def collect(self, snap: Snapshot) -> Snapshot:
        """Algorithm 6 (Hwang §V-B) for up to ``max_steps`` discards, applied to the actors."""
        result = collect_garbage(snap, self.cfg.max_steps)
        view = self.view or PartitionView(snap)
        for d in result.decisions:
            started = time.time()
            d = view.discard(d)  # the deployment's stream ids (partitioned inputs have their own in the view)
            self.handover._apply_discard(d.streams, d.replicas)
            groups = sorted({label_group(r) for r in d.replicas if replica_partition(r) is not None})
            self.record({"kind": "gc", **d.to_dict(), "text": d.describe(),
                         **({"partitions": groups} if groups else {}),
                         "apply_seconds": round(time.time() - started, 3), "live_after": self.live_counts()})
        return result.snapshot

    def revive(self, snap: Snapshot) -> None:
        """The revival policy (Hwang §V-C) on the measured delays, applied to the actors.

        First, a hindered replica whose inputs are all *link-bound* (see :meth:`link_bound`) is
        replaced at once on a server Algorithm 5 chooses: reviving a stream or an upstream
        replica into its server cannot help there, so the paper's "if the problem persists"
        step is taken without waiting for the earlier steps to fail one period each. The
        policy then runs on a fresh measurement at the next period."""
        now = self.now()
        delays = {l: d for l, d in self.delays.items() if self.cooling.get(l, -1.0) < now}
        bound = self.link_bound(snap, delays)
        if bound:
            for h, why in bound:
                fast = [srv for srv in self.dep.servers if not self._slow_links(snap, h, srv)]
                server = self._place(snap.replica(h).operator, snap, h, among=fast) if fast else None
                if server is None:
                    self._none_once(h, f"{why}; no server without a live {snap.replica(h).operator!r} replica "
                                    f"has every input and output link under the threshold")
                    continue
                e = self.handover._replacement(h, server, False, "delay", f"{why}: replaced at once on {server} "
                                      f"(Algorithm 5)", delay_s=float(delays[h]), threshold_s=self.cfg.threshold_s,
                                      theta=self.theta)
                if not self._apply_and_record(e):
                    return
            return
        view = self.view or PartitionView(snap)
        for e in self.policy.decide(snap, delays):
            e = view.event(e)  # the deployment's stream ids, ports and operators
            if e.action == "none":
                if self._last_none.get(e.replica) != e.reason:
                    self._last_none[e.replica] = e.reason
                    self.record({"kind": "revival", **e.to_dict(), "text": e.describe(), "applied": False})
                continue
            if not self._apply_and_record(e):
                break  # the snapshot the later events were planned on did not come about

    def _none_once(self, label: str, reason: str) -> None:
        if self._last_none.get(label) != reason:
            self._last_none[label] = reason
            self.record({"kind": "revival", "action": "none", "trigger": "delay", "replica": label,
                         "reason": reason, "text": f"{label}: none; {reason}", "applied": False})

    def _apply_and_record(self, e) -> bool:
        """Apply one revival decision, start its cooldown, log it; False if it failed."""
        if e.replica is not None:
            self._last_none.pop(e.replica, None)
        started = time.time()
        try:
            info = self.handover._apply_revival(e)
            applied, err = True, None
        except Exception as exc:
            info, applied, err = {}, False, f"{type(exc).__name__}: {exc}"
        until = self.now() + self.cfg.cooldown()
        self.hold_gc_until = until
        new = [r.label for r in e.new_replicas] + list(e.revive_replicas)
        for lab in [e.replica] + new:
            if lab:
                self.cooling[lab] = until
        if e.replica is not None and applied:
            for lab in self._downstream(e.replica) | {d for n in new for d in self._downstream(n)}:
                self.cooling[lab] = until  # their delay is the hindered (or new) replica's
        rec = {"kind": "revival", **e.to_dict(), "text": e.describe(), "applied": applied,
               "apply_seconds": round(time.time() - started, 3), **info}
        if err:
            rec["error"] = err
        self.record(rec)
        return applied

    def link_bound(self, snap: Snapshot, delays: dict[str, float]) -> list[tuple[str, str]]:
        """Hindered operator replicas (upstream first) whose every input port has a functioning
        live feeder but whose every input stream replica from a functioning replica, live or
        discarded, is slower than the threshold by itself: the links into its server are
        the problem (e.g. congestion on the surviving path), so reviving a stream or an
        upstream replica into that server cannot bring its delay under the threshold.
        Returns ``[(label, reason)]``."""
        thr = self.cfg.threshold_s

        def functioning(label):
            r = snap.replica(label)
            return r.live and delays.get(label, 0.0) <= thr

        rank = {op: i for i, op in enumerate(snap.topological())}
        out = []
        for label in sorted(delays, key=lambda l: (rank[snap.replica(l).operator], l)):
            r = snap.replica(label)
            if delays[label] <= thr or r.kind != "operator" or not r.live:
                continue
            ports = snap.ports(label)
            feeds = {p: [s for s in snap.in_streams(label, p, live=None) if functioning(s.src)] for p in ports}
            if not ports or not all(any(s.live for s in feeds[p]) for p in ports):
                continue  # an input is starved: the policy's steps 1-3a apply
            slow = [s for p in ports for s in feeds[p]]
            if all(s.latency_ms > 1000.0 * thr for s in slow):
                out.append((label, f"every input stream replica of {label} from a functioning replica "
                                   f"({len(slow)}, live or discarded) has latency >= "
                                   f"{min(s.latency_ms for s in slow):.6g} ms > threshold {thr:g} s"))
        return out

    def _slow_links(self, snap: Snapshot, label: str, server: str) -> bool:
        """Whether a replacement of ``label`` on ``server`` would have a link above the threshold:
        from a live feeder of its operator, or to a live replica ``label`` feeds."""
        op = snap.replica(label).operator
        limit = 1000.0 * self.cfg.threshold_s
        for p in snap.ports(label):
            up = snap.upstream_operator(op, p)
            if any(self.meter._latency(u.server, server) > limit for u in snap.replicas_of(up, "live")):
                return True
        return any(self.meter._latency(server, snap.replica(s.dst).server) > limit for s in snap.out_streams(label))

    def live_counts(self) -> dict[str, int]:
        """Live replicas per operator (entry points as ``"entry"``), per partition (``"op.P"``) for a
        partitioned operator, as the loop last left them."""
        out: dict[str, int] = {}
        for r in self.topology.replicas():
            g = label_group(r.label) if replica_partition(r.label) is not None else r.operator
            out[g] = out.get(g, 0) + (1 if r.live else 0)
        return out

    def _downstream(self, label: str) -> set:
        seen, todo = set(), [label]
        streams = self.topology.streams(live=True)
        while todo:
            x = todo.pop()
            for s in streams:
                if s.src == x and s.dst not in seen:
                    seen.add(s.dst)
                    todo.append(s.dst)
        return seen

    def congest_surviving_path(self, extra_ms: float = 3000.0, duration_s: float | None = None) -> list[str]:
        """Failure injection for revival experiments: add ``extra_ms`` to the live remote input
        links of the first operator, walking upstream from the applications (after garbage
        collection, the path they depend on), whose live replicas all depend on remote links.
        Returns the stream ids hit.

        The unit is an operator: the inputs of all its live replicas are congested together
        (one of two would be masked by the other's path). Walked past: operators with a live
        replica on an application's server (congesting every link into the application's
        server leaves no route a replacement could take: seen in runs where the
        Join replica shared the application's server and the links into it from the three
        other servers were congested), and operators with a live replica that has a local live
        feeder on every input port (congesting its remote inputs hinders nothing). The delay is
        added in the direction the stream replicas flow only, as congestion on a path is. If
        every operator of the path is walked past, the first remote inputs found are congested.

        >>> dep.manager.congest_surviving_path(3000)   # doctest: +SKIP
        ['correlate#1->hot#0:0']
        """
        snap = self.last_snapshot or self.meter.measure()
        todo = list(self.dep.query.sinks)
        app_servers = {snap.replica(a).server for a in todo}

        def cut_off(label):
            """The live remote inputs of ports with no local live feeder (congesting them hinders it)."""
            ins = snap.in_streams(label)
            remote = [s for s in ins if snap.replica(s.src).server != snap.replica(s.dst).server]
            ports = [p for p in {s.port for s in ins} if all(s in remote for s in ins if s.port == p)]
            return [s for s in remote if s.port in ports]

        seen, ops = set(), set()
        first = None  # fallback: no operator qualifies
        while todo:
            r = todo.pop(0)
            if r in seen:
                continue
            seen.add(r)
            ins = snap.in_streams(r)
            rep = snap.replica(r)
            if rep.kind == "operator" and rep.operator not in ops:
                ops.add(rep.operator)
                # every live replica of the operator: congesting one of two masks nothing
                peers = [x.label for x in snap.replicas_of(rep.operator, "live")]
                hit = [cut_off(x) for x in peers]
                if first is None and any(hit):
                    first = [s for h in hit for s in h]
                if all(hit) and all(snap.replica(x).server not in app_servers for x in peers):
                    return self._congest(snap, [s for h in hit for s in h], extra_ms, duration_s, "")
            todo += [s.src for s in ins]
        if first is not None:
            return self._congest(snap, first, extra_ms, duration_s, " (no operator of the path has all its live "
                                 "replicas off the applications' servers and fed only remotely)")
        return []

    def _congest(self, snap: Snapshot, streams: list, extra_ms: float, duration_s, note: str) -> list[str]:
        for s in streams:
            self.dep.faults.delay_link(snap.replica(s.src).server, snap.replica(s.dst).server, extra_ms, duration_s,
                                both_directions=False)
        self.record({"kind": "congestion", "action": "delay_link", "streams": [s.id for s in streams],
                     "extra_ms": extra_ms, "text": f"{extra_ms:g} ms added on {', '.join(s.id for s in streams)}"
                                                   f"{note}"})
        return [s.id for s in streams]

    # -- Algorithm 5 for a new replica -------------------------------------------------------
    def _place(self, operator: str, snap: Snapshot, hindered: str, among=None) -> str | None:
        """Server for a new replica of ``operator``: Algorithm 5 lines 7-9 (Hwang §V-A): among
        servers (of ``among``, default all) without a live replica of it and farther than
        ``d_min_ms`` from its live replicas (if any such server exists), the one minimising the
        cost of its input and output stream replicas. None for entry points (their input
        cannot be replayed)."""
        if operator == ENTRY or snap.replicas_of(operator)[0].kind != "operator":
            return None
        live = snap.replicas_of(operator, "live")
        taken = {r.server for r in live}
        cands = [s for s in (self.dep.servers if among is None else among) if s not in taken]
        far = [s for s in cands if all(min(self.meter._latency(s, r.server), self.meter._latency(r.server, s)) > self.cfg.d_min_ms
                                       for r in live)]
        cands = far or cands
        if not cands:
            return None
        ins = []
        for p in snap.ports(operator):
            up = snap.upstream_operator(operator, p)
            like = [s for r in snap.replicas_of(operator) for s in snap.in_streams(r.label, p, live=None)]
            rate = like[0].rate if like else 0.0
            ins += [(rate, u.server) for u in snap.replicas_of(up, "live")]
        outs = []
        for r in snap.replicas_of(operator):
            for s in snap.out_streams(r.label, live=None):
                outs.append((s.rate, snap.replica(s.dst)))
        downs = {}
        for rate, d in outs:
            if d.live:
                downs[d.label] = (rate, d.server)

        def cost(srv):
            return (math.fsum(rate * self.meter._latency(a, srv) for rate, a in ins)
                    + math.fsum(rate * self.meter._latency(srv, b) for rate, b in downs.values()))

        return min(cands, key=lambda s: (cost(s), list(self.dep.servers).index(s)))

    # -- events ------------------------------------------------------------------------------
    def record(self, rec: dict) -> None:
        """Log a decision or event: in :attr:`events`, in the coordinator actor's log, and as a JSON line
        in ``log_path`` if the config gives one (``t``: seconds since the run started)."""
        rec = {"t": round(self.now(), 3), **rec}
        for k, v in list(rec.items()):
            if isinstance(v, float) and math.isinf(v):
                rec[k] = None
        self.events.append(rec)
        try:
            self.dep.coordinator.report.remote(rec.get("kind", "gc"), rec)
        except Exception as e:  # the coordinator is gone (shutting down): the event stays in self.events
            rec["coordinator_error"] = repr(e)
        if self.cfg.log_path:
            with open(self.cfg.log_path, "a") as f:
                f.write(json.dumps(rec, default=json_default) + "\n")
