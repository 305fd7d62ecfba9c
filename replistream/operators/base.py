"""The operator contract shared by the reference engine, the Ray runtime and the simulator.

An operator's *logic* is a plain Python object: no Ray, no clock. It takes a
batch or a punctuation on input port ``i`` and returns the list of items to
emit, in order: batches (numpy structured arrays) and
:class:`~replistream.schema.Punctuation` objects. Engines differ only in how
they move those items (DESIGN.md decision 2).

:class:`OperatorLogic` implements what every operator shares:

* input checking (the batch must match the port's schema; the error names the
  field);
* the punctuation contract (Hwang §IV-A): a tuple with ``ts <= p`` after
  punctuation ``p`` on the same port is counted and dead-lettered (or raises
  :class:`~replistream.errors.PunctuationViolation` in strict mode), never
  processed;
* punctuation forwarding: the operator forwards ``p`` once every input has
  delivered at least ``p`` (the *watermark* is the minimum over inputs), after
  emitting whatever that watermark completes (closing windows).

Subclasses implement ``_on_batch(port, batch) -> list[np.ndarray]`` and,
where they hold state, ``_on_port_punctuation(port, p)`` (purge) and
``_on_watermark(wm) -> list[np.ndarray]`` (close windows).
"""
from __future__ import annotations

from typing import Union

import numpy as np

from ..errors import DeadLetter, PunctuationViolation
from ..schema import Punctuation, Schema, TS

Item = Union[np.ndarray, Punctuation]

#: Punctuation value before any punctuation arrived.
NO_PUNCTUATION = int(np.iinfo(np.int64).min)


class OperatorLogic:
    """Base class of every operator's running logic.

    ``name`` is the operator's stable id (used in ids, errors, metrics);
    ``in_schemas`` the schema of each input port; ``out_schema`` the schema of
    what it emits. With ``strict=True`` a punctuation violation raises instead
    of being dead-lettered.

    >>> from replistream.operators import FilterLogic
    >>> s = Schema({"x": "i8"})
    >>> op = FilterLogic("f", [s], lambda b: b["x"] > 0)
    >>> op.process(0, Punctuation(5))
    [Punctuation(5)]
    >>> op.process(0, s.from_columns({"ts": [3, 7], "x": [1, 1]}))[0]["ts"]
    array([7])
    >>> op.late_count
    1
    """

    #: Order-sensitive operators need their inputs sorted (Hwang §IV-C); the
    #: query builder then inserts a Sorter in front of them.
    order_sensitive: bool = False

    def __init__(self, name: str, in_schemas: list[Schema], out_schema: Schema, strict: bool = False):
        self.name = name
        self.in_schemas = list(in_schemas)
        self.out_schema = out_schema
        self.strict = strict
        self.in_punct = [NO_PUNCTUATION] * len(self.in_schemas)
        self.watermark = NO_PUNCTUATION
        self.dead_letters: list[DeadLetter] = []
        self.late_count = 0
        self.tuples_in = 0
        self.tuples_out = 0

    @property
    def n_inputs(self) -> int:
        return len(self.in_schemas)

    # -- the engine-facing API ------------------------------------------------
    def process(self, port: int, item: Item) -> list[Item]:
        """Feed one batch or punctuation on ``port``; return what to emit, in order."""
        if isinstance(item, Punctuation):
            return self.on_punctuation(port, item.p)
        return self.on_batch(port, item)

    def on_batch(self, port: int, batch: np.ndarray) -> list[Item]:
        self._check_port(port)
        batch = self.in_schemas[port].check(batch, f"{self.name} input {port}")
        batch = self._drop_late(port, batch)
        if not len(batch):
            return []
        self.tuples_in += len(batch)
        return self._tally([b for b in self._on_batch(port, batch) if len(b)])

    def on_punctuation(self, port: int, p: int) -> list[Item]:
        self._check_port(port)
        p = int(p)
        if p <= self.in_punct[port]:
            return []  # a weaker or repeated promise says nothing new
        self.in_punct[port] = p
        out: list[Item] = list(self._on_port_punctuation(port, p))
        wm = min(self.in_punct)
        if wm > self.watermark:
            out.extend(b for b in self._on_watermark(wm) if len(b))
            self.watermark = wm
            out.append(Punctuation(wm))
        return self._tally(out)

    # -- hooks for subclasses -------------------------------------------------
    def _on_batch(self, port: int, batch: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _on_port_punctuation(self, port: int, p: int) -> list[np.ndarray]:
        return []

    def _on_watermark(self, wm: int) -> list[np.ndarray]:
        return []

    # -- helpers --------------------------------------------------------------
    def _check_port(self, port: int) -> None:
        if not 0 <= port < len(self.in_schemas):
            raise ValueError(f"operator {self.name!r} has {len(self.in_schemas)} input(s); got input {port}")

    def _drop_late(self, port: int, batch: np.ndarray) -> np.ndarray:
        p = self.in_punct[port]
        if p == NO_PUNCTUATION:
            return batch
        late = batch[TS] <= p
        if not late.any():
            return batch
        where = f"{self.name} input {port}"
        if self.strict:
            ts = int(batch[TS][late][0])
            raise PunctuationViolation(f"{where}: tuple with ts={ts} arrived after punctuation {p}")
        self.late_count += int(late.sum())
        self.dead_letters.append(DeadLetter(where, f"late: ts <= punctuation {p}", batch[late]))
        return batch[~late]

    def _tally(self, out: list[Item]) -> list[Item]:
        for item in out:
            if not isinstance(item, Punctuation):
                self.tuples_out += len(item)
        return out

    def stats(self) -> dict:
        """Counters for metrics and tests."""
        return {
            "name": self.name,
            "tuples_in": self.tuples_in,
            "tuples_out": self.tuples_out,
            "late": self.late_count,
            "watermark": self.watermark,
        }
