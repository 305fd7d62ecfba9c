"""Stream replicas on Ray: batching, emulated wide-area delay, backpressure, dead channels.

Every upstream replica sends its output stream to every downstream replica
over its own FIFO *link* (a stream replica, Hwang §II-B). An :class:`Outbox`
holds one output stream of one actor:

* ``emit(items)`` appends the operator's outputs to a pending packet;
* the packet is flushed at a size bound (``max_batch`` tuples), a time bound
  (``flush_ms``), and before every punctuation (docs/design.md, decision 3). A flush
  queues the packet on every link;
* each link delivers packets in order, no earlier than
  ``sent + latency(a, b, sent)`` of the emulated network (decision 5); packets
  that are due together go in one call, up to ``max_batch`` tuples (a backlog,
  e.g. many small chunks with their punctuations, costs one Ray call per
  ``max_batch`` tuples, not one per packet);
* a link with more than ``max_inflight`` packets sent but not yet processed
  makes ``emit`` wait (backpressure), at most ``drop_after_s``; a link whose
  receiver died, stays slow past that, or whose network queue exceeds
  ``max_queued`` packets (a cut link) is dropped and reported, so a dead or
  unreachable receiver never blocks the sender (decision 4).

Packets travel as inlined call arguments (``RAY_SYSTEM_CONFIG`` raises Ray's
inlining limit): a receiver holding calls whose object-store arguments were
owned by a now dead sender stalls about a second per argument, so a crashed
upstream replica would slow its live peers' consumers.

The receiver's ``push`` returns its current maximum punctuation on that input:
the *acknowledgement*. Every outbox keeps what it flushed since the smallest
punctuation all its active links acknowledged (its *retention log*, a
:class:`~replistream.replica.ReplayLog`, the one replay log of every engine;
docs/design.md, decision 7), so a link added later (a new or revived downstream
replica, or a revived stream replica; Hwang §V-C) starts with a replay of that log:
``add_link(link, replay=True)``. Adding the link and taking the log happen
under the outbox lock, so nothing emitted around that moment is missed. A
discarded stream replica (garbage collection, Algorithm 6) is removed with
:meth:`Outbox.remove_link`: the sender stops sending on it, no drop is
reported, and it no longer holds back the trimming of the log.

One :class:`Sender` thread per actor services all its outboxes.
"""
from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import ray

from ...network import delivery_time
from ...replica import ReplayLog
from ...schema import Marker, Punctuation
from . import lockorder
from .common import is_actor_death, is_unavailable

__all__ = ["CONTROL", "NO_ACK", "Link", "Outbox", "Sender", "coalesce", "gone_key"]

#: Items that carry no tuples: flushed at once, never merged into batches.
CONTROL = (Punctuation, Marker)

NO_ACK = int(np.iinfo(np.int64).min)


@dataclass
class Link:
    """One stream replica: this actor's output to one downstream replica's input port.

    >>> Link("join#1", "tokyo", None, port=0, channel=2).alive
    True
    """

    label: str  # receiver label, e.g. "join#1"
    server: str
    handle: Any  # Ray actor handle
    port: int
    channel: int  # index of this stream replica at the receiver's port
    alive: bool = True
    queue: deque = field(default_factory=deque)  # (due wall time, packet, sent wall time, tuples)
    inflight: deque = field(default_factory=deque)  # (ObjectRef of push, sent time, tuples)
    last_due: float = 0.0
    acked: int = NO_ACK
    packets: int = 0
    tuples: int = 0
    delay_sum: float = 0.0
    delay_max: float = 0.0
    blocked_since: float | None = None
    drop_reason: str | None = None
    replayed: int = 0  # tuples replayed from the retention log when the link was added
    #: to a replica of a partitioned operator: the router of that operator's input and the
    #: receiver's partition; the link carries that partition's share of each batch (issue #41)
    router: Any = None
    partition: int | None = None

    def share(self, packet: list, cache: dict | None = None) -> tuple[list, int]:
        """``(items, tuples)`` this link carries of ``packet``: all of it, or for a partition's
        replica its tuples' share and every punctuation and marker (``cache``: the packet's
        split per (router, port), shared by the links of one flush).

        >>> Link("g#0", "b", None, 0, 0).share([Punctuation(3)])
        ([Punctuation(3)], 0)
        """
        if self.router is None:
            return packet, sum(len(it) for it in packet if not isinstance(it, CONTROL))
        key = (id(self.router), self.port)
        parts = None if cache is None else cache.get(key)
        if parts is None:
            parts = self.router.route(self.port, packet)
            if cache is not None:
                cache[key] = parts
        mine = parts[self.partition]
        return mine, sum(len(it) for it in mine if not isinstance(it, CONTROL))


def gone_key(label: str, port: int) -> str:
    """The key of the hold a discarded stream replica to ``label``'s input ``port`` leaves on its
    sender's log (:meth:`Outbox.remove_link` with ``hold=True``).

    >>> gone_key("join#1", 0)
    'gone:join#1:0'
    """
    return f"gone:{label}:{int(port)}"


def coalesce(items: list) -> list:
    """Merge consecutive batches between punctuations into one batch each (empty batches go).

    >>> b = np.zeros(2, dtype=[("ts", "i8")])
    >>> [len(it) if isinstance(it, np.ndarray) else it for it in coalesce([b, b[:0], b, Punctuation(3), b])]
    [4, Punctuation(3), 2]
    """
    out: list = []
    run: list[np.ndarray] = []
    for it in items:
        if isinstance(it, CONTROL):
            if run:
                out.append(run[0] if len(run) == 1 else np.concatenate(run))
                run = []
            out.append(it)
        elif len(it):
            run.append(it)
    if run:
        out.append(run[0] if len(run) == 1 else np.concatenate(run))
    return out


class Outbox:
    """One output stream of an actor, fanned out to its links (see the module doc).

    ``log`` is its retention log (a :class:`~replistream.replica.ReplayLog`): what it
    flushed until every active link acknowledged a punctuation covering it; markers
    of running changes are not kept (replicas started later are built from the
    changed query). A batch straddling the acknowledgement keeps only its tuples
    above it.

    >>> from replistream import Schema
    >>> s = Schema({"x": "i8"})
    >>> ob = Outbox("f#0", "a", None, 0.0)
    >>> ob.emit([s.from_columns({"ts": [1, 5], "x": [0, 0]}), Punctuation(2)])
    >>> ob.log.tuples, ob.retained()[-1]
    (2, Punctuation(2))
    >>> ob.set_floor(2)  # no link: trimmed to the floor
    >>> ob.log.tuples, [len(it) for it in ob.retained()]
    (1, [1])
    """

    def __init__(self, owner: str, server: str, network, t0: float, max_batch: int = 10_000,
                 flush_ms: float = 2.0, max_inflight: int = 16, max_queued: int = 20_000,
                 drop_after_s: float = 10.0, on_drop: Callable[[str, Link, str], None] | None = None,
                 epoch: str | None = None):
        self.owner = owner
        self.epoch = epoch  # the deployment's: every packet carries it (a receiver rejects another's)
        self.server = server
        self.network = network
        self.t0 = t0
        self.max_batch = int(max_batch)
        self.flush_s = float(flush_ms) / 1000.0
        self.max_inflight = int(max_inflight)
        self.max_queued = int(max_queued)
        self.drop_after_s = float(drop_after_s)
        self.on_drop = on_drop
        self.links: list[Link] = []
        self.pending: list = []
        self.pending_tuples = 0
        self.pending_since: float | None = None
        self.lock = lockorder.condition(lockorder.rlock("Outbox.lock", 3))  # (one outbox's at a time)
        self.closed = False
        self.wake: threading.Event | None = None  # set by emit so an idle sender thread wakes up
        self.first_emit: float | None = None  # wall time of the first output emitted (repair timing)
        self.blocked_s = 0.0  # time emit() waited for room (backpressure)
        # retention log: every flushed item, in flush order, until every active link
        # acknowledged a punctuation covering it
        self.log = ReplayLog()
        self.floor = NO_ACK  # trim point used while no link is active (set by the coordinator)
        self.holds: dict[str, int] = {}  # trim points a dormant checkpoint downstream still needs
        self.emitted = 0  # tuples flushed since the start (the stream's rate)

    # -- setup ------------------------------------------------------------------
    def add_link(self, link: Link, replay: bool = False) -> int:
        """Add a stream replica; with ``replay``, first send it the retention log.

        Returns the number of tuples replayed.

        >>> ob = Outbox("f#0", "a", None, 0.0)
        >>> ob.emit([Punctuation(3)]); ob.add_link(Link("g#0", "b", None, 0, 0), replay=True)
        0
        >>> ob.links[0].queue[0][1]  # the replay packet, queued before anything new
        [Punctuation(3)]
        """
        with self.lock:
            n = 0
            if replay and len(self.log):
                packet, n = link.share(coalesce(self.log.items()))
                if packet:
                    now = time.time()
                    due = self._due(link, now)
                    link.last_due = due
                    link.queue.append((due, packet, now, n))
                link.replayed = n
            self.links.append(link)
            # a hold left by this stream replica's discard (remove_link(..., hold=True)) is no
            # longer needed: the link bounds the trim again (acked starts below everything)
            self.holds.pop(gone_key(link.label, link.port), None)
            self.lock.notify_all()
            if self.wake is not None:
                self.wake.set()
            return n

    def remove_link(self, label: str, port: int | None = None, hold: bool = False) -> int:
        """Stop sending to ``label`` (on ``port``, if given): the stream replica is discarded.

        Packets queued on it are forgotten; no drop is reported. Returns the
        number of links removed. With ``hold``, the log keeps everything after
        the link's last acknowledgement (a hold under :func:`gone_key`): the
        receiver stays fed by other senders and may lag behind this sender's
        other receivers, and if this stream replica is revived, its replay must
        start at the receiver's position, or the replayed punctuation passes the
        receiver's duplicate filter ahead of tuples it still waits for, which the
        filter then drops as copies. The coordinator raises the hold as the
        receiver acknowledges (:meth:`raise_holds`) and releases it when the
        receiver is no longer fed; :meth:`add_link` to it releases it too.

        >>> ob = Outbox("f#0", "a", None, 0.0); ob.add_link(Link("g#0", "b", None, 0, 0))
        0
        >>> ob.remove_link("g#0"), ob.links
        (1, [])
        >>> ob.add_link(Link("g#0", "b", None, 0, 1, acked=5)); ob.remove_link("g#0", 0, hold=True), ob.holds
        0
        (1, {'gone:g#0:0': 5})
        """
        with self.lock:
            gone = [l for l in self.links if l.label == label and (port is None or l.port == port)]
            self.links = [l for l in self.links if not any(l is g for g in gone)]
            n = len(gone)
            if hold:
                for l in gone:
                    if l.alive:
                        key = gone_key(l.label, l.port)
                        self.holds[key] = min(self.holds.get(key, l.acked), l.acked)
            self._trim_locked()
            self.lock.notify_all()
            return n

    def set_floor(self, acked: int) -> None:
        """Trim point while no link is active (e.g. a dormant entry replica, still fed)."""
        with self.lock:
            self.floor = max(self.floor, int(acked))
            self._trim_locked()

    def adopt(self, items: Iterable) -> None:
        """Take ``items`` (a peer's retained output, handed over with its checkpoint) into the
        retention log, after what it holds: links added later replay them."""
        with self.lock:
            self.log.append(items)

    def hold(self, key: str, p: int) -> None:
        """Keep everything after punctuation ``p`` for ``key`` (a dormant checkpoint downstream at
        ``p``), whatever the links acknowledge; a later call may only raise it."""
        with self.lock:
            self.holds[key] = max(self.holds.get(key, int(p)), int(p))
            self._trim_locked()

    def raise_holds(self, points: dict) -> int:
        """``{key: p or None}``: raise each hold this outbox has to ``p`` (never lower it), or
        release it (``None``); keys it does not hold are ignored, so a late call cannot bring
        back a hold that :meth:`add_link` released. Returns how many holds changed.

        >>> ob = Outbox("f#0", "a", None, 0.0); ob.hold("gone:g#0:0", 3)
        >>> ob.raise_holds({"gone:g#0:0": 7, "gone:h#0:0": 9}), ob.holds
        (1, {'gone:g#0:0': 7})
        >>> ob.raise_holds({"gone:g#0:0": None}), ob.holds
        (1, {})
        """
        n = 0
        with self.lock:
            for key, p in points.items():
                if key not in self.holds:
                    continue
                if p is None:
                    del self.holds[key]
                elif int(p) > self.holds[key]:
                    self.holds[key] = int(p)
                else:
                    continue
                n += 1
            if n:
                self._trim_locked()
        return n

    def _trim_locked(self) -> None:
        acks = [l.acked for l in self.links if l.alive]
        point = min(acks) if acks else self.floor
        self.log.trim(min(point, *self.holds.values()) if self.holds else point)

    # -- producer side -------------------------------------------------------------
    def emit(self, items: list, wait: bool = True) -> None:
        """Queue the operator's outputs; flushes on size and punctuation; waits on backpressure
        (unless ``wait=False``: then call :meth:`wait_for_room` later)."""
        if not items:
            return
        with self.lock:
            if self.first_emit is None:
                self.first_emit = time.time()
            punct = False
            for it in items:
                if isinstance(it, CONTROL):
                    punct = True
                else:
                    self.pending_tuples += len(it)
                self.pending.append(it)
            if self.pending_since is None:
                self.pending_since = time.time()
            if punct or self.pending_tuples >= self._batch_bound():
                self._flush_locked()
            if self.wake is not None:
                self.wake.set()
            if wait:
                self._wait_for_room_locked()

    def _batch_bound(self) -> int:
        """Tuples pending that flush the outbox: ``max_batch``, times the partitions its live links
        carry shares of (a flush is cut into one share per partition: each share about
        ``max_batch``, so a partitioned operator gets as many calls per tuple as an unpartitioned
        one, not p times as many; issue #41).

        >>> ob = Outbox("f#0", "a", None, 0.0, max_batch=100)
        >>> ob._batch_bound()
        100
        >>> ob.links = [Link(f"g.{q}#{i}", "a", None, 0, 0, router=object(), partition=q) for q in (0, 1) for i in (0, 1)]
        >>> ob._batch_bound()
        200
        """
        parts = {link.partition for link in self.links if link.alive and link.router is not None}
        return self.max_batch * max(1, len(parts))

    def wait_for_room(self) -> None:
        """Wait (backpressure) until every active link has room, dropping those blocked too long."""
        with self.lock:
            self._wait_for_room_locked()

    def _flush_locked(self) -> None:
        if not self.pending:
            return
        packet = coalesce(self.pending)
        tuples = self.pending_tuples
        self.pending, self.pending_tuples, self.pending_since = [], 0, None
        live = [l for l in self.links if l.alive]
        now = time.time()
        dues = [self._due(link, now) for link in live]  # first: an error here leaves no link without the packet
        self.emitted += tuples
        self.log.append(packet)  # a marker is not kept: replicas started later are built from the changed query
        # The packet goes to each link by value, not through ray.put: an object in
        # the object store is owned by this actor, and a receiver that still has
        # calls carrying objects of a dead owner stalls about a second per object
        # (measured on Ray 2.60). Inlined arguments (see RAY_SYSTEM_CONFIG) do not.
        split: dict = {}  # a partition's share, cut once per (router, port) for every link of this flush
        for link, due in zip(live, dues):
            mine, n = link.share(packet, split)
            if not mine:
                continue  # nothing of this packet is its partition's (punctuations go to every one)
            link.last_due = due
            link.queue.append((due, mine, now, n))
            if len(link.queue) > self.max_queued:
                self._drop_locked(link, f"network queue over {self.max_queued} packets (link cut or far too slow)",
                                  hold=True)
        self.lock.notify_all()

    def _due(self, link: Link, now: float) -> float:
        return max(self._delivery(link, now), link.last_due)  # FIFO: never overtake an earlier packet

    def _delivery(self, link: Link, sent: float) -> float:
        if self.network is None:
            return sent
        return self.t0 + delivery_time(self.network, self.server, link.server, sent - self.t0)

    def set_network(self, network) -> None:
        """A new view of the emulated network: packets still queued are re-timed from when they
        were sent (a link cut without a duration and later restored delivers its queue then,
        instead of keeping it due at infinity), still in order.

        >>> from replistream.network import NetworkConditions, ZeroLatency
        >>> net = NetworkConditions(ZeroLatency(["a", "b"])); net.cut("a", "b", 0.0, None)
        >>> ob = Outbox("f#0", "a", net, 0.0); ob.add_link(Link("g#0", "b", None, 0, 0))
        0
        >>> ob.emit([Punctuation(1)]); ob.links[0].queue[0][0]
        inf
        >>> net.restore(a="a", b="b", at=5.0); ob.set_network(net); ob.links[0].queue[0][0] < float("inf")
        True
        """
        with self.lock:
            self.network = network
            for link in self.links:
                last, down_until = 0.0, None
                queued = deque()
                for due, packet, sent, tuples in link.queue:
                    if down_until is not None and sent < down_until:
                        at = last  # sent while the link was still down: it comes up at the same moment
                    else:
                        at = self._delivery(link, sent)
                        down = network is not None and not np.isfinite(
                            network.latency_ms(self.server, link.server, sent - self.t0))
                        down_until = at if down else None
                    last = max(at, last)
                    queued.append((last, packet, sent, tuples))
                link.queue = queued
                link.last_due = last
            self.lock.notify_all()
            if self.wake is not None:
                self.wake.set()

    def _wait_for_room_locked(self) -> None:
        """Backpressure follows the fastest receiver (Hwang: results as early as the fastest path
        allows): wait only while *every* live link is full. A slower link's packets wait in its
        queue (bounded by ``max_queued``); one blocked longer than ``drop_after_s`` is dropped and
        reported by :meth:`_check_blocked_locked`, so no receiver ever holds this sender back."""
        started = None
        while True:
            live = [l for l in self.links if l.alive]
            if not live or any(len(l.inflight) < self.max_inflight for l in live):
                if started is not None:
                    self.blocked_s += time.time() - started
                return
            started = started or time.time()
            self._check_blocked_locked(time.time())
            self.lock.wait(0.005)

    def _check_blocked_locked(self, now: float) -> None:
        """Drop (and report) every live link whose receiver has left ``max_inflight`` packets
        unprocessed for longer than ``drop_after_s``: a stopped or far too slow receiver."""
        for l in self.links:
            if not l.alive:
                continue
            if len(l.inflight) < self.max_inflight:
                l.blocked_since = None
            elif l.blocked_since is None:
                l.blocked_since = now
            elif now - l.blocked_since > self.drop_after_s:
                self._drop_locked(l, f"receiver slow: {len(l.inflight)} packets unprocessed for "
                                     f"{self.drop_after_s:g} s", hold=True)

    # -- the sender thread's work ------------------------------------------------------
    def service(self) -> float | None:
        """Flush on the time bound, send due packets, collect acks.

        Returns the seconds until this outbox needs service again, or None when it
        is idle (nothing pending, queued or in flight)."""
        with self.lock:
            now = time.time()
            self._check_blocked_locked(now)
            if self.pending and self.pending_since is not None and now - self.pending_since >= self.flush_s:
                self._flush_locked()
            next_due = None
            if self.pending and self.pending_since is not None:
                next_due = max(0.0, self.pending_since + self.flush_s - now)
            for link in self.links:
                if not link.alive:
                    continue
                while link.queue and link.queue[0][0] <= now and len(link.inflight) < self.max_inflight:
                    due, packet, sent, tuples = link.queue.popleft()
                    # packets already due behind it go in the same call, up to max_batch tuples:
                    # a backlog costs one Ray call per max_batch tuples, not one per packet
                    while (link.queue and link.queue[0][0] <= now
                           and tuples + link.queue[0][3] <= max(self.max_batch, tuples)):
                        _, more, _, n_more = link.queue.popleft()
                        packet, tuples = packet + more, tuples + n_more
                    try:
                        call = link.handle.push.remote(link.port, link.channel, packet, self.epoch, self.owner)
                    except Exception as e:  # handle of a dead actor
                        self._drop_locked(link, f"send failed: {type(e).__name__}")
                        break
                    link.inflight.append((call, sent, tuples))
                    link.packets += 1
                    link.tuples += tuples
                    delay = now - sent
                    link.delay_sum += delay
                    link.delay_max = max(link.delay_max, delay)
                if link.queue and len(link.inflight) < self.max_inflight:
                    wait = max(0.0, link.queue[0][0] - now)
                    next_due = wait if next_due is None else min(next_due, wait)
                # (a link at max_inflight waits for an acknowledgement: the Sender wakes when a call
                # completes, see Sender._watch; no polling)
        return next_due

    def inflight_refs(self) -> list:
        with self.lock:
            return [c for l in self.links if l.alive for c, _, _ in l.inflight]

    def collect(self, ready: set) -> None:
        """Take the acknowledgements of completed calls (``ready``: ObjectRefs)."""
        with self.lock:
            for link in self.links:
                while link.alive and link.inflight and link.inflight[0][0] in ready:
                    call, _, _ = link.inflight.popleft()
                    try:
                        ack = ray.get(call)
                    except Exception as e:
                        if is_unavailable(e):  # unreachable for now: reconnected later, replaying from its position
                            self._drop_locked(link, f"receiver unreachable: {type(e).__name__}", hold=True)
                        elif is_actor_death(e):  # the receiver is gone: its peers carry on (Hwang §II-B)
                            self._drop_locked(link, f"receiver died: {type(e).__name__}")
                        else:  # its code raised: it reported the run's failure itself (actors._Base._fatal)
                            self._drop_locked(link, f"receiver raised: {_cause(e)}")
                        break
                    if ack is not None:
                        link.acked = max(link.acked, int(ack))
                    link.blocked_since = None
            self._trim_locked()
            self.lock.notify_all()

    def _drop_locked(self, link: Link, reason: str, hold: bool = False) -> None:
        """Drop ``link`` and report it. With ``hold`` (its receiver may live on: too slow, or cut
        off), the log keeps what the receiver has not acknowledged, as a discard does
        (:meth:`remove_link`): the deployment reconnects the link later with a replay, which must
        start at the receiver's position (decision 7); the hold is released by that reconnection,
        raised as the receiver acknowledges through other senders, and released if it dies."""
        if not link.alive:
            return
        link.alive = False
        link.drop_reason = reason
        link.queue.clear()
        link.inflight.clear()
        if hold:
            key = gone_key(link.label, link.port)
            self.holds[key] = min(self.holds.get(key, link.acked), link.acked)
        self._trim_locked()
        self.lock.notify_all()
        if self.on_drop is not None:
            self.on_drop(self.owner, link, reason)

    def drop(self, label: str, reason: str) -> None:
        """Drop the link(s) to ``label`` (e.g. a replica known to be dead), and release what a
        dropped or discarded link to it held (nothing will be replayed to it)."""
        with self.lock:
            for l in self.links:
                if l.label == label:
                    self._drop_locked(l, reason)
            prefix = gone_key(label, 0).rpartition(":")[0] + ":"
            for key in [k for k in self.holds if k.startswith(prefix)]:
                del self.holds[key]
            self._trim_locked()

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()

    def idle(self) -> bool:
        with self.lock:
            return not self.pending and all(not l.queue and not l.inflight for l in self.links if l.alive)

    def min_ack(self) -> int:
        """Smallest punctuation acknowledged by every live link (what everyone downstream has)."""
        with self.lock:
            acks = [l.acked for l in self.links if l.alive]
        return min(acks) if acks else NO_ACK

    def retained(self) -> list:
        """The retention log's items (flushed, not yet acknowledged by every active link), in order."""
        with self.lock:
            return self.log.items()

    def retained_since(self, mark: int) -> tuple[list, int]:
        """``(items, new mark)``: the retained items appended at or after ``mark`` (0: all of them),
        and the mark to pass next time. A staged transfer ships each step's increment of the log
        to the same receiver: the union of the increments covers the log at every step."""
        with self.lock:
            return self.log.items(since=mark), self.log.seq

    def stats(self) -> list[dict]:
        with self.lock:
            return [{
                "from": self.owner, "to": l.label, "port": l.port, "channel": l.channel, "alive": l.alive,
                "dropped": l.drop_reason, "packets": l.packets, "tuples": l.tuples,
                "mean_delay_ms": 1000.0 * l.delay_sum / l.packets if l.packets else 0.0,
                "max_delay_ms": 1000.0 * l.delay_max, "queued": len(l.queue), "inflight": len(l.inflight),
                "acked": l.acked, "replayed": l.replayed,
            } for l in self.links]


def _cause(e: BaseException) -> str:
    """The error a remote call raised, in one line (a RayTaskError's cause when it has one)."""
    cause = getattr(e, "cause", None) or e
    return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"


class Sender(threading.Thread):
    """The one background thread of an actor that services all its outboxes."""

    def __init__(self, outboxes: list[Outbox], on_error: Callable[[BaseException], None] | None = None):
        super().__init__(daemon=True, name="replistream-sender")
        self.on_error = on_error  # the actor's report of its own failure (an error here is a bug)
        self.errors = 0
        self.outboxes = outboxes
        self.wake = threading.Event()
        self.stopped = False
        # calls in flight whose completion wakes this thread (their futures' callbacks), and those
        # completed since the last round: no polling of calls in flight
        self._watched: set = set()
        self._done: set = set()
        self._done_lock = threading.Lock()
        for ob in outboxes:
            ob.wake = self.wake

    def add(self, outbox: Outbox) -> None:
        outbox.wake = self.wake
        self.outboxes.append(outbox)

    def run(self) -> None:
        while not self.stopped:
            try:
                self._round()
            except Exception as e:  # reported (the replica is declared failed); the thread goes on
                self._failed(e)
                time.sleep(0.01)

    def _round(self) -> None:
        """One round: service every outbox, collect acknowledgements, sleep until the next deadline."""
        wait = None
        outboxes = list(self.outboxes)
        for ob in outboxes:
            try:
                w = ob.service()
            except Exception as e:  # reported: the replica is declared failed (its peers carry the stream)
                self._failed(e)
                w = 0.01
            if w is not None:
                wait = w if wait is None else min(wait, w)
        # the calls completed since the last round (each one's completion woke this thread)
        refs = [r for ob in outboxes for r in ob.inflight_refs()]
        if refs or self._watched:
            ready = self._watch(refs)
            if ready:
                for ob in outboxes:
                    try:
                        ob.collect(ready)
                    except Exception as e:  # reported as above
                        self._failed(e)
        # idle: sleep until emit() wakes us (bounded, to notice stop); busy: until the next deadline
        # (bounded too: a cut link's packets are due at infinity until restore() re-times them)
        self.wake.wait(0.25 if wait is None else min(0.25, max(0.0005, wait)))
        self.wake.clear()

    def _watch(self, refs: list) -> set:
        """Have each call of ``refs`` wake this thread when it completes (once per call); returns
        those completed so far. Calls no longer in flight (collected, or of a dropped link) are
        forgotten."""
        current = set(refs)
        for r in current - self._watched:
            r.future().add_done_callback(lambda _f, r=r: self._completed(r))
        self._watched = current
        with self._done_lock:
            ready = self._done & current
            self._done = ready  # (a completion of a call already forgotten is dropped)
        return ready

    def _completed(self, ref) -> None:
        with self._done_lock:
            self._done.add(ref)
        self.wake.set()

    def _failed(self, e: BaseException) -> None:
        """An error in this thread is a bug that may have left a link without a packet: the replica
        reports it (``on_error``: the coordinator declares it failed, and its peers carry its
        streams); without a reporter it is printed. Reported once; the thread goes on meanwhile."""
        self.errors += 1
        if self.errors == 1 and self.on_error is not None:
            self.on_error(e)
        elif self.errors == 1:
            traceback.print_exc()

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()
