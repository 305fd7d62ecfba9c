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
from dataclasses import dataclass, replace
from typing import Any

import ray

from ...gc import ENTRY, OperatorReplica, RevivalEvent, RevivalPolicy, Snapshot, StreamReplica, collect_garbage
from ...plan import group_of
from ...replica.handover import missing_feeders, rank_peers, shares_feeders
from ...replica.transfer import STRATEGIES, splittable
from .channels import NO_ACK, gone_key
from .common import is_actor_death, json_default
from .transfer import staged_install

__all__ = ["CUT_MS", "GCConfig", "ReplicaManager"]

#: Latency (ms) a cut link counts with in the snapshot (the cost model needs finite figures).
CUT_MS = 60_000.0


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
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.next_gc = None
        self.ticks = 0
        self.errors = 0
        self.policy = RevivalPolicy(threshold_s=config.threshold_s, proactive=config.proactive,
                                    place=self._place, latency=self._latency, max_proactive=config.max_proactive)

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

    # -- measuring ---------------------------------------------------------------------------
    def _latency(self, a: str, b: str) -> float:
        lat = float(self.dep.conditions.latency_ms(a, b, self.now()))
        return CUT_MS if not math.isfinite(lat) else lat

    def _reports(self) -> dict[str, dict]:
        """The gc report of every running replica not failed, all asked at once and waited for
        together for at most one utility period (between 2 and 30 s). One that does not answer in
        time is left out of this period and listed in :attr:`unanswered` (a replica busy in long
        calls: an overloaded server answers late); its report is not asked again until it
        answers, and counts in the next period. A death is noticed through the topology."""
        topo = self.topology
        running = {r.label for r in topo.replicas() if r.state != "failed" and topo.is_running(r.label)}
        for label in [lab for lab in self._asked if lab not in running]:
            del self._asked[label]
        for label in running:
            if label not in self._asked:
                self._asked[label] = topo.handle(label).gc_report.remote()
        refs = list(self._asked.values())
        wait_s = min(30.0, max(2.0, float(self.cfg.utility_period_s)))
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=wait_s)[0]) if refs else set()
        out = {}
        self.unanswered = set()
        for label, ref in list(self._asked.items()):
            if ref not in ready:
                self.unanswered.add(label)
                continue
            del self._asked[label]
            try:
                out[label] = ray.get(ref)
            except Exception:  # no report from it this period; see the docstring
                continue
        return out

    def notice_failures(self) -> None:
        """Log every replica that failed since the last call (failure, not garbage collection)."""
        for r in self.topology.replicas(state="failed"):
            if r.label not in self.reported_failures:
                self.reported_failures.add(r.label)
                self.record({"kind": "failure", "action": "failed", "replica": r.label,
                             "text": f"{r.label} died (failure, not garbage collection)"})

    def measure(self) -> Snapshot:
        """Ask the actors and build the current snapshot (rates, latencies, weights of the last period)."""
        topo = self.topology
        with self.lock:
            self.notice_failures()
            reports = self._reports()
            self._measure_rates(reports)
            self._measure_loads(reports)
            weights: dict[str, float] = {}
            for s in topo.streams():
                sid = s.id
                rep = reports.get(s.dst)
                if rep is None or not rep.get("weights"):
                    continue
                ch = topo.channel(sid)
                port_w = rep["weights"][s.port] if s.port < len(rep["weights"]) else []
                if ch is None or ch >= len(port_w):
                    continue
                key = (s.dst, s.port, ch)
                w = float(port_w[ch])
                weights[sid] = max(0.0, w - self.weights_prev.get(key, 0.0))
                self.weights_prev[key] = w
            # once the feeder has sent everything, nothing newer is due: a replica's input stops
            # aging then (else every replica looks hindered at the end of a paced run)
            done = self.dep.feeder.done_wall
            idle = max(0.0, time.time() - done) if done is not None else 0.0
            self.delays = {label: max(0.0, float(rep.get("delay_s", 0.0)) - idle) for label, rep in reports.items()
                           if topo.replica(label).kind != "entry" and topo.replica(label).live}

            def measured(s: StreamReplica) -> StreamReplica:
                return replace(s, rate=float(self.rates.get(s.stream, 0.0)),
                               latency_ms=self._latency(topo.server(s.src), topo.server(s.dst)),
                               weight=weights.get(s.id, 0.0))

            snap = topo.snapshot(self.kmin, self.theta, measured)
            self._floor_dormant_entries(reports)
            self._raise_holds(reports)
            self.last_snapshot = snap
            return snap

    def _fed(self, label: str, port: int) -> bool:
        """Whether ``label`` is live, running and fed on input ``port`` by a live stream replica
        from a running replica."""
        topo = self.topology
        if label not in topo or not topo.replica(label).live or not topo.is_running(label):
            return False
        return any(s.port == port and topo.is_running(s.src) for s in topo.streams(live=True, dst=label))

    def _raise_holds(self, reports: dict) -> None:
        """Move on the holds discarded stream replicas left on their senders' logs (decision 7;
        :meth:`~.channels.Outbox.remove_link`): to the receiver's acknowledgement on that port
        while another sender feeds it, released once nothing does (a dormant replica is brought
        up to date by a hand-over, not by this log). Derived from the topology each period, so a
        coordinator that took over moves on its predecessor's holds too; a receiver that did not
        report this period keeps its hold where it was."""
        topo = self.topology
        points: dict[str, dict] = {}
        for s in topo.streams(live=False):
            if not topo.is_running(s.src):
                continue
            key = gone_key(s.dst, s.port)
            if not self._fed(s.dst, s.port):
                points.setdefault(s.src, {})[key] = None
                continue
            acks = (reports.get(s.dst) or {}).get("acks") or []
            if s.port < len(acks):
                points.setdefault(s.src, {})[key] = int(acks[s.port])
        for src, pts in points.items():  # advisory: a lost call leaves a hold lower, never higher
            topo.handle(src).raise_holds.remote(pts)

    def _measure_rates(self, reports: dict) -> None:
        """Stream rates (tuples/s) over the rate window: per stream, its busiest producer's.

        Each producer is measured from its own start (``age_s`` of its report), so a
        replacement does not restart the stream's rate from zero; a stream none of whose
        producers has two samples yet keeps its previous rate."""
        now = self.now()
        window = self.cfg.rate_window()
        best: dict[str, float] = {}
        for label, rep in reports.items():
            for stream, n in rep.get("emitted", {}).items():
                key = (label, stream)
                hist = self.flushed.get(key)
                if hist is None:
                    born = max(0.0, now - float(rep.get("age_s", now)))
                    hist = self.flushed[key] = deque([(born, 0)])
                hist.append((now, int(n)))
                while len(hist) > 2 and now - hist[1][0] >= window:
                    hist.popleft()
                (t_a, n_a), (t_b, n_b) = hist[0], hist[-1]
                if t_b - t_a > 1e-3:
                    best[stream] = max(best.get(stream, 0.0), (n_b - n_a) / (t_b - t_a))
        self.rates.update(best)

    def _floor_dormant_entries(self, reports: dict) -> None:
        """A dormant entry replica (still fed, no links) trims its retention to what the live entry
        replicas' consumers acknowledged."""
        topo = self.topology
        entries = topo.replicas(ENTRY)
        live = [reports[r.label] for r in entries if r.live and r.label in reports]
        dormant = [r.label for r in entries if r.state == "dormant" and topo.is_running(r.label)]
        if not live or not dormant:
            return
        acks = [a for rep in live for a in rep.get("min_ack", {}).values()]
        if acks:
            floor = min(acks)
            for l in dormant:
                topo.handle(l).set_floor.remote(floor)

    def _measure_loads(self, reports: dict) -> None:
        """Each reporting replica's load over the last period, as a share of one core: ``work_s``
        (processing, plus what a slowed server's emulation stretched it by) and ``busy_s`` (its
        own processing) per wall second since its previous report."""
        now = time.time()
        for label, rep in reports.items():
            if "work_s" not in rep:
                continue
            prev = self._work_prev.get(label)
            self._work_prev[label] = (now, float(rep["busy_s"]), float(rep["work_s"]))
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                self.loads[label] = max(0.0, (float(rep["work_s"]) - prev[2]) / dt)
                self.own_loads[label] = max(0.0, (float(rep["busy_s"]) - prev[1]) / dt)

    def server_loads(self) -> dict[str, float]:
        """``{server: load}``: the measured loads of the replicas running there (shares of a core).

        >>> dep.control_loop().server_loads()   # doctest: +SKIP
        {'boston': 0.93, 'london': 0.12, 'tokyo': 0.08}
        """
        out = {s: 0.0 for s in self.dep.servers}
        for label, _ in self.topology.running():
            out[self.topology.server(label)] = out.get(self.topology.server(label), 0.0) + self.loads.get(label, 0.0)
        return out

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
        loads = self.server_loads()
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
            op = self.topology.replica(label).operator
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
                ev = self.replace_replica(label, server=target, strategy=self.cfg.move_strategy)
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
            snap = self.measure()
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
        for d in result.decisions:
            started = time.time()
            self._apply_discard(d.streams, d.replicas)
            self.record({"kind": "gc", **d.to_dict(), "text": d.describe(),
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
                e = self._replacement(h, server, False, "delay", f"{why}: replaced at once on {server} "
                                      f"(Algorithm 5)", delay_s=float(delays[h]), threshold_s=self.cfg.threshold_s,
                                      theta=self.theta)
                if not self._apply_and_record(e):
                    return
            return
        for e in self.policy.decide(snap, delays):
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
            info = self._apply_revival(e)
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
            if any(self._latency(u.server, server) > limit for u in snap.replicas_of(up, "live")):
                return True
        return any(self._latency(server, snap.replica(s.dst).server) > limit for s in snap.out_streams(label))

    def live_counts(self) -> dict[str, int]:
        """Live replicas per operator (entry points as ``"entry"``), as the loop last left them."""
        out: dict[str, int] = {}
        for r in self.topology.replicas():
            out[r.operator] = out.get(r.operator, 0) + (1 if r.live else 0)
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
        snap = self.last_snapshot or self.measure()
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
            self.dep.delay_link(snap.replica(s.src).server, snap.replica(s.dst).server, extra_ms, duration_s,
                                both_directions=False)
        self.record({"kind": "congestion", "action": "delay_link", "streams": [s.id for s in streams],
                     "extra_ms": extra_ms, "text": f"{extra_ms:g} ms added on {', '.join(s.id for s in streams)}"
                                                   f"{note}"})
        return [s.id for s in streams]

    # -- by request ------------------------------------------------------------------------------
    def replace_replica(self, label: str, add: bool = False, checkpoint: bool = True, server: str | None = None,
                        strategy: str | None = None, bins_per_step: int | None = None,
                        bits: int | None = None, pause_ms: float = 20.0, lag_ms: float | None = None) -> dict:
        """Start a new replica of ``label``'s operator on its server by hand-over from a live peer,
        fed by every live upstream replica and feeding every live downstream replica; unless
        ``add``, then discard ``label`` (kill it if it still runs). Returns the logged event.
        ``checkpoint=False`` starts it from a fresh state instead (a negative control for
        tests: a stateful replica then misses what its window held).

        ``server`` places the new replica there (default: ``label``'s server, or Algorithm 5's
        choice with ``add``); with ``label`` still running that is a *move*. ``strategy``
        (``"all-at-once"``, ``"batched"`` with ``bins_per_step``, ``"fluid"``; Megaphone §3.3)
        moves the checkpoint in steps of ``2**bits`` bins (default 8 bits), each taken at a
        punctuation of the sending peer while it keeps serving, as many at one punctuation as keep
        its pause within ``pause_ms`` beyond a step's fixed cost, and paced by the live path: the
        receiver's answers, and the peer's output lag (at most ``lag_ms`` above its recent minimum,
        default ``max(pause_ms, 10)``) (:func:`replistream.engines.ray.transfer.staged_install`);
        progress is in :attr:`transfers`. When the state splits into bins the new replica's upstream
        links do not replay their retained output: the steps cover it.
        ``strategy=None`` is the single-step hand-over of docs/handover.md.

        What ``Deployment.revive_replica``/``add_replica``/``move_replica`` (and the
        :class:`~replistream.sources.Revive` sentinel) run.

        >>> dep.control_loop().replace_replica("join#0", checkpoint=False)["action"]   # doctest: +SKIP
        'replace-replica'
        """
        topo = self.topology
        with self.lock:
            if label not in topo:
                raise ValueError(f"no replica {label!r}; replicas: {sorted(r.label for r in topo.replicas())}")
            old = topo.replica(label)
            if old.kind != "operator":
                raise ValueError(f"{label!r} is {'an entry point' if old.kind == 'entry' else 'an application'}: "
                                 f"only operator replicas can be revived or added (an entry point's input "
                                 f"cannot be replayed; an application has one replica)")
            if old.state == "failed":
                self.notice_failures()
            if server is not None and server not in self.dep.servers:
                raise ValueError(f"no server {server!r}; servers: {sorted(self.dep.servers)}")
            if strategy is not None and strategy not in STRATEGIES:
                raise ValueError(f"unknown transfer strategy {strategy!r}; choose one of {STRATEGIES}")
            if not pause_ms >= 0:
                raise ValueError(f"pause_ms must be >= 0 (0: one transfer step per punctuation), got {pause_ms}")
            given = server
            server = old.server if given is None else given
            if add and given is None:
                snap = self.last_snapshot or topo.snapshot(self.kmin)
                server = self._place(old.operator, snap, label) or old.server
            e = self._replacement(label, server, add, "request",
                                  f"requested: {'add a replica of' if add else 'replace'} {label} by hand-over")
            started = time.time()
            how = {"checkpoint": checkpoint,
                   "staged": None if strategy is None else {"strategy": strategy, "bins_per_step": bins_per_step,
                                                            "bits": 8 if bits is None else int(bits),
                                                            "pause_ms": float(pause_ms), "lag_ms": lag_ms}}
            info = self._apply_revival(e, how)
            rec = {"kind": "revival", **e.to_dict(), "text": e.describe(), "applied": True,
                   "apply_seconds": round(time.time() - started, 3), **info}
            self.record(rec)
            return rec

    def discard(self, label: str, text: str) -> None:
        """Discard the running replica ``label`` and its live stream replicas (as Algorithm 6 does), and
        log it as a reconfiguration with ``text``."""
        with self.lock:
            self._apply_discard([s.id for s in self.topology.streams(live=True, touching=label)], [label])
            self.record({"kind": "reconfiguration", "action": "discard", "replica": label, "text": text})

    def _replacement(self, label: str, server: str, add: bool, trigger: str, reason: str, **kw) -> RevivalEvent:
        """The RevivalEvent that starts a new replica of ``label``'s operator on ``server``, fed by
        every live upstream replica and feeding every live downstream replica (and, unless
        ``add``, discards ``label`` and its stream replicas)."""
        topo = self.topology
        old = topo.replica(label)
        new_label = topo.next_label(old.operator)
        new = OperatorReplica(new_label, old.operator, server, "operator", "live", old.stateful)
        q = self.dep.query
        streams = []
        for p, up in enumerate(q.inputs_of(old.operator)):
            for r in topo.replicas(group_of(q, up), state="live"):
                streams.append(StreamReplica(r.label, new_label, p, 0.0, 0.0, 0.0, True, up))
        for v, p in q.outputs_of(old.operator):
            for r in topo.replicas(v, state="live"):
                streams.append(StreamReplica(new_label, r.label, p, 0.0, 0.0, 0.0, True, old.operator))
        drop = [] if add or not old.live else [s.id for s in topo.streams(live=True, touching=label)]
        return RevivalEvent("create-replica" if add else "replace-replica", trigger, label, reason,
                            new_replicas=(new,), new_streams=tuple(streams), discard_streams=tuple(drop),
                            discard_replicas=() if add or not old.live else (label,),
                            handover=(new_label,) if new.stateful else (), **kw)

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
        far = [s for s in cands if all(min(self._latency(s, r.server), self._latency(r.server, s)) > self.cfg.d_min_ms
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
            return (math.fsum(rate * self._latency(a, srv) for rate, a in ins)
                    + math.fsum(rate * self._latency(srv, b) for rate, b in downs.values()))

        return min(cands, key=lambda s: (cost(s), list(self.dep.servers).index(s)))

    # -- applying decisions to the actors -----------------------------------------------------
    def _apply_discard(self, streams, replicas) -> None:
        """Stop the discarded stream replicas at their sources; retire the replicas left dormant."""
        topo = self.topology
        calls = {}
        gone = [topo.stream(sid) for sid in streams]
        for s in gone:
            topo.disconnect(s.id)
        if self.dep._persister is not None:  # kept before any sender hears of it: a restored host finishes it
            self.dep._persister.persist_now()
        retiring = set(replicas)
        for s in gone:
            if topo.is_running(s.src):
                # a receiver another sender still feeds may lag this sender's other receivers: the
                # sender's log holds what it has not acknowledged, for a replay if s is revived
                hold = s.dst not in retiring and self._fed(s.dst, s.port)
                calls[f"{s.src}|{s.id}"] = topo.handle(s.src).disconnect.remote(s.dst, s.port, hold)
        self.dep.tell({key: ref for key, ref in calls.items()}, timeout=60)
        for label in replicas:
            self.dep.retire(label)

    def _stream_name(self, s: StreamReplica) -> str:
        return s.stream or self.topology.replica(s.src).operator

    def _apply_revival(self, e: RevivalEvent, how: dict | None = None) -> dict:
        """Apply a revival decision: start its replicas (pending, subscribed with replay), hand
        state over to them, connect their outputs and the revived stream replicas, then discard
        what the event replaces. ``how``: ``{"checkpoint": False}`` starts them fresh;
        ``{"staged": {...}}`` moves the state in steps (:func:`.transfer.staged_install`)."""
        topo = self.topology
        how = {"checkpoint": True, "staged": None, **(how or {})}
        info: dict[str, Any] = {}
        new_labels = [r.label for r in e.new_replicas]
        for r in e.new_replicas:
            topo.add_replica(r)
        wanted = {sid: topo.stream(sid) for sid in e.revive_streams}
        for s in e.new_streams:
            topo.put_stream(replace(s, live=False))
            wanted[s.id] = s
        to_start = [lab for lab in list(e.revive_replicas) + new_labels if topo.replica(lab).kind == "operator"]
        for lab in e.revive_replicas:
            topo.set_state(lab, "live")
        started: dict[str, Any] = {}
        try:
            # 1. start pending actors, 2. subscribe them to their upstream replicas (with replay;
            # without for a staged transfer of state that splits, whose steps cover what a replay
            # would: engines/ray/transfer.py)
            for lab in to_start:
                ins = [s for s in wanted.values() if s.dst == lab and s.src not in to_start]
                replay = not self._staged_without_replay(lab, set(to_start), how)
                started[lab] = self._start(topo.replica(lab), ins, replay=replay)
            # 3. hand-over: a checkpoint from a live peer, taken after the subscription
            handover = {}
            for lab in to_start:
                handover[lab] = self._install(lab, started[lab], set(started), how)
            info["handover"] = handover
            # 4. their outputs, 5. revived stream replicas between running replicas
            for s in wanted.values():
                if topo.stream(s.id).live:
                    continue  # connected in _start
                self._connect(s)
        except Exception:
            for lab in to_start:
                self.connect_marks.pop(lab, None)
            for lab in started:  # a half-started replica must not linger
                topo.set_state(lab, "dormant")
                self._apply_discard([s.id for s in topo.streams(live=True, touching=lab)], [lab])
            raise
        # 6. what a replacement discards
        if e.discard_streams or e.discard_replicas:
            self._apply_discard(e.discard_streams, e.discard_replicas)
        return info

    def _connect(self, s: StreamReplica) -> int:
        """Connect ``s`` (both ends running) on a new filter channel, replaying the source's log."""
        topo = self.topology
        dst = topo.handle(s.dst)
        try:
            ch = ray.get(dst.add_channel.remote(s.port), timeout=60)
        except Exception as e:
            if not is_actor_death(e):
                raise
            # the downstream replica died meanwhile, unannounced (within the fault model): its peers
            # get this stream; the death is recorded as such
            self.dep.mark_failed(s.dst, f"died while {s.src} was connected to it: {type(e).__name__}")
            return 0
        try:
            n = ray.get(topo.handle(s.src).connect.remote(self._stream_name(s), s.dst, topo.server(s.dst), dst,
                                                         s.port, ch, True), timeout=60)
        except Exception as e:
            if not is_actor_death(e):
                raise
            # the upstream replica died meanwhile (a crash within the fault model): its peers feed on
            self.dep.mark_failed(s.src, f"died while connecting to {s.dst}: {type(e).__name__}")
            return 0
        topo.put_stream(replace(s, live=True), ch)
        return n

    def _staged_without_replay(self, label: str, pending: set, how: dict) -> bool:
        """Whether ``label`` (about to start) will get its state by a staged transfer whose steps
        make a replay from its upstream replicas unnecessary: a strategy was asked, the operator's
        state splits into bins, and a live peer can send the steps (otherwise a dormant checkpoint
        or a fresh state is installed, which needs the replay)."""
        if not how.get("checkpoint", True) or how.get("staged") is None:
            return False
        op = self.topology.replica(label).operator
        return splittable(self.dep.query, op) and bool(self.peers(label, pending))

    def resubscribe_with_replay(self, label: str) -> list[str]:
        """Connect ``label`` once more to each of its live upstream replicas, on new channels, this
        time replaying their retained output (the links without replay stay; duplicate filters
        drop what comes twice): a staged transfer's fallback when it cannot go without the
        replay (:func:`.transfer.staged_install`). Returns the stream ids reconnected.

        >>> mgr.resubscribe_with_replay("join#2")   # doctest: +SKIP
        ['entry#0->join#2:0', 'entry#0->join#2:1']
        """
        done = []
        for s in self.topology.streams(live=True, dst=label):
            if self.topology.is_running(s.src):
                self._connect(s)
                done.append(s.id)
        self.connect_marks.pop(label, None)
        return done

    def _start(self, rep: OperatorReplica, ins: list[StreamReplica], replay: bool = True):
        """Create the actor of ``rep`` pending, fed by ``ins`` (each replaying its log). With
        ``replay=False`` (a staged transfer, :meth:`_staged_without_replay`) the links carry only
        what their senders flush from now on; each sender's connect mark (``connect_for_transfer``)
        goes, per input port the largest, to :attr:`connect_marks` for the transfer's gate."""
        topo = self.topology
        n_ports = len(self.dep.query.inputs_of(rep.operator))
        channels = [0] * n_ports
        chan_of = {}
        for s in ins:
            chan_of[s.id] = channels[s.port]
            channels[s.port] += 1
        for p in range(n_ports):
            if channels[p] == 0:
                raise RuntimeError(f"cannot start {rep.label}: no live upstream replica feeds its port {p}")
        h = self.dep.start_replica(rep.label, channels, pending=True)
        calls = []
        for s in ins:
            src = topo.handle(s.src)
            if replay:
                call = src.connect.remote(self._stream_name(s), rep.label, rep.server, h, s.port, chan_of[s.id], True)
            else:
                call = src.connect_for_transfer.remote(self._stream_name(s), rep.label, rep.server, h, s.port,
                                                       chan_of[s.id])
            calls.append((s, call))
            topo.put_stream(replace(s, live=True), chan_of[s.id])
        fed = [0] * n_ports
        marks = [NO_ACK] * n_ports
        for s, call in calls:
            try:
                got = ray.get(call, timeout=60)
                fed[s.port] += 1
                if not replay:
                    marks[s.port] = max(marks[s.port], int(got))
            except Exception as e:
                if not is_actor_death(e):
                    raise
                # an upstream replica died meanwhile (within the fault model): its peers feed the new one
                self.dep.mark_failed(s.src, f"died while connecting to {rep.label}: {type(e).__name__}")
        for p in range(n_ports):
            if fed[p] == 0:
                raise RuntimeError(f"cannot start {rep.label}: every upstream replica feeding its port {p} died")
        if not replay:
            self.connect_marks[rep.label] = marks
        return h

    # -- hand-over: the peer and its feeders (replistream.replica.handover) ---------------------
    def peers(self, label: str, pending: set) -> list[str]:
        """Running live peers of ``label``'s operator that can give it a checkpoint (not in
        ``pending``), those whose inputs share a feeder with ``label`` on every port first, those on
        a server over the load bound (:meth:`rebalance`) last."""
        topo = self.topology
        op = topo.replica(label).operator
        candidates = [r.label for r in topo.replicas(op, state="live") if r.label != label
                      and topo.is_running(r.label) and r.label not in pending]
        ranked = rank_peers(label, candidates, topo.streams())
        return sorted(ranked, key=lambda p: topo.server(p) in self.overloaded)  # stable: overloaded ones last

    def cover_peer(self, label: str, peer: str) -> list[str]:
        """Unless ``label`` shares a feeder with ``peer`` on every port, subscribe it to the peer's
        feeders it lacks (with replay), so the replay covers everything above the peer's ``p``;
        returns the stream ids added."""
        streams = self.topology.streams()
        if shares_feeders(streams, label, peer):
            return []
        added = []
        for s in missing_feeders(streams, label, peer):
            self._connect(s)
            added.append(s.id)
        return added

    def _install(self, label: str, handle, pending: set, how: dict) -> dict:
        """Hand-over (docs/design.md, decision 7): install a checkpoint from a live peer whose inputs share
        a feeder with ``label`` on every port; subscribe ``label`` to more feeders if needed.
        With a transfer strategy (``how["staged"]``), the checkpoint moves in steps of bins
        instead (Megaphone §3.3, :mod:`.transfer`)."""
        rep = self.topology.replica(label)
        if not how["checkpoint"]:
            ray.get(handle.install.remote(None), timeout=120)
            return {"peer": None, "checkpoint": None}
        peers = self.peers(label, pending)
        if label in self.connect_marks and (not peers or how["staged"] is None):
            self.resubscribe_with_replay(label)  # subscribed without replay, but no staged transfer now
        if not peers:
            dormant = self.dep.ask_coordinator("dormant_checkpoint", rep.operator, timeout=60)
            if dormant is not None:  # every replica was lost: the last one's dormant checkpoint
                p, source, ck = dormant
                got = ray.get(handle.install.remote(ck), timeout=300)
                return {"peer": None, "dormant": {"from": source, "punctuation": int(p)}, **got}
            if rep.stateful:
                raise RuntimeError(f"no live peer of {rep.operator!r} can hand its state over to {label}")
            ray.get(handle.install.remote(None), timeout=120)
            return {"peer": None}
        if how["staged"] is not None:
            return staged_install(self, label, handle, pending, **how["staged"])
        for peer in peers:
            added = self.cover_peer(label, peer)
            try:
                ck = ray.get(self.topology.handle(peer).checkpoint.remote(), timeout=120)
            except Exception as e:
                if not is_actor_death(e):
                    raise
                # the peer died unannounced (within the fault model): the next live peer hands over
                self.dep.mark_failed(peer, f"died while handing its state over to {label}: {type(e).__name__}")
                continue
            got = ray.get(handle.install.remote(ck), timeout=300)
            return {"peer": peer, "extra_streams": added, **got}
        raise RuntimeError(f"every live peer of {rep.operator!r} died while handing its state over to {label}")

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
