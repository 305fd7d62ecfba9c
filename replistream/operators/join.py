"""Windowed Join made replica consistent with punctuations (Algorithm 2, Hwang §IV-E).

For ``t1`` on input 0 and ``t2`` on input 1 the Join emits ``t1 ⊗ t2`` when
``|t1.ts - t2.ts| < window`` and the predicate holds (and, on the fast path,
their keys are equal). The output timestamp is ``max(t1.ts, t2.ts)``, the time
the pair would be produced in the ideal run; its id is ``mix(t1.id, t2.id)``.

Invariant (lines 5-6): a punctuation ``p`` on input ``i`` removes from the
*other* input's buffer every tuple that no future tuple on ``i`` (``ts > p``)
can match: ``ts <= p + 1 - window`` in integer time. Each matching pair is
produced exactly once, when the second of its two tuples arrives, whatever
the interleaving: the operator is non-blocking and replica consistent.

Buffers are lists of chunks sorted by key and ts (or by ts without a key); a
probe binary-searches each chunk for the rows with its key *within its window*
and expands those ranges with numpy, so no Python runs per tuple and a probe
costs the matches it finds, not every buffered tuple of its key. Chunks are
merged as in a log-structured merge tree: a new chunk is merged with the one
before it while it is at least half that one's size, so chunk sizes grow
geometrically, a buffer of n tuples has O(log n) chunks, and each tuple is
copied O(log n) times, whatever the state's size (merging everything every
few batches made a Join over 1M buffered tuples spend 18 ms per 100-tuple batch).

Live bins (Megaphone §3.4): a keyed Join's search key is the 64-bit hash of its join key
(:func:`~replistream.ids.hash_columns`, the same on both inputs), so every chunk is sorted by
key hash and the bin of a row, the top bits of its hash, is a contiguous slice of each chunk
for *any* number of bins. A transfer step (:meth:`JoinLogic.checkpoint` with ``bins``) takes
those slices, two binary searches per bin and chunk, without hashing or scanning the rest of
the window; a receiver adds a step's rows as one more chunk (:meth:`JoinLogic.install_bins`).
Exact key equality is still tested on the candidate pairs, so a hash collision never makes a
false match.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import SchemaError, UserFunctionError
from ..ids import argsort_u64, hash_columns, mix
from ..schema import END, ID, TS, Schema
from .base import CheckpointError, OperatorLogic, bin_list, concat_ranges
from .keyed import bin_ranges

_MAX_CHUNKS = 32  # more than this (purges can leave many small chunks): merge them all


def join_schema(left: Schema, right: Schema, suffixes: tuple[str, str] = ("_l", "_r")) -> tuple[Schema, list, list]:
    """Output schema of a join, and the (input name, output name) pairs of each side.

    Fields present on both sides get ``suffixes``.

    >>> join_schema(Schema({"k": "i8", "a": "f8"}), Schema({"k": "i8", "b": "f8"}))[0]
    Schema({k_l: <i8, a: <f8, k_r: <i8, b: <f8})
    """
    clash = set(left.names) & set(right.names)
    lmap = [(n, n + suffixes[0] if n in clash else n) for n in left.names]
    rmap = [(n, n + suffixes[1] if n in clash else n) for n in right.names]
    fields = [(o, left[n]) for n, o in lmap] + [(o, right[n]) for n, o in rmap]
    return Schema(fields), lmap, rmap


class _SideBuffer:
    """Buffered tuples of one input, as chunks sorted by their search key and, within a key, by ts.

    :meth:`ranges` finds, for probe tuples, the rows of a chunk with an equal key *and* a
    timestamp within the window, with two binary searches per probe tuple (no enumeration
    of every buffered tuple of the key): within a chunk, rows are numbered by their key's
    rank ``g`` and placed at ``g * span + (ts - tmin)``, which is sorted, so the window of a
    probe tuple with key rank ``g`` is one interval of that array.
    """

    def __init__(self):
        self.chunks: list[np.ndarray] = []  # structured batches
        self.keys: list[np.ndarray] = []  # sorted search key per chunk
        self._index: list = []  # per chunk, (unique keys, positions, tmin, tmax) once a probe needed it
        self.tmin: list[int] = []  # per chunk, its earliest timestamp (a purge below it keeps the chunk)
        self.tmax: list[int] = []  # per chunk, its latest timestamp (a purge at or above it drops the chunk)
        self.bound: int | None = None  # the latest purge: rows at or below it are expired

    def _merge(self, a: int) -> None:
        """Merge chunks ``a..`` (the last ones) into one, leaving out expired rows."""
        batch = concat_rows(self.chunks[a:])
        key = np.concatenate(self.keys[a:])
        if self.bound is not None and min(self.tmin[a:]) <= self.bound:
            keep = batch[TS] > self.bound
            batch, key = batch.compress(keep), key[keep]
        order = _merge_order(key, batch[TS])
        batch, key = batch.take(order), key[order]
        self.chunks[a:], self.keys[a:], self._index[a:] = [batch], [key], [None]
        t = batch[TS]
        self.tmin[a:] = [int(t.min()) if len(t) else 0]
        self.tmax[a:] = [int(t.max()) if len(t) else 0]
        if not len(batch):
            del self.chunks[a:], self.keys[a:], self._index[a:], self.tmin[a:], self.tmax[a:]

    @staticmethod
    def order(batch: np.ndarray, key: np.ndarray) -> np.ndarray:
        """The order of a batch's rows in a chunk: by search key, then by ts."""
        if key.dtype == np.uint64:  # a key hash: by ts (batches come nearly in time order), then by
            by_ts = np.argsort(batch[TS], kind="stable")  # key with a radix pass first: lexsort's order
            return by_ts[argsort_u64(key[by_ts])]
        return np.lexsort((batch[TS], key))

    def add(self, batch: np.ndarray, key: np.ndarray, in_order: bool = False) -> None:
        """Buffer ``batch`` (search keys ``key``) as a new chunk; ``in_order``: it is in
        :meth:`order` already."""
        if not len(batch):
            return
        if not in_order:
            o = self.order(batch, key)
            batch, key = batch.take(o), key[o]
        self.chunks.append(batch)
        self.keys.append(key)
        self._index.append(None)
        self.tmin.append(int(batch[TS].min()))
        self.tmax.append(int(batch[TS].max()))
        while len(self.chunks) > 1 and 2 * len(self.chunks[-1]) >= len(self.chunks[-2]):
            self._merge(len(self.chunks) - 2)
        if len(self.chunks) > _MAX_CHUNKS:
            self._merge(0)

    def purge(self, bound: int) -> None:
        """Expire tuples with ts <= bound (Algorithm 2, lines 5-6). No later probe can match them
        (a probe tuple of the other side has ts > its punctuation, so its window starts above
        ``bound``), so they leave lazily: a chunk goes once all of it is expired, and is copied
        without them once at least half of its time span is, not at every punctuation (a large
        chunk, such as a window loaded at once, would otherwise be copied whole 50 times a
        second). What the buffer gives out (:meth:`live`, :meth:`rows_in_bins`, ``len``) never
        holds them."""
        self.bound = bound if self.bound is None else max(self.bound, bound)
        bound = self.bound
        chunks, keys, index, tmin, tmax = [], [], [], [], []
        for c, k, x, t, u in zip(self.chunks, self.keys, self._index, self.tmin, self.tmax):
            if u <= bound:
                continue  # all of it expired
            if t <= bound and 2 * (bound - t + 1) >= u - t + 1:
                keep = c[TS] > bound
                c, k, x = c.compress(keep), k[keep], None
                t = int(c[TS].min())
            chunks.append(c)
            keys.append(k)
            index.append(x)
            tmin.append(t)
            tmax.append(u)
        self.chunks, self.keys, self._index, self.tmin, self.tmax = chunks, keys, index, tmin, tmax

    def live(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(rows, search keys)`` of each chunk without its expired rows (still sorted)."""
        out = []
        for c, k, t in zip(self.chunks, self.keys, self.tmin):
            if self.bound is not None and t <= self.bound:
                keep = c[TS] > self.bound
                c, k = c.compress(keep), k[keep]
            if len(c):
                out.append((c, k))
        return out

    def ranges(self, i: int, key: np.ndarray, ts: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``(lo, hi)``: the rows of chunk ``i`` with key equal to ``key`` and ``|ts' - ts| < w``,
        per probe tuple; None when the positions would not fit in int64 (the caller then
        enumerates the key's rows and tests the window)."""
        x = self._index[i]
        if x is None:
            k, t = self.keys[i], self.chunks[i][TS]
            head = np.r_[True, k[1:] != k[:-1]]
            tmin, tmax = int(t.min()), int(t.max())
            span = tmax - tmin + 1
            if int(head.sum()) * span >= 2 ** 62:
                return None
            pos = (np.cumsum(head) - 1) * span + (t - tmin)
            x = self._index[i] = (k[head], pos, tmin, tmax, span)
        ukeys, pos, tmin, tmax, span = x
        g = np.searchsorted(ukeys, key)
        found = g < len(ukeys)
        found[found] = ukeys[g[found]] == key[found]
        a = np.clip(ts - (w - 1), tmin, tmax + 1) - tmin  # the window, clipped to this chunk's times
        b = np.clip(ts + (w - 1), tmin - 1, tmax) - tmin
        base = g * span
        lo = np.searchsorted(pos, base + a, "left")
        hi = np.searchsorted(pos, base + b, "right")
        empty = ~found | (b < a)
        lo[empty] = 0
        hi[empty] = 0
        return lo, np.maximum(hi, lo)

    def rows_in_bins(self, bits: int, bins: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        """``(rows, keys)`` of the buffered tuples whose key (a 64-bit hash) lies in ``bins`` at
        ``2**bits`` bins (all when None), in chunk order: slices of each sorted chunk, found
        by binary search; None when nothing is buffered. The bins' rows are selected before the
        expired ones are dropped: a chunk that straddles the window's bound is not copied whole
        for each step of a transfer (a 200,000-row chunk: 2 ms a step, against 0.1 ms)."""
        rows, keys = [], []
        for c, k, t in zip(self.chunks, self.keys, self.tmin):
            if bins is not None:
                idx = concat_ranges(*bin_ranges(k, bits, bins))
                if not len(idx):
                    continue
                c, k = c[idx], k[idx]
            if self.bound is not None and t <= self.bound:  # (what live() drops)
                keep = c[TS] > self.bound
                c, k = c.compress(keep), k[keep]
            if not len(c):
                continue
            rows.append(c)
            keys.append(k)
        if not rows:
            return None
        if len(rows) == 1:
            return rows[0], keys[0]
        return concat_rows(rows), np.concatenate(keys)

    def drop_bins(self, bits: int, bins: np.ndarray) -> int:
        """Remove the tuples whose key (a 64-bit hash) lies in ``bins`` at ``2**bits`` bins: their
        rows in each chunk are found by binary search (a bin is one slice of a sorted chunk) and
        each chunk holding some is copied once without them (still sorted). Returns how many
        were removed (expired ones included).

        >>> b = _SideBuffer()
        >>> rows = Schema({"k": "i8"}).from_columns({"ts": [1, 2, 3], "k": [1, 2, 3]}, ids=[1, 2, 3])
        >>> b.add(rows, np.array([5, 2**63, 7], dtype=np.uint64))
        >>> b.drop_bins(1, np.array([1])), len(b)
        (1, 2)
        """
        gone = 0
        for i, (c, k) in enumerate(zip(self.chunks, self.keys)):
            idx = concat_ranges(*bin_ranges(k, bits, bins))
            if not len(idx):
                continue
            keep = np.ones(len(c), dtype=bool)
            keep[idx] = False
            gone += len(idx)
            self.chunks[i], self.keys[i], self._index[i] = c.compress(keep), k[keep], None
        if gone:  # (chunks left empty go; the others' time spans as they are now)
            live = [i for i, c in enumerate(self.chunks) if len(c)]
            self.chunks = [self.chunks[i] for i in live]
            self.keys = [self.keys[i] for i in live]
            self._index = [self._index[i] for i in live]
            self.tmin = [int(c[TS].min()) for c in self.chunks]
            self.tmax = [int(c[TS].max()) for c in self.chunks]
        return gone

    def __len__(self) -> int:
        """Tuples held and not expired (counted, not copied as :meth:`live` copies them)."""
        return sum(int(np.count_nonzero(c[TS] > self.bound)) if self.bound is not None and t <= self.bound
                   else len(c) for c, t in zip(self.chunks, self.tmin))


class JoinLogic(OperatorLogic):
    """Algorithm 2 (Hwang §IV-E): a symmetric windowed join of two inputs.

    ``window`` (> 0, timestamp units) bounds ``|t1.ts - t2.ts|``; ``left_key`` /
    ``right_key`` (field names, or tuples of names) select the fast equi-join
    path; ``predicate(left_rows, right_rows) -> bool array`` is applied to
    candidate pairs given as two aligned batches. Public, for the engines: ``window``
    (as given, an int) and ``keys``, the (left, right) key field tuples (None each
    without keys).

    >>> from replistream.schema import Punctuation
    >>> L, R = Schema({"k": "i8"}), Schema({"k": "i8", "v": "f8"})
    >>> j = JoinLogic("j", [L, R], window=10, left_key="k", right_key="k")
    >>> j.process(0, L.from_columns({"ts": [100], "k": [1]}, ids=[1]))
    []
    >>> out = j.process(1, R.from_columns({"ts": [105, 120], "k": [1, 1], "v": [0.5, 0.7]}, ids=[2, 3]))
    >>> out[0][["ts", "k_l", "v"]].tolist()
    [(105, 1, 0.5)]

    Hand-over: a Join built from the same spec and restored from a checkpoint
    holds the same buffers and emits what the original would (docs/design.md, decision 7):

    >>> j2 = JoinLogic("j", [L, R], window=10, left_key="k", right_key="k").restore(j.checkpoint())
    >>> j2.buffered
    (1, 2)
    """

    def __init__(self, name: str, in_schemas: list[Schema], window: int,
                 left_key: str | Sequence[str] | None = None, right_key: str | Sequence[str] | None = None,
                 predicate: Callable | None = None, suffixes: tuple[str, str] = ("_l", "_r"),
                 strict: bool = False):
        if len(in_schemas) != 2:
            raise ValueError(f"join {name!r} takes exactly 2 inputs, got {len(in_schemas)}")
        out_schema, self._lmap, self._rmap = join_schema(in_schemas[0], in_schemas[1], suffixes)
        super().__init__(name, in_schemas, out_schema, strict)
        if int(window) <= 0:
            raise ValueError(f"join {name!r}: window must be > 0, got {window}")
        self.window = int(window)
        lk, rk = _key_tuple(left_key), _key_tuple(right_key)
        if (lk is None) != (rk is None) or (lk and len(lk) != len(rk)):
            raise ValueError(f"join {name!r}: left_key and right_key must both be given, with equal lengths")
        for side, keys, schema in (("left", lk, in_schemas[0]), ("right", rk, in_schemas[1])):
            for k in keys or ():
                if k not in schema:
                    raise SchemaError(f"join {name!r}: {side} key {k!r} is not a field of {schema!r}")
        self.keys = (lk, rk)
        self.predicate = predicate
        self.buffers = (_SideBuffer(), _SideBuffer())
        # live bins: search by key hash when equal keys of the two inputs hash alike (an unkeyed
        # Join is all in bin 0, live as it is)
        self._hashed = lk is not None and all(_hash_alike(in_schemas[0][a], in_schemas[1][b])
                                              for a, b in zip(lk, rk))
        self.live_bins = lk is None or self._hashed

    def _search_key(self, port: int, batch: np.ndarray) -> np.ndarray:
        keys = self.keys[port]
        if keys is None:
            return batch[TS]
        if self._hashed:
            return hash_columns(batch, keys)
        if len(keys) == 1:
            col = batch[keys[0]]
            if col.dtype.kind in "iufUSb":
                return col
        return hash_columns(batch, keys)

    def _on_batch(self, port, batch):
        other = 1 - port
        key = self._search_key(port, batch)
        # The batch is put in its buffer order (by key, then ts) first, as its chunk needs it,
        # and probes in that order: each chunk's binary searches then go through sorted needles,
        # which numpy serves from where the last search ended (three times as fast for 10,000
        # probes into 20,000 rows as in arrival order). The pairs come out in that order.
        o = _SideBuffer.order(batch, key)
        batch, key = batch.take(o), key[o]
        out = self._probe(port, batch, key)
        # Keep only tuples a future tuple on the other input could still match.
        bound = self.in_punct[other] + 1 - self.window if self.in_punct[other] > np.iinfo(np.int64).min + self.window else None
        keep = batch[TS] > bound if bound is not None else None
        if keep is None or keep.all():
            self.buffers[port].add(batch, key, in_order=True)
        elif keep.any():
            self.buffers[port].add(batch.compress(keep), key[keep], in_order=True)
        return out

    def _probe(self, port, batch, key):
        buf = self.buffers[1 - port]
        w = self.window
        ts = batch[TS]
        found_pairs = []  # (chunk, probe rows, chunk rows) of each chunk with matches
        for i, (chunk, ckey) in enumerate(zip(buf.chunks, buf.keys)):
            found = None if self.keys[0] is None else buf.ranges(i, key, ts, w)
            if self.keys[0] is None:
                lo = np.searchsorted(ckey, ts - (w - 1), "left")
                hi = np.searchsorted(ckey, ts + (w - 1), "right")
            elif found is not None:
                lo, hi = found
            else:
                lo = np.searchsorted(ckey, key, "left")
                hi = np.searchsorted(ckey, key, "right")
            cnt = hi - lo
            total = int(cnt.sum())
            if not total:
                continue
            pi = np.repeat(np.arange(len(batch)), cnt)
            starts = np.repeat(lo - np.cumsum(cnt) + cnt, cnt)
            oi = starts + np.arange(total)
            # test the window (and exact key equality, guarding hash collisions and NaN)
            # on index arrays first; copy columns only for pairs that match
            ok = np.abs(ts[pi] - chunk[TS][oi]) < w
            if self.keys[0] is not None:
                for a, b in zip(self.keys[port], self.keys[1 - port]):
                    ok &= batch[a][pi] == chunk[b][oi]
            if not ok.any():
                continue
            found_pairs.append((chunk, pi[ok], oi[ok]))
        if self.predicate is not None:
            outs = []
            for chunk, pi, oi in found_pairs:
                (left, li), (right, ri) = ((batch, pi), (chunk, oi)) if port == 0 else ((chunk, oi), (batch, pi))
                outs.extend(self._predicate_pairs(left.take(li), right.take(ri)))
            return outs
        if not found_pairs:
            return []
        # one output batch per probe, whatever the number of chunks: every item costs its own
        # downstream duplicate filter pass and channel overhead (a probe met 2.2 chunks on
        # average in bench/band_join.py's workload)
        out = np.empty(sum(len(pi) for _, pi, _ in found_pairs), dtype=self.out_schema.dtype)
        at = 0
        for chunk, pi, oi in found_pairs:
            (left, li), (right, ri) = ((batch, pi), (chunk, oi)) if port == 0 else ((chunk, oi), (batch, pi))
            self._emit_pairs(left, li, right, ri, out[at:at + len(pi)])
            at += len(pi)
        return [out]

    def _emit_pairs(self, left: np.ndarray, li: np.ndarray, right: np.ndarray, ri: np.ndarray,
                    out: np.ndarray | None = None) -> np.ndarray:
        """The joined tuples of pairs ``(left[li], right[ri])``, as :meth:`_emit` makes them, built
        column by column (into ``out`` when given, a slice of a larger batch): gathering whole
        structured rows first, then copying their fields, cost 7x as much (28 against 3.9 ms per
        100,000 pairs of four-field tuples, issue #42). A column is gathered by indexing
        (``left[n][li]``), never ``left[n].take(li)``: a field of a structured array is not
        contiguous, and ``take`` first copies the whole column, so one pair from a 200,000-row
        chunk of 88-byte tags cost 1-3 ms (a probe of 500 tuples a second kept a third of a core
        busy)."""
        if out is None:
            out = np.empty(len(li), dtype=self.out_schema.dtype)
        lts, rts = left[TS][li], right[TS][ri]
        out[TS] = np.maximum(lts, rts)
        out[ID] = mix(left[ID][li], right[ID][ri])
        for n, o in self._lmap:
            out[o] = left[n][li]
        for n, o in self._rmap:
            out[o] = right[n][ri]
        return out

    def _predicate_pairs(self, left: np.ndarray, right: np.ndarray) -> list[np.ndarray]:
        """The joined tuples of the candidate pairs the predicate accepts; pairs on which it raises
        are dead-lettered as the joined tuple they would have made (``on_error``)."""
        def check(result, lo, hi):
            m = np.asarray(result)
            if m.shape != (hi - lo,) or m.dtype != np.bool_:
                raise UserFunctionError(self.name, f"join predicate must return a boolean array of length "
                                                   f"{hi - lo}, got dtype {m.dtype} shape {m.shape}")
            return self._emit(left[lo:hi][m], right[lo:hi][m])

        pairs = np.arange(len(left))
        return self.apply_user(lambda idx: self.predicate(left[idx], right[idx]), pairs, check, "predicate",
                               emit=lambda idx: self._emit(left[idx], right[idx]))

    def _emit(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        out = np.empty(len(left), dtype=self.out_schema.dtype)
        out[TS] = np.maximum(left[TS], right[TS])
        out[ID] = mix(left[ID], right[ID])
        for n, o in self._lmap:
            out[o] = left[n]
        for n, o in self._rmap:
            out[o] = right[n]
        return out

    def _on_port_punctuation(self, port, p):
        # Algorithm 2, lines 5-6: punctuation on this input purges the other buffer.
        self.buffers[1 - port].purge(p + 1 - self.window)
        return []

    @property
    def buffered(self) -> tuple[int, int]:
        return len(self.buffers[0]), len(self.buffers[1])

    # -- hand-over (docs/design.md, decision 7) ------------------------------------
    # The state is the two buffers, as plain rows; bins by the hash of the join
    # key (the same hash on both sides, so a key's tuples of both inputs share a
    # bin, as Megaphone needs). An unkeyed join's tuples can match any other
    # tuple, so its state does not partition: it all lies in bin 0.
    def _state_params(self):
        return {"window": self.window, "keys": self.keys}

    def bin_keys(self, port, batch):
        """Join-key hash (both sides hash alike, so matching tuples share a bin); an unkeyed
        join's state is all in bin 0 (hash 0)."""
        if self.keys[port] is None:
            return np.zeros(len(batch), dtype=np.uint64)
        return hash_columns(batch, self.keys[port])

    def _state_tables(self, keyed):
        tables = {}
        for port, side in enumerate(("left", "right")):
            chunks = [c for c, _ in self.buffers[port].live()]
            rows = chunks[0] if len(chunks) == 1 else (
                concat_rows(chunks) if chunks else self.in_schemas[port].empty())
            key = hash_columns(rows, self.keys[port]) if keyed and self.keys[port] is not None else None
            tables[side] = ({"rows": rows}, key)
        return tables

    def _live_tables(self, bits, bins):
        """Each side's rows of ``bins``: slices of its hash-sorted chunks (an unkeyed Join's
        whole window is bin 0)."""
        tables = {}
        for port, side in enumerate(("left", "right")):
            buf = self.buffers[port]
            if self.keys[port] is None:
                got = buf.rows_in_bins(0, None) if bins is None or 0 in bins else None
                key = None
            else:
                got = buf.rows_in_bins(bits, bins)
                key = np.zeros(0, np.uint64) if got is None else got[1]
            rows = self.in_schemas[port].empty() if got is None else got[0]
            tables[side] = ({"rows": rows}, key)
        return tables

    def _install_tables(self, tables):
        """A step's rows become one more chunk of each side (merged as the chunks always are)."""
        self._restore_tables(tables)

    def drop_bins(self, bits: int, bins) -> int:
        """Forget both sides' tuples of ``bins`` (at ``2**bits`` bins): a rescale's step gave them
        to another partition (replistream/replica/rescale.py). Costs one copy of the buffered
        chunks that hold some, with no checkpoint of the rest and no logic built anew. An unkeyed
        Join's whole window is bin 0. Returns how many tuples were dropped.

        >>> L = Schema({"k": "i8"})
        >>> j = JoinLogic("j", [L, L], window=10, left_key="k", right_key="k")
        >>> _ = j.process(0, L.from_columns({"ts": [1, 2], "k": [1, 2]}, ids=[1, 2]))
        >>> gone = j.checkpoint(1).nonempty_bins()[:1]
        >>> j.drop_bins(1, gone), j.buffered, j.checkpoint(1).select(gone).rows()
        (1, (1, 0), 0)
        """
        if not self.live_bins:
            raise CheckpointError(f"join {self.name!r}: its keys do not hash alike on both inputs, so its "
                                  f"buffers are not in bins; merge checkpoints")
        chosen = bin_list(bins)
        gone = 0
        for port in (0, 1):
            buf = self.buffers[port]
            if self.keys[port] is None:  # (unkeyed: everything is bin 0)
                if 0 in chosen:
                    gone += len(buf)
                    self.buffers = tuple(_SideBuffer() if i == port else b for i, b in enumerate(self.buffers))
                    self.buffers[port].bound = buf.bound
            else:
                gone += buf.drop_bins(int(bits), chosen)
        return gone

    def gives_ahead(self, at: int) -> int:
        """A Join buffers each tuple as it arrives and its punctuations only purge rows no later
        tuple can match: a rescale's old owner may give the bins of later steps at watermark
        ``at`` once every tuple up to their times has come (their rows up to then are all here;
        an older row the taker gets besides matches nothing there and is purged there).

        >>> JoinLogic("j", [Schema({"k": "i8"})] * 2, window=10, left_key="k", right_key="k").gives_ahead(5) > 10 ** 15
        True
        """
        return END - 1

    def _restore_tables(self, tables):
        for port, side in enumerate(("left", "right")):
            rows = self.in_schemas[port].check(tables[side]["rows"], f"{self.name} checkpoint ({side})")
            if len(rows):
                self.buffers[port].add(rows, self._search_key(port, rows))


def concat_rows(parts: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)`` for structured batches of one dtype, copied as raw rows.

    numpy copies a structured array field by field through its generic dtype transfer, which
    costs 10 to 25 times a copy of the same bytes (numpy 2.4: 790 against 33 µs for two batches
    of 5,000 four-field rows); so do fancy indexing and boolean masks, which is why this module
    gathers rows with ``take`` and ``compress``. Rows are viewed as opaque bytes of the dtype's
    size when the dtype holds no Python objects and every part has it; otherwise numpy's own.

    >>> a = np.array([(1, 2.5)], dtype=[("ts", "i8"), ("v", "f8")])
    >>> concat_rows([a, a[:0], a]).tolist()
    [(1, 2.5), (1, 2.5)]
    """
    dt = parts[0].dtype
    if dt.names is None or dt.hasobject or any(p.dtype != dt for p in parts):
        return np.concatenate(parts)
    raw = np.dtype((np.void, dt.itemsize))
    return np.concatenate([p.view(raw) for p in parts]).view(dt)


def _merge_order(key: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The order of rows by ``(key, ts)``, as ``np.lexsort((ts, key))`` gives it, for rows that are
    a concatenation of runs each sorted so (the chunks :meth:`_SideBuffer._merge` joins).

    A stable sort by key alone merges the runs in about one pass (numpy's stable sort of 64-bit
    values is a timsort), where lexsort first sorts every row by time (the runs' times are not in
    order), then by key; within a key the rows then come run by run, which is time order whenever
    a later run's rows of that key are no earlier than an earlier run's (a side's batches come
    in time order). That is checked, and lexsort's order taken when it does not hold.

    >>> key = np.array([1, 2, 1, 2], dtype=np.uint64)
    >>> _merge_order(key, np.array([5, 6, 7, 8])).tolist(), _merge_order(key, np.array([5, 9, 4, 8])).tolist()
    ([0, 2, 1, 3], [2, 0, 3, 1])
    """
    if key.dtype.kind not in "iu":
        return np.lexsort((ts, key))
    order = np.argsort(key, kind="stable")
    k, t = key[order], ts[order]
    if ((k[1:] == k[:-1]) & (t[1:] < t[:-1])).any():
        return np.lexsort((ts, key))
    return order


def _hash_alike(a: np.dtype, b: np.dtype) -> bool:
    """Whether equal values of dtypes ``a`` and ``b`` get equal :func:`~replistream.ids.hash_columns`
    (integers and booleans alike, floats alike, strings or bytes alike).

    >>> _hash_alike(np.dtype("i4"), np.dtype("i8")), _hash_alike(np.dtype("i8"), np.dtype("f8"))
    (True, False)
    """
    group = {"i": "i", "u": "i", "b": "i", "f": "f", "U": "U", "S": "S", "M": "M", "m": "m"}
    ka, kb = group.get(np.dtype(a).kind), group.get(np.dtype(b).kind)
    return ka is not None and ka == kb and (ka not in "Mm" or np.dtype(a) == np.dtype(b))


def _key_tuple(key):
    if key is None:
        return None
    if isinstance(key, str):
        return (key,)
    return tuple(key)
