"""What the control loop measures each utility period: the replicas' reports (filter weights,
rates, loads, input delays), the holds on retention logs they ask for, and the servers' loads
(Hwang §V; docs/gc.md).

>>> plane.manager.meter.measure()          # doctest: +SKIP
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import replace

import ray

from ...gc import ENTRY, Snapshot, StreamReplica, partition_view
from ...plan import label_group, replica_partition
from .channels import gone_key
from .common import READY_S


__all__ = ["Meter", "CUT_MS"]

#: Latency (ms) a cut link counts with in the snapshot (the cost model needs finite figures).
CUT_MS = 60_000.0


class Meter:
    """What the control loop measures each utility period: the replicas' reports (filter weights,

    >>> plane.manager.meter.measure()          # doctest: +SKIP
    """

    def __init__(self, mgr):
        self.mgr = mgr  # the :class:`~.control.ReplicaManager` whose state it reads and changes

    # -- measuring ---------------------------------------------------------------------------
    def _latency(self, a: str, b: str) -> float:
        lat = float(self.mgr.dep.conditions.latency_ms(a, b, self.mgr.now()))
        return CUT_MS if not math.isfinite(lat) else lat

    def _reports(self) -> dict[str, dict]:
        """The gc report of every running replica not failed, all asked at once and waited for
        together for at most one utility period (between 2 and 30 s). One that does not answer in
        time is left out of this period and listed in :attr:`unanswered` (a replica busy in long
        calls: an overloaded server answers late); its report is not asked again until it
        answers, and counts in the next period. A death is noticed through the topology."""
        topo = self.mgr.topology
        running = {r.label for r in topo.replicas() if r.state != "failed" and topo.is_running(r.label)}
        for label in [lab for lab in self.mgr._asked if lab not in running]:
            del self.mgr._asked[label]
        for label in running:
            if label not in self.mgr._asked:
                self.mgr._asked[label] = topo.handle(label).gc_report.remote()
        refs = list(self.mgr._asked.values())
        wait_s = min(30.0, max(2.0, float(self.mgr.cfg.utility_period_s)))
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=wait_s)[0]) if refs else set()
        out = {}
        self.mgr.unanswered = set()
        for label, ref in list(self.mgr._asked.items()):
            if ref not in ready:
                self.mgr.unanswered.add(label)
                continue
            del self.mgr._asked[label]
            try:
                out[label] = ray.get(ref, timeout=READY_S)
            except Exception:  # no report from it this period; see the docstring
                continue
        return out

    def notice_failures(self) -> None:
        """Log every replica that failed since the last call (failure, not garbage collection)."""
        for r in self.mgr.topology.replicas(state="failed"):
            if r.label not in self.mgr.reported_failures:
                self.mgr.reported_failures.add(r.label)
                self.mgr.record({"kind": "failure", "action": "failed", "replica": r.label,
                             "text": f"{r.label} died (failure, not garbage collection)"})

    def measure(self) -> Snapshot:
        """Ask the actors and build the current snapshot (rates, latencies, weights of the last period):
        the :func:`~replistream.gc.partition_view` of the topology's, so that with partitioned operators
        each partition (``"op.P"``) is an operator of it (its view is ``mgr.view``)."""
        topo = self.mgr.topology
        with self.mgr.lock:
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
                weights[sid] = max(0.0, w - self.mgr.weights_prev.get(key, 0.0))
                self.mgr.weights_prev[key] = w
            # once the feeder has sent everything, nothing newer is due: a replica's input stops
            # aging then (else every replica looks hindered at the end of a paced run)
            done = self.mgr.dep.feeder.done_wall
            idle = max(0.0, time.time() - done) if done is not None else 0.0
            self.mgr.delays = {label: max(0.0, float(rep.get("delay_s", 0.0)) - idle) for label, rep in reports.items()
                           if topo.replica(label).kind != "entry" and topo.replica(label).live}

            def measured(s: StreamReplica) -> StreamReplica:
                return replace(s, rate=float(self.mgr.rates.get(s.stream, 0.0)),
                               latency_ms=self._latency(topo.server(s.src), topo.server(s.dst)),
                               weight=weights.get(s.id, 0.0))

            # per partition replica: each partition of a partitioned operator is an operator of the
            # snapshot, each (port, upstream partition) an input (replistream.gc.partitions); the
            # decisions made on it are translated back through mgr.view before they are applied
            view = partition_view(topo.snapshot(self.mgr.kmin, self.mgr.theta, measured))
            snap = view.snapshot
            self._floor_dormant_entries(reports)
            self._raise_holds(reports)
            self.mgr.view = view
            self.mgr.last_snapshot = snap
            return snap

    def _fed(self, label: str, port: int) -> bool:
        """Whether ``label`` is live, running and fed on input ``port`` by a live stream replica
        from a running replica."""
        topo = self.mgr.topology
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
        topo = self.mgr.topology
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
        now = self.mgr.now()
        window = self.mgr.cfg.rate_window()
        best: dict[str, float] = {}
        for label, rep in reports.items():
            for stream, n in rep.get("emitted", {}).items():
                key = (label, stream)
                hist = self.mgr.flushed.get(key)
                if hist is None:
                    born = max(0.0, now - float(rep.get("age_s", now)))
                    hist = self.mgr.flushed[key] = deque([(born, 0)])
                hist.append((now, int(n)))
                while len(hist) > 2 and now - hist[1][0] >= window:
                    hist.popleft()
                (t_a, n_a), (t_b, n_b) = hist[0], hist[-1]
                if t_b - t_a > 1e-3:
                    best[stream] = max(best.get(stream, 0.0), (n_b - n_a) / (t_b - t_a))
        self.mgr.rates.update(best)

    def _floor_dormant_entries(self, reports: dict) -> None:
        """A dormant entry replica (still fed, no links) trims its retention to what the live entry
        replicas' consumers acknowledged: the live replicas of its own entry partition's, with
        ``parallelism={"entry": p}`` (each partition carries other tuples)."""
        topo = self.mgr.topology
        groups: dict[str, list] = {}
        for r in topo.replicas(ENTRY):
            groups.setdefault(label_group(r.label) if replica_partition(r.label) is not None else ENTRY, []).append(r)
        for entries in groups.values():
            live = [reports[r.label] for r in entries if r.live and r.label in reports]
            dormant = [r.label for r in entries if r.state == "dormant" and topo.is_running(r.label)]
            if not live or not dormant:
                continue
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
            prev = self.mgr._work_prev.get(label)
            self.mgr._work_prev[label] = (now, float(rep["busy_s"]), float(rep["work_s"]))
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                self.mgr.loads[label] = max(0.0, (float(rep["work_s"]) - prev[2]) / dt)
                self.mgr.own_loads[label] = max(0.0, (float(rep["busy_s"]) - prev[1]) / dt)

    def server_loads(self) -> dict[str, float]:
        """``{server: load}``: the measured loads of the replicas running there (shares of a core).

        >>> dep.control_loop().server_loads()   # doctest: +SKIP
        {'boston': 0.93, 'london': 0.12, 'tokyo': 0.08}
        """
        out = {s: 0.0 for s in self.mgr.dep.servers}
        for label, _ in self.mgr.topology.running():
            out[self.mgr.topology.server(label)] = out.get(self.mgr.topology.server(label), 0.0) + self.mgr.loads.get(label, 0.0)
        return out
