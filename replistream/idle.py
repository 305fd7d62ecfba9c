"""Idle sources: heartbeat punctuations for a source that stopped sending.

A join or a union waits for the smallest punctuation over its inputs, so one
source that goes quiet holds back every result behind it until the run ends.
With an idle timeout (as Flink's source idleness), the feeder stops waiting for
a source that has had nothing to send for ``idle_timeout`` seconds of wall
time and, while it stays quiet, puts **heartbeat punctuations** on it: the
event time the run has reached (the largest timestamp fed on any source, or,
in a paced replay, the wall clock mapped to event time, whichever is larger)
minus the source's ``max_disorder``. A tuple the source sends later at or
below a heartbeat is late: its entry points dead-letter it with its reason,
as any late tuple (docs/design.md, decision 1); nothing is folded into
results.

Heartbeats are decided in one place (the feeder, in the driver) and sent to
every entry replica as part of the source's input, so every replica sees the
same stream and replication transparency holds. Their positions are logged
(:class:`Heartbeat`, ``Deployment.heartbeats()``): the ideal run of the same
query over the input with the heartbeats put back (:func:`with_heartbeats`)
is the reference the replicated run must equal.

>>> import queue, threading
>>> q = queue.Queue()
>>> m = IdleMerge({"a": iter([[{"ts": 10}], [{"ts": 20}]]), "b": iter(q.get, None)},
...               idle_timeout=0.05, every=0.0)
>>> [(t, s, type(c).__name__) for t, s, c in (next(m), next(m), next(m))]
[(10, 'a', 'list'), (10, 'b', 'Punctuation'), (20, 'a', 'list')]
>>> m.heartbeats[0].source, m.heartbeats[0].p, m.heartbeats[0].after
('b', 10, 0)
>>> q.put(None); m.close()
"""
from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

from .schema import END, Punctuation
from .sources import chunk_time, chunk_tmax, iter_chunks

__all__ = ["Heartbeat", "IdleMerge", "with_heartbeats", "idle_timeouts"]

_END = object()


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat punctuation the feeder put on an idle source: ``Punctuation(p)`` after the
    source's first ``after`` input items (chunks as :func:`~replistream.sources.iter_chunks`
    cut them at the run's ``chunk_size``, sentinels included), ``wall`` seconds after the
    merge started.

    >>> Heartbeat("b", after=3, p=1_000_000, wall=0.5).p
    1000000
    """
    source: str
    after: int
    p: int
    wall: float


def idle_timeouts(idle_timeout: float | Mapping[str, float] | None, sources: list[str]) -> dict[str, float]:
    """``{source: seconds}`` from a run's ``idle_timeout`` (one number for every source, or a
    mapping for some of them; None: no source is ever idle). Raises ``ValueError`` naming a
    bad value or an unknown source.

    >>> idle_timeouts(0.5, ["a", "b"]), idle_timeouts({"b": 2}, ["a", "b"]), idle_timeouts(None, ["a"])
    ({'a': 0.5, 'b': 0.5}, {'b': 2.0}, {})
    """
    if idle_timeout is None:
        return {}
    if isinstance(idle_timeout, Mapping):
        unknown = sorted(set(idle_timeout) - set(sources))
        if unknown:
            raise ValueError(f"idle_timeout names unknown source(s) {unknown}; the query's sources are {sources}")
        pairs = dict(idle_timeout)
    else:
        pairs = {s: idle_timeout for s in sources}
    out = {}
    for s, v in pairs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"idle_timeout of source {s!r} must be a number of seconds > 0, got {v!r}")
        out[s] = float(v)
    return out


class IdleMerge:
    """Interleave per-source iterators in event-time order, as
    :class:`~replistream.sources.TimeMerge`, without waiting for idle sources.

    Each source is read by its own thread, ``prefetch`` items ahead. The merge yields the
    earliest head, as ``TimeMerge`` does, once every source has a head, has ended, or is
    *idle*: it is in ``idle_timeout`` (``{source: seconds}``) and has had nothing to give
    for that long (``clock`` seconds). While a source is idle the merge yields heartbeat
    punctuations for it, ``(p, source, Punctuation(p))``, at most one every ``every``
    seconds and only when ``p`` grows: ``p`` is the largest timestamp yielded on any source,
    or ``now_ts()`` (event time now, e.g. a paced replay's clock) if larger, minus
    ``disorder[source]``. Each is logged in :attr:`heartbeats`. A source that sends again
    is no longer idle. ``(inf, source, None)`` ends each source, as in ``TimeMerge``.
    An exception its iterator raises is raised by the merge; :meth:`close` stops the
    readers. (Heartbeats: Flink's source idleness; Hwang §II-B punctuations.)

    >>> m = IdleMerge({"a": iter([[{"ts": 4}]]), "b": iter([[{"ts": 2}]])}, idle_timeout=1.0)
    >>> [(t, s) for t, s, _ in m], m.heartbeats
    ([(2, 'b'), (4, 'a'), (inf, 'a'), (inf, 'b')], [])
    """

    def __init__(self, iters: Mapping[str, Iterator], idle_timeout: float | Mapping[str, float],
                 disorder: Mapping[str, int] | None = None, *, every: float = 0.05,
                 now_ts: Callable[[], float | None] | None = None, clock: Callable[[], float] = time.monotonic,
                 prefetch: int = 2):
        self.order = list(iters)
        self.timeout = idle_timeouts(idle_timeout, self.order)
        self.disorder = {s: int((disorder or {}).get(s, 0)) for s in self.order}
        self.every = float(every)
        self.now_ts = now_ts
        self.clock = clock
        self.heartbeats: list[Heartbeat] = []
        self._rank = {s: i for i, s in enumerate(self.order)}
        self._cv = threading.Condition()
        self._queues = {s: queue.Queue(maxsize=max(1, int(prefetch))) for s in self.order}
        self._heads: dict[str, tuple] = {}  # source -> (t, pos, chunk); chunk _END: ended
        self._done: set[str] = set()  # sources whose end was yielded
        self._taken = {s: 0 for s in self.order}  # input items taken from each source
        self._last_t = {s: -math.inf for s in self.order}
        self._punct = {s: -math.inf for s in self.order}  # largest timestamp / punctuation yielded per source
        self._fed = -math.inf  # largest timestamp yielded on any source
        self._hb_wall = {s: -math.inf for s in self.order}
        self._stop = False
        self.start = self.clock()
        self._seen = {s: self.start for s in self.order}  # when each source last gave something
        self._threads = [threading.Thread(target=self._read, args=(s, iters[s]), daemon=True,
                                          name=f"replistream-source-{s}") for s in self.order]
        for th in self._threads:
            th.start()
        self.first = self._first()

    # -- readers ---------------------------------------------------------------------------------
    def _read(self, src: str, it: Iterator) -> None:
        q = self._queues[src]
        try:
            for item in it:
                if not self._put(q, ("item", item)):
                    return
        except BaseException as e:  # raised by the merge, in the feeder
            self._put(q, ("error", e))
            return
        self._put(q, ("end", None))

    def _put(self, q: queue.Queue, entry) -> bool:
        while not self._stop:
            try:
                q.put(entry, timeout=0.1)
            except queue.Full:
                continue
            with self._cv:
                self._cv.notify_all()
            return True
        return False

    def close(self) -> None:
        """Stop the reader threads (an iterator blocked inside its own ``next`` stays blocked
        until it returns; the threads are daemons)."""
        self._stop = True

    # -- merging ---------------------------------------------------------------------------------
    def _fill(self) -> None:
        for s in self.order:
            if s in self._heads or s in self._done:
                continue
            try:
                kind, item = self._queues[s].get_nowait()
            except queue.Empty:
                continue
            self._seen[s] = self.clock()
            if kind == "error":
                self.close()
                raise item
            if kind == "end":
                self._heads[s] = (math.inf, 0, _END)
                continue
            t = chunk_time(item)
            t = self._last_t[s] if t is None else max(t, self._last_t[s])
            self._last_t[s] = t
            self._taken[s] += 1
            self._heads[s] = (t, self._taken[s], item)

    def _first(self) -> int | None:
        """The earliest first timestamp over the sources that give one within their idle timeout
        (a source without a timeout is waited for)."""
        with self._cv:
            while True:
                self._fill()
                now = self.clock()
                waiting = [s for s in self.order if s not in self._heads
                           and not (s in self.timeout and now - self.start >= self.timeout[s])]
                if not waiting:
                    break
                self._cv.wait(timeout=self._wait_for(waiting, now))
        firsts = [h[0] for h in self._heads.values() if h[2] is not _END and math.isfinite(h[0])]
        return int(min(firsts)) if firsts else None

    def _wait_for(self, waiting: list[str], now: float) -> float:
        due = [self._seen[s] + self.timeout[s] - now for s in waiting if s in self.timeout]
        return min([0.1] + [max(0.001, d) for d in due])

    def __iter__(self) -> "IdleMerge":
        return self

    def __next__(self) -> tuple[float, str, Any]:
        with self._cv:
            while True:
                self._fill()
                now = self.clock()
                waiting = [s for s in self.order if s not in self._heads and s not in self._done]
                idle = [s for s in waiting if s in self.timeout and now - self._seen[s] >= self.timeout[s]]
                hb = self._heartbeat(idle, now)
                if hb is not None:
                    return hb
                if len(idle) == len(waiting) and self._heads:
                    src = min(self._heads, key=lambda s: (self._heads[s][0], self._heads[s][2] is _END,
                                                          self._rank[s], self._heads[s][1]))
                    t, _, chunk = self._heads.pop(src)
                    if chunk is _END:
                        self._done.add(src)
                        return math.inf, src, None
                    hi = chunk_tmax(chunk)
                    if hi is not None and hi != END:
                        self._fed = max(self._fed, hi)
                        self._punct[src] = max(self._punct[src], hi)
                    return t, src, chunk
                if not waiting and not self._heads:
                    self.close()
                    raise StopIteration
                busy = [s for s in waiting if s not in idle]
                pause = self._wait_for(busy, now)
                if idle and self.now_ts is not None:  # the clock moves on: the next heartbeat is due
                    pause = min(pause, max(0.01, self.every))
                self._cv.wait(timeout=pause)

    def _heartbeat(self, idle: list[str], now: float):
        if not idle:
            return None
        progress = self._fed
        if self.now_ts is not None:
            wall = self.now_ts()
            if wall is not None:
                progress = max(progress, wall)
        if not math.isfinite(progress):
            return None
        for s in idle:
            p = int(progress) - self.disorder[s]
            if p > self._punct[s] and now - self._hb_wall[s] >= self.every:
                self._punct[s] = p
                self._hb_wall[s] = now
                self.heartbeats.append(Heartbeat(s, self._taken[s], p, now - self.start))
                return p, s, Punctuation(p)
        return None


def with_heartbeats(inputs: Mapping[str, Any], heartbeats: list[Heartbeat], chunk_size: int = 10_000
                    ) -> dict[str, list]:
    """The inputs as a run with heartbeats saw them: each source cut into chunks at
    ``chunk_size`` (as the run's feeder cut them) with each heartbeat's punctuation put back
    after its first ``after`` items; the input of the reference run of such a run.

    >>> hb = [Heartbeat("b", after=1, p=7, wall=0.1)]
    >>> with_heartbeats({"a": [{"ts": 9}], "b": [{"ts": 1}, {"ts": 8}]}, hb, chunk_size=1)["b"]
    [[{'ts': 1}], Punctuation(7), [{'ts': 8}]]
    """
    out: dict[str, list] = {}
    for src, data in inputs.items():
        items = list(iter_chunks(data, chunk_size))
        marks = sorted((h for h in heartbeats if h.source == src), key=lambda h: h.after)
        merged, pos = [], 0
        for h in marks:
            if h.after > len(items):
                raise ValueError(f"heartbeat on {src!r} after item {h.after}, but the input has {len(items)} "
                                 f"items at chunk_size={chunk_size}: give the run's input and chunk_size")
            merged.extend(items[pos:h.after])
            merged.append(Punctuation(h.p))
            pos = h.after
        merged.extend(items[pos:])
        out[src] = merged
    unknown = {h.source for h in heartbeats} - set(inputs)
    for src in sorted(unknown):
        out[src] = [Punctuation(h.p) for h in heartbeats if h.source == src]
    return out
