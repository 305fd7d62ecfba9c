"""Stateless operators: Filter, Map, FlatMap, Union (Hwang §IV-D).

Each processes every tuple on its own, so it is replica consistent whatever
the input order. Their only state is the punctuation bookkeeping of
:class:`~replistream.operators.base.OperatorLogic` (``stateless = True``), so a
hand-over checkpoint of one is a few integers. User functions are *vectorised*: they take a whole batch (a
numpy structured array) and return arrays, so no Python runs per tuple.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..errors import SchemaError
from ..ids import mix
from ..schema import ID, TS, Schema
from .base import OperatorLogic


def _columns(result, out_schema: Schema, n: int, where: str) -> np.ndarray:
    """Assemble a user function's result into a batch of ``out_schema`` (ts/id filled later)."""
    if isinstance(result, np.ndarray) and result.dtype.names is not None:
        result = {name: result[name] for name in result.dtype.names}
    if not isinstance(result, Mapping):
        raise SchemaError(f"{where}: function must return a mapping of field to array or a structured array, "
                          f"got {type(result).__name__}")
    for reserved in (TS, ID):
        if reserved in result:
            raise SchemaError(f"{where}: function returned {reserved!r}; timestamps and ids are kept by replistream")
    cols = dict(result)
    cols[TS] = np.zeros(n, dtype=np.int64)
    return out_schema.from_columns(cols, where)


class FilterLogic(OperatorLogic):
    """Filter: forward each tuple for which ``predicate(batch)`` is true (Hwang §IV-D).

    ``predicate`` takes a batch and returns a boolean array of the same length.
    Ids are kept.

    >>> s = Schema({"x": "i8"})
    >>> f = FilterLogic("f", [s], lambda b: b["x"] % 2 == 0)
    >>> f.process(0, s.from_columns({"ts": [1, 2, 3], "x": [1, 2, 4]}))[0]["x"]
    array([2, 4])
    """

    stateless = True  # checkpoint/restore carry only the punctuation bookkeeping

    def __init__(self, name: str, in_schemas: list[Schema], predicate: Callable, strict: bool = False):
        super().__init__(name, in_schemas, in_schemas[0], strict)
        self.predicate = predicate

    def _on_batch(self, port, batch):
        mask = np.asarray(self.predicate(batch))
        if mask.shape != (len(batch),) or mask.dtype != np.bool_:
            raise SchemaError(f"filter {self.name!r}: predicate must return a boolean array of length {len(batch)}, "
                              f"got dtype {mask.dtype} shape {mask.shape}")
        return [batch[mask]]


class MapLogic(OperatorLogic):
    """Map: convert each tuple into another (Hwang §IV-D), keeping ``ts`` and ``id``.

    ``fn(batch)`` returns a mapping of output field to array (or a structured
    array) with one row per input row, matching ``out_schema``.

    >>> s = Schema({"x": "i8"})
    >>> m = MapLogic("m", [s], lambda b: {"y": b["x"] * 10.0}, Schema({"y": "f8"}))
    >>> m.process(0, s.from_columns({"ts": [1], "x": [4]}))[0]["y"]
    array([40.])
    """

    stateless = True  # checkpoint/restore carry only the punctuation bookkeeping

    def __init__(self, name, in_schemas, fn: Callable, out_schema: Schema, strict: bool = False):
        super().__init__(name, in_schemas, out_schema, strict)
        self.fn = fn

    def _on_batch(self, port, batch):
        out = _columns(self.fn(batch), self.out_schema, len(batch), f"map {self.name!r}")
        out[TS] = batch[TS]
        out[ID] = batch[ID]
        return [out]


class FlatMapLogic(OperatorLogic):
    """FlatMap: each input tuple yields zero or more output tuples.

    ``fn(batch)`` returns ``(parent, columns)``: ``parent[i]`` is the input row
    that output row ``i`` comes from, ``columns`` the output fields. An output
    tuple keeps its parent's ``ts``; its id is ``mix(parent id, index among the
    parent's outputs)``, so every replica names it the same.

    >>> s = Schema({"n": "i8"})
    >>> def explode(b):
    ...     parent = np.repeat(np.arange(len(b)), b["n"])
    ...     return parent, {"k": np.concatenate([np.arange(n) for n in b["n"]])}
    >>> fm = FlatMapLogic("fm", [s], explode, Schema({"k": "i8"}))
    >>> fm.process(0, s.from_columns({"ts": [1, 2], "n": [2, 1]}))[0]["k"]
    array([0, 1, 0])
    """

    stateless = True  # checkpoint/restore carry only the punctuation bookkeeping

    def __init__(self, name, in_schemas, fn: Callable, out_schema: Schema, strict: bool = False):
        super().__init__(name, in_schemas, out_schema, strict)
        self.fn = fn

    def _on_batch(self, port, batch):
        result = self.fn(batch)
        where = f"flat_map {self.name!r}"
        if not (isinstance(result, tuple) and len(result) == 2):
            raise SchemaError(f"{where}: function must return (parent_index, columns)")
        parent = np.asarray(result[0])
        if parent.ndim != 1 or parent.dtype.kind not in "iu":
            raise SchemaError(f"{where}: parent_index must be a 1-D integer array")
        if len(parent) and (parent.min() < 0 or parent.max() >= len(batch)):
            raise SchemaError(f"{where}: parent_index refers to rows outside the input batch")
        out = _columns(result[1], self.out_schema, len(parent), where)
        out[TS] = batch[TS][parent]
        # index of each output among its parent's outputs, in the order returned
        order = np.argsort(parent, kind="stable")
        sp = parent[order]
        start = np.r_[0, np.flatnonzero(sp[1:] != sp[:-1]) + 1]
        run = np.zeros(len(sp), dtype=np.int64)
        if len(sp):
            run_id = np.zeros(len(sp), dtype=np.int64)
            run_id[start[1:]] = 1
            run_id = np.cumsum(run_id)
            run = np.arange(len(sp)) - start[run_id]
        ordinal = np.empty(len(sp), dtype=np.uint64)
        ordinal[order] = run.astype(np.uint64)
        out[ID] = mix(batch[ID][parent], ordinal)
        return [out]


class UnionLogic(OperatorLogic):
    """Union of n inputs with equal schemas (Hwang §IV-D).

    Output ids are ``mix(id, input port)``, so a tuple that reaches the Union
    on two inputs stays two logical tuples, as it would in the ideal run.

    >>> s = Schema({"x": "i8"})
    >>> u = UnionLogic("u", [s, s])
    >>> len(u.process(1, s.from_columns({"ts": [1], "x": [1]}))[0])
    1
    """

    stateless = True  # checkpoint/restore carry only the punctuation bookkeeping

    def __init__(self, name, in_schemas, strict: bool = False):
        super().__init__(name, in_schemas, in_schemas[0], strict)
        self._port_salt = [np.uint64(i + 1) for i in range(len(in_schemas))]

    def _on_batch(self, port, batch):
        out = batch.copy()
        out[ID] = mix(batch[ID], self._port_salt[port])
        return [out]
