"""Arrow blocks -> source chunks: the conversion a Spark source runs inside Ray.

RayDP hands a Spark DataFrame to Ray as Arrow tables in the object store.
:func:`convert_table` turns one such table into the chunks an entry point
takes (:class:`~replistream.operators.entry.SourceBatch`): event time to int64
microseconds, payload columns to the source's numpy dtypes, and every row that
cannot be carried faithfully set aside with a reason that names the column
(null values, non-finite event times, integers out of range, strings longer
than the declared width). It is pure (no Spark, no Ray), so it is tested on
hand-built tables and runs unchanged in a Ray task.

>>> import pyarrow as pa
>>> from replistream.schema import Schema
>>> plan = ConversionPlan("load", "t", "int", 1_000_000, Schema({"cpu": "f8"}), (("cpu", "cpu"),))
>>> t = pa.table({"t": [1, None, 3], "cpu": [0.5, 0.1, None]})
>>> [(meta["n"], meta["rejected"]) for meta, sb in convert_table(t, plan, chunk_size=10)]
[(3, {"event time 't' is null": 1, "column 'cpu' is null": 1})]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SchemaError
from ..operators.entry import SourceBatch
from ..schema import TS, Schema

#: microseconds per unit of a numeric event-time column
TIME_UNITS = {"us": 1, "ms": 1_000, "s": 1_000_000, "min": 60_000_000, "h": 3_600_000_000}
_DAY_US = 86_400_000_000
_ARROW_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1}


@dataclass(frozen=True)
class ConversionPlan:
    """How to read one source's rows from Arrow tables.

    ``time_kind`` is ``"timestamp"``, ``"date"``, ``"int"`` or ``"float"``;
    ``factor`` is microseconds per unit for numeric event times;
    ``fields`` pairs each schema field with the table column it comes from
    (after the source's select, the column has the field's name);
    ``on_bad_rows`` is ``"dead_letter"`` or ``"raise"``.
    """

    source: str
    time_col: str
    time_kind: str
    factor: int
    schema: Schema
    fields: tuple
    on_bad_rows: str = "dead_letter"


class _Rejects:
    """The first reason each rejected row was rejected for."""

    def __init__(self, n: int):
        self.bad = np.zeros(n, dtype=bool)
        self.reason = np.empty(n, dtype=object)

    def add(self, mask: np.ndarray, reason: str) -> None:
        new = mask & ~self.bad
        if new.any():
            self.reason[new] = reason
            self.bad |= new


def _nulls(col: pa.ChunkedArray) -> np.ndarray:
    if col.null_count == 0:
        return np.zeros(len(col), dtype=bool)
    return pc.is_null(col, nan_is_null=False).to_numpy(zero_copy_only=False)


def _event_time(col: pa.ChunkedArray, plan: ConversionPlan, rej: _Rejects) -> np.ndarray:
    name = plan.time_col
    rej.add(_nulls(col), f"event time {name!r} is null")
    t = col.type
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            raw = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
            return np.floor_divide(raw, 1000)
        raw = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return raw * _ARROW_UNIT_US[t.unit]
    if pa.types.is_date(t):
        days = pc.fill_null(col.cast(pa.date32()).cast(pa.int32()), 0).to_numpy(zero_copy_only=False)
        return days.astype(np.int64) * _DAY_US
    if pa.types.is_integer(t):
        raw = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        if plan.factor != 1:
            lim = np.iinfo(np.int64).max // plan.factor
            rej.add(np.abs(raw) > lim, f"event time {name!r} overflows int64 microseconds")
            raw = np.where(np.abs(raw) > lim, 0, raw)
        return raw * plan.factor
    if pa.types.is_floating(t):
        raw = pc.fill_null(col, 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        us = raw * plan.factor
        bad = ~np.isfinite(us) | (np.abs(us) >= 2.0 ** 63)
        rej.add(bad, f"event time {name!r} is not a finite number of microseconds")
        return np.rint(np.where(bad, 0.0, us)).astype(np.int64)
    raise SchemaError(f"source {plan.source!r}: event-time column {name!r} has Arrow type {t}; "
                      "it must be a timestamp, date or number")


def _payload(field: str, col: pa.ChunkedArray, dtype: np.dtype, source: str, rej: _Rejects) -> np.ndarray:
    rej.add(_nulls(col), f"column {field!r} is null")
    t = col.type
    kind = dtype.kind
    if kind in "iu":
        if pa.types.is_timestamp(t):
            col = col.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64())
        elif pa.types.is_date(t):
            col = col.cast(pa.date32()).cast(pa.int32())
        elif pa.types.is_boolean(t) or not pa.types.is_integer(t):
            raise SchemaError(f"source {source!r}: column {field!r} has Arrow type {t}, expected an integer")
        vals = pc.fill_null(col, 0).to_numpy(zero_copy_only=False)
        info = np.iinfo(dtype)
        if vals.dtype.kind == "u":
            out_of_range = vals > np.uint64(info.max)
        else:
            wide = vals.astype(np.int64)
            out_of_range = (wide < info.min) | ((wide > 0) & (wide.astype(np.uint64) > np.uint64(info.max)))
        rej.add(out_of_range, f"column {field!r} is out of range for {dtype.name}")
        return np.where(out_of_range, 0, vals).astype(dtype)
    if kind == "f":
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise SchemaError(f"source {source!r}: column {field!r} has Arrow type {t}, expected a number")
        vals = pc.fill_null(col, 0).to_numpy(zero_copy_only=False)
        out = vals.astype(dtype)
        if vals.dtype.kind in "iu":
            back = np.where(np.isfinite(out), out, 0).astype(vals.dtype)
            rej.add(back != vals, f"column {field!r} is not exactly representable as {dtype.name}")
        return out
    if kind == "b":
        if not pa.types.is_boolean(t):
            raise SchemaError(f"source {source!r}: column {field!r} has Arrow type {t}, expected a boolean")
        return pc.fill_null(col, False).to_numpy(zero_copy_only=False).astype(bool)
    if kind in "US":
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            raise SchemaError(f"source {source!r}: column {field!r} has Arrow type {t}, expected a string")
        width = dtype.itemsize // (4 if kind == "U" else 1)
        filled = pc.fill_null(col, "" if kind == "U" else b"")
        lengths = (pc.utf8_length(filled) if kind == "U" and not pa.types.is_binary(t)
                   else pc.binary_length(filled)).to_numpy(zero_copy_only=False)
        rej.add(lengths > width, f"column {field!r} is longer than {width} characters")
        vals = filled.to_numpy(zero_copy_only=False)
        vals = np.where(lengths > width, "" if kind == "U" else b"", vals)
        return vals.astype(dtype)
    if kind == "O":
        return col.to_numpy(zero_copy_only=False)
    raise SchemaError(f"source {source!r}: field {field!r} has dtype {dtype}, which a Spark source cannot fill")


def convert_table(table: pa.Table, plan: ConversionPlan, chunk_size: int = 10_000
                  ) -> Iterator[tuple[dict, SourceBatch]]:
    """Convert one Arrow table into ``(meta, SourceBatch)`` chunks of at most ``chunk_size`` rows.

    ``meta`` holds ``n`` (rows, rejected included), ``good``, ``tmin``/``tmax``
    (event-time bounds of the good rows, ``None`` if there are none) and
    ``rejected`` (count per reason). With ``on_bad_rows="raise"`` the first
    bad row raises :class:`~replistream.errors.SchemaError` naming the column.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n = table.num_rows
    missing = [c for c in [plan.time_col] + [c for _, c in plan.fields] if c not in table.column_names]
    if missing:
        raise SchemaError(f"source {plan.source!r}: column(s) {missing} missing from the data; "
                          f"it has {table.column_names}")
    rej = _Rejects(n)
    ts = _event_time(table.column(plan.time_col), plan, rej)
    cols = {f: _payload(f, table.column(c), plan.schema[f], plan.source, rej) for f, c in plan.fields}
    if rej.bad.any() and plan.on_bad_rows == "raise":
        i = int(np.flatnonzero(rej.bad)[0])
        raise SchemaError(f"source {plan.source!r}: {rej.reason[i]} in row {table.slice(i, 1).to_pylist()[0]} "
                          "(pass on_bad_rows='dead_letter' to set such rows aside and go on)")
    for a in range(0, n, chunk_size):
        b = min(n, a + chunk_size)
        bad = rej.bad[a:b]
        good = np.flatnonzero(~bad)
        data = np.zeros(len(good), dtype=plan.schema.dtype)
        data[TS] = ts[a:b][good]
        for f, v in cols.items():
            data[f] = v[a:b][good]
        rejected = []
        counts: dict[str, int] = {}
        for i in np.flatnonzero(bad):
            reason = rej.reason[a + i]
            rejected.append((int(i), reason, table.slice(a + int(i), 1).to_pylist()[0]))
            counts[reason] = counts.get(reason, 0) + 1
        positions = None if not len(rejected) else good.astype(np.int64)
        meta = {"n": b - a, "good": int(len(good)), "rejected": counts,
                "tmin": int(data[TS].min()) if len(good) else None,
                "tmax": int(data[TS].max()) if len(good) else None}
        yield meta, SourceBatch(data, n=b - a, positions=positions, rejected=rejected)
