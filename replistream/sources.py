"""Source input: chunks, their event times, the event-time merge, and scripted events.

What every engine does with a source's input before its entry points see it:

* :func:`iter_chunks` cuts an input (a structured array, a column mapping, a
  list of records, or an iterable of such chunks, punctuations and
  sentinels) into chunks, lazily;
* :func:`chunk_time` and :func:`chunk_tmax` read a chunk's first and largest
  timestamp (whatever its form: records, columns, arrays, a
  :class:`ChunkRef` already in Ray's object store, a punctuation);
* :class:`TimeMerge` interleaves several sources in event-time order, as
  the ideal run sees them and as a deployment's feeder replays them;
* :func:`source_streams` runs each source's entry logic over its input;
* :class:`Sentinel` events (:class:`KillReplica`, :class:`KillServer`,
  :class:`Pause`, :class:`Call`, :class:`Revive`, :class:`AddReplica`, :class:`Rescale`) placed
  among a source's chunks script what happens at a known point of the stream;
  :class:`inject_at` places them by event time.

>>> chunks = [[{"ts": 5, "x": 1}], Punctuation(6), [{"ts": 3, "x": 2}]]
>>> [chunk_time(c) for c in chunks], chunk_tmax(chunks[0])
([5, 6, 3], 5)
>>> [(t, s) for t, s, _ in TimeMerge({"a": iter([[{"ts": 4}]]), "b": iter([[{"ts": 2}]])})]
[(2, 'b'), (4, 'a'), (inf, 'a'), (inf, 'b')]
"""
from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .errors import QueryError, SchemaError
from .operators.base import NO_PUNCTUATION, Item
from .schema import END, TS, Punctuation

if TYPE_CHECKING:
    from .operators.entry import EntryLogic
    from .query import Query

__all__ = ["ChunkRef", "iter_chunks", "cut_by_time", "paced_pieces", "window_close_rule", "release_rule", "AdaptiveCut", "chunk_time", "chunk_tmax", "needs_stamp", "stamp", "TimeMerge",
           "source_streams", "Sentinel", "Handed", "KillReplica", "StopReplica", "KillServer", "Pause", "Call", "Revive",
           "AddReplica", "Rescale", "inject_at"]


# -- chunks --------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkRef:
    """A source chunk already in Ray's object store, with what the feeder needs to know.

    Sources that produce their data inside the cluster (e.g.
    :class:`replistream.spark.SparkSource`) yield these: the feeder hands
    ``ref`` to every entry point replica and uses ``n``/``tmin``/``tmax``
    (event-time bounds, microseconds) to merge sources and to pace the
    replay, so the rows never pass through the driver.

    >>> ChunkRef(ref=None, n=3, tmin=10, tmax=42).tmin
    10
    """

    ref: Any
    n: int
    tmin: int
    tmax: int

def iter_chunks(data: Any, chunk_size: int = 10_000):
    """The chunks of one source's input, lazily (generators are not materialised), none larger
    than ``chunk_size`` rows.

    ``data`` is a structured array, a column mapping, a list of records, or an
    iterable of such chunks, :class:`~replistream.schema.Punctuation` objects,
    :class:`Sentinel` events and single records. Consecutive records are grouped
    into chunks of at most ``chunk_size``; a structured array, a column mapping or a
    list of records longer than that, given whole or as one chunk of an iterable, is
    cut into slices of ``chunk_size`` rows (a column mapping only when its columns
    all have the same length: otherwise it is passed whole, for the entry point to
    reject). Cutting never changes a run's result: entry points number rows by
    their position in the source (ids do not depend on chunking) and decide
    lateness per tuple; it lets the feeder pace and the entry points punctuate
    within what the user gave as one piece. Chunks already cut elsewhere
    (:class:`ChunkRef`, :class:`~replistream.operators.entry.SourceBatch`) pass
    as they are.

    >>> [len(c) for c in iter_chunks([{"ts": i} for i in range(5)], 2)]
    [2, 2, 1]
    >>> [c["ts"].tolist() for c in iter_chunks({"ts": np.arange(5), "x": np.zeros(5)}, 2)]
    [[0, 1], [2, 3], [4]]
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a whole number of rows >= 1, got {chunk_size!r}")
    chunk_size = int(chunk_size)
    if isinstance(data, np.ndarray) or isinstance(data, Mapping):
        yield from _cut(data, chunk_size)
        return
    group: list = []
    for item in data:
        if _is_record(item):
            group.append(item)
            if len(group) >= chunk_size:
                yield group
                group = []
            continue
        if group:
            yield group
            group = []
        yield from _cut(item, chunk_size)
    if group:
        yield group


def _cut(chunk: Any, size: int):
    """``chunk`` in slices of at most ``size`` rows: structured arrays, column mappings whose
    columns have one common length, and lists of records; anything else whole."""
    if isinstance(chunk, np.ndarray) and chunk.ndim == 1 and len(chunk) > size:
        for a in range(0, len(chunk), size):
            yield chunk[a:a + size]
        return
    if isinstance(chunk, Mapping) and chunk:
        n = _common_length(chunk)
        if n is not None and n > size:
            for a in range(0, n, size):
                yield {k: v[a:a + size] for k, v in chunk.items()}
            return
    if isinstance(chunk, list) and len(chunk) > size and chunk and isinstance(chunk[0], Mapping):
        for a in range(0, len(chunk), size):
            yield chunk[a:a + size]
        return
    yield chunk


def cut_by_time(chunk: Any, span: int | Callable[[], int], punct: Callable[[np.ndarray], np.ndarray] | None = None,
                before: float = -math.inf):
    """``chunk`` in row slices that each span at most ``span`` µs of event time (from the slice's
    first row, by the running maximum of the timestamps, so rows keep their order): what a paced
    replay sends at once. ``span`` may be a function, asked again before each slice (a batch
    size that adapts while the chunk is sent, :class:`AdaptiveCut`). Structured arrays, column mappings and lists of records with readable
    timestamps are cut; anything else, or a chunk within ``span``, passes whole. As with
    :func:`iter_chunks`, cutting never changes a run's result.

    ``punct`` is the source's punctuation rule (the entry point's
    :meth:`~replistream.operators.entry.EntryLogic.auto_punctuation`, a function of the running
    maximum of the timestamps) and ``before`` the running maximum before this chunk: a row that
    raises the punctuation then ends its slice. A replay that releases each slice at its last
    row's time thus sends every punctuation at the time of the row that raises it: batching
    delays rows by at most ``span``, never the windows they close.

    >>> [c["ts"].tolist() for c in cut_by_time({"ts": np.array([0, 3, 9, 10, 25])}, 10)]
    [[0, 3, 9, 10], [25]]
    >>> [len(c) for c in cut_by_time([{"ts": 0}, {"ts": 50}, {"x": 1}], 10)]
    [1, 2]
    >>> grid = lambda m: m // 5 * 5 - 1      # a punctuation every 5 µs
    >>> [c["ts"].tolist() for c in cut_by_time({"ts": np.array([0, 3, 5, 6, 9, 10])}, 100, grid, before=0)]
    [[0, 3, 5], [6, 9, 10]]
    """
    t = _row_times(chunk)
    if t is None or not len(t):
        yield chunk
        return
    t = np.maximum(np.maximum.accumulate(np.where(np.isnan(t), -np.inf, t)), before)
    width = span if callable(span) else (lambda: span)
    raise_at = _punctuation_raises(t, punct, before) if punct is not None else _NO_ROWS
    if len(t) < 2 or (np.isfinite(t[-1]) and t[-1] - t[np.argmax(np.isfinite(t))] <= width()
                      and (not len(raise_at) or raise_at[0] == len(t) - 1)):
        yield chunk
        return
    if not np.isfinite(t[-1]) and not len(raise_at):
        yield chunk
        return
    n, a = len(t), 0
    while a < n:
        base = t[a] if np.isfinite(t[a]) else t[np.argmax(np.isfinite(t))]
        b = max(a + 1, int(np.searchsorted(t, base + width(), "right")))
        j = int(np.searchsorted(raise_at, a))  # the first row from a on that raises the punctuation
        if j < len(raise_at) and raise_at[j] < b:
            b = int(raise_at[j]) + 1
        yield _rows(chunk, a, b)
        a = b


_NO_ROWS = np.empty(0, dtype=np.int64)


def _punctuation_raises(t: np.ndarray, punct: Callable[[np.ndarray], np.ndarray], before: float) -> np.ndarray:
    """The rows at which the running maxima ``t`` (floats, -inf before any readable time) raise
    the punctuation ``punct`` gives, from where ``before`` left it."""
    m = np.r_[before, t]
    known = np.isfinite(m)
    p = np.full(len(m), NO_PUNCTUATION, dtype=np.int64)
    p[known] = np.asarray(punct(m[known].astype(np.int64)), dtype=np.int64)
    return np.flatnonzero(p[1:] > p[:-1])


def window_close_rule(grid: int, max_disorder: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """The punctuation a source's entry point has reached, counted on the grid of the punctuations
    that release results downstream only (:meth:`~replistream.query.Query.release_grid`: the window
    ends, or every punctuation when a user operator or a sorted input waits on each): a function of
    the running maximum of the timestamps that rises exactly when a row lets a result out. A paced
    replay ends its pieces at those rows (:func:`paced_pieces`), and only at those: a punctuation
    that releases nothing (``punctuate_every`` finer than the windows, with only windows
    downstream) does not cut a piece.

    >>> rule = window_close_rule(1_000, max_disorder=10)
    >>> rule(np.array([500, 1_009, 1_010, 2_500])).tolist()
    [-1, -1, 999, 1999]
    """
    grid, d = int(grid), int(max_disorder)
    if grid <= 0:
        raise ValueError(f"window grid must be > 0, got {grid}")
    return lambda m: (np.asarray(m, dtype=np.int64) - d) // grid * grid - 1


def release_rule(grid: int, max_disorder: int = 0, min_gap: int = 1,
                 also: Callable[[np.ndarray], np.ndarray] | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """The rule by which a paced replay ends its pieces for an operator that acts on every
    punctuation of the source (:meth:`~replistream.query.Query.release_grid`): the punctuations on
    ``grid``, but at most one per ``min_gap`` µs of event time (the replay's span: the grid's
    multiple at or above it), so that fine punctuations never make pieces smaller than the span
    (each piece is a call to every entry replica); a row that raises it, or ``also`` (a window
    close rule), ends its piece.

    >>> rule = release_rule(20, min_gap=50)     # punctuations every 20 µs, pieces of 50: every 60 µs
    >>> rule(np.array([59, 60, 119, 120])).tolist()
    [-1, 59, 59, 119]
    >>> both = release_rule(20, min_gap=50, also=window_close_rule(100))
    >>> (np.diff(both(np.array([59, 60, 99, 100, 119, 120]))) > 0).tolist()
    [True, False, True, False, True]
    """
    grid, gap = int(grid), max(1, int(min_gap))
    if grid <= 0:
        raise ValueError(f"punctuation grid must be > 0, got {grid}")
    coarse = window_close_rule(grid * -(-gap // grid), max_disorder)
    if also is None:
        return coarse
    return lambda m: coarse(m) + also(m)  # (both rise with m: the sum rises whenever either does)


def paced_pieces(chunks: Iterator, span: int | Callable[[], int],
                 punct: Callable[[np.ndarray], np.ndarray] | None = None) -> Iterator:
    """Every chunk of one source cut by :func:`cut_by_time`, the running maximum of its timestamps
    carried from chunk to chunk (so the rows that raise ``punct`` end their pieces across chunk
    boundaries too).

    >>> grid = lambda m: m // 5 * 5 - 1     # the source's first row raises it too (from none)
    >>> [c["ts"].tolist() for c in paced_pieces(iter([{"ts": np.array([6, 7])}, {"ts": np.array([9, 12, 13])}]), 100, grid)]
    [[6], [7], [9, 12], [13]]
    """
    before = -math.inf
    for chunk in chunks:
        yield from cut_by_time(chunk, span, punct, before)
        t = _row_times(chunk)
        if t is not None and len(t) and not np.isnan(t).all():
            before = max(before, float(np.nanmax(t)))


class AdaptiveCut:
    """How much wall time a paced chunk may span: the batch size of a paced replay, adapted to
    whether the deployment keeps up (#16: batches adaptive to rate and latency target).

    It starts at ``chunk_ms`` (a piece leaves at its last row's time, so each row waits at most
    ``chunk_ms``; rows that raise a punctuation end their pieces and do not wait, see
    :func:`cut_by_time`). When a piece is sent later than 4 spans after its time (the entry points hold
    the feeder back: the deployment cannot take that many packets), the span doubles, at most
    once per 8 spans of wall time (so a backlog that takes time to drain does not blow it up)
    and up to ``max_ms``: fewer, larger packets cost less per tuple. After ``calm`` pieces sent
    on time in a row it halves again, down to ``chunk_ms``; if the halved span falls behind
    again, ``calm`` doubles (it waits longer before the next try, as TCP backs off). A cut never changes a run's result
    (:func:`cut_by_time`, which asks for the span before each piece).

    >>> cut = AdaptiveCut(5.0)
    >>> cut.sent(late_s=0.5, now=0.0); cut.ms        # late by 100 spans: doubled
    10.0
    >>> cut.sent(late_s=0.5, now=0.05); cut.ms       # not again within 8 spans (80 ms)
    10.0
    >>> cut.sent(late_s=0.5, now=0.09); cut.ms
    20.0
    >>> for _ in range(128): cut.sent(late_s=0.0)
    >>> cut.ms, cut.max_seen_ms
    (5.0, 20.0)
    """

    def __init__(self, chunk_ms: float, max_ms: float = 1000.0, calm: int = 64):
        self.base = self.ms = self.max_seen_ms = float(chunk_ms)
        self.max_ms = max(float(max_ms), self.base)
        self.calm = int(calm)
        self._on_time = 0
        self._grown_at = -math.inf
        self._shrunk = False
        self.changes = 0

    def span_us(self, pace: float) -> int:
        """The event-time span (µs) of a piece at ``pace`` event seconds per second."""
        return max(1, int(pace * 1e3 * self.ms))

    def sent(self, late_s: float, now: float | None = None) -> None:
        """A piece left ``late_s`` seconds after its time (0 or less: on time); ``now`` is a
        monotonic clock in seconds (default :func:`time.monotonic`)."""
        if late_s * 1e3 > 4 * self.ms:
            self._on_time = 0
            now = time.monotonic() if now is None else now
            if self.ms < self.max_ms and now - self._grown_at >= 8 * self.ms / 1e3:
                if self._shrunk:  # the smaller span it tried was too small: try again later
                    self.calm = min(self.calm * 2, 1 << 16)
                    self._shrunk = False
                self.ms = min(self.ms * 2, self.max_ms)
                self.max_seen_ms = max(self.max_seen_ms, self.ms)
                self._grown_at = now
                self.changes += 1
            return
        self._on_time += 1
        if self._on_time >= self.calm and self.ms > self.base:
            self.ms = max(self.base, self.ms / 2)
            self._on_time = 0
            self._shrunk = True
            self.changes += 1
        elif self._on_time >= self.calm:
            self._shrunk = False


def _row_times(chunk: Any) -> np.ndarray | None:
    """Each row's timestamp as float (nan where unreadable), or None for a chunk of another kind."""
    from .operators.entry import SourceBatch

    try:
        if isinstance(chunk, SourceBatch):  # (its good rows; the rows set aside go with their neighbours)
            return _row_times(chunk.data)
        if isinstance(chunk, np.ndarray):
            return chunk[TS].astype(np.float64) if chunk.ndim == 1 and TS in (chunk.dtype.names or ()) else None
        if isinstance(chunk, Mapping):
            if _common_length(chunk) is None or TS not in chunk:
                return None
            ts = np.asarray(chunk[TS])
            return ts.astype(np.float64) if ts.dtype.kind in "iuf" else None
        if isinstance(chunk, list) and chunk and all(isinstance(r, Mapping) for r in chunk):
            return np.array([float(r[TS]) if isinstance(r.get(TS), (int, float, np.integer, np.floating))
                             and not isinstance(r.get(TS), bool) else np.nan for r in chunk])
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _rows(chunk: Any, a: int, b: int):
    from .operators.entry import SourceBatch

    if isinstance(chunk, Mapping):
        return {k: v[a:b] for k, v in chunk.items()}
    if isinstance(chunk, SourceBatch):  # good rows a..b-1, with the rows set aside between them
        pos = chunk.positions
        lo = 0 if a == 0 else int(a if pos is None else pos[a])
        hi = chunk.n if b >= len(chunk.data) else int(b if pos is None else pos[b])
        return source_batch_slice(chunk, lo, hi)
    return chunk[a:b]


def source_batch_slice(sb, lo: int, hi: int):
    """The records of :class:`~replistream.operators.entry.SourceBatch` ``sb`` at positions
    ``lo..hi-1`` (good ones and those set aside) as a SourceBatch of its own, positions from 0. An
    entry point numbers a batch's records from its running count, so the slices of a batch, fed in
    order, get the ids the whole batch would have had (a paced replay of files cuts the batches a
    reading task made into pieces of ``chunk_ms``).

    >>> from replistream.operators.entry import SourceBatch
    >>> from replistream.schema import Schema
    >>> sb = SourceBatch(Schema({"x": "i8"}).from_columns({"ts": [1, 3, 4], "x": [0, 0, 0]}), n=4,
    ...                  positions=np.array([0, 2, 3]), rejected=[(1, "null", {"ts": 2})])
    >>> part = source_batch_slice(sb, 1, 3)
    >>> part.n, part.positions.tolist(), part.data["ts"].tolist(), part.rejected
    (2, [1], [3], [(0, 'null', {'ts': 2})])
    """
    from .operators.entry import SourceBatch

    pos = np.arange(len(sb.data)) if sb.positions is None else np.asarray(sb.positions)
    keep = (pos >= lo) & (pos < hi)
    rejected = [(p - lo, why, rec) for p, why, rec in sb.rejected if lo <= p < hi]
    return SourceBatch(sb.data[keep], n=hi - lo, positions=pos[keep] - lo, rejected=rejected)


def _common_length(columns: Mapping) -> int | None:
    """The length every column of a mapping has (arrays, lists, tuples, pandas or Arrow columns);
    None when some column has no length or when lengths differ."""
    n = None
    for v in columns.values():
        if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or not hasattr(v, "__getitem__"):
            return None
        if isinstance(v, np.ndarray) and v.ndim != 1:
            return None
        m = len(v)
        if n is None:
            n = m
        elif m != n:
            return None
    return n


def _is_record(item: Any) -> bool:
    """Whether an item of a source's iterable is one record rather than a chunk: a mapping whose
    ``ts`` is a scalar (a record with a bad value, e.g. a list, is still a record, set aside by the
    entry point), or anything that is no kind of chunk (a tuple, None: a malformed record)."""
    from .operators.entry import SourceBatch

    if isinstance(item, Mapping):
        return not isinstance(item.get(TS), (np.ndarray, list, tuple))
    return not isinstance(item, (np.ndarray, list, Punctuation, Sentinel, ChunkRef, SourceBatch))


def chunk_time(chunk: Any, punctuations: bool = True) -> int | None:
    """The first (smallest) timestamp of a source chunk, in µs; a punctuation's ``p`` (None
    with ``punctuations=False``); None when the chunk has no readable timestamp (a sentinel,
    an empty or malformed chunk). As in :func:`chunk_tmax`, timestamps an entry point sets aside
    (the reserved :data:`~replistream.schema.END` and below the first valid time, not finite, not
    whole) do not count: a malformed record stamped ``END`` must not carry its source's time to
    the end of the stream (a paced replay would send everything after it at once).

    >>> chunk_time({"ts": [30, 10]}), chunk_time([{"ts": 5}, {"x": 1}]), chunk_time(Punctuation(3))
    (10, 5, 3)
    >>> chunk_time(ChunkRef(ref=None, n=3, tmin=10, tmax=42)), chunk_time([{"ts": "late"}])
    (10, None)
    >>> chunk_time([{"ts": END}]), chunk_time({"ts": np.array([END, 7])})
    (None, 7)
    """
    if isinstance(chunk, Punctuation):
        return chunk.p if punctuations else None
    if isinstance(chunk, ChunkRef):
        return int(chunk.tmin) if chunk.n and chunk.tmin is not None else None
    from .operators.entry import SourceBatch

    if isinstance(chunk, SourceBatch):  # (its good rows': those set aside carry no time)
        chunk = chunk.data
    try:
        if isinstance(chunk, np.ndarray):
            return _readable_min(chunk[TS]) if len(chunk) and TS in (chunk.dtype.names or ()) else None
        if isinstance(chunk, Mapping):
            ts = np.asarray(chunk.get(TS, []))
            return _readable_min(ts.ravel()) if ts.size and ts.dtype.kind in "iuf" else None
        if isinstance(chunk, (list, tuple)):
            good = _readable([r.get(TS) for r in chunk if isinstance(r, Mapping)])
            return min(good) if good else None
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _readable_min(ts: np.ndarray) -> int | None:
    """The smallest of the numbers ``ts`` an entry point would read as a timestamp (None if none)."""
    if ts.dtype.kind in "iu":  # (the common case: no per-row Python)
        lo = ts.min()
        if NO_PUNCTUATION < lo and ts.max() < END:
            return int(lo)
        ok = ts[(ts > NO_PUNCTUATION) & (ts < END)]
        return int(ok.min()) if len(ok) else None
    ok = ts[np.isfinite(ts) & (ts > NO_PUNCTUATION) & (ts < END) & (ts == np.floor(ts))]
    return int(ok.min()) if len(ok) else None


def chunk_tmax(chunk: Any) -> int | None:
    """The largest timestamp (or punctuation) in a chunk; :data:`NO_PUNCTUATION` for an empty
    chunk or the final punctuation; None if it cannot be told (a chunk of a kind the feeder cannot
    read). Records without a readable ``ts`` (not a mapping, ``ts`` missing, None, text, not finite,
    beyond int64) are set aside by the entry points and carry no tuple, so they do not count.

    >>> chunk_tmax([{"ts": 5}, {"ts": 9}]), chunk_tmax([{"ts": 5}, {"x": 1}, None]), chunk_tmax(Punctuation(7))
    (9, 5, 7)
    >>> chunk_tmax({"ts": [3, None, 8]}), chunk_tmax([None]) == NO_PUNCTUATION
    (8, True)
    """
    from .operators.entry import SourceBatch

    if isinstance(chunk, SourceBatch):
        chunk = chunk.data
    try:
        if isinstance(chunk, ChunkRef):
            return int(chunk.tmax) if chunk.n and chunk.tmax is not None else NO_PUNCTUATION
        if isinstance(chunk, Punctuation):
            return NO_PUNCTUATION if chunk.p == END else int(chunk.p)
        if isinstance(chunk, np.ndarray):
            return int(chunk[TS].max()) if len(chunk) else NO_PUNCTUATION
        if isinstance(chunk, Mapping):
            ts = chunk.get(TS, [])
            if isinstance(ts, np.ndarray) and ts.ndim == 1 and ts.dtype.kind == "i":  # (a paced piece: no per-row Python)
                ok = ts[(ts > NO_PUNCTUATION) & (ts < END)]
                return int(ok.max()) if len(ok) else NO_PUNCTUATION
            return _readable_max(np.asarray(ts, dtype=object).ravel().tolist())
        if isinstance(chunk, list):
            return _readable_max([r.get(TS) for r in chunk if isinstance(r, Mapping)])
    except (TypeError, ValueError, KeyError, IndexError, OverflowError):
        return None
    return None


def _readable(values: list) -> list[int]:
    """The ``values`` an entry point would read as timestamps (numbers, not bool, finite, whole,
    after the first valid time and before :data:`~replistream.schema.END`), as ints."""
    return [int(v) for v in values if isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_)) and math.isfinite(v) and NO_PUNCTUATION < v < END
            and float(v).is_integer()]


def _readable_max(values: list) -> int:
    """The largest of ``values`` an entry point would read as a timestamp (NO_PUNCTUATION if none)."""
    good = _readable(values)
    return max(good) if good else NO_PUNCTUATION


def needs_stamp(chunk: Any) -> bool:
    """True for records (or columns) without ``ts``: the feeder stamps them with its clock (Hwang §II-B).

    >>> needs_stamp([{"x": 1}]), needs_stamp([{"ts": 1}])
    (True, False)
    """
    if isinstance(chunk, list) and chunk and isinstance(chunk[0], Mapping):
        return all(TS not in r for r in chunk)
    if isinstance(chunk, Mapping):
        return TS not in chunk
    return False


def stamp(chunk: Any, ts: int):
    """``chunk`` with every record's (or the column mapping's) ``ts`` set to ``ts``.

    >>> stamp([{"x": 1}], 7)
    [{'x': 1, 'ts': 7}]
    """
    if isinstance(chunk, Mapping):
        n = len(next(iter(chunk.values()))) if chunk else 0
        return {**chunk, TS: np.full(n, ts, dtype=np.int64)}
    return [{**r, TS: ts} for r in chunk]


# -- the event-time merge ------------------------------------------------------------------

class TimeMerge:
    """Interleave per-source iterators in event-time order: iterating yields ``(t, source, chunk)``,
    and ``(inf, source, None)`` once per source after every chunk of every source.

    ``time(chunk)`` gives a chunk's time (None: the source's previous time, as for a
    :class:`Sentinel`); with ``monotone`` a source's times never go back (a chunk
    earlier than its predecessor keeps the predecessor's place). Ties go to the
    source named first in ``iters``, then keep each source's order. Sources are read
    lazily: each source's next chunk is read only when the merge is asked for its next item
    (so a chunk is yielded before its source's following chunk exists, as a watched
    directory needs), and every source's head must be known to choose; :attr:`first` is the earliest first time over the sources
    (None if no source has a timed chunk), known before anything is taken.

    >>> m = TimeMerge({"a": iter([Punctuation(1), Punctuation(0)]), "b": iter([[{"ts": 1}]])})
    >>> m.first, [(t, s) for t, s, _ in m]
    (1, [(1, 'a'), (1, 'a'), (1, 'b'), (inf, 'a'), (inf, 'b')])
    """

    def __init__(self, iters: Mapping[str, Iterator], time: Callable[[Any], int | None] = chunk_time,
                 monotone: bool = True):
        self.iters = dict(iters)
        self.time = time
        self.monotone = monotone
        self._rank = {s: i for i, s in enumerate(self.iters)}
        self._pos = {s: 0 for s in self.iters}
        self._last: dict[str, float] = {s: -math.inf for s in self.iters}
        self._heap: list = []
        self._due: str | None = None  # the source whose chunk was yielded last, read on the next call
        for s in self.iters:
            self._advance(s)
        firsts = [t for t, end, *_ in self._heap if not end and math.isfinite(t)]
        self.first = min(firsts) if firsts else None

    def _advance(self, src: str) -> None:
        try:
            chunk = next(self.iters[src])
        except StopIteration:
            heapq.heappush(self._heap, (math.inf, 1, self._rank[src], 0, src, None))
            return
        t = self.time(chunk)
        last = self._last[src]
        t = last if t is None else (max(t, last) if self.monotone else t)
        self._last[src] = t
        self._pos[src] += 1
        heapq.heappush(self._heap, (t, 0, self._rank[src], self._pos[src], src, chunk))

    def __iter__(self) -> "TimeMerge":
        return self

    def __next__(self) -> tuple[float, str, Any]:
        if self._due is not None:
            src, self._due = self._due, None
            self._advance(src)
        if not self._heap:
            raise StopIteration
        t, end, _, _, src, chunk = heapq.heappop(self._heap)
        if not end:
            self._due = src
        return t, src, chunk


def source_streams(query: Query, inputs: Mapping[str, Any], strict: bool = False,
                   on_malformed: str = "raise", events: list | None = None
                   ) -> tuple[dict[str, list[Item]], dict[str, EntryLogic]]:
    """Run each source's entry logic over its input; returns the item lists and the entries.

    ``inputs[source]`` is an iterable of chunks (record lists, column mappings,
    structured arrays, Punctuations) or a single structured array / column
    mapping. Sources missing from ``inputs`` are empty. Sentinels are skipped;
    given a list ``events``, each is appended to it as ``(source, position,
    sentinel)``, ``position`` being the number of the source's items before it. A record an entry
    point cannot read raises :class:`~replistream.errors.SchemaError` with ``on_malformed="raise"``
    (its message names the other policy) and is dead-lettered with ``"dead_letter"``.

    >>> from replistream import Query
    >>> q = Query(); _ = q.source("s", {"x": "i8"}).sink("o")
    >>> streams, entries = source_streams(q.build(), {"s": [{"ts": 1, "x": 1}, {"ts": 2}]}, on_malformed="dead_letter")
    >>> entries["s"].dead_letters[0].reason
    "malformed: source 's': record 0 is missing field 'x'"
    """
    unknown = set(inputs) - set(query.sources)
    if unknown:
        raise QueryError(f"inputs given for unknown source(s) {sorted(unknown)}; sources are {query.sources}")
    streams, entries = {}, {}
    for src in query.sources:
        entry = query.build_entry(src, strict, on_malformed)
        items: list[Item] = []
        for chunk in iter_chunks(inputs.get(src, ())):
            if isinstance(chunk, Sentinel):
                if events is not None:
                    events.append((src, len(items), chunk))
                continue  # scripted events only mean something to a deployment or the harness
            try:
                items.extend(entry.push(chunk))
            except SchemaError as e:  # with on_malformed="raise": name the other policy, the deployments' default
                raise SchemaError(f"{e} (on_malformed='dead_letter' sets unreadable records aside with their "
                                  "reason, as deploy() and the simulator do by default)") from e
        items.extend(entry.close())
        streams[src], entries[src] = items, entry
    return streams, entries


# -- scripted events ------------------------------------------------------------------------

class Sentinel:
    """An event placed among a source's input chunks; a deployment's feeder runs it
    when it reaches that point of the input, so failures happen at a known place in
    the stream without sleeping. The reference engine ignores sentinels;
    :func:`run_replicated` runs :class:`KillReplica`, :class:`StopReplica`, :class:`KillServer`,
    :class:`Revive`, :class:`AddReplica` and :class:`Rescale` when the first entry-point copy of
    that source reaches them, takes :class:`Pause` as a no-op and refuses
    :class:`Call` (it has no deployment to call).

    >>> inputs = {"s": [[{"ts": 1, "x": 1}], KillReplica("f", 0), [{"ts": 2, "x": 2}]]}
    """

    def apply(self, deployment) -> None:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Handed(Sentinel):
    """Everything before it on its source has reached every entry replica that answers (a
    deployment's feeder runs a sentinel only then): ``event`` is set. A source that must not
    acknowledge input before it is safe (:class:`~replistream.spark.SparkStreamSource` with a
    checkpoint location) puts one after each micro-batch and waits for it.

    >>> import threading; done = threading.Event(); Handed(done).apply(None); done.is_set()
    True
    """

    event: threading.Event

    def apply(self, deployment) -> None:
        self.event.set()


@dataclass(frozen=True)
class KillReplica(Sentinel):
    """Kill replica ``replica`` of ``operator`` (``"entry"`` for an entry point).

    In :func:`run_replicated` a kill that would leave an operator without a
    working replica is skipped (and listed in ``HarnessStats.spared``).

    >>> inputs = {"s": [[{"ts": 1, "k": 1}], KillReplica("join", 0), [{"ts": 2, "k": 1}]]}
    """

    operator: str
    replica: int

    def apply(self, deployment) -> None:
        deployment.kill_replica(self.operator, self.replica)


@dataclass(frozen=True)
class StopReplica(Sentinel):
    """Stop replica ``replica`` of ``operator`` (``"entry"`` for an entry point) without killing it:
    from then on it is never scheduled again, never crashes and never answers (a suspended VM, a
    swapping host, a process sent SIGSTOP). Its peers must mask it as they mask a crash (Hwang §II:
    the application gets every result as early as the fastest replica delivers it).

    :func:`run_replicated` delivers nothing more to it and schedules it no more; it still counts
    among the live receivers whose acknowledgements trim their senders' retained output (nothing
    tells the engine it stopped), but never as a working replica: no hand-over takes a checkpoint
    from it, and a stop that would leave an operator without a working replica is skipped (and
    listed in ``HarnessStats.spared``). A deployment runs it as
    ``deployment.stop_replica(operator, replica)``.

    >>> from replistream import Query
    >>> from replistream.testing import assert_same_output, run_reference, run_replicated
    >>> q = Query(); s = q.source("s", {"k": "i8"}, punctuate_every=4)
    >>> _ = s.window(size=8, by="k", name="w").sink("out")
    >>> recs = [{"ts": t, "k": t % 3} for t in range(40)]
    >>> data = {"s": recs[:20] + [StopReplica("w", 0)] + recs[20:]}
    >>> rep = run_replicated(q, data, k=2, seed=3)
    >>> rep.stats["harness"].stopped, rep.complete
    (['w#0'], True)
    >>> assert_same_output(run_reference(q, data).outputs["out"], rep.outputs["out"])
    """

    operator: str
    replica: int

    def apply(self, deployment) -> None:
        fn = getattr(deployment, "stop_replica", None)
        if fn is None:
            raise NotImplementedError(f"{type(deployment).__name__} has no stop_replica(); stopped replicas "
                                      f"run in replistream.engines.inprocess.run_replicated")
        fn(self.operator, self.replica)


@dataclass(frozen=True)
class KillServer(Sentinel):
    """Kill every replica on ``server``."""

    server: str

    def apply(self, deployment) -> None:
        deployment.kill_server(self.server)


@dataclass(frozen=True)
class Pause(Sentinel):
    """Pause the feeder for ``seconds``."""

    seconds: float

    def apply(self, deployment) -> None:
        import time

        time.sleep(self.seconds)


@dataclass(frozen=True)
class Call(Sentinel):
    """Call ``fn(deployment)`` (e.g. ``lambda d: d.cut_link("boston", "zurich", 2.0)``)."""

    fn: object

    def apply(self, deployment) -> None:
        self.fn(deployment)


@dataclass(frozen=True)
class Revive(Sentinel):
    """Replace replica ``replica`` of ``operator`` (crashed or running) by a new one
    built by hand-over from a live peer (docs/design.md, decision 7; Hwang §V-C).

    The new replica subscribes to every live upstream replica, which replays its
    retained output (everything since the last punctuation all its live
    downstream replicas acknowledged); ``delay`` harness steps later it takes a
    checkpoint from a live peer (``peer``, or one at random; the replaced replica
    itself only when no other replica works, which makes the event a move),
    installs it, kills the replaced replica if it still runs, and starts
    feeding every downstream replica, first replaying the peer's retained
    output. ``tamper(checkpoint) -> checkpoint`` edits the checkpoint before it
    is installed: for negative controls only. A deployment runs it as
    ``deployment.revive_replica(operator, replica)``.

    ``strategy`` (``"all-at-once"``, ``"batched"`` with ``bins_per_step``, ``"fluid"``;
    Megaphone §3.3, :mod:`replistream.replica.transfer`) moves the checkpoint in steps of
    ``2**bits`` bins (default ``checkpoint_bits`` of the run, or 3), each taken by
    the peer at one of its punctuations while it keeps running, into a
    :class:`~replistream.engine.StagedReplica`; if the peer dies mid-transfer, the
    remaining steps come from another working replica. ``tamper`` then edits
    every step's checkpoint. In a deployment the feeder runs the sentinel and
    waits for it, so no punctuation comes meanwhile and each step is taken when
    the coordinator stops waiting for one (0.5 s); to move state while input
    flows, call ``deployment.move_replica`` (or ``revive_replica``) from a thread,
    as ``tests/ray/test_transfer_runtime.py`` does.

    >>> from replistream import Query
    >>> from replistream.testing import assert_same_output, chunked, run_reference, run_replicated
    >>> q = Query(); s = q.source("s", {"k": "i8"}, punctuate_every=4)
    >>> _ = s.window(size=8, by="k", name="w").sink("out")
    >>> recs = [{"ts": t, "k": t % 3} for t in range(40)]
    >>> data = {"s": chunked(recs[:20], 5) + [Revive("w", 0)] + chunked(recs[20:], 5)}
    >>> rep = run_replicated(q, data, k=2, seed=3, audit=True)
    >>> assert_same_output(run_reference(q, data).outputs["out"], rep.outputs["out"])
    >>> [h["node"] for h in rep.stats["harness"].handovers]
    ['w']
    """

    operator: str
    replica: int
    peer: int | None = None
    delay: int = 0
    tamper: Callable | None = None
    strategy: str | None = None
    bins_per_step: int | None = None
    bits: int | None = None

    def apply(self, deployment) -> None:
        _deployment_call(deployment, "revive_replica", self, self.operator, self.replica)


@dataclass(frozen=True)
class AddReplica(Sentinel):
    """Add a replica of ``operator`` by hand-over from a live peer, as :class:`Revive`
    does, without replacing one (a deployment: ``deployment.add_replica(operator)``).

    >>> AddReplica("join", peer=1).peer
    1
    """

    operator: str
    peer: int | None = None
    delay: int = 0
    tamper: Callable | None = None
    strategy: str | None = None
    bins_per_step: int | None = None
    bits: int | None = None

    def apply(self, deployment) -> None:
        _deployment_call(deployment, "add_replica", self, self.operator)


@dataclass(frozen=True)
class Rescale(Sentinel):
    """Change the number of partitions of the partitioned ``operator`` to ``p`` while the stream
    runs (issue #41; Megaphone, Hoffmann et al. 2019, §3.3): the bins that change owner between
    the balanced maps of the old and new number of partitions move, at logical times from ``T0``
    on (the largest timestamp routed to ``operator`` so far), in steps: ``"all-at-once"`` (one
    step per pair of partitions at ``T0``), ``"batched"`` (``bins_per_step`` bins per step, by default about 16 steps) or
    ``"fluid"`` (one bin per step), step ``i`` at ``T0 + i * gap`` (``gap``: event time, 1 ms by
    default). More partitions start new ones; fewer retire the last ones once they gave their bins.

    :func:`run_replicated` runs it (:mod:`replistream.engines.inprocess_rescale`); the operator
    must be deployed partitioned (``parallelism={operator: p}``, 1 included). A deployment on Ray
    rescales with ``deployment.rescale(operator, p, strategy=...)`` called from a thread while the
    feed goes on (the call waits for the steps, which need the feed): its feeder does not run this
    sentinel (:meth:`apply` says so).

    >>> from replistream import Query
    >>> from replistream.testing import assert_same_output, chunked, run_reference, run_replicated
    >>> q = Query(); s = q.source("s", {"k": "i8"}, punctuate_every=4)
    >>> _ = s.window(size=8, by="k", name="w").sink("out")
    >>> recs = [{"ts": t, "k": t % 5} for t in range(60)]
    >>> data = {"s": chunked(recs[:20], 5) + [Rescale("w", 2, gap=2)] + chunked(recs[20:], 5)}
    >>> rep = run_replicated(q, data, k=2, seed=3, parallelism={"w": 1}, bits=3)
    >>> assert_same_output(run_reference(q, data).outputs["out"], rep.outputs["out"])
    >>> [(r["from"], r["to"], r["steps"]) for r in rep.stats["harness"].rescales]
    [(1, 2, 4)]
    """

    operator: str
    p: int
    strategy: str = "fluid"
    bins_per_step: int | None = None
    gap: int = 1_000

    def apply(self, deployment) -> None:
        raise NotImplementedError(
            f"{type(deployment).__name__}: a Rescale sentinel runs in replistream.engines.inprocess.run_replicated "
            f"only; on a deployment call deployment.rescale({self.operator!r}, {self.p}, "
            f"strategy={self.strategy!r}) from a thread while the feed goes on")


class inject_at:
    """Wrap a source's input so ``events`` (sentinels) fire just before the first chunk with ``ts >= at``.

    The feeder applies a sentinel only after every earlier chunk has reached
    the entry points, so the failure lands at a known point of the stream
    whatever the machine's speed. Works with any input the feeder takes,
    including sources with ``bind`` (e.g. :class:`replistream.spark.SparkSource`,
    whose chunks carry ``tmin``); if no chunk reaches ``at`` the events fire at the end.

    >>> chunks = [[{"ts": 1}], [{"ts": 5}], [{"ts": 9}]]
    >>> [c if isinstance(c, Sentinel) else c[0]["ts"] for c in inject_at(chunks, 5, Pause(0))]
    [1, Pause(seconds=0), 5, 9]
    """

    def __init__(self, source: Any, at: int, *events: Sentinel):
        if not events or not all(isinstance(e, Sentinel) for e in events):
            raise ValueError("inject_at needs one or more Sentinel events (KillServer, KillReplica, Call, ...)")
        self.source = source
        self.at = at
        self.events = events

    def bind(self, name: str, schema) -> None:
        if hasattr(self.source, "bind"):
            self.source.bind(name, schema)

    def __iter__(self):
        fired = False
        for chunk in self.source:
            t = None if fired or isinstance(chunk, Punctuation) else chunk_time(chunk)
            if not fired and t is not None and t >= self.at:
                fired = True
                yield from self.events
            yield chunk
        if not fired:
            yield from self.events


def _deployment_call(deployment, method: str, event: Revive | AddReplica, *args) -> None:
    """``deployment.method(*args)``, with the event's transfer strategy when it names one."""
    fn = getattr(deployment, method, None)
    if fn is None:
        raise NotImplementedError(f"{type(deployment).__name__} has no {method}(); hand-over of replicas "
                                  f"runs in replistream.engines.inprocess.run_replicated")
    if event.strategy is None:
        fn(*args)
    else:
        fn(*args, strategy=event.strategy, bins_per_step=event.bins_per_step, bits=event.bits)
