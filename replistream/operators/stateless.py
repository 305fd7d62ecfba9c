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

from ..errors import SchemaError, UserFunctionError
from ..ids import mix
from ..schema import ID, TS, Schema
from .base import OperatorLogic


def _columns(result, out_schema: Schema, n: int, where: str, operator: str) -> np.ndarray:
    """Assemble a user function's result into a batch of ``out_schema`` (ts/id filled later); a result
    of the wrong type, fields or length is a :class:`~replistream.errors.UserFunctionError`."""
    if isinstance(result, np.ndarray) and result.dtype.names is not None:
        result = {name: result[name] for name in result.dtype.names}
    if not isinstance(result, Mapping):
        raise UserFunctionError(operator, f"{where}: function must return a mapping of field to array or a "
                                          f"structured array, got {type(result).__name__}")
    for reserved in (TS, ID):
        if reserved in result:
            raise UserFunctionError(operator, f"{where}: function returned {reserved!r}; timestamps and ids are "
                                              f"kept by replistream")
    cols = dict(result)
    for name, col in cols.items():
        length = np.shape(col)[0] if np.ndim(col) else None
        if length != n:
            raise UserFunctionError(operator, f"{where}: function returned {length} value(s) for field {name!r} "
                                              f"on a batch of {n} row(s); it must return one per row")
    cols[TS] = np.zeros(n, dtype=np.int64)
    try:
        return out_schema.from_columns(cols, where)
    except SchemaError as e:
        raise UserFunctionError(operator, str(e)) from e


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
        def check(result, lo, hi):
            mask = np.asarray(result)
            if mask.shape != (hi - lo,) or mask.dtype != np.bool_:
                raise UserFunctionError(self.name, f"filter predicate must return a boolean array of length "
                                                   f"{hi - lo}, got dtype {mask.dtype} shape {mask.shape}")
            return batch[lo:hi][mask]

        return self.apply_user(self.predicate, batch, check, "predicate")


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
        def check(result, lo, hi):
            out = _columns(result, self.out_schema, hi - lo, f"map {self.name!r}", self.name)
            out[TS] = batch[TS][lo:hi]
            out[ID] = batch[ID][lo:hi]
            return out

        return self.apply_user(self.fn, batch, check, "map function")


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
        return self.apply_user(self.fn, batch, lambda result, lo, hi: self._expand(batch[lo:hi], result),
                               "flat_map function")

    def _expand(self, batch, result):
        where = f"flat_map {self.name!r}"
        if not (isinstance(result, tuple) and len(result) == 2):
            raise UserFunctionError(self.name, f"{where}: function must return (parent_index, columns)")
        parent = np.asarray(result[0])
        if parent.ndim != 1 or parent.dtype.kind not in "iu":
            raise UserFunctionError(self.name, f"{where}: parent_index must be a 1-D integer array")
        if len(parent) and (parent.min() < 0 or parent.max() >= len(batch)):
            raise UserFunctionError(self.name, f"{where}: parent_index refers to rows outside the input batch")
        out = _columns(result[1], self.out_schema, len(parent), where, self.name)
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
        return out


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
