"""Staged state transfer: how a checkpoint moves from a live peer to a new replica in steps (Megaphone §3.3).

A *plan* is the list of bin sets moved in successive steps; each step is
taken by the sending replica at one of its punctuations (a logical time) and
installed by the receiver (:class:`StagedReplica`), while
the sender keeps processing between steps.

* ``"all-at-once"``: one step with every bin (the largest pause of the sender,
  the shortest transfer);
* ``"batched"``: ``bins_per_step`` bins per step;
* ``"fluid"``: one bin per step (the smallest pauses, the longest transfer).

State that does not partition by key (:func:`splittable`
is False: an unkeyed join, a logic behind a Sorter) always moves at once.

>>> [len(s) for s in plan_transfer("batched", bits=3, bins_per_step=3)]
[3, 3, 2]
>>> len(plan_transfer("fluid", bits=4)), len(plan_transfer("all-at-once", bits=4))
(16, 1)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..errors import DeadLetter, merge_dead_letters
from ..operators import Item
from ..operators.base import NO_PUNCTUATION, CheckpointError, OperatorState, bin_of
from ..operators.dupfilter import FilterState
from ..query import Query
from ..schema import ID, TS, Punctuation
from .checkpoint import ReplicaCheckpoint
from .core import ReplicaCore

__all__ = ["STRATEGIES", "pack_steps", "plan_transfer", "splittable", "StagedReplica", "unpack_steps"]

#: The strategies of Megaphone §3.3 (and §5.3's comparison).
STRATEGIES = ("all-at-once", "batched", "fluid")


#: A batched transfer or rescale without ``bins_per_step`` moves its bins in about this many steps.
BATCHED_STEPS = 16


def plan_transfer(strategy: str, bits: int, bins_per_step: int | None = None,
                  splittable: bool = True) -> list[np.ndarray]:
    """The bins of each step of a transfer of ``2**bits`` bins with ``strategy``.

    ``bins_per_step`` is for ``"batched"`` (default: 16 steps). With
    ``splittable=False`` every strategy is one step.

    >>> plan_transfer("fluid", bits=2, splittable=False)[0].tolist()
    [0, 1, 2, 3]
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown transfer strategy {strategy!r}; choose one of {STRATEGIES}")
    if not 0 <= int(bits) <= 16:
        raise ValueError(f"bits must be in 0..16, got {bits}")
    nb = 1 << int(bits)
    every = np.arange(nb, dtype=np.int64)
    if strategy == "all-at-once" or not splittable:
        return [every]
    if strategy == "fluid":
        n = 1
    else:
        n = max(1, nb // BATCHED_STEPS) if bins_per_step is None else int(bins_per_step)
        if n < 1:
            raise ValueError(f"bins_per_step must be >= 1, got {bins_per_step}")
    return [every[i:i + n] for i in range(0, nb, n)]


def pack_steps(steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps ``[(index, bins), ...]`` as three int64 arrays: the indices, where each step's bins
    end, and every step's bins one after another. A fluid transfer at 2^12 bins has 4,096 steps:
    as a list of small arrays its message took about 11 ms to deserialize on a quiet core (each
    array is a buffer of its own), on the thread that then holds the sender's data path; packed,
    0.2 ms (:func:`unpack_steps` gives the list back).

    >>> packed = pack_steps([(0, [0, 1]), (3, [7])])
    >>> [a.tolist() for a in packed]
    [[0, 3], [2, 3], [0, 1, 7]]
    """
    steps = list(steps)
    index = np.fromiter((int(i) for i, _ in steps), dtype=np.int64, count=len(steps))
    parts = [np.asarray(b, dtype=np.int64).ravel() for _, b in steps]
    ends = np.cumsum([len(b) for b in parts], dtype=np.int64)
    bins = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return index, ends, bins


def unpack_steps(steps) -> list[tuple[int, np.ndarray]]:
    """The steps ``[(index, bins), ...]`` of :func:`pack_steps`'s arrays (a list of pairs is
    returned as it is, each step's bins an int64 array).

    >>> [(i, b.tolist()) for i, b in unpack_steps(pack_steps([(0, [0, 1]), (3, [7])]))]
    [(0, [0, 1]), (3, [7])]
    >>> unpack_steps([(1, [4])])[0][1].tolist()
    [4]
    """
    if isinstance(steps, tuple) and len(steps) == 3 and all(isinstance(a, np.ndarray) for a in steps):
        index, ends, bins = steps
        return list(zip(index.tolist(), np.split(bins, ends[:-1]) if len(ends) else []))
    return [(int(i), np.asarray(b, dtype=np.int64)) for i, b in steps]


def splittable(query: Query, node: str) -> bool:
    """Whether ``node``'s state can move in several steps: its logic names the key of every
    input tuple (:meth:`~replistream.operators.base.OperatorLogic.bin_keys`) and no Sorter
    (whose buffer is not keyed) sits in front of it.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.window(size=10, by="k", name="w").sink("out"); q = q.build()
    >>> splittable(q, "w")
    True
    """
    if query.sorted_inputs(node):
        return False
    logic = query.build_logic(node)
    return all(logic.bin_keys(i, sch.empty()) is not None for i, sch in enumerate(query.in_schemas(node)))


@dataclass
class _Part:
    """One partial core of a :class:`StagedReplica`: the bins it holds and, per port, the
    largest ts among the applied ids its checkpoint brought (ids of other bins among them
    are forgotten once its filter's punctuation passes that ts)."""

    core: ReplicaCore
    bins: np.ndarray
    bound: list[int]
    steps: int = 1


class StagedReplica:
    """A new replica receiving its state in steps, from live peers, while it runs (Megaphone §3.3
    fluid and batched migration, on top of the hand-over of docs/design.md, decision 7).

    Each step brings a :class:`ReplicaCheckpoint` of some bins, taken by a live
    peer at its own logical time: its duplicate filters' ``p`` and applied ids,
    and its logic restricted to those bins. The receiver builds one *partial
    core* per step from it and routes every input tuple, by the bin of its key
    (:meth:`~replistream.operators.base.OperatorLogic.bin_keys`), to the core
    holding that bin; tuples of bins not yet received wait in a buffer with the
    punctuations between them and are replayed, in arrival order, to the core
    of the step that brings their bin. Punctuations go to every core. So each
    core is, for its bins, exactly a replica built by single-step hand-over at
    its step (docs/handover.md, A-C), whatever the logical time of the other
    steps.

    Cores merge (filters' applied ids united) once
    they agree on their filters' punctuation on every port and that punctuation
    has passed every applied id their checkpoints brought, so a merged filter
    never holds the id of a tuple of another core's bin that this core has not
    applied. A logic with live bins (Join, both Aggregates, keyed operators:
    :attr:`~replistream.operators.base.OperatorLogic.live_bins`) takes the other cores' bins
    into the running logic of the core holding the most bins
    (:meth:`~replistream.operators.base.OperatorLogic.install_bins`: the installed rows are
    copied, the rest is not); other logics merge checkpoints (:meth:`OperatorState.merge`)
    into a new core. Before completion the receiver emits no punctuation and sends
    nothing (its outputs wait in :attr:`early`); it is :attr:`complete` once it
    holds every bin in one core whose watermark has reached the largest
    watermark ``Q`` of the steps' checkpoints. Its output log
    (:meth:`final_output`) is then the union of the peers' retained outputs
    at the steps (deduplicated by id), its own outputs above ``Q``, and a
    punctuation at its watermark: every ideal output up to that is in it or was
    acknowledged by every live downstream replica (docs/migration.md).

    Dead letters (docs/design.md, decision 9): every step's checkpoint carries
    all the letters its peer holds at that step, whatever the step's bins (the
    peer keeps processing between steps, so the letters of a bin's tuples that
    it applied before the bin's step are only in that step's checkpoint, and a
    restart from another peer brings that peer's). Each partial core restores
    its step's letters and merges keep each set-aside tuple once by (where,
    reason) and id, so the completed core's :meth:`ReplicaCore.dead_letters`
    holds every letter once whatever the steps and peers; :meth:`dead_letters`
    reports them meanwhile.

    >>> from replistream import Query, Punctuation
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.window(size=10, by="k", name="w").sink("out"); q = q.build()
    >>> peer = ReplicaCore(q, "w", channels=[1], retain=True)
    >>> b = q.schema_of("s").from_columns({"ts": [1, 2, 3], "k": [1, 2, 3]}, ids=[1, 2, 3])
    >>> _ = peer.process(0, 0, b)
    >>> new = StagedReplica(q, "w", channels=[1], bits=1)
    >>> new.install_step(peer.checkpoint(1, [0]), [0]); new.install_step(peer.checkpoint(1, [1]), [1])
    >>> _ = new.process(0, 0, b); _ = new.process(0, 0, Punctuation(10))
    >>> new.complete, sorted(new.core.checkpoint().logic.tables["windows"]["count"].tolist())
    (True, [])
    >>> sorted(np.concatenate(new.early)[["k", "count"]].tolist())  # the peer's ids were not re-applied
    [(1, 1), (2, 1), (3, 1)]
    """

    def __init__(self, query: Query, node: str, channels: list[int], bits: int, strict: bool = False,
                 max_parts: int = 8, groups: list | None = None):
        self.query, self.node, self.bits, self.strict = query, node, int(bits), strict
        self.channels = list(channels)
        #: per input port, the upstream partition of each channel (None: an unpartitioned upstream)
        self.groups = None if groups is None else [None if g is None else list(g) for g in groups]
        self._probe = query.build_logic(node, strict)
        self.max_parts = int(max_parts)
        self.owner = np.full(1 << self.bits, -1, dtype=np.int64)  # bin -> index in parts (-1: not yet)
        self.parts: list[_Part | None] = []
        # input of bins not yet received: per (port, channel) its tuples (with their bins) in arrival
        # order, its latest punctuation, and markers in order
        self.wait_rows: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}
        self.wait_punct: dict[tuple[int, int], Item] = {}
        self.wait_other: list[tuple[int, int, Item]] = []
        self.logs: list[list[Item]] = []  # the peers' retained output at each step
        self.acked = NO_PUNCTUATION
        self.top = NO_PUNCTUATION  # Q: the largest watermark of the steps' checkpoints
        self.early: list[np.ndarray] = []  # tuples the cores emitted before completion
        self.steps = 0
        self.merges = 0
        self.live_merges = 0  # merges that installed bins into a running logic (no copy of its state)
        self.core: ReplicaCore | None = None

    # -- input -----------------------------------------------------------------------
    def add_channel(self, port: int, group: int | None = None) -> int:
        self.channels[port] += 1
        if self.groups is not None and self.groups[port] is not None:
            self.groups[port].append(int(group))
        for part in self._live():
            part.core.add_channel(port, group)
        return self.channels[port] - 1

    def _live(self) -> list[_Part]:
        return [p for p in self.parts if p is not None]

    def _bins(self, port: int, batch: np.ndarray) -> np.ndarray:
        keys = self._probe.bin_keys(port, batch)
        return np.zeros(len(batch), dtype=np.int64) if keys is None else bin_of(keys, self.bits)

    def process(self, port: int, channel: int, item: Item) -> list[Item]:
        """Deliver an input item; returns outputs only once complete (before, they wait in :attr:`early`)."""
        if self.core is not None:
            return self.core.process(port, channel, item)
        if not isinstance(item, np.ndarray):  # a punctuation (or a marker): every core sees it
            if (self.owner < 0).any():
                if isinstance(item, Punctuation):
                    self.wait_punct[(port, channel)] = item  # only the latest matters (see install_step)
                else:
                    self.wait_other.append((port, channel, item))
            for part in self._live():
                self._collect(part.core.process(port, channel, item))
        elif len(item):
            bins = self._bins(port, item)
            own = self.owner[bins]
            lost = own < 0
            if lost.any():
                self.wait_rows.setdefault((port, channel), []).append((item[lost], bins[lost]))
            for idx in np.unique(own[~lost]).tolist():
                self._collect(self.parts[idx].core.process(port, channel, item[own == idx]))
        self._settle()
        return []

    def _collect(self, out: list[Item]) -> None:
        self.early.extend(it for it in out if isinstance(it, np.ndarray) and len(it))

    # -- steps -----------------------------------------------------------------------
    @property
    def missing(self) -> np.ndarray:
        """Bins not received yet."""
        return np.flatnonzero(self.owner < 0)

    def install_step(self, checkpoint: ReplicaCheckpoint, bins: Iterable[int]) -> None:
        """Install one step: ``checkpoint`` (a live peer's, with its logic restricted to at least
        ``bins`` at this receiver's ``bits``); bins already held are ignored (a re-sent step)."""
        if self.core is not None:
            return
        bins = np.unique(np.asarray(list(bins), dtype=np.int64))
        bins = bins[self.owner[bins] < 0]
        if not len(bins):
            return
        if checkpoint.logic.bits != self.bits:
            raise CheckpointError(f"{self.node!r}: step has {checkpoint.logic.bits} bits, receiver {self.bits}")
        ck = ReplicaCheckpoint(checkpoint.node, checkpoint.filters, checkpoint.sorters,
                               checkpoint.logic.select(bins), [], checkpoint.output_acked,
                               dead_letters=checkpoint.dead_letters)
        core = ReplicaCore.from_checkpoint(self.query, ck, self.channels, self.strict, retain=False, groups=self.groups)
        bound = [int(f.applied_ts.max()) if len(f.applied_ts) else NO_PUNCTUATION for f in checkpoint.filters]
        idx = len(self.parts)
        self.parts.append(_Part(core, bins, bound))
        self.owner[bins] = idx
        self.logs.append(list(checkpoint.output))
        self.acked = max(self.acked, int(checkpoint.output_acked))
        self.top = max(self.top, int(checkpoint.logic.watermark))
        self.steps += 1
        # Replay what waited for these bins: markers, then per channel its tuples of these bins in
        # arrival order, then its latest punctuation. Delivering a channel's punctuations after its
        # tuples, and only the latest, is an execution the channel could have produced (a
        # punctuation held back until the next one): every operator here is correct under it.
        # One vectorised pass over the waiting rows per step, whatever their number.
        done = not (self.owner < 0).any()
        for port, channel, it in self.wait_other:
            self._collect(core.process(port, channel, it))
        for key, chunks in list(self.wait_rows.items()):
            rows = chunks[0][0] if len(chunks) == 1 else np.concatenate([c[0] for c in chunks])
            bins_ = chunks[0][1] if len(chunks) == 1 else np.concatenate([c[1] for c in chunks])
            mine = self.owner[bins_] == idx
            if mine.any():
                self._collect(core.process(key[0], key[1], rows[mine]))
            if done or mine.all():
                del self.wait_rows[key]
            else:
                self.wait_rows[key] = [(rows[~mine], bins_[~mine])]
        for (port, channel), it in self.wait_punct.items():
            self._collect(core.process(port, channel, it))
        if done:
            self.wait_punct, self.wait_other = {}, []
        self._settle()

    # -- merging -----------------------------------------------------------------------
    def _key(self, part: _Part):
        """Parts with equal keys may merge; None while a part still holds foreign applied ids."""
        ps = tuple(f.max_punct for f in part.core.filters)
        if any(p < b for p, b in zip(ps, part.bound)):
            return None
        return ps, part.core.logic.watermark

    def _settle(self) -> None:
        live = self._live()
        done = not (self.owner < 0).any()
        groups: dict = {}
        for part in live:
            k = self._key(part)
            if k is not None:
                groups.setdefault(k, []).append(part)
        for members in groups.values():
            if len(members) < 2:
                continue
            if done or len(live) > self.max_parts or self._installs_in_place(members):
                self._merge(members)
                continue
            # binary-counter merging (a logic whose merge copies every member): a part merges with
            # one at most twice its size, so the parts stay few and each bin is copied O(log steps) times
            members.sort(key=lambda p: p.steps)
            while len(members) >= 2 and members[1].steps <= 2 * members[0].steps:
                merged = self._merge(members[:2])
                members = sorted([merged] + members[2:], key=lambda p: p.steps)
        live = self._live()
        if done and len(live) == 1 and self._key(live[0]) is not None and \
                live[0].core.logic.watermark >= self.top:
            self.core = live[0].core

    @staticmethod
    def _installs_in_place(members: list[_Part]) -> bool:
        """Whether merging ``members`` costs only the smaller ones: a logic with live bins and no
        sorter takes the others' bins into the largest member's running state, which is not copied
        (:meth:`_merge`), so every part that can merge does at once and each bin is copied once.
        Merged pairwise by size instead, each bin was copied once per doubling: a fluid move of a
        million keys in 4,096 steps kept its receiver busy for most of the move, in
        ``KeyedState._append`` (py-spy), on cores the live path needs.

        >>> StagedReplica._installs_in_place([])
        True
        """
        return all(m.core.logic.live_bins and m.core.sorters is None for m in members)

    def _merge(self, members: list[_Part]) -> _Part:
        """One part from ``members`` (equal filter punctuations and watermark). With live bins
        (:attr:`~replistream.operators.base.OperatorLogic.live_bins`) the others' bins are
        installed into the running logic of the member holding the most bins, which is not
        copied (Megaphone §3.3); otherwise the members' checkpoints are merged and restored."""
        ports = len(self.channels)
        filters = []
        for i in range(ports):
            sts = [m.core.filters[i].checkpoint() for m in members]
            ts = np.concatenate([s.applied_ts for s in sts])
            ids = np.concatenate([s.applied_ids for s in sts])
            ids, first = np.unique(ids, return_index=True)
            filters.append(FilterState(sts[0].max_punct, ts[first], ids))
        letters = merge_dead_letters([d for m in members for d in m.core.dead_letters()])
        base = max(members, key=lambda m: len(m.bins))
        logic = base.core.logic
        live = logic.live_bins and base.core.sorters is None and all(
            tuple(m.core.logic.in_punct) == tuple(logic.in_punct) and m.core.logic.watermark == logic.watermark
            for m in members)
        if live:
            for m in members:
                if m is not base:  # its core holds only its own bins: its whole state is theirs
                    logic.install_bins(m.core.logic.checkpoint(self.bits), m.bins)
            core = ReplicaCore(self.query, self.node, self.channels, self.strict, retain=False, groups=self.groups)
            for f, st in zip(core.filters, filters):
                f.restore(st)
            core.logic = logic
            core.restore_letters(letters)
            self.live_merges += 1
        else:
            state = OperatorState.merge([m.core.logic.checkpoint(self.bits) for m in members])
            ck = ReplicaCheckpoint(self.node, tuple(filters), None, state, [], NO_PUNCTUATION, dead_letters=letters)
            core = ReplicaCore.from_checkpoint(self.query, ck, self.channels, self.strict, retain=False,
                                               groups=self.groups)
        part = _Part(core, np.concatenate([m.bins for m in members]),
                     [max(m.bound[i] for m in members) for i in range(ports)], sum(m.steps for m in members))
        idx = len(self.parts)
        self.parts.append(part)
        for m in members:
            self.parts[next(i for i, p in enumerate(self.parts) if p is m)] = None
        self.owner[part.bins] = idx
        self.merges += 1
        return part

    def dead_letters(self) -> list[DeadLetter]:
        """What the receiver holds as set aside so far, each tuple once: the steps' letters and those
        of its partial cores (the completed core's once complete).

        >>> from replistream import Query
        >>> q = Query(); s = q.source("s", {"k": "i8"})
        >>> _ = s.window(size=10, by="k", name="w").sink("out"); q = q.build()
        >>> StagedReplica(q, "w", channels=[1], bits=1).dead_letters()
        []
        """
        if self.core is not None:
            return self.core.dead_letters()
        return merge_dead_letters([d for part in self._live() for d in part.core.dead_letters()])

    @property
    def complete(self) -> bool:
        """Every bin received, merged into one core caught up with every step's watermark."""
        return self.core is not None

    def final_output(self) -> tuple[list[Item], int]:
        """(log, acked) the completed replica adopts as its retained output: the peers' retained
        outputs at the steps (each tuple once), its own outputs above ``Q``, a punctuation at its
        watermark."""
        if self.core is None:
            raise RuntimeError(f"{self.node!r}: the staged transfer is not complete")
        batches = [it for log in self.logs for it in log if isinstance(it, np.ndarray) and len(it)]
        out: list[Item] = []
        if batches:
            allrows = np.concatenate(batches)
            _, first = np.unique(allrows[ID], return_index=True)
            out.append(allrows[np.sort(first)])
        own = [b[b[TS] > self.top] for b in self.early]
        out.extend(b for b in own if len(b))
        wm = self.core.logic.watermark
        if wm != NO_PUNCTUATION:
            out.append(Punctuation(wm))
        return out, self.acked

    def stats(self) -> dict:
        return {"steps": self.steps, "merges": self.merges, "live_merges": self.live_merges,
                "parts": len(self._live()),
                "missing_bins": int((self.owner < 0).sum()),
                "waiting_tuples": sum(len(c[0]) for cs in self.wait_rows.values() for c in cs),
                "early_tuples": sum(len(b) for b in self.early), "complete": self.complete}
