"""Duplicate filter: merge k stream replicas into one stream (Algorithm 1, Hwang §IV-B).

Algorithm 1 passes a tuple the first time it is seen with
``ts > max punctuation``, drops later copies, and forgets per-tuple counts once
a punctuation passes them; it never blocks. Its multiset bookkeeping
(``count[t][i]``) exists to tell "a second copy" from "a second tuple with the
same values". Here every logical tuple carries a unique deterministic id
(docs/design.md, decision 1), so each id has multiplicity one in the ideal stream and
Algorithm 1 reduces to "pass the first copy of each id". That also makes a
copy repeated on the *same* stream replica (a retransmission after a
reconnection or a hand-over replay) harmless, where Algorithm 1 would pass it
again. Theorem 1's argument carries over unchanged.

Bookkeeping per filter: ``seen`` (:class:`IdCounts`) holds, for each id with
``ts > max punctuation``, the copies received so far and the tuple's ``ts``, in
sorted uint64 arrays, so a batch is looked up and counted with a few numpy calls
(no Python per tuple) and a punctuation forgets every id at or below it in bulk.

Contribution weights (§V-B): the j-th copy of a tuple adds ``1/j`` to the
weight of the stream replica that delivered it; :attr:`weights` accumulates
them for replica utility and garbage collection.

A tuple with ``ts <= p`` after punctuation ``p`` *on its own stream replica*
breaks that replica's punctuation contract: it is dead-lettered (or raises in
strict mode). A tuple with ``ts <= max punctuation`` from another, slower
replica is an ordinary late duplicate and is dropped.

Hand-over (docs/design.md, decision 7): a filter's state is exactly what a new
replica must know to apply "only tuples with ts > p that the checkpoint did not
contain": the maximum punctuation ``p`` and the (ts, id) of the tuples with
``ts > p`` it has already passed (:class:`FilterState`). A filter restored from
it drops every later copy of those tuples and everything at or below ``p``.

Audit (``REPLISTREAM_AUDIT=1`` in the environment, read when a filter is built; off by default):
the filter also keeps every id it passed, and counts the tuples it drops as copies by line 2
(``ts <= max punctuation``) although it never passed them (:attr:`DuplicateFilter.unseen_drops`,
with a few of them in ``unseen_sample``). Such a drop is a loss, not a copy: the channel whose
punctuation raised ``max punctuation`` had not carried them (a stream replica that broke its
contract), and no other copy will pass. A restored filter counts only tuples above the
punctuation it was restored at (below it, the checkpoint's replica passed them). For chaos
campaigns and tests: it costs a set of every id passed.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import DeadLetter, PunctuationViolation
from ..ids import argsort_u64
from ..schema import END, ID, TS, Punctuation, Schema
from .base import NO_PUNCTUATION, STATE_VERSION, CheckpointError


class IdCounts:
    """Copies received per tuple id, for the ids a duplicate filter still tracks (those with
    ``ts`` above its punctuation), vectorised: sorted runs of ids (uint64) with their counts and
    timestamps, each run at least twice as long as the next (a log-structured merge), so a
    batch of ``n`` ids costs ``O(n log S)`` for ``S`` tracked ids and a punctuation drops every
    id at or below it with one mask per run.

    >>> c = IdCounts()
    >>> c.insert(np.array([3, 9], dtype=np.uint64), 1, np.array([30, 90]))
    >>> prev, where = c.lookup(np.array([1, 3, 9], dtype=np.uint64)); prev.tolist()
    [0, 1, 1]
    >>> c.bump(where, 1); c.lookup(np.array([9], dtype=np.uint64))[0].tolist(), len(c)
    ([2], 2)
    >>> c.expire(50); c.as_dict()
    {9: 2}
    """

    def __init__(self):
        self._ids: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []
        self._ts: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self._ids)

    def __bool__(self) -> bool:
        return any(len(r) for r in self._ids)

    def __eq__(self, other) -> bool:
        return isinstance(other, IdCounts) and self.as_dict() == other.as_dict()

    def as_dict(self) -> dict[int, int]:
        """``{id: copies}`` (for tests and inspection)."""
        return {i: c for r, n in zip(self._ids, self._counts) for i, c in zip(r.tolist(), n.tolist())}

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, list]:
        """Copies so far of each of ``ids`` (distinct; sorted is fastest), and where the known ones
        are, for :meth:`bump`."""
        prev = np.zeros(len(ids), dtype=np.int64)
        where: list = []
        for r, c in zip(self._ids, self._counts):
            pos = np.searchsorted(r, ids)
            np.minimum(pos, len(r) - 1, out=pos)
            hit = np.flatnonzero(r[pos] == ids)
            if len(hit):
                pos = pos[hit]
                prev[hit] = c[pos]
                where.append((hit, pos))
            else:
                where.append(None)
        return prev, where

    def bump(self, where: list, add) -> None:
        """Add ``add`` (one number, or one per id given to :meth:`lookup`) to the counts of the known ids."""
        for at, c in zip(where, self._counts):
            if at is not None:
                hit, pos = at
                c[pos] += add if np.ndim(add) == 0 else add[hit]

    def insert(self, ids: np.ndarray, counts, ts: np.ndarray) -> None:
        """Track new ``ids`` (sorted, distinct, none tracked yet) with their counts and timestamps."""
        if not len(ids):
            return
        self._ids.append(np.asarray(ids, dtype=np.uint64))
        self._counts.append(np.broadcast_to(np.asarray(counts, dtype=np.int64), len(ids)).copy())
        self._ts.append(np.asarray(ts, dtype=np.int64))
        self._compact()

    def expire(self, p: int) -> None:
        """Forget every id whose tuple has ``ts <= p``."""
        for i, t in enumerate(self._ts):
            keep = t > p
            if not keep.all():
                self._ids[i], self._counts[i], self._ts[i] = self._ids[i][keep], self._counts[i][keep], t[keep]
        live = [i for i, r in enumerate(self._ids) if len(r)]
        if len(live) != len(self._ids):
            self._ids, self._counts, self._ts = ([x[i] for i in live] for x in (self._ids, self._counts, self._ts))
        self._compact()

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ts, ids)`` of every tracked id."""
        if not self._ids:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64)
        return np.concatenate(self._ts), np.concatenate(self._ids)

    def _compact(self) -> None:
        i = len(self._ids) - 1
        while i >= 1:
            if len(self._ids[i - 1]) <= 2 * len(self._ids[i]):
                # merge run i into run i - 1: where each of its ids goes, found once for the three
                # arrays (np.insert would sort the positions and build a mask three times)
                a, b = self._ids[i - 1], self._ids[i]
                dest = np.searchsorted(a, b) + np.arange(len(b))
                old = np.ones(len(a) + len(b), dtype=bool)
                old[dest] = False
                for runs in (self._ids, self._counts, self._ts):
                    merged = np.empty(len(old), dtype=runs[i].dtype)
                    merged[dest] = runs[i]
                    merged[old] = runs[i - 1]
                    runs[i - 1] = merged
                del self._ids[i], self._counts[i], self._ts[i]
                i = min(i, len(self._ids) - 1)
            else:
                i -= 1


@dataclass
class FilterState:
    """What a duplicate filter ships at hand-over (docs/design.md, decision 7).

    ``max_punct`` is the filter's maximum punctuation ``p``; ``applied_ts`` and
    ``applied_ids`` the timestamps and ids of the tuples with ``ts > p`` it has
    already passed downstream (16 bytes each). Per-channel bookkeeping
    (weights, channel punctuations) belongs to the old replica's own stream
    replicas and is not shipped.

    >>> s = Schema({"x": "i8"})
    >>> f = DuplicateFilter(1, s)
    >>> _ = f.on_punctuation(0, 1); _ = f.on_batch(0, s.from_columns({"ts": [2, 3], "x": [0, 0]}, ids=[7, 8]))
    >>> st = f.checkpoint(); st.max_punct, st.applied_ids.tolist()
    (1, [7, 8])
    """

    max_punct: int
    applied_ts: np.ndarray
    applied_ids: np.ndarray
    version: int = STATE_VERSION

    @property
    def applied(self) -> int:
        return len(self.applied_ids)

    def nbytes(self) -> int:
        return self.applied_ts.nbytes + self.applied_ids.nbytes


#: the group of a channel of a partition that ended and was started again (:meth:`DuplicateFilter.add_channel`)
RETIRED = -1

#: packets whose id order a duplicate filter keeps for their copies (:meth:`DuplicateFilter._sorted`)
ORDER_CACHE = 32


def _groups(sorted_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For sorted ids: where each run of equal ids starts, each id's run, and its rank in its run."""
    m = len(sorted_ids)
    head = np.empty(m, dtype=bool)
    head[0] = True
    np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=head[1:])
    starts = np.flatnonzero(head)
    group = np.cumsum(head) - 1
    return starts, group, np.arange(m) - starts[group]


class DuplicateFilter:
    """Algorithm 1 (Hwang §IV-B) over ``n_channels`` stream replicas of one stream.

    ``on_batch(channel, batch)`` returns the tuples seen for the first time;
    ``on_punctuation(channel, p)`` returns ``[Punctuation(p)]`` when ``p`` is
    a new maximum, else ``[]``. :meth:`on_rows` takes the copies of many
    packets at once (the batched simulator's path). Channels can be added while
    running (:meth:`add_channel`), for revived or new upstream replicas.

    Public bookkeeping, read by the engines: ``max_punct`` (the maximum
    punctuation ``p``, :data:`~replistream.operators.base.NO_PUNCTUATION` before
    the first), ``chan_punct`` (per channel, its highest punctuation),
    ``weights`` (per channel, the contribution weights of §V-B), ``copies``
    (per channel, tuple copies received), ``passed``, ``duplicates`` and
    ``late_count`` (tuples passed, dropped as copies, dead-lettered as late).

    >>> s = Schema({"x": "i8"})
    >>> b = s.from_columns({"ts": [1, 2], "x": [7, 8]}, ids=[10, 11])
    >>> f = DuplicateFilter(2, s)
    >>> len(f.on_batch(0, b)[0]), f.on_batch(1, b)
    (2, [])
    >>> f.on_punctuation(1, 2), f.on_punctuation(0, 2)
    ([Punctuation(2)], [])
    >>> f.weights.tolist()
    [2.0, 1.0]
    """

    def __init__(self, n_channels: int, schema: Schema | None = None, name: str = "filter", strict: bool = False,
                 groups: Sequence[int] | None = None):
        if n_channels < 1:
            raise ValueError(f"duplicate filter {name!r} needs at least one input stream replica, got {n_channels}")
        if groups is not None and len(groups) != n_channels:
            raise ValueError(f"duplicate filter {name!r}: {len(groups)} groups given for {n_channels} channels")
        #: per channel, the partition of the upstream operator it comes from (None: one unpartitioned
        #: upstream); see :meth:`on_punctuation`
        self.groups: list[int] | None = None if groups is None else [int(g) for g in groups]
        self.name = name
        self.schema = schema
        self.strict = strict
        self.max_punct = NO_PUNCTUATION
        self.chan_punct = [NO_PUNCTUATION] * n_channels
        self.weights = np.zeros(n_channels, dtype=np.float64)
        self.copies = np.zeros(n_channels, dtype=np.int64)  # tuples received per channel
        self.seen = IdCounts()
        self._orders: OrderedDict = OrderedDict()  # the sort of recent packets' ids, for their copies
        self.passed = 0
        self.duplicates = 0
        self.late_count = 0
        self.dead_letters: list[DeadLetter] = []
        # the audit (module doc): ids passed, drops of ids never passed above audit_floor
        self.audit: set | None = set() if os.environ.get("REPLISTREAM_AUDIT") == "1" else None
        self.audit_floor = NO_PUNCTUATION
        self.unseen_drops = 0
        self.unseen_sample: list[tuple[int, int, int]] = []  # (channel, ts, id)

    @property
    def n_channels(self) -> int:
        return len(self.chan_punct)

    def add_channel(self, group: int | None = None) -> int:
        """Add a stream replica (e.g. from a revived upstream replica); returns its index. A filter
        fed by a partitioned upstream needs the new channel's upstream partition (``group``)."""
        if (group is None) != (self.groups is None):
            raise ValueError(f"duplicate filter {self.name!r}: a new channel needs an upstream partition exactly "
                             f"when the filter's upstream is partitioned (groups {self.groups}, got {group!r})")
        if self.groups is not None:
            g = int(group)
            mine = [c for c, x in enumerate(self.groups) if x == g]
            if any(self.chan_punct[c] == END for c in mine) and self.max_punct != END:
                # the partition ended (a rescale to fewer partitions closed it with END) and is
                # started again: its old channels no longer count, or their END would let the
                # filter's punctuation pass the new partition's tuples
                for c in mine:
                    self.groups[c] = RETIRED
            self.groups.append(g)
        self.chan_punct.append(NO_PUNCTUATION)
        self.weights = np.append(self.weights, 0.0)
        self.copies = np.append(self.copies, 0)
        return len(self.chan_punct) - 1

    def checkpoint(self) -> FilterState:
        """Maximum punctuation and the tuples with ts above it already passed (see :class:`FilterState`)."""
        ts, ids = self.seen.entries()
        return FilterState(int(self.max_punct), ts.copy(), ids.copy())

    def restore(self, state: FilterState) -> "DuplicateFilter":
        """Install ``state`` into this fresh filter (its own channels keep their fresh bookkeeping).

        >>> s = Schema({"x": "i8"})
        >>> g = DuplicateFilter(2, s).restore(FilterState(1, np.array([2]), np.array([7], dtype=np.uint64)))
        >>> b = s.from_columns({"ts": [1, 2, 3], "x": [0, 0, 0]}, ids=[6, 7, 8])
        >>> g.on_batch(1, b)[0]["id"].tolist()  # ts 1 <= p and id 7 already applied: dropped
        [8]
        """
        if not isinstance(state, FilterState) or state.version != STATE_VERSION:
            raise CheckpointError(f"{self.name!r}: expected a FilterState of version {STATE_VERSION}, "
                                  f"got {state!r}")
        if self.seen or self.max_punct != NO_PUNCTUATION or self.passed:
            raise CheckpointError(f"{self.name!r}: restore needs a fresh duplicate filter")
        if len(state.applied_ts) != len(state.applied_ids):
            raise CheckpointError(f"{self.name!r}: applied_ts and applied_ids differ in length")
        self.max_punct = int(state.max_punct)
        ids = np.asarray(state.applied_ids, dtype=np.uint64)
        ts = np.asarray(state.applied_ts, dtype=np.int64)
        o = np.argsort(ids, kind="stable")
        if len(ids) > 1 and (ids[o][1:] == ids[o][:-1]).any():
            raise CheckpointError(f"{self.name!r}: an id appears twice among the applied tuples")
        self.seen = IdCounts()
        self.seen.insert(ids[o], 1, ts[o])
        if self.audit is not None:  # (below the checkpoint's punctuation its replica passed them)
            self.audit_floor = self.max_punct
            self.audit.update(ids.tolist())
        return self

    def process(self, channel: int, item) -> list:
        if isinstance(item, Punctuation):
            return self.on_punctuation(channel, item.p)
        return self.on_batch(channel, item)

    def on_batch(self, channel: int, batch: np.ndarray) -> list[np.ndarray]:
        if self.schema is not None:
            batch = self.schema.check(batch, f"{self.name} channel {channel}")
        n = len(batch)
        if not n:
            return []
        self.copies[channel] += n
        ts = batch[TS]
        cp = self.chan_punct[channel]
        if cp != NO_PUNCTUATION:
            late = ts <= cp
            if late.any():
                where = f"{self.name} channel {channel}"
                if self.strict:
                    raise PunctuationViolation(
                        f"{where}: tuple with ts={int(ts[late][0])} arrived after punctuation {cp}")
                self.late_count += int(late.sum())
                self.dead_letters.append(DeadLetter(where, f"late: ts <= punctuation {cp}", batch.compress(late)))
                keep = ~late
                batch, ts = batch.compress(keep), ts[keep]
        if self.max_punct != NO_PUNCTUATION:
            fresh = ts > self.max_punct  # Algorithm 1, line 2
            if not fresh.all():
                if self.audit is not None:
                    self._audit_drops(channel, batch, ts, ~fresh)
                self.duplicates += int(len(fresh) - fresh.sum())
                batch, ts = batch.compress(fresh), ts[fresh]
        if not len(batch):
            return []
        ids = batch[ID]
        m = len(ids)
        o, sid, dup = self._sorted(ids)
        sts = ts[o]
        if dup:
            # The same id twice within one batch (a retransmission): copies counted in arrival order.
            starts, group, rank = _groups(sid)
            seen0, where = self.seen.lookup(sid[starts])
            self.seen.bump(where, np.diff(np.r_[starts, m]))
            miss = seen0 == 0
            self.seen.insert(sid[starts][miss], np.diff(np.r_[starts, m])[miss], sts[starts][miss])
            prev_sorted = seen0[group] + rank
        else:
            prev_sorted, where = self.seen.lookup(sid)
            self.seen.bump(where, 1)
            miss = prev_sorted == 0
            self.seen.insert(sid[miss], 1, sts[miss])
        prev = np.empty(m, dtype=np.int64)
        prev[o] = prev_sorted
        new = prev == 0
        self.weights[channel] += float(np.sum(1.0 / (prev + 1)))
        n_new = int(new.sum())
        self.duplicates += m - n_new
        if not n_new:
            return []
        # compress, not batch[new]: numpy masks a structured array field by field, about 20
        # times slower than copying its rows' bytes (replistream.operators.join.concat_rows)
        out = batch if n_new == len(batch) else batch.compress(new)
        self.passed += n_new
        if self.audit is not None:
            self.audit.update(out[ID].tolist())
        return [out]

    def _audit_drops(self, channel: int, batch: np.ndarray, ts: np.ndarray, dropped: np.ndarray) -> None:
        """The audit (module doc): count the tuples line 2 drops that this filter never passed."""
        cand = dropped & (ts > self.audit_floor)
        if not cand.any():
            return
        ids = batch[ID][cand].tolist()
        unseen = [(int(t), i) for t, i in zip(ts[cand].tolist(), ids) if i not in self.audit]
        self.unseen_drops += len(unseen)
        room = max(0, 10 - len(self.unseen_sample))
        self.unseen_sample.extend((int(channel), t, i) for t, i in unseen[:room])

    def _sorted(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(order, ids[order], whether an id repeats)`` with ``order`` a stable argsort of ``ids``.

        The k copies of a packet usually arrive with the same ids in the same order (peer
        replicas cut their output alike, entry points always), so the sort of the last
        :data:`ORDER_CACHE` packets is kept under a digest of their ids (count, xor, sum)
        and reused for a copy after checking that it gives the copy's ids in sorted order:
        the sort, the largest cost of a copy, is paid once per packet, not once per copy.
        """
        m = len(ids)
        key = (m, int(np.bitwise_xor.reduce(ids)), int(ids.sum(dtype=np.uint64))) if m else None
        hit = self._orders.get(key)
        if hit is not None and np.array_equal(ids[hit[0]], hit[1]):
            self._orders.move_to_end(key)
            return hit
        o = argsort_u64(ids)  # hashed ids: a radix pass first (replistream.ids.argsort_u64)
        sid = ids[o]
        out = (o, sid, bool(m > 1 and (sid[1:] == sid[:-1]).any()))
        self._orders[key] = out
        if len(self._orders) > ORDER_CACHE:
            self._orders.popitem(last=False)
        return out

    def on_rows(self, rows: np.ndarray, channels, before=None, order=None) -> np.ndarray:
        """Algorithm 1 over the tuple copies of many packets at once; returns which copies passed.

        The copies are ``rows[order]`` (``order`` None: ``rows`` as given) in arrival
        order: copy ``i`` came from stream replica ``channels[i]`` while punctuation
        ``before[i]`` was in force (the maximum of :attr:`max_punct` and the punctuations
        of the packets that arrived before its own; None: :attr:`max_punct` for all).
        The result, one bool per copy in arrival order, and every counter and weight are
        those of :meth:`on_batch` called packet by packet with the punctuations applied
        in between:

        * a copy at or below its own stream replica's punctuation (as this filter knows
          it now) breaks that replica's contract: dead-lettered, or raised in strict mode;
        * a copy at or below ``before`` is a late duplicate, dropped (Algorithm 1, line 2);
        * of the others, the first copy of each id passes unless an earlier call saw the
          id; the ``j``-th copy adds ``1/j`` to its channel's weight (§V-B). The weights
          are summed as :meth:`on_batch` would add them were round ``j`` (the ``j``-th
          copy of every id) fed one channel at a time, rounds in order, so they are
          bit-identical to that.

        Punctuations are not applied here: call :meth:`on_punctuation` afterwards.
        Vectorised: one sort of the ids, then one dictionary lookup and one update per
        distinct id (no Python per copy).

        >>> s = Schema({"x": "i8"})
        >>> f = DuplicateFilter(2, s)
        >>> rows = s.from_columns({"ts": [5, 5, 6, 4, 6], "x": [0] * 5}, ids=[1, 1, 2, 3, 2])
        >>> f.on_rows(rows, [0, 1, 1, 0, 0], before=[-1, -1, -1, 4, 4]).tolist()
        [True, False, True, False, False]
        >>> f.weights.tolist(), f.passed, f.duplicates
        ([1.5, 1.5], 2, 3)
        """
        if self.schema is not None:
            rows = self.schema.check(rows, f"{self.name} (copies of many packets)")
        pick = None if order is None else np.asarray(order, dtype=np.int64)
        ts = rows[TS] if pick is None else rows[TS][pick]
        n = len(ts)
        channels = np.asarray(channels, dtype=np.int64)
        if len(channels) != n or (before is not None and np.ndim(before) and len(before) != n):
            raise ValueError(f"{self.name!r}: on_rows needs one channel (and one punctuation) per copy; "
                             f"got {len(channels)} channels for {n} copies")
        passed = np.zeros(n, dtype=bool)
        if not n:
            return passed
        if int(channels.min()) < 0 or int(channels.max()) >= self.n_channels:
            raise ValueError(f"{self.name!r} has {self.n_channels} stream replica(s); got channels "
                             f"{int(channels.min())}..{int(channels.max())}")
        self.copies += np.bincount(channels, minlength=self.n_channels)
        drop = np.zeros(n, dtype=bool)
        cp = np.asarray(self.chan_punct, dtype=np.int64)[channels]
        broken = (ts <= cp) & (cp != NO_PUNCTUATION)
        if broken.any():  # as on_batch: the channel broke its punctuation contract
            for c in np.unique(channels[broken]).tolist():
                sel = np.flatnonzero(broken & (channels == c))
                where, p = f"{self.name} channel {c}", self.chan_punct[c]
                if self.strict:
                    raise PunctuationViolation(f"{where}: tuple with ts={int(ts[sel[0]])} arrived after "
                                               f"punctuation {p}")
                self.late_count += len(sel)
                self.dead_letters.append(DeadLetter(where, f"late: ts <= punctuation {p}",
                                                    rows[sel if pick is None else pick[sel]]))
            drop |= broken
        limit = self.max_punct if before is None else np.maximum(np.asarray(before, dtype=np.int64), self.max_punct)
        late = (ts <= limit) & ~drop
        self.duplicates += int(late.sum())
        drop |= late
        keep = np.flatnonzero(~drop) if drop.any() else None
        ids = rows[ID] if pick is None else rows[ID][pick]
        if keep is not None:
            ids, ch = ids[keep], channels[keep]
        else:
            ch = channels
        m = len(ids)
        if not m:
            return passed
        # the rank of each copy among the copies of its id here (0: the first), and its id's group
        o = np.argsort(ids, kind="stable")
        s = ids[o]
        head = np.empty(m, dtype=bool)
        head[0] = True
        np.not_equal(s[1:], s[:-1], out=head[1:])
        starts = np.flatnonzero(head)
        group = np.cumsum(head) - 1
        rank = np.empty(m, dtype=np.int64)
        rank[o] = np.arange(m) - starts[group]
        inv = np.empty(m, dtype=np.int64)
        inv[o] = group
        uniq = s[starts]
        count = np.diff(np.r_[starts, m])
        seen0, where = self.seen.lookup(uniq)
        prev = seen0[inv] + rank
        self.seen.bump(where, count)
        miss = seen0 == 0
        kept_ts = ts if keep is None else ts[keep]
        self.seen.insert(uniq[miss], count[miss], kept_ts[o][starts][miss])
        # weights: per round of copies, then per channel, each a sum in arrival order (as on_batch adds them)
        g = np.lexsort((ch, rank))
        w = 1.0 / (prev[g] + 1)
        key = rank[g] * self.n_channels + ch[g]
        bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]).tolist()
        for b, e, c in zip(bounds, bounds[1:] + [m], ch[g][bounds].tolist()):
            self.weights[c] += float(np.sum(w[b:e]))
        new = prev == 0
        n_new = int(new.sum())
        self.duplicates += m - n_new
        if n_new:
            at = np.flatnonzero(new) if keep is None else keep[new]
            passed[at] = True
            self.passed += n_new
        return passed

    def on_punctuation(self, channel: int, p: int) -> list[Punctuation]:
        """A punctuation ``p`` on ``channel``: returns ``[Punctuation(q)]`` when the filter's
        punctuation rises to ``q``. Without :attr:`groups`, ``q = p`` when ``p`` is a new maximum
        (Algorithm 1): every stream replica carries the whole stream. With :attr:`groups` (the
        upstream is partitioned, issue #41) a channel carries one partition's share, and its
        punctuation covers that share only: ``q`` is the minimum over partitions of the maximum
        over each partition's channels. A partition that a rescale to fewer partitions retires
        closes its channels with ``END`` (it holds nothing back any more); if it is started again
        later (more partitions), a new channel of it retires those old ones (:meth:`add_channel`).

        >>> f = DuplicateFilter(4, groups=[0, 0, 1, 1])
        >>> f.on_punctuation(0, 5), f.on_punctuation(2, 3), f.on_punctuation(3, 7), f.on_punctuation(1, 9)
        ([], [Punctuation(3)], [Punctuation(5)], [Punctuation(7)])
        >>> f.on_punctuation(3, END), f.on_punctuation(0, 12)   # partition 1 retired (closed with END)
        ([Punctuation(9)], [Punctuation(12)])
        >>> c = f.add_channel(1); f.on_punctuation(0, 20), f.on_punctuation(c, 15)   # and started again
        ([], [Punctuation(15)])
        """
        p = int(p)
        if p > self.chan_punct[channel]:
            self.chan_punct[channel] = p
        if self.groups is not None:
            top: dict[int, int] = {}
            for g, cp in zip(self.groups, self.chan_punct):
                if g != RETIRED and cp > top.get(g, NO_PUNCTUATION - 1):
                    top[g] = cp
            p = min(top.values())
        if p <= self.max_punct:
            return []
        self.max_punct = p  # Algorithm 1, lines 7-11
        self.seen.expire(p)
        return [Punctuation(p)]

    def stats(self) -> dict:
        return {
            "name": self.name,
            "passed": self.passed,
            "duplicates": self.duplicates,
            "late": self.late_count,
            "tracked_ids": len(self.seen),
            "max_punctuation": self.max_punct,
            "weights": self.weights.tolist(),
            **({} if self.audit is None else {"unseen_drops": self.unseen_drops,
                                               "unseen_sample": list(self.unseen_sample)}),
        }
