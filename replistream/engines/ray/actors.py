"""The data-path Ray actors of a deployment: entry points, operator replicas, applications.

Each actor hosts plain objects from the core (docs/design.md, decision 2): a
:class:`~replistream.replica.ReplicaCore` (or the entry points'
:class:`~replistream.operators.entry.EntryLogic`), and an
:class:`~replistream.engines.ray.channels.Outbox` per output stream whose
retention log is the core's :class:`~replistream.replica.ReplayLog`. Actors are
created with ``num_cpus=0`` so a replicated query fits on a small machine; a
*server* is a label (and, on a cluster, a Ray node) that every actor knows, for
the emulated network and for failure injection.

* :class:`EntryActor`: one replica of the entry points of every source (Hwang §II-B);
* :class:`ReplicaActor`: one operator replica; started *pending* it buffers its input
  until a hand-over installs a peer's checkpoint (docs/design.md, decision 7), whole
  or in steps of bins (Megaphone §3.3: ``begin_transfer``/``install_step`` as
  receiver, ``request_steps`` as sender);
* :class:`SinkActor`: an application, which records what it delivers.

The coordinator actor is in :mod:`.coordinator`: it needs the placement library
(scipy), which this module keeps out of the data-path actors' processes.

Locks (each actor, in its own process; a thread holding one takes only those
after it, never one before):

1. ``lock`` (the core and what it emitted; ``inbox_cv`` and ``installed_cv`` are its
   conditions: a receiver's worker waits on the first, ``install_step`` and
   ``transfer_status`` on the second, in the ``transfer`` concurrency group);
2. ``staged_lock`` (a receiver's :class:`~replistream.replica.StagedReplica`): the
   transfer worker applies input and steps under it alone and publishes what it
   installed under ``lock`` only after releasing it (``_staged_run``);
3. an outbox's lock (``Outbox.lock``, one per output stream; never two at once).

The probe (:meth:`_Base.probe`) runs on a thread of its own and takes no lock.

>>> h = ReplicaActor.remote(query, "join", 0, "tokyo", [2, 2], network, t0, {})   # doctest: +SKIP
>>> ray.get(h.connect.remote("join", "alerts", "boston", sink, 0, 0))          # doctest: +SKIP
0
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import resource
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray

from ...partition import DEFAULT_BITS, BinMap, Router, parse_partition_label, partition_label
from ...plan import label_group, replica_partition
from ...replica import ReplicaCore, StagedReplica
from ...replica.transfer import unpack_steps
from ...schema import END, TS, Marker, Punctuation
from ...sinks import SinkWriter
from . import gcpause, lockorder, metrics_export
from .channels import NO_ACK, Link, Outbox, Sender
from .moving import MovingBins
from .common import failure_record, warm_lazy_imports

#: Punctuation rises each replica remembers for :meth:`_Base.punctuation_times` (in and out each).
PUNCT_TIMES = 4096

__all__ = ["EntryActor", "ReplicaActor", "SinkActor"]


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Base:
    """What every data-path actor shares: identity, server, network view, outboxes."""

    def _setup(self, label: str, server: str, network, t0: float, channel_opts: dict, coordinator=None):
        self.label = label
        self.quiet = False  # the deployment ended: send nothing, ignore input (pool.py)
        self._reports: list = []  # reports sent to the coordinator (settled() waits for them)
        self._sent: list[tuple[str, dict]] = []  # every report, sent again to a new coordinator
        self._rid = itertools.count()  # report ids (next() is atomic: the sender thread reports too)
        self.failure: dict | None = None  # set when this replica's own code raised (_fatal)
        self.server = server
        self.network = network
        self.t0 = t0
        self.channel_opts = dict(channel_opts)
        #: ``{operator: p}`` of the deployment's partitioned operators and the bits of their bins
        #: (issue #41): a link to a partition's replica carries that partition's share only
        self.partitions: dict[str, int] = dict(self.channel_opts.pop("partitions", None) or {})
        self.bits: int = int(self.channel_opts.pop("bits", None) or DEFAULT_BITS)
        #: per partitioned operator, ``(partitions at deployment, [Switch of each rescale since])``
        self.routing: dict[str, tuple] = dict(self.channel_opts.pop("routing", None) or {})
        self.channel_opts.pop("entry_partitions", None)  # (the entry points': read by the control plane)
        self._routers: dict[str, Router] = {}
        #: The deployment this actor belongs to (``channel_opts["epoch"]``): a packet or report of
        #: another deployment (an old sender of a pooled actor's previous life) is rejected, named.
        self.epoch = self.channel_opts.get("epoch")
        self.stale: list[dict] = []  # packets rejected for their epoch (at most the last 100)
        self.coordinator = coordinator
        self.outboxes: dict[str, Outbox] = {}
        self.sender = Sender([], on_error=self._sender_failed)
        self.sender.start()
        self.cpu0 = _cpu_seconds()
        self.dropped: list[dict] = []
        self.pushes = 0
        self.busy_s = 0.0  # time spent in operator logic
        self.slow_s = 0.0  # time a slowed server's emulation added to it (_slowdown)
        self.last_push = None
        # input delay (Hwang §V-C): per input port, the event time of the freshest tuple or
        # punctuation received, mapped to wall time with the feeder's clock (set_clock)
        self.ts0: float | None = None
        self.pace: float | None = None
        self.created = time.time()
        self.fresh: dict[int, int] = {}
        self.call_started: float | None = None  # when the data-path call running now began (probe)
        # when this replica's punctuation rose, in and out (punctuation_times: latency by hop)
        self.punct_in: deque = deque(maxlen=PUNCT_TIMES)
        self.punct_out: deque = deque(maxlen=PUNCT_TIMES)
        # Python's garbage collector: pauses measured (stats()["gc"]), young collections rarer,
        # everything built so far frozen out of later collections (gcpause.py, issue #42)
        self.gc_watch = gcpause.watch()
        warm_lazy_imports()  # (numpy's lazy imports paid here, not on the data thread at a first snapshot)
        # before any data flows, frozen; a pooled life's garbage collected first so none is frozen for
        # good. A fresh process's first set-up skips that full collection: it found 41 unreachable
        # objects among 88,000 and cost 43 ms of CPU per actor, ten actors starting at once at k=3
        gcpause.settle(collect=gcpause.freezes() > 0)
        self.frozen_at_setup = gcpause.freezes()  # reinit thaws only if a later install froze more

    def _punct_times(self, started: float, before: int, after: int, out: list) -> None:
        """Keep when the input punctuation rose from ``before`` to ``after`` (the call that brought
        it began at ``started``) and when each punctuation in ``out`` left (now)."""
        if after > before:
            self.punct_in.append((int(after), started))
        now = None
        for it in out:
            if isinstance(it, Punctuation):
                now = now or time.time()
                self.punct_out.append((int(it.p), now))

    @ray.method(concurrency_group="probe")
    def punctuation_times(self) -> dict:
        """When this replica's punctuation rose (the last few thousand times): ``{"label", "in":
        [(punctuation, wall time of the call that brought it)], "out": [(punctuation, wall time it
        left)]}``. An entry replica's input is its source's (the punctuation its entry point reached);
        an application's "out" is empty. ``bench/latency.py`` follows a window's close through
        every hop with it.

        >>> ray.get(dep.handles["entry#0"].punctuation_times.remote(), timeout=30)["out"][:1]   # doctest: +SKIP
        [(999999, 1764331200.52)]
        """
        return {"label": self.label, "in": list(self.punct_in), "out": list(self.punct_out)}

    @ray.method(concurrency_group="probe")
    def lock_order(self) -> dict:
        """This process's record of the order it took its locks in (:func:`.lockorder.report`; on
        when the process has ``REPLISTREAM_LOCK_ORDER=1``).

        >>> ray.get(replica.lock_order.remote())["violations"]   # doctest: +SKIP
        []
        """
        return lockorder.report()

    # -- the failure detector's probe (detector.py): answered on a thread of its own ---------------
    @ray.method(concurrency_group="probe")
    def probe(self) -> dict:
        """Answered apart from the data path (its own concurrency group), so a healthy replica
        answers at once whatever its input queue: how long the data-path call running now has run
        (``busy_s``, 0 between calls; time waiting on backpressure does not count), calls
        completed, and the process id (to fence the replica off if it is declared failed).

        >>> ray.get(replica.probe.remote())["busy_s"]   # doctest: +SKIP
        0.0
        """
        started = getattr(self, "call_started", None)
        node = getattr(self, "_node", None)
        if node is None:
            node = self._node = ray.get_runtime_context().get_node_id()
        ident = getattr(self, "_ident", None)
        if ident is None:  # who this process is, for a fence that checks before it kills (common.signal_process)
            from .common import process_start

            ident = self._ident = {"actor": ray.get_runtime_context().get_actor_id(),
                                   "start": process_start(os.getpid())}
        return {"busy_s": 0.0 if started is None else time.time() - started, "pushes": getattr(self, "pushes", 0),
                "pid": os.getpid(), "node": node, "position": self._position(), "pending": self._pending(), **ident}

    def _pending(self) -> bool:
        """Whether it still waits for its state (a replica started pending, before ``install``)."""
        return False

    @contextmanager
    def _data_call(self, started: float):
        """A data-path call runs from ``started`` (what :meth:`probe` reports as ``busy_s``)."""
        self.call_started = started
        try:
            yield
        finally:
            self.call_started = None

    def _position(self) -> int | None:
        """Its logical position for the failure detector (comparable among the replicas of one node):
        the watermark its core reached (an application: its last punctuation; an entry replica:
        chunks taken). Read without a lock: one attribute, possibly a moment old."""
        core = getattr(self, "core", None)
        logic = getattr(core, "logic", None)
        w = getattr(logic, "watermark", None)
        return None if w is None else int(w)

    # -- reuse by a later deployment (pool.py) --------------------------------------------------
    def preload(self) -> int:
        """Import every operator and replica module a deployment's replica may need (a warm actor of
        the cluster's pool, engines/ray/warm.py: its re-initialisation then imports nothing; on two
        cores ten actors importing at once took seconds). Returns how many modules it imported.

        >>> ray.get(actor.preload.remote()) > 0   # doctest: +SKIP
        True
        """
        import importlib
        import pkgutil

        from ... import operators, replica

        names = [m.name for pkg in (operators, replica)
                 for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + ".")]
        for name in names:
            importlib.import_module(name)
        return len(names)

    def stop_sending(self) -> bool:
        """The deployment ends: stop the sender thread and ignore input from now on."""
        self.quiet = True
        self.sender.stop()
        return True

    def settled(self) -> tuple[bool, bool]:
        """``(no call of this actor still in flight and its sender thread gone, reusable)``."""
        refs = [r for ob in self.outboxes.values() for r in ob.inflight_refs()] + self._reports
        if refs:
            _, rest = ray.wait(refs, num_returns=len(refs), timeout=0)
            if rest:
                return False, self._reusable()
        self.sender.join(timeout=0.5)
        return not self.sender.is_alive(), self._reusable()

    def _reusable(self) -> bool:
        return self.failure is None

    def reinit(self, *args, **kwargs) -> bool:
        """Become a new actor of this class for another deployment: every attribute dropped, then
        ``__init__(*args, **kwargs)``. Only for an actor the pool took in (quiet and settled)."""
        if getattr(self, "quiet", False):
            self.sender.join(timeout=1.0)
        if not getattr(self, "quiet", False) or self.sender.is_alive():
            raise RuntimeError(f"{self.label}: reinit of an actor still in use")
        # the earlier life's state, frozen at its install, collectable again (_setup collects); a
        # spare never fed holds no state and froze nothing after its set-up: no thaw, so the next
        # set-up's collection walks only what was made since (a spare is taken while data flows)
        gcpause.thaw(since=getattr(self, "frozen_at_setup", None) if self._untouched() else None)
        for name in [n for n in self.__dict__ if not n.startswith("_ray")]:
            del self.__dict__[name]
        self.__init__(*args, **kwargs)
        return True

    def _untouched(self) -> bool:
        """Whether this life took in no data (a spare never fed): its objects frozen at set-up hold
        no state, so ``reinit`` need not thaw them. Only an actor that counts its input can say so.

        >>> replica._untouched()   # doctest: +SKIP
        True
        """
        return False

    def _stale(self, port: int, channel: int, epoch, sender) -> int:
        """A packet from another deployment (``epoch``; ``sender``: its sender's label): rejected and
        reported, never processed (its channel numbers are another deployment's). Returns no ack."""
        rec = {"receiver": self.label, "sender": sender, "epoch": epoch, "port": int(port), "channel": int(channel),
               "t": time.time() - self.t0}
        self.stale = [*self.stale[-99:], rec]
        self._report("stale_packet", rec)
        return NO_ACK

    def _report(self, kind: str, rec: dict) -> None:
        """Send a report to the coordinator, with an id (``rid``) that makes sending it again harmless,
        and the deployment's epoch (the coordinator ignores reports of another deployment)."""
        if self.coordinator is None:
            return
        rec = {**rec, "rid": f"{self.label}/{next(self._rid)}", "epoch": self.epoch}
        self._sent.append((kind, rec))
        self._reports.append(self.coordinator.report.remote(kind, rec))

    @ray.method(concurrency_group="probe")  # not behind a long data-path call
    def set_coordinator(self, handle) -> int:
        """The deployment replaced its coordinator (the old one was lost for good): report to
        ``handle`` from now on, and send it every report sent so far (it logs each id once), so
        none sent to the lost one is lost with it. Returns how many were sent again.

        >>> ray.get(replica.set_coordinator.remote(new_coordinator))   # doctest: +SKIP
        2
        """
        self.coordinator = handle
        sent = list(self._sent)
        self._reports = [handle.report.remote(kind, rec) for kind, rec in sent]
        return len(sent)

    @ray.method(concurrency_group="probe")  # not behind a long data-path call: it must come first
    def hold_retention(self, key: str, p: int) -> bool:
        """Every output stream keeps what it sent after punctuation ``p`` for ``key`` (an operator
        downstream whose dormant checkpoint is at ``p``), whatever its links acknowledge."""
        for ob in list(self.outboxes.values()):
            ob.hold(key, p)
        self._holds = {**getattr(self, "_holds", {}), key: max(getattr(self, "_holds", {}).get(key, p), p)}
        return True

    def _outbox(self, stream: str) -> Outbox:
        ob = self.outboxes.get(stream)
        if ob is None:
            ob = Outbox(f"{self.label}", self.server, self.network, self.t0, on_drop=self._on_drop,
                        **self.channel_opts)
            for key, p in getattr(self, "_holds", {}).items():  # an outbox opened later holds as well
                ob.hold(key, p)
            self.outboxes[stream] = ob
            self.sender.add(ob)
        return ob

    def _on_drop(self, owner: str, link: Link, reason: str) -> None:
        rec = {"from": owner, "to": link.label, "reason": reason, "t": time.time() - self.t0}
        self.dropped.append(rec)
        self._report("channel_dropped", rec)

    def connect(self, stream: str, label: str, server: str, handle, port: int, channel: int,
                replay: bool = False) -> int:
        """Add a stream replica from ``stream`` (this actor's output) to ``label``'s input ``port``.

        With ``replay`` the new link first carries what this actor retained
        since its downstream replicas' last common acknowledgement (a new or
        revived downstream replica, or a revived stream replica; Hwang §V-C).
        Returns the number of tuples replayed."""
        return self._outbox(stream).add_link(self._link(label, server, handle, port, channel), replay=replay)

    def _link(self, label: str, server: str, handle, port: int, channel: int) -> Link:
        """A link to ``label``; to a replica of a partitioned operator (``"agg.1#0"``) it carries
        the share of the stream its partition owns (:class:`~replistream.partition.Router`)."""
        node, part = parse_partition_label(label_group(label))
        if part is None or node not in self.partitions:
            return Link(label, server, handle, port, channel)
        router = self._routers.get(node)
        if router is None:
            router = self._routers[node] = self._router(node)
        return Link(label, server, handle, port, channel, router=router, partition=part)

    def _router(self, node: str) -> Router:
        p0, switches = self.routing.get(node, (self.partitions[node], ()))
        return Router(self.query, node, BinMap.even(p0, self.bits), switches)

    def set_routing(self, node: str, partitions: int, p0: int, switches: list) -> int:
        """A rescale of partitioned ``node`` (:mod:`.rescale`): it has ``partitions`` partitions,
        ``p0`` at deployment, and these switches (:class:`~replistream.partition.Switch`) since;
        every link to it routes by them from now on (a switch concerns only tuples later than the
        largest timestamp fed, none of which exists yet). Returns the links changed."""
        self.partitions[node] = int(partitions)
        self.routing[node] = (int(p0), list(switches))
        router = self._routers[node] = self._router(node)
        n = 0
        for ob in list(self.outboxes.values()):
            with ob.lock:
                for link in ob.links:
                    if link.router is not None and link.router.node == node:
                        link.router = router
                        n += 1
        return n

    def connect_for_transfer(self, stream: str, label: str, server: str, handle, port: int, channel: int) -> int:
        """Add a stream replica to a staged transfer's receiver *without* replay, and return its
        *connect mark*: a timestamp at or above every tuple and punctuation this stream carried
        before the link (:meth:`~replistream.replica.ReplayLog.bound`, read with the link added
        under the outbox lock). The link then carries every tuple of the stream with a larger
        timestamp; the sending peer takes its first step only once its filter's punctuation on
        that port has reached the mark (the exactness argument is in
        :mod:`replistream.engines.ray.transfer`).

        >>> ray.get(entry.connect_for_transfer.remote("s", "join#2", "tokyo", new, 0, 1))  # doctest: +SKIP
        1040000
        """
        ob = self._outbox(stream)
        with ob.lock:  # re-entrant: add_link takes it too; nothing is flushed between the two
            mark = ob.log.bound()
            ob.add_link(self._link(label, server, handle, port, channel), replay=False)
        return int(mark)

    def _emit(self, outbox: Outbox, out: list) -> None:
        """Queue ``out`` on ``outbox``; a marker that opens stream replicas from this actor
        (an operator added at run time, :class:`~replistream.replica.changes.AddOperator`) opens
        them just before it is queued, so each new link starts with the marker and then
        carries everything emitted after it (call under the actor's lock)."""
        start = 0
        for i, it in enumerate(out):
            if isinstance(it, Marker):
                links = [l for l in it.change.links_from(self.label) if self.outboxes.get(l[0]) is outbox]
                if links:
                    outbox.emit(out[start:i], wait=False)
                    outbox.flush()
                    for stream, label, server, handle, port, channel in links:
                        self.connect(stream, label, server, handle, port, channel)
                    start = i
        outbox.emit(out[start:] if start else out, wait=False)

    def disconnect(self, label: str, port: int | None = None, hold: bool = False) -> int:
        """Stop sending to ``label`` (a discarded stream replica, Algorithm 6); returns links removed.

        With ``hold`` (the receiver stays fed by other senders), the retention log keeps what
        ``label`` has not acknowledged, for a replay if this stream replica is revived
        (:meth:`~.channels.Outbox.remove_link`); :meth:`raise_holds` moves the hold on.

        >>> ray.get(loads0.disconnect.remote("correlate#1", 0, True), timeout=60)   # doctest: +SKIP
        1
        """
        return sum(ob.remove_link(label, port, hold=hold) for ob in self.outboxes.values())

    def raise_holds(self, points: dict) -> int:
        """``{hold key: acknowledged punctuation, or None to release}`` for the holds discarded
        stream replicas left (:meth:`disconnect` with ``hold``): the coordinator's utility
        period passes each receiver's progress. Returns how many holds changed.

        >>> ray.get(loads0.raise_holds.remote({"gone:correlate#1:0": 41_999_999}), timeout=60)   # doctest: +SKIP
        1
        """
        holds = getattr(self, "_holds", {})
        for key, p in points.items():  # (an outbox opened later holds what is still held, nothing else)
            if key in holds:
                if p is None:
                    holds = {k: v for k, v in holds.items() if k != key}
                else:
                    holds = {**holds, key: max(holds[key], int(p))}
        self._holds = holds
        return sum(ob.raise_holds(points) for ob in list(self.outboxes.values()))

    def set_floor(self, acked: int) -> bool:
        """Trim point of the retention logs of outboxes without active links (a dormant entry replica)."""
        for ob in self.outboxes.values():
            ob.set_floor(acked)
        return True

    def set_clock(self, t0: float, ts0: float, pace: float | None) -> bool:
        """The feeder's clock: event time ``ts`` is due at wall time ``t0 + (ts - ts0) / (1e6 * pace)``."""
        self.t0, self.ts0, self.pace = t0, float(ts0), pace
        for ob in self.outboxes.values():
            ob.t0 = t0
        return True

    def _observe(self, port: int, packet: list) -> None:
        """Remember the freshest event time received on ``port`` (for :meth:`input_delay`)."""
        hi = self.fresh.get(port)
        for it in packet:
            if isinstance(it, Marker):
                continue
            t = it.p if isinstance(it, Punctuation) else (int(it[TS].max()) if len(it) else None)
            if t is not None and (hi is None or t > hi):
                hi = t
        if hi is not None:
            self.fresh[port] = hi

    def input_delay(self, ports: int) -> float:
        """Seconds the freshest input lags behind the feeder's clock, worst port first (Hwang §V-C).

        A port that has received nothing counts from when this actor started
        (or the run started, if later). 0 for unpaced runs (no clock)."""
        if self.pace is None or self.ts0 is None:
            return 0.0
        now = time.time()
        start = max(self.created, self.t0)
        worst = 0.0
        for p in range(ports):
            t = self.fresh.get(p)
            wall = start if t is None or t == END else max(start, self.t0 + (t - self.ts0) / (1e6 * self.pace))
            if t == END:
                continue
            worst = max(worst, now - wall)
        return worst

    def _weights(self) -> list[list[float]]:
        core = getattr(self, "core", None)
        if core is None or core.filters is None:
            return []
        return [f.weights.tolist() for f in core.filters]

    def _acks(self) -> list[int]:
        """Per input port, the duplicate filter's maximum punctuation: what this replica acknowledges."""
        core = getattr(self, "core", None)
        if core is None or core.filters is None:
            return []
        return [int(f.max_punct) for f in core.filters]

    def gc_report(self) -> dict:
        """What the coordinator's utility period needs: duplicate-filter weights per input port and
        channel (cumulative, §V-B), tuples flushed per output stream since this actor started (and
        ``age_s``, seconds since then, or since the run started if later), input delay, retention,
        and per input port the punctuation it acknowledges (``acks``)."""
        return {"label": self.label, "weights": self._weights(), "delay_s": self._delay(),
                "age_s": time.time() - max(self.created, self.t0),
                "busy_s": self.busy_s, "work_s": self.busy_s + self.slow_s,
                "emitted": {n: ob.emitted for n, ob in self.outboxes.items()},
                "min_ack": {n: ob.min_ack() for n, ob in self.outboxes.items()},
                "acks": self._acks(),
                "retained": {n: ob.log.tuples for n, ob in self.outboxes.items()}}

    def _delay(self) -> float:
        return 0.0

    def set_network(self, network) -> bool:
        """Replace the emulated network view (failure injection at run time)."""
        self.network = network
        for ob in self.outboxes.values():
            ob.set_network(network)
        return True

    def set_start(self, t0: float) -> bool:
        """The run's start (wall time): the origin of emulated-network and scenario time."""
        self.t0 = t0
        for ob in self.outboxes.values():
            ob.t0 = t0
        return True

    def drop_link(self, label: str, reason: str = "receiver killed") -> bool:
        for ob in self.outboxes.values():
            ob.drop(label, reason)
        return True

    def _slowdown(self, started: float) -> None:
        """Emulate a slowed server: stretch processing time by the server's factor."""
        net = self.network
        if net is None or not hasattr(net, "slowdown"):
            return
        factor = net.slowdown(self.server, time.time() - self.t0)
        if factor > 1.0:
            stretch = (time.time() - started) * (factor - 1.0) + 0.0005 * (factor - 1.0)
            self.slow_s += stretch
            time.sleep(stretch)

    def ping(self) -> str:
        return self.label

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def idle(self) -> bool:
        return all(ob.idle() for ob in self.outboxes.values())

    def dead_letters(self) -> list:
        """Every tuple this replica set aside, with where and why (its core's; an entry replica's own
        method gives its entry points')."""
        core = getattr(self, "core", None)
        if core is None:
            staged = getattr(self, "staged", None)  # a staged transfer: what its received parts hold
            if staged is None:
                return []
            with self.staged_lock:
                return staged.dead_letters() if self.staged is staged else self.core.dead_letters()
        with self.lock:
            return core.dead_letters()

    def _guard(self, core, port: int, channel: int, item):
        """``item`` without the tuples at or below the punctuation its own stream replica already
        delivered on ``channel``: inside a deployment every sender is a replica of the system (an
        entry point's disorder is set aside at the entry point), so such a tuple is a broken
        contract of the sender, never late data. It is reported to the coordinator (receiver,
        port, channel, timestamp, punctuation), which declares the sender failed while another
        replica covers its node and ends the run naming sender, receiver and logical time
        otherwise (docs/reliability.md); it is neither processed nor dead-lettered here."""
        if isinstance(item, (Punctuation, Marker)) or core is None or core.filters is None or not len(item):
            return item
        cp = core.filters[port].chan_punct[channel]
        if cp == NO_ACK:
            return item
        broken = item[TS] <= cp
        if not broken.any():
            return item
        rec = {"receiver": self.label, "port": int(port), "channel": int(channel), "rows": int(broken.sum()),
               "ts": int(item[TS][broken].min()), "punctuation": int(cp), "t": time.time() - self.t0}
        self.broken_contracts = getattr(self, "broken_contracts", 0) + rec["rows"]
        self._report("broken_contract", rec)
        return item[~broken]

    def _sender_failed(self, error: BaseException) -> None:
        """The sender thread raised (a bug): some link may lack a packet, so this replica can no
        longer be trusted to deliver its streams. Reported to the coordinator as a replica to
        declare failed (its peers carry the streams; repaired with ``repair=True``)."""
        import traceback as tb

        rec = {"replica": self.label, "reason": f"its sender thread raised {type(error).__name__}: {error}",
               "traceback": "".join(tb.format_exception(error)), "t": time.time() - self.t0}
        self._report("declare_failed", rec)

    def _fatal(self, operator: str, logical_time, error: BaseException) -> None:
        """This replica's own code raised (a user function with ``on_error="fail"``, a wrong result, a
        bug): the run cannot complete exactly. Reported to the coordinator, which the driver reads
        while it waits (``Deployment.wait`` raises it at once); the caller re-raises, so the sender
        sees a ``RayTaskError``, which is not the death of this actor (:func:`.common.is_actor_death`)."""
        rec = failure_record(self.label, operator, None if logical_time is None else int(logical_time), error)
        rec["t"] = time.time() - self.t0
        self.failure = rec
        self._report("fatal", rec)

    def _common_stats(self) -> dict:
        return {
            "label": self.label,
            "server": self.server,
            "pid": os.getpid(),
            "cpu_seconds": _cpu_seconds() - self.cpu0,
            "links": [s for ob in self.outboxes.values() for s in ob.stats()],
            "pushes": self.pushes,
            "busy_seconds": self.busy_s,
            "blocked_seconds": sum(ob.blocked_s for ob in self.outboxes.values()),
            "last_push_s": self.last_push,
            "dropped": list(self.dropped),
            "retained_tuples": {n: ob.log.tuples for n, ob in self.outboxes.items()},
            "first_output_wall": min((ob.first_emit for ob in self.outboxes.values() if ob.first_emit is not None),
                                     default=None),
            "gc": self.gc_watch.stats(),
        }


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, concurrency_groups={"probe": 1, "transfer": 4})
class ReplicaActor(_Base, MovingBins):
    """One replica of one operator: duplicate filters, optional sorters, the operator logic.

    Started with ``pending=True`` (a revived or new replica, Hwang §V-C), it
    buffers its input until :meth:`install` gives it a checkpoint from a live
    peer (docs/design.md, decision 7) or a fresh state; its acknowledgements stay
    at "nothing" meanwhile, so its upstream replicas keep everything it may need.
    """

    def __init__(self, query, node: str, index: int, server: str, channels: list[int], network, t0: float,
                 channel_opts: dict, coordinator=None, strict: bool = False, pending: bool = False,
                 partition: int | None = None, groups: list | None = None):
        group = node if partition is None else partition_label(node, partition)
        self._setup(f"{group}#{index}", server, network, t0, channel_opts, coordinator)
        #: the partition this replica is of (None: its operator is not partitioned), and per input
        #: port the upstream partition of each channel (None: the upstream is not partitioned)
        self.partition = partition
        self.groups = None if groups is None else [None if g is None else list(g) for g in groups]
        self.dormant_every: float | None = None  # keep_dormant(): checkpoints to the coordinator
        self._dormant_last, self._dormant_ref = 0.0, None
        self.node = node
        self.query = query
        self.strict = strict
        self.n_ports = len(channels)
        self.channels = list(channels)
        self.core = None if pending else ReplicaCore(query, node, channels, strict, groups=self.groups)
        self.buffered: list[tuple[int, int, list]] = []  # (port, channel, packet) while pending
        self.installed: dict | None = None  # what install() put in place
        # staged transfer (Megaphone §3.3, engines/ray/transfer.py): as receiver, the StagedReplica
        # and the steps it installed; as sender, the steps asked for, taken at our next punctuation
        self.staged = None
        self.steps_installed: dict[int, float] = {}
        self.step_requests: dict[str, dict] = {}  # per receiver: the steps it asked for, and their pacing
        self.steps_taken: list[dict] = []
        self.steps_sent: set[tuple[str, int]] = set()  # (receiver, step) already taken: a re-request is ignored
        self.out = self._outbox(node)
        self.closed_partition = False  # its partition retired (moving.py close_partition): input ignored
        self.lock = lockorder.lock("ReplicaActor.lock", 1)
        # a receiver's installed steps changed (install_step and transfer_status wait on it)
        self.installed_cv = lockorder.condition(self.lock)
        self.last_punct_wall = 0.0  # when this replica last emitted a punctuation (a sender's pacing)
        metrics_export.start(self, node)  # Ray metrics of its counters, every few seconds (metrics_export.py)

    def push(self, port: int, channel: int, packet: list, epoch: str | None = None, sender: str | None = None) -> int:
        """Take ``packet`` on input ``port``, duplicate-filter channel ``channel``, from ``sender`` of
        deployment ``epoch`` (another deployment's packet is rejected, :meth:`_stale`); returns the
        acknowledgement (the filter's maximum punctuation on ``port``)."""
        if self.quiet:
            return NO_ACK
        if epoch != self.epoch:
            return self._stale(port, channel, epoch, sender)
        if self.closed_partition:  # (its partition retired: what still comes is late everywhere)
            return self.core.filters[port].max_punct
        started = time.time()
        self._observe(port, packet)
        if self.core is None and self.staged is not None:
            return self._push_staged(port, channel, packet)
        if self.core is None:
            self.buffered.append((port, channel, packet))
            self.last_push = time.time() - self.t0
            return NO_ACK
        with self._data_call(started), self.lock:
            before = self.core.logic.watermark
            out = self._process(port, channel, packet)
            self.busy_s += time.time() - started
            self._punct_times(started, before, self.core.logic.watermark, out)
            self._emit(self.out, out)  # queued under the lock: a checkpoint sees it in the log
            if self.core.moves is not None and self.core.moves.shipped:
                self._ship_moves()  # a rescale's step given at this punctuation (moving.py)
            if self.step_requests and any(isinstance(it, Punctuation) for it in out):
                self.last_punct_wall = time.time()
                self._take_steps()  # a transfer step at this logical time (our punctuation)
            if self.dormant_every is not None and any(isinstance(it, Punctuation) for it in out):
                self._send_dormant()
        self.out.wait_for_room()
        self._slowdown(started)
        self.pushes += 1
        self.last_push = time.time() - self.t0
        return self.core.filters[port].max_punct

    def _process(self, port: int, channel: int, packet: list) -> list:
        out: list = []
        try:
            for item in packet:
                out.extend(self.core.process(port, channel, self._guard(self.core, port, channel, item)))
        except Exception as e:  # reported as the run's failure, then raised to the sender
            self._fatal(self.node, self.core.logic.watermark, e)
            raise
        return out

    def _reusable(self) -> bool:
        return (self.failure is None and self.core is not None and self.staged is None and not self.buffered
                and not self.steps_installed and not self.step_requests and not self.steps_taken)

    def add_channel(self, port: int, group: int | None = None) -> int:
        """A new upstream replica will feed ``port`` (from upstream partition ``group`` when the
        upstream is partitioned): returns its channel index."""
        with self.lock:
            if self.core is None and self.staged is not None:
                with self.staged_lock:
                    self.channels[port] += 1
                    self._add_group(port, group)
                    return self.staged.add_channel(port, group)
            if self.core is None:
                self.channels[port] += 1
                self._add_group(port, group)
                return self.channels[port] - 1
            self._add_group(port, group)
            return self.core.add_channel(port, group)

    def _add_group(self, port: int, group: int | None) -> None:
        if self.groups is not None and self.groups[port] is not None:
            if group is None:
                raise ValueError(f"{self.label}: a new channel on port {port} needs its upstream partition")
            self.groups[port].append(int(group))

    def checkpoint(self):
        """This replica's hand-over checkpoint (docs/design.md, decision 7): its core's state, and as
        ``output`` what its outbox retains (flushed first), so the taker can replay it downstream."""
        if self.core is None:
            raise RuntimeError(f"{self.label} is waiting for its own checkpoint; it cannot give one")
        with self.lock:
            return self._checkpoint_locked()

    def _checkpoint_locked(self):
        self.out.flush()
        ck = self.core.checkpoint()
        return dataclasses.replace(ck, output=self.out.retained(), output_acked=self.out.min_ack())

    def keep_dormant(self, every_s: float | None) -> bool:
        """Send the coordinator a dormant checkpoint every ``every_s`` seconds, at a punctuation
        (None: stop): this replica is its operator's (its partition's) last live one (Rhino's dormant
        replica, Del Monte 2017); the coordinator keeps it under the operator's name, or the
        partition's (``"op.P"``). Its upstream replicas keep their output after the checkpoint's
        punctuation."""
        self.dormant_every = None if every_s is None else float(every_s)
        self._dormant_last = 0.0
        return True

    def _send_dormant(self) -> None:
        """Under ``lock``: a checkpoint to the coordinator if ``dormant_every`` has passed and the
        previous one arrived; its punctuation is the smallest of the input filters' (what the
        checkpoint holds on every input)."""
        now = time.time()
        if now - self._dormant_last < self.dormant_every or self.coordinator is None:
            return
        if self._dormant_ref is not None and not ray.wait([self._dormant_ref], timeout=0)[0]:
            return  # the previous one is still on its way
        if self.core.moves is not None and not self.core.moves.idle:
            return  # bins moving (a rescale): a checkpoint carries no moves; the next one, once done
        p = min(int(f.max_punct) for f in self.core.filters)
        if p == NO_ACK:
            return
        self._dormant_last = now
        # kept per partition ("op.P") for a partitioned operator: each partition holds its own bins
        group = self.node if self.partition is None else partition_label(self.node, self.partition)
        self._dormant_ref = self.coordinator.keep_dormant.remote(group, self.label, p, self._checkpoint_locked())
        self._reports.append(self._dormant_ref)

    def install(self, checkpoint=None) -> dict:
        """Leave pending mode: build the core from ``checkpoint`` (a peer's, or None for a fresh
        state), then process the input buffered meanwhile. Returns what was installed."""
        if self.core is not None:
            raise RuntimeError(f"{self.label} already runs; install() is for a replica started pending")
        started = time.time()
        with self.lock:
            if checkpoint is None:
                self.core = ReplicaCore(self.query, self.node, self.channels, self.strict, groups=self.groups)
                info = {"checkpoint": None}
            else:
                self.core = ReplicaCore.from_checkpoint(self.query, checkpoint, self.channels, self.strict, retain=False,
                                                        groups=self.groups)
                info = {"checkpoint": checkpoint.summary()}
                if checkpoint.output:
                    # the peer's retained output becomes ours: links added later replay it
                    self.out.adopt(checkpoint.output)
            out: list = []
            for port, channel, packet in self.buffered:
                out.extend(self._process(port, channel, packet))
            info["buffered_packets"] = len(self.buffered)
            self.buffered = []
            self.out.emit(out, wait=False)
        gcpause.settle()  # the installed state out of later collections
        self.busy_s += time.time() - started
        info["seconds"] = time.time() - started
        self.installed = info
        return info

    # -- staged transfer (Megaphone §3.3; docs/migration.md) ----------------------------------
    def begin_transfer(self, bits: int) -> dict:
        """Receiver: leave plain pending mode for a staged transfer of ``2**bits`` bins; the input
        buffered so far goes through the :class:`~replistream.replica.StagedReplica` (held back
        until the step with its bins arrives).

        The receiver's work (routing input to partial cores, installing steps, merging) runs in
        a worker thread: ``push`` and ``install_step`` only queue, so upstream replicas are never
        held back (backpressure) by a receiver busy installing a large step."""
        if self.core is not None or self.staged is not None:
            raise RuntimeError(f"{self.label} is not waiting for a checkpoint")
        with self.lock:
            self.staged = StagedReplica(self.query, self.node, self.channels, bits, self.strict, groups=self.groups)
            self.staged_lock = lockorder.lock("ReplicaActor.staged_lock", 2)
            self.started_transfer = time.time()
            self.inbox = deque(("push", p, c, pk) for p, c, pk in self.buffered)
            self.inbox_cv = lockorder.condition(self.lock)
            self.steps_queued: set[int] = set()
            n = len(self.buffered)
            self.buffered = []
            threading.Thread(target=self._staged_loop, daemon=True, name="replistream-transfer").start()
        return {"buffered_packets": n}

    def _push_staged(self, port: int, channel: int, packet: list) -> int:
        with self.lock:
            staged = self.staged is not None
            if staged:
                self.inbox.append(("push", port, channel, packet))
                self.inbox_cv.notify()
        if not staged:  # completed meanwhile (the packet's epoch was checked already: this deployment's)
            return self.push(port, channel, packet, self.epoch)
        self.pushes += 1
        self.last_push = time.time() - self.t0
        return NO_ACK

    @ray.method(concurrency_group="transfer")  # apart from the data path: it waits for the worker
    def install_step(self, checkpoint, bins, steps, wait_s: float = 30.0) -> dict:
        """Receiver: queue a checkpoint (a peer's, restricted to ``bins``) carrying step(s) ``steps``
        (an index or a list of the indices a peer took at one punctuation) for the worker; steps or
        bins already installed are ignored (a step re-sent after its first sender died).

        Returns once the worker has installed them (or the transfer completed, or ``wait_s``
        passed) with :meth:`transfer_status`: the sender waits for this answer before it takes its
        next step, so steps go at the pace the receiver installs them (its queued input goes
        through before the step) and never pile up in its queue. It runs on a thread of its own
        (the ``transfer`` concurrency group), so pushes are never held up behind it.

        >>> ray.get(new.install_step.remote(ck, [0, 1], [0]))["installed"]   # doctest: +SKIP
        {0: 31.52}
        """
        steps = [int(steps)] if np.isscalar(steps) else [int(x) for x in steps]
        with self.lock:
            if self.staged is not None and not set(steps) <= self.steps_queued:
                self.steps_queued.update(steps)
                self.inbox.append(("step", checkpoint, bins, steps))
                self.inbox_cv.notify_all()
            deadline = time.time() + float(wait_s)
            while self.staged is not None and not all(i in self.steps_installed for i in steps):
                left = deadline - time.time()
                if left <= 0:
                    break
                self.installed_cv.wait(left)
            return self._status_locked()

    def _staged_run(self, items, out: list) -> list[tuple[int, float]]:
        """Apply queued input and steps to the StagedReplica (under staged_lock, never taking
        ``lock``: the lock order is ``lock`` then ``staged_lock``); outputs of a completed one
        (its merged core) go to ``out``. Returns ``(step, seconds since t0)`` of the steps
        installed, for the caller to publish under ``lock`` once ``staged_lock`` is released."""
        staged = self.staged
        installed = []
        for it in items:
            if it[0] == "push":
                for item in it[3]:
                    out.extend(staged.process(it[1], it[2], item))
            elif not staged.complete:
                staged.install_step(it[1], it[2])
                installed.extend((step, time.time() - self.t0) for step in it[3])
        return installed

    def _staged_loop(self) -> None:
        try:  # background work: the replicas serving the application (the sender) get the CPU first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while True:
            with self.lock:
                while not self.inbox and self.staged is not None:
                    self.inbox_cv.wait(0.5)
                if self.staged is None:
                    return
                items = list(self.inbox)
                self.inbox.clear()
            started = time.time()
            out: list = []
            with self.staged_lock:
                installed = self._staged_run(items, out)
                complete = self.staged.complete
                info = self.staged.stats()
            with self.lock:
                self.transfer_info = info
                self.steps_installed.update(installed)
                self.installed_cv.notify_all()
            if complete:
                with self.lock:
                    with self.staged_lock:
                        rest = list(self.inbox)
                        self.inbox.clear()
                        self.steps_installed.update(self._staged_run(rest, out))
                        tail = self._complete_transfer()
                    # after the adopted log (links replay it first), and before the punctuation at
                    # the core's watermark now: ``out`` holds what the core emitted since it
                    # completed, below that watermark (a punctuation before them would make them late)
                    self._emit(self.out, out + tail)
                    self.installed_cv.notify_all()
            self.busy_s += time.time() - started
            if complete:
                return

    def _complete_transfer(self) -> list:
        """Adopt the completed transfer's log; returns its closing punctuation, which the caller
        emits after what the core output since it completed."""
        staged = self.staged
        items, acked = staged.final_output()
        tail = [items.pop()] if items and isinstance(items[-1], Punctuation) else []
        self.core = staged.core
        self.staged = None
        # the peers' retained output and ours become our log: links added later replay it
        self.out.adopt(items)
        self.installed = {"checkpoint": "staged", **staged.stats(),
                          "seconds": time.time() - getattr(self, "started_transfer", time.time())}
        return tail

    @ray.method(concurrency_group="transfer")  # apart from the data path: it may wait
    def transfer_status(self, wait_s: float = 0.0, seen: int | None = None) -> dict:
        """Receiver: steps installed (step -> seconds since t0), bins missing, input queued for the
        worker (``inbox``), complete. Reads what the worker last published, so it never waits for
        a step being installed or merged. With ``seen`` (the number of steps the caller knows
        installed) it waits up to ``wait_s`` for more, or for completion (the coordinator's
        long poll: no call per few milliseconds).

        >>> ray.get(new.transfer_status.remote(wait_s=0.5, seen=3))["complete"]   # doctest: +SKIP
        False
        """
        deadline = time.time() + float(wait_s)
        with self.lock:
            while seen is not None and self.core is None and len(self.steps_installed) <= int(seen):
                left = deadline - time.time()
                if left <= 0:
                    break
                self.installed_cv.wait(left)
            return self._status_locked()

    def _status_locked(self) -> dict:
        if self.core is not None:
            return {"installed": dict(self.steps_installed), "complete": True, "inbox": 0,
                    **dict(self.installed or {})}
        return {"installed": dict(self.steps_installed), "complete": False,
                "inbox": len(getattr(self, "inbox", ())), **dict(getattr(self, "transfer_info", {}))}

    #: seconds of a sender's output lag samples its pacing takes the baseline (their minimum) over
    LAG_WINDOW_S = 2.0

    def request_steps(self, receiver, steps, bits: int, pause_s: float = 0.02, gate=None,
                      lag_s: float | None = None, max_defer_s: float = 0.25) -> int:
        """Sender: take ``steps`` (``[(index, bins), ...]`` at ``2**bits`` bins, in order, or
        :func:`~replistream.replica.transfer.pack_steps` of them: the form to send) at this
        replica's next punctuations and send each to ``receiver.install_step``; returns at once
        (this replica keeps processing). Returns the number of steps queued; steps already taken
        for this receiver are ignored. At a punctuation (Megaphone §3.3: a step at a logical time)
        the next step is taken unless the pacing defers it (:meth:`_defer`, reasons counted in
        :meth:`transfer_report`):

        * ``gate`` (one connect mark per input port, or None): no step before this replica's
          duplicate filter has passed the mark on every port (the receiver's upstream links were
          added without replay: they deliver every tuple above the mark, and the steps must cover
          the rest; :mod:`replistream.engines.ray.transfer`);
        * the receiver has not installed the previous message yet (its ``install_step`` has not
          answered): at most one message in flight, so the receiver's backlog never builds up;
        * the live path is slow: this replica's output lag (wall time minus the due time of the
          punctuation it just emitted, on the feeder's clock) exceeds its minimum over the last
          :attr:`LAG_WINDOW_S` s by more than ``lag_s`` (default ``max(pause_s, 0.01)``), or an
          output link has more than half its ``max_inflight`` packets unacknowledged. These two
          never hold a step back longer than ``max_defer_s`` after the previous message.

        A step taken goes with as many following steps as keep the pause within ``pause_s``
        beyond the fixed cost of a step (0: one step per punctuation), as one checkpoint.

        >>> peer.request_steps.remote(new_replica, [(0, [0, 1]), (1, [2, 3])], 2, gate=[1040000])  # doctest: +SKIP
        """
        if self.core is None:
            raise RuntimeError(f"{self.label} has no state to send (it is waiting for its own)")
        given = unpack_steps(steps)  # (before the lock: the data path goes on meanwhile)
        with self.lock:
            rkey = repr(receiver)
            fresh = [(i, b) for i, b in given if (rkey, i) not in self.steps_sent]
            if not fresh:
                return 0
            now = time.time()
            plan = self.step_requests.setdefault(rkey, {
                "receiver": receiver, "bits": int(bits), "steps": {}, "room": 1, "fixed_s": None, "mark": 0,
                "asked": now, "requested": now, "ack": None, "last_sent": now, "lags": deque(),
                "deferred": {"gate": 0, "receiver": 0, "lag": 0, "output": 0}, "lag_max": None,
                "gate_s": None})
            plan["steps"].update(fresh)
            plan["pause_s"] = float(pause_s)
            plan["lag_s"] = max(float(pause_s), 0.01) if lag_s is None else float(lag_s)
            plan["max_defer_s"] = float(max_defer_s)
            plan["gate"] = None if gate is None else [int(c) for c in gate]
            if self.core.logic.watermark == END:
                self._take_steps(everything=True)
        return len(fresh)

    def take_steps_now(self) -> int:
        """Sender: take the next requested step(s) now, as at a punctuation, if none came for 0.25 s
        (the input paused; while punctuations come, the pacing decides), or all of them once the
        stream has ended. The gate and the receiver's answer still hold it back; the live path's
        lag does not (it grows while the input pauses). Returns the number of steps taken.

        >>> ray.get(peer.take_steps_now.remote())   # doctest: +SKIP
        1
        """
        with self.lock:
            if self.core is None:
                return 0
            if self.core.logic.watermark == END:
                return self._take_steps(everything=True)
            if time.time() - self.last_punct_wall < 0.25:
                return 0
            return self._take_steps(forced=True)

    def _output_lag(self, now: float) -> float | None:
        """Seconds this replica's watermark lags behind the feeder's clock (None unpaced or at the
        ends): its own output latency, the live path's load as this replica sees it."""
        wm = self.core.logic.watermark
        if self.pace is None or self.ts0 is None or wm == END or wm == NO_ACK:
            return None
        return now - (self.t0 + (wm - self.ts0) / (1e6 * self.pace))

    def _defer(self, plan: dict, forced: bool) -> str | None:
        """Why the next step for ``plan``'s receiver waits (None: take it now); see :meth:`request_steps`."""
        now = time.time()
        lag = None if forced else self._output_lag(now)
        if lag is not None:
            lags = plan["lags"]
            lags.append((now, lag))
            while lags[0][0] < now - self.LAG_WINDOW_S:
                lags.popleft()
            plan["lag_max"] = lag if plan["lag_max"] is None else max(plan["lag_max"], lag)
        if plan["gate"] is not None:
            if any(int(f.max_punct) < c for f, c in zip(self.core.filters, plan["gate"])):
                return "gate"
            plan["gate"], plan["gate_s"], plan["last_sent"] = None, now - plan["requested"], now
        if plan["ack"] is not None:
            if not ray.wait([plan["ack"]], timeout=0)[0]:
                return "receiver"
            plan["ack"] = None
        if forced or now - plan["last_sent"] >= plan["max_defer_s"]:
            return None
        if lag is not None and lag > min(x for _, x in plan["lags"]) + plan["lag_s"]:
            return "lag"
        with self.out.lock:
            if any(len(l.queue) + len(l.inflight) > self.out.max_inflight // 2 for l in self.out.links if l.alive):
                return "output"
        return None

    def _take_steps(self, everything: bool = False, forced: bool = False) -> int:
        """Take requested steps now (under the lock, between two deliveries): per receiver, unless
        the pacing defers it (:meth:`_defer`; not with ``everything``), the next step, and more
        while the estimated pause stays within its budget (all with ``everything``); they go as
        one checkpoint with the retained output appended since the last one sent to that
        receiver. Returns the number of steps taken."""
        taken_n = 0
        for rkey in list(self.step_requests):
            plan = self.step_requests[rkey]
            if not everything:
                why = self._defer(plan, forced)
                if why is not None:
                    plan["deferred"][why] += 1
                    continue
            order = sorted(plan["steps"])
            if everything:
                chosen = order
            else:
                chosen, nbins = [order[0]], len(plan["steps"][order[0]])
                for i in order[1:]:
                    if nbins + len(plan["steps"][i]) > plan["room"]:
                        break
                    chosen.append(i)
                    nbins += len(plan["steps"][i])
            bins = np.concatenate([plan["steps"].pop(i) for i in chosen])
            t = time.time()
            self.out.flush()
            ck = self.core.checkpoint(plan["bits"], bins)
            output, plan["mark"] = self.out.retained_since(plan["mark"])
            ck = dataclasses.replace(ck, output=output, output_acked=self.out.min_ack())
            taken = time.time()
            plan["ack"] = plan["receiver"].install_step.remote(ck, bins, chosen)
            for i in chosen:
                self.steps_sent.add((rkey, i))
            if plan["pause_s"] > 0:
                # the group's size follows its cost (taking it and handing it to Ray, which
                # serialises it now): the pause beyond the fixed cost of any step (the smallest
                # seen: hashing the state, the filters, the log) stays within pause_s
                cost = time.time() - t
                plan["fixed_s"] = cost if plan["fixed_s"] is None else min(plan["fixed_s"], cost)
                limit = plan["pause_s"] + plan["fixed_s"]
                if cost < limit / 2:
                    plan["room"] = max(plan["room"], 2 * len(bins))
                elif cost > limit:
                    plan["room"] = max(1, len(bins) // 2)
            lags = plan["lags"]
            self.steps_taken.append({"step": chosen[0], "steps": len(chosen), "bins": len(bins),
                                     "waited_s": t - plan["asked"], "checkpoint_s": taken - t,
                                     "send_s": time.time() - taken, "rows": ck.logic.rows(),
                                     "bytes": ck.nbytes(), "watermark": int(self.core.logic.watermark),
                                     "deferred": dict(plan["deferred"]), "forced": forced,
                                     "gate_s": plan["gate_s"],
                                     "lag_s": lags[-1][1] if lags else None,
                                     "lag_base_s": min(x for _, x in lags) if lags else None,
                                     "lag_max_s": plan["lag_max"], "receiver": rkey})
            plan["deferred"] = dict.fromkeys(plan["deferred"], 0)
            plan["asked"] = plan["last_sent"] = time.time()
            taken_n += len(chosen)
            if not plan["steps"]:
                del self.step_requests[rkey]
        return taken_n

    def transfer_pacing(self, receiver) -> dict | None:
        """Sender: where the steps for ``receiver`` stand (None once all were taken, or none were
        asked): the gate still closed (its marks) or None, this replica's filter punctuation per
        port, steps left, punctuations deferred since the last message by reason.

        >>> ray.get(peer.transfer_pacing.remote(new_replica))["gate"]   # doctest: +SKIP
        [1040000, 1020000]
        """
        with self.lock:
            plan = self.step_requests.get(repr(receiver))
            if plan is None or self.core is None:
                return None
            return {"gate": plan["gate"], "punct": [int(f.max_punct) for f in self.core.filters],
                    "left": len(plan["steps"]), "deferred": dict(plan["deferred"])}

    def transfer_report(self) -> list[dict]:
        """Sender: one record per message it sent (steps, bins, wait for its punctuation, checkpoint
        and send times, bytes; its pacing: ``deferred`` punctuations since the previous message by
        reason, ``gate_s`` from the request to the gate passing, the output lag seen).

        >>> ray.get(peer.transfer_report.remote())[0]["deferred"]   # doctest: +SKIP
        {'gate': 2, 'receiver': 0, 'lag': 0, 'output': 0}
        """
        with self.lock:
            return list(self.steps_taken)

    def _delay(self) -> float:
        return self.input_delay(self.n_ports)

    def _pending(self) -> bool:
        """Still waiting for its state: started pending (before ``install``) or receiving a staged
        transfer. The failure detector never counts it as a peer that progresses."""
        return getattr(self, "core", None) is None

    def _untouched(self) -> bool:
        """No input pushed, buffered or staged, no state installed: a warm spare never used
        (:meth:`_Base._untouched`).

        >>> spare._untouched()   # doctest: +SKIP
        True
        """
        return (self.pushes == 0 and not getattr(self, "buffered", None) and getattr(self, "installed", None) is None
                and getattr(self, "staged", None) is None and not getattr(self, "step_requests", None))

    def stats(self) -> dict:
        s = self._common_stats()
        with self.lock:
            if self.core is None:
                s.update({"node": self.node, "pending": True, "buffered_packets": len(self.buffered)})
                return s
            s.update({"node": self.node, "core": self.core.stats(), "watermark": self.core.logic.watermark,
                      "dead_letters": sum(d.count for d in self.core.dead_letters()),
                      "installed": self.installed})
        return s


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, concurrency_groups={"probe": 1, "peer": 1})
class EntryActor(_Base):
    """One replica of the entry points of a group of sources (Hwang §II-B).

    Every entry replica receives every input chunk (the feeder fans chunks
    out to all live replicas, so each input tuple is held at k entry points),
    runs the same :class:`EntryLogic` (same ids, same punctuations), and keeps
    what it emitted until every live downstream replica has acknowledged a
    punctuation covering it (its outboxes' retention logs), so it can replay
    to a new or revived replica.

    With entry partitions (``parallelism={"entry": p}``, issue #41) a replica belongs to one
    partition (``entry.P#R``): the feeder sends it only that partition's chunks of each source,
    each with the state an unpartitioned entry point would be in before it
    (:class:`~replistream.operators.entry.EntryStart`), and progress notes (punctuations);
    its chunk numbers, held input and peers are its partition's.

    Entry points hold their input for their peers (Hwang §III): each replica keeps
    the raw chunks from ``keep_from`` on (the feeder names the first chunk some
    peer missed; with none missing, only the last chunk), and answers a peer's
    :meth:`input_chunks` on a thread of its own. A replica the feeder stopped
    sending to (it stopped answering for a while, then answered again) takes what
    it missed from a peer (:meth:`catch_up`) before its next chunk.
    """

    #: Seconds a replica waits for one peer's answer when it catches up (then it asks the next).
    PEER_TIMEOUT_S = 10.0
    #: How long a peer asked for chunks it has not taken yet waits for them (:meth:`input_chunks`).
    PEER_WAIT_S = 5.0

    def __init__(self, query, index: int, server: str, network, t0: float, channel_opts: dict,
                 coordinator=None, strict: bool = False, on_malformed: str = "dead_letter",
                 partition: int | None = None):
        sources = query.sources
        self.partition = partition  # its entry partition (None: the entry points are not partitioned)
        self._setup(f"entry#{index}" if partition is None else f"entry.{int(partition)}#{index}", server, network,
                    t0, channel_opts, coordinator)
        self.query = query  # (a link to a partitioned operator routes by its key: _link)
        self.index = index
        self.entries = {name: query.build_entry(name, strict, on_malformed) for name in sources}
        self.expected = {name: 0 for name in sources}
        for name in sources:
            self._outbox(name)
        self.lock = lockorder.lock("EntryActor.lock", 1)
        self.input_log: dict[str, dict[int, Any]] = {name: {} for name in sources}  # seq -> (raw chunk, start)
        self.log_lock = lockorder.lock("EntryActor.log_lock", 2)
        self.log_grew = lockorder.condition(self.log_lock)  # a chunk was logged (input_chunks waits on it)
        self.recovered = 0  # chunks taken from a peer
        metrics_export.start(self, "entry")  # Ray metrics of its counters, every few seconds (metrics_export.py)

    def push_chunk(self, source: str, seq: int, chunk: Any, keep_from: int | None = None, start=None) -> int:
        """Take input chunk ``seq`` of ``source`` (duplicates and replays are ignored); keep the
        raw chunks from ``keep_from`` on for peers that missed them (None: only this one).
        ``start``: with entry partitions, the :class:`~replistream.operators.entry.EntryStart` the
        unpartitioned entry point would have before the chunk (the feeder's)."""
        if self.quiet:
            return -1
        started = time.time()
        with self._data_call(started):
            return self._push_chunk(source, seq, chunk, started, keep_from, start)

    def _push_chunk(self, source: str, seq: int, chunk: Any, started: float, keep_from: int | None,
                    start=None) -> int:
        with self.lock:
            if seq < self.expected[source]:
                return self.expected[source]
            if seq > self.expected[source]:
                raise RuntimeError(f"{self.label}: chunk {seq} of {source!r} arrived before chunk "
                                   f"{self.expected[source]}, and nobody asked it to catch up from a peer")
            self._take(source, seq, chunk, start)
            self._log_input(source, seq, (chunk, start), seq if keep_from is None else keep_from)
        self.call_started = None  # waiting on downstream replicas is not this replica's silence
        self.outboxes[source].wait_for_room()
        self._slowdown(started)
        return self.expected[source]

    def _take(self, source: str, seq: int, chunk: Any, start=None) -> None:
        """Run chunk ``seq`` of ``source`` (from position ``start``, with entry partitions) through the
        entry logic and queue its output (under the lock)."""
        self.expected[source] = seq + 1
        entry = self.entries[source]
        if isinstance(chunk, Marker):  # a change to the running query (replistream.replica.changes)
            self._emit(self.outboxes[source], [chunk])
            return
        before = entry.punct
        try:
            items = entry.close() if chunk is None else entry.push(chunk, start=start)
        except Exception as e:  # a chunk the entry point refuses (on_malformed="raise"): the run's failure
            self._fatal(source, entry.punct, e)
            raise
        self._punct_times(self.call_started or time.time(), before, entry.punct, items)
        self.outboxes[source].emit(items, wait=False)

    def _log_input(self, source: str, seq: int, chunk: Any, keep_from: int) -> None:
        with self.log_lock:
            log = self.input_log[source]
            log[seq] = chunk
            for s in [s for s in log if s < keep_from]:
                del log[s]
            self.log_grew.notify_all()

    @ray.method(concurrency_group="peer")  # apart from the data path: a busy peer answers at once
    def input_chunks(self, source: str, lo: int, hi: int) -> list | None:
        """The raw chunks ``lo`` .. ``hi - 1`` of ``source`` this replica still holds, in order, each
        with its entry partition's start (None without entry partitions), or None if it no longer
        holds them all (Hwang §III: entry points hold input for their peers). Chunks it has not
        taken yet (still on their way to it) are waited for, at most :attr:`PEER_WAIT_S`.

        >>> ray.get(peer.input_chunks.remote("s", 3, 5))   # doctest: +SKIP
        [(array(...), None), (array(...), None)]
        """
        deadline = time.monotonic() + self.PEER_WAIT_S
        with self.log_lock:
            while True:
                log = self.input_log.get(source, {})
                if all(s in log for s in range(lo, hi)):
                    return [log[s] for s in range(lo, hi)]
                # chunks this replica has not taken yet may still be on their way to it (the feeder
                # asks a skipped peer to catch up right after sending them here): wait for those,
                # but one it took and no longer holds (trimmed) never comes back. ``expected`` is
                # raised before the chunk is logged, so only chunks below ``expected - 1`` are sure
                taken = self.expected.get(source, 0) - 1
                left = deadline - time.monotonic()
                if any(s not in log for s in range(lo, min(hi, taken))) or left <= 0:
                    return None
                self.log_grew.wait(left)  # woken by each chunk logged (_log_input)

    def catch_up(self, upto: dict, peers: list) -> dict:
        """Take every chunk this replica missed, up to ``upto`` (``{source: first chunk not missed}``),
        from the first of ``peers`` (other entry replicas) that holds them all, each asked with a
        deadline. Returns ``{source: chunks taken}``; raises ``RuntimeError`` naming the source and
        chunks when no peer holds them (this replica is then lost; its peers carry the input).

        >>> ray.get(entry.catch_up.remote({"s": 40}, [peer]))   # doctest: +SKIP
        {'s': 12}
        """
        taken = {}
        started = time.time()
        with self._data_call(started):
            for source, hi in upto.items():
                lo = self.expected[source]
                if hi <= lo:
                    continue
                chunks = self._from_peers(source, lo, hi, peers)
                with self.lock:
                    for i, (chunk, start) in enumerate(chunks):
                        seq = lo + i
                        if seq < self.expected[source]:
                            continue
                        self._take(source, seq, chunk, start)
                        self._log_input(source, seq, (chunk, start), seq)
                self.recovered += len(chunks)
                taken[source] = len(chunks)
                self.call_started = None
                self.outboxes[source].wait_for_room()
        return taken

    def _from_peers(self, source: str, lo: int, hi: int, peers: list) -> list:
        why = []
        for peer in peers:
            try:
                got = ray.get(peer.input_chunks.remote(source, lo, hi), timeout=self.PEER_TIMEOUT_S)
            except Exception as e:  # a dead or silent peer: ask the next (the reason is kept for the error)
                why.append(f"{type(e).__name__}")
                continue
            if got is not None:
                return got
            why.append("no longer held")
        raise RuntimeError(f"{self.label}: chunks {lo}..{hi - 1} of {source!r} are held by no live peer entry "
                           f"point ({', '.join(why) or 'no peer'}): this replica cannot catch up")

    @ray.method(concurrency_group="peer")  # apart from the data path: a busy replica answers between chunks
    def entry_position(self) -> dict:
        """Where this replica stands per source: ``{source: {"expected": next chunk, "rows": records
        taken (the entry point's id counter), "closed": its end taken}}``; a control plane that was
        restored resumes the feed from the furthest replica's (:mod:`.lifecycle`). An entry
        partition's also says which ranges of records it took (``"taken"``, the last
        :data:`~replistream.operators.entry.TAKEN_KEPT`), whether those are all (``"complete"``) and
        the highest punctuation it passed on (``"punct"``).

        >>> ray.get(entry.entry_position.remote())["s"]   # doctest: +SKIP
        {'expected': 12, 'rows': 110000, 'closed': False}
        """
        from ...operators.entry import TAKEN_KEPT

        with self.lock:
            out = {src: {"expected": int(self.expected[src]), "rows": int(e.seq), "closed": bool(e.closed)}
                   for src, e in self.entries.items()}
            if self.partition is not None:
                for src, e in self.entries.items():
                    taken = list(getattr(e, "taken", ()))
                    out[src].update(taken=taken, complete=len(taken) < TAKEN_KEPT, punct=int(e.position().punct))
            return out

    def entry_checkpoint(self) -> dict:
        """What a new entry replica needs to take this one's place (a repair, Hwang §III: entry
        points hold their input for their peers): every source's entry logic (its id counter,
        punctuation, disorder buffer, dead letters), the next chunk expected per source, and what
        each output stream retains (flushed first), for the new replica to replay downstream.

        >>> ck = ray.get(entry.entry_checkpoint.remote())   # doctest: +SKIP
        """
        import copy

        with self.lock:
            for ob in self.outboxes.values():
                ob.flush()
            return {"entries": copy.deepcopy(self.entries), "expected": dict(self.expected),
                    "output": {src: ob.retained() for src, ob in self.outboxes.items()}}

    def install_entry(self, ck: dict) -> dict:
        """Take a peer's :meth:`entry_checkpoint` (before any link or chunk reaches this replica)."""
        with self.lock:
            self.entries, self.expected = ck["entries"], dict(ck["expected"])
            for src, items in ck["output"].items():
                if items:
                    self._outbox(src).adopt(items)
        return {"expected": dict(self.expected), "retained": {s: len(v) for s, v in ck["output"].items()}}

    def _position(self) -> int | None:
        expected = getattr(self, "expected", None)
        return None if expected is None else int(sum(expected.values()))

    def stats(self) -> dict:
        s = self._common_stats()
        with self.lock:
            s.update({
                "entries": {n: e.stats() for n, e in self.entries.items()},
                "buffered_items": {n: len(ob.log) for n, ob in self.outboxes.items()},
                "dead_letters": sum(d.count for e in self.entries.values() for d in e.dead_letters),
                "recovered_chunks": self.recovered,
            })
        return s

    def dead_letters(self) -> list:
        with self.lock:
            return [d for e in self.entries.values() for d in e.dead_letters]


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, concurrency_groups={"probe": 1, "fetch": 1})
class SinkActor(_Base):
    """An application: merges its k input stream replicas (duplicate filter, sorter if ordered)
    and records every delivered tuple with its arrival time; optionally writes Parquet."""

    def __init__(self, query, node: str, server: str, channels: list[int], network, t0: float,
                 channel_opts: dict, coordinator=None, strict: bool = False, parquet_dir: str | None = None,
                 time_origin: float | None = None, label: str | None = None, sink=None, groups: list | None = None):
        self._setup(label or node, server, network, t0, channel_opts, coordinator)
        # a ParquetSink (replistream.sinks): this replica writes the application's files itself (a
        # replica "out.P#R" of a partitioned application: partition P's files and marker)
        part = replica_partition(self.label) if node in self.partitions else None
        self.writer = None if sink is None else SinkWriter(sink, node, self.label, part,
                                                           None if part is None else self.partitions[node])
        self.keep = sink is None or sink.keep  # tuples also kept for the driver's fetches
        self.node = node
        self.core = ReplicaCore(query, node, channels, strict, groups=groups)
        self.schema = query.schema_of(node)
        self.batches: list[np.ndarray] = []
        self.arrivals: list[np.ndarray] = []
        self._fetch_batch = 0  # first batch not yet fully fetched, and the position it starts at
        self._fetch_pos = 0
        self.punctuation = int(np.iinfo(np.int64).min)
        self.count = 0
        self.parquet_dir = parquet_dir
        self.parquet_files: list[str] = []
        self.time_origin = t0 if time_origin is None else time_origin
        self.lock = lockorder.lock("SinkActor.lock", 1)
        self.done = threading.Event()
        metrics_export.start(self, node)  # Ray metrics of its counters and latencies (metrics_export.py)

    def push(self, port: int, channel: int, packet: list, epoch: str | None = None, sender: str | None = None) -> int:
        """Take ``packet`` (see :meth:`ReplicaActor.push`)."""
        if self.quiet:
            return NO_ACK
        if epoch != self.epoch:
            return self._stale(port, channel, epoch, sender)
        now = time.time()
        with self._data_call(now):
            return self._push(port, channel, packet, now)

    def _push(self, port: int, channel: int, packet: list, now: float) -> int:
        self._observe(port, packet)
        with self.lock:
            before = self.punctuation
            self._sink_items(port, channel, packet, now)
            self._punct_times(now, before, self.punctuation, ())
        return self.core.filters[port].max_punct

    def _sink_items(self, port: int, channel: int, packet: list, now: float) -> None:
        """Deliver a packet's tuples (kept, written, counted) and take its punctuations (under the lock)."""
        for item in packet:
            if isinstance(item, Marker):
                continue  # the change concerns operators; nothing changes for an application
            try:
                outs = self.core.process(port, channel, self._guard(self.core, port, channel, item))
            except Exception as e:  # reported as the run's failure, then raised to the sender
                self._fatal(self.node, self.punctuation, e)
                raise
            for out in outs:
                if isinstance(out, Punctuation):
                    self.punctuation = max(self.punctuation, out.p)
                    if self.writer is not None:
                        self._await_parquet(out.p)
                        self._write(self.writer.punctuate, out.p)  # commits the cells it closes
                    if out.p == END:
                        self.done.set()
                elif len(out):
                    lat = metrics_export.latencies_ms(self, out, now)  # per batch (paced runs only)
                    if lat is not None:
                        self.metrics_export.observe(lat)
                    if self.keep:
                        self.batches.append(out)
                        self.arrivals.append(np.full(len(out), now))
                    self.count += len(out)
                    if self.writer is not None:
                        self.writer.add(out)
                    if self.parquet_dir:
                        self._write_parquet(out)

    def _await_parquet(self, p: int) -> None:
        """Before a commit at ``p``: wait for the writer to have loaded Parquet (its warm-up thread;
        seconds of imports on loaded cores), with the probe's busy clock stopped. That wait is this
        process setting up, not its data path hanging: counted, a first commit behind a slow import
        made a healthy replica look silent and be declared failed (``fail_after_s``). Its probes
        are answered meanwhile (their own concurrency group); a commit itself still counts."""
        if self.writer.warm.is_set() or not self.writer.due(p):
            return
        started, self.call_started = self.call_started, None  # probe(): busy_s 0 while it waits
        t = time.time()
        try:
            self.writer.wait_warm()
        finally:
            if started is not None:
                self.call_started = started + (time.time() - t)

    def _write(self, fn, p: int) -> None:
        """Run a sink step; an error (a full disk, a folder removed) is the run's failure, named."""
        try:
            fn(p)
        except Exception as e:
            self._fatal(self.node, self.punctuation, RuntimeError(
                f"{self.label} could not write its ParquetSink {self.writer.sink.path!r} at logical time "
                f"{p}: {type(e).__name__}: {e}"))
            raise

    def _write_parquet(self, batch: np.ndarray) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        os.makedirs(self.parquet_dir, exist_ok=True)
        path = os.path.join(self.parquet_dir, f"{self.node}-{len(self.parquet_files):06d}.parquet")
        root = os.path.realpath(self.parquet_dir)
        if os.path.dirname(os.path.realpath(path)) != root:  # never outside the folder given (names are checked too)
            raise ValueError(f"application {self.node!r}: its Parquet file {path!r} would lie outside {root!r}")
        table = pa.table({n: batch[n] for n in batch.dtype.names})
        pq.write_table(table, path)
        self.parquet_files.append(path)

    @ray.method(concurrency_group="fetch")  # apart from the data path: a large backlog is not copied on its thread
    def fetch(self, start: int = 0) -> tuple[list, list, int, int]:
        """Delivered tuples from position ``start`` on: (their batches, the batches' arrival
        times, count, punctuation); the caller joins them (:func:`~.results.joined`).

        Only batches not yet fetched are returned, so polling stays cheap as output grows. It runs
        on a thread of its own and holds the lock only to take the list of batches: before, a
        first fetch after millions of results (a ``wait()`` after a long ``feed()``) joined them
        all on the data path's thread, and no result arrived for a second meanwhile."""
        with self.lock:
            if start < self._fetch_pos:  # a reader starting over
                self._fetch_pos, self._fetch_batch = 0, 0
            i, pos = self._fetch_batch, self._fetch_pos
            while i < len(self.batches) and pos + len(self.batches[i]) <= start:
                pos += len(self.batches[i])
                i += 1
            self._fetch_batch, self._fetch_pos = i, pos
            parts, arrs = self.batches[i:], self.arrivals[i:]
            count, punct = self.count, self.punctuation
        if parts and start > pos:  # (the first batch was fetched in part: its rest; a view)
            parts[0], arrs[0] = parts[0][start - pos:], arrs[0][start - pos:]
        return parts, arrs, count, punct

    def _position(self) -> int | None:
        return getattr(self, "count", None)  # results delivered (its punctuations may lag its peers')

    def wait_done(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def _reusable(self) -> bool:
        return self.failure is None and self.parquet_dir is None and self.writer is None

    def add_channel(self, port: int, group: int | None = None) -> int:
        """A new upstream replica will feed ``port`` (from upstream partition ``group`` when the
        upstream is partitioned): returns its channel index."""
        with self.lock:
            return self.core.add_channel(port, group)

    def _delay(self) -> float:
        if self.done.is_set():
            return 0.0
        return self.input_delay(len(self.core.filters))

    def stats(self) -> dict:
        s = self._common_stats()
        with self.lock:
            s.update({"node": self.node, "delivered": self.count, "punctuation": self.punctuation,
                      "filters": [f.stats() for f in self.core.filters],
                      "dead_letters": sum(d.count for d in self.core.dead_letters()),
                      "parquet_files": list(self.parquet_files),
                      "sink": None if self.writer is None else self.writer.stats()})
        return s
