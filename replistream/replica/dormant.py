"""Dormant replicas kept fresh by incremental checkpoints (Del Monte 2017, docs/migration.md)."""
from __future__ import annotations

from typing import Iterable

from ..operators.base import CheckpointError
from ..query import Query
from .checkpoint import ReplicaCheckpoint
from .core import ReplayLog, ReplicaCore

__all__ = ["DormantReplica"]


class DormantReplica:
    """A dormant copy of a replica's keyed state, kept fresh by incremental checkpoints (Del Monte 2017).

    It holds an operator logic restored from one full checkpoint of an active
    replica and, at each :meth:`refresh`, replaces the bins changed since its
    version (:meth:`ReplicaCore.delta_checkpoint`). It processes no input.
    :meth:`revive` turns it into a running replica from one last delta: that
    delta's filter state, pending work and changed bins, the rest already held,
    then the usual replay (docs/handover.md), so reviving ships only what
    changed since the last refresh.

    >>> from replistream import Query, Punctuation
    >>> from replistream.operators.keyed import KeyedCount
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.apply(KeyedCount(by="k", bits=4), name="c").sink("out"); q = q.build()
    >>> live = ReplicaCore(q, "c", channels=[1], retain=True)
    >>> b = q.schema_of("s").from_columns({"ts": [1, 2], "k": [1, 2]}, ids=[1, 2])
    >>> _ = live.process(0, 0, b); _ = live.process(0, 0, Punctuation(2))
    >>> dormant = DormantReplica(q, live.checkpoint(4), live.logic.version())
    >>> _ = live.process(0, 0, q.schema_of("s").from_columns({"ts": [3], "k": [1]}, ids=[3]))
    >>> _ = live.process(0, 0, Punctuation(3))
    >>> ck, bins, v = live.delta_checkpoint(dormant.version); len(bins), ck.logic.rows("state")
    (1, 1)
    >>> core = dormant.revive(ck, bins, v, channels=[1])
    >>> sorted(core.logic.checkpoint().tables["state"]["count"].tolist())
    [1, 2]
    """

    def __init__(self, query: Query, checkpoint: ReplicaCheckpoint, version: int, strict: bool = False):
        self.query, self.node, self.strict = query, checkpoint.node, strict
        self.logic = query.build_logic(self.node, strict).restore(checkpoint.logic)
        if not hasattr(self.logic, "apply_delta"):
            raise CheckpointError(f"{self.node!r}: {type(self.logic).__name__} cannot take incremental deltas")
        self.version = int(version)
        self.refreshes = 0
        self.letters = list(checkpoint.dead_letters)  # the latest dead letters of the live replica

    def refresh(self, delta: ReplicaCheckpoint, bins: Iterable[int], version: int) -> None:
        """Apply an incremental checkpoint taken since :attr:`version` (its filters and output are not
        kept; its dead letters, all the live replica's, replace :attr:`letters`)."""
        self.logic.apply_delta(delta.logic, bins)
        self.letters = list(delta.dead_letters)
        self.version = int(version)
        self.refreshes += 1

    def revive(self, delta: ReplicaCheckpoint, bins: Iterable[int], version: int, channels: list[int],
               retain: bool = True) -> ReplicaCore:
        """A running replica from the last delta: its filters (p and applied ids), sorters, retained
        output, dead letters (every one the live replica holds: a delta carries them all, so the
        revived replica reports what its peer set aside) and changed bins, on top of the state
        this copy holds."""
        self.refresh(delta, bins, version)
        core = ReplicaCore(self.query, self.node, channels, self.strict, retain)
        for f, st in zip(core.filters, delta.filters):
            f.restore(st)
        for srt, st in zip(core.sorters or (), delta.sorters or ()):
            srt.restore(st)
        core.logic = self.logic
        if core.output_log is not None:
            core.output_log = ReplayLog(delta.output, delta.output_acked)
        core.restore_letters(self.letters)
        return core
