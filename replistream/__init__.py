"""replistream: replicated, replication-transparent stream processing.

Build a query, run it, compare with the ideal run:

>>> import replistream as rs
>>> q = rs.Query("hello")
>>> nums = q.source("nums", {"x": "i8"}, punctuate_every=10)
>>> nums.window(size=10, aggs={"total": ("x", "sum")}).sink("sums")
'sums'
>>> out = rs.run_reference(q.build(), {"nums": [{"ts": t, "x": t} for t in range(20)]})
>>> out.outputs["sums"][["window_start", "total"]].tolist()
[(0, 45), (10, 145)]

See README.md for the replicated engines and the CLI.
"""
import importlib

from .errors import DeadLetter, PunctuationViolation, QueryError, ReplistreamError, RunFailed, SchemaError, UserFunctionError
from .operators.aggregate import Summary
from .schema import END, Punctuation, Schema, millis, seconds
from .query import Query, Stream
from .progress import quiet

__version__ = "0.1.0"


# Names loaded on first use (PEP 562), so that ``import replistream`` stays light (issue #42, point 4:
# under 0.5 s; ``tests/core/test_import_budget.py`` checks what it imports): the name -> the module
# that defines it. The Ray engine pulls in Ray, ``FileSource`` and ``ParquetSink`` pyarrow; the
# engines, the replica, the network model and the scenario are this package's own, but together
# they were a third of the import that a script which only builds a query does not need.
_LAZY = {
    "deploy": ".engines.ray", "Deployment": ".engines.ray", "GCConfig": ".engines.ray", "attach": ".engines.ray",
    "FileSource": ".files", "ParquetSink": ".sinks",
    "RunResult": ".engines", "run_reference": ".engines",
    "ReplicaCore": ".replica",
    "Server": ".network", "default_servers": ".network",
    "Event": ".scenario", "Scenario": ".scenario",
}
# Subpackages that ``import replistream`` used to import (so ``rs.engines`` worked without importing it):
# still attributes, imported on first use.
_SUBMODULES = ("engines", "network", "replica", "scenario")


def __getattr__(name):
    where = _LAZY.get(name)
    if where is not None:
        return getattr(importlib.import_module(where, __name__), name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'replistream' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, with those loaded on first use (``deploy``, ``FileSource``, ...), so tab
    completion and ``help()`` find them.

    >>> import replistream as rs
    >>> {"deploy", "FileSource", "Deployment", "GCConfig", "run_reference", "engines"} <= set(dir(rs))
    True
    """
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))

__all__ = [
    "DeadLetter", "PunctuationViolation", "QueryError", "ReplistreamError", "RunFailed", "SchemaError",
    "UserFunctionError",
    "Summary", "END", "Punctuation", "Schema", "millis", "seconds", "Query", "Stream",
    "ReplicaCore", "RunResult", "run_reference", "Server", "default_servers", "Deployment", "deploy", "GCConfig", "FileSource",
    "ParquetSink", "attach", "Event", "Scenario", "quiet", "__version__",
]
