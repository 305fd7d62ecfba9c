"""What an engine run delivered: one result type for every engine.

The reference engine, the in-process replicated engine, a Ray deployment and
the simulator all return a :class:`RunResult`: per application its tuples in
arrival order, the last punctuation it received, every dead-lettered tuple,
and, for the engines with a clock, when each tuple arrived.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..errors import DeadLetter
from ..operators.base import NO_PUNCTUATION, Item
from ..schema import END, TS, Punctuation

__all__ = ["RunResult", "Collector", "as_multiset", "multiset_diff", "format_rows", "dead_letter_summary", "TIME_FIELDS",
           "latency_s"]


def latency_s(arrivals: np.ndarray, ts: np.ndarray, ts0: int, pace: float = 1.0) -> np.ndarray:
    """Latency in seconds of tuples with timestamps ``ts`` (microseconds) that arrived at run
    times ``arrivals`` (seconds): arrival minus the timestamp mapped to run time,
    ``(ts - ts0) / (1e6 * pace)`` (Hwang §VI-B).

    >>> latency_s(np.array([1.5, 2.25]), np.array([1_000_000, 2_000_000]), ts0=0)
    array([0.5 , 0.25])
    """
    return arrivals - (ts - ts0) / (1e6 * (pace or 1.0))


@dataclass(repr=False)
class RunResult:
    """What an engine run delivered.

    * ``outputs[app]``: the application's tuples in arrival order (one structured array);
    * ``punctuation[app]``: the last punctuation it received (``END`` when it completed);
    * ``dead_letters``: every set-aside tuple, with where and why;
    * ``arrivals[app]``: when each tuple arrived, in seconds since the run started
      (wall time on Ray, virtual time in the simulator; empty for engines without a clock);
    * ``ts0`` and ``pace``: the event time replayed at the start and how many event
      seconds pass per second, so :meth:`latencies` can map timestamps to run time;
    * ``end_time``: seconds from the start to the last event; ``events``: failures,
      hand-overs and other things that happened; ``links``: per stream replica, what it
      carried; ``metrics``: a deployment's metrics; ``stats``: engine-specific figures.

    >>> r = RunResult({"a": np.zeros(0, dtype=[("ts", "i8")])}, {"a": END})
    >>> r.complete, r.dead_letter_count(), r.latencies("a")[1].size
    (True, 0, 0)
    """

    outputs: dict[str, np.ndarray]
    punctuation: dict[str, int] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    arrivals: dict[str, np.ndarray] = field(default_factory=dict)
    ts0: int = 0
    pace: float | None = 1.0
    end_time: float = 0.0
    events: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """Per application (by name) its tuple count and column names, whether the run completed, and the dead
        letters; :meth:`show` prints the tuples themselves.

        >>> from replistream import Schema
        >>> b = Schema({"x": "i8"}).from_columns({"ts": [1_000_000, 2_000_000], "x": [5, 7]})
        >>> RunResult({"a": b}, {"a": END})
        RunResult(complete; a: 2 tuples (ts, x); 0 dead letters)
        """
        apps = "; ".join(f"{app}: {len(out):,} tuple{'' if len(out) == 1 else 's'} "
                         f"({', '.join(n for n in (out.dtype.names or ()) if n != 'id')})"
                         for app, out in sorted(self.outputs.items()))
        state = "complete" if self.complete else "incomplete"
        dead = self.dead_letter_count()
        return f"RunResult({state}; {apps or 'no applications'}; {dead:,} dead letter{'' if dead == 1 else 's'})"

    @property
    def complete(self) -> bool:
        """True when every application received the final punctuation."""
        return all(p == END for p in self.punctuation.values())

    def dead_letter_count(self) -> int:
        """Tuples set aside over the whole run."""
        return sum(d.count for d in self.dead_letters)

    def latencies(self, app: str) -> tuple[np.ndarray, np.ndarray]:
        """(arrival time s, latency s) of every tuple application ``app`` received: arrival minus
        the tuple's timestamp mapped to run time, ``(ts - ts0) / (1e6 * pace)`` (Hwang §VI-B)."""
        if app not in self.outputs:
            raise KeyError(f"{app!r} is not an application of this run; applications: {sorted(self.outputs)}")
        out = self.outputs[app]
        arr = self.arrivals.get(app, np.zeros(0))
        if not len(out) or len(arr) != len(out):
            return arr, np.zeros(0)
        return arr, latency_s(arr, out[TS], self.ts0, self.pace)

    def show(self, app: str, n: int = 10, columns: list[str] | None = None) -> str:
        """The first ``n`` tuples ``app`` received (by timestamp, ties by id, so every engine shows the
        same rows), as a readable table with named columns and times in seconds (:func:`format_rows`).

        >>> from replistream import Schema
        >>> b = Schema({"x": "i8"}).from_columns({"ts": [2_500_000, 1_000_000], "x": [7, 5]})
        >>> print(RunResult({"a": b}, {"a": END}).show("a"))
        ts (s)  x
             1  5
           2.5  7
        """
        if app not in self.outputs:
            raise KeyError(f"{app!r} is not an application of this run; applications: {sorted(self.outputs)}")
        out = self.outputs[app]
        # by timestamp, ties by id: the same order whatever order the tuples arrived in
        order = np.lexsort((out["id"], out[TS])) if "id" in (out.dtype.names or ()) else \
            np.argsort(out[TS], kind="stable")
        return format_rows(out[order][:n], columns)

    def to_pandas(self, app: str):
        """The tuples ``app`` received as a pandas DataFrame, in arrival order, with ``ts`` also as a
        datetime column ``time`` (µs since the epoch) and, with a clock, ``arrival_s``.

        >>> from replistream import Schema
        >>> b = Schema({"x": "i8"}).from_columns({"ts": [1_000_000], "x": [5]})
        >>> RunResult({"a": b}, {"a": END}).to_pandas("a")[["time", "x"]].to_dict("records")
        [{'time': Timestamp('1970-01-01 00:00:01'), 'x': 5}]
        """
        import pandas as pd

        out = self.outputs[app]
        df = pd.DataFrame({name: out[name] for name in out.dtype.names})
        df.insert(1, "time", pd.to_datetime(out[TS], unit="us"))
        arr = self.arrivals.get(app)
        if arr is not None and len(arr) == len(out):
            df["arrival_s"] = arr
        return df

    def dead_letter_summary(self) -> dict[tuple[str, str], int]:
        """Set-aside tuples counted per (where, reason) (:func:`dead_letter_summary`)."""
        return dead_letter_summary(self.dead_letters)


def dead_letter_summary(letters: Iterable[DeadLetter]) -> dict[tuple[str, str], int]:
    """Set-aside tuples counted per (where, reason), largest first: what a report prints.

    >>> dead_letter_summary([DeadLetter("f", "predicate raised ValueError: x", np.zeros(3, [("ts", "i8")]))])
    {('f', 'predicate raised ValueError: x'): 3}
    """
    counts: Counter = Counter()
    for d in letters:
        counts[(d.where, d.reason)] += d.count
    return dict(counts.most_common())


TIME_FIELDS = (TS, "window_start", "window_end")
"""Fields holding microsecond timestamps, which :func:`format_rows` shows in seconds (a window's bounds too)."""


def format_rows(batch: np.ndarray, columns: list[str] | None = None) -> str:
    """Tuples as a plain-text table: named columns, ``ts`` and window bounds in seconds, floats to 4
    significant digits, ``id`` left out unless asked for.

    >>> from replistream import Schema
    >>> print(format_rows(Schema({"cpu": "f8"}).from_columns({"ts": [1_500_000], "cpu": [0.912345]})))
    ts (s)     cpu
       1.5  0.9123
    """
    names = [n for n in (columns or batch.dtype.names) if columns or n != "id"]
    times = {n for n in names if n in TIME_FIELDS and np.issubdtype(batch.dtype[n], np.integer)}
    head = [f"{n} (s)" if n in times else n for n in names]
    cells = []
    for row in batch:
        line = []
        for n in names:
            v = row[n]
            if n in times:
                line.append(f"{int(v) / 1e6:g}")
            elif isinstance(v, (float, np.floating)):
                line.append(f"{float(v):.4g}")
            else:
                line.append(str(v.item() if hasattr(v, "item") else v))
        cells.append(line)
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


class Collector:
    """An application's output as an engine without a clock gathers it: batches and the last
    punctuation.

    >>> from replistream import Schema
    >>> s = Schema({"x": "i8"}); c = Collector(s)
    >>> c.add([s.from_columns({"ts": [1], "x": [2]}), Punctuation(3)])
    >>> len(c.result()), c.punctuation
    (1, 3)
    """

    def __init__(self, schema):
        self.schema = schema
        self.batches: list[np.ndarray] = []
        self.punctuation = NO_PUNCTUATION

    def add(self, items: Iterable[Item]) -> None:
        for it in items:
            if isinstance(it, Punctuation):
                self.punctuation = max(self.punctuation, it.p)
            elif len(it):
                self.batches.append(it)

    def result(self) -> np.ndarray:
        return np.concatenate(self.batches) if self.batches else self.schema.empty()


# -- comparing outputs -----------------------------------------------------------------

def as_multiset(batch: np.ndarray) -> Counter:
    """The rows of ``batch`` as a multiset, keyed by their exact bytes (ts, id and values).

    >>> b = np.array([(1, 5, 0.5), (1, 5, 0.5)], dtype=[("ts", "i8"), ("id", "u8"), ("v", "f8")])
    >>> list(as_multiset(b).values())
    [2]
    """
    if batch.dtype.hasobject:
        return Counter(tuple(repr(v) for v in row) for row in batch.tolist())
    packed = np.ascontiguousarray(batch).view(np.dtype((np.void, batch.dtype.itemsize)))
    return Counter(packed.tolist())


def multiset_diff(expected: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows missing from ``actual``, rows in ``actual`` not expected), with multiplicity."""
    e, a = as_multiset(expected), as_multiset(actual)
    missing, extra = e - a, a - e

    def rows(c: Counter, like: np.ndarray) -> np.ndarray:
        if like.dtype.hasobject:
            return like[:0]
        keys = [k for k, n in c.items() for _ in range(n)]
        if not keys:
            return like[:0]
        return np.frombuffer(b"".join(keys), dtype=like.dtype)

    return rows(missing, expected), rows(extra, actual)
