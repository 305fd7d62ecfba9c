"""Per-server CPU model of the simulator (Hwang §VI-D, Table I).

Every simulated server has one CPU that serves the packets delivered to the
replicas it hosts, one at a time, in arrival order. Processing a packet of
``n`` tuples at a replica of an operator of kind ``kind`` costs::

    cost_s = (per_packet_us + per_copy_us[kind] * n) * 1e-6 * slowdown(server, t)

``n`` counts every copy that arrives, duplicates included: the per-replica
cost growth with the degree of replication in Table I is the cost of
receiving and filtering k copies of every tuple. A packet waits while the
server is busy, so an overloaded server delays its outputs; a ``slow_server``
scenario event multiplies the cost (``NetworkConditions.slowdown``).

Defaults come from the Ray runtime's own measurement (``bench/runtime.py``,
"CPU per replica by degree of replication", re-run at commit ``b401f25``,
docs/benchmarks.md): raw CPU seconds per replica for 10 s of input at k =
1..4. :func:`fit_costs` fits ``cpu_s = tuples_in * k * per_copy`` by least
squares through those four points per operator; ``per_packet_us`` is an
assumption (the runtime's cost is largely per packet, but the benchmark did
not separate the two). A measured figure is quoted below, never invented:
:data:`MEASURED_CPU_S` is that table.

>>> m = CpuModel()
>>> round(m.cost("union", 1000), 5) > 0
True
>>> CpuModel(per_copy_us={"union": 1.0}, per_packet_us=0.0).cost("union", 1000)
0.001
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

__all__ = ["CpuModel", "MEASURED_CPU_S", "TABLE1_INPUT_TUPLES", "PAPER_TABLE1", "PAPER_TABLE1_RATIOS", "fit_costs", "operator_kind"]

#: Raw CPU seconds per replica measured on the Ray runtime, k = 1..4, 20k tuples/s
#: for 10 s (docs/benchmarks.md, "Re-run after the runtime fixes (commit b401f25)").
MEASURED_CPU_S: dict[str, tuple[float, float, float, float]] = {
    "union": (0.31, 0.47, 0.61, 0.91),
    "filter": (0.30, 0.50, 0.63, 0.97),
    "join": (0.47, 0.64, 0.75, 1.01),
    "aggregate": (0.28, 0.32, 0.33, 0.42),
}

#: Logical tuples into one replica of each operator in that benchmark (bench/runtime.py,
#: ``table1_workload``: 4 sources at 5k tuples/s for 10 s; union(a, b) -> filter -> join
#: with c; d -> aggregate).
TABLE1_INPUT_TUPLES: dict[str, int] = {"union": 100_000, "filter": 100_000, "join": 150_000, "aggregate": 50_000}

#: Hwang et al. 2008, Table I: % CPU cycles per replica, no replication and k = 1..4.
PAPER_TABLE1: dict[str, tuple[float, ...]] = {
    "union": (0.7, 1.1, 1.8, 2.7, 3.5),
    "filter": (0.8, 1.2, 1.9, 2.8, 3.6),
    "aggregate": (2.3, 2.7, 3.6, 4.4, 5.2),
    "join": (9.5, 10.3, 10.8, 11.6, 12.3),
}

#: The ratios Table I prints beside its k = 1..4 figures (relative to no replication; they were
#: computed from unrounded measurements, so they differ a little from the rounded percentages).
PAPER_TABLE1_RATIOS: dict[str, tuple[float, ...]] = {
    "union": (1.43, 2.57, 3.86, 5.00),
    "filter": (1.38, 2.37, 3.50, 4.50),
    "aggregate": (1.17, 1.57, 1.92, 2.26),
    "join": (1.08, 1.14, 1.22, 1.29),
}


def fit_costs(measured: Mapping[str, tuple[float, ...]] = MEASURED_CPU_S,
              tuples: Mapping[str, int] = TABLE1_INPUT_TUPLES) -> dict[str, float]:
    """Microseconds per arriving tuple copy, fitted through the origin per operator.

    A replica at degree k receives ``k * tuples`` copies; the least-squares slope
    of CPU seconds against copies is the per-copy cost.

    >>> c = fit_costs()
    >>> sorted(c), 1.0 < c["union"] < 4.0
    (['aggregate', 'filter', 'join', 'union'], True)
    """
    out = {}
    for op, cpu in measured.items():
        if op not in tuples:
            raise ValueError(f"no input tuple count for operator kind {op!r}")
        copies = np.arange(1, len(cpu) + 1, dtype=float) * tuples[op]
        y = np.asarray(cpu, dtype=float)
        out[op] = float(copies @ y / (copies @ copies)) * 1e6
    return out


def operator_kind(spec) -> str:
    """The cost class of a query node's spec: union, filter, join, aggregate, or other.

    >>> from replistream.workloads import fig1_query
    >>> q = fig1_query(2)
    >>> [operator_kind(q.spec(n)) for n in q.operators]
    ['union', 'union', 'join', 'filter']
    """
    name = type(spec).__name__.lower()
    for kind in ("union", "join", "filter"):
        if kind in name:
            return kind
    if "aggregate" in name or "window" in name:
        return "aggregate"
    if "map" in name:
        return "filter"
    return "other"


@dataclass
class CpuModel:
    """CPU cost of a packet at a replica (see the module docs).

    ``per_copy_us``: microseconds per arriving tuple copy by operator kind
    (``"entry"``, ``"sink"`` and ``"other"`` included; missing kinds take
    ``default_us``); ``per_packet_us``: fixed cost per packet. ``scale``
    multiplies everything (e.g. a slower machine, or 0 to turn CPU off).
    ``per_state_row_us``: microseconds per row of keyed state a rescale moves, at the giving
    replica (taking it out) and again at each taking one (installing it); an assumption, not
    measured: 0 by default (:mod:`replistream.sim.rescale`).

    >>> CpuModel(scale=0).cost("join", 10**6)
    0.0
    >>> CpuModel(per_state_row_us=2.0).state_cost(1000)
    0.002
    """

    per_copy_us: dict[str, float] = field(default_factory=fit_costs)
    per_packet_us: float = 20.0
    default_us: float = 2.0
    scale: float = 1.0
    per_state_row_us: float = 0.0

    def __post_init__(self):
        if not (self.scale >= 0 and self.per_packet_us >= 0 and self.default_us >= 0 and self.per_state_row_us >= 0):
            raise ValueError(f"CpuModel: scale, per_packet_us, default_us and per_state_row_us must be >= 0, got "
                             f"{self.scale}, {self.per_packet_us}, {self.default_us}, {self.per_state_row_us}")
        bad = {k: v for k, v in self.per_copy_us.items() if not v >= 0}
        if bad:
            raise ValueError(f"CpuModel: per_copy_us must be >= 0, got {bad}")

    def cost(self, kind: str, tuples: int, slowdown: float = 1.0) -> float:
        """Seconds of CPU to process a packet of ``tuples`` copies at a replica of ``kind``."""
        if not self.scale:
            return 0.0
        us = self.per_packet_us + self.per_copy_us.get(kind, self.default_us) * tuples
        return us * 1e-6 * self.scale * slowdown

    def state_cost(self, rows: int, slowdown: float = 1.0) -> float:
        """Seconds of CPU to take ``rows`` rows of keyed state out of a replica, or to install them."""
        return self.per_state_row_us * rows * 1e-6 * self.scale * slowdown
