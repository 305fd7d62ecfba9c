"""Crashes and their repair, in a deployment's control plane.

:meth:`Repairer.mark_failed` turns a death into the topology's ``failed`` state (every running
actor drops its links to it); with ``deploy(repair=True)`` the replica is then rebuilt on its
server by hand-over from a live peer (Hwang §V-C), an entry replica from a peer's input state.

>>> plane.repairer.mark_failed("join#0", "killed")     # doctest: +SKIP
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
import warnings

import ray

from ...placement.nodes import ray_options
from ...plan import ENTRY, label_group, replica_index, replica_partition
from .actors import EntryActor
from .lifecycle import kill_actors

__all__ = ["Repairer", "REPAIR_ATTEMPTS", "REPAIR_RETRY_S", "wanted_replicas"]

#: Tries of one crashed replica's repair: a repair that fails (a fault during it, e.g. the peer
#: it copies from killed meanwhile) is tried again, :data:`REPAIR_RETRY_S` later, while a live
#: peer is left to copy from; after the last one the operator runs on with fewer replicas.
REPAIR_ATTEMPTS = 3
REPAIR_RETRY_S = 1.0


def wanted_replicas(plane, operator: str) -> int:
    """How many live replicas ``operator`` (each of its partitions) should have: the deployment's
    ``k``, or what the last ``set_replication`` of it set (recorded in ``plane.changes``). A repair
    rebuilds a crashed replica only while its group has fewer.

    >>> from types import SimpleNamespace
    >>> plane = SimpleNamespace(k=2, changes=[{"change": "set_replication", "operator": "agg", "k": 3}])
    >>> wanted_replicas(plane, "agg"), wanted_replicas(plane, "join")
    (3, 2)
    """
    k = int(plane.k)
    for c in getattr(plane, "changes", ()):
        if c.get("change") == "set_replication" and c.get("operator") == operator:
            k = int(c["k"])
    return k


class Repairer:
    """Crashes and their repair, in a deployment's control plane.

    >>> plane.repairer.mark_failed("join#0", "killed")     # doctest: +SKIP
    """

    def __init__(self, plane):
        self.plane = plane  # the :class:`~.plane.ControlPlane` this part belongs to
        self.repair = False  # deploy(repair=True): a crashed operator replica is replaced (_repair_loop)
        self.spares = 0
        self.repairs: list[dict] = []  # one record per repair tried (see _repair_loop)
        self._repair_queue: queue.Queue = queue.Queue()
        self._repair_thread: threading.Thread | None = None
        self._lost_servers: set[str] = set()

    def mark_failed(self, label: str, reason: str) -> None:
        """``label``'s actor died (``reason``): the topology marks it failed, the event is logged
        (``"dead"``), and every running actor drops its links to it."""
        h = self.plane.topology.handle(label) if label in self.plane.topology else None
        if not self.plane.topology.mark_failed(label):
            return
        if h is not None:  # a replica counted failed never runs on (one Ray only could not reach, too)
            kill_actors([h])
        self.plane.events.append({"t": self.plane.now(), "event": "dead", "actor": label, "reason": reason})
        for other, h in self.plane.topology.running():
            if other != label:
                h.drop_link.remote(label, reason)
        if self.repair:
            self._schedule_repair(label, reason)

    # -- automatic repair ----------------------------------------------------------------------
    def _schedule_repair(self, label: str, reason: str) -> None:
        """Queue the repair of crashed ``label`` (``deploy(repair=True)``): an operator or entry
        replica whose server is not lost (an entry replica from a live peer's input state,
        :meth:`repair_entry`); applications are not rebuilt (they hold delivered results)."""
        rep = self.plane.topology.replica(label)
        why = None
        if rep.kind == "application":
            why = "an application is not rebuilt"
        elif rep.server in self._lost_servers:
            why = f"its server {rep.server} is lost"
        elif self.plane.shut_down:
            return
        if why is not None:
            self.repairs.append({"replica": label, "repaired": False, "why": why})
            self.plane.events.append({"t": self.plane.now(), "event": "not_repaired", "actor": label, "why": why})
            return
        self._repair_queue.put((label, time.time(), 1))
        if self._repair_thread is None or not self._repair_thread.is_alive():
            self._repair_thread = threading.Thread(target=self._repair_loop, daemon=True, name="replistream-repair")
            self._repair_thread.start()

    def _retry_later(self, label: str, detected: float, attempt: int) -> None:
        """Queue try ``attempt`` of ``label``'s repair :data:`REPAIR_RETRY_S` from now (the repair
        thread, which queued it, is running)."""
        t = threading.Timer(REPAIR_RETRY_S, self._repair_queue.put, args=((label, detected, attempt),))
        t.daemon = True
        t.start()

    def _repair_loop(self) -> None:
        """Replace each queued crashed replica by a new one on its server, built by hand-over from a
        live peer (:meth:`revive_replica`, Hwang §V-C; a warm spare's process if one is kept), then
        start a spare in place of the one taken. A repair that fails is logged (``repair_failed``,
        with its try) and kept in :attr:`repairs` (``retrying``: it is tried again), then tried
        again :data:`REPAIR_RETRY_S` later, up to :data:`REPAIR_ATTEMPTS` tries; after the last it
        is warned about, and the operator runs on with fewer replicas, never with wrong output."""
        while not self.plane.shut_down:
            try:
                label, detected, attempt = self._repair_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if self.plane.shut_down:
                return
            while self.plane.rescaling.is_set() and not self.plane.shut_down:  # after the rescale (rescale.py)
                self.plane.rescale_done.wait(0.2)
            if self.plane.delivered.complete():  # nothing is left to compute
                self.repairs.append({"replica": label, "repaired": False, "why": "the run had completed"})
                continue
            if label in self.plane.topology.removed():  # (a partition retired by the rescale meanwhile)
                self.repairs.append({"replica": label, "repaired": False, "why": "its partition was retired"})
                continue
            op = self.plane.topology.replica(label).operator
            live = len(self.plane.topology.serving(label_group(label)))  # (of its partition, when partitioned)
            if not live:
                continue  # nothing to hand over from: the run fails naming the operator (check_failures)
            want = wanted_replicas(self.plane, op)
            if live >= want:  # back at k meanwhile (a try before this one, a revival, a host restored)
                why = f"its group is back at k={want} live replicas"
                self.repairs.append({"replica": label, "repaired": False, "why": why, "attempt": attempt})
                self.plane.events.append({"t": self.plane.now(), "event": "not_repaired", "actor": label, "why": why})
                continue
            rec = {"replica": label, "detected_wall": detected, "attempt": attempt}
            try:
                if op == ENTRY:
                    new = self.repair_entry(label)
                    rec.update(repaired=True, new=new, installed_wall=time.time())
                else:
                    ev = self.plane.control_loop().handover.replace_replica(label)
                    rec.update(repaired=True, new=ev["new_replicas"][0]["label"], installed_wall=time.time())
                self.plane.events.append({"t": self.plane.now(), "event": "repaired", "actor": label, "new": rec["new"],
                                          "seconds": round(rec["installed_wall"] - detected, 4)})
                if self.spares:
                    self.plane.start_spares(1)
            except Exception as e:  # the run stays exact with the replicas left; said loudly
                if self.plane.shut_down:
                    return
                again = attempt < REPAIR_ATTEMPTS
                rec.update(repaired=False, why=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=12),
                           retrying=again)
                self.plane.events.append({"t": self.plane.now(), "event": "repair_failed", "actor": label,
                                          "error": rec["why"], "attempt": attempt, "retrying": again})
                if again:  # (a fault during the repair: the next try copies from a peer still live)
                    self._retry_later(label, detected, attempt + 1)
                else:
                    warnings.warn(f"replistream: could not repair {label} in {attempt} tries ({rec['why']}); "
                                  f"{op!r} runs on with the replicas left", RuntimeWarning, stacklevel=1)
            self.repairs.append(rec)

    def repair_entry(self, label: str) -> str:
        """Replace the crashed entry replica ``label`` by a new one on its server, from a live
        peer's :meth:`~.actors.EntryActor.entry_checkpoint` (Hwang §III: entry points hold their
        input for their peers; with entry partitions, a peer of its own partition ``entry.P``, and
        the new replica is ``entry.P#N``): while no chunk is fed and no control action runs
        (:meth:`quiet`), the peer's entry logic and retained output go to the new replica, which
        is connected to every live downstream replica (replaying what it retained; the duplicate
        filters drop what they had) and fed every chunk from then on. Returns its label.

        >>> dep.repair_entry("entry#0")    # doctest: +SKIP
        'entry#2'
        """
        from ...gc import OperatorReplica, StreamReplica

        topo, q = self.plane.topology, self.plane.query
        old = topo.replica(label)
        with self.plane.quiet():
            peers = [p for p in topo.serving(label_group(label))
                     if not self.plane.detector.is_suspected(p)]  # never wait on a silent one with the feed held
            if not peers:
                raise RuntimeError(f"no live entry replica that answers can hand its input over to a replacement "
                                   f"of {label}")
            ck = ray.get(topo.handle(peers[0]).entry_checkpoint.remote(), timeout=120)
            new_label = topo.next_label(label_group(label))
            index = replica_index(new_label)
            h = self.plane._settle(*self.plane._start(EntryActor, ray_options(self.plane.servers[old.server]), q, index, old.server,
                                                      self.plane.conditions, self.plane.t0, self.plane.channel_opts, self.plane.coordinator,
                                                      self.plane.strict, self.plane.on_malformed,
                                                      partition=replica_partition(label)))
            try:
                ray.get(h.install_entry.remote(ck), timeout=120)
            except BaseException:  # a half-started replica must not linger (the repair may be tried again)
                kill_actors([h])
                raise
            topo.add_replica(OperatorReplica(new_label, ENTRY, old.server, "entry", "live", False))
            topo.attach(new_label, h)
            mgr = self.plane.control_loop()
            with mgr.handover.logs_held([new_label]):
                for src in q.sources:
                    for v, port in q.outputs_of(src):
                        for r in topo.replicas(v, state="live"):
                            if topo.is_running(r.label):
                                mgr.handover._connect(StreamReplica(new_label, r.label, port, 0.0, 0.0, 0.0, False,
                                                                    src))
        self.plane.events.append({"t": self.plane.now(), "event": "entry_repaired", "actor": label, "new": new_label,
                                  "from": peers[0], "expected": ck["expected"]})
        return new_label
