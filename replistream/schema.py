"""The data model: schemas, columnar batches, timestamps and punctuations.

**Batches.** A batch is a numpy structured array. Its first two fields are
always ``ts`` (``int64``) and ``id`` (``uint64``), followed by the stream's
payload fields in schema order. numpy was chosen over Arrow record batches for
the core because every operator is a handful of vectorised numpy calls
(``argsort``, ``searchsorted``, ``reduceat``) on fixed-width columns, and a
structured array pickles as one buffer across Ray. Arrow is used at the edges
(Parquet, Spark): see :meth:`Schema.to_arrow` and :meth:`Schema.from_arrow`.

**Time.** Timestamps are integers in **microseconds** (``int64``), the time a
tuple would appear in the ideal, non-replicated run (Hwang §III). Use
:func:`seconds` and :func:`millis` to write durations.

**Punctuations** (Hwang §IV-A). ``Punctuation(p)`` on a stream promises that no
later tuple on that stream has ``ts <= p``. :data:`END` closes a stream.

>>> s = Schema({"server": "i8", "cpu": "f8"})
>>> b = s.from_records([{"ts": 5, "server": 1, "cpu": 0.5}])
>>> b.dtype.names
('ts', 'id', 'server', 'cpu')
>>> seconds(2) == 2_000_000
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import SchemaError

TS = "ts"
ID = "id"
TS_DTYPE = np.dtype(np.int64)
ID_DTYPE = np.dtype(np.uint64)
RESERVED = (TS, ID)

#: Punctuation value that closes a stream: no tuple may follow it.
END = int(np.iinfo(np.int64).max)

MICROS_PER_SECOND = 1_000_000


def seconds(x: float) -> int:
    """Duration of ``x`` seconds in timestamp units (microseconds).

    >>> seconds(0.5)
    500000
    """
    return int(round(x * MICROS_PER_SECOND))


def as_seconds(ts: int) -> str:
    """A timestamp (microseconds) as exact seconds for a person to read.

    >>> as_seconds(1962656), as_seconds(1_700_000_000_000_001), as_seconds(-500_000)
    ('1.962656 s', '1,700,000,000.000001 s', '-0.500000 s')
    """
    whole, micros = divmod(abs(int(ts)), MICROS_PER_SECOND)  # integers: exact however large
    return f"{'-' if ts < 0 else ''}{whole:,}.{micros:06d} s"


def millis(x: float) -> int:
    """Duration of ``x`` milliseconds in timestamp units (microseconds).

    >>> millis(10)
    10000
    """
    return int(round(x * 1000))


@dataclass(frozen=True, order=True)
class Punctuation:
    """"No later tuple on this stream has ``ts <= p``" (Hwang §IV-A).

    >>> Punctuation(10) < Punctuation(11)
    True
    """

    p: int

    def __repr__(self) -> str:
        return "Punctuation(END)" if self.p == END else f"Punctuation({self.p})"


@dataclass(frozen=True, eq=False)
class Marker:
    """A change to the running query, in the stream at logical time ``p`` (Bartnik §3).

    Every tuple before a marker has ``ts <= p``; the change applies to tuples with
    ``ts > p``. Markers travel like punctuations but are not promises: tuples with
    ``ts <= p`` may still follow. Operators never see them; the replica that
    receives the first copy applies the change and forwards it
    (:mod:`replistream.replica.changes`).

    >>> Marker(5, 1, None).p
    5
    """

    p: int
    id: int
    change: Any

    def __repr__(self) -> str:
        return f"Marker({self.p}, #{self.id})"


class Schema:
    """The payload fields of a stream, in order, with their numpy dtypes.

    ``ts`` and ``id`` are implicit: every batch of every stream starts with
    them. Field names must be identifiers and must not be ``ts`` or ``id``.

    >>> s = Schema([("src", "i8"), ("dst", "i8"), ("ms", "f8")])
    >>> s.names
    ('src', 'dst', 'ms')
    >>> s.empty().dtype.names[:2]
    ('ts', 'id')
    """

    __slots__ = ("fields", "dtype", "_names")

    def __init__(self, fields: Mapping[str, Any] | Iterable[tuple[str, Any]] | "Schema" = ()):
        if isinstance(fields, Schema):
            fields = fields.fields
        items = list(fields.items()) if isinstance(fields, Mapping) else list(fields)
        seen = set()
        out = []
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise SchemaError(f"schema entries must be (name, dtype) pairs, got {item!r}")
            name, dt = item
            if not isinstance(name, str) or not name.isidentifier():
                raise SchemaError(f"field name {name!r} is not a valid identifier")
            if name in RESERVED:
                raise SchemaError(f"field name {name!r} is reserved (every batch has 'ts' and 'id')")
            if name in seen:
                raise SchemaError(f"field {name!r} is declared twice")
            seen.add(name)
            try:
                dt = np.dtype(dt)
            except TypeError as e:
                raise SchemaError(f"field {name!r}: {dt!r} is not a numpy dtype ({e})") from None
            if dt.fields is not None or dt.subdtype is not None:
                raise SchemaError(f"field {name!r}: nested or sub-array dtypes are not supported")
            out.append((name, dt))
        self.fields: tuple[tuple[str, np.dtype], ...] = tuple(out)
        self._names = tuple(n for n, _ in out)
        self.dtype = np.dtype([(TS, TS_DTYPE), (ID, ID_DTYPE)] + list(out))

    # -- basic protocol -------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __getitem__(self, name: str) -> np.dtype:
        for n, dt in self.fields:
            if n == name:
                return dt
        raise KeyError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash(self.dtype.descr.__repr__())

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {dt.str}" for n, dt in self.fields)
        return f"Schema({{{inner}}})"

    def __getstate__(self):
        return [(n, dt.str if dt.kind != "O" else "O") for n, dt in self.fields]

    def __setstate__(self, state):
        self.__init__(state)

    # -- batches ----------------------------------------------------------
    def empty(self, n: int = 0) -> np.ndarray:
        """A zero-filled batch of ``n`` rows."""
        return np.zeros(n, dtype=self.dtype)

    def check(self, batch: Any, where: str = "stream") -> np.ndarray:
        """Return ``batch`` if it is a well-formed batch of this schema, else raise.

        Cheap when the dtype matches exactly; otherwise the error names the
        first missing or mistyped field.

        >>> Schema({"x": "i8"}).check(np.zeros(1, [("ts", "i8"), ("id", "u8")]), "s")
        Traceback (most recent call last):
        ...
        replistream.errors.SchemaError: s: batch is missing field 'x' (schema Schema({x: <i8}))
        """
        if isinstance(batch, np.ndarray) and batch.dtype == self.dtype and batch.ndim == 1:
            return batch
        if not isinstance(batch, np.ndarray) or batch.dtype.names is None:
            raise SchemaError(f"{where}: expected a numpy structured array, got {type(batch).__name__}")
        if batch.ndim != 1:
            raise SchemaError(f"{where}: batch must be one-dimensional, got shape {batch.shape}")
        names = batch.dtype.names
        for name, dt in ((TS, TS_DTYPE), (ID, ID_DTYPE)) + self.fields:
            if name not in names:
                raise SchemaError(f"{where}: batch is missing field {name!r} (schema {self!r})")
            got = batch.dtype.fields[name][0]
            if got != dt:
                raise SchemaError(f"{where}: field {name!r} has dtype {got}, expected {dt}")
        extra = [n for n in names if n not in self.dtype.names]
        if extra:
            raise SchemaError(f"{where}: batch has undeclared field(s) {extra} (schema {self!r})")
        # Same fields, other order: reorder into a fresh, canonical batch.
        out = np.empty(len(batch), dtype=self.dtype)
        for name in self.dtype.names:
            out[name] = batch[name]
        return out

    def from_columns(self, columns: Mapping[str, Any], where: str = "stream", ids: Any = None) -> np.ndarray:
        """Build a batch from a mapping of column name to array-like.

        ``ts`` is required and must hold integers (no NaN, no fractions);
        payload columns are converted to their declared dtype, and a value that
        cannot be converted raises :class:`SchemaError` naming the column.
        ``id`` may be given through ``ids`` (entry points assign it).

        >>> Schema({"x": "f8"}).from_columns({"ts": [1, 2], "x": [0.5, 1.5]})["x"]
        array([0.5, 1.5])
        """
        if TS not in columns:
            raise SchemaError(f"{where}: missing field 'ts' (the event timestamp, integer microseconds)")
        ts = to_timestamps(columns[TS], where)
        n = len(ts)
        out = np.empty(n, dtype=self.dtype)
        out[TS] = ts
        if ids is not None:
            out[ID] = ids
        elif ID in columns:
            out[ID] = np.asarray(columns[ID], dtype=np.uint64)
        else:
            out[ID] = 0
        for name, dt in self.fields:
            if name not in columns:
                raise SchemaError(f"{where}: missing field {name!r} (schema {self!r})")
            out[name] = _convert(columns[name], dt, name, where, n)
        extra = [k for k in columns if k not in self.dtype.names]
        if extra:
            raise SchemaError(f"{where}: undeclared field(s) {sorted(extra)} (schema {self!r})")
        return out

    def from_records(self, records: Iterable[Mapping[str, Any]], where: str = "stream") -> np.ndarray:
        """Build a batch from dict-like records, each with ``ts`` and every payload field.

        >>> Schema({"x": "i8"}).from_records([{"ts": 1, "x": 2}])["x"]
        array([2])
        """
        records = list(records)
        cols: dict[str, list] = {TS: []}
        for name in self._names:
            cols[name] = []
        for i, r in enumerate(records):
            if not isinstance(r, Mapping):
                raise SchemaError(f"{where}: record {i} is a {type(r).__name__}, expected a mapping of field to value")
            for key in r:
                if key not in cols:
                    if key == ID:
                        raise SchemaError(f"{where}: record {i} sets 'id'; ids are assigned by replistream")
                    raise SchemaError(f"{where}: record {i} has undeclared field {key!r} (schema {self!r})")
            for name, lst in cols.items():
                if name not in r:
                    raise SchemaError(f"{where}: record {i} is missing field {name!r}")
                lst.append(r[name])
        return self.from_columns(cols, where)

    # -- Arrow ------------------------------------------------------------
    def to_arrow(self):
        """The equivalent ``pyarrow.Schema`` (with ``ts`` and ``id``)."""
        import pyarrow as pa

        return pa.schema([pa.field(n, pa.from_numpy_dtype(self.dtype.fields[n][0])) for n in self.dtype.names])


def to_timestamps(values: Any, where: str = "stream") -> np.ndarray:
    """Convert event times to ``int64`` microseconds, rejecting NaN and fractions.

    >>> to_timestamps([1, 2.0])
    array([1, 2])
    >>> to_timestamps([1.5], "load")
    Traceback (most recent call last):
    ...
    replistream.errors.SchemaError: load: field 'ts' holds non-integer timestamp 1.5 (row 0); timestamps are integer microseconds
    """
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError) as e:
        raise SchemaError(f"{where}: field 'ts' holds mixed or non-scalar values ({e})") from None
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return _in_range(_timestamps(arr, where), where)


def _in_range(ts: np.ndarray, where: str) -> np.ndarray:
    """Timestamps strictly between the int64 extremes: the smallest means "no punctuation yet",
    the largest is :data:`END`, the end-of-stream punctuation."""
    if ts.size:
        bad = np.flatnonzero((ts == END) | (ts == _TS_MIN))
        if bad.size:
            v = int(ts[bad[0]])
            raise SchemaError(f"{where}: field 'ts' holds {v} (row {bad[0]}), reserved for "
                              f"{'the end of the stream (END)' if v == END else 'no punctuation'}; timestamps "
                              f"lie strictly between {_TS_MIN} and {END}")
    return ts


_TS_MIN = int(np.iinfo(np.int64).min)


def _timestamps(arr: np.ndarray, where: str) -> np.ndarray:
    kind = arr.dtype.kind
    if kind in "iu":
        if kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise SchemaError(f"{where}: field 'ts' holds {int(arr.max())}, beyond int64 (timestamps are "
                              f"integer microseconds)")
        return arr.astype(np.int64, copy=False)
    if kind == "b":
        raise SchemaError(f"{where}: field 'ts' holds booleans, expected integer microseconds")
    if kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise SchemaError(f"{where}: field 'ts' holds {arr[bad[0]]} (row {bad[0]}); timestamps must be finite integers")
        frac = np.flatnonzero(arr != np.floor(arr))
        if frac.size:
            raise SchemaError(
                f"{where}: field 'ts' holds non-integer timestamp {arr[frac[0]]} (row {frac[0]}); "
                "timestamps are integer microseconds"
            )
        far = np.flatnonzero((arr >= 2.0 ** 63) | (arr < -(2.0 ** 63)))
        if far.size:
            raise SchemaError(f"{where}: field 'ts' holds {arr[far[0]]} (row {far[0]}), beyond int64")
        return arr.astype(np.int64)
    if kind == "M":
        return arr.astype("datetime64[us]").astype(np.int64)
    if kind == "O":
        out = np.empty(len(arr), dtype=np.int64)
        for i, v in enumerate(arr):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer, float, np.floating)):
                raise SchemaError(f"{where}: field 'ts' holds {v!r} (row {i}); expected an integer timestamp")
            if isinstance(v, (float, np.floating)) and (not np.isfinite(v) or v != int(v)):
                raise SchemaError(f"{where}: field 'ts' holds {v!r} (row {i}); timestamps must be finite integers")
            if not _TS_MIN <= int(v) <= END:
                raise SchemaError(f"{where}: field 'ts' holds {int(v)} (row {i}), beyond int64 (timestamps are "
                                  f"integer microseconds)")
            out[i] = int(v)
        return out
    raise SchemaError(f"{where}: field 'ts' has dtype {arr.dtype}, expected integer microseconds")


def _convert(values: Any, dt: np.dtype, name: str, where: str, n: int) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError):
        raise SchemaError(f"{where}: field {name!r} holds mixed or non-scalar values, expected {dt}") from None
    if arr.shape != (n,):
        raise SchemaError(f"{where}: field {name!r} has {arr.size} values, expected {n}")
    if arr.dtype == dt:
        return arr
    if n == 0:
        return np.zeros(0, dtype=dt)
    src, dst = arr.dtype.kind, dt.kind
    ok = (
        (dst in "iu" and src in "iub")
        or (dst == "f" and src in "iuf")
        or (dst == "b" and src == "b")
        or (dst in "US" and src in "US")
        or dst == "O"
    )
    if src == "O" and dst != "O":
        try:
            inferred = np.array(arr.tolist())
        except (TypeError, ValueError, OverflowError):
            inferred = arr
        if inferred.dtype.kind == "O" or inferred.shape != (n,):
            raise SchemaError(f"{where}: field {name!r} holds mixed or non-scalar values, expected {dt}")
        return _convert(inferred, dt, name, where, n)
    if not ok:
        raise SchemaError(f"{where}: field {name!r} has values of dtype {arr.dtype}, expected {dt}")
    if dst in "iu" and src in "iu":
        info = np.iinfo(dt)
        if n and (arr.min() < info.min or arr.max() > info.max):
            raise SchemaError(f"{where}: field {name!r} holds values outside the range of {dt}")
    if dst in "US":
        width = dt.itemsize // (4 if dst == "U" else 1)
        if n and width and int(np.char.str_len(arr).max()) > width:
            raise SchemaError(f"{where}: field {name!r} holds strings longer than {dt}")
        try:
            return arr.astype(dt)
        except (UnicodeEncodeError, UnicodeDecodeError) as e:
            raise SchemaError(f"{where}: field {name!r} holds text that does not fit {dt}: {e.reason}") from None
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dt)
    if dst == "f" and src in "iuf":  # a finite value too large for the field's width would become inf
        blown = np.flatnonzero(np.isfinite(arr) & ~np.isfinite(out))
        if blown.size:
            raise SchemaError(f"{where}: field {name!r} holds {arr[blown[0]]} (row {blown[0]}), too large for {dt}")
    return out
