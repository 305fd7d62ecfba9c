"""Trace-driven discrete-event simulator (imported as ``replistream.sim``; Hwang §VI).

The simulator drives the runtime's own operator objects (``ReplicaCore``,
``EntryLogic``, ``DuplicateFilter``) over virtual links whose delays come
from a latency model or trace (docs/design.md, decisions 2 and 5); only
communication differs from the Ray runtime, as in the paper's simulator.

* :class:`Simulator`, :data:`MODES` (engine); a run returns the engines' one result type,
  :class:`replistream.engines.RunResult`;
* :mod:`replistream.sim.batch`: batched execution (``Simulator(batch_s=...)``), every
  packet and tuple keeping its own virtual time (the network through
  :func:`replistream.network.delivery_times`, the duplicate filters through
  ``DuplicateFilter.on_rows``, the CPU queue vectorised);
* :mod:`replistream.sim.rescale`: live rescaling of partitioned operators
  (``Simulator(rescales=...)`` or a ``Rescale`` sentinel; issue #41);
* :class:`CpuModel` (per-server CPU, defaults fitted to the runtime's measured Table I);
* :mod:`replistream.sim.traces`: month-long latency traces over >= 100 real cities;
* :mod:`replistream.sim.experiments`: the paper's Fig. 2-5 and Table I, and live rescaling;
* :mod:`replistream.sim.cli`: ``replistream sim <experiment>``.

>>> from replistream.sim import Simulator, MODES
>>> MODES
('replication', 'synchronization', 'deterministic')
"""
from .cpu import CpuModel, MEASURED_CPU_S, PAPER_TABLE1, fit_costs
from .engine import ENTRY, MODES, Simulator

__all__ = ["Simulator", "MODES", "ENTRY", "CpuModel", "MEASURED_CPU_S", "PAPER_TABLE1", "fit_costs"]
