"""One replica of one operator or application, with no transport (Hwang §II-B, §IV).

A :class:`ReplicaCore` is, per input port, a
:class:`~replistream.operators.dupfilter.DuplicateFilter` over its stream
replicas (Algorithm 1), then a Sorter where the query asks for one (§IV-C),
then the operator logic. Every engine drives these same objects: the
reference engine (with no duplicate filters), the in-process replicated
engine, the Ray actors and the simulator; only how items travel between
them differs (docs/design.md, decision 2).

A :class:`ReplayLog` is the one retained-output log of every engine: what a
replica (or an output stream of a Ray actor) emitted since the last
punctuation all its live downstream replicas acknowledged, replayed to a new
or revived downstream replica (docs/design.md, decision 7).

Hand-over (docs/handover.md): :meth:`ReplicaCore.checkpoint` captures a
replica as a :class:`~replistream.replica.checkpoint.ReplicaCheckpoint`;
:meth:`ReplicaCore.from_checkpoint` builds a new replica from one.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ..errors import DeadLetter, merge_dead_letters
from ..operators import Item, OperatorLogic
from ..operators.base import NO_PUNCTUATION, CheckpointError
from ..operators.dupfilter import DuplicateFilter
from ..query import Query
from ..schema import TS, Marker, Punctuation
from .checkpoint import CHECKPOINT_VERSION, ReplicaCheckpoint

__all__ = ["ReplayLog", "ReplicaCore"]


class ReplayLog:
    """What a replica emitted since the last punctuation all its live downstream replicas
    acknowledged: the replay buffer of hand-over (docs/design.md, decision 7).

    The one replay log of every engine: a :class:`ReplicaCore` keeps its outputs in
    one (``retain=True``), and each output stream of a Ray actor keeps what it
    flushed in one. ``append(items)`` records outputs in emission order (markers
    of running changes are not kept: replicas started later are built from the
    changed query); ``trim(acked)`` forgets every tuple with ``ts <= acked`` and
    every punctuation ``<= acked`` (a tuple with a higher ts stays even if emitted
    before a punctuation ``acked``: an operator may emit out of timestamp order);
    ``items()`` is the replay, in emission order, which keeps each stream
    replica's punctuation contract; ``tuples`` counts the tuples it holds.

    >>> from replistream import Schema
    >>> s = Schema({"x": "i8"})
    >>> log = ReplayLog()
    >>> log.append([s.from_columns({"ts": [5, 9], "x": [0, 0]}), Punctuation(6)])
    >>> log.trim(6)
    >>> [it if isinstance(it, Punctuation) else it["ts"].tolist() for it in log.items()]
    [[9]]
    """

    def __init__(self, items: Iterable[Item] = (), acked: int = NO_PUNCTUATION):
        # (sequence number, min ts, max ts, item); a punctuation has min = max = p
        self._log: list[tuple[int, int, int, Item]] = []
        self.acked = int(acked)
        self._tuples = 0
        self._seq = 0  # entries ever appended: the sequence number of the next one
        self.append(items)

    def append(self, items: Iterable[Item]) -> None:
        for it in items:
            if isinstance(it, Punctuation):
                self._log.append((self._seq, it.p, it.p, it))
            elif isinstance(it, np.ndarray) and len(it):
                ts = it[TS]
                self._log.append((self._seq, int(ts.min()), int(ts.max()), it))
                self._tuples += len(it)
            else:
                continue
            self._seq += 1

    def trim(self, acked: int) -> None:
        """Forget what every live downstream replica has: tuples and punctuations ``<= acked``."""
        acked = int(acked)
        if acked <= self.acked:
            return
        self.acked = acked
        kept = []
        n = 0
        for seq, lo, hi, it in self._log:
            if hi <= acked:
                continue
            if lo <= acked:  # a batch straddling the acknowledgement: keep its later tuples
                it = it[it[TS] > acked]
                lo = int(it[TS].min())
            if not isinstance(it, Punctuation):
                n += len(it)
            kept.append((seq, lo, hi, it))
        self._log = kept
        self._tuples = n

    def items(self, since: int = 0) -> list[Item]:
        """The retained outputs, in emission order (what a new downstream replica is replayed);
        with ``since``, only those appended at or after sequence number ``since`` (see :attr:`seq`).

        >>> log = ReplayLog([Punctuation(1)]); mark = log.seq; log.append([Punctuation(2)])
        >>> log.items(since=mark)
        [Punctuation(2)]
        """
        if since <= 0:
            return [e[3] for e in self._log]
        return [e[3] for e in self._log if e[0] >= since]

    @property
    def seq(self) -> int:
        """Entries appended so far: ``items(since=seq)`` later returns only what was appended after
        now. The retained log at any time is within what ``items()`` returned at an earlier mark
        plus ``items(since=mark)`` (trimming only removes), which lets a sender ship a log in
        increments."""
        return self._seq

    @property
    def tuples(self) -> int:
        """Tuples held (punctuations not counted)."""
        return self._tuples

    def bound(self) -> int:
        """A timestamp at or above that of every tuple and punctuation ever appended (trimmed or
        not): the largest of the trim point and the held entries' timestamps. A stream replica
        added without replay after ``bound()`` was read receives every tuple of the stream with a
        larger timestamp (a staged transfer's gate, :func:`replistream.engines.ray.transfer.staged_install`).

        >>> log = ReplayLog([Punctuation(3)]); log.trim(3); log.bound()
        3
        >>> from replistream import Schema
        >>> log.append([Schema({"x": "i8"}).from_columns({"ts": [9, 4], "x": [0, 0]})]); log.bound()
        9
        """
        return max([self.acked] + [e[2] for e in self._log])

    def __len__(self) -> int:
        return len(self._log)



class ReplicaCore:
    """One replica of ``node``: duplicate filters -> optional sorters -> logic.

    ``channels`` gives the number of stream replicas feeding each input port;
    ``None`` means "no duplicate filter" (the reference engine). ``groups`` gives, per
    port, None or (when the upstream operator is partitioned) each channel's upstream
    partition (:class:`~replistream.operators.dupfilter.DuplicateFilter`, ``groups``).

    >>> from replistream import Query, Punctuation
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> _ = s.filter(lambda b: b["x"] > 0, name="f").sink("out"); q = q.build()
    >>> core = ReplicaCore(q, "f", channels=[2])
    >>> core.process(0, 1, Punctuation(3))
    [Punctuation(3)]

    ``retain=True`` keeps the outputs in :attr:`output_log` until
    :meth:`trim_output` says every live downstream replica has them, for replay
    to a new downstream replica; :meth:`checkpoint` and :meth:`from_checkpoint`
    hand a replica over (docs/design.md, decision 7).
    """

    def __init__(self, query: Query, node: str, channels: list[int] | None = None, strict: bool = False,
                 retain: bool = False, groups: list | None = None):
        self.node = node
        self.query, self.strict = query, strict  # (a rescale's step builds the logic again: replica/rescale.py)
        self.output_log: ReplayLog | None = ReplayLog() if retain else None
        #: the steps of rescales this replica gives or takes bins in (:class:`~.rescale.Moves`), or None
        self.moves = None
        self.logic: OperatorLogic = query.build_logic(node, strict)
        n = self.logic.n_inputs
        if channels is not None and len(channels) != n:
            raise ValueError(f"{node!r} has {n} input(s); got channel counts for {len(channels)}")
        schemas = query.in_schemas(node)
        if groups is not None and (channels is None or len(groups) != n):
            raise ValueError(f"{node!r} has {n} input(s); got upstream partitions for {len(groups)}")
        self.filters = None if channels is None else [
            DuplicateFilter(c, schemas[i], f"{node}.dupfilter[{i}]", strict, None if groups is None else groups[i])
            for i, c in enumerate(channels)]
        self.sorters = [query.build_sorter(node, i, strict) for i in range(n)] if query.sorted_inputs(node) else None
        #: dead letters restored from a checkpoint (:meth:`from_checkpoint`): what the peers this
        #: replica was built from set aside; :meth:`dead_letters` reports them with its own
        self.inherited_letters: list[DeadLetter] = []

    def process(self, port: int, channel: int, item: Item) -> list[Item]:
        """Deliver ``item`` from stream replica ``channel`` of input ``port``; returns the outputs.

        A :class:`~replistream.schema.Marker` (a change at a logical time,
        :mod:`replistream.replica.changes`) is applied on its first copy and returned
        to be forwarded; later copies return nothing."""
        if isinstance(item, Marker):
            from .changes import on_marker

            return [item] if on_marker(self, item) else []
        if not 0 <= port < self.logic.n_inputs:
            raise ValueError(f"{self.node!r} has {self.logic.n_inputs} input(s); got input {port}")
        if self.filters is not None and not 0 <= channel < self.filters[port].n_channels:
            raise ValueError(f"{self.node!r} input {port} has {self.filters[port].n_channels} stream "
                             f"replica(s); got channel {channel}")
        items = [item] if self.filters is None else self.filters[port].process(channel, item)
        if self.sorters is not None:
            sorted_items: list[Item] = []
            for it in items:
                sorted_items.extend(self.sorters[port].process(0, it))
            items = sorted_items
        out: list[Item] = []
        if self.moves is not None:  # bins moving between partitions (a rescale): replica/rescale.py
            for it in items:
                out.extend(self.moves.feed(self, port, it))
        else:
            for it in items:
                out.extend(self.logic.process(port, it))
        if self.output_log is not None and out:
            self.output_log.append(out)
        return out

    def add_channel(self, port: int, group: int | None = None) -> int:
        """A new upstream replica feeds ``port`` (from upstream partition ``group`` when the
        upstream is partitioned): returns the index of its stream replica."""
        if self.filters is None:
            raise ValueError(f"{self.node!r} has no duplicate filters (a reference core)")
        return self.filters[port].add_channel(group)

    def trim_output(self, acked: int) -> None:
        """Every live downstream replica has acknowledged punctuation ``acked``: forget what it covers."""
        if self.output_log is not None:
            self.output_log.trim(acked)

    def checkpoint(self, bits: int = 0, bins: Iterable[int] | None = None) -> ReplicaCheckpoint:
        """This replica's state for a new or revived peer (docs/design.md, decision 7).

        Take it between two :meth:`process` calls. ``bits`` splits keyed state
        into ``2**bits`` bins (Megaphone); 0 keeps one bin and costs nothing extra.
        ``bins`` restricts the logic's state to those bins: one step of a binned
        transfer (Megaphone §3.3, :class:`StagedReplica`); filters, sorters,
        retained output and dead letters (:meth:`dead_letters`, merged) are shipped
        whole at every step.
        """
        if self.filters is None:
            raise CheckpointError(f"{self.node!r}: a core without duplicate filters has no applied-id "
                                  f"bookkeeping to hand over")
        log = self.output_log
        return ReplicaCheckpoint(
            node=self.node,
            filters=tuple(f.checkpoint() for f in self.filters),
            sorters=None if self.sorters is None else tuple(s.checkpoint() for s in self.sorters),
            logic=self.logic.checkpoint(bits) if bins is None else self.logic.checkpoint(bits, bins),
            output=log.items() if log is not None else [],
            output_acked=log.acked if log is not None else NO_PUNCTUATION,
            dead_letters=self.dead_letters(),
        )

    @classmethod
    def from_checkpoint(cls, query: Query, checkpoint: ReplicaCheckpoint, channels: list[int],
                        strict: bool = False, retain: bool = True, groups: list | None = None) -> "ReplicaCore":
        """A new replica of ``checkpoint.node`` in the state of the peer that took ``checkpoint``.

        ``channels`` counts its own input stream replicas per port (one per live
        upstream replica it subscribed to). It then drops every tuple with
        ``ts <= p`` and every id the checkpoint already applied, so replayed and
        later tuples change it only where the checkpoint did not reflect them;
        what the peer set aside among those comes with the checkpoint
        (``checkpoint.dead_letters``) and is reported by :meth:`dead_letters`.

        >>> from replistream import Query, Punctuation
        >>> q = Query(); s = q.source("s", {"k": "i8"})
        >>> _ = s.window(size=10, by="k", name="window").sink("out"); q = q.build()
        >>> old = ReplicaCore(q, "window", channels=[1])
        >>> b = q.schema_of("s").from_columns({"ts": [3, 4], "k": [1, 1]}, ids=[1, 2])
        >>> _ = old.process(0, 0, b)
        >>> new = ReplicaCore.from_checkpoint(q, old.checkpoint(), channels=[2])
        >>> new.process(0, 1, b)  # a replay of what the checkpoint holds changes nothing
        []
        >>> new.process(0, 1, Punctuation(9))[0][["window_start", "count"]].tolist()
        [(0, 2)]
        """
        if not isinstance(checkpoint, ReplicaCheckpoint):
            raise CheckpointError(f"expected a ReplicaCheckpoint, got {type(checkpoint).__name__}")
        if checkpoint.version != CHECKPOINT_VERSION:
            raise CheckpointError(f"checkpoint version {checkpoint.version}, this replistream reads "
                                  f"version {CHECKPOINT_VERSION}")
        node = checkpoint.node
        core = cls(query, node, channels, strict, retain, groups)
        if len(checkpoint.filters) != len(core.filters):
            raise CheckpointError(f"{node!r}: checkpoint has {len(checkpoint.filters)} input(s), "
                                  f"the query gives {len(core.filters)}")
        if (checkpoint.sorters is None) != (core.sorters is None):
            raise CheckpointError(f"{node!r}: checkpoint and query disagree on sorted inputs")
        for f, st in zip(core.filters, checkpoint.filters):
            f.restore(st)
        for s, st in zip(core.sorters or (), checkpoint.sorters or ()):
            s.restore(st)
        core.logic.restore(checkpoint.logic)
        if core.output_log is not None:
            core.output_log = ReplayLog(checkpoint.output, checkpoint.output_acked)
        core.restore_letters(checkpoint.dead_letters)
        return core

    def restore_letters(self, letters: Iterable[DeadLetter]) -> None:
        """Adopt ``letters`` (a peer's, from a checkpoint) as set aside by this replica too:
        :meth:`dead_letters` reports them with its own, each tuple once (docs/design.md, decision 9)."""
        letters = list(letters)
        if letters:
            self.inherited_letters = merge_dead_letters(self.inherited_letters + letters)

    def delta_checkpoint(self, since: int) -> tuple[ReplicaCheckpoint, np.ndarray, int]:
        """An incremental checkpoint (Del Monte 2017): like :meth:`checkpoint`, but the logic's state is
        only the bins changed after state version ``since`` (plus its pending work); returns
        (checkpoint, those bins, the state's version now). The logic must keep versioned bins
        (:class:`~replistream.operators.keyed.KeyedOperatorLogic`)."""
        if self.filters is None:
            raise CheckpointError(f"{self.node!r}: a core without duplicate filters cannot hand over")
        if not hasattr(self.logic, "delta"):
            raise CheckpointError(f"{self.node!r}: {type(self.logic).__name__} keeps no versioned bins; "
                                  f"incremental checkpoints need a KeyedOperatorLogic")
        delta, bins = self.logic.delta(since)
        log = self.output_log
        ck = ReplicaCheckpoint(node=self.node, filters=tuple(f.checkpoint() for f in self.filters),
                               sorters=None if self.sorters is None else tuple(s.checkpoint() for s in self.sorters),
                               logic=delta, output=log.items() if log is not None else [],
                               output_acked=log.acked if log is not None else NO_PUNCTUATION,
                               dead_letters=self.dead_letters())
        return ck, bins, self.logic.version()

    def dead_letters(self) -> list[DeadLetter]:
        """Every tuple this replica set aside (its logic's, filters' and sorters' letters) and every
        tuple the peers it was built from had set aside before their checkpoint
        (:attr:`inherited_letters`), merged: one :class:`~replistream.errors.DeadLetter` per
        (where, reason), each tuple id once (:func:`~replistream.errors.merge_dead_letters`).
        Dead letters are state (docs/design.md, decision 9): they travel in every checkpoint.

        >>> from replistream import Query
        >>> q = Query(); s = q.source("s", {"x": "i8"})
        >>> def inverse(b):
        ...     if (b["x"] == 0).any():
        ...         raise ZeroDivisionError("x is 0")
        ...     return {"y": 10 // b["x"]}
        >>> _ = s.map(inverse, {"y": "i8"}, name="m").sink("out"); q = q.build()
        >>> old = ReplicaCore(q, "m", channels=[1])
        >>> _ = old.process(0, 0, q.schema_of("s").from_columns({"ts": [1, 2], "x": [5, 0]}, ids=[1, 2]))
        >>> [(d.where, d.batch["id"].tolist()) for d in old.dead_letters()]
        [('m', [2])]
        >>> new = ReplicaCore.from_checkpoint(q, old.checkpoint(), channels=[1])
        >>> [(d.where, d.batch["id"].tolist()) for d in new.dead_letters()]  # the peer's, restored
        [('m', [2])]
        """
        dl = list(self.inherited_letters)
        dl.extend(self.logic.dead_letters)
        for f in self.filters or ():
            dl.extend(f.dead_letters)
        for s in self.sorters or ():
            dl.extend(s.dead_letters)
        return merge_dead_letters(dl)

    def stats(self) -> dict:
        return {"logic": self.logic.stats(), "filters": [f.stats() for f in self.filters or ()]}
