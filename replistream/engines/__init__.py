"""The engines that run a query: one result type, the reference run, the in-process replicated
run and, imported on first use, the Ray deployment.

* :mod:`.result`: :class:`RunResult`, what every engine returns;
* :mod:`.reference`: :func:`run_reference`, the ideal non-replicated run (Hwang §III);
* :mod:`.inprocess`: :class:`InProcessEngine` and :func:`run_replicated`, every operator replicated in one process,
  with a seeded scheduler, crashes and hand-overs;
* :mod:`.ray`: :func:`deploy`, replicas as Ray actors over an emulated wide-area network.

The simulator (:mod:`replistream.sim`) is the fourth engine.
"""
from .inprocess import InProcessEngine, run_replicated
from .reference import run_reference, run_reference_on_streams
from .result import Collector, RunResult

__all__ = ["RunResult", "Collector", "run_reference", "run_reference_on_streams", "InProcessEngine", "run_replicated"]
