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
from ..exact import LIMBS, ExactSums, exact_row_sums
from ..ids import argsort_u64, hash_columns, mix, stable_hash
from ..schema import END, ID, TS, Schema
from .base import OperatorLogic, bin_list, bin_of, concat_ranges
from .keyed import bin_ranges
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


class SortedIndex:
    """A map from uint64 keys to int64 rows kept as two sorted arrays: lookups, inserts and
    deletes of a whole batch of keys are a ``searchsorted`` and one merge, with no Python per
    key (the open windows of :class:`TimeWindowAggregateLogic`).

    >>> ix = SortedIndex()
    >>> ix.insert(np.array([9, 2], dtype=np.uint64), np.array([0, 1]))
    >>> ix.get(np.array([2, 5, 9], dtype=np.uint64)).tolist()
    [1, -1, 0]
    >>> ix.delete(np.array([9], dtype=np.uint64)); len(ix), ix.get(np.array([9], dtype=np.uint64)).tolist()
    (1, [-1])
    """

    def __init__(self):
        self.keys = np.zeros(0, dtype=np.uint64)
        self.rows = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key, -1 where absent."""
        if not len(self.keys):
            return np.full(len(keys), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[pos] == keys, self.rows[pos], -1)

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add ``keys`` (distinct, none present) with their rows."""
        keys = np.asarray(keys, dtype=np.uint64)
        order = argsort_u64(keys)
        keys, rows = keys[order], np.asarray(rows, dtype=np.int64)[order]
        at = np.searchsorted(self.keys, keys)
        self.keys, self.rows = np.insert(self.keys, at, keys), np.insert(self.rows, at, rows)

    def delete(self, keys: np.ndarray) -> None:
        """Remove ``keys`` (each present)."""
        pos = np.searchsorted(self.keys, keys)
        keep = np.ones(len(self.keys), dtype=bool)
        keep[pos] = False
        self.keys, self.rows = self.keys[keep], self.rows[keep]

    def reset(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Exactly these ``keys`` and ``rows``."""
        self.keys, self.rows = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        self.insert(keys, rows)


class HashRuns:
    """Slot rows indexed by key hash, for finding a bin's rows without a pass over the rest (live
    bins, Megaphone §3.4): sorted runs of ``(hash, row, tag)``, each at least twice as long as
    the next (a log-structured merge, so a row is copied ``O(log n)`` times over its life). The
    rows of a bin, the top bits of the hash, are a slice of every run for any number of bins.

    Removal is lazy: an entry stays until a compaction and is valid while the slot still holds
    the row it was added for, which the caller checks with ``valid(rows, tags)`` (a freed slot is
    reused with another tag). :meth:`forget` counts removals and compacts once they outnumber
    the live entries.

    >>> ix = HashRuns()
    >>> ix.add(np.array([2**63 + 1, 5], dtype=np.uint64), np.array([0, 1]), np.array([10, 11], dtype=np.uint64))
    >>> ix.rows(1, np.array([1]), lambda r, t: np.ones(len(r), bool)).tolist()
    [0]
    >>> ix.rows(1, np.array([0, 1]), lambda r, t: r != 1).tolist()   # row 1 was freed
    [0]
    """

    #: entries gathered unsorted before they become a run (a batch then pays a list append)
    FOLD = 1024

    def __init__(self):
        self.hash: list[np.ndarray] = []
        self.row: list[np.ndarray] = []
        self.tag: list[np.ndarray] = []
        self.stale = 0
        self._new: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._n_new = 0

    def __len__(self) -> int:
        return sum(len(h) for h in self.hash) + self._n_new

    def add(self, hashes: np.ndarray, rows: np.ndarray, tags: np.ndarray) -> None:
        """Index new ``rows`` (with their ``hashes`` and ``tags``): gathered, then sorted into a
        run once :attr:`FOLD` have come (amortised merges follow)."""
        if not len(hashes):
            return
        self._new.append((np.asarray(hashes, dtype=np.uint64), np.asarray(rows, dtype=np.int64),
                          np.asarray(tags, dtype=np.uint64)))
        self._n_new += len(hashes)
        if self._n_new >= self.FOLD:
            self._fold()

    def _fold(self) -> None:
        """Sort the gathered entries into a new run and merge runs as the invariant asks."""
        if not self._new:
            return
        h, r, t = (np.concatenate(x) for x in zip(*self._new))
        self._new, self._n_new = [], 0
        order = argsort_u64(h)
        self.hash.append(h[order])
        self.row.append(r[order])
        self.tag.append(t[order])
        while len(self.hash) > 1 and 2 * len(self.hash[-1]) >= len(self.hash[-2]):
            a, b = self.hash[-2], self.hash[-1]
            at = np.searchsorted(a, b)
            self.hash[-2] = np.insert(a, at, b)
            self.row[-2] = np.insert(self.row[-2], at, self.row[-1])
            self.tag[-2] = np.insert(self.tag[-2], at, self.tag[-1])
            del self.hash[-1], self.row[-1], self.tag[-1]

    def rows(self, bits: int, bins: np.ndarray, valid, tags: bool = False):
        """The valid rows whose hash lies in ``bins`` (sorted, distinct) at ``2**bits`` bins; with
        ``tags``, ``(rows, their tags)``."""
        self._fold()
        got, got_t = [], []
        for h, r, t in zip(self.hash, self.row, self.tag):
            idx = concat_ranges(*bin_ranges(h, bits, bins))
            if len(idx):
                rr, tt = r[idx], t[idx]
                ok = valid(rr, tt)
                got.append(rr[ok])
                got_t.append(tt[ok])
        rows = np.concatenate(got) if got else np.zeros(0, dtype=np.int64)
        if not tags:
            return rows
        return rows, (np.concatenate(got_t) if got_t else np.zeros(0, dtype=np.uint64))

    def forget(self, n: int, valid) -> None:
        """``n`` indexed rows were removed; once removals outnumber the live entries, drop every
        entry ``valid`` rejects (one pass, amortised over the removals)."""
        self.stale += int(n)
        total = len(self)
        if self.stale * 2 <= total or not total:
            return
        self._fold()
        h, r, t = (np.concatenate(x) for x in (self.hash, self.row, self.tag))
        keep = valid(r, t)
        order = np.argsort(h[keep], kind="stable")
        self.hash, self.row, self.tag = [h[keep][order]], [r[keep][order]], [t[keep][order]]
        self.stale = 0


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

    def _state_params(self):
        aggs = tuple((a.name, a.field, a.how if isinstance(a.how, str) else "summary") for a in self.aggs)
        return {"size": self.size, "slide": self.slide, "by": self.by, "aggs": aggs}


class TimeWindowAggregateLogic(_GroupedWindows):
    """Algorithm 3 (Hwang §IV-F): per group, windows ``[start, start + size)`` every ``slide``.

    A tuple updates every window it belongs to as it arrives, in any order
    (lines 1-3); a watermark ``p`` closes every window whose last timestamp
    ``start + size - 1 <= p`` (lines 4-8). The output tuple has
    ``ts = start + size - 1`` (when it would close in the ideal run), fields
    ``by..., window_start, window_end`` (end exclusive) and the aggregations,
    and id ``mix(hash(operator), hash(group), start)``.

    State is columnar: one row per open (group, window) in numpy arrays,
    located through a sorted index of the 64-bit (group, window) hash. The rows are also
    indexed by group hash (:class:`HashRuns`), so the bins of the state (the top bits of the
    group hash, Megaphone §3.4) are found without hashing or scanning the rest: a transfer
    step's :meth:`checkpoint` costs its bins' windows, and :meth:`install_bins` adds a step's
    windows to a running logic.

    >>> from replistream.schema import Punctuation
    >>> s = Schema({"k": "i8", "x": "f8"})
    >>> a = TimeWindowAggregateLogic("a", [s], size=10, by="k", aggs={"n": "count", "m": ("x", "mean")})
    >>> a.process(0, s.from_columns({"ts": [1, 5, 12], "k": [1, 1, 1], "x": [1.0, 2.0, 9.0]}, ids=[1, 2, 3]))
    []
    >>> out = a.process(0, Punctuation(9)); out[0][["ts", "k", "window_start", "n", "m"]].tolist()
    [(9, 1, 0, 2, 1.5)]

    Hand-over: a fresh replica restored from a checkpoint closes the open window
    exactly as the original would (docs/design.md, decision 7):

    >>> b = TimeWindowAggregateLogic("a", [s], size=10, by="k", aggs={"n": "count", "m": ("x", "mean")})
    >>> b.restore(a.checkpoint()).process(0, Punctuation(19))[0][["ts", "n", "m"]].tolist()
    [(19, 1, 9.0)]
    """

    def __init__(self, name, in_schemas, size, slide=None, by=None, aggs=None, strict=False):
        super().__init__(name, in_schemas, size, slide, by, aggs or {"count": "count"},
                         [("window_start", "i8"), ("window_end", "i8")], strict)
        schema = in_schemas[0]
        self._nwin = -(-self.size // self.slide)  # windows per tuple, at most
        self._index = SortedIndex()  # open window's (group, start) hash -> row
        self._bins = HashRuns()  # open windows by group hash (live bins)
        self._ghash = np.zeros(0, dtype=np.uint64)  # each row's group hash
        self._free = np.zeros(0, dtype=np.int64)  # rows of closed windows, reused first
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
        self._ghash = ext(self._ghash)
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
        rows = self._free[len(self._free) - take:][::-1]
        self._free = self._free[:len(self._free) - take]
        extra = k - take
        if extra:
            self._grow(self._n + extra)
            rows = np.r_[rows, np.arange(self._n, self._n + extra, dtype=np.int64)]
            self._n += extra
        return np.ascontiguousarray(rows, dtype=np.int64)

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
        gsrc = self._group_hash(batch)[src]
        key = mix(gsrc, starts.view(np.uint64))
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        rows = self._index.get(uniq)
        miss = rows < 0
        if miss.any():
            new = self._allocate(int(miss.sum()))
            rows[miss] = new
            self._index.insert(uniq[miss], new)
            f = first[miss]
            self._key[new] = uniq[miss]
            self._ghash[new] = gsrc[f]
            self._bins.add(gsrc[f], new, uniq[miss])
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

    def quiet_until(self, at: int) -> int:
        """The last timestamp before the end of the first window still open at watermark ``at``:
        no window closes until the watermark passes it (the windows start at multiples of the
        slide), so a rescale's new owner takes punctuations up to it without its moving bins.

        >>> TimeWindowAggregateLogic("a", [Schema({"k": "i8"})], size=10, by="k").quiet_until(5)
        8
        """
        first = (np.floor_divide(int(at) - self.size + 1, self.slide) + 1) * self.slide
        return int(first + self.size - 2)

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
        self._index.delete(self._key[closing])
        self._bins.forget(len(closing), self._live_row)
        self._free = np.r_[self._free, closing.astype(np.int64)]
        return [out[canonical_order(out)]]

    @property
    def open_windows(self) -> int:
        return len(self._index)

    # -- hand-over (docs/design.md, decision 7) ------------------------------------
    # One row per open (group, window), binned by the group's hash so that all
    # windows of a group share a bin (Megaphone). Exact float sums travel as a
    # band of their non-zero limbs per row (a handful of the 70), plus the
    # special-value counts and the adds since the last renormalisation.
    def bin_keys(self, port, batch):
        """Group hash: all windows of a group share the group's bin (Megaphone §3.2)."""
        return self._group_hash(batch)

    live_bins = True

    def _live_row(self, rows: np.ndarray, tags: np.ndarray) -> np.ndarray:
        """Whether each slot still holds the open window ``tags`` names (:class:`HashRuns`)."""
        return self._alive[rows] & (self._key[rows] == tags)

    def _live_tables(self, bits, bins):
        """The open windows of ``bins`` (all when None), found by group hash, with their values."""
        if bins is None:
            rows = np.flatnonzero(self._alive[: self._n])
        else:
            rows = np.sort(self._bins.rows(bits, bins, self._live_row))  # slot order, as the whole layout
        return self._tables_of(rows, True)

    def _state_tables(self, keyed):
        return self._tables_of(np.flatnonzero(self._alive[: self._n]), keyed)

    def drop_bins(self, bits: int, bins) -> int:
        """Forget the open windows of ``bins`` (at ``2**bits`` bins): a rescale gave them to
        another partition (replistream/replica/rescale.py). Costs their rows, as closing them
        would. Returns how many windows were dropped.

        >>> s = Schema({"k": "i8"})
        >>> a = TimeWindowAggregateLogic("a", [s], size=10, by="k")
        >>> _ = a.process(0, s.from_columns({"ts": [1, 2, 3], "k": [1, 2, 3]}, ids=[1, 2, 3]))
        >>> gone = a.checkpoint(1).nonempty_bins()[:1]
        >>> a.drop_bins(1, gone) > 0, a.checkpoint(1).select(gone).rows()
        (True, 0)
        """
        rows = np.unique(self._bins.rows(int(bits), np.asarray(list(bins), dtype=np.int64), self._live_row))
        if not len(rows):
            return 0
        self._alive[rows] = False
        self._index.delete(self._key[rows])
        self._bins.forget(len(rows), self._live_row)
        self._free = np.r_[self._free, rows.astype(np.int64)]
        for store in self._udf.values():
            for r in rows.tolist():
                store.pop(r, None)
        return int(len(rows))

    def _tables_of(self, rows: np.ndarray, keyed: bool) -> dict:
        """``{table: (columns, group hash or None)}`` of the open windows in slots ``rows``."""
        cols: dict[str, np.ndarray] = {"key": self._key[rows], "start": self._start[rows],
                                       "count": self._count[rows]}
        if self._group is not None:
            cols["group"] = self._group[rows]
        for (kind, fld), acc in self._acc.items():
            if isinstance(acc, ExactSums):
                lo, band = _pack_limbs(acc.limbs[rows])
                cols[f"fsum:{fld}:lo"], cols[f"fsum:{fld}:band"] = lo, band
                cols[f"fsum:{fld}:special"] = acc.special[rows]
                cols[f"fsum:{fld}:adds"] = acc.adds[rows]
            else:
                cols[f"{kind}:{fld}"] = acc[rows]
        ghash = self._ghash[rows] if keyed else None
        tables = {"windows": (cols, ghash)}
        for name, store in self._udf.items():
            parts, lens, owner = [], [], []
            for i, r in enumerate(rows.tolist()):
                ps = store.get(r)
                if ps:
                    parts.extend(ps)
                    lens.extend(map(len, ps))
                    owner.extend([i] * len(ps))
            at = np.repeat(np.asarray(owner, dtype=np.int64), lens) if parts else np.zeros(0, np.int64)
            tables[f"udf:{name}"] = ({"rows": _join_parts(parts) if parts else self._udf_empty(name),
                                      "key": cols["key"][at]},
                                     ghash[at] if keyed else None)
        return tables

    def _udf_empty(self, name: str) -> np.ndarray:
        schema = self.in_schemas[0]
        whole = any(a.field == "*" for a in self.aggs if isinstance(a.how, Summary))
        if whole:
            return schema.empty()
        cols = [TS, ID] + sorted({a.field for a in self.aggs if isinstance(a.how, Summary) and a.field != "*"})
        return _repack_fields(schema.empty()[cols])

    def _restore_tables(self, tables):
        self._install_tables(tables)

    def _install_tables(self, tables):
        """Open the windows of ``tables`` (of groups this logic does not hold) in fresh slots."""
        cols = tables["windows"]
        n = len(cols["key"])
        if not n:
            return
        rows = self._allocate(n)
        self._key[rows] = cols["key"]
        ghash = self._group_hash(cols["group"]) if self._group is not None else np.zeros(n, dtype=np.uint64)
        self._ghash[rows] = ghash
        self._bins.add(ghash, rows, cols["key"])
        self._start[rows] = cols["start"]
        self._count[rows] = cols["count"]
        self._alive[rows] = True
        if self._group is not None:
            self._group[rows] = cols["group"]
        for (kind, fld), acc in self._acc.items():
            if isinstance(acc, ExactSums):
                acc.clear(rows)
                _unpack_limbs(acc.limbs, rows, cols[f"fsum:{fld}:lo"], cols[f"fsum:{fld}:band"])
                acc.special[rows] = cols[f"fsum:{fld}:special"]
                acc.adds[rows] = cols[f"fsum:{fld}:adds"]
            else:
                acc[rows] = cols[f"{kind}:{fld}"]
        self._index.insert(cols["key"], rows)
        for name, store in self._udf.items():
            t = tables[f"udf:{name}"]
            if not len(t["key"]):
                continue
            where = self._index.get(t["key"])
            order = np.argsort(where, kind="stable")
            w = where[order]
            cuts = np.r_[0, np.flatnonzero(w[1:] != w[:-1]) + 1, len(w)]
            for a, b in zip(cuts[:-1], cuts[1:]):
                store[int(w[a])] = [t["rows"][order[a:b]]]


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

    Live bins (Megaphone §3.4): the groups are indexed by group hash (:class:`HashRuns`, in the
    order they appeared), so a transfer step's :meth:`checkpoint` visits only its bins' groups
    (and hashes the unreleased input, which lies above the watermark), and
    :meth:`install_bins` adds a step's groups to a running logic.

    Hand-over restores the unreleased input and each group's count and pending tuples:

    >>> d = CountWindowAggregateLogic("c", [s], size=2, aggs={"s": ("x", "sum")}).restore(c.checkpoint())
    >>> _ = d.process(0, s.from_columns({"ts": [7], "x": [70]}, ids=[4]))
    >>> d.process(0, Punctuation(9))[0][["ts", "window", "s"]].tolist()
    [(7, 1, 100)]
    """

    def __init__(self, name, in_schemas, size, slide=None, by=None, aggs=None, strict=False):
        super().__init__(name, in_schemas, size, slide, by, aggs or {"count": "count"},
                         [("window", "i8"), ("first_ts", "i8"), ("last_ts", "i8")], strict)
        self._buffer: list[np.ndarray] = []
        # group hash -> [tuples counted so far, next window index, pending tuples]
        self._groups: dict[int, list] = {}
        self._gindex = HashRuns()  # the groups by hash; row: the group's rank (the order groups came in)
        self._rank: dict[int, int] = {}  # each group's rank (an index entry of another is stale)
        self._ranks = 0  # ranks given so far

    order_sensitive = False  # it sorts its own input (Algorithm 4, lines 1-6)

    def frozen_until(self, at: int) -> int:
        """A group's windows close by its own tuples' count, never by time: a bin that gets no
        tuple after ``at`` keeps its state from watermark ``at`` on, so a rescale's old owner
        gives many steps in one pass at the last of their times (replistream/replica/rescale.py).

        >>> CountWindowAggregateLogic("c", [Schema({"x": "i8"})], size=2).frozen_until(5) > 10 ** 15
        True
        """
        return END - 1

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
        order = argsort_u64(gh)
        gs = gh[order]
        cuts = np.r_[0, np.flatnonzero(gs[1:] != gs[:-1]) + 1, len(gs)]
        size, slide = self.size, self.slide
        outs = []
        fresh = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            g = int(gs[a])
            new = rel[order[a:b]]
            st = self._groups.get(g)
            if st is None:
                st = self._groups[g] = [0, 0, new[:0]]
                fresh.append(g)
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
        self._index_groups(fresh)
        if not outs:
            return []
        out = np.concatenate(outs)
        return [out[canonical_order(out)]]

    def _index_groups(self, groups: list[int]) -> None:
        """Index groups just added to ``_groups``, ranked after every group indexed before."""
        if groups:
            h = np.asarray(groups, dtype=np.uint64)
            ranks = np.arange(self._ranks, self._ranks + len(groups), dtype=np.int64)
            self._ranks += len(groups)
            self._rank.update(zip(groups, ranks.tolist()))
            self._gindex.add(h, ranks, h)

    def _indexed(self, ranks: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Which index entries stand for a group held now (not one a rescale gave away, nor an
        earlier entry of a group given away and taken back)."""
        rank = self._rank
        return np.fromiter((rank.get(g, -1) == r for r, g in zip(ranks.tolist(), groups.tolist())),
                           dtype=bool, count=len(ranks))

    def drop_bins(self, bits: int, bins) -> int:
        """Forget the groups of ``bins`` (at ``2**bits`` bins), their counts and pending tuples,
        and any unreleased input of theirs: a rescale gave them to another partition
        (replistream/replica/rescale.py). Costs their groups (found through the group index,
        whose entries for them go stale and leave at a later compaction), not a pass over the
        others. Returns how many groups were dropped.

        >>> s = Schema({"k": "i8"})
        >>> from replistream.schema import Punctuation
        >>> c = CountWindowAggregateLogic("c", [s], size=2, by="k")
        >>> _ = c.process(0, s.from_columns({"ts": [1, 2, 3], "k": [1, 2, 3]}, ids=[1, 2, 3]))
        >>> _ = c.process(0, Punctuation(3))
        >>> gone = c.checkpoint(1).nonempty_bins()[:1]
        >>> c.drop_bins(1, gone) > 0, c.checkpoint(1).select(gone).rows()
        (True, 0)
        """
        chosen = bin_list(bins)
        _, gs = self._gindex.rows(int(bits), chosen, self._indexed, tags=True)
        for g in gs.tolist():
            del self._groups[g], self._rank[g]
        self._gindex.forget(len(gs), self._indexed)
        if self._buffer:  # (input above the watermark: none of a bin whose step's time it passed)
            buf = np.concatenate(self._buffer)
            keep = ~np.isin(bin_of(self._group_hash(buf), int(bits)), chosen)
            self._buffer = [buf[keep]] if keep.any() else []
        return int(len(gs))

    # -- hand-over (docs/design.md, decision 7) ------------------------------------
    # The unreleased input (ts > watermark), and per group its tuple count, next
    # window number and the tuples still pending for open windows (in (ts, id)
    # order); all binned by group hash.
    def bin_keys(self, port, batch):
        """Group hash: a group's buffered, counted and pending tuples share its bin."""
        return self._group_hash(batch)

    def _state_tables(self, keyed):
        schema = self.in_schemas[0]
        buf = self._buffer[0] if len(self._buffer) == 1 else (
            np.concatenate(self._buffer) if self._buffer else schema.empty())
        gs = np.fromiter(self._groups.keys(), dtype=np.uint64, count=len(self._groups))
        st = list(self._groups.values())
        count = np.fromiter((x[0] for x in st), dtype=np.int64, count=len(st))
        nxt = np.fromiter((x[1] for x in st), dtype=np.int64, count=len(st))
        pend = [x[2] for x in st if len(x[2])]
        pending = np.concatenate(pend) if pend else schema.empty()
        return {
            "buffer": ({"rows": buf}, self._group_hash(buf) if keyed else None),
            "groups": ({"group": gs, "count": count, "next": nxt}, gs if keyed else None),
            "pending": ({"rows": pending}, self._group_hash(pending) if keyed else None),
        }

    live_bins = True

    def _live_tables(self, bits, bins):
        """The unreleased input of ``bins`` (hashed: it lies above the watermark) and the groups of
        ``bins`` with their pending tuples, found through the group index, in the order they
        appeared (the whole layout's)."""
        if bins is None:
            return self._state_tables(True)
        schema = self.in_schemas[0]
        buf = self._buffer[0] if len(self._buffer) == 1 else (
            np.concatenate(self._buffer) if self._buffer else schema.empty())
        bh = self._group_hash(buf)
        keep = np.isin(bin_of(bh, bits), bins)
        rank, gs = self._gindex.rows(bits, bins, self._indexed, tags=True)
        gs = gs[np.argsort(rank, kind="stable")]
        st = [self._groups[g] for g in gs.tolist()]
        count = np.fromiter((x[0] for x in st), dtype=np.int64, count=len(st))
        nxt = np.fromiter((x[1] for x in st), dtype=np.int64, count=len(st))
        pend = [x[2] for x in st if len(x[2])]
        pending = np.concatenate(pend) if pend else schema.empty()
        return {
            "buffer": ({"rows": buf[keep]}, bh[keep]),
            "groups": ({"group": gs, "count": count, "next": nxt}, gs),
            "pending": ({"rows": pending}, self._group_hash(pending)),
        }

    def _restore_tables(self, tables):
        self._install_tables(tables)

    def _install_tables(self, tables):
        """Add a step's unreleased input, groups and pending tuples (of groups this logic lacks)."""
        schema = self.in_schemas[0]
        buf = schema.check(tables["buffer"]["rows"], f"{self.name} checkpoint")
        if len(buf):
            self._buffer.append(buf)
        pending = schema.check(tables["pending"]["rows"], f"{self.name} checkpoint")
        by_group: dict[int, np.ndarray] = {}
        if len(pending):
            gh = self._group_hash(pending)
            order = np.argsort(gh, kind="stable")  # stable: keeps each group's (ts, id) order
            gsorted = gh[order]
            cuts = np.r_[0, np.flatnonzero(gsorted[1:] != gsorted[:-1]) + 1, len(gsorted)]
            for a, b in zip(cuts[:-1], cuts[1:]):
                by_group[int(gsorted[a])] = pending[order[a:b]]
        g = tables["groups"]
        empty = pending[:0]
        for h, c, j in zip(g["group"].tolist(), g["count"].tolist(), g["next"].tolist()):
            self._groups[h] = [c, j, by_group.get(h, empty)]
        self._index_groups(g["group"].tolist())

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


def _repack_fields(a: np.ndarray) -> np.ndarray:
    """``numpy.lib.recfunctions.repack_fields``, imported on first use: that module pulls in ``numpy.ma``,
    which ``import replistream`` does not need (issue #42, point 4)."""
    from numpy.lib.recfunctions import repack_fields as repack

    return repack(a)


def _join_parts(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate many small row blocks of one dtype quickly, packed (no padding of unused fields)."""
    dt = parts[0].dtype
    if any(p.dtype != dt for p in parts):
        return _repack_fields(np.concatenate(parts))
    return _repack_fields(np.frombuffer(b"".join(np.ascontiguousarray(p).tobytes() for p in parts), dtype=dt))


def _pack_limbs(limbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first non-zero limb and the band of limbs from it to the last non-zero one.

    >>> lo, band = _pack_limbs(np.array([[0, 5, 0, 7] + [0] * (LIMBS - 4), [0] * LIMBS]))
    >>> lo.tolist(), band.tolist()
    ([1, 0], [[5, 0, 7], [0, 0, 0]])
    """
    n = len(limbs)
    nz = limbs != 0
    has = nz.any(axis=1)
    lo = np.where(has, nz.argmax(axis=1), 0)
    hi = np.where(has, LIMBS - nz[:, ::-1].argmax(axis=1), 0)
    w = int((hi - lo).max()) if n else 0
    j = np.arange(w)
    idx = lo[:, None] + j
    band = np.take_along_axis(limbs, np.minimum(idx, LIMBS - 1), axis=1) if n else np.zeros((0, 0), np.int64)
    band = np.where(idx < hi[:, None], band, 0)
    return lo.astype(np.int8), band.astype(np.int64)


def _unpack_limbs(limbs: np.ndarray, rows: np.ndarray, lo: np.ndarray, band: np.ndarray) -> None:
    """Write bands back into ``limbs[rows]`` (rows already cleared)."""
    lo = lo.astype(np.int64)
    for j in range(band.shape[1]):
        col = lo + j
        ok = (col < LIMBS) & (band[:, j] != 0)
        limbs[rows[ok], col[ok]] = band[ok, j]
