"""Bins that move between the partitions of a running operator (a rescale, issue #41; Megaphone,
Hoffmann et al. 2019, §3.3), at one replica.

A rescale changes which partition owns some bins from logical time ``at`` on: every sender routes
a tuple of a moving bin with ``ts > at`` to the new owner, and one with ``ts <= at`` to the old
one (:class:`~replistream.partition.Switch`). Each replica of either partition holds the
:class:`Move` steps that concern it in a :class:`Moves`, which its core consults for every item
after the duplicate filter (:meth:`~replistream.replica.ReplicaCore.process`):

* **giving** (the old owner): when the logic's watermark is about to pass ``at`` (a punctuation
  that takes it past), the logic first takes the punctuation ``at`` alone (closing every window
  that ends by ``at``, with every tuple of the moving bins it will ever get: all of them have
  ``ts <= at``), then the state of the moving bins is taken out of it and kept in
  :attr:`Moves.shipped` for the replica to send, then the punctuation goes on. The old owner
  never again holds those bins.
* **taking** (the new owner): the tuples of the moving bins (all with ``ts > at``) wait, in the
  order they came, until the state arrives, each with its port's punctuation when it came (it is
  judged late against that one, as it would have been then). Punctuations go on as long as the
  logic promises to emit nothing up to them (:meth:`~replistream.operators.base.OperatorLogic.quiet_until`:
  a time window's aggregate until its next window's end; any other logic ``at``); the first past
  the promise, the logic takes the punctuation ``at`` and then everything waits (no output that
  the bins' windows may change leaves before they are there). :meth:`Moves.install` adds the state (the first
  copy from any replica of the old owner: they are identical, decision 1) and lets the waiting
  items through in order.

Why the output stays exact: a moving bin's tuples up to ``at`` are processed by the old owner,
those after by the new owner starting from the old owner's state at ``at``; so the bin's state
evolves through exactly the tuples, in the same per-port order, as in one partition. A window
ending by ``at`` is emitted by the old owner only (the new owner gets its state after it closed);
one ending after ``at`` by the new owner only (the old owner gave it away before closing it). Ids
of outputs are functions of content (decision 1), so the downstream duplicate filters are
unchanged.

>>> from replistream import Query
>>> from replistream.replica import ReplicaCore
>>> from replistream.schema import Punctuation
>>> q = Query(); s = q.source("s", {"k": "i8"})
>>> _ = s.window(10, by="k", name="w").sink("out"); q = q.build()
>>> old, new = ReplicaCore(q, "w", channels=[1]), ReplicaCore(q, "w", channels=[1])
>>> step = Move("r1/0", "w", at=5, bins=(0, 1), bits=1, src=0, dst=1)
>>> old.moves, new.moves = Moves([step], partition=0), Moves([step], partition=1)
>>> b = q.schema_of("s").from_columns({"ts": [1, 2], "k": [1, 2]}, ids=[1, 2])
>>> _ = old.process(0, 0, b); _ = old.process(0, 0, Punctuation(6))
>>> [m.id for group, _ in old.moves.shipped for m in group]   # the bins' state, taken at watermark 5
['r1/0']
>>> late = q.schema_of("s").from_columns({"ts": [7], "k": [1]}, ids=[3])
>>> new.process(0, 0, late), new.moves.waiting   # bin of k=1 not there yet: the tuple waits
([], 1)
>>> out = new.moves.install(new, "r1/0", old.moves.shipped[0][1]) + new.process(0, 0, Punctuation(10))
>>> sorted(int(r["count"]) for it in out if hasattr(it, "dtype") for r in it)   # k=1: 1 + 1, k=2: 1
[1, 2]
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

import numpy as np

from ..operators.base import NO_PUNCTUATION, Item, OperatorState, bin_of
from ..schema import TS, Punctuation
from .transfer import BATCHED_STEPS, pack_steps

if TYPE_CHECKING:
    from ..partition import BinMap

__all__ = ["Move", "Moves", "pack_moves", "plan_steps", "unpack_moves"]


@dataclass(frozen=True)
class Move:
    """One step of a rescale: ``bins`` (of ``2**bits``) of operator ``node`` pass from partition
    ``src`` to partition ``dst`` at logical time ``at`` (tuples with ``ts > at`` go to ``dst``)."""

    id: str
    node: str
    at: int
    bins: tuple
    bits: int
    src: int
    dst: int


_PACKED = "moves/1"  # the tag of pack_moves's form


def pack_moves(moves: Iterable[Move]) -> tuple:
    """``moves`` in the form a rescale sends to each replica taking part (:func:`unpack_moves`
    gives them back): their ids and operators as lists of strings, their numbers as int64
    arrays. A fluid rescale at 2^12 bins from 1 to 2 partitions has 2,048 steps: as dataclasses
    they were pickled once per replica on the host while the feed was held (30 ms for four
    replicas on the quiet machine) and unpickled one by one at each.

    >>> steps = [Move("w@100/0", "w", 100, (2,), 2, 0, 1), Move("w@100/1", "w", 110, (3, 1), 2, 0, 1)]
    >>> unpack_moves(pack_moves(steps)) == steps
    True
    """
    moves = list(moves)
    nums = np.array([(m.at, m.bits, m.src, m.dst) for m in moves], dtype=np.int64).reshape(-1, 4)
    _, ends, bins = pack_steps((0, m.bins) for m in moves)  # (the same form: where each step's bins end, and all)
    return _PACKED, [m.id for m in moves], [m.node for m in moves], nums, ends, bins


def unpack_moves(packed) -> list[Move]:
    """The steps of :func:`pack_moves`'s form (any other iterable of steps: as a list).

    >>> unpack_moves([Move("w@1/0", "w", 1, (0,), 1, 0, 1)])[0].bins
    (0,)
    """
    if not (isinstance(packed, tuple) and len(packed) == 6 and packed[0] == _PACKED):
        return list(packed)
    _, ids, nodes, nums, ends, bins = packed
    starts = np.r_[0, ends[:-1]].tolist() if len(ends) else []
    flat = bins.tolist()
    return [Move(i, node, at, tuple(flat[a:z]), bits, src, dst)
            for i, node, (at, bits, src, dst), a, z in zip(ids, nodes, nums.tolist(), starts, ends.tolist())]


class Moves:
    """The steps of rescales that concern one replica of partition ``partition`` (see the module
    doc): it gives the bins of steps with ``src == partition`` and takes those with ``dst ==
    partition``."""

    def __init__(self, steps: Iterable[Move] = (), partition: int | None = None):
        self.partition = partition
        self.take: dict[str, Move] = {}  # not installed yet
        self._times: list[int] = []  # the distinct times of the steps left to give or take, sorted
        self._give_at: dict[int, list[Move]] = {}  # time -> steps to give
        self._take_at: dict[int, int] = {}  # time -> steps to take not installed yet
        # taken out, for the replica to send: the steps given at once to one partition, their state
        self.shipped: list[tuple[tuple[Move, ...], OperatorState]] = []
        self.installed: set[str] = set()
        self.given: set[str] = set()
        # tuples of bins not installed yet, as they came: (port, tuples, port's punctuation, each one's step number)
        self._held_rows: list[tuple[int, np.ndarray, int, np.ndarray]] = []
        self._num: dict[str, int] = {}  # step to take -> its number
        self._ready = np.zeros(0, dtype=bool)  # by step number: installed
        self._step_at = np.zeros(0, dtype=np.int64)  # by step number: its time
        # per bin, the steps to take it (numbers; -1: none), one row per step of a bin that takes
        # it more than once (a bin given away and taken back: fewer partitions after more)
        self._bin_step: np.ndarray | None = None
        self._held: list[tuple[int, Item]] = []  # everything, once blocked at a step's time
        self.blocked_at: int | None = None
        # an operator with several inputs: each input's punctuation as it came; the logic gets it
        # only up to the first step's time not done yet (:meth:`_capped`)
        self._real: dict[int, int] = {}
        self.add(steps)

    def add(self, steps: Iterable[Move]) -> None:
        """Take more steps (those of this replica's partition; the others are ignored).

        A rescale gives a replica of a taking partition one step per bin with the fluid strategy
        (2,048 at 2^12 bins from 1 to 2 partitions), all at once while the feed is held: their
        numbers and times are set in one pass of numpy (a copy of the per-step arrays for each
        step took 20 ms for 2,048 steps on a quiet core).

        >>> m = Moves([Move("r:0", "op", 10, (0, 1), 2, 0, 1), Move("r:1", "op", 20, (2,), 2, 0, 1)], partition=1)
        >>> sorted(m.take), m._bin_step.tolist(), m._step_at.tolist()
        (['r:0', 'r:1'], [[0, 0, 1, -1]], [10, 20])
        """
        new: list[Move] = []
        for m in steps:
            if m.src == self.partition and m.id not in self.given and m not in self._give_at.get(m.at, ()):
                self._give_at.setdefault(m.at, []).append(m)
            elif m.dst == self.partition and m.id not in self.installed and m.id not in self.take:
                if self._bin_step is None:
                    self._bin_step = np.full((1, 1 << m.bits), -1, dtype=np.int64)
                if self._bin_step.shape[1] != 1 << m.bits:
                    raise ValueError(f"steps of one replica at different bits: {m.bits} and {self._bits}")
                self.take[m.id] = m
                self._take_at[m.at] = self._take_at.get(m.at, 0) + 1
                new.append(m)
        if new:
            first = len(self._num)
            nums = np.arange(first, first + len(new), dtype=np.int64)
            sizes = np.fromiter((len(m.bins) for m in new), dtype=np.int64, count=len(new))
            bins = np.fromiter((b for m in new for b in m.bins), dtype=np.int64, count=int(sizes.sum()))
            if len(np.unique(bins)) == len(bins) and (self._bin_step[0, bins] < 0).all():
                self._bin_step[0, bins] = np.repeat(nums, sizes)  # (the common case: one row, bins once each)
            else:  # a bin taken more than once: each step in the first row where its bins are free
                for num, m in zip(nums.tolist(), new):
                    b = np.asarray(m.bins, dtype=np.int64)
                    free = [j for j in range(len(self._bin_step)) if (self._bin_step[j, b] < 0).all()]
                    if not free:
                        self._bin_step = np.vstack([self._bin_step, np.full_like(self._bin_step[:1], -1)])
                        free = [len(self._bin_step) - 1]
                    self._bin_step[free[0], b] = num
            for num, m in zip(nums.tolist(), new):
                self._num[m.id] = num
            self._step_at = np.concatenate([self._step_at, np.fromiter((m.at for m in new), dtype=np.int64,
                                                                       count=len(new))])
        self._times = sorted(set(self._give_at) | set(self._take_at))
        self._ready = np.r_[self._ready, np.zeros(len(self._num) - len(self._ready), dtype=bool)]

    def _done_at(self, at: int) -> None:
        """Forget time ``at`` once no step of it is left to give or take."""
        if at not in self._give_at and not self._take_at.get(at):
            self._take_at.pop(at, None)
            i = bisect.bisect_left(self._times, at)
            if i < len(self._times) and self._times[i] == at:
                del self._times[i]

    @property
    def give(self) -> list[Move]:
        """The steps left to give, by time."""
        return [m for t in sorted(self._give_at) for m in self._give_at[t]]

    @property
    def waiting(self) -> int:
        """Items held back (tuples of bins not installed, and everything once blocked)."""
        return len(self._held_rows) + len(self._held)

    @property
    def idle(self) -> bool:
        """True when nothing is left to give or take."""
        return not self._give_at and not self.take and not self._held and not self._held_rows

    # -- the core's data path -------------------------------------------------------------------
    def feed(self, core, port: int, item: Item, late_at: int | None = None) -> list[Item]:
        """Process ``item`` (past the duplicate filter and sorter) through ``core.logic``, giving,
        holding or blocking as the steps say. ``late_at``: the punctuation of ``port`` when a held
        batch came (its tuples are judged late against it, as they would have been then)."""
        if self.blocked_at is not None:
            self._held.append((port, item))
            return []
        if isinstance(item, Punctuation):
            out: list[Item] = []
            multi = len(core.logic.in_punct) > 1
            if multi:
                self._real[port] = max(self._real.get(port, NO_PUNCTUATION), int(item.p))
                after = min(max(int(p), self._real.get(i, NO_PUNCTUATION)) for i, p in enumerate(core.logic.in_punct))
            else:
                after = _watermark_after(core.logic, port, int(item.p))
            for at in self._times[:bisect.bisect_right(self._times, after)]:
                if core.logic.watermark < at:  # (every input is past at: each one behind is taken to at)
                    for i in range(len(core.logic.in_punct)) if multi else (port,):
                        if core.logic.in_punct[i] < at:
                            out.extend(core.logic.process(i, Punctuation(at)))  # the watermark is now at
                if at in self._give_at and not multi and (last := self._frozen_last(core, at, after)) > at:
                    # the later steps' bins, whose state stays what it was at their own times up
                    # to `last` (no tuple of theirs comes after it): the watermark to the last of
                    # them, then all given in one pass (a keyed operator: one step's cost is then
                    # its bins' rows, not a pass of the watermark and a message each)
                    if core.logic.in_punct[port] < last:
                        out.extend(core.logic.process(port, Punctuation(last)))
                    times = self._times[bisect.bisect_left(self._times, at):bisect.bisect_right(self._times, last)]
                    self._give(core, [m for t in times for m in self._give_at.get(t, ())])
                    continue
                if at in self._give_at:
                    # the later steps up to what the logic lets go early go at once (one pass over the
                    # state): none of a window's would close before their time; a join's rows of them
                    # are all here (gives_ahead)
                    upto = min(after, core.logic.gives_ahead(at))
                    times = self._times[bisect.bisect_left(self._times, at):bisect.bisect_right(self._times, upto)]
                    self._give(core, [m for t in times for m in self._give_at.get(t, ())])
                if self._take_at.get(at):
                    quiet = core.logic.quiet_until(at)  # (the logic emits nothing until past it)
                    if after <= quiet:
                        continue  # the bins' state is on its way: it is needed only past quiet
                    self.blocked_at = at  # the bins' windows are not there yet: nothing passes
                    self._held.append((port, item))
                    return out
            if multi:
                return out + self._capped(core)
            return out + core.logic.process(port, item)
        if self.take and len(item):
            keys = core.logic.bin_keys(port, item)
            if keys is not None:
                step = self._waits_for(bin_of(keys, self._bits), item[TS])
                wait = step >= 0
                if wait.any():
                    came = core.logic.in_punct[port] if late_at is None else late_at
                    self._held_rows.append((port, item[wait], came, step[wait]))
                    item = item[~wait]
                    if not len(item):
                        return []
        if late_at is not None:
            return core.logic.on_batch(port, item, late_at)
        return core.logic.process(port, item)

    def _frozen_last(self, core, at: int, after: int) -> int:
        """The last step time from ``at`` up to ``after`` and to what the logic keeps a bin's state
        frozen by (:meth:`~replistream.operators.base.OperatorLogic.frozen_until`), before any step
        this partition still takes (the watermark must not pass one whose bins are not here)."""
        upto = min(int(after), core.logic.frozen_until(at))
        if upto <= at:
            return at
        last = at
        for t in self._times[bisect.bisect_left(self._times, at):bisect.bisect_right(self._times, upto)]:
            if self._take_at.get(t):
                break
            last = t
        return last

    def _capped(self, core) -> list[Item]:
        """An operator with several inputs: each input's punctuation to the logic, but no further
        than the first step's time not given or installed yet. One input's punctuation purges the
        *other* input's state (a join: rows no later tuple of this input can match); past a step's
        time that would be wrong for a moving bin, whose later tuples of this input go to (or wait
        at) the new owner and still need those rows: the giver must give them, the taker must still
        hold them when what waited for the bins is replayed (Megaphone's invariant: a bin's state
        moves as of the step's time)."""
        out: list[Item] = []
        upto = self._times[0] if self._times else None
        for i, p in sorted(self._real.items()):
            target = p if upto is None else min(p, upto)
            if core.logic.in_punct[i] < target:
                out.extend(core.logic.process(i, Punctuation(target)))
        return out

    @property
    def _bits(self) -> int:
        return self._bin_step.shape[1].bit_length() - 1

    def _waits_for(self, bins: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Per tuple (its bin, its time), the step it waits for (-1: none): of the steps not
        installed that take its bin, the latest whose time is before the tuple's (a tuple at or
        before every such time is still this partition's: a bin it gave away and takes back). A
        later step of a bin is given only after the earlier ones were installed (the giver took
        the bin by one of them), so waiting for the latest is waiting for all."""
        steps = self._bin_step[:, bins]
        at = np.where(steps >= 0, self._step_at[np.maximum(steps, 0)], np.iinfo(np.int64).max)
        before = at < ts
        if len(steps) == 1:
            return np.where(before[0], steps[0], -1)
        at = np.where(before, at, np.iinfo(np.int64).min)
        j = np.argmax(at, axis=0)
        pick = steps[j, np.arange(steps.shape[1])]
        return np.where(before.any(axis=0), pick, -1)

    def _give(self, core, steps: list[Move]) -> None:
        """Take the bins of ``steps`` out of ``core.logic`` into :attr:`shipped`, one state per
        taking partition: one pass over the state for them all. The logic's watermark is the first
        step's time; the others' times are no later than what it lets go early
        (:meth:`~replistream.operators.base.OperatorLogic.gives_ahead`: no window closes before
        them; a join's rows of them are all here), so their bins' state is what it would be at
        their own times, or holds more that the new owner keeps without effect; or, for a keyed
        operator, the watermark is the last step's time and the bins' state has stayed what it
        was at their times (:meth:`~replistream.operators.base.OperatorLogic.frozen_until`)."""
        logic = core.logic
        bits = steps[0].bits
        bins = _bins_of(steps)
        drop = getattr(logic, "drop_bins", None)
        if logic.live_bins and drop is not None:  # the bins' rows only (a time window's aggregate, a keyed operator)
            moving = logic.checkpoint(bits, bins)
            drop(bits, bins)
        else:  # any other logic: the rest of its state into a new logic (one pass over the state)
            moving = logic.checkpoint(bits)
            keep = np.ones(moving.n_bins, dtype=bool)
            keep[bins] = False
            rest = core.query.build_logic(core.node, core.strict).restore(moving.select(np.flatnonzero(keep)))
            rest.dead_letters = logic.dead_letters  # (what the logic set aside stays with this replica)
            core.logic = rest
        per_dst: dict[int, list[Move]] = {}
        for m in steps:
            self.given.add(m.id)
            self._give_at.pop(m.at, None)
            self._done_at(m.at)
            per_dst.setdefault(m.dst, []).append(m)
        for group in per_dst.values():  # (one state per partition taking: one message, one install)
            mine = moving if len(per_dst) == 1 and drop is not None and logic.live_bins else \
                moving.select(_bins_of(group))
            self.shipped.append((tuple(group), mine))

    def install(self, core, move_id: str, state: OperatorState) -> list[Item]:
        """Add the bins of step ``move_id`` from ``state`` (the old owner's, taken at the step's
        time) to ``core.logic`` and process what waited for them; the outputs. A second copy (from
        another replica of the old owner) is ignored."""
        return self.install_many(core, [((move_id,), state)])

    def install_many(self, core, given: list) -> list[Item]:
        """:meth:`install` for each ``(step ids, state)`` of ``given`` (the steps an old owner's
        replica gave at once, their bins' state: :attr:`shipped`), then what waited for any of
        them, in the order it came (one pass over what is held, in batches as large as it came).
        Steps installed already (a copy from another replica of the old owner, which may have
        given them in other groups) are left out."""
        added = False
        for ids, state in given:
            new = [self.take.pop(i) for i in ids if i in self.take]
            if not new:
                continue
            if len(new) < len(ids):  # (only the bins of the steps not installed yet)
                state = state.select(_bins_of(new))
            added = True
            for m in new:
                self.installed.add(m.id)
                self._take_at[m.at] -= 1
                self._done_at(m.at)
                self._ready[self._num[m.id]] = True
                rows = self._bin_step[:, np.asarray(m.bins, dtype=np.int64)]
                rows[rows == self._num[m.id]] = -1
                self._bin_step[:, np.asarray(m.bins, dtype=np.int64)] = rows
            logic = core.logic
            if logic.live_bins:
                logic._install_tables(state.tables)  # the bins are not in it: added as they are
            else:
                mine = logic.checkpoint(state.bits)
                merged = OperatorState.merge([mine, replace(state, in_punct=mine.in_punct, watermark=mine.watermark)])
                fresh = core.query.build_logic(core.node, core.strict).restore(merged)
                fresh.dead_letters = logic.dead_letters
                core.logic = fresh
        if not added:
            return []
        # the tuples held for the steps' bins came before anything held at a block (all with
        # ts > at): they go first, each with its port's punctuation when it came; consecutive
        # ones of a port and punctuation in one batch
        out: list[Item] = []
        keep, run = [], []
        for port, rows, came, nums in self._held_rows:
            ready = self._ready[nums]
            if ready.all():
                go = rows
            else:
                if ready.any():
                    keep.append((port, rows[~ready], came, nums[~ready]))
                    go = rows[ready]
                else:
                    keep.append((port, rows, came, nums))
                    continue
            if run and (run[0][0], run[0][2]) != (port, came):
                out.extend(_replay(core, run))
                run = []
            run.append((port, go, came))
        if run:
            out.extend(_replay(core, run))
        self._held_rows = keep
        if self.blocked_at is None or self._take_at.get(self.blocked_at):
            if self._real and self.blocked_at is None:
                out.extend(self._capped(core))  # (a step's time done: the inputs' punctuation goes on)
            return out  # nothing blocked, or another step of that time is still on its way
        # then everything held at the block, in order (through feed again: another step's time
        # may hold it anew)
        held, self._held, self.blocked_at = self._held, [], None
        for port, item in held:
            out.extend(self.feed(core, port, item))
        if self._real and self.blocked_at is None:
            out.extend(self._capped(core))
        return out


def _bins_of(steps) -> np.ndarray:
    """The bins of ``steps``, sorted and distinct."""
    return np.unique(np.concatenate([np.asarray(m.bins, dtype=np.int64) for m in steps]))


def _replay(core, run: list) -> list[Item]:
    """Batches of one port held with one punctuation, processed as one."""
    port, _, came = run[0]
    rows = run[0][1] if len(run) == 1 else np.concatenate([r for _, r, _ in run])
    return core.logic.on_batch(port, rows, came)


def _watermark_after(logic, port: int, p: int) -> int:
    """The logic's watermark once input ``port`` has punctuation ``p``."""
    punct = list(logic.in_punct)
    punct[port] = max(int(punct[port]), p)
    return min(punct) if punct else NO_PUNCTUATION


def plan_steps(node: str, current: "BinMap", new: "BinMap", t0: int, strategy: str, bins_per_step: int | None,
               gap: int, stamp: str | None = None) -> tuple[list[Move], list[tuple[int, int]]]:
    """The steps of a rescale from ``current`` to ``new`` and ``(bin, time)`` of each moving bin:
    per pair of partitions (in order), its bins cut by ``strategy`` (``"all-at-once"``: one step at
    ``t0``; ``"batched"``: ``bins_per_step`` bins per step, by default the moving bins in about
    :data:`BATCHED_STEPS` steps, as a replica's batched move makes; ``"fluid"``: one bin), step
    ``i`` at ``t0 + i * gap``. The cut both engines' rescales make; step ids are ``stamp/i``
    (default ``node@t0``).

    >>> from replistream.partition import BinMap
    >>> steps, times = plan_steps("w", BinMap.even(1, bits=2), BinMap.even(2, bits=2), 100, "fluid", None, 10)
    >>> [(m.id, m.at, m.bins, m.src, m.dst) for m in steps]
    [('w@100/0', 100, (2,), 0, 1), ('w@100/1', 110, (3,), 0, 1)]
    >>> len(plan_steps("w", BinMap.even(1, bits=12), BinMap.even(2, bits=12), 0, "batched", None, 1)[0])
    16
    """
    by_pair: dict[tuple[int, int], list[int]] = {}
    moves = current.moves(new)
    for b, src, dst in moves:
        by_pair.setdefault((src, dst), []).append(b)
    if strategy == "batched" and bins_per_step is not None and int(bins_per_step) < 1:
        raise ValueError(f"bins_per_step must be >= 1 (bins moved per step), got {bins_per_step!r}")
    batch = int(bins_per_step) if bins_per_step is not None else max(1, -(-len(moves) // BATCHED_STEPS))
    size = {"fluid": 1, "batched": batch, "all-at-once": None}[strategy]
    steps: list[Move] = []
    times: list[tuple[int, int]] = []
    i = 0
    stamp = f"{node}@{t0}" if stamp is None else stamp
    for (src, dst), bins in sorted(by_pair.items()):
        cuts = [bins] if size is None else [bins[a:a + size] for a in range(0, len(bins), size)]
        for chunk in cuts:
            at = t0 if size is None else t0 + i * int(gap)
            steps.append(Move(f"{stamp}/{i}", node, int(at), tuple(int(b) for b in chunk), current.bits,
                              int(src), int(dst)))
            times += [(b, at) for b in chunk]
            i += 1
    return steps, times
