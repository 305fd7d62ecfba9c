"""Errors raised by replistream, and the dead-letter record for bad input.

Every error names what is wrong (the field, operator, parameter or input) so a
user can fix it without reading replistream's source.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class ReplistreamError(Exception):
    """Base class of every error replistream raises on purpose: catch it to catch them all.

    >>> issubclass(SchemaError, ReplistreamError) and issubclass(RunFailed, ReplistreamError)
    True
    """


class SchemaError(ReplistreamError, ValueError):
    """A batch or record does not match the declared schema of its stream.

    The message names the offending field:

    >>> from replistream import Schema
    >>> Schema({"cpu": "f8"}).from_columns({"ts": [1], "cpu": ["high"]}, "stream 'load'")
    Traceback (most recent call last):
    ...
    replistream.errors.SchemaError: stream 'load': field 'cpu' has values of dtype <U4, expected float64
    """


class QueryError(ReplistreamError, ValueError):
    """A query failed validation (cycle, arity, window parameters, schemas, node names).

    >>> from replistream import Query
    >>> q = Query("q"); _ = q.source("s", {"x": "i8"})
    >>> q.build()
    Traceback (most recent call last):
    ...
    replistream.errors.QueryError: query 'q' has no application: add .sink(name) to a stream
    """


class PunctuationViolation(ReplistreamError):
    """A tuple arrived with ``ts <= p`` after punctuation ``p`` on the same input.

    Raised only in strict mode; otherwise such tuples are counted and
    dead-lettered (see :class:`DeadLetter`).

    >>> from replistream import Schema, Punctuation
    >>> from replistream.operators import FilterLogic
    >>> s = Schema({"x": "i8"}); f = FilterLogic("f", [s], lambda b: b["x"] > 0, strict=True)
    >>> _ = f.process(0, Punctuation(5))
    >>> f.process(0, s.from_columns({"ts": [3], "x": [1]}))
    Traceback (most recent call last):
    ...
    replistream.errors.PunctuationViolation: f input 0: tuple with ts=3 arrived after punctuation 5
    """

class UserFunctionError(ReplistreamError):
    """A user function (a filter's predicate, a map's or flat map's function, a custom
    operator) failed, or returned something of the wrong length or type, and the operator's
    policy is to stop (``on_error="fail"``), or the failure cannot be pinned on input rows.

    ``operator`` names the operator, ``row`` is a sample input row it failed on (None when
    the failure is not a row's), ``cause`` the exception the function raised (or None).

    >>> e = UserFunctionError("hot", "ZeroDivisionError: division by zero", row=(5, 17, 0.0))
    >>> e.operator, str(e)
    ('hot', "operator 'hot': ZeroDivisionError: division by zero (on input row (5, 17, 0.0))")
    """

    def __init__(self, operator: str, message: str, row=None, cause: BaseException | None = None):
        self.operator, self.message, self.row, self.cause = operator, message, row, cause
        where = f" (on input row {row})" if row is not None else ""
        super().__init__(f"operator {operator!r}: {message}{where}")

    def __reduce__(self):
        """Pickled with its own arguments (and what was set on it since, e.g. ``result``), so it
        crosses processes whole: a detached deployment's host raises it to the client's ``wait()``."""
        return (type(self), (self.operator, self.message, self.row, self.cause), dict(self.__dict__))


class RunFailed(ReplistreamError):
    """A run ended without delivering everything: what was lost is named (operator, replica,
    logical time) and the run's partial result is attached (``result``) when there is one.

    Every run ends in one of two ways: complete and exact, or with this error (docs/reliability.md).

    >>> e = RunFailed("every replica of 'correlate' is lost", operator="correlate", logical_time=15_000_000)
    >>> e.operator, e.logical_time
    ('correlate', 15000000)
    """

    def __init__(self, message: str, *, operator: str | None = None, replica: str | None = None,
                 logical_time: int | None = None, result=None):
        self.operator, self.replica, self.logical_time, self.result = operator, replica, logical_time, result
        super().__init__(message)


@dataclass
class DeadLetter:
    """Tuples that were set aside rather than processed, and why.

    ``where`` names the operator (or source) and input port, ``reason`` is a
    short human-readable cause and ``batch`` holds the rejected tuples
    unchanged (a numpy structured array with ``ts`` and ``id``).

    >>> import numpy as np
    >>> dl = DeadLetter("join[0]", "late: ts <= punctuation 9", np.zeros(2, [("ts", "i8")]))
    >>> dl.count
    2
    """

    where: str
    reason: str
    batch: np.ndarray = field(repr=False)

    @property
    def count(self) -> int:
        return int(len(self.batch))


def merge_dead_letters(letters) -> list[DeadLetter]:
    """The dead letters of a run, each set-aside tuple once: the replicas of an operator set the same
    tuples aside (the same rows fail the same way on every replica, whatever its batching), so the
    engines gather every replica's letters and merge them here. One :class:`DeadLetter` per
    (``where``, ``reason``), holding each tuple id once, in order of first appearance.

    >>> import numpy as np
    >>> b = np.array([(1, 7), (2, 8)], dtype=[("ts", "i8"), ("id", "u8")])
    >>> merged = merge_dead_letters([DeadLetter("f", "raised", b), DeadLetter("f", "raised", b[1:])])
    >>> [(d.where, d.count) for d in merged]
    [('f', 2)]
    """
    groups: dict[tuple[str, str], list[np.ndarray]] = {}
    for d in letters:
        groups.setdefault((d.where, d.reason), []).append(d.batch)
    out = []
    for (where, reason), parts in groups.items():
        batch = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if "id" in (batch.dtype.names or ()) and len(parts) > 1:
            _, first = np.unique(batch["id"], return_index=True)
            batch = batch[np.sort(first)]
        out.append(DeadLetter(where, reason, batch))
    return out
