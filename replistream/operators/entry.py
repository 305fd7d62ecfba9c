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
"""
from __future__ import annotations

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

    def push(self, data: Any) -> list[Item]:
        if self.closed:
            raise ValueError(f"source {self.name!r}: data pushed after the stream was closed")
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
