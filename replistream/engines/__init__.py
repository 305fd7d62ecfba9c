"""The engines that run a query: one result type, the reference run, the in-process replicated
run and, imported on first use, the Ray deployment.

* :mod:`.result`: :class:`RunResult`, what every engine returns;
* :mod:`.reference`: :func:`run_reference`, the ideal non-replicated run (Hwang §III);
* :mod:`.inprocess`: :class:`InProcessEngine` and :func:`run_replicated`, every operator replicated in one process,
  with a seeded scheduler, crashes and hand-overs;
* :mod:`.ray`: :func:`deploy`, replicas as Ray actors over an emulated wide-area network.

The simulator (:mod:`replistream.sim`) is the fourth engine.
"""
import importlib

# Loaded on first use (PEP 562): a Ray actor's process imports ``replistream.engines.ray.actors``,
# hence this package, and needs neither the in-process engine nor the reference run. Importing
# them (and what only they import) took about 20 ms of the 146 ms of replistream's part of each
# actor's start, by ``python -X importtime`` (issue #42, point 4).
_LAZY = {"InProcessEngine": ".inprocess", "run_replicated": ".inprocess", "run_reference": ".reference",
         "run_reference_on_streams": ".reference", "Collector": ".result", "RunResult": ".result"}

__all__ = ["RunResult", "Collector", "run_reference", "run_reference_on_streams", "InProcessEngine", "run_replicated"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
