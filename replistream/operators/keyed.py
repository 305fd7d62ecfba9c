"""Keyed state kept in bins while the operator runs, and keyed operators built on it (Megaphone §3).

Megaphone (Hoffmann et al. 2019, §3.2-3.4) makes an operator's state and its
pending work explicit, keyed, and split into ``2**b`` *bins* by the top bits
of the key hash, so that a migration can move a few bins at a logical time
while the rest keeps running. This module is that interface for replistream.

:class:`KeyedState` is a flat columnar store: one row per key, every column a
numpy array, rows in the order their keys arrived, found through an index of
runs sorted by the 64-bit key hash. Because a bin is the top bits of the hash,
sorting by hash also sorts by bin, for *every* number of bins: bin ``b`` is a
contiguous slice of each run, found by two binary searches. So

* per-bin snapshot (:meth:`KeyedState.snapshot`) costs the rows of the chosen
  bins plus ``O(log n)`` per bin and run, not the whole state;
* a batch finds its keys with a ``searchsorted`` per run, and its new keys are
  appended (the index merges runs as the logarithmic method does), so it costs
  its own keys, not the size of the state;
* each bin has a version, bumped when a row of it changes
  (:meth:`KeyedState.touch`); :meth:`KeyedState.changed_since` lists the bins
  an incremental checkpoint (Del Monte 2017) must ship, and
  :meth:`KeyedState.replace_bins` applies one.

Per-bin Python objects (4096 dicts or arrays) would make every batch pay a
loop over bins; here a batch pays a few vectorised calls whatever ``b`` is
(``bench/migration.py`` measures the steady-state cost of ``b`` = 0..16).

:class:`KeyedOperatorLogic` is the operator interface (Megaphone §3.2's
"state + notificator"): a subclass declares its key fields and per-key state
columns and implements :meth:`KeyedOperatorLogic.update`, which the base class
calls at each watermark with every input tuple the watermark completes, in
(ts, id) order, and the state row of each tuple's key. Tuples above the
watermark are the operator's *pending work*: they wait, binned by key, in the
``pending`` table, which travels with the state at hand-over. Because update
sees a complete, canonically ordered set of tuples, even an order-sensitive
update is replica consistent (Hwang Definition 2). :class:`KeyedCountLogic`
(a running count per key, emitted for each key that changed) is built on it;
:class:`KeyedCount` is its factory for :meth:`replistream.query.Stream.apply`.

>>> from replistream import Query, Punctuation
>>> from replistream.testing import run_reference
>>> q = Query(); s = q.source("s", {"k": "i8"})
>>> _ = s.apply(KeyedCount(by="k", bits=4), name="counts").sink("out")
>>> r = run_reference(q, {"s": [{"ts": 1, "k": 7}, {"ts": 2, "k": 7}, {"ts": 3, "k": 9}]})
>>> sorted(r.outputs["out"][["ts", "k", "count"]].tolist())   # one output per key and epoch (here: timestamp)
[(1, 7, 1), (2, 7, 2), (3, 9, 1)]
"""
from __future__ import annotations

from collections.abc import Mapping as _MappingABC
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..ids import argsort_u64, hash_columns, mix, stable_hash
from ..schema import END, TS, Punctuation, Schema
from .base import NO_PUNCTUATION, CheckpointError, OperatorLogic, OperatorState, bin_list, bin_of, concat_ranges
from .sorter import canonical_order

_U64 = np.uint64


def bin_bounds(hashes: np.ndarray, bits: int) -> np.ndarray:
    """Offsets (length ``2**bits + 1``) of each bin in an array of hashes sorted ascending.

    >>> bin_bounds(np.array([1, 2**63, 2**63 + 5], dtype=np.uint64), 1).tolist()
    [0, 1, 3]
    """
    nb = 1 << bits
    if bits == 0:
        return np.array([0, len(hashes)], dtype=np.int64)
    edges = np.arange(1, nb, dtype=np.uint64) << _U64(64 - bits)
    return np.r_[0, np.searchsorted(hashes, edges), len(hashes)].astype(np.int64)


def bin_ranges(hashes: np.ndarray, bits: int, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)``: where each of ``bins`` (int64) lies in an array of hashes sorted ascending, at
    ``2**bits`` bins; two binary searches per bin asked for, whatever the number of bins.

    >>> lo, hi = bin_ranges(np.array([1, 2**63, 2**63 + 5], dtype=np.uint64), 1, np.array([1]))
    >>> lo.tolist(), hi.tolist()
    ([1], [3])
    """
    bins = np.asarray(bins, dtype=np.int64)
    if bits == 0:
        return np.zeros(len(bins), np.int64), np.full(len(bins), len(hashes), np.int64)
    shift = np.uint64(64 - bits)
    lo = np.searchsorted(hashes, bins.astype(np.uint64) << shift)
    last = bins + 1 >= (1 << bits)
    hi = np.searchsorted(hashes, np.where(last, 0, bins + 1).astype(np.uint64) << shift)
    hi[last] = len(hashes)
    return lo.astype(np.int64), hi.astype(np.int64)


class _Columns(_MappingABC):
    """The state's columns as row-aligned arrays (views of storage that grows by doubling): read
    and change them in place; assigning a column writes its values into the storage."""

    def __init__(self, state: "KeyedState"):
        self._state = state

    def __getitem__(self, c: str) -> np.ndarray:
        return self._state._cols[c][:self._state._n]

    def __setitem__(self, c: str, values) -> None:
        if c not in self._state._cols:
            raise KeyError(f"{c!r} is not a state column (columns: {list(self._state._cols)})")
        self._state._cols[c][:self._state._n] = values

    def __iter__(self):
        return iter(self._state._cols)

    def __len__(self) -> int:
        return len(self._state._cols)


#: index entries up to which runs are merged at once (a few ms); beyond, in slices
MERGE_AT_ONCE = 1 << 18
#: entries of each run merged per lookup while a merge goes on in slices
MERGE_STEP = 1 << 15
#: storage capacity (rows) from which the next storage is touched ahead of its growth
TOUCH_AHEAD_FROM = 1 << 16


class _Merge:
    """A merge of sorted runs into one, going on in slices (:meth:`KeyedState._merge_step`):
    the merged entries so far (``h[:k]``, ``r[:k]``, storage for all of them allocated at the
    start) and, per run, the position up to which it was merged."""

    __slots__ = ("srcs", "pos", "h", "r", "k")

    def __init__(self, srcs: list, total: int):
        self.srcs = srcs
        self.pos = [0] * len(srcs)
        self.h = np.empty(total, dtype=np.uint64)
        self.r = np.empty(total, dtype=np.int64)
        self.k = 0

    @property
    def done(self) -> bool:
        return all(p == len(h) for (h, _), p in zip(self.srcs, self.pos))

    def views(self) -> list:
        """The runs lookups see meanwhile: the merged part, then what is left of each run."""
        out = [(self.h[:self.k], self.r[:self.k])] if self.k else []
        return out + [(h[p:], r[p:]) for (h, r), p in zip(self.srcs, self.pos) if p < len(h)]

    @property
    def lead(self) -> int:
        """How many of the first runs in the index are this merge's views."""
        return int(self.k > 0) + sum(p < len(h) for (h, _), p in zip(self.srcs, self.pos))


class KeyedState:
    """Per-key rows in flat columns, found by key hash through sorted runs; bins are hash ranges (Megaphone §3.4).

    ``columns`` maps column name to dtype; ``bits`` sets the bins whose
    versions are tracked (snapshots may use any number of bits). Versions:
    :attr:`clock` counts changes; ``versions[b]`` is the clock value of bin
    ``b``'s last change (0: never changed).

    Rows are kept in the order their keys arrived: :attr:`hash` and every column of
    :attr:`cols` are aligned arrays, and a batch's new keys are appended (amortised by
    doubling the storage), never inserted into the middle of every column, so a batch
    costs its own keys, not the state's size. An index of sorted runs of ``(hash, row)``
    finds them: a batch's new keys become a run, merged with the one before while the
    two are of comparable size (the logarithmic method: an entry is copied ``O(log n)``
    times overall), and every run is merged into one once lookups in the extra runs
    have cost about as much as that merge. A merge of more than :data:`MERGE_AT_ONCE` entries
    goes in slices, one per lookup (:data:`MERGE_STEP` entries of each run: the runs' entries
    below a hash bound, sorted and written into the merged run's storage), with the part merged
    so far and the rest of each run serving lookups meanwhile, so no lookup waits for the whole
    index (a 4M-key count once paused 50-156 ms for one merge, with no fault and no move:
    issue #42). A bin, the top bits of the hash, is one
    contiguous range of each run. While the rows are in hash order (after a load or a full
    snapshot, or appended in order: a transfer's steps installed bin after bin) the storage is
    its own index and no run is kept: a fluid move's receiver once merged runs of a million
    entries in one step (a pause of the data path at 4M keys, bench/state_move.py); the first
    append out of order makes the rows so far one run (one copy). A full snapshot (and a
    load) puts the rows themselves in hash order, so a snapshot of some bins copies slices
    instead of gathering rows; an update
    never does: at a million keys of 112 bytes that copy took 0.37 s, a pause of the data
    path with no fault and no move (issue #42, ``bench/steady.py``), while gathering one bin's
    rows costs that bin's rows only.

    Bins given away (:meth:`drop_bins`, a rescale's step) leave their rows in storage as *dead*
    rows, free slots that new keys take before the storage grows (as a hash table keeps its
    slots); where runs index the storage, the dead rows' entries are cleared (row -1) at once,
    and purged when their run is next merged. A step costs its own rows: nothing copies every
    live row while a partition gives bins away (one copy once a quarter of the rows were dead was
    a pause of the giving replica at each quarter: 27 and 22 ms in process at 4M keys,
    ``bench/state_move.py``, about 70 ms on Ray with both replicas of the giver pausing at once).
    The slots come back to memory at the next full :meth:`snapshot` (a checkpoint), which deletes
    the dead rows, as :meth:`replace_bins` and :meth:`remove` do first, and :meth:`upsert` if it
    ever meets one. No tuple of a given bin comes here any more, so no lookup meets a dead row; a
    snapshot of some bins leaves them out, and ``len`` counts live rows. :attr:`hash` and
    :attr:`cols` still show them, row-aligned (rows a keyed update never gets).

    >>> st = KeyedState({"n": "i8"}, bits=2)
    >>> slots = st.upsert(np.array([5, 2**63], dtype=np.uint64))
    >>> st.cols["n"][slots] += 1; st.touch(np.array([5, 2**63], dtype=np.uint64))
    >>> st.changed_since(0).tolist(), len(st)
    ([0, 2], 2)
    >>> h, cols, off = st.snapshot([2]); h.tolist(), off.tolist()
    ([9223372036854775808], [0, 0, 0, 1, 1])
    """

    def __init__(self, columns: Mapping[str, object], bits: int = 12):
        if not 0 <= int(bits) <= 24:
            raise ValueError(f"bits must be in 0..24, got {bits}")
        self.bits = int(bits)
        self.dtypes = {c: np.dtype(d) for c, d in columns.items()}
        self._n = 0
        self._hash = np.zeros(0, dtype=np.uint64)
        self._cols = {c: np.zeros(0, dtype=d) for c, d in self.dtypes.items()}
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted hashes, their rows), oldest first
        self._probes = 0  # lookups in runs beyond the first since the last full merge
        self._merge: _Merge | None = None  # a merge of the first runs going on in slices
        self._spare: tuple | None = None  # the next storage (hash, cols), touched ahead of growth
        self._touched = 0  # its rows touched so far
        #: the storage's rows are in hash order: they are their own index (``_runs`` is empty)
        self._ordered = True
        self.cols = _Columns(self)
        self.versions = np.zeros(1 << self.bits, dtype=np.int64)
        self.clock = 0
        #: rows given away and not deleted yet (:meth:`drop_bins`): a mask over the storage, or None
        self._dead: np.ndarray | None = None
        self._n_dead = 0
        self._holes: list[np.ndarray] = []  # the dead rows (free slots), each once
        self._unlinked = 0  # index entries cleared (row -1) and not purged yet

    def __len__(self) -> int:
        return self._n - self._n_dead

    @property
    def hash(self) -> np.ndarray:
        """Each row's key hash (row-aligned with :attr:`cols`, dead rows included)."""
        return self._hash[:self._n]

    def _compact(self) -> None:
        """Delete the dead rows (one copy of the live ones; row numbers change)."""
        if self._n_dead:
            keep = ~self._dead[:self._n]
            self._dead, self._n_dead = None, 0
            self._keep(keep)

    @property
    def nbytes(self) -> int:
        """Bytes of the rows and their index (not the storage's spare capacity)."""
        return self._hash[:self._n].nbytes + sum(a.nbytes for a in self.cols.values()) + \
            sum(h.nbytes + r.nbytes for h, r in self._runs)

    # -- the index --------------------------------------------------------------------------
    def _add_run(self, hashes: np.ndarray, rows: np.ndarray) -> None:
        order = argsort_u64(hashes)
        self._runs.append((hashes[order], rows[order]))
        lead = 0 if self._merge is None else self._merge.lead  # (runs a slice merge is reading)
        while len(self._runs) > lead + 1 and 2 * len(self._runs[-1][0]) >= len(self._runs[-2][0]):
            if self._merge is None and len(self._runs[-1][0]) + len(self._runs[-2][0]) > MERGE_AT_ONCE:
                self._start_merge()  # (every run, in slices: no pause of the whole merge)
                return
            (ah, ar), (bh, br) = self._runs[-2], self._runs[-1]
            if self._unlinked:  # (a merge copies both anyway: cleared entries go)
                (ah, ar), (bh, br) = self._purged(ah, ar), self._purged(bh, br)
            at = np.searchsorted(ah, bh)
            self._runs[-2:] = [(np.insert(ah, at, bh), np.insert(ar, at, br))]

    def _purged(self, h: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A run without its cleared entries (row -1: rows of bins given away)."""
        ok = r >= 0
        gone = len(r) - int(np.count_nonzero(ok))
        if not gone:
            return h, r
        self._unlinked -= gone
        return h[ok], r[ok]

    def _start_merge(self) -> None:
        """Merge every run into one: at once if they hold at most :data:`MERGE_AT_ONCE` entries,
        else in slices, one per later lookup (:meth:`_merge_step`)."""
        self._probes = 0
        total = sum(len(h) for h, _ in self._runs)
        if total <= MERGE_AT_ONCE or len(self._runs) < 2:
            self._merge_index()
            return
        self._merge = _Merge(list(self._runs), total)
        self._runs = self._merge.views()

    def _merge_step(self, budget: int = 0) -> None:
        """One slice of the merge going on: of each run being merged, its entries below the
        smallest hash that lies ``budget`` (default :data:`MERGE_STEP`) entries on in one of them
        (equal hashes stay together, in run order), without cleared entries, sorted into the
        merged run's storage. The merged part and the rest of each run stay in :attr:`_runs`
        (views): a lookup finds every entry in exactly one of them meanwhile."""
        m = self._merge
        budget = int(budget) or MERGE_STEP
        rest = self._runs[m.lead:]
        bound = None
        for (h, _), p in zip(m.srcs, m.pos):
            if len(h) - p > budget:
                b = h[p + budget]
                bound = b if bound is None or b < bound else bound
        ends = [len(h) if bound is None else int(np.searchsorted(h, bound, side="left")) for h, _ in m.srcs]
        if bound is not None and all(e == p for e, p in zip(ends, m.pos)):  # (one hash, over budget times)
            ends = [int(np.searchsorted(h, bound, side="right")) for h, _ in m.srcs]
        hs = [h[p:e] for (h, _), p, e in zip(m.srcs, m.pos, ends) if e > p]
        rs = [r[p:e] for (_, r), p, e in zip(m.srcs, m.pos, ends) if e > p]
        if hs:
            h = hs[0] if len(hs) == 1 else np.concatenate(hs)
            r = rs[0] if len(rs) == 1 else np.concatenate(rs)
            if self._unlinked:  # (cleared entries go: rows of bins given away)
                ok = r >= 0
                gone = len(r) - int(np.count_nonzero(ok))
                if gone:
                    self._unlinked -= gone
                    h, r = h[ok], r[ok]
            if len(hs) > 1:
                order = np.argsort(h, kind="stable")  # (sorted pieces: one merging pass)
                h, r = h[order], r[order]
            m.h[m.k:m.k + len(h)] = h
            m.r[m.k:m.k + len(r)] = r
            m.k += len(h)
        m.pos = ends
        if m.done:
            self._merge = None
            self._runs = ([(m.h[:m.k], m.r[:m.k])] if m.k else []) + rest
        else:
            self._runs = m.views() + rest

    def _finish_merge(self) -> None:
        """Complete the merge going on, if any (what is left of it at once)."""
        if self._merge is not None:
            self._merge_step(budget=1 << 62)

    def __getstate__(self):
        self._finish_merge()  # (views into the merge's storage would not survive a copy)
        return {**self.__dict__, "_spare": None}  # (storage not in use yet)

    def _merge_index(self) -> None:
        """One run of every entry (runs are sorted already, so the stable sort merges them): 16
        bytes an entry, whatever the columns."""
        self._finish_merge()
        self._probes = 0
        if self._unlinked:
            self._runs = [x for x in (self._purged(h, r) for h, r in self._runs) if len(x[0])]
        if len(self._runs) > 1:
            h = np.concatenate([x for x, _ in self._runs])
            r = np.concatenate([x for _, x in self._runs])
            order = np.argsort(h, kind="stable")
            self._runs = [(h[order], r[order])]

    def _merge_runs(self) -> None:
        """One run, and the rows put in hash order (renumbered) if they are not: a bin is then one
        contiguous slice of the storage, as in a state that never grows, so a snapshot copies
        slices instead of gathering rows. Costs a copy of every row in a new order."""
        self._compact()
        self._merge_index()
        if self._ordered:
            return
        if self._runs:
            h, r = self._runs[0]
            self._hash = h
            self._cols = {c: a[:self._n][r] for c, a in self._cols.items()}
            self._spare = None
        self._runs, self._probes = [], 0  # (the storage is its own index from now on)
        self._ordered = True

    def locate(self, hashes: np.ndarray) -> np.ndarray:
        """Row of each hash, -1 where absent (or dead)."""
        out = self._locate(hashes)
        if self._n_dead:
            found = out >= 0
            out[found] = np.where(self._dead[out[found]], -1, out[found])
        return out

    def _locate(self, hashes: np.ndarray) -> np.ndarray:
        """Row of each hash, -1 where absent; dead rows are found too."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        if self._ordered:  # the storage is its own index
            h = self._hash[:self._n]
            out = np.full(len(hashes), -1, dtype=np.int64)
            if len(h):
                pos = np.minimum(np.searchsorted(h, hashes), len(h) - 1)
                hit = h[pos] == hashes
                out[hit] = pos[hit]
            return out
        if self._merge is not None:
            self._merge_step()
        elif len(self._runs) > 1:
            self._probes += len(hashes) * (len(self._runs) - 1)
            if 8 * self._probes > self._n:  # lookups in the extra runs have paid for merging them
                self._start_merge()
        out = np.full(len(hashes), -1, dtype=np.int64)
        for rh, rr in self._runs:
            if not len(rh):
                continue
            pos = np.minimum(np.searchsorted(rh, hashes), len(rh) - 1)
            r = rr[pos]
            hit = (rh[pos] == hashes) & (r >= 0)  # (a cleared entry: a key of a bin given away)
            out[hit] = r[hit]
        return out

    # -- rows -------------------------------------------------------------------------------
    def _append(self, hashes: np.ndarray, values: Mapping[str, np.ndarray] | None) -> np.ndarray:
        """Add rows (``values[c]`` per column, zeros where absent), into free slots (dead rows)
        first, then at the end; returns their row numbers."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        m, n = len(hashes), self._n
        # rows appended in hash order after every row (a restore, a transfer's steps in bin order)
        # leave the storage in hash order, its own index: no run to add, none to merge
        was = self._ordered
        self._ordered = was and (m == 0 or (bool(np.all(hashes[1:] > hashes[:-1])) and
                                            (n == 0 or bool(hashes[0] > self._hash[n - 1]))))
        if was and not self._ordered and n:  # the rows so far become the first run (one copy)
            rows0 = np.arange(n, dtype=np.int64)
            if self._n_dead:  # (dead rows are in no run)
                rows0[self._dead[:n]] = -1
                self._unlinked += self._n_dead
            self._runs = [(self._hash[:n].copy(), rows0)]
        slots = self._take_holes(m) if self._holes and not self._ordered else np.zeros(0, dtype=np.int64)
        if len(slots):
            self._dead[slots] = False
            self._n_dead -= len(slots)
        top = m - len(slots)  # rows added at the end
        if len(self._hash) >= TOUCH_AHEAD_FROM and 2 * (n + top) > len(self._hash):
            self._touch_ahead(4 * top)
        if n + top > len(self._hash):
            cap = max(2 * len(self._hash), n + top, 16)
            spare, self._spare = self._spare, None
            if spare is not None and len(spare[0]) == cap:  # (touched already: a copy, no fault)
                grown, cols = spare
            else:
                grown, cols = np.zeros(cap, dtype=np.uint64), {c: np.zeros(cap, dtype=a.dtype)
                                                               for c, a in self._cols.items()}
            grown[:n] = self._hash[:n]
            self._hash = grown
            for c, a in self._cols.items():
                g = cols[c]
                g[:n] = a[:n]
                self._cols[c] = g
            if self._dead is not None:
                grown_dead = np.zeros(cap, dtype=bool)
                grown_dead[:n] = self._dead[:n]
                self._dead = grown_dead
        rows = np.arange(n, n + top, dtype=np.int64)
        where = slice(n, n + top)
        if len(slots):
            rows = np.concatenate([slots, rows])
            where = rows
        self._hash[where] = hashes
        for c, a in self._cols.items():
            a[where] = np.zeros(m, dtype=a.dtype) if values is None or c not in values else \
                np.asarray(values[c], dtype=a.dtype)
        self._n = n + top
        if not self._ordered:
            self._add_run(hashes, rows)
        return rows

    def _touch_ahead(self, k: int) -> None:
        """Write zeros into ``k`` more rows of the storage the next growth will copy into (twice
        the present capacity, allocated when the rows pass half of it). Memory a process touches
        for the first time costs a page fault per page (on this VM up to 2.4 ms a MB, fresh from
        the host): touched a few rows per append, the growth is then one copy into memory that is
        there already, not a pause of the data path for the faults of the whole copy (a fluid
        move's taker paused about 90 ms growing from 1.9M rows, issue #42)."""
        cap = len(self._hash)
        if self._spare is None or len(self._spare[0]) != 2 * cap:
            self._spare = (np.empty(2 * cap, dtype=np.uint64),
                           {c: np.empty(2 * cap, dtype=a.dtype) for c, a in self._cols.items()})
            self._touched = 0
        a, b = self._touched, min(cap, self._touched + max(int(k), 1024))
        if a < b:  # (the rows a growth copies into: the first ``cap``)
            h, cols = self._spare
            h[a:b] = 0
            for g in cols.values():
                g[a:b] = 0
            self._touched = b

    def _take_holes(self, k: int) -> np.ndarray:
        """Up to ``k`` free slots (dead rows), taken from the list of them."""
        out = []
        while k and self._holes:
            last = self._holes[-1]
            if len(last) <= k:
                out.append(self._holes.pop())
                k -= len(last)
            else:
                out.append(last[len(last) - k:])
                self._holes[-1] = last[:len(last) - k]
                k = 0
        return np.concatenate(out) if len(out) > 1 else out[0] if out else np.zeros(0, dtype=np.int64)

    def _keep(self, keep: np.ndarray) -> None:
        """Keep only the rows where ``keep`` holds (renumbered, in order; ``keep`` leaves out
        every dead row)."""
        self._finish_merge()  # (its entries are renumbered too)
        self._spare = None
        self._hash = self._hash[:self._n][keep]
        self._cols = {c: a[:self._n][keep] for c, a in self._cols.items()}
        renumber = np.cumsum(keep) - 1
        runs = []
        for h, r in self._runs:
            ok = r >= 0  # (cleared entries go)
            ok[ok] = keep[r[ok]]
            runs.append((h[ok], renumber[r[ok]]))
        self._runs = [x for x in runs if len(x[0])]
        self._n = len(self._hash)
        self._holes, self._unlinked = [], 0

    def load(self, hashes: np.ndarray, cols: Mapping[str, np.ndarray]) -> None:
        """Replace every row with ``hashes`` and ``cols`` (copied: a checkpoint's arrays may be
        read-only), in any order."""
        self._n = 0
        self._hash = np.zeros(0, dtype=np.uint64)
        self._cols = {c: np.zeros(0, dtype=d) for c, d in self.dtypes.items()}
        self._runs, self._probes, self._ordered, self._merge, self._spare = [], 0, True, None, None
        self._dead, self._n_dead = None, 0
        self._holes, self._unlinked = [], 0
        if len(hashes):
            self._append(np.array(hashes, dtype=np.uint64), cols)
            self._merge_runs()

    def upsert(self, hashes: np.ndarray, init: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Rows of ``hashes`` (distinct), appending absent ones (zeros, or ``init[col][i]`` for the
        i-th hash); returns the rows, valid until the next ``upsert``, removal or full snapshot
        (each may renumber rows; :meth:`locate` never does)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        pos = self._locate(hashes)
        if self._n_dead and self._dead[pos[pos >= 0]].any():  # (a key of a bin given away: never
            self._compact()                                    # expected; a new row, not the dead one)
            pos = self._locate(hashes)
        new = pos < 0
        if new.any():
            pos[new] = self._append(hashes[new], None if init is None else
                                    {c: np.asarray(v)[new] for c, v in init.items() if c in self._cols})
        return pos

    def touch(self, hashes: np.ndarray) -> None:
        """Record that the rows of ``hashes`` changed: bump their bins' versions."""
        if len(hashes):
            self.clock += 1
            self.versions[bin_of(hashes, self.bits)] = self.clock

    def changed_since(self, version: int) -> np.ndarray:
        """Bins changed after clock value ``version`` (what an incremental checkpoint ships)."""
        return np.flatnonzero(self.versions > int(version))

    def remove(self, rows: np.ndarray) -> None:
        """Delete rows (their bins count as changed; the others' row numbers change; dead rows
        go too)."""
        if len(rows):
            self.touch(self._hash[:self._n][rows])
            keep = np.ones(self._n, dtype=bool) if not self._n_dead else ~self._dead[:self._n]
            keep[rows] = False
            self._dead, self._n_dead = None, 0
            self._keep(keep)

    def drop_bins(self, bins: Iterable[int], bits: int | None = None) -> int:
        """Delete every row of ``bins`` (at ``2**bits`` bins, default :attr:`bits`): a rescale's
        step gave them to another partition. The rows are found with two binary searches per bin
        and run of the index (no pass over the hashes) and marked dead: free slots for new keys,
        deleted at the next full snapshot. Their bins count as changed. Returns how many rows
        were deleted.

        >>> st = KeyedState({"n": "i8"}, bits=1)
        >>> _ = st.upsert(np.array([5, 7, 9, 2**63], dtype=np.uint64))
        >>> st.drop_bins([1]), len(st), st.snapshot([0, 1])[0].tolist()   # dead, not yet deleted
        (1, 3, [5, 7, 9])
        >>> st.snapshot()[0].tolist(), len(st.hash)   # (a full snapshot deletes them)
        ([5, 7, 9], 3)
        """
        bits = self.bits if bits is None else int(bits)
        chosen = bin_list(bins)
        if not len(chosen) or not self._n:
            return 0
        if self._ordered:  # (the storage is the index: its dead rows stay in it)
            _, rows = self._rows_of(chosen, bits)
            if self._n_dead:
                rows = rows[~self._dead[rows]]
        else:
            rows = self._unlink(chosen, bits)
        if not len(rows):
            return 0
        self.touch(self._hash[rows])
        if self._dead is None:
            self._dead = np.zeros(len(self._hash), dtype=bool)
        self._dead[rows] = True
        self._n_dead += len(rows)
        self._holes.append(rows)
        return int(len(rows))

    def _unlink(self, chosen: np.ndarray, bits: int) -> np.ndarray:
        """Clear the index entries of the live rows of bins ``chosen`` (row -1, purged at the next
        merge) and return those rows: two binary searches per bin and run, then their entries."""
        out = []
        for _, rr, idx, ok in self._run_entries(chosen, bits):
            out.append(rr[idx[ok]])
            rr[idx[ok]] = -1
        rows = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
        self._unlinked += len(rows)
        return rows

    def snapshot(self, bins: Iterable[int] | None = None, bits: int | None = None
                 ) -> tuple[np.ndarray, dict, np.ndarray]:
        """(hashes sorted ascending, columns, offsets) of ``bins`` (all when None) at ``2**bits``
        bins (default :attr:`bits`), copied; offsets cover every bin, empty for the others.
        Costs the rows of ``bins`` plus two binary searches per bin and run."""
        bits = self.bits if bits is None else int(bits)
        if bins is None:
            self._merge_runs()  # in hash order from then on
            return self.hash.copy(), {c: a.copy() for c, a in self.cols.items()}, bin_bounds(self.hash, bits)
        chosen = np.unique(np.asarray(list(bins), dtype=np.int64))
        if self._n_dead:  # (rows of bins given away: the snapshot leaves them out)
            h, r = self._rows_of(chosen, bits)
            live = ~self._dead[r]
            h, r = h[live], r[live]
            counts = np.bincount(bin_of(h, bits), minlength=1 << bits) if len(h) else np.zeros(1 << bits, np.int64)
            return h, {c: a[r] for c, a in self.cols.items()}, np.r_[0, np.cumsum(counts)].astype(np.int64)
        if self._ordered:  # one run in storage order: the bins are slices
            lo, hi = bin_ranges(self.hash, bits, chosen)  # searches for the chosen bins only
            idx = concat_ranges(lo, hi)
            counts = np.zeros(1 << bits, dtype=np.int64)
            counts[chosen] = hi - lo
            return self.hash[idx], {c: a[idx] for c, a in self.cols.items()}, np.r_[0, np.cumsum(counts)]
        h, r = self._rows_of(chosen, bits)
        counts = np.bincount(bin_of(h, bits), minlength=1 << bits) if len(h) else np.zeros(1 << bits, np.int64)
        return h, {c: a[r] for c, a in self.cols.items()}, np.r_[0, np.cumsum(counts)].astype(np.int64)

    def _rows_of(self, chosen: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
        """(hashes ascending, their rows) of the bins ``chosen`` (at ``2**bits`` bins), dead rows
        included: two binary searches per bin and run of the index (of the storage, in hash order)."""
        if self._ordered:
            idx = concat_ranges(*bin_ranges(self.hash, bits, chosen)).astype(np.int64)
            return self.hash[idx], idx
        hs, rs = [], []
        for rh, rr, idx, ok in self._run_entries(chosen, bits):
            hs.append(rh[idx[ok]])
            rs.append(rr[idx[ok]])
        h = np.concatenate(hs) if hs else np.zeros(0, np.uint64)
        r = np.concatenate(rs) if rs else np.zeros(0, np.int64)
        if len(hs) > 1:
            order = np.argsort(h, kind="stable")
            h, r = h[order], r[order]
        return h, r

    def _run_entries(self, chosen: np.ndarray, bits: int):
        """Per run of the index, ``(hashes, rows, idx, ok)``: ``idx`` the positions of the bins
        ``chosen`` (two binary searches per bin), ``ok`` those not cleared (row -1: given away)."""
        for rh, rr in self._runs:
            idx = concat_ranges(*bin_ranges(rh, bits, chosen))
            yield rh, rr, idx, rr[idx] >= 0

    def _holds_any(self, bins: np.ndarray, bits: int) -> bool:
        """Whether some row lies in ``bins`` (at ``2**bits`` bins): two binary searches per bin and
        run of the index, not a pass over every row. A receiver installs each step of a transfer
        into a state that holds none of its bins: the step then costs its own rows, not also a
        look at every row the receiver holds so far. (Not what makes a fluid move's receiver busy:
        py-spy puts that in :meth:`_append`, in storage growth and copies of merged parts.)

        >>> st = KeyedState({"n": "i8"}, bits=1)
        >>> _ = st.upsert(np.array([5], dtype=np.uint64))
        >>> st._holds_any(np.array([0]), 1), st._holds_any(np.array([1]), 1)
        (True, False)
        """
        if self._ordered:
            lo, hi = bin_ranges(self.hash, bits, bins)
            return bool((hi > lo).any())
        for rh, rr in self._runs:
            lo, hi = bin_ranges(rh, bits, bins)
            if bool((hi > lo).any()) and bool((rr[concat_ranges(lo, hi)] >= 0).any()):  # (cleared: given away)
                return True
        return False

    def replace_bins(self, bins: Iterable[int], hashes: np.ndarray, cols: Mapping[str, np.ndarray],
                     bits: int | None = None) -> None:
        """Make bins ``bins`` hold exactly the given rows (an incremental checkpoint's delta, or a
        transfer step's bins, which this state does not hold: ``bins`` empty, nothing dropped)."""
        bits = self.bits if bits is None else int(bits)
        hashes = np.asarray(hashes, dtype=np.uint64)
        chosen = np.asarray(list(bins), dtype=np.int64)
        self._compact()  # (a bin given away may come back: its dead rows must not be found)
        if len(chosen) and self._n and self._holds_any(chosen, bits):  # (a transfer's step: it holds none)
            drop = np.zeros(1 << bits, dtype=bool)
            drop[chosen] = True
            keep = ~drop[bin_of(self.hash, bits)]
            if not keep.all():
                self._keep(keep)
        if len(hashes):
            self._append(hashes, cols)
            self.touch(hashes)


class KeyedOperatorLogic(OperatorLogic):
    """Base class of user-defined keyed stateful operators (Megaphone §3.2's operator interface).

    Declare the key and the per-key state, implement :meth:`update`:

    * ``by``: the key fields of the (single) input;
    * ``state_columns``: ``{column: dtype}`` of each key's state row (the key fields are
      kept too, to check 64-bit hash collisions and for output);
    * ``every``: the length of an *epoch* of event time (epoch ``e`` is the timestamps
      ``e*every .. (e+1)*every - 1``; default 1: every timestamp its own epoch);
    * ``update(state, rows, batch) -> list[np.ndarray]``: called once per complete epoch
      (every epoch up to the watermark), in epoch order; ``batch`` is the epoch's input
      tuples in (ts, id) order, ``rows[i]`` the state row of ``batch[i]``'s key (new keys
      start zeroed); change ``state.cols[...]`` in place and return what to emit, with
      timestamps taken from ``batch`` (they are then above every punctuation already
      emitted).

    Epochs, not watermarks, delimit what ``update`` sees: replicas receive different
    punctuations (a replica built by a staged transfer skips some), so output that
    depended on which watermarks came would differ between replicas; per epoch it is
    the same everywhere (replica consistency, Hwang Definition 2).

    The state lives in a :class:`KeyedState` with ``2**bits`` versioned bins; tuples above
    the watermark are pending work, binned by key too. Checkpoints of a few bins cost those
    bins (:meth:`checkpoint` with ``bins``), and :meth:`delta` ships the bins changed since a
    version (Del Monte 2017's incremental checkpoint).

    >>> class Latest(KeyedOperatorLogic):   # the largest x seen per key, emitted when it grows
    ...     def __init__(self, name, in_schemas, strict=False):
    ...         out = Schema({"k": "i8", "top": "i8"})
    ...         super().__init__(name, in_schemas, out, by=("k",), state_columns={"top": "i8"}, bits=2,
    ...                          strict=strict)
    ...     def update(self, state, rows, batch):
    ...         old = state.cols["top"][rows].copy()
    ...         np.maximum.at(state.cols["top"], rows, batch["x"])
    ...         grew = np.unique(rows[state.cols["top"][rows] > old])
    ...         ts = np.full(len(grew), batch["ts"].max())
    ...         return [self.out_schema.from_columns({"ts": ts, "k": state.cols["k"][grew],
    ...                 "top": state.cols["top"][grew]}, ids=self.ids(state.hash[grew], ts))]
    >>> from replistream import Punctuation
    >>> s = Schema({"k": "i8", "x": "i8"})
    >>> op = Latest("top", [s])
    >>> op.process(0, s.from_columns({"ts": [1, 2], "k": [1, 1], "x": [5, 3]}, ids=[1, 2]))
    []
    >>> op.process(0, Punctuation(4))[0][["k", "top"]].tolist()
    [(1, 5)]
    """

    def __init__(self, name: str, in_schemas: list[Schema], out_schema: Schema, by: Sequence[str],
                 state_columns: Mapping[str, object], bits: int = 12, strict: bool = False, every: int = 1):
        super().__init__(name, in_schemas, out_schema, strict)
        if int(every) < 1:
            raise ValueError(f"keyed operator {name!r}: every must be >= 1, got {every}")
        self.every = int(every)
        if len(in_schemas) != 1:
            raise ValueError(f"keyed operator {name!r} takes one input, got {len(in_schemas)}")
        self.by = (by,) if isinstance(by, str) else tuple(by)
        if not self.by:
            raise ValueError(f"keyed operator {name!r} needs key fields (by=...)")
        for f in self.by:
            if f not in in_schemas[0]:
                raise ValueError(f"keyed operator {name!r}: key field {f!r} is not in its input {in_schemas[0]}")
        cols = {f: in_schemas[0][f] for f in self.by}
        for c, d in state_columns.items():
            if c in cols:
                raise ValueError(f"keyed operator {name!r}: state column {c!r} clashes with a key field")
            cols[c] = d
        self.bits = int(bits)
        self.state = KeyedState(cols, self.bits)
        self._salt = stable_hash(name)
        self._pending: list[np.ndarray] = []  # input tuples above the watermark (pending work)
        self._pending_hash: list[np.ndarray] = []

    def frozen_until(self, at: int) -> int:
        """A key's state changes only when its own tuples' epoch completes (:meth:`update`): a bin
        that gets no tuple after ``at`` keeps its state until the epoch holding ``at`` completes,
        forever if it is complete at ``at`` (always with ``every=1``). A rescale's old owner then
        gives many steps' bins in one pass (replistream/replica/rescale.py).

        >>> KeyedCountLogic("c", [Schema({"k": "i8"})], by="k").frozen_until(5) > 10 ** 15
        True
        >>> KeyedCountLogic("c", [Schema({"k": "i8"})], by="k", every=10).frozen_until(5)
        8
        """
        end = (int(at) // self.every + 1) * self.every - 1  # the last timestamp of at's epoch
        return END - 1 if end == int(at) else end - 1

    def forward_punctuation(self, wm):
        """The end of the last complete epoch (the watermark itself with ``every=1``, or at the
        end of the stream): the open epoch's output comes when it completes, so forwarding the
        watermark would promise what is still owed.

        >>> from replistream import Punctuation
        >>> c = KeyedCountLogic("c", [Schema({"k": "i8"})], by="k", every=10)
        >>> c.forward_punctuation(8), c.forward_punctuation(9), c.process(0, Punctuation(8))
        (-1, 9, [Punctuation(-1)])
        """
        if self.every == 1:
            return wm
        w = np.asarray(wm, dtype=np.int64)
        keep = (w == END) | (w <= NO_PUNCTUATION + self.every)
        # the edge only of the values it is used for: END + 1 wrapped round (an overflow whose result
        # np.where then dropped: no wrong edge, but a RuntimeWarning; tests/core/test_keyed_edges.py)
        safe = np.where(keep, 0, w)
        edge = (safe + 1) // self.every * self.every - 1
        out = np.where(keep, w, edge)
        return int(out) if np.ndim(wm) == 0 else out

    # -- what subclasses implement --------------------------------------------------
    def update(self, state: KeyedState, rows: np.ndarray, batch: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} must implement update(state, rows, batch)")

    def ids(self, key_hash: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Deterministic output ids for (key, ts) (docs/design.md, decision 1)."""
        return mix(self._salt, key_hash, np.asarray(ts, dtype=np.int64).view(np.uint64))

    # -- the engine-facing part ------------------------------------------------------
    def key_hash(self, batch: np.ndarray) -> np.ndarray:
        return hash_columns(batch, self.by)

    def bin_keys(self, port, batch):
        return self.key_hash(batch)

    def _on_batch(self, port, batch):
        self._pending.append(batch)
        self._pending_hash.append(self.key_hash(batch))
        return []

    def _take_pending(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._pending:
            return self.in_schemas[0].empty(), np.zeros(0, dtype=np.uint64)
        if len(self._pending) > 1:
            self._pending = [np.concatenate(self._pending)]
            self._pending_hash = [np.concatenate(self._pending_hash)]
        return self._pending[0], self._pending_hash[0]

    def _on_watermark(self, wm):
        rows, hashes = self._take_pending()
        if not len(rows):
            return []
        if wm == END:
            ready = np.ones(len(rows), dtype=bool)
        else:  # complete epochs only: what update sees must not depend on which punctuations came
            ready = rows[TS] <= (wm + 1) // self.every * self.every - 1
        if not ready.any():
            return []
        batch, bh = rows[ready], hashes[ready]
        keep = ~ready
        self._pending = [rows[keep]] if keep.any() else []
        self._pending_hash = [hashes[keep]] if keep.any() else []
        order = canonical_order(batch)
        batch, bh = batch[order], bh[order]
        uniq, first, inv = np.unique(bh, return_index=True, return_inverse=True)
        init = {f: batch[f][first] for f in self.by}
        slots = self.state.upsert(uniq, init)
        for f in self.by:  # a 64-bit hash collision would merge two keys: check, never ignore
            if not _same_keys(self.state.cols[f][slots], init[f]):
                raise RuntimeError(f"keyed operator {self.name!r}: 64-bit key hash collision")
        self.state.touch(uniq)
        out = self.update_epochs(self.state, slots[inv], batch, batch[TS] // self.every)
        # rows are numbered in arrival order, which differs between replicas (a restored one holds
        # its keys in hash order): the output goes in (ts, id) order, the same on every replica
        return [o[canonical_order(o)] if len(o) > 1 else o for o in out]

    def update_epochs(self, state: KeyedState, rows: np.ndarray, batch: np.ndarray,
                      epoch: np.ndarray) -> list[np.ndarray]:
        """Apply several complete epochs at once (``epoch`` nondecreasing): by default one
        :meth:`update` per epoch; a subclass may override it with a vectorised equivalent."""
        cuts = np.r_[0, np.flatnonzero(epoch[1:] != epoch[:-1]) + 1, len(batch)]
        out: list[np.ndarray] = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            out.extend(self.update(state, rows[a:b], batch[a:b]))
        return out

    # -- state (hand-over, transfer, incremental checkpoints) --------------------------
    def _state_params(self):
        return {"by": self.by, "every": self.every,
                "columns": tuple((c, str(d)) for c, d in self.state.dtypes.items())}

    def checkpoint(self, bits: int = 0, bins: Iterable[int] | None = None) -> OperatorState:
        """The state at ``2**bits`` bins, only ``bins`` if given: the cost is the rows of those bins
        (plus the pending tuples, which are few: those above the watermark)."""
        bits = int(bits)
        h, cols, off = self.state.snapshot(bins, bits)
        cols = dict(cols)
        cols["hash"] = h
        prow, phash = self._take_pending()
        pb = bin_of(phash, bits)
        if bins is not None:
            keep = np.isin(pb, np.asarray(list(bins), dtype=np.int64))
            prow, phash, pb = prow[keep], phash[keep], pb[keep]
        order = np.argsort(pb, kind="stable")
        poff = np.r_[0, np.cumsum(np.bincount(pb, minlength=1 << bits))].astype(np.int64)
        return OperatorState(type(self).__name__, self.name, self._state_params(), tuple(self.in_punct),
                             int(self.watermark), bits,
                             {"state": cols, "pending": {"rows": prow[order].copy(), "hash": phash[order].copy()}},
                             {"state": off, "pending": poff})

    def _restore_tables(self, tables):
        st = tables["state"]
        h = np.asarray(st["hash"], dtype=np.uint64)
        self.state.load(h, {c: st[c] for c in self.state.dtypes})
        if len(h):
            self.state.touch(h)
        p = tables["pending"]
        rows = self.in_schemas[0].check(p["rows"], f"{self.name} checkpoint (pending)")
        self._pending = [rows] if len(rows) else []
        self._pending_hash = [np.asarray(p["hash"], dtype=np.uint64)] if len(rows) else []

    live_bins = True  # the state is a KeyedState: sorted by key hash as it runs

    def drop_bins(self, bits: int, bins) -> int:
        """Forget the keys of ``bins`` (at ``2**bits`` bins) and their pending tuples: a rescale's
        step gave them to another partition (replistream/replica/rescale.py; Megaphone §3.3's
        fluid migration, whose steps should cost their own bins). Costs the bins' rows to find and
        one copy of the rows kept: no hash pass over the state and no logic built anew, which a
        step cost before (a whole checkpoint, a selection of the other bins and a restore of
        them: 4.7 ms a step at 200,000 keys). Returns how many keys were dropped.

        >>> s = Schema({"k": "i8"})
        >>> a = KeyedCountLogic("c", [s], by="k", bits=2)
        >>> _ = a.process(0, s.from_columns({"ts": [1, 1, 1], "k": [1, 2, 3]}, ids=[1, 2, 3]))
        >>> _ = a.process(0, Punctuation(1))
        >>> gone = a.checkpoint(2).nonempty_bins()[:1]
        >>> a.drop_bins(2, gone) > 0, a.checkpoint(2).select(gone).rows("state"), len(a.state) < 3
        (True, 0, True)
        """
        chosen = bin_list(bins)
        dropped = self.state.drop_bins(chosen, int(bits))
        rows, hashes = self._take_pending()
        if len(rows):
            keep = ~np.isin(bin_of(hashes, int(bits)), chosen)
            if not keep.all():
                self._pending = [rows[keep]] if keep.any() else []
                self._pending_hash = [hashes[keep]] if keep.any() else []
        return dropped

    def _install_tables(self, tables):
        """Insert a step's keys (of bins this logic does not hold) into the sorted state, and
        append its pending tuples."""
        st = tables["state"]
        h = np.asarray(st["hash"], dtype=np.uint64)
        if len(h):
            self.state.replace_bins(np.zeros(0, dtype=np.int64), h, {c: st[c] for c in self.state.dtypes})
        p = tables["pending"]
        rows = self.in_schemas[0].check(p["rows"], f"{self.name} step (pending)")
        if len(rows):
            self._pending.append(rows)
            self._pending_hash.append(np.asarray(p["hash"], dtype=np.uint64))

    def version(self) -> int:
        """The state's version: the clock of its last change."""
        return self.state.clock

    def delta(self, since: int) -> tuple[OperatorState, np.ndarray]:
        """Incremental checkpoint (Del Monte 2017): the bins (at the state's own ``bits``) changed
        after version ``since``, and all pending work; returns (state, bins).

        >>> s = Schema({"k": "i8"})
        >>> a = KeyedCountLogic("c", [s], by="k", bits=2)
        >>> _ = a.process(0, s.from_columns({"ts": [1], "k": [3]}, ids=[1])); _ = a.process(0, Punctuation(1))
        >>> v = a.version(); _ = a.process(0, s.from_columns({"ts": [2], "k": [4]}, ids=[2]))
        >>> _ = a.process(0, Punctuation(2)); d, bins = a.delta(v); d.rows("state"), len(bins)
        (1, 1)
        """
        bits = self.state.bits
        changed = self.state.changed_since(since)
        st = self.checkpoint(bits, changed)
        # pending work travels whole: it is small (above the watermark) and replaced by apply_delta
        rows, h = self._take_pending()
        pb = bin_of(h, bits)
        order = np.argsort(pb, kind="stable")
        st.tables["pending"] = {"rows": rows[order].copy(), "hash": h[order].copy()}
        st.offsets["pending"] = np.r_[0, np.cumsum(np.bincount(pb, minlength=1 << bits))].astype(np.int64)
        return st, changed

    def apply_delta(self, state: OperatorState, bins: Iterable[int]) -> "KeyedOperatorLogic":
        """Bring this logic (restored from an earlier checkpoint or delta of the same operator) up to
        ``state``, a :meth:`delta` of bins ``bins``: those bins are replaced, pending work and
        punctuation bookkeeping taken over."""
        if state.kind != type(self).__name__ or state.name != self.name or state.params != self._state_params():
            raise CheckpointError(f"delta of {state.kind} {state.name!r} cannot apply to {self.name!r}")
        st = state.tables["state"]
        self.state.replace_bins(bins, st["hash"], {c: st[c] for c in self.state.dtypes}, bits=state.bits)
        p = state.tables["pending"]
        self._pending = [p["rows"]] if len(p["rows"]) else []
        self._pending_hash = [np.asarray(p["hash"], dtype=np.uint64)] if len(p["rows"]) else []
        self.in_punct = [int(x) for x in state.in_punct]
        self.watermark = int(state.watermark)
        return self

    def stats(self) -> dict:
        s = super().stats()
        s.update({"keys": len(self.state), "state_bytes": self.state.nbytes, "bits": self.bits,
                  "pending": sum(len(p) for p in self._pending)})
        return s


def _same_keys(a: np.ndarray, b: np.ndarray) -> bool:
    """Equality that treats NaN as equal to NaN (floats hash NaNs alike)."""
    if a.dtype.kind == "f":
        return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
    return bool(np.array_equal(a, b))


class KeyedCountLogic(KeyedOperatorLogic):
    """A running count per key (Megaphone §5.3's keyed count), on binned live state.

    Per epoch of ``every`` event-time units (default 1), once the watermark
    passes it, it emits for every key the epoch touched one tuple: the key
    fields, ``count`` (all tuples of that key up to the end of the epoch) and the
    ``keep`` fields of the key's latest tuple in (ts, id) order, with ``ts`` =
    that tuple's ts and id ``mix(hash(operator), hash(key), ts)``. Replica
    consistent: the output depends only on the tuples of each epoch. With
    ``emit_keep=False`` the ``keep`` fields stay in the state but not in the output.

    >>> from replistream import Punctuation
    >>> s = Schema({"k": "i8", "tag": "S4"})
    >>> c = KeyedCountLogic("c", [s], by="k", keep=("tag",), bits=2, every=10)
    >>> _ = c.process(0, s.from_columns({"ts": [1, 2, 3], "k": [1, 1, 2], "tag": [b"a", b"b", b"c"]}, ids=[1, 2, 3]))
    >>> c.process(0, Punctuation(8))   # epoch 0 (ts 0..9) is not complete yet: only ts <= -1 promised
    [Punctuation(-1)]
    >>> sorted(c.process(0, Punctuation(9))[0][["ts", "k", "count", "tag"]].tolist())
    [(2, 1, 2, b'b'), (3, 2, 1, b'c')]
    """

    def __init__(self, name, in_schemas, by, keep: Sequence[str] = (), bits: int = 12, strict: bool = False,
                 every: int = 1, emit_keep: bool = True):
        by = (by,) if isinstance(by, str) else tuple(by)
        keep = (keep,) if isinstance(keep, str) else tuple(keep)
        schema = in_schemas[0]
        for f in keep:
            if f not in schema:
                raise ValueError(f"keyed count {name!r}: keep field {f!r} is not in its input {schema}")
        out = Schema([(f, schema[f]) for f in by] + [("count", "i8")] +
                     ([(f, schema[f]) for f in keep] if emit_keep else []))
        super().__init__(name, in_schemas, out, by, {"count": "i8", **{f: schema[f] for f in keep}}, bits, strict,
                         every)
        self.keep = keep
        self.emit_keep = bool(emit_keep)

    def update(self, state, rows, batch):
        u, last_rev, n = np.unique(rows[::-1], return_index=True, return_counts=True)
        last = len(rows) - 1 - last_rev  # each key's latest tuple (batch is in (ts, id) order)
        state.cols["count"][u] += n
        for f in self.keep:
            state.cols[f][u] = batch[f][last]
        ts = batch[TS][last]
        cols = {"ts": ts, "count": state.cols["count"][u]}
        for f in self.by + (self.keep if self.emit_keep else ()):
            cols[f] = state.cols[f][u]
        return [self.out_schema.from_columns(cols, ids=self.ids(state.hash[u], ts))]

    def update_epochs(self, state, rows, batch, epoch):
        """All epochs in one vectorised pass (equal, as a multiset, to :meth:`update` per epoch)."""
        if len(epoch) and epoch[0] == epoch[-1]:
            return self.update(state, rows, batch)
        n = len(rows)
        order = np.lexsort((np.arange(n), rows))  # by key row, then arrival ((ts, id)) order
        r, e = rows[order], epoch[order]
        first = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (e[1:] != e[:-1])])  # (key, epoch) groups
        last = np.r_[first[1:], n] - 1
        size = last - first + 1
        grow = r[first]
        key_start = np.r_[True, grow[1:] != grow[:-1]]
        cs = np.cumsum(size)
        seg = np.cumsum(key_start) - 1
        before = np.r_[0, cs][np.flatnonzero(key_start)][seg]
        cum = state.cols["count"][grow] + cs - before  # each key's count at the end of each epoch
        at = order[last]  # each group's latest tuple
        ts = batch[TS][at]
        key_last = np.r_[np.flatnonzero(key_start)[1:] - 1, len(grow) - 1]
        state.cols["count"][grow[key_last]] = cum[key_last]
        for f in self.keep:
            state.cols[f][grow[key_last]] = batch[f][at[key_last]]
        cols = {"ts": ts, "count": cum}
        for f in self.by:
            cols[f] = state.cols[f][grow]
        for f in self.keep if self.emit_keep else ():
            cols[f] = batch[f][at]
        return [self.out_schema.from_columns(cols, ids=self.ids(state.hash[grow], ts))]

    def _state_params(self):
        return {**super()._state_params(), "keep": self.keep, "emit_keep": self.emit_keep}


@dataclass(frozen=True)
class KeyedCount:
    """Factory of :class:`KeyedCountLogic` for :meth:`replistream.query.Stream.apply`.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.apply(KeyedCount(by="k", bits=12), name="counts").sink("out")
    >>> q.build().schema_of("counts").names
    ('k', 'count')
    """

    by: tuple | str
    keep: tuple | str = ()
    bits: int = 12
    every: int = 1
    emit_keep: bool = True

    def __call__(self, name, in_schemas, strict=False):
        return KeyedCountLogic(name, in_schemas, self.by, self.keep, self.bits, strict, self.every, self.emit_keep)

