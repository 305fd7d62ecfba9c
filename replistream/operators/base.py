"""The operator contract shared by the reference engine, the Ray runtime and the simulator.

An operator's *logic* is a plain Python object: no Ray, no clock. It takes a
batch or a punctuation on input port ``i`` and returns the list of items to
emit, in order: batches (numpy structured arrays) and
:class:`~replistream.schema.Punctuation` objects. Engines differ only in how
they move those items (docs/design.md, decision 2).

:class:`OperatorLogic` implements what every operator shares:

* input checking (the batch must match the port's schema; the error names the
  field);
* the punctuation contract (Hwang §IV-A): a tuple with ``ts <= p`` after
  punctuation ``p`` on the same port is counted and dead-lettered (or raises
  :class:`~replistream.errors.PunctuationViolation` in strict mode), never
  processed;
* punctuation forwarding: the operator forwards ``p`` once every input has
  delivered at least ``p`` (the *watermark* is the minimum over inputs), after
  emitting whatever that watermark completes (closing windows).

Subclasses implement ``_on_batch(port, batch) -> list[np.ndarray]`` and,
where they hold state, ``_on_port_punctuation(port, p)`` (purge) and
``_on_watermark(wm) -> list[np.ndarray]`` (close windows).

Hand-over (docs/design.md, decision 7): :meth:`OperatorLogic.checkpoint` returns the
logic's whole state as an :class:`OperatorState`, a plain, versioned, picklable
object of numpy arrays, and :meth:`OperatorLogic.restore` installs one into a
freshly built logic, which then behaves exactly as the checkpointed one would.
Keyed state is laid out in *bins* by the most significant bits of the key hash
(Megaphone 2019, §3.4), so a later state transfer can ship it bin by bin
(:meth:`OperatorState.select`, :meth:`OperatorState.merge`). Stateful
subclasses implement ``_state_tables`` / ``_restore_tables``; stateless ones
set ``stateless = True``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Union

import numpy as np

from ..errors import DeadLetter, PunctuationViolation, ReplistreamError, UserFunctionError
from ..schema import Punctuation, Schema, TS

Item = Union[np.ndarray, Punctuation]

#: Punctuation value before any punctuation arrived.
NO_PUNCTUATION = int(np.iinfo(np.int64).min)

#: Version of the state format written by :meth:`OperatorLogic.checkpoint`;
#: :meth:`OperatorLogic.restore` accepts only this version.
STATE_VERSION = 1


class CheckpointError(ReplistreamError, ValueError):
    """A checkpoint cannot be installed: wrong version, operator, parameters, or a logic that already ran."""


def bin_of(key_hash: np.ndarray, bits: int) -> np.ndarray:
    """The bin of each 64-bit key hash: its ``bits`` most significant bits (Megaphone §3.4).

    Megaphone takes the high bits because similar keys often differ only in
    their low bits; with ``bits == 0`` there is one bin, 0.

    >>> bin_of(np.array([0, 2**63, 2**64 - 1], dtype=np.uint64), 2).tolist()
    [0, 2, 3]
    >>> bin_of(np.array([5], dtype=np.uint64), 0).tolist()
    [0]
    """
    key_hash = np.asarray(key_hash, dtype=np.uint64)
    if not 0 <= int(bits) <= 32:
        raise ValueError(f"bits must be in 0..32, got {bits}")
    if bits == 0:
        return np.zeros(len(key_hash), dtype=np.int64)
    return (key_hash >> np.uint64(64 - bits)).astype(np.int64)


def isolate_failures(n: int, call, first_only: bool = False):
    """Run ``call(lo, hi)`` over rows ``0..n`` and pin every exception it raises on single rows, by
    bisection: a range that raises is split in two until the rows that raise alone are found.
    Returns ``(results, failures)``: ``results`` the ``(lo, hi, value)`` of every range that returned,
    in row order; ``failures`` the ``(row, exception)`` of every row that raised alone.

    A row-wise function raises on the same rows whatever the batch they come in, so every replica of
    an operator (each batching its input its own way) isolates the same rows (#15's "data errors,
    handled identically on every replica"). The cost is about ``2 f log2(n)`` extra calls for ``f``
    failing rows. ``first_only`` stops at the first failing row (for ``on_error="fail"``).
    A range that raises while both its halves return (a function that is not row-wise) keeps the
    halves' results.

    >>> def call(lo, hi):
    ...     if lo <= 5 < hi: raise ValueError("row 5")
    ...     return hi - lo
    >>> results, failures = isolate_failures(8, call)
    >>> [(lo, hi) for lo, hi, _ in results], [(i, str(e)) for i, e in failures]
    ([(0, 4), (4, 5), (6, 8)], [(5, 'row 5')])
    """
    results, failures = [], []
    stack = [(0, n)]
    while stack:
        lo, hi = stack.pop()
        try:
            value = call(lo, hi)
        except Exception as e:  # the user function's; pinned on rows below, never swallowed
            if hi - lo == 1:
                failures.append((lo, e))
                if first_only:
                    break
                continue
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
            continue
        results.append((lo, hi, value))
    return results, failures


Columns = dict  # column name -> numpy array (all of one table's columns have the same length)


@dataclass
class OperatorState:
    """The state of one operator logic: what hand-over ships (docs/design.md, decision 7).

    * ``kind``, ``name``, ``params``: which logic wrote it (checked on restore);
    * ``in_punct``, ``watermark``: the punctuation bookkeeping of the base class;
    * ``tables``: keyed state, ``{table: {column: array}}``; every column of a
      table has one row per state entry (2-D columns are zero-padded bands);
    * ``offsets``: ``{table: int64 array of 2**bits + 1}``; rows are sorted by
      bin, and bin ``b`` of a table is rows ``offsets[b]:offsets[b + 1]``. The
      bin of a row is the top ``bits`` bits of its key hash (:func:`bin_of`);
      unkeyed state (an unkeyed Join, a Sorter) lies in bin 0.

    Only numpy arrays, ints and strings: it pickles compactly (one buffer per
    array) and moves between processes as it is.

    >>> from replistream.operators.aggregate import TimeWindowAggregateLogic
    >>> s = Schema({"k": "i8"})
    >>> a = TimeWindowAggregateLogic("a", [s], size=10, by="k")
    >>> _ = a.process(0, s.from_columns({"ts": [1, 2, 3], "k": [1, 2, 3]}, ids=[1, 2, 3]))
    >>> st = a.checkpoint(bits=1); st.rows("windows"), st.offsets["windows"].tolist()
    (3, [0, 1, 3])
    >>> st.select([1]).rows("windows")
    2
    """

    kind: str
    name: str
    params: dict
    in_punct: tuple
    watermark: int
    bits: int = 0
    tables: dict = field(default_factory=dict)
    offsets: dict = field(default_factory=dict)
    version: int = STATE_VERSION

    @property
    def n_bins(self) -> int:
        return 1 << self.bits

    def rows(self, table: str | None = None) -> int:
        """Rows in ``table`` (all tables when None)."""
        names = [table] if table is not None else list(self.tables)
        return sum(int(self.offsets[t][-1]) for t in names)

    def nbytes(self) -> int:
        """Bytes of array data held (what pickling ships, give or take a few hundred bytes)."""
        return sum(a.nbytes for cols in self.tables.values() for a in cols.values()) + \
            sum(o.nbytes for o in self.offsets.values())

    def bin_rows(self, table: str) -> np.ndarray:
        """Rows of ``table`` per bin (length ``2**bits``)."""
        return np.diff(self.offsets[table])

    def select(self, bins: Iterable[int]) -> "OperatorState":
        """The state restricted to ``bins`` (other bins empty): one step of a binned transfer
        (Megaphone §3.3). Costs in proportion to the rows of ``bins`` (plus ``2**bits`` for the offsets).
        A band (a 2-D column named ``...:band``, zero-padded on the right) keeps only as many
        columns as its selected rows use, as a checkpoint of those bins alone would.

        >>> st = OperatorState("X", "x", {}, (0,), 0, bits=1, tables={"t": {"v": np.arange(3)}},
        ...                    offsets={"t": np.array([0, 1, 3])})
        >>> st.select([1]).tables["t"]["v"].tolist()
        [1, 2]
        """
        keep = np.zeros(self.n_bins, dtype=bool)
        keep[np.asarray(list(bins), dtype=np.int64)] = True
        chosen = np.flatnonzero(keep)
        tables, offsets = {}, {}
        for t, cols in self.tables.items():
            off = self.offsets[t]
            idx = concat_ranges(off[chosen], off[chosen + 1])
            tables[t] = {c: _trim_band(a[idx]) if c.endswith(":band") else a[idx] for c, a in cols.items()}
            counts = np.where(keep, np.diff(off), 0)
            offsets[t] = np.r_[0, np.cumsum(counts)].astype(np.int64)
        return replace(self, tables=tables, offsets=offsets)

    def nonempty_bins(self) -> np.ndarray:
        """Bins holding at least one row of some table (sorted).

        >>> OperatorState("X", "x", {}, (0,), 0, bits=1, tables={"t": {"v": np.arange(2)}},
        ...               offsets={"t": np.array([0, 0, 2])}).nonempty_bins().tolist()
        [1]
        """
        rows = np.zeros(self.n_bins, dtype=np.int64)
        for t in self.tables:
            rows += np.diff(self.offsets[t])
        return np.flatnonzero(rows)

    @staticmethod
    def merge(parts: list["OperatorState"]) -> "OperatorState":
        """Reassemble states of disjoint bins (e.g. from :meth:`select`) into one (Megaphone §3.3).

        Vectorised: one stable sort of the rows by bin per table, whatever the number of parts.

        >>> st = OperatorState("X", "x", {}, (0,), 0, bits=1, tables={"t": {"v": np.arange(3)}},
        ...                    offsets={"t": np.array([0, 1, 3])})
        >>> OperatorState.merge([st.select([1]), st.select([0])]).tables["t"]["v"].tolist()
        [0, 1, 2]
        """
        if not parts:
            raise ValueError("merge needs at least one state")
        first = parts[0]
        for p in parts[1:]:
            if (p.kind, p.name, p.bits, p.version, tuple(p.in_punct), p.watermark) != \
                    (first.kind, first.name, first.bits, first.version, tuple(first.in_punct), first.watermark):
                raise CheckpointError(f"cannot merge states of {first.name!r}: they differ in kind, bits "
                                      f"or punctuation")
        nb = first.n_bins
        tables, offsets = {}, {}
        for t in first.tables:
            live = [p for p in parts if int(p.offsets[t][-1]) > 0]
            if len(live) <= 1:
                src = live[0] if live else first
                tables[t], offsets[t] = src.tables[t], src.offsets[t]
                continue
            bins = np.concatenate([np.repeat(np.arange(nb), np.diff(p.offsets[t])) for p in live])
            order = np.argsort(bins, kind="stable")
            tables[t] = {c: _concat_rows([p.tables[t][c] for p in live], first.tables[t][c])[order]
                         for c in first.tables[t]}
            offsets[t] = np.r_[0, np.cumsum(np.bincount(bins, minlength=nb))].astype(np.int64)
        return replace(first, tables=tables, offsets=offsets)


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(lo[i], hi[i])`` over ``i``, vectorised.

    >>> concat_ranges(np.array([0, 5]), np.array([2, 7])).tolist()
    [0, 1, 5, 6]
    """
    lo = np.asarray(lo, dtype=np.int64)
    n = np.asarray(hi, dtype=np.int64) - lo
    keep = n > 0
    lo, n = lo[keep], n[keep]
    if not len(n):
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(lo - np.r_[0, np.cumsum(n)[:-1]], n)
    return starts + np.arange(int(n.sum()), dtype=np.int64)


def _trim_band(a: np.ndarray) -> np.ndarray:
    """A 2-D zero-padded band without its trailing all-zero columns; other arrays as they are.

    >>> _trim_band(np.array([[1, 0, 0], [2, 3, 0]])).tolist()
    [[1, 0], [2, 3]]
    """
    if a.ndim != 2:
        return a
    used = np.flatnonzero((a != 0).any(axis=0))
    w = int(used[-1]) + 1 if len(used) else 0
    return a if w == a.shape[1] else a[:, :w]


def _concat_rows(pieces: list, like: np.ndarray) -> np.ndarray:
    """Concatenate row blocks; 2-D bands of different widths are zero-padded on the right."""
    if not pieces:
        return like[:0]
    if like.ndim == 2:
        w = max(p.shape[1] for p in pieces)
        pieces = [p if p.shape[1] == w else np.pad(p, ((0, 0), (0, w - p.shape[1]))) for p in pieces]
    return np.concatenate(pieces)


def _rows_of_bins(tables: dict, bits: int, bins: Iterable[int]) -> dict:
    """``{table: (columns, key_hash or None)}`` restricted to the rows whose bin is in ``bins``
    (unkeyed tables lie in bin 0), in their original order, so that :func:`binned` of the
    result equals :meth:`OperatorState.select` of the whole layout.

    >>> t = _rows_of_bins({"t": ({"v": np.arange(3)}, np.array([2**63, 0, 2**63], dtype=np.uint64))}, 1, [1])
    >>> t["t"][0]["v"].tolist()
    [0, 2]
    """
    keep = np.zeros(1 << bits, dtype=bool)
    keep[np.asarray(list(bins), dtype=np.int64)] = True
    out = {}
    for name, (cols, key) in tables.items():
        n = len(next(iter(cols.values()))) if cols else 0
        if n == 0:
            out[name] = (cols, key)
        elif key is None:
            out[name] = (cols if keep[0] else {c: a[:0] for c, a in cols.items()}, None)
        else:
            m = keep[bin_of(key, bits)]
            out[name] = ({c: a[m] for c, a in cols.items()}, key[m])
    return out


def bin_list(bins: Iterable[int]) -> np.ndarray:
    """``bins`` as a sorted array of distinct int64.

    >>> bin_list([3, 1, 3]).tolist()
    [1, 3]
    """
    return np.unique(np.asarray(list(bins) if not isinstance(bins, np.ndarray) else bins, dtype=np.int64))


def binned(tables: dict, bits: int) -> tuple[dict, dict]:
    """Lay out ``{table: (columns, key_hash or None)}`` by bin; returns (tables, offsets).

    ``key_hash`` None means unkeyed (everything in bin 0). With ``bits == 0``
    nothing is hashed or reordered.

    >>> t, o = binned({"t": ({"v": np.arange(3)}, np.array([2**63, 0, 2**63], dtype=np.uint64))}, 1)
    >>> t["t"]["v"].tolist(), o["t"].tolist()
    ([1, 0, 2], [0, 1, 3])
    """
    out, offsets = {}, {}
    nb = 1 << bits
    for name, (cols, key) in tables.items():
        n = len(next(iter(cols.values()))) if cols else 0
        if bits == 0 or key is None or n == 0:
            out[name] = cols
            off = np.zeros(nb + 1, dtype=np.int64)
            off[1:] = n
            offsets[name] = off
            continue
        b = bin_of(key, bits)
        order = np.argsort(b, kind="stable")
        out[name] = {c: a[order] for c, a in cols.items()}
        offsets[name] = np.r_[0, np.cumsum(np.bincount(b, minlength=nb))].astype(np.int64)
    return out, offsets


class OperatorLogic:
    """Base class of every operator's running logic.

    ``name`` is the operator's stable id (used in ids, errors, metrics);
    ``in_schemas`` the schema of each input port; ``out_schema`` the schema of
    what it emits. With ``strict=True`` a punctuation violation raises instead
    of being dead-lettered.

    >>> from replistream.operators import FilterLogic
    >>> s = Schema({"x": "i8"})
    >>> op = FilterLogic("f", [s], lambda b: b["x"] > 0)
    >>> op.process(0, Punctuation(5))
    [Punctuation(5)]
    >>> op.process(0, s.from_columns({"ts": [3, 7], "x": [1, 1]}))[0]["ts"]
    array([7])
    >>> op.late_count
    1

    Punctuation bookkeeping, public for the engines: ``in_punct[port]`` is the
    highest punctuation received on each input, ``watermark`` the minimum over
    them that the logic last forwarded (``NO_PUNCTUATION`` before any);
    :meth:`watermarks` tells, without feeding them, where punctuations would
    raise it.
    """

    #: Order-sensitive operators need their inputs sorted (Hwang §IV-C); the
    #: query builder then inserts a Sorter in front of them.
    order_sensitive: bool = False

    #: True when the only state is the punctuation bookkeeping of this base
    #: class (Filter, Map, FlatMap, Union): checkpoint and restore need nothing more.
    stateless: bool = False

    #: What happens to rows on which a user function raises (set by
    #: :meth:`~replistream.query.Query.build_logic` from the query): ``"dead_letter"`` sets them
    #: aside with the exception and goes on, ``"fail"`` raises
    #: :class:`~replistream.errors.UserFunctionError` naming the operator and the row.
    on_error: str = "dead_letter"

    def __init__(self, name: str, in_schemas: list[Schema], out_schema: Schema, strict: bool = False):
        self.name = name
        self.in_schemas = list(in_schemas)
        self.out_schema = out_schema
        self.strict = strict
        self.in_punct = [NO_PUNCTUATION] * len(self.in_schemas)
        self.watermark = NO_PUNCTUATION
        self.dead_letters: list[DeadLetter] = []
        self.late_count = 0
        self.failed_count = 0  # rows a user function raised on, dead-lettered (on_error="dead_letter")
        self.tuples_in = 0
        self.tuples_out = 0

    @property
    def n_inputs(self) -> int:
        return len(self.in_schemas)

    # -- the engine-facing API ------------------------------------------------
    def process(self, port: int, item: Item) -> list[Item]:
        """Feed one batch or punctuation on ``port``; return what to emit, in order."""
        if isinstance(item, Punctuation):
            return self.on_punctuation(port, item.p)
        return self.on_batch(port, item)

    def on_batch(self, port: int, batch: np.ndarray, late_at: int | None = None) -> list[Item]:
        """Feed one batch on ``port``; what to emit. A tuple with ``ts`` at or below the port's
        punctuation is late (counted and dead-lettered); ``late_at`` judges it against that
        punctuation instead: the port's when the batch came, for a batch held back meanwhile (a
        rescale's bins, replistream/replica/rescale.py).

        >>> from replistream.operators import UnionLogic
        >>> u = UnionLogic("u", [Schema({"x": "i8"})]); b = u.in_schemas[0].from_columns({"ts": [3], "x": [1]}, ids=[1])
        >>> _ = u.process(0, Punctuation(5)); len(u.on_batch(0, b, late_at=2)[0]), u.late_count
        (1, 0)
        """
        self._check_port(port)
        batch = self.in_schemas[port].check(batch, f"{self.name} input {port}")
        batch = self._drop_late(port, batch, late_at)
        if not len(batch):
            return []
        self.tuples_in += len(batch)
        try:
            out = self._on_batch(port, batch)
        except ReplistreamError:
            raise
        except Exception as e:  # user code (a custom operator, a summary) failed: named, never swallowed
            raise UserFunctionError(self.name, f"{type(e).__name__}: {e}", row=_row(batch, 0), cause=e) from e
        return self._tally([b for b in out if len(b)])

    def on_punctuation(self, port: int, p: int) -> list[Item]:
        self._check_port(port)
        p = int(p)
        if p <= self.in_punct[port]:
            return []  # a weaker or repeated promise says nothing new
        self.in_punct[port] = p
        try:
            out: list[Item] = list(self._on_port_punctuation(port, p))
            wm = min(self.in_punct)
            if wm > self.watermark:
                out.extend(b for b in self._on_watermark(wm) if len(b))
                before, self.watermark = self.watermark, wm
                promise = int(self.forward_punctuation(wm))
                if promise > self.forward_punctuation(before):
                    out.append(Punctuation(promise))
        except ReplistreamError:
            raise
        except Exception as e:  # user code run at a punctuation (a summary, a custom operator)
            raise UserFunctionError(self.name, f"{type(e).__name__}: {e} (at punctuation {p} on input {port})",
                                    cause=e) from e
        return self._tally(out)

    def apply_user(self, fn, rows: np.ndarray, check, what: str = "user function", emit=None) -> list:
        """Run a user function over ``rows`` the way :attr:`on_error` says; returns the checked results
        of the ranges it accepted, in row order.

        ``fn(rows[lo:hi])`` is the user's call; ``check(value, lo, hi)`` validates its result (a
        wrong length or type is a programming error: it raises
        :class:`~replistream.errors.UserFunctionError` naming the operator, whatever the policy) and
        returns what to keep. Rows on which ``fn`` raises are found by bisection
        (:func:`isolate_failures`); with ``on_error="dead_letter"`` they are dead-lettered here with
        the exception (``emit(rows)`` gives the tuples to set aside, default the rows themselves),
        with ``"fail"`` the first raises :class:`~replistream.errors.UserFunctionError` with the row.

        >>> from replistream.operators import FilterLogic
        >>> s = Schema({"x": "i8"})
        >>> def positive(b):
        ...     if (b["x"] == 0).any(): raise ValueError("x is 0")
        ...     return b["x"] > 1
        >>> f = FilterLogic("f", [s], positive)
        >>> out = f.process(0, s.from_columns({"ts": [1, 2, 3], "x": [1, 0, 5]}))
        >>> out[0]["x"].tolist(), f.dead_letters[0].reason, f.dead_letters[0].batch["x"].tolist()
        ([5], 'predicate raised ValueError: x is 0', [0])
        """
        n = len(rows)
        results, failures = isolate_failures(n, lambda lo, hi: fn(rows[lo:hi]), self.on_error == "fail")
        kept = [check(value, lo, hi) for lo, hi, value in results]
        if failures:
            i, e = failures[0]
            if self.on_error == "fail":
                sample = rows[i:i + 1] if emit is None else emit(rows[i:i + 1])
                raise UserFunctionError(self.name, f"{what} raised {type(e).__name__}: {e}", row=_row(sample, 0),
                                        cause=e) from e
            by_reason: dict[str, list[int]] = {}
            for i, e in failures:
                by_reason.setdefault(f"{what} raised {type(e).__name__}: {e}", []).append(i)
            for reason, idx in by_reason.items():
                bad = rows[np.asarray(idx, dtype=np.int64)]
                self.dead_letters.append(DeadLetter(self.name, reason, bad if emit is None else emit(bad)))
                self.failed_count += len(idx)
        return kept

    def quiet_until(self, at: int) -> int:
        """The highest watermark up to which this logic, at watermark ``at`` or above, emits nothing
        whatever tuples with ``ts > at`` it gets meanwhile: a rescale's new owner goes on taking
        punctuations up to it while the state of its bins moved at ``at`` is on its way
        (replistream/replica/rescale.py). ``at`` itself here (no such promise); a time window's
        aggregate promises up to the last timestamp before its next window's end.

        >>> from replistream.operators import UnionLogic
        >>> UnionLogic("u", [Schema({"x": "i8"})]).quiet_until(7)
        7
        """
        return int(at)

    def gives_ahead(self, at: int) -> int:
        """The latest step time whose bins a rescale's old owner may give at watermark ``at`` (once
        every tuple up to that time has come): the state it gives for them then is what it would
        be at their own times, or more that the new owner can keep without effect. By default
        :meth:`quiet_until` (no window closes before); a Join, whose punctuations only purge,
        anything (replistream/replica/rescale.py).

        >>> from replistream.operators import UnionLogic
        >>> UnionLogic("u", [Schema({"x": "i8"})]).gives_ahead(7)
        7
        """
        return self.quiet_until(at)

    def frozen_until(self, at: int) -> int:
        """The highest watermark up to which the state of a bin that gets no more tuples after
        ``at`` stays what it was at watermark ``at``, pending tuples included: a rescale's old
        owner then gives several steps' bins in one pass at the last of their times instead of
        one step at a time (replistream/replica/rescale.py). ``at`` itself here (no such promise:
        a window closing, a join purging change a bin's state with no tuple of it); a keyed
        operator's state changes only by its own keys' tuples.

        >>> from replistream.operators import UnionLogic
        >>> UnionLogic("u", [Schema({"x": "i8"})]).frozen_until(7)
        7
        """
        return int(at)

    def forward_punctuation(self, wm):
        """The punctuation this logic forwards once its watermark is ``wm`` (an int or an array of
        them): ``wm`` itself, unless the logic still owes output at or below it, as a keyed
        operator with epochs longer than one unit does (the end of its last complete epoch).
        Nondecreasing in ``wm``; a logic forwards it whenever it rises.

        >>> from replistream.operators import UnionLogic
        >>> UnionLogic("u", [Schema({"x": "i8"})]).forward_punctuation(7)
        7
        """
        return wm

    def watermarks(self, ports, puncts) -> np.ndarray:
        """The watermark after each punctuation ``puncts[i]`` on input ``ports[i]``, in turn,
        were they fed to :meth:`process` now (nothing changes): per input the highest
        punctuation so far, then the minimum over the inputs. The logic forwards
        ``Punctuation(forward_punctuation(w))`` wherever that rises above the previous one.

        >>> from replistream.operators import UnionLogic
        >>> s = Schema({"x": "i8"})
        >>> u = UnionLogic("u", [s, s]); _ = u.process(1, Punctuation(4))
        >>> u.watermarks([0, 0, 1], [2, 7, 9]).tolist()
        [2, 4, 7]
        """
        ports = np.asarray(ports, dtype=np.int64)
        puncts = np.asarray(puncts, dtype=np.int64)
        m = np.full((len(ports), self.n_inputs), NO_PUNCTUATION, dtype=np.int64)
        m[np.arange(len(ports)), ports] = puncts
        m = np.maximum(np.maximum.accumulate(m, axis=0), np.array(self.in_punct, dtype=np.int64)[None, :])
        return m.min(axis=1)

    # -- hand-over (docs/design.md, decision 7) ---------------------------------------
    def checkpoint(self, bits: int = 0, bins: Iterable[int] | None = None) -> OperatorState:
        """The state of this logic, keyed state split into ``2**bits`` bins; with ``bins``, only
        those bins (one step of a binned transfer, Megaphone §3.3; the rest is empty).

        Take it between two ``process`` calls; it shares no mutable object with
        the logic (arrays are copies or never mutated in place afterwards). This
        generic version hashes the whole state, keeps the rows of ``bins`` and lays
        out only those (a step costs one hash pass over the state plus sorting and
        copying its own rows; equal to ``checkpoint(bits).select(bins)``); logics
        that keep their state binned while they run
        (:class:`~replistream.operators.keyed.KeyedOperatorLogic`) pay only for the
        bins asked for.

        >>> from replistream.operators import FilterLogic
        >>> s = Schema({"x": "i8"})
        >>> f = FilterLogic("f", [s], lambda b: b["x"] > 0)
        >>> _ = f.process(0, Punctuation(5))
        >>> g = FilterLogic("f", [s], lambda b: b["x"] > 0).restore(f.checkpoint())
        >>> g.in_punct, g.watermark
        ([5], 5)
        """
        bits = int(bits)
        if self.live_bins:  # the rows of ``bins`` are found without a pass over the rest
            tables, offsets = binned(self._live_tables(bits, None if bins is None else bin_list(bins)), bits)
            return OperatorState(type(self).__name__, self.name, self._state_params(), tuple(self.in_punct),
                                 int(self.watermark), bits, tables, offsets)
        raw = self._state_tables(bits > 0)
        subset = bins is not None and bits > 0
        if subset:  # only the rows of ``bins`` are sorted and copied
            raw = _rows_of_bins(raw, bits, bins)
        tables, offsets = binned(raw, bits)
        st = OperatorState(type(self).__name__, self.name, self._state_params(), tuple(self.in_punct),
                           int(self.watermark), bits, tables, offsets)
        return st if bins is None or subset else st.select(bins)

    #: True when the logic keeps its state ordered by key hash while it runs (live bins,
    #: Megaphone §3.4): :meth:`checkpoint` of a few bins then costs those bins' rows (no hash
    #: pass over the state), at any ``bits``, and :meth:`install_bins` adds bins to the running
    #: logic without copying the others. Such logics implement ``_live_tables``.
    live_bins: bool = False

    def _live_tables(self, bits: int, bins: np.ndarray | None) -> dict:
        """``{table: (columns, key_hash)}`` of the rows of ``bins`` at ``2**bits`` bins (every row
        when None), found through the live layout; only for logics with :attr:`live_bins`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no live bins")

    def install_bins(self, state: OperatorState, bins: Iterable[int]) -> "OperatorLogic":
        """Add the rows of ``state`` (a :meth:`checkpoint` of this operator, at any ``bits``, holding
        only ``bins``) to this running logic, which holds none of ``bins`` and has the same
        punctuation bookkeeping: the receiving side of one step of a binned transfer (Megaphone
        §3.3), costing the installed rows only. Logics without :attr:`live_bins` raise
        :class:`CheckpointError` (a receiver then merges checkpoints instead).

        >>> from replistream.operators.join import JoinLogic
        >>> L = Schema({"k": "i8"})
        >>> a, b = (JoinLogic("j", [L, L], window=5, left_key="k", right_key="k") for _ in range(2))
        >>> rows = L.from_columns({"ts": [1, 2], "k": [1, 2]}, ids=[1, 2])
        >>> _ = a.process(0, rows)
        >>> ck = a.checkpoint(1); mine = ck.nonempty_bins()[:1]
        >>> _ = b.process(0, rows[np.isin(bin_of(a.bin_keys(0, rows), 1), mine, invert=True)])
        >>> b.install_bins(ck.select(mine), mine).buffered
        (2, 0)
        """
        if not self.live_bins:
            raise CheckpointError(f"{self.name!r}: {type(self).__name__} keeps no live bins; merge checkpoints")
        if state.kind != type(self).__name__ or state.name != self.name or state.params != self._state_params():
            raise CheckpointError(f"state of {state.kind} {state.name!r} cannot be installed into "
                                  f"{type(self).__name__} {self.name!r}")
        if tuple(int(p) for p in state.in_punct) != tuple(self.in_punct) or int(state.watermark) != self.watermark:
            raise CheckpointError(f"{self.name!r}: bins taken at punctuations {tuple(state.in_punct)} cannot join "
                                  f"a logic at {tuple(self.in_punct)}")
        self._install_tables(state.tables)
        return self

    def _install_tables(self, tables: dict) -> None:
        """Add the rows of ``tables`` (bins this logic does not hold) to the live state."""
        raise NotImplementedError(f"{type(self).__name__} keeps no live bins")

    def bin_keys(self, port: int, batch: np.ndarray) -> np.ndarray | None:
        """The 64-bit key hash of each tuple of ``batch`` (input ``port``) that decides which
        bin of this logic's state the tuple reads and writes (Megaphone §3.2: the key
        function of an operator's state); ``None`` when the state does not partition
        by a key of the input (an unkeyed Join, a logic behind a Sorter): a binned
        transfer of it then moves in one step.

        A tuple must touch only state rows of its own bin, and the bins of the rows
        :meth:`checkpoint` writes must be ``bin_of(hash)`` of the same hashes.

        >>> from replistream.operators import FilterLogic
        >>> s = Schema({"x": "i8"})
        >>> FilterLogic("f", [s], lambda b: b["x"] > 0).bin_keys(0, s.empty()) is not None
        True
        """
        if self.stateless:
            return np.zeros(len(batch), dtype=np.uint64)
        return None

    def restore(self, state: OperatorState) -> "OperatorLogic":
        """Install ``state`` (from :meth:`checkpoint` of a logic built from the same spec) into
        this freshly built logic; returns ``self``. Raises :class:`CheckpointError` on a mismatch."""
        if not isinstance(state, OperatorState):
            raise CheckpointError(f"{self.name!r}: expected an OperatorState, got {type(state).__name__}")
        if state.version != STATE_VERSION:
            raise CheckpointError(f"{self.name!r}: state version {state.version}, this replistream reads "
                                  f"version {STATE_VERSION}")
        if state.kind != type(self).__name__ or state.name != self.name:
            raise CheckpointError(f"state of {state.kind} {state.name!r} cannot be restored into "
                                  f"{type(self).__name__} {self.name!r}")
        if state.params != self._state_params():
            raise CheckpointError(f"{self.name!r}: state was taken with parameters {state.params}, "
                                  f"this logic has {self._state_params()}")
        if len(state.in_punct) != self.n_inputs:
            raise CheckpointError(f"{self.name!r}: state has {len(state.in_punct)} input(s), "
                                  f"logic has {self.n_inputs}")
        if self.tuples_in or self.watermark != NO_PUNCTUATION or any(p != NO_PUNCTUATION for p in self.in_punct):
            raise CheckpointError(f"{self.name!r}: restore needs a freshly built logic; this one already ran")
        self.in_punct = [int(p) for p in state.in_punct]
        self.watermark = int(state.watermark)
        self._restore_tables(state.tables)
        return self

    def _state_params(self) -> dict:
        """Parameters a state depends on (checked on restore)."""
        return {}

    def _state_tables(self, keyed: bool) -> dict:
        """``{table: (columns, key_hash or None)}``; key hashes are needed only when ``keyed``."""
        if self.stateless:
            return {}
        raise NotImplementedError(
            f"operator {self.name!r} ({type(self).__name__}) does not support hand-over: set "
            f"stateless = True or implement _state_tables and _restore_tables")

    def _restore_tables(self, tables: dict) -> None:
        if self.stateless:
            return
        raise NotImplementedError(
            f"operator {self.name!r} ({type(self).__name__}) does not support hand-over: set "
            f"stateless = True or implement _state_tables and _restore_tables")

    # -- hooks for subclasses -------------------------------------------------
    def _on_batch(self, port: int, batch: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _on_port_punctuation(self, port: int, p: int) -> list[np.ndarray]:
        return []

    def _on_watermark(self, wm: int) -> list[np.ndarray]:
        return []

    # -- helpers --------------------------------------------------------------
    def _check_port(self, port: int) -> None:
        if not 0 <= port < len(self.in_schemas):
            raise ValueError(f"operator {self.name!r} has {len(self.in_schemas)} input(s); got input {port}")

    def _drop_late(self, port: int, batch: np.ndarray, p: int | None = None) -> np.ndarray:
        p = self.in_punct[port] if p is None else p
        if p == NO_PUNCTUATION:
            return batch
        late = batch[TS] <= p
        if not late.any():
            return batch
        where = f"{self.name} input {port}"
        if self.strict:
            ts = int(batch[TS][late][0])
            raise PunctuationViolation(f"{where}: tuple with ts={ts} arrived after punctuation {p}")
        self.late_count += int(late.sum())
        self.dead_letters.append(DeadLetter(where, f"late: ts <= punctuation {p}", batch[late]))
        return batch[~late]

    def _tally(self, out: list[Item]) -> list[Item]:
        for item in out:
            if not isinstance(item, Punctuation):
                self.tuples_out += len(item)
        return out

    def stats(self) -> dict:
        """Counters for metrics and tests."""
        return {
            "name": self.name,
            "tuples_in": self.tuples_in,
            "tuples_out": self.tuples_out,
            "late": self.late_count,
            "failed": self.failed_count,
            "watermark": self.watermark,
        }


def _row(rows: np.ndarray, i: int):
    """Row ``i`` as a plain tuple (for an error message), or None when there is none."""
    return rows[i].tolist() if 0 <= i < len(rows) else None
