"""The one live view of a deployment's replicas and stream replicas (Hwang §II-B, §V).

A :class:`Topology` starts as a :class:`~replistream.plan.PhysicalPlan` (every
replica of every node on its server, every upstream replica feeding every
downstream replica on the channel of its index) and then follows the running
deployment: actors attached to replicas, failures, garbage collection (dormant
replicas, discarded stream replicas), revivals and new replicas, stream
replicas reconnected on new duplicate-filter channels, operators added and
removed at run time.

It is plain data with one lock and no Ray: the deployment owns it, the feeder
reads the running entry replicas from it, the control loop
(:mod:`.control`) and reconfiguration (:mod:`.reconfigure`) read and change it
through the methods below, and the garbage collector's
:class:`~replistream.gc.Snapshot` is built from it (:meth:`Topology.snapshot`).

A replica is a :class:`~replistream.gc.OperatorReplica` (label, operator,
server, kind, ``state``: ``"live"``, ``"dormant"`` or ``"failed"``, stateful)
plus what the gc types do not hold:

* its actor handle, once an actor runs it, and whether that actor runs
  (*running*): a dormant entry replica still runs (it is still fed, its input
  cannot be replayed), a dormant operator replica does not;
* *removed*: its operator was removed from the running query; it no longer
  appears in :meth:`~Topology.replicas` nor in snapshots, its stream replicas
  are forgotten.

A stream replica is a :class:`~replistream.gc.StreamReplica` (``live``: connected
and carrying data) plus the duplicate-filter *channel* it has at its destination's
port (every reconnection opens a new one).

Its lock is the innermost of a deployment (see :mod:`replistream.engines.ray`):
nothing is called out while it is held.

>>> from replistream import Query
>>> from replistream.plan import PhysicalPlan
>>> q = Query(); s = q.source("s", {"x": "i8"})
>>> s.filter(lambda b: b["x"] > 0, name="f").sink("app")
'app'
>>> topo = Topology(PhysicalPlan(q.build(), {"entry": ["a", "b"], "f": ["b", "c"], "app": ["c"]}))
>>> [(r.label, r.server) for r in topo.replicas("f")], topo.channel("entry#1->f#0:0")
([('f#0', 'b'), ('f#1', 'c')], 1)
>>> topo.attach("f#0", "handle of f#0"); topo.is_running("f#0"), topo.is_running("f#1")
(True, False)
>>> topo.mark_failed("f#0"), topo.replica("f#0").state, [s.id for s in topo.streams(live=True, dst="app")]
(True, 'failed', ['f#1->app:0'])
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

from . import lockorder
from ...gc import OperatorReplica, Snapshot, StreamReplica
from ...plan import ENTRY, PhysicalPlan, label_group, replica_index

__all__ = ["Topology", "kind_of"]


def kind_of(query, node: str) -> str:
    """The gc kind of ``node``'s replicas: ``"entry"``, ``"operator"`` or ``"application"``.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.sink("app")
    >>> kind_of(q, "entry"), kind_of(q, "app")
    ('entry', 'application')
    """
    if node == ENTRY:
        return "entry"
    return "application" if query.spec(node).kind == "sink" else "operator"


class Topology:
    """Replicas and stream replicas of a running deployment (see the module doc).

    Built from ``plan``; every stream replica of the plan starts live on the
    channel of its upstream replica's index, with the rate 1.0 and latency 0 a
    snapshot of an unmeasured plan has (:func:`~replistream.gc.snapshot_from_plan`);
    the control loop's measurements go into its own snapshots, not here.
    Reads return immutable records (or copies); changes take the lock.
    """

    def __getstate__(self) -> dict:
        """A copy for another process (a detached deployment's client reads it): without the lock."""
        with self.lock:  # containers copied under the lock (their records are immutable)
            return {k: (v.copy() if isinstance(v, (dict, list, set)) else v) for k, v in self.__dict__.items()
                    if k not in ("lock", "changed")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = lockorder.rlock("Topology.lock", 5)
        self.changed = threading.Event()
        self.__dict__.setdefault("version", 0)
        self.__dict__.setdefault("_burned", set())

    def _bump(self) -> None:
        """A change (under the lock): :attr:`version` grows and :attr:`changed` is set, so the
        process that persists the topology (a detached deployment's, :mod:`.lifecycle`) writes it."""
        self.version += 1
        self.changed.set()

    def burn(self, label: str) -> None:
        """Never give ``label`` to a new replica (:meth:`next_label`): an actor that once ran under it
        may still be named in reports (a half-started replica rolled back after a restore)."""
        with self.lock:
            self._burned.add(label)
            self._bump()

    def __init__(self, plan: PhysicalPlan):
        self.lock = lockorder.rlock("Topology.lock", 5)
        self.changed = threading.Event()  # set by every change (see _bump)
        self.version = 0
        self._burned: set[str] = set()
        self._reps: dict[str, OperatorReplica] = {}
        self._handles: dict[str, Any] = {}
        self._running: dict[str, bool] = {}
        self._removed: set[str] = set()
        self._streams: dict[str, StreamReplica] = {}
        self._channels: dict[str, int] = {}
        q = plan.query
        for r in plan.replicas():
            self._reps[r.label] = OperatorReplica(r.label, r.node, plan.server(r), kind_of(q, r.node),
                                                  stateful=plan.stateful(r.node))
            self._running[r.label] = False
        for e in plan.streams():
            s = StreamReplica(e.src.label, e.dst.label, e.port, 1.0, 0.0, 0.0, True, e.stream)
            self._streams[s.id] = s
            self._channels[s.id] = e.channel

    # -- replicas: reading ---------------------------------------------------------------
    def replica(self, label: str) -> OperatorReplica:
        """The replica ``label`` (removed ones too); ``KeyError`` if there never was one."""
        with self.lock:
            return self._reps[label]

    def __contains__(self, label: str) -> bool:
        with self.lock:
            return label in self._reps and label not in self._removed

    def replicas(self, node: str | None = None, state: str | None = None) -> list[OperatorReplica]:
        """Replicas not removed (of group ``node``, in ``state``), in the order they were added.
        ``node`` is an operator (every partition's replicas, for a partitioned one) or one
        partition ``"op.P"`` (its copies only)."""
        with self.lock:
            return [r for r in self._reps.values() if r.label not in self._removed
                    and (node is None or r.operator == node or label_group(r.label) == node)
                    and (state is None or r.state == state)]

    def serving(self, group: str) -> list[str]:
        """Labels of ``group``'s replicas (as :meth:`replicas`) that are live and run in an actor
        now: the peers a hand-over can copy from, and how many a repair counts toward k.

        >>> from replistream import Query
        >>> q = Query(); s = q.source("s", {"k": "i8"}); _ = s.window(10, by="k", name="w").sink("app")
        >>> topo = Topology(PhysicalPlan(q.build(), {"entry": ["a"], "w": ["a", "b"], "app": ["a"]}))
        >>> for r in topo.replicas(): topo.attach(r.label, None)
        >>> _ = topo.mark_failed("w#0"); topo.serving("w")
        ['w#1']
        """
        return [r.label for r in self.replicas(group, state="live") if self.is_running(r.label)]

    def copies(self, label: str, state: str | None = None) -> list[OperatorReplica]:
        """The replicas that are copies of ``label`` (its operator's, or its partition's), ``label``
        included (in ``state`` if given).

        >>> from replistream import Query
        >>> q = Query(); s = q.source("s", {"k": "i8"}); _ = s.window(10, by="k", name="w").sink("app")
        >>> topo = Topology(PhysicalPlan(q.build(), {"entry": ["a"], "w": ["a", "b"], "app": ["a"]}, parallelism={"w": 2}))
        >>> [r.label for r in topo.copies("w.1#0")], len(topo.replicas("w"))
        (['w.1#0', 'w.1#1'], 4)
        """
        return self.replicas(label_group(label), state)

    def handle(self, label: str):
        """The actor handle of ``label`` (None before an actor was attached)."""
        with self.lock:
            return self._handles.get(label)

    def server(self, label: str) -> str:
        """The server of ``label``."""
        with self.lock:
            return self._reps[label].server

    def is_running(self, label: str) -> bool:
        """Whether an actor runs ``label`` now (False for an unknown label)."""
        with self.lock:
            return self._running.get(label, False)

    def running(self, node: str | None = None) -> list[tuple[str, Any]]:
        """``(label, handle)`` of every running replica (of ``node``: an operator, or one partition
        ``"op.P"``), in the order added."""
        with self.lock:
            return [(label, self._handles[label]) for label, r in self._reps.items()
                    if self._running[label] and (node is None or r.operator == node or label_group(label) == node)]

    def alive(self) -> dict[str, bool]:
        """``{label: running}`` of every replica an actor was ever attached to."""
        with self.lock:
            return {label: self._running[label] for label in self._handles}

    def handles(self) -> dict[str, Any]:
        """``{label: actor handle}`` of every replica an actor was ever attached to."""
        with self.lock:
            return dict(self._handles)

    def servers(self) -> dict[str, str]:
        """``{label: server}`` of every replica an actor was ever attached to."""
        with self.lock:
            return {label: self._reps[label].server for label in self._handles}

    def removed(self) -> set[str]:
        """Labels of replicas of operators removed from the running query."""
        with self.lock:
            return set(self._removed)

    def next_label(self, node: str) -> str:
        """The label a new replica of operator ``node`` (or of partition ``"op.P"``) gets: one past
        the highest index so far."""
        with self.lock:
            idx = [replica_index(label) for label in self._reps if label_group(label) == node]
            idx += [replica_index(label) for label in self._burned if label_group(label) == node]
        idx = [i for i in idx if i is not None]
        return f"{node}#{max(idx) + 1 if idx else 0}"

    # -- replicas: changing --------------------------------------------------------------
    def add_replica(self, replica: OperatorReplica) -> None:
        """Add a replica (no actor yet), or replace the record of one with the same label."""
        with self.lock:
            self._reps[replica.label] = replica
            self._running.setdefault(replica.label, False)
            self._removed.discard(replica.label)
            self._bump()

    def attach(self, label: str, handle) -> None:
        """An actor now runs ``label``."""
        with self.lock:
            if label not in self._reps:
                raise KeyError(f"no replica {label!r} to attach an actor to")
            self._handles[label] = handle
            self._running[label] = True
            self._bump()

    def set_state(self, label: str, state: str) -> None:
        """Set the gc state of ``label`` (``"live"``, ``"dormant"``, ``"failed"``)."""
        with self.lock:
            self._reps[label] = replace(self._reps[label], state=state)
            self._bump()

    def mark_failed(self, label: str) -> bool:
        """The actor of ``label`` died: it no longer runs; a live replica becomes failed and its
        stream replicas stop. Returns False if it was not running (nothing changed)."""
        with self.lock:
            if not self._running.get(label):
                return False
            self._running[label] = False
            self._bump()
            r = self._reps[label]
            if r.state == "live":
                self._reps[label] = replace(r, state="failed")
                for sid, s in self._streams.items():
                    if s.live and label in (s.src, s.dst):
                        self._streams[sid] = replace(s, live=False)
            return True

    def retire(self, label: str) -> bool:
        """Garbage collection made ``label`` dormant. An operator replica's actor is to be stopped:
        returns True if it was running (the caller stops it); an entry replica keeps running."""
        with self.lock:
            r = self._reps[label]
            self._reps[label] = replace(r, state="dormant")
            self._bump()
            if r.kind == "operator" and self._running[label]:
                self._running[label] = False
                return True
            return False

    def remove(self, labels) -> list[tuple[str, Any]]:
        """Replicas of removed operators: forgotten with their stream replicas; returns the
        ``(label, handle)`` of those that were running (the caller stops them)."""
        with self.lock:
            stop = []
            for label in labels:
                if self._running.get(label):
                    stop.append((label, self._handles[label]))
                self._running[label] = False
                self._removed.add(label)
            self._bump()
            gone = [sid for sid, s in self._streams.items() if s.src in self._removed or s.dst in self._removed]
            for sid in gone:
                del self._streams[sid]
                self._channels.pop(sid, None)
            return stop

    def stop_all(self) -> list[tuple[str, Any]]:
        """Every actor is being stopped (the deployment shuts down): returns those that were running."""
        with self.lock:
            stop = [(label, self._handles[label]) for label, on in self._running.items() if on]
            for label, _ in stop:
                self._running[label] = False
            self._bump()
            return stop

    # -- stream replicas -----------------------------------------------------------------
    def stream(self, sid: str) -> StreamReplica:
        """The stream replica ``sid`` (``"src->dst:port"``)."""
        with self.lock:
            return self._streams[sid]

    def has_stream(self, sid: str) -> bool:
        with self.lock:
            return sid in self._streams

    def channel(self, sid: str) -> int | None:
        """The duplicate-filter channel of ``sid`` at its destination (None if never connected)."""
        with self.lock:
            return self._channels.get(sid)

    def streams(self, live: bool | None = None, src: str | None = None, dst: str | None = None,
                touching: str | None = None) -> list[StreamReplica]:
        """Stream replicas (live or not; from ``src``; to ``dst``; with ``touching`` at either end),
        in the order they were added."""
        with self.lock:
            return [s for s in self._streams.values() if (live is None or s.live == live)
                    and (src is None or s.src == src) and (dst is None or s.dst == dst)
                    and (touching is None or touching in (s.src, s.dst))]

    def sender_of(self, dst: str, port: int, channel: int) -> str | None:
        """The upstream replica whose stream replica feeds ``dst``'s input ``port`` on duplicate-filter
        channel ``channel`` (None if none is recorded)."""
        with self.lock:
            for sid, s in self._streams.items():
                if s.dst == dst and s.port == port and self._channels.get(sid) == channel:
                    return s.src
        return None

    def put_stream(self, stream: StreamReplica, channel: int | None = None) -> None:
        """Add a stream replica, or replace the record of the one with its id (which keeps its place)."""
        with self.lock:
            self._streams[stream.id] = stream
            if channel is not None:
                self._channels[stream.id] = int(channel)
            self._bump()

    def connect(self, sid: str, channel: int) -> None:
        """``sid`` now carries data on duplicate-filter channel ``channel`` of its destination."""
        with self.lock:
            self._streams[sid] = replace(self._streams[sid], live=True)
            self._channels[sid] = int(channel)
            self._bump()

    def disconnect(self, sid: str) -> None:
        """``sid`` was discarded (or its link dropped): it carries nothing; it keeps its channel."""
        with self.lock:
            self._streams[sid] = replace(self._streams[sid], live=False)
            self._bump()

    # -- the garbage collector's view ------------------------------------------------------
    def snapshot(self, kmin: int = 1, theta: float = float("inf"),
                 measure: Callable[[StreamReplica], StreamReplica] | None = None) -> Snapshot:
        """A :class:`~replistream.gc.Snapshot` of the replicas and stream replicas not removed;
        ``measure(stream)`` gives each stream replica its measured rate, latency and weight."""
        with self.lock:
            reps = [r for r in self._reps.values() if r.label not in self._removed]
            streams = list(self._streams.values())
        if measure is not None:
            streams = [measure(s) for s in streams]
        return Snapshot(reps, streams, kmin, theta)
