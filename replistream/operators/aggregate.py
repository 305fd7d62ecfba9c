"""Aggregates over time windows (Algorithm 3) and count windows (Algorithm 4), Hwang §IV-F.

Both split their input into groups (``by``: zero or more fields) and form
windows per group; each closed window emits one tuple with the group fields,
the window bounds and one column per aggregation.

Aggregations are given as ``{output name: (field, how)}`` where ``how`` is one
of ``"count"``, ``"sum"``, ``"min"``, ``"max"``, ``"mean"`` or a
:class:`Summary` (a user function over the window's values). ``"count"``
takes ``None`` as its field.

Replica consistency needs bit-identical outputs whatever the input order and
batching. Counts, integer sums, minima and maxima are associative as they are;
float sums and means use an exact superaccumulator
(:mod:`replistream.exact`), and a :class:`Summary` sees the window's values
sorted by (ts, id), so a user function need not be order-insensitive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import QueryError
from ..exact import ExactSums, exact_row_sums
from ..ids import hash_columns, mix, stable_hash
from ..schema import ID, TS, Schema
from .base import OperatorLogic
from .sorter import canonical_order

BUILTIN = ("count", "sum", "min", "max", "mean")


@dataclass(frozen=True)
class Summary:
    """A user-defined window summary: ``fn(values) -> scalar`` of ``dtype``.

    ``values`` are the window's values of the aggregated field (or its whole
    rows when the field is ``"*"``), sorted by (ts, id), the same on every
    replica.

    >>> spread = Summary(lambda v: v.max() - v.min(), "f8")
    >>> float(spread.fn(np.array([1.0, 4.0])))
    3.0
    """

    fn: Callable
    dtype: Any = "f8"


@dataclass(frozen=True)
class Agg:
    """One normalised aggregation: output ``name``, input ``field``, ``how``."""

    name: str
    field: str | None
    how: str | Summary


def normalize_aggs(aggs: Mapping[str, Any], schema: Schema, where: str) -> tuple[Agg, ...]:
    """Validate ``{name: (field, how)}`` against ``schema``; returns :class:`Agg` tuples.

    >>> normalize_aggs({"n": "count", "s": ("x", "sum")}, Schema({"x": "f8"}), "agg")
    (Agg(name='n', field=None, how='count'), Agg(name='s', field='x', how='sum'))
    """
    if not aggs:
        raise QueryError(f"{where}: at least one aggregation is required, e.g. aggs={{'n': 'count'}}")
    out = []
    for name, spec in aggs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise QueryError(f"{where}: aggregation name {name!r} is not a valid identifier")
        if spec == "count":
            spec = (None, "count")
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise QueryError(f"{where}: aggregation {name!r} must be (field, how), got {spec!r}")
        field, how = spec
        if isinstance(how, Summary):
            if field != "*" and field not in schema:
                raise QueryError(f"{where}: aggregation {name!r} reads unknown field {field!r}")
        elif how not in BUILTIN:
            raise QueryError(f"{where}: aggregation {name!r}: unknown function {how!r}; "
                             f"use one of {BUILTIN} or a Summary")
        elif how == "count":
            if field not in (None, "*") and field not in schema:
                raise QueryError(f"{where}: aggregation {name!r} reads unknown field {field!r}")
            field = None
        else:
            if field not in schema:
                raise QueryError(f"{where}: aggregation {name!r} reads unknown field {field!r}")
            if schema[field].kind not in "iufb":
                raise QueryError(f"{where}: aggregation {name!r}: {how} needs a numeric field; "
                                 f"{field!r} has dtype {schema[field]}")
        out.append(Agg(name, field, how))
    return tuple(out)


def agg_dtype(agg: Agg, schema: Schema) -> np.dtype:
    if isinstance(agg.how, Summary):
        return np.dtype(agg.how.dtype)
    if agg.how == "count":
        return np.dtype(np.int64)
    if agg.how == "mean":
        return np.dtype(np.float64)
    kind = schema[agg.field].kind
    if agg.how == "sum":
        return np.dtype(np.float64 if kind == "f" else np.uint64 if kind == "u" else np.int64)
    return np.dtype(np.float64) if kind == "f" else schema[agg.field]


def _sum_dtype(kind: str) -> np.dtype:
    return np.dtype(np.uint64 if kind == "u" else np.int64)


def _extreme(dt: np.dtype, how: str):
    if dt.kind == "f":
        return np.inf if how == "min" else -np.inf
    if dt.kind == "b":
        return True if how == "min" else False
    info = np.iinfo(dt)
    return info.max if how == "min" else info.min


def _canon(values: np.ndarray) -> np.ndarray:
    """-0.0 -> 0.0 so that min/max do not depend on arrival order."""
    return values + 0.0 if values.dtype.kind == "f" else values


class _GroupedWindows(OperatorLogic):
    """What both aggregates share: parameters, output schema, group hashing."""

    def __init__(self, name, in_schemas, size: int, slide: int | None, by: Sequence[str] | str | None,
                 aggs: Mapping[str, Any], window_fields: list[tuple[str, str]], strict: bool = False):
        schema = in_schemas[0]
        kind = type(self).__name__
        if len(in_schemas) != 1:
            raise QueryError(f"{kind} {name!r} takes exactly one input, got {len(in_schemas)}")
        size = int(size)
        slide = size if slide is None else int(slide)
        if size <= 0:
            raise ValueError(f"{kind} {name!r}: window size must be > 0, got {size}")
        if slide <= 0:
            raise ValueError(f"{kind} {name!r}: slide must be > 0, got {slide}")
        by = (by,) if isinstance(by, str) else tuple(by or ())
        for f in by:
            if f not in schema:
                raise QueryError(f"{kind} {name!r}: group field {f!r} is not a field of {schema!r}")
        self.aggs = normalize_aggs(aggs, schema, f"{kind} {name!r}")
        fields = [(f, schema[f]) for f in by] + window_fields + [(a.name, agg_dtype(a, schema)) for a in self.aggs]
        names = [f for f, _ in fields]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise QueryError(f"{kind} {name!r}: output field(s) {sorted(dup)} clash; rename the aggregation")
        super().__init__(name, in_schemas, Schema(fields), strict)
        self.size, self.slide, self.by = size, slide, by
        self._salt = stable_hash(name)

    def _group_hash(self, batch: np.ndarray) -> np.ndarray:
        if not self.by:
            return np.zeros(len(batch), dtype=np.uint64)
        return hash_columns(batch, self.by)


class TimeWindowAggregateLogic(_GroupedWindows):
    """Algorithm 3 (Hwang §IV-F): per group, windows ``[start, start + size)`` every ``slide``.

    A tuple updates every window it belongs to as it arrives, in any order
    (lines 1-3); a watermark ``p`` closes every window whose last timestamp
    ``start + size - 1 <= p`` (lines 4-8). The output tuple has
    ``ts = start + size - 1`` (when it would close in the ideal run), fields
    ``by..., window_start, window_end`` (end exclusive) and the aggregations,
    and id ``mix(hash(operator), hash(group), start)``.

    State is columnar: one row per open (group, window) in numpy arrays,
    located through a dict from the 64-bit (group, window) hash.

    >>> from replistream.schema import Punctuation
    >>> s = Schema({"k": "i8", "x": "f8"})
    >>> a = TimeWindowAggregateLogic("a", [s], size=10, by="k", aggs={"n": "count", "m": ("x", "mean")})
    >>> a.process(0, s.from_columns({"ts": [1, 5, 12], "k": [1, 1, 1], "x": [1.0, 2.0, 9.0]}, ids=[1, 2, 3]))
    []
    >>> out = a.process(0, Punctuation(9)); out[0][["ts", "k", "window_start", "n", "m"]].tolist()
    [(9, 1, 0, 2, 1.5)]
    """

    def __init__(self, name, in_schemas, size, slide=None, by=None, aggs=None, strict=False):
        super().__init__(name, in_schemas, size, slide, by, aggs or {"count": "count"},
                         [("window_start", "i8"), ("window_end", "i8")], strict)
        schema = in_schemas[0]
        self._nwin = -(-self.size // self.slide)  # windows per tuple, at most
        self._index: dict[int, int] = {}
        self._free: list[int] = []
        self._cap = 0
        self._n = 0  # rows ever allocated (high-water mark)
        self._key = np.zeros(0, dtype=np.uint64)
        self._start = np.zeros(0, dtype=np.int64)
        self._alive = np.zeros(0, dtype=bool)
        self._group = np.zeros(0, dtype=[(f, schema[f]) for f in self.by]) if self.by else None
        self._count = np.zeros(0, dtype=np.int64)
        self._acc: dict[tuple, Any] = {}
        self._udf: dict[str, dict[int, list]] = {}
        for a in self.aggs:
            if isinstance(a.how, Summary):
                self._udf[a.name] = {}
            elif a.how in ("sum", "mean"):
                kind = schema[a.field].kind
                if kind == "f":
                    self._acc.setdefault(("fsum", a.field), ExactSums(0))
                else:
                    self._acc.setdefault(("isum", a.field), np.zeros(0, dtype=_sum_dtype(kind)))
            elif a.how in ("min", "max"):
                self._acc.setdefault((a.how, a.field), np.zeros(0, dtype=agg_dtype(a, schema)))
        self._grow(64)

    # -- storage ----------------------------------------------------------
    def _grow(self, need: int) -> None:
        if need <= self._cap:
            return
        cap = max(need, 2 * self._cap)

        def ext(arr, fill=0):
            new = np.full(cap, fill, dtype=arr.dtype) if arr.dtype.names is None else np.zeros(cap, dtype=arr.dtype)
            new[: len(arr)] = arr
            return new

        self._key, self._start, self._alive, self._count = (ext(self._key), ext(self._start),
                                                             ext(self._alive, False), ext(self._count))
        if self._group is not None:
            self._group = ext(self._group)
        for k, acc in self._acc.items():
            if isinstance(acc, ExactSums):
                acc.grow(cap)
            else:
                self._acc[k] = ext(acc, _extreme(acc.dtype, k[0]) if k[0] in ("min", "max") else 0)
        self._cap = cap

    def _allocate(self, k: int) -> np.ndarray:
        take = min(k, len(self._free))
        rows = [self._free.pop() for _ in range(take)]
        extra = k - take
        if extra:
            self._grow(self._n + extra)
            rows.extend(range(self._n, self._n + extra))
            self._n += extra
        return np.asarray(rows, dtype=np.int64)

    # -- Algorithm 3 --------------------------------------------------------
    def _on_batch(self, port, batch):
        ts = batch[TS]
        size, slide = self.size, self.slide
        last = np.floor_divide(ts, slide) * slide
        if self._nwin == 1:
            src = np.arange(len(batch))
            starts = last
        else:
            src = np.repeat(np.arange(len(batch)), self._nwin)
            starts = last[src] - np.tile(np.arange(self._nwin, dtype=np.int64), len(batch)) * slide
        valid = starts + size > ts[src]
        if not valid.all():
            src, starts = src[valid], starts[valid]
        if not len(src):
            return []
        key = mix(self._group_hash(batch)[src], starts.view(np.uint64))
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        rows = np.fromiter((self._index.get(h, -1) for h in uniq.tolist()), dtype=np.int64, count=len(uniq))
        miss = rows < 0
        if miss.any():
            new = self._allocate(int(miss.sum()))
            rows[miss] = new
            self._index.update(zip(uniq[miss].tolist(), new.tolist()))
            f = first[miss]
            self._key[new] = uniq[miss]
            self._start[new] = starts[f]
            self._alive[new] = True
            self._count[new] = 0
            if self._group is not None:
                self._group[new] = batch[list(self.by)][src[f]]
            for k, acc in self._acc.items():
                if isinstance(acc, ExactSums):
                    acc.clear(new)
                else:
                    acc[new] = _extreme(acc.dtype, k[0]) if k[0] in ("min", "max") else 0
        if self._group is not None and not miss.all():
            # A 64-bit (group, window) hash collision would merge two windows: check, never ignore.
            hit = ~miss
            stored, seen = self._group[rows[hit]], batch[src[first[hit]]]
            same = self._start[rows[hit]] == starts[first[hit]]
            for f in self.by:
                a, b = stored[f], seen[f]
                same &= (a == b) | ((a != a) & (b != b)) if a.dtype.kind == "f" else (a == b)
            if not same.all():
                raise RuntimeError(f"aggregate {self.name!r}: 64-bit group hash collision")
        order = np.argsort(inv, kind="stable")
        seg = np.r_[0, np.flatnonzero(np.diff(inv[order])) + 1]
        self._count[rows] += np.diff(np.r_[seg, len(order)])
        srco = src[order]
        for (kind, field), acc in self._acc.items():
            vals = batch[field][srco]
            if kind == "fsum":
                acc.add(rows[inv[order]], vals)
            elif kind == "isum":
                acc[rows] += np.add.reduceat(vals.astype(acc.dtype), seg)
            elif kind == "min":
                acc[rows] = np.minimum(acc[rows], np.minimum.reduceat(_canon(vals).astype(acc.dtype), seg))
            else:
                acc[rows] = np.maximum(acc[rows], np.maximum.reduceat(_canon(vals).astype(acc.dtype), seg))
        if self._udf:
            cols = [TS, ID] + sorted({a.field for a in self.aggs if isinstance(a.how, Summary) and a.field != "*"})
            part = batch[srco] if any(a.field == "*" for a in self.aggs if isinstance(a.how, Summary)) \
                else batch[cols][srco]
            bounds = np.r_[seg, len(order)]
            for name, store in self._udf.items():
                for i, r in enumerate(rows.tolist()):
                    store.setdefault(r, []).append(part[bounds[i]:bounds[i + 1]])
        return []

    def _on_watermark(self, wm):
        closing = np.flatnonzero(self._alive[: self._n] & (self._start[: self._n] <= wm - self.size + 1))
        if not len(closing):
            return []
        out = np.empty(len(closing), dtype=self.out_schema.dtype)
        out[TS] = self._start[closing] + (self.size - 1)
        out[ID] = mix(self._salt, self._key[closing])
        for f in self.by:
            out[f] = self._group[f][closing]
        out["window_start"] = self._start[closing]
        out["window_end"] = self._start[closing] + self.size
        counts = self._count[closing]
        sums: dict[str, np.ndarray] = {}
        for (kind, field), acc in self._acc.items():
            if kind == "fsum":
                sums[field] = acc.result(closing)
            elif kind == "isum":
                sums[field] = acc[closing]
        for a in self.aggs:
            if isinstance(a.how, Summary):
                store = self._udf[a.name]
                vals = []
                for r in closing.tolist():
                    rows = np.concatenate(store.pop(r))
                    rows = rows[canonical_order(rows)]
                    vals.append(a.how.fn(rows if a.field == "*" else rows[a.field]))
                out[a.name] = np.asarray(vals, dtype=out.dtype.fields[a.name][0])
            elif a.how == "count":
                out[a.name] = counts
            elif a.how == "sum":
                out[a.name] = sums[a.field]
            elif a.how == "mean":
                out[a.name] = sums[a.field] / counts
            else:
                out[a.name] = self._acc[(a.how, a.field)][closing]
        self._alive[closing] = False
        keys = self._key[closing].tolist()
        for h in keys:
            del self._index[h]
        self._free.extend(closing.tolist())
        return [out[canonical_order(out)]]

    @property
    def open_windows(self) -> int:
        return len(self._index)


class CountWindowAggregateLogic(_GroupedWindows):
    """Algorithm 4 (Hwang §IV-F): per group, windows of ``size`` tuples every ``slide`` tuples.

    Count windows are order sensitive, so the operator sorts its input by
    (ts, id) up to each watermark first (lines 1-6, §IV-C) and then counts
    tuples per group in that order (lines 7-15). Window ``j`` of a group holds
    the group's tuples number ``j*slide .. j*slide + size - 1``; it closes when
    its last tuple is released, and the output has ``ts`` = that tuple's ts,
    fields ``by..., window, first_ts, last_ts`` and the aggregations, and id
    ``mix(hash(operator), hash(group), j)``.

    >>> from replistream.schema import Punctuation
    >>> s = Schema({"x": "i8"})
    >>> c = CountWindowAggregateLogic("c", [s], size=2, aggs={"s": ("x", "sum")})
    >>> _ = c.process(0, s.from_columns({"ts": [3, 1, 2], "x": [30, 10, 20]}, ids=[1, 2, 3]))
    >>> c.process(0, Punctuation(5))[0][["ts", "window", "s"]].tolist()
    [(2, 0, 30)]
    """

    def __init__(self, name, in_schemas, size, slide=None, by=None, aggs=None, strict=False):
        super().__init__(name, in_schemas, size, slide, by, aggs or {"count": "count"},
                         [("window", "i8"), ("first_ts", "i8"), ("last_ts", "i8")], strict)
        self._buffer: list[np.ndarray] = []
        # group hash -> [tuples counted so far, next window index, pending tuples]
        self._groups: dict[int, list] = {}

    order_sensitive = False  # it sorts its own input (Algorithm 4, lines 1-6)

    def _on_batch(self, port, batch):
        self._buffer.append(batch)
        return []

    def _on_watermark(self, wm):
        if not self._buffer:
            return []
        buf = np.concatenate(self._buffer)
        ready = buf[TS] <= wm
        self._buffer = [buf[~ready]] if not ready.all() else []
        rel = buf[ready]
        if not len(rel):
            return []
        rel = rel[canonical_order(rel)]
        gh = self._group_hash(rel)
        order = np.argsort(gh, kind="stable")
        gs = gh[order]
        cuts = np.r_[0, np.flatnonzero(gs[1:] != gs[:-1]) + 1, len(gs)]
        size, slide = self.size, self.slide
        outs = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            g = int(gs[a])
            new = rel[order[a:b]]
            st = self._groups.get(g)
            if st is None:
                st = self._groups[g] = [0, 0, new[:0]]
            count, nxt, pending = st
            start_pos = count - len(pending)
            seq = np.concatenate([pending, new]) if len(pending) else new
            count += len(new)
            if nxt * slide + size <= count:
                last_j = (count - size) // slide
                js = np.arange(nxt, last_j + 1, dtype=np.int64)
                idx = (js * slide - start_pos)[:, None] + np.arange(size)
                outs.append(self._windows(g, seq, idx, js))
                nxt = last_j + 1
            keep_from = nxt * slide - start_pos
            pending = seq[keep_from:] if keep_from < len(seq) else seq[:0]
            st[0], st[1], st[2] = count, nxt, pending
        if not outs:
            return []
        out = np.concatenate(outs)
        return [out[canonical_order(out)]]

    def _windows(self, g: int, seq: np.ndarray, idx: np.ndarray, js: np.ndarray) -> np.ndarray:
        n = len(js)
        out = np.empty(n, dtype=self.out_schema.dtype)
        win = seq[idx]  # (n, size) rows, each in canonical order
        out[TS] = win[TS][:, -1]
        out[ID] = mix(self._salt, np.uint64(g), js.view(np.uint64))
        for f in self.by:
            out[f] = win[f][:, 0]
        out["window"] = js
        out["first_ts"] = win[TS][:, 0]
        out["last_ts"] = win[TS][:, -1]
        for a in self.aggs:
            if isinstance(a.how, Summary):
                out[a.name] = [a.how.fn(w if a.field == "*" else w[a.field]) for w in win]
            elif a.how == "count":
                out[a.name] = self.size
            else:
                v = win[a.field]
                if a.how in ("sum", "mean"):
                    s = exact_row_sums(v) if v.dtype.kind == "f" else v.astype(_sum_dtype(v.dtype.kind)).sum(axis=1)
                    out[a.name] = s / self.size if a.how == "mean" else s
                elif a.how == "min":
                    out[a.name] = _canon(v).min(axis=1)
                else:
                    out[a.name] = _canon(v).max(axis=1)
        return out
