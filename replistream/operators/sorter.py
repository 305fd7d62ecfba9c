"""Sorter: release tuples in (timestamp, id) order up to each punctuation (Hwang §IV-C).

Ids are unique per logical tuple and computed identically by every replica
(docs/design.md, decision 1), so ``(ts, id)`` is the unique tie-break the paper asks
for: every replica of an order-sensitive operator sees its input in the same
order. The price is delay up to the next punctuation, so the query builder
inserts a Sorter only in front of order-sensitive operators and applications.
"""
from __future__ import annotations

import numpy as np

from ..schema import ID, TS, Schema
from .base import OperatorLogic


def canonical_order(batch: np.ndarray) -> np.ndarray:
    """Indices that sort ``batch`` by (ts, id).

    >>> b = np.array([(2, 1), (1, 9), (1, 3)], dtype=[("ts", "i8"), ("id", "u8")])
    >>> canonical_order(b).tolist()
    [2, 1, 0]
    """
    return np.lexsort((batch[ID], batch[TS]))


class SorterLogic(OperatorLogic):
    """Buffers its input and, on punctuation ``p``, emits every tuple with
    ``ts <= p`` sorted by (ts, id), then ``p`` (Hwang §IV-C).

    >>> from replistream.schema import Punctuation
    >>> s = Schema({"x": "i8"})
    >>> so = SorterLogic("sort", [s])
    >>> so.process(0, s.from_columns({"ts": [5, 3, 9], "x": [0, 1, 2]}, ids=[1, 2, 3]))
    []
    >>> out = so.process(0, Punctuation(6)); out[0]["ts"].tolist(), out[1]
    ([3, 5], Punctuation(6))

    Its checkpoint is the buffer (tuples above the watermark), unkeyed:

    >>> SorterLogic("sort", [s]).restore(so.checkpoint()).buffered
    1
    """

    def __init__(self, name: str, in_schemas: list[Schema], strict: bool = False):
        super().__init__(name, in_schemas, in_schemas[0], strict)
        self._buffer: list[np.ndarray] = []

    def _on_batch(self, port, batch):
        self._buffer.append(batch)
        return []

    def release(self, wm: int) -> np.ndarray:
        """Remove and return buffered tuples with ts <= wm, in (ts, id) order."""
        if not self._buffer:
            return self.out_schema.empty()
        buf = self._buffer[0] if len(self._buffer) == 1 else np.concatenate(self._buffer)
        ready = buf[TS] <= wm
        if ready.all():
            self._buffer = []
            out = buf
        else:
            self._buffer = [buf[~ready]]
            out = buf[ready]
        return out[canonical_order(out)]

    def _on_watermark(self, wm):
        return [self.release(wm)]

    # -- hand-over: the buffered tuples (ts > watermark), unkeyed, in bin 0 --
    def _state_tables(self, keyed):
        buf = self._buffer[0] if len(self._buffer) == 1 else (
            np.concatenate(self._buffer) if self._buffer else self.out_schema.empty())
        return {"buffer": ({"rows": buf}, None)}

    def _restore_tables(self, tables):
        rows = tables["buffer"]["rows"]
        self._buffer = [self.in_schemas[0].check(rows, f"{self.name} checkpoint")] if len(rows) else []

    @property
    def buffered(self) -> int:
        return sum(len(b) for b in self._buffer)
