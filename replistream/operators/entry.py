"""Entry-point logic (Hwang §II-B): turn raw source records into a stream.

An entry point checks each record against the source's schema, assigns the
deterministic id ``mix(hash(source), sequence number)`` (docs/design.md,
decision 1), sets aside tuples that arrive too late, and emits punctuations. Peer entry
points that run the same logic over the same input produce the same stream,
so downstream duplicate filters can merge them.

**Punctuations.** With ``punctuate_every=E`` and ``max_disorder=d`` the entry
point promises, after seeing timestamps up to ``m``, that no later tuple has
``ts <= P(m) = floor((m - d) / E) * E - 1``: punctuations fall on multiples of
``E`` minus one, which are exactly the expiry times of time windows whose
slide divides ``E`` (§IV-F: punctuate at window expiry to cut aggregate
latency). Explicit :class:`~replistream.schema.Punctuation` items in the input
are honoured too; :meth:`EntryLogic.close` emits :data:`~replistream.schema.END`.

**Late tuples.** Tuple ``i`` is late when ``ts_i <= P`` for the punctuation in
force after tuples ``0..i-1``. The rule is per tuple, so which tuples are late
does not depend on how the input is chunked. Late tuples are counted and
dead-lettered (strict mode raises), never emitted.

**Malformed records** (missing field, wrong type, NaN or fractional
timestamp) raise :class:`~replistream.errors.SchemaError` naming the field;
with ``on_malformed="dead_letter"`` they are dead-lettered one by one and the
rest of the stream keeps flowing.

**Entry partitions** (issue #41). One feeder may cut a source between ``p`` entry partitions,
each chunk to one of them (:class:`EntrySplit`): it sends with each chunk the state an
unpartitioned entry point would be in before it (:class:`EntryStart`: the first sequence
number, the running maximum timestamp, the punctuation in force), which the partition takes
(``push(chunk, start=...)``), so ids, lateness and punctuations are those of the unpartitioned run.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import DeadLetter, PunctuationViolation, SchemaError
from ..ids import mix, stable_hash
from ..schema import END, ID, TS, Punctuation, Schema
from .base import NO_PUNCTUATION, Item


@dataclass
class SourceBatch:
    """A chunk of source rows converted elsewhere (e.g. from a Spark DataFrame).

    ``data`` holds the rows that could be read, in input order, in the
    source's dtype (``id`` is ignored: the entry point assigns it).
    ``positions`` gives each good row's position among all ``n`` rows of the
    chunk (``None``: rows ``0..n-1``, nothing rejected); ``rejected`` lists
    ``(position, reason, record)`` for the rows that could not be read. The
    entry point dead-letters those with their reason and counts them, and ids
    follow positions, so a rejected row still consumes its sequence number:
    ids do not depend on which rows were bad.

    >>> s = Schema({"x": "i8"})
    >>> good = s.from_columns({"ts": [5], "x": [7]})
    >>> e = EntryLogic("src", s)
    >>> out = e.push(SourceBatch(good, n=2, positions=np.array([1]),
    ...                          rejected=[(0, "column 'x' is null", {"ts": 4, "x": None})]))
    >>> len(out[0]), e.malformed_count, e.dead_letters[0].reason
    (1, 1, "malformed: column 'x' is null")
    """

    data: np.ndarray
    n: int | None = None
    positions: np.ndarray | None = None
    rejected: list = field(default_factory=list)

    def __post_init__(self):
        if self.n is None:
            self.n = len(self.data)
        if self.positions is None and len(self.data) != self.n:
            raise ValueError(f"SourceBatch: {len(self.data)} good rows of {self.n} need their positions")
        if len(self.data) + len(self.rejected) != self.n:
            raise ValueError(f"SourceBatch: {len(self.data)} good + {len(self.rejected)} rejected rows "
                             f"!= n={self.n}")

    def __len__(self) -> int:
        return self.n


@dataclass(frozen=True)
class EntryStart:
    """Where an unpartitioned entry point stands before a chunk: ``seq`` (the chunk's first
    sequence number: records before it, rejected ones included), ``max_ts`` (the running maximum
    of the timestamps before it) and ``punct`` (the punctuation in force, explicit ones included).
    A partition of the entry points takes it with the chunk (``EntryLogic.push(chunk, start=...)``).

    >>> e = EntryLogic("src", Schema({"x": "i8"}), punctuate_every=10)
    >>> _ = e.push([{"ts": 3, "x": 1}, {"ts": 12, "x": 2}])
    >>> e.position()
    EntryStart(seq=2, max_ts=12, punct=9)
    """

    seq: int
    max_ts: int
    punct: int


#: How many ranges of records an entry partition remembers having taken (:attr:`EntryLogic.taken`).
TAKEN_KEPT = 4096


class EntryLogic:
    """Entry point for source ``name`` (Hwang §II-B).

    ``push(data)`` takes a batch (structured array without or with a zero
    ``id``), a mapping of columns, a list of record dicts, or a
    :class:`Punctuation`, and returns the items to send downstream.

    >>> s = Schema({"x": "i8"})
    >>> e = EntryLogic("src", s, punctuate_every=10)
    >>> out = e.push([{"ts": 3, "x": 1}, {"ts": 12, "x": 2}])
    >>> len(out[0]), out[1]
    (2, Punctuation(9))
    >>> e.push([{"ts": 8, "x": 3}]), e.late_count
    ([], 1)
    >>> e.close()
    [Punctuation(END)]

    A partition of the entry points (issue #41) gets each of its chunks with the state the
    unpartitioned entry point would be in before it (:class:`EntryStart`); ids, lateness and
    punctuations are then those of the unpartitioned run:

    >>> part = EntryLogic("src", s, punctuate_every=10)
    >>> out = part.push([{"ts": 8, "x": 3}, {"ts": 25, "x": 4}], start=EntryStart(seq=2, max_ts=12, punct=9))
    >>> out[0]["ts"].tolist(), out[1], part.late_count, part.seq
    ([25], Punctuation(19), 1, 4)

    Public state, for the engines: ``every`` and ``max_disorder`` (the punctuation
    rule's parameters), ``max_ts`` (the largest timestamp emitted), ``explicit``
    (the highest explicit punctuation), ``punct`` (the last punctuation emitted).
    """

    def __init__(self, name: str, schema: Schema, punctuate_every: int | None = None, max_disorder: int = 0,
                 strict: bool = False, on_malformed: str = "raise"):
        if punctuate_every is not None and int(punctuate_every) <= 0:
            raise ValueError(f"source {name!r}: punctuate_every must be > 0, got {punctuate_every}")
        if int(max_disorder) < 0:
            raise ValueError(f"source {name!r}: max_disorder must be >= 0, got {max_disorder}")
        if on_malformed not in ("raise", "dead_letter"):
            raise ValueError(f"source {name!r}: on_malformed must be 'raise' or 'dead_letter', got {on_malformed!r}")
        self.name = name
        self.schema = schema
        self.every = None if punctuate_every is None else int(punctuate_every)
        self.max_disorder = int(max_disorder)
        self.strict = strict
        self.on_malformed = on_malformed
        self._salt = stable_hash(f"source:{name}")
        self.seq = 0  # records seen so far, including rejected ones: the id counter
        self.max_ts = NO_PUNCTUATION
        self.explicit = NO_PUNCTUATION  # highest explicit punctuation
        self.punct = NO_PUNCTUATION  # last punctuation emitted
        self.closed = False
        self.late_count = 0
        self.malformed_count = 0
        self.tuples_out = 0
        self.dead_letters: list[DeadLetter] = []
        #: with entry partitions, the last :data:`TAKEN_KEPT` ranges of the source's records this
        #: partition took, ``(first, end)`` by id counter, in order: a control plane restored after
        #: a host was lost learns from them which rows no partition took (:class:`TakenRows`)
        self.taken: deque[tuple[int, int]] = deque(maxlen=TAKEN_KEPT)

    def auto_punctuation(self, m):
        """The punctuation rule ``P(m) = floor((m - max_disorder) / every) * every - 1`` for
        running maxima ``m`` of the timestamps (array or scalar; ``NO_PUNCTUATION`` without
        ``punctuate_every``). With :attr:`max_ts`, :attr:`explicit` (the highest explicit
        punctuation) and :attr:`punct` (the last one emitted), an engine can tell which
        punctuation follows each tuple of a batch, as the batched simulator does.

        >>> EntryLogic("src", Schema({"x": "i8"}), punctuate_every=10, max_disorder=2).auto_punctuation(
        ...     np.array([11, 12, 25])).tolist()
        [-1, 9, 19]
        """
        if self.every is None:
            return np.full_like(m, NO_PUNCTUATION)
        base = np.asarray(m) - self.max_disorder
        return np.where(np.asarray(m) == NO_PUNCTUATION, NO_PUNCTUATION,
                        np.floor_divide(base, self.every) * self.every - 1)

    def position(self) -> EntryStart:
        """Where this entry point stands before its next chunk (what a partition of the entry
        points needs to take that chunk as this one would: :meth:`push` with ``start=``)."""
        return EntryStart(int(self.seq), int(self.max_ts), int(max(self.punct, self.explicit)))

    def advance(self, n: int, tmax: int | None) -> list[Item]:
        """Count a chunk of ``n`` records whose largest readable timestamp is ``tmax`` (None: no
        readable row) without its rows: what a feeder that holds only a chunk's row count and
        bounds (:class:`~replistream.sources.ChunkRef`) does to know the next chunk's
        :meth:`position`. Returns the punctuation that follows the chunk, if it rose. Rows the
        chunk's entry partition finds late do not count in :attr:`max_ts` there and do here; that
        changes no later decision: a late row's timestamp is at or below the punctuation in force,
        and the punctuation it would give lies below it.

        >>> e = EntryLogic("src", Schema({"x": "i8"}), punctuate_every=10)
        >>> e.advance(3, 25), e.position()
        ([Punctuation(19)], EntryStart(seq=3, max_ts=25, punct=19))
        """
        if self.closed:
            raise ValueError(f"source {self.name!r}: data pushed after the stream was closed")
        self.seq += int(n)
        if n and tmax is not None and int(tmax) > self.max_ts:
            self.max_ts = int(tmax)
        p = int(self.auto_punctuation(np.int64(self.max_ts)))
        if p > self.punct:
            self.punct = p
            return [Punctuation(p)]
        return []

    def push(self, data: Any, start: EntryStart | None = None) -> list[Item]:
        """The items to send downstream for ``data`` (see the class doc). With ``start``, this
        entry point first takes that position (an entry partition given a chunk by the feeder,
        with the state the unpartitioned entry point would be in before it) and notes the range of
        records it took in :attr:`taken`."""
        out = self._push(data, start)
        if start is not None and not isinstance(data, Punctuation) and self.seq > int(start.seq):
            if not hasattr(self, "taken"):  # (an entry point pickled before ranges were kept)
                self.taken = deque(maxlen=TAKEN_KEPT)
            self.taken.append((int(start.seq), int(self.seq)))
        return out

    def _push(self, data: Any, start: EntryStart | None) -> list[Item]:
        if self.closed:
            raise ValueError(f"source {self.name!r}: data pushed after the stream was closed")
        if start is not None:
            self.seq, self.max_ts, self.punct = int(start.seq), int(start.max_ts), int(start.punct)
            self.explicit = min(self.explicit, self.punct)
        if isinstance(data, Punctuation):
            return self._explicit(data.p)
        batch = self._to_batch(data)
        out: list[Item] = []
        if batch is None or not len(batch):
            return out
        ts = batch[TS]
        prev_max = np.maximum.accumulate(np.r_[self.max_ts, ts[:-1]])
        in_force = np.maximum(self.auto_punctuation(prev_max), max(self.explicit, self.punct))
        late = ts <= in_force
        if late.any():
            where = f"source {self.name!r}"
            if self.strict:
                i = int(np.flatnonzero(late)[0])
                raise PunctuationViolation(f"{where}: tuple with ts={int(ts[i])} arrived after punctuation "
                                           f"{int(in_force[i])} (max_disorder={self.max_disorder})")
            self.late_count += int(late.sum())
            self.dead_letters.append(DeadLetter(where, "late: ts <= punctuation in force", batch[late]))
            batch = batch[~late]
        if len(batch):
            self.max_ts = max(self.max_ts, int(batch[TS].max()))
            self.tuples_out += len(batch)
            out.append(batch)
        p = int(self.auto_punctuation(np.int64(self.max_ts)))
        if p > self.punct:
            self.punct = p
            out.append(Punctuation(p))
        return out

    def _explicit(self, p: int) -> list[Item]:
        p = int(p)
        self.explicit = max(self.explicit, p)
        if p > self.punct:
            self.punct = p
            return [Punctuation(p)]
        return []

    def close(self) -> list[Item]:
        """End of the source: emit :data:`END` so every window can close."""
        if self.closed:
            return []
        self.closed = True
        self.punct = END
        return [Punctuation(END)]

    # -- records -> batch ---------------------------------------------------
    def _to_batch(self, data: Any) -> np.ndarray | None:
        where = f"source {self.name!r}"
        if isinstance(data, SourceBatch):
            return self._source_batch(data, where)
        try:
            batch = self._convert(data, where)
        except SchemaError:
            # a list of records with bad ones among them (or not records at all: each is then set
            # aside with what it is); any other unreadable chunk is the caller's mistake
            records = None if self.on_malformed == "raise" else _as_records(data)
            if records is None:
                raise
            return self._convert_one_by_one(records, where)
        n = len(batch)
        batch[ID] = mix(self._salt, np.arange(self.seq, self.seq + n, dtype=np.uint64))
        self.seq += n
        return batch

    def _convert(self, data: Any, where: str) -> np.ndarray:
        if isinstance(data, np.ndarray) and data.dtype.names is not None:
            cols = {n: data[n] for n in data.dtype.names if n != ID}
            return self.schema.from_columns(cols, where)
        if isinstance(data, Mapping):
            if ID in data:
                raise SchemaError(f"{where}: input sets 'id'; ids are assigned by replistream")
            return self.schema.from_columns(data, where)
        if is_records(data):
            return self.schema.from_records(data, where)
        raise SchemaError(f"{where}: cannot read {type(data).__name__}; give records (dicts), a mapping of "
                          "columns, a structured array or a Punctuation")

    def _source_batch(self, sb: SourceBatch, where: str) -> np.ndarray:
        if sb.data.dtype != self.schema.dtype:
            batch = self._convert(sb.data, where)
        else:
            batch = sb.data.copy()  # arrays from Ray's object store are read-only
        pos = np.arange(len(batch), dtype=np.uint64) if sb.positions is None else \
            np.asarray(sb.positions, dtype=np.uint64)
        batch[ID] = mix(self._salt, np.uint64(self.seq) + pos)
        by_reason: dict[str, list] = {}
        for _, reason, record in sb.rejected:
            by_reason.setdefault(reason, []).append(record)
        for reason, records in by_reason.items():
            bad = np.empty(len(records), dtype=object)
            bad[:] = records
            self.malformed_count += len(records)
            self.dead_letters.append(DeadLetter(where, f"malformed: {reason}", bad))
        self.seq += int(sb.n)
        return batch

    def _convert_one_by_one(self, records: list, where: str) -> np.ndarray:
        good, ids = [], []
        for i, r in enumerate(records):
            try:
                if not isinstance(r, Mapping):
                    raise SchemaError(f"{where}: a record is a {type(r).__name__}, expected a mapping of field to value")
                good.append(self.schema.from_records([r], where))
                ids.append(self.seq)
            except (SchemaError, ValueError, TypeError, OverflowError) as e:  # set aside with its reason
                self.malformed_count += 1
                bad = np.empty(1, dtype=object)
                bad[0] = r
                reason = str(e) if isinstance(e, SchemaError) else f"{type(e).__name__}: {e}"
                self.dead_letters.append(DeadLetter(where, f"malformed: {reason}", bad))
            self.seq += 1
        if not good:
            return None
        batch = np.concatenate(good)
        batch[ID] = mix(self._salt, np.asarray(ids, dtype=np.uint64))
        return batch

    def stats(self) -> dict:
        return {"name": self.name, "tuples_out": self.tuples_out, "late": self.late_count,
                "malformed": self.malformed_count, "punctuation": self.punct}


class EntrySplit:
    """The one feeder's cut of a source between ``partitions`` entry partitions (issue #41).

    ``entry`` is a fresh entry point of the source, the feeder's *shadow*: it keeps the
    unpartitioned entry point's position (:class:`EntryStart`) and nothing it emits is sent.
    :meth:`route` takes the source's chunks in feed order and says what each partition is sent,
    as ``(partition, item, start)``:

    * a chunk of records goes to one partition, ``(offset + its ordinal among the source's
      chunks of records) % partitions`` (its place in the feed decides, nothing else), with the
      position before it; when the punctuation rises after it, every other partition gets a
      progress note, ``Punctuation(p)``, so the punctuation downstream (the minimum over the
      partitions) keeps moving;
    * an explicit punctuation that raises the one in force, a marker and the end (None) go to every partition.

    A chunk read by a Ray task (:class:`~replistream.sources.ChunkRef`) is counted from its row
    count and largest timestamp (:meth:`EntryLogic.advance`); others are run through the shadow.

    >>> s = Schema({"x": "i8"})
    >>> split = EntrySplit(EntryLogic("src", s, punctuate_every=10), 2)
    >>> [(p, type(i).__name__, st) for p, i, st in split.route([{"ts": 3, "x": 1}, {"ts": 12, "x": 2}])]
    [(0, 'list', EntryStart(seq=0, max_ts=-9223372036854775808, punct=-9223372036854775808)), (1, 'Punctuation', None)]
    >>> [(p, st.seq) for p, _, st in split.route([{"ts": 15, "x": 3}])]
    [(1, 2)]
    >>> [(p, i) for p, i, _ in split.route(None)]
    [(0, None), (1, None)]
    """

    def __init__(self, entry: EntryLogic, partitions: int, offset: int = 0):
        if int(partitions) < 1:
            raise ValueError(f"source {entry.name!r}: entry partitions must be >= 1, got {partitions}")
        entry.strict, entry.on_malformed = False, "dead_letter"  # a shadow never refuses: the partition does
        self.shadow = entry
        self.partitions = int(partitions)
        self.ordinal = int(offset)

    def route(self, chunk: Any) -> list[tuple[int, Any, EntryStart | None]]:
        everyone = range(self.partitions)
        if chunk is None:
            return [(i, None, None) for i in everyone]
        if isinstance(chunk, Punctuation):
            return [(i, chunk, None) for i in everyone] if self.shadow.push(chunk) else []
        by_meta = _is_chunk_ref(chunk)
        if not by_meta and not isinstance(chunk, (SourceBatch, list, tuple, Mapping, np.ndarray)):
            return [(i, chunk, None) for i in everyone]  # a marker (a change at a logical time)
        part = self.ordinal % self.partitions
        self.ordinal += 1
        start = self.shadow.position()
        before = self.shadow.punct
        if by_meta:
            self.shadow.advance(chunk.n, chunk.tmax if chunk.n else None)
        elif isinstance(chunk, SourceBatch):
            self.shadow.advance(chunk.n, int(chunk.data[TS].max()) if len(chunk.data) else None)
        else:
            try:
                self.shadow.push(chunk)
            except (SchemaError, ValueError, TypeError):  # unreadable: its partition raises it
                pass
            self.shadow.dead_letters.clear()
        out = [(part, chunk, start)]
        if self.shadow.punct > before:
            out += [(i, Punctuation(self.shadow.punct), None) for i in everyone if i != part]
        return out


class TakenRows:
    """Which records of a source the entry partitions had taken when the host feeding them was lost,
    by id counter (a record's place in the source): every record below ``floor`` and those in
    ``ranges`` (``[(first, end)]``).

    Built by :meth:`of` from each partition's position: a partition takes the chunks sent to it in
    order, so with its furthest replica at ``rows`` it took every chunk routed to it that ends by
    ``rows``. Below the lowest ``rows`` of all partitions every record was taken (its chunk went
    to some partition, which stands past it); above it, the ranges each partition remembers
    (:attr:`EntryLogic.taken`) say which were. A restored feeder cuts and routes the source anew,
    so it needs no cut of the lost host's (a paced feed's pieces are cut by wall time): it sends
    only the records no partition took (:meth:`segments`).

    >>> t = TakenRows.of([{"rows": 300, "taken": [(0, 100), (250, 300)], "complete": True},
    ...                   {"rows": 240, "taken": [(100, 240)], "complete": True},
    ...                   {"rows": 200, "taken": [(120, 200)], "complete": True}])
    >>> t.floor, t.ranges                  # 240..249 went to a partition that never got them
    (240, [(250, 300)])
    >>> t.segments(150, 420)
    [(150, 240, True), (240, 250, False), (250, 300, True), (300, 420, False)]
    """

    def __init__(self, floor: int, ranges: list[tuple[int, int]]):
        self.floor = int(floor)
        self.ranges = [(int(a), int(b)) for a, b in ranges]

    @classmethod
    def of(cls, parts: list[dict]) -> "TakenRows":
        """From each partition's ``{"rows": its id counter, "taken": the ranges it remembers,
        "complete": whether it remembers every range it took}`` for one source. Raises
        ``RuntimeError`` when a partition forgot ranges above the floor (more than
        :data:`TAKEN_KEPT` chunks behind): which records it took is then unknown."""
        floor = min(int(p["rows"]) for p in parts) if parts else 0
        merged: list[tuple[int, int]] = []
        for i, p in enumerate(parts):
            kept = [(int(a), int(b)) for a, b in p.get("taken", ())]
            if not p.get("complete", True) and kept and kept[0][0] > floor:
                raise RuntimeError(f"entry partition {i} remembers only the records it took from {kept[0][0]} "
                                   f"on, and the partitions all stand past record {floor} only: which records "
                                   f"between them it took is unknown")
            merged += [(max(a, floor), b) for a, b in kept if b > floor]
        merged.sort()
        ranges: list[tuple[int, int]] = []
        for a, b in merged:
            if ranges and a <= ranges[-1][1]:
                ranges[-1] = (ranges[-1][0], max(ranges[-1][1], b))
            else:
                ranges.append((a, b))
        if ranges and ranges[0][0] <= floor:  # (joined to the floor)
            floor = ranges.pop(0)[1]
        return cls(floor, ranges)

    def segments(self, a: int, b: int) -> list[tuple[int, int, bool]]:
        """Records ``a`` .. ``b - 1`` cut where taken and not taken records meet: ``[(first, end,
        taken)]`` in order, covering them all."""
        cuts: list[tuple[int, int, bool]] = []

        def add(lo: int, hi: int, taken: bool) -> None:
            lo, hi = max(lo, a), min(hi, b)
            if lo >= hi:
                return
            if cuts and cuts[-1][2] == taken and cuts[-1][1] == lo:
                cuts[-1] = (cuts[-1][0], hi, taken)
            else:
                cuts.append((lo, hi, taken))

        add(a, self.floor, True)
        at = max(a, self.floor)
        for lo, hi in self.ranges:
            if hi <= at:
                continue
            if lo >= b:
                break
            add(at, lo, False)
            add(lo, hi, True)
            at = hi
        add(at, b, False)
        return cuts


def _is_chunk_ref(chunk: Any) -> bool:
    """A :class:`~replistream.sources.ChunkRef` (rows in Ray's object store, known by ``ref``, ``n``,
    ``tmin``, ``tmax``), told by its fields (this module sits below :mod:`replistream.sources`)."""
    return all(hasattr(chunk, f) for f in ("ref", "n", "tmin", "tmax"))


def partition_streams(entry_of, chunks: Iterable[Any], partitions: int, offset: int = 0
                      ) -> tuple[list[list[Item]], list[EntryLogic], list[tuple[tuple[int, ...], Any]]]:
    """Each entry partition's stream of a source when one feeder cuts ``chunks`` between
    ``partitions`` of them (:class:`EntrySplit`): ``(items per partition, the partitions'
    entry logics, marks)``. ``entry_of()`` makes a fresh entry point of the source; a chunk
    that is not data, a punctuation or the end (a scripted event) is not sent but marked, as
    ``(each partition's item count before it, chunk)``.

    >>> s = Schema({"x": "i8"})
    >>> items, logics, _ = partition_streams(lambda: EntryLogic("src", s, punctuate_every=10),
    ...                                      [[{"ts": 3, "x": 1}], [{"ts": 14, "x": 2}]], 2)
    >>> [[i["ts"].tolist() if isinstance(i, np.ndarray) else i.p for i in part][:3] for part in items]
    [[[3], -1, 9], [-1, [14], 9]]
    """
    split = EntrySplit(entry_of(), partitions, offset)
    logics = [entry_of() for _ in range(partitions)]
    items: list[list[Item]] = [[] for _ in range(partitions)]
    marks = []
    for chunk in chunks:
        if chunk is not None and not isinstance(chunk, (Punctuation, SourceBatch, list, tuple, Mapping, np.ndarray)):
            marks.append((tuple(len(x) for x in items), chunk))
            continue
        for part, item, start in split.route(chunk):
            items[part].extend(logics[part].push(item, start=start))
    for part in range(partitions):
        items[part].extend(logics[part].close())
    return items, logics, marks


def _as_records(data: Any) -> list | None:
    """``data`` as a list of records, to set its bad rows aside one by one; None when it has no rows
    (a chunk of an unreadable kind, or columns of unequal lengths: the caller's mistake, raised)."""
    if isinstance(data, (list, tuple)):
        return list(data)
    if isinstance(data, np.ndarray) and data.dtype.names is not None:
        names = [n for n in data.dtype.names if n != ID]
        return [{n: row[n] for n in names} for row in data]
    if isinstance(data, Mapping) and ID not in data:
        try:
            cols = {k: list(v) for k, v in data.items()}
        except TypeError:
            return None
        lengths = {len(v) for v in cols.values()}
        if len(lengths) != 1:
            return None
        return [{k: v[i] for k, v in cols.items()} for i in range(lengths.pop())]
    return None


def is_records(data: Any) -> bool:
    """True for a list of records (mappings of field to a scalar), as opposed to
    a list of column mappings (field to array)."""
    if not isinstance(data, (list, tuple)) or not data or not isinstance(data[0], Mapping):
        return False
    return not any(isinstance(v, (np.ndarray, list, tuple)) for v in data[0].values())


def source_stream(entry: EntryLogic, data: Iterable[Any]) -> list[Item]:
    """Run ``entry`` over ``data`` (an iterable of chunks) and close it; the whole stream.

    >>> s = Schema({"x": "i8"})
    >>> items = source_stream(EntryLogic("s", s), [[{"ts": 1, "x": 0}], Punctuation(4)])
    >>> [type(i).__name__ for i in items]
    ['ndarray', 'Punctuation', 'Punctuation']
    """
    items: list[Item] = []
    for chunk in data:
        items.extend(entry.push(chunk))
    items.extend(entry.close())
    return items
