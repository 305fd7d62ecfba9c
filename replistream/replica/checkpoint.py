"""A replica's hand-over checkpoint (docs/design.md, decision 7; docs/handover.md)."""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field

from ..operators.base import NO_PUNCTUATION, CheckpointError, OperatorState
from ..schema import Punctuation

__all__ = ["CHECKPOINT_VERSION", "ReplicaCheckpoint"]

#: Version of :class:`ReplicaCheckpoint`; :meth:`ReplicaCore.from_checkpoint` reads only this one.
CHECKPOINT_VERSION = 1


@dataclass
class ReplicaCheckpoint:
    """A replica's hand-over checkpoint (docs/design.md, decision 7; docs/handover.md).

    * ``filters``: per input port, a :class:`~replistream.operators.dupfilter.FilterState`:
      the peer's maximum punctuation ``p`` and the ids (with ts) of the tuples with
      ``ts > p`` it has already applied;
    * ``sorters``: the sorters' states where the query sorts this node's inputs;
    * ``logic``: the operator's :class:`~replistream.operators.base.OperatorState`
      (keyed state in bins by key hash, Megaphone §3.4);
    * ``output``, ``output_acked``: the peer's retained output since the last
      punctuation all its live downstream replicas acknowledged; the new replica
      adopts it as its own replay buffer, so it is as good an upstream replica as
      the peer was;
    * ``dead_letters``: every tuple the peer (its filters, sorters and logic, and
      the peers it was itself built from) set aside so far, merged
      (:func:`~replistream.errors.merge_dead_letters`: one
      :class:`~replistream.errors.DeadLetter` per (where, reason), each id once).
      Dead letters are state (docs/design.md, decision 9): the new replica skips
      every tuple the checkpoint reflects, so it would never set those aside
      itself; it restores them and reports them as its own. A step of a staged
      transfer carries all of them, whatever its bins (docs/handover.md).

    Plain data (numpy arrays, ints, strings, Punctuation): ``to_bytes`` pickles it.
    A checkpoint pickled before ``dead_letters`` existed loads with none.

    >>> from replistream import Query, Punctuation
    >>> from replistream.replica import ReplicaCore
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.window(size=10, by="k", name="window").sink("out"); q = q.build()
    >>> core = ReplicaCore(q, "window", channels=[2], retain=True)
    >>> b = q.schema_of("s").from_columns({"ts": [3, 4], "k": [1, 2]}, ids=[1, 2])
    >>> _ = core.process(0, 0, Punctuation(2)); _ = core.process(0, 0, b)
    >>> ck = core.checkpoint()
    >>> ck.punctuation, ck.filters[0].applied, ck.logic.rows("windows")
    ((2,), 2, 2)
    >>> ReplicaCheckpoint.from_bytes(ck.to_bytes()).node
    'window'
    >>> ck.dead_letters
    []
    """

    node: str
    filters: tuple
    sorters: tuple | None
    logic: OperatorState
    output: list = field(default_factory=list)
    output_acked: int = NO_PUNCTUATION
    version: int = CHECKPOINT_VERSION
    dead_letters: list = field(default_factory=list)

    def __setstate__(self, state: dict) -> None:
        # a checkpoint pickled before ``dead_letters`` existed (same version: the field only adds)
        state.setdefault("dead_letters", [])
        self.__dict__.update(state)

    @property
    def punctuation(self) -> tuple[int, ...]:
        """The peer's maximum punctuation ``p`` on each input port."""
        return tuple(f.max_punct for f in self.filters)

    def nbytes(self) -> int:
        """Bytes of array data in the checkpoint (the pickle adds a little framing)."""
        n = self.logic.nbytes() + sum(f.nbytes() for f in self.filters)
        n += sum(s.nbytes() for s in self.sorters or ())
        n += sum(d.batch.nbytes for d in self.dead_letters)
        return n + sum(it.nbytes for it in self.output if not isinstance(it, Punctuation))

    def to_bytes(self) -> bytes:
        """The checkpoint as bytes (pickle protocol 5: each array one contiguous buffer)."""
        return pickle.dumps(self, protocol=5)

    @staticmethod
    def from_bytes(data: bytes) -> "ReplicaCheckpoint":
        ck = pickle.loads(data)
        if not isinstance(ck, ReplicaCheckpoint):
            raise CheckpointError(f"not a ReplicaCheckpoint: {type(ck).__name__}")
        return ck

    def summary(self) -> dict:
        """Sizes for logs and benchmarks."""
        return {"node": self.node, "punctuation": list(self.punctuation),
                "applied": sum(f.applied for f in self.filters), "state_rows": self.logic.rows(),
                "sorted_rows": sum(s.rows() for s in self.sorters or ()),
                "output_items": len(self.output), "dead_letters": sum(d.count for d in self.dead_letters),
                "bytes": self.nbytes()}
