"""Errors raised by replistream, and the dead-letter record for bad input.

Every error names what is wrong (the field, operator, parameter or input) so a
user can fix it without reading replistream's source.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class ReplistreamError(Exception):
    """Base class of every error replistream raises on purpose."""


class SchemaError(ReplistreamError, ValueError):
    """A batch or record does not match the declared schema of its stream.

    The message names the offending field, e.g.::

        SchemaError: stream 'load': field 'cpu' has dtype <U3, expected float64
    """


class QueryError(ReplistreamError, ValueError):
    """A query failed validation (cycle, arity, window parameters, schemas)."""


class PunctuationViolation(ReplistreamError):
    """A tuple arrived with ``ts <= p`` after punctuation ``p`` on the same input.

    Raised only in strict mode; otherwise such tuples are counted and
    dead-lettered (see :class:`DeadLetter`).
    """


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
