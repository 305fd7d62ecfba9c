"""The feeder: the driver-side thread that hands the sources' input to the entry replicas
(Hwang §II-B).

It reads every source lazily (:func:`~replistream.sources.iter_chunks`), merges
them in event-time order (:class:`~replistream.sources.TimeMerge`), and sends
each chunk to **every** running entry replica (so each input tuple is held at k
entry points; a dormant entry replica is fed too: its input cannot be replayed
later). With a pace it releases a chunk at its first timestamp mapped to wall
time (:func:`~replistream.sources.chunk_time`); records without ``ts`` are
stamped with its clock (:func:`~replistream.sources.stamp`), one clock for every
entry replica. A chunk already in Ray's object store
(:class:`~replistream.sources.ChunkRef`) goes by reference: the rows never pass
through the driver. The feeder goes on as soon as the fastest entry replica has
room (at most 32 chunks in flight); a slower one may lag up to 256 chunks, and one
the failure detector suspects (``suspected``) is never waited on: its calls stay
queued and it catches up from the object store, or it is declared failed. Once a
suspected replica has :attr:`Feeder.max_lag` calls queued, the feeder stops sending
to it and its peers keep the raw chunks it misses (``keep_from``); when it answers
again it takes them from a peer in one call (:meth:`~.actors.EntryActor.catch_up`,
Hwang §III: entry points hold input for their peers) and is fed from then on. An
entry replica whose call fails is reported (``on_entry_failed``) and skipped.

With entry partitions (``parallelism={"entry": p}``, issue #41) the entry replicas are
``p`` groups ``entry.P`` of ``k`` copies, and the feeder hands each chunk of a source to one
group only (:class:`~replistream.operators.entry.EntrySplit`, which decides by the chunk's place
in the feed), with the state an unpartitioned entry point would be in before it; the other
groups get a progress note (the new punctuation) when it rises; the end goes to every group.
Chunk numbers, backpressure, skipping, ``keep_from`` and catching up from a peer then work per
group: a replica catches up from a copy of its own partition. A feed resumed after its host was
lost (:mod:`.lifecycle`) cuts and routes the input again from its start (a paced feed's pieces
anew) and sends only the records no partition took, known from the ranges each partition's
furthest replica remembers (:meth:`Feeder._taken`), each to a partition that has not passed it
(:meth:`Feeder._destination`); a feed with idle timeouts is refused, saying so.

With idle timeouts (``idle``: ``{source: seconds}``) the sources are merged by
:class:`~replistream.idle.IdleMerge` instead: a source with nothing to send for its
timeout no longer holds the others back, and gets heartbeat punctuations (logged
in :attr:`Feeder.heartbeats`), sent to every entry replica like any chunk.

A :class:`~replistream.sources.Sentinel` among a source's chunks runs
(``on_sentinel``) once everything before it has reached the entry points, and
with no lock held.

Changes at logical times (docs/design.md, decision 8) need a marker placed after
everything fed so far: while :meth:`Feeder.held` is held no chunk is sent,
:meth:`Feeder.marker_time` is the largest timestamp or punctuation sent, and
:meth:`Feeder.send_marker` puts a marker on every source that has not ended.

>>> feeder = Feeder(topology, on_start=print, on_sentinel=print, on_entry_failed=print)   # doctest: +SKIP
>>> feeder.start(["s"], {"s": [[{"ts": 1, "x": 1}]]}, pace=None, chunk_size=100, t0=time.time())  # doctest: +SKIP
"""
from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import ray

from . import lockorder
from ...operators.base import NO_PUNCTUATION
from ...partition import partition_label
from ...plan import ENTRY, label_group
from ...schema import END, Punctuation
from ...idle import Heartbeat, IdleMerge
from ...sources import (AdaptiveCut, ChunkRef, Sentinel, TimeMerge, chunk_tmax, iter_chunks, paced_pieces, release_rule,
                        needs_stamp, stamp)
from .common import is_actor_death
from .topology import Topology

__all__ = ["Feeder", "MAX_INFLIGHT_CHUNKS", "MAX_LAG_CHUNKS", "KEEP_CHUNKS", "INLINE_CHUNK_BYTES", "chunk_rows", "inline_chunk",
           "skip_rows"]

#: Chunks in flight to the fastest entry replica before the feeder waits.
MAX_INFLIGHT_CHUNKS = 32

#: Chunks a slower entry replica (not suspected) may have in flight before the feeder waits for it:
#: a replica that is merely slower is waited for at this distance; one that stops answering is
#: suspected by the failure detector and then never waited on.
MAX_LAG_CHUNKS = 8 * MAX_INFLIGHT_CHUNKS

#: Raw chunks every entry replica keeps for its peers even when none lacks any: an entry replica
#: that was sent fewer chunks than its peers when the feeder was lost (its process, or the host that
#: ran it) takes those from a peer when the feed resumes (:mod:`.lifecycle`).
KEEP_CHUNKS = 8


#: A chunk at most this large (bytes, estimated) travels inlined in each entry replica's call
#: instead of through the object store (a put and a fetch per chunk: milliseconds per paced piece).
INLINE_CHUNK_BYTES = 256 * 1024


def inline_chunk(chunk) -> bool:
    """True if ``chunk`` is small enough to travel inlined in each call (:data:`INLINE_CHUNK_BYTES`):
    a structured array or a mapping of numpy columns by their bytes, a list of records by its
    length (up to 1,000); anything else goes through the object store.

    >>> inline_chunk({"ts": np.arange(1_000)}), inline_chunk(np.zeros(1_000_000)), inline_chunk([{"ts": 1}])
    (True, False, True)
    """
    if isinstance(chunk, np.ndarray):
        return chunk.nbytes <= INLINE_CHUNK_BYTES
    if isinstance(chunk, Mapping):
        cols = list(chunk.values())
        return all(isinstance(c, np.ndarray) for c in cols) and sum(c.nbytes for c in cols) <= INLINE_CHUNK_BYTES
    if isinstance(chunk, list):
        return len(chunk) <= 1_000
    return False


def chunk_rows(chunk) -> int:
    """Input records in ``chunk`` (what an entry point counts: its id counter), 0 for what carries
    none (a punctuation, a sentinel, a marker, the end).

    >>> chunk_rows([{"ts": 1}, {"ts": 2}]), chunk_rows(np.zeros(3, dtype=[("ts", "i8")])), chunk_rows(None)
    (2, 3, 0)
    """
    if chunk is None:
        return 0
    if isinstance(chunk, ChunkRef):
        return int(chunk.n)
    n = getattr(chunk, "n", None)  # a SourceBatch
    if isinstance(n, (int, np.integer)) and not isinstance(chunk, np.ndarray):
        return int(n)
    if isinstance(chunk, np.ndarray):
        return len(chunk)
    if isinstance(chunk, list):
        return len(chunk)
    if isinstance(chunk, Mapping):
        lengths = {len(v) for v in chunk.values() if hasattr(v, "__len__")}
        return lengths.pop() if len(lengths) == 1 else 0
    return 0


def _tail(chunk, start: int):
    """``chunk`` without its first ``start`` rows."""
    return _slice(chunk, start, chunk_rows(chunk))


def _slice(chunk, lo: int, hi: int):
    """Records ``lo`` .. ``hi - 1`` of ``chunk`` (by place, rejected records included: what an entry
    point's id counter counts).

    >>> _slice([{"ts": 1}, {"ts": 2}, {"ts": 3}], 1, 3), _slice({"ts": np.arange(4)}, 0, 2)["ts"].tolist()
    ([{'ts': 2}, {'ts': 3}], [0, 1])
    """
    from ...operators.entry import SourceBatch
    from ...sources import source_batch_slice

    if isinstance(chunk, SourceBatch):
        return source_batch_slice(chunk, lo, hi)
    if isinstance(chunk, (np.ndarray, list)):
        return chunk[lo:hi]
    if isinstance(chunk, Mapping):
        return {k: v[lo:hi] for k, v in chunk.items()}
    raise RuntimeError(f"the feed cannot resume inside a chunk of type {type(chunk).__name__} (its rows "
                       f"{lo}..{hi} are to be sent apart from the others): the chunk cannot be cut")


#: How long a paced feeder waits for a chunk a reading task put in the object store.
FETCH_TIMEOUT_S = 60.0


def fetched(chunks: Iterator) -> Iterator:
    """``chunks`` with each :class:`~replistream.sources.ChunkRef` (rows a Ray task read from a
    file into the object store) fetched here, so a paced replay cuts it into pieces of
    ``chunk_ms`` like any other chunk. Unfetched, a file's chunk (10,000 rows by default: half a
    second at 20,000 events/s) left whole at its last row's time, and every window closing
    inside it waited for it (issue #42: a paced keyed count read from files had its results
    half a second late). A chunk not fetched within :data:`FETCH_TIMEOUT_S` fails the feed,
    naming it.

    >>> next(fetched(iter([[{"ts": 1}]])))
    [{'ts': 1}]
    """
    import ray

    for c in chunks:
        if isinstance(c, ChunkRef):
            try:
                c = ray.get(c.ref, timeout=FETCH_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(f"the feeder could not fetch a chunk of {c.n} rows (ts {c.tmin}..{c.tmax}) "
                                   f"read from a file within {FETCH_TIMEOUT_S:g} s") from None
        yield c


def skip_rows(chunks: Iterator, rows: int) -> Iterator:
    """``chunks`` without their first ``rows`` records (a chunk straddling the point is cut);
    punctuations, sentinels and the end pass (a punctuation sent twice changes nothing; sentinels
    are counted apart).

    >>> [len(c) for c in skip_rows(iter([[1, 2], [3, 4, 5], [6]]), 3)]
    [2, 1]
    """
    left = int(rows)
    for c in chunks:
        if left > 0 and not isinstance(c, Sentinel):
            n = chunk_rows(c)
            if n:
                if n <= left:
                    left -= n
                    continue
                c, left = _tail(c, left), 0
        yield c


def _past_gate(chunk, hi: int | None, gate: int) -> bool:
    """True if an item the feeder is about to send lies past a change's time ``gate``: a source's
    end (``chunk`` None) or the final punctuation, a chunk whose largest timestamp cannot be told
    (``hi`` None) or is above ``gate``. An empty chunk or one of records the entry points set
    aside (:data:`NO_PUNCTUATION`) carries no tuple and is not.

    >>> _past_gate([{"ts": 5}], 5, 5), _past_gate([{"ts": 6}], 6, 5), _past_gate(None, None, 5)
    (False, True, True)
    >>> _past_gate(Punctuation(END), NO_PUNCTUATION, 5), _past_gate([], NO_PUNCTUATION, 5)
    (True, False)
    """
    if chunk is None or (isinstance(chunk, Punctuation) and chunk.p == END):
        return True
    if hi is None:
        return True
    return hi != NO_PUNCTUATION and hi > gate


class Feeder:
    """Feeds the sources to the running entry replicas of ``topology`` (see the module doc).

    Hooks, each called from the feeder thread: ``on_start(ts0)`` once the sources'
    earliest timestamp ``ts0`` is known, before the first chunk (with a pace, :attr:`t0` has
    then moved to that moment if reading the first chunks took longer than ``t0`` was ahead); ``on_sentinel(sentinel)``
    for each sentinel; ``on_entry_failed(label, reason)`` when an entry replica's call fails.

    State (``lock`` guards every field the feeder changes while it runs): ``seqs``
    (next chunk number per source), ``open_sources`` (not ended yet), ``max_fed``
    (largest timestamp or punctuation sent; None: nothing yet), ``tmax_unknown`` (some
    chunk's largest timestamp could not be read), ``feeding`` (between ``on_start`` and
    the end of the input), ``fed`` (``(seconds since t0, source, chunk number)`` per chunk
    sent), ``error`` (what stopped the thread), ``done_wall`` (wall time it sent its last
    chunk; input delays stop growing then).
    """

    def __init__(self, topology: Topology, on_start: Callable[[float], None],
                 on_sentinel: Callable[[Sentinel], None], on_entry_failed: Callable[[str, str], None],
                 suspected: Callable[[str], bool] | None = None, entry_partitions: int = 1,
                 entry_of: Callable[[str], Any] | None = None):
        self.topology = topology
        #: the entry partitions (1: every entry replica takes every chunk) and, with more, a fresh
        #: entry logic per source for each source's :class:`~replistream.operators.entry.EntrySplit`
        self.entry_partitions = int(entry_partitions)
        self.entry_of = entry_of
        self.splits: dict[str, Any] = {}
        #: with entry partitions: per partition, the next chunk number of each source it is sent
        self.part_seqs: list[dict[str, int]] = []
        self.suspected = suspected or (lambda label: False)
        self.on_start = on_start
        self.on_sentinel = on_sentinel
        self.on_entry_failed = on_entry_failed
        self.lock = lockorder.rlock("Feeder.lock", 2)
        #: While a change is placed with :meth:`gated`: the time ``T0`` past which nothing is sent
        #: (None: no gate); the feed thread waits on :attr:`_gate_cv` at an item past it.
        self.gate: int | None = None
        self._gate_cv = lockorder.condition(self.lock)
        #: How long the feed thread waited at gates so far (seconds), and how many times.
        self.gate_waits: list[float] = []
        self.pace: float | None = None
        self.sources: list[str] = []
        self.seqs: dict[str, int] = {}
        self.open_sources: set[str] = set()
        self.inflight: dict[str, list] = {}
        #: ``{call: (source, chunk number)}`` of each push in :attr:`inflight` (a replica skipped with
        #: pushes still queued lacks from the first of them: its peers keep that far back).
        self.pushed: dict = {}
        self.max_fed: int | None = None
        self.tmax_unknown = False
        self.feeding = False
        self.fed: list[tuple[float, str, int]] = []
        self.error: BaseException | None = None
        self.done_wall: float | None = None
        self.t0 = time.time()
        self.thread: threading.Thread | None = None
        #: Set once every chunk was sent and every call of a replica not suspected has returned
        #: (a skipped replica may still catch up after it, in the same thread).
        self.fed_all = threading.Event()
        self.merge: IdleMerge | None = None
        self.idle: dict[str, float] = {}
        self.disorder: dict[str, int] = {}
        self.chunk_ms: float | None = None
        self.punct: dict[str, Callable] = {}  # per source, its window ends' rule (a paced piece ends where it rises)
        self.every: dict[str, tuple[int, int]] = {}  # per source, (grid, max_disorder) of the punctuations that release results
        self.cut: AdaptiveCut | None = None  # the paced replay's batch size (see AdaptiveCut)
        #: Calls a suspected entry replica may have queued before the feeder stops sending to it.
        self.max_lag = MAX_LAG_CHUNKS
        #: Entry replicas not sent to: ``{label: {source: first chunk it lacks}}``; and those
        #: catching up from a peer: ``{label: (the call's ref, what it lacked)}``.
        self.skipped: dict[str, dict[str, int]] = {}
        self.catching: dict[str, tuple[Any, dict[str, int]]] = {}
        #: ``(seconds since t0, label, event)`` each time a replica was skipped or caught up.
        self.skips: list[tuple[float, str, str]] = []
        #: Sentinels run so far per source (counted before each runs: a resumed feed skips them).
        self.sentinels_run: dict[str, int] = {}
        self.resumed: dict | None = None
        #: after a restore with entry partitions: per partition, ``{source: (rows, closed)}`` of its
        #: furthest replica, per source the records some partition took (not sent again:
        #: :class:`~replistream.operators.entry.TakenRows`), per partition where it stands as the
        #: resumed feed sends it more, and the sources sent anything since
        self.part_skip: list[dict[str, tuple[int, bool]]] | None = None
        self.part_taken: dict | None = None
        self.part_pos: list[dict[str, int]] | None = None
        self.part_punct: list[dict[str, int]] | None = None
        self.sent_since_resume: set[str] = set()

    @property
    def heartbeats(self) -> list[Heartbeat]:
        """The heartbeat punctuations put on idle sources so far (empty without idle timeouts)."""
        merge = self.merge
        return list(merge.heartbeats) if merge is not None else []

    # -- running ---------------------------------------------------------------------------
    def start(self, sources: list[str], inputs: Mapping[str, Any], pace: float | None, chunk_size: int,
              t0: float, idle: Mapping[str, float] | None = None, disorder: Mapping[str, int] | None = None,
              chunk_ms: float | None = None, resume: dict | None = None,
              punct: Mapping[str, Callable] | None = None, every: Mapping[str, tuple[int, int]] | None = None) -> None:
        """Feed ``inputs`` (``{source: input}``, sources in ``sources`` order) in a background
        thread; ``t0`` is the run's start (wall time), ``pace`` event seconds per second (None:
        as fast as the entry points take it; paced, each chunk is cut to span at most ``chunk_ms``
        of wall time, :func:`~replistream.sources.cut_by_time`, each piece ending at a row that
        raises its source's rule in ``punct`` (``{source: rule}``, the window ends downstream:
        :func:`~replistream.sources.window_close_rule`) or, for a source in ``every`` (``{source: (grid,
        max_disorder)}``: an operator downstream acts on each of its punctuations), a punctuation on
        that grid at most once per piece's span (:func:`~replistream.sources.release_rule`), and
        leaving at its last row's time); ``idle`` the idle timeouts (``{source: seconds}``)
        and ``disorder`` each source's ``max_disorder`` (see :mod:`replistream.idle`).

        ``resume`` (a restored control plane, :mod:`.lifecycle`): ``{"at": {source: {"seq", "rows",
        "closed"}}, "behind": {entry label: {source: its next chunk}}, "ts0", "markers": [(source,
        marker)]}``: the markers of a change no entry replica got are sent first; each source
        goes on at chunk ``seq`` without its first ``rows`` records (and without the sentinels
        already run, :attr:`sentinels_run`), a closed one is not sent again, the entry replicas
        ``behind`` catch up from a peer first, and the clock (``t0``, ``ts0``) is the one the run
        started with. With entry partitions ``resume["parts"]`` (``[{source: {"seq", "rows",
        "closed", "taken", "complete"}}]``, per partition its furthest replica's) replaces the skip
        by ``rows``: the input is cut and routed again from its start (cut anew: a paced feed's
        pieces need not fall where the lost host's did), the records no partition took are sent
        (:meth:`_taken`, :meth:`_destination`) and partition ``P`` goes on at chunk ``seq``."""
        self.resumed = resume
        self.t0 = t0
        self.pace = pace
        self.done_wall = None
        self.fed_all.clear()
        self.idle = dict(idle or {})
        self.chunk_ms = chunk_ms
        self.punct = dict(punct or {})
        self.every = dict(every or {})
        self.disorder = dict(disorder or {})
        self.thread = threading.Thread(target=self._run, args=(list(sources), dict(inputs), pace, chunk_size),
                                       daemon=True, name="replistream-feeder")
        self.thread.start()

    def _split(self, sources: list[str], parts: list[dict] | None) -> None:
        """Set up the cut of each source between the entry partitions (:class:`EntrySplit
        <replistream.operators.entry.EntrySplit>`), fresh or, with ``parts`` (``resume["parts"]``,
        see :meth:`start`), resumed: the split is replayed from each source's first chunk, each
        partition's chunks numbered on from its own position, and nothing some partition took
        before the host was lost is sent again (:meth:`_taken`)."""
        from ...operators.entry import EntrySplit, TakenRows

        self.splits = {s: EntrySplit(self.entry_of(s), self.entry_partitions, offset=i) for i, s in enumerate(sources)}
        self.part_seqs = [{s: 0 if parts is None else int(parts[i][s]["seq"]) for s in sources}
                          for i in range(self.entry_partitions)]
        self.part_skip = None if parts is None else [
            {s: (int(parts[i][s]["rows"]), bool(parts[i][s]["closed"])) for s in sources}
            for i in range(self.entry_partitions)]
        self.part_taken = None if parts is None else {
            s: TakenRows.of([parts[i][s] for i in range(self.entry_partitions)]) for s in sources}
        self.part_pos = None if parts is None else [{s: sk[0] for s, sk in skip.items()} for skip in self.part_skip]
        self.part_punct = None if parts is None else [
            {s: int(END if parts[i][s].get("punct") is None else parts[i][s]["punct"]) for s in sources}
            for i in range(self.entry_partitions)]
        self.sent_since_resume = set()

    @property
    def started(self) -> bool:
        """True once :meth:`start` was called."""
        return self.thread is not None

    def _run(self, sources, inputs, pace, chunk_size) -> None:
        try:
            self._feed(sources, inputs, pace, chunk_size)
        except BaseException as e:  # surfaced by Deployment.wait()
            self.error = e
        finally:
            self.fed_all.set()
            if self.merge is not None:
                self.merge.close()

    def _feed(self, sources: list[str], inputs, pace, chunk_size) -> None:
        iters: dict[str, Iterator] = {s: iter(iter_chunks(inputs.get(s, ()), chunk_size)) for s in sources}
        if pace is not None and self.chunk_ms:  # chunks read by Ray tasks (files) come here to be cut too
            iters = {s: fetched(it) for s, it in iters.items()}
        resume = self.resumed
        parts = None if resume is None else resume.get("parts")  # a partitioned feed resumed
        if parts is not None:
            self._refuse_unrepeatable_heartbeats()
        elif resume is not None:
            iters = {s: skip_rows(it, resume["at"][s]["rows"]) for s, it in iters.items()}
        cut = None
        if pace is not None and self.chunk_ms:  # a paced chunk in pieces of at most chunk_ms of wall time,
            # each sent at its last row's time (no row leaves before its time) and ended by a row that
            # lets a window close (which so leaves at its own time: windows close unbatched).
            # k entry replicas each call k downstream replicas per piece: a piece spans k x chunk_ms
            # to begin with, so each replica gets as many calls per second as at k = 1; more while
            # the deployment falls behind
            k = max(1, len(self.topology.running(ENTRY)) // max(1, self.entry_partitions))
            cut = self.cut = AdaptiveCut(self.chunk_ms * k)
            rules = dict(self.punct)
            for s, (grid, d) in self.every.items():  # (punctuations that release results, one per span)
                rules[s] = release_rule(grid, d, cut.span_us(pace), also=rules.get(s))
            iters = {s: paced_pieces(it, lambda: cut.span_us(pace), rules.get(s)) for s, it in iters.items()}
        with self.lock:
            self.sources = list(sources)
            self.seqs = {s: 0 if resume is None or parts is not None else resume["at"][s]["seq"] for s in sources}
            if self.entry_partitions > 1:
                if resume is not None and parts is None:
                    raise RuntimeError(f"the host of this detached deployment was lost while it fed "
                                       f"{self.entry_partitions} entry partitions, and the restored feeder was not "
                                       f"told where each partition stands: the feed cannot resume")
                self._split(sources, parts)
            closed = set() if resume is None else {s for s in sources if resume["at"][s]["closed"]}
            self.open_sources = set(sources) - closed
            self.inflight = {label: [] for label, _ in self.topology.running(ENTRY)}
            self.pushed = {}
            self.max_fed, self.tmax_unknown = None, False
            if resume is not None:  # behind its peers: it takes what it lacks from them before its next chunk
                for label, missed in resume["behind"].items():
                    if self.topology.is_running(label):
                        self.skipped[label] = dict(missed)
                        self.skips.append((time.time() - self.t0, label, "behind after a restore"))
        skip_sentinels = {s: self.sentinels_run.get(s, 0) for s in sources}
        if self.idle:  # quiet sources do not hold the others back; they get heartbeats
            merge = self.merge = IdleMerge(iters, self.idle, self.disorder)
        else:
            merge = TimeMerge(iters)  # the sources in event-time order (a sentinel keeps its source's time)
        ts0 = float(merge.first) if merge.first is not None else 0.0
        if resume is not None and resume.get("ts0") is not None:
            ts0 = float(resume["ts0"])  # the run's clock, not the rest of the input's (a lost host
            # that kept "fed" before its feeder knew the clock sent nothing under one: a fresh start)
        elif pace is not None:  # paced from when the first chunks are there (a Spark job, a file), not from feed()
            self.t0 = max(self.t0, time.time())
            if self.merge is not None:  # heartbeats follow the replay's clock too
                self.merge.now_ts = lambda: ts0 + (time.time() - self.t0) * 1e6 * pace
        self.on_start(ts0)
        self.feeding = True
        if resume is not None and pace is not None and self.merge is not None:
            self.merge.now_ts = lambda: ts0 + (time.time() - self.t0) * 1e6 * pace
        for src, marker in (resume or {}).get("markers", ()):  # a change the lost host had begun to send
            with self.lock:
                self._send(src, marker)
        for t, src, chunk in merge:
            if isinstance(chunk, Sentinel):
                if skip_sentinels.get(src, 0) > 0:  # run before the restore
                    skip_sentinels[src] -= 1
                    continue
                self._settle(0, 0)  # everything before the event has reached the entry points
                self.sentinels_run[src] = self.sentinels_run.get(src, 0) + 1
                self.on_sentinel(chunk)
                continue
            if chunk is None and src not in self.open_sources:
                continue  # ended before the restore
            hi = chunk_tmax(chunk) if chunk is not None else None  # (once: its release time and max_fed)
            if cut is not None and chunk is not None and math.isfinite(t):  # a piece leaves at its last row's time
                t = max(t, hi) if hi is not None and hi != NO_PUNCTUATION else t
            if pace is not None and chunk is not None and math.isfinite(t) and t < END:
                # (a chunk starting at END holds only records the entry points set aside: no wait)
                delay = early = self.t0 + (t - ts0) / (1e6 * pace) - time.time()
                while delay > 0:  # in slices: a timestamp years ahead must not overflow sleep()
                    time.sleep(min(delay, 1.0))
                    delay = self.t0 + (t - ts0) / (1e6 * pace) - time.time()
                delay = early
                if cut is not None:
                    cut.sent(-delay)
            if chunk is not None and needs_stamp(chunk):
                if self.part_skip is not None:
                    raise RuntimeError(f"the host of this detached deployment was lost while it fed entry "
                                       f"partitions, and source {src!r} has records without 'ts' (stamped by the "
                                       f"lost host's clock): the feed cannot be cut again the same way; give a "
                                       f"'ts' column for a detached deployment with entry partitions")
                chunk = stamp(chunk, int((time.time() - self.t0) * 1e6))
                hi = chunk_tmax(chunk)
            with self.lock:
                self._wait_gate(src, chunk, hi)
                self._send(src, chunk)
                if chunk is None:
                    self.open_sources.discard(src)
                else:
                    if hi is None:
                        self.tmax_unknown = True
                    elif self.max_fed is None or hi > self.max_fed:
                        self.max_fed = hi
        self.feeding = False
        self._settle(0, 0)
        self.done_wall = time.time()
        self.fed_all.set()
        while True:  # a replica skipped while silent catches up when it answers (or is declared failed)
            with self.lock:
                self._resume()
                left = [lb for lb in [*self.skipped, *self.catching] if self.topology.is_running(lb)]
            if not left:
                return
            self._settle(0, 0)
            time.sleep(0.1)

    def _send(self, src: str, chunk) -> None:
        """Send the next chunk of ``src`` (None: its end) to every running entry replica, or with
        entry partitions to those of the partition it goes to (progress notes and the end to the
        others: :class:`~replistream.operators.entry.EntrySplit`) (under the lock)."""
        seq = self.seqs[src]
        self.fed.append((time.time() - self.t0, src, seq))
        if not self.splits:
            self._send_to(ENTRY, src, seq, chunk, None)
        else:
            for piece in self._untaken_apart(src, chunk):
                for part, item, start in self.splits[src].route(piece):
                    if self.part_skip is not None:
                        if self._taken(part, src, item, start):
                            continue  # a partition took it before its host was lost
                        part = self._destination(part, src, item, start)
                    self.sent_since_resume.add(src)
                    pseq = self.part_seqs[part][src]
                    self._send_to(partition_label(ENTRY, part), src, pseq, item, start)
                    self.part_seqs[part][src] = pseq + 1
        self.seqs[src] = seq + 1
        self._settle(MAX_INFLIGHT_CHUNKS, MAX_LAG_CHUNKS)

    def _untaken_apart(self, src: str, chunk) -> list:
        """After a restore with entry partitions: ``chunk`` cut where records some partition took
        before the host was lost meet records none took (:meth:`TakenRows.segments
        <replistream.operators.entry.TakenRows.segments>`), so that each piece is either sent
        whole or not at all; otherwise ``[chunk]``. A chunk whose rows are not here
        (:class:`~replistream.sources.ChunkRef`, read by a Ray task and sent by reference) cannot be
        cut: the resumed feed cuts such chunks as the lost host did (by ``chunk_size`` and the
        readings), so none straddles."""
        n = chunk_rows(chunk) if self.part_skip is not None else 0
        if n == 0:
            return [chunk]
        a = int(self.splits[src].shadow.seq)
        segments = self.part_taken[src].segments(a, a + n)
        if len(segments) <= 1 or isinstance(chunk, ChunkRef):
            return [chunk]
        return [_slice(chunk, lo - a, hi - a) for lo, hi, _ in segments]

    def _taken(self, part: int, src: str, item, start) -> bool:
        """After a restore, with entry partitions: True if ``item`` (of ``src``, routed to entry
        partition ``part`` from position ``start``) need not be sent. A chunk of records was taken
        if some partition took its records before the host was lost (:class:`TakenRows
        <replistream.operators.entry.TakenRows>`: the resumed feed need not cut the input as the lost
        host did); a punctuation or an end was taken if the partition stands past that point (one
        sent again changes nothing); everything was taken once the partition took the source's
        end."""
        rows, closed = self.part_skip[part][src]
        if closed:
            return True
        if start is not None:  # a chunk of records, from its place in the source
            lo, hi = int(start.seq), int(start.seq) + chunk_rows(item)
            segments = self.part_taken[src].segments(lo, hi)
            if len(segments) > 1:
                raise RuntimeError(f"the resumed feed of source {src!r} cannot cut a chunk of rows {lo}..{hi} "
                                   f"read by a Ray task where the rows entry partitions took before the host was "
                                   f"lost end ({segments}): it was cut differently than the lost host did")
            return bool(segments and segments[0][2])
        return self.splits[src].shadow.seq < self.part_pos[part][src]

    def _destination(self, part: int, src: str, item, start) -> int:
        """After a restore, with entry partitions: the partition that takes ``item`` (routed to
        ``part``; a punctuation goes where it was routed). A chunk of records goes to a partition
        that has not taken the source's end, stands at or before the chunk's first record and has
        passed on no punctuation above the one in force there (``start.punct``), ``part`` if it
        qualifies: records no partition took before the host was lost may lie below where ``part``
        stands (a paced feed's pieces are cut anew), and a partition that went past them, or was
        sent a progress note from past them, has promised downstream nothing below that note. The
        partition they first went to had taken nothing from past them, so one always qualifies.
        """
        if isinstance(item, Punctuation):
            self.part_punct[part][src] = max(self.part_punct[part][src], int(item.p))
        if start is None:
            return part
        lo = int(start.seq)
        ok = [p for p in [part, *range(self.entry_partitions)]
              if not self.part_skip[p][src][1] and self.part_pos[p][src] <= lo
              and self.part_punct[p][src] <= int(start.punct)]
        if not ok:
            raise RuntimeError(f"after the host was lost, records {lo}..{lo + chunk_rows(item)} of source {src!r} "
                               f"were taken by no entry partition, and every partition stands past them "
                               f"(records {[pos[src] for pos in self.part_pos]}, punctuations "
                               f"{[p[src] for p in self.part_punct]}): the feed cannot resume exactly")
        self.part_pos[ok[0]][src] = lo + chunk_rows(item)
        self.part_punct[ok[0]][src] = max(self.part_punct[ok[0]][src], int(self.splits[src].shadow.punct))
        return ok[0]

    def _refuse_unrepeatable_heartbeats(self) -> None:
        """A partitioned feed with idle timeouts places heartbeat punctuations by wall time: a
        resumed feed would place them elsewhere, and a partition may have passed on a heartbeat
        above records no partition took. Refused, saying so."""
        if self.idle:
            raise RuntimeError(f"the host of this detached deployment was lost while it fed {self.entry_partitions} "
                               f"entry partitions, and the feed cannot resume exactly because it had idle timeouts "
                               f"(heartbeats placed by wall time): a partition may have passed on a heartbeat "
                               f"above rows no partition took; feed with no idle_timeout (or deploy without "
                               f"parallelism['entry']) for a detached deployment with entry partitions that "
                               f"survives losing its host")

    def _group(self, label: str) -> str:
        """The entry replicas that are copies of ``label``: ``"entry"``, or its partition ``"entry.P"``."""
        return label_group(label) if self.splits else ENTRY

    def _next_seqs(self, label: str) -> dict[str, int]:
        """The next chunk number of each source for ``label`` (its partition's, with entry partitions)."""
        if not self.splits:
            return self.seqs
        return self.part_seqs[int(self._group(label).rpartition(".")[2])]

    def _send_to(self, group: str, src: str, seq: int, chunk, start) -> None:
        """Send chunk ``seq`` of ``src`` (with its entry partition's ``start``) to every running
        replica of ``group`` (under the lock)."""
        if isinstance(chunk, ChunkRef):
            ref = chunk.ref  # already in the object store: the driver never holds the rows
        elif chunk is None or inline_chunk(chunk):
            ref = chunk  # small (a paced piece): inlined in each call, no object-store round trip
        else:
            ref = ray.put(chunk)  # large: stored once for the k entry replicas
        self._resume()
        running = self.topology.running(group)
        for label, _ in running:
            if (label not in self.skipped and label not in self.catching and self.suspected(label)
                    and len(self.inflight.get(label, ())) >= self.max_lag):
                # it stopped answering: its calls would pile up; its peers keep what it misses,
                # from the first push it has not answered yet (one taken after it changes nothing)
                missed = dict(self._next_seqs(label))
                for call in self.inflight.get(label, ()):
                    at = self.pushed.get(call)
                    if at is not None:
                        missed[at[0]] = min(missed.get(at[0], at[1]), at[1])
                self.skipped[label] = missed
                self.skips.append((time.time() - self.t0, label, "skipped"))
        keep = self._keep_from(src, seq, group)
        sent = False
        for label, h in running:
            if label in self.skipped:
                continue
            call = h.push_chunk.remote(src, seq, ref, keep) if start is None else \
                h.push_chunk.remote(src, seq, ref, keep, start)
            self.inflight.setdefault(label, []).append(call)
            self.pushed[call] = (src, seq)
            sent = True
        if not sent:
            what = "every entry point replica is dead" if group == ENTRY else \
                f"every replica of entry partition {group} is dead"
            raise RuntimeError(f"{what}: the input cannot be delivered")

    def _keep_from(self, src: str, seq: int, group: str = ENTRY) -> int:
        """The first chunk of ``src`` the entry replicas of ``group`` must keep for a peer that lacks
        it (``seq``: none lacks any)."""
        lacking = [missed.get(src, seq) for label, missed in
                   [*self.skipped.items(), *((lb, m) for lb, (_, m) in self.catching.items())]
                   if self.topology.is_running(label) and self._group(label) == group]
        return max(0, min([seq - KEEP_CHUNKS + 1, *lacking]))

    def _resume(self) -> None:
        """A skipped entry replica that answers again (not suspected, its queued calls done) takes
        what it missed from its peers (under the lock); one no longer running is forgotten."""
        for label, missed in list(self.skipped.items()):
            if not self.topology.is_running(label):
                del self.skipped[label]
                continue
            if self.suspected(label) or self.inflight.get(label):
                continue
            peers = [h for lb, h in self.topology.running(self._group(label))
                     if lb != label and lb not in self.skipped and lb not in self.catching and not self.suspected(lb)]
            if not peers:
                continue
            nxt = self._next_seqs(label)
            upto = {s: nxt[s] for s in self.sources if nxt[s] > missed.get(s, nxt[s])}
            ref = self.topology.handle(label).catch_up.remote(upto, peers)
            self.inflight.setdefault(label, []).append(ref)
            self.catching[label] = (ref, missed)
            del self.skipped[label]
            self.skips.append((time.time() - self.t0, label, "catching up"))

    def _settle(self, limit: int, lag: int) -> None:
        """Backpressure that follows the fastest entry replica (Hwang: the fast path sets the pace):
        wait until some entry replica not suspected by the failure detector has at most ``limit``
        chunks in flight and none of them more than ``lag``. A suspected replica is never waited on:
        its calls stay queued at it (the chunks wait in the object store) and it catches up when it
        answers again, or is declared failed. An entry replica whose call failed with its death is
        reported (``on_entry_failed``) and skipped; one whose code refused a chunk ends the feed."""
        while True:
            self._reap()
            with self.lock:
                self._resume()
            waited = [label for label, refs in self.inflight.items()
                      if refs and self.topology.is_running(label) and not self.suspected(label)]
            if not waited:
                return
            counts = [len(self.inflight[label]) for label in waited]
            active: dict[str, list[int]] = {}  # per group of copies (entry partition), what each has in flight
            for label, _ in self.topology.running(ENTRY):
                if not self.suspected(label):
                    active.setdefault(self._group(label), []).append(len(self.inflight.get(label, [])))
            fastest = max((min(v) for v in active.values()), default=0)  # the fastest of each group
            if fastest <= limit and max(counts) <= lag:
                return
            refs = [r for label in waited for r in self.inflight[label]]
            ray.wait(refs, num_returns=1, timeout=0.1)

    def _reap(self) -> None:
        """Take the answers of completed calls to the entry replicas (in order, per replica)."""
        for label, refs in self.inflight.items():
            if not refs:
                continue
            if not self.topology.is_running(label):
                self._forget(refs)
                continue
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            catching = self.catching.get(label)
            while refs and refs[0] in ready:
                catch_up = catching is not None and refs[0] == catching[0]
                try:
                    ray.get(refs[0])
                except Exception as e:
                    if catch_up and not is_actor_death(e):  # no peer held what it missed: it is lost, not the run
                        self.catching.pop(label, None)
                        ray.kill(self.topology.handle(label), no_restart=True)  # fenced off, as a crash
                        self.on_entry_failed(label, f"could not catch up from a peer entry point: {e}")
                        self._forget(refs)
                        break
                    if not is_actor_death(e):
                        raise  # its code refused a chunk: it reported the run's failure; the feed ends here
                    self.catching.pop(label, None)
                    self.on_entry_failed(label, f"entry point died: {type(e).__name__}")  # its peers go on
                    self._forget(refs)
                    break
                if catch_up:
                    self.catching.pop(label, None)
                    self.skips.append((time.time() - self.t0, label, "caught up"))
                self.pushed.pop(refs.pop(0), None)

    def _forget(self, refs: list) -> None:
        """Drop the calls ``refs`` of one replica from :attr:`inflight` (it died or was fenced)."""
        for call in refs:
            self.pushed.pop(call, None)
        refs.clear()

    # -- markers after everything fed (changes at logical times) ------------------------------
    @contextmanager
    def held(self):
        """No chunk is sent while the block runs (re-entrant)."""
        with self.lock:
            yield self

    @contextmanager
    def gated(self, lead_us: int = 0):
        """A change placed at ``T0`` while the feed goes on: ``T0`` is :meth:`marker_time` plus
        ``lead_us`` (what the block gets), and until the block ends nothing past ``T0`` is sent
        (a chunk whose largest timestamp or punctuation is above it, or one that cannot be told,
        or a source's end, waits in the feed thread, :meth:`_wait_gate`); chunks up to ``T0`` are
        sent meanwhile. So, as under :meth:`held`, no tuple later than ``T0`` exists anywhere
        before the block ends, but a paced feed whose next chunks lie below ``T0`` does not pause
        while the change is handed out. Raises what :meth:`marker_time` raises, before any gate.

        >>> with feeder.gated(lead_us=250_000) as t0: ...   # doctest: +SKIP
        """
        with self.lock:
            t0 = int(self.marker_time()) + max(0, int(lead_us))
            self.gate = t0
        try:
            yield t0
        finally:
            with self.lock:
                self.gate = None
                self._gate_cv.notify_all()

    def _wait_gate(self, src: str, chunk, hi: int | None, limit: float = 600.0) -> None:
        """In the feed thread, under the lock: wait while a gate (:meth:`gated`) stands below this
        item (``hi``, its largest timestamp; ``chunk`` None: ``src``'s end). The lock is released
        while it waits. A gate that stays up ``limit`` s fails the feed, naming it (the change
        that set it has deadlines of its own: this is a backstop)."""
        if self.gate is None:
            return
        started = time.monotonic()
        while self.gate is not None and _past_gate(chunk, hi, self.gate):
            if time.monotonic() - started > limit:
                raise RuntimeError(f"the feed of source {src!r} waited {limit:g} s at a change's time "
                                   f"{self.gate} and the change never released it")
            self._gate_cv.wait(0.5)
        waited = time.monotonic() - started
        if waited > 0.0005:
            self.gate_waits.append(round(waited, 4))

    def marker_time(self) -> int:
        """``p`` for a change now: the largest timestamp or punctuation sent so far (call under
        :meth:`held`). After a restore (:attr:`resumed`) the feeder never saw what the lost host
        fed: once every open source has sent a chunk since the resume, ``p`` is the largest
        timestamp sent since then plus the sources' largest ``max_disorder`` (a tuple fed before
        is at most that much later than one fed after it). Raises ``RuntimeError`` when no
        change can be placed: not feeding, a chunk whose largest timestamp is unknown, every
        source ended, or (after a restore) an open source the resumed feed sent nothing of yet
        (:meth:`unsent_since_resume`; ``Changes._exclusive`` waits for it first).

        >>> feeder.marker_time()     # doctest: +SKIP
        15000000
        """
        with self.lock:
            # the feed over: ended or failed, or its last chunk sent and acknowledgements awaited
            # (feeding is off from the last chunk sent, fed_all is set once every entry took it)
            over = self.fed_all.is_set() or (self.thread is not None and bool(self.sources)
                                             and not any(s in self.open_sources for s in self.sources))
            if not self.feeding and over:
                if self.error is not None:
                    raise RuntimeError(f"the feed failed ({type(self.error).__name__}: {self.error}): no change "
                                       f"can be placed after it")
                raise RuntimeError("every source has ended: nothing is left to change")
            if not self.feeding and self.thread is not None:
                raise RuntimeError("the feed has started but sends nothing yet (its first chunks are being read): "
                                   "no change can be placed before them; call again once it sends")
            if not self.feeding:
                raise RuntimeError("a running query changes while it is fed: call feed() first (before it, deploy "
                                   "the query you want; once every source has ended, nothing is left to change)")
            if self.tmax_unknown:
                raise RuntimeError("the feeder could not tell the largest timestamp of some input chunk, so it "
                                   "cannot place a change after it; give chunks with a 'ts' column")
            if not any(s in self.open_sources for s in self.sources):
                raise RuntimeError("every source has ended: nothing is left to change")
            behind = self.unsent_since_resume()
            if behind:
                raise RuntimeError(f"the feed resumed after the deployment's host was lost has sent nothing of "
                                   f"source(s) {behind} yet, so no time past what the lost host fed is known; "
                                   f"call again once it has")
            if self.max_fed is None:
                return NO_PUNCTUATION
            slack = 0 if self.resumed is None else max([int(d or 0) for d in self.disorder.values()] or [0])
            return int(self.max_fed) + slack

    def unsent_since_resume(self) -> list[str]:
        """After a restore (:attr:`resumed`): the sources still open that the resumed feed has sent
        no chunk of yet (the markers it sent first not counted); ``[]`` otherwise. Until it is
        empty, :meth:`marker_time` cannot place a change after what the lost host fed.

        >>> feeder.unsent_since_resume()     # doctest: +SKIP
        ['s']
        """
        with self.lock:
            res = self.resumed
            if res is None or not self.feeding:
                return []
            if res.get("parts") is not None:  # a partitioned feed: what the replayed split actually sent
                return sorted(src for src in self.sources if src in self.open_sources
                              and src not in self.sent_since_resume)
            markers: dict[str, int] = {}
            for src, _ in res.get("markers", ()):
                markers[src] = markers.get(src, 0) + 1
            return sorted(src for src in self.sources if src in self.open_sources
                          and self.seqs.get(src, 0) <= res["at"][src]["seq"] + markers.get(src, 0))

    def send_marker(self, marker) -> None:
        """Put ``marker`` after everything sent so far on every source that has not ended, on
        every running entry replica (call under :meth:`held`)."""
        with self.lock:
            for src in self.sources:
                if src in self.open_sources:
                    self._send(src, marker)
