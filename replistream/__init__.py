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
from .errors import DeadLetter, PunctuationViolation, QueryError, ReplistreamError, RunFailed, SchemaError, UserFunctionError
from .operators.aggregate import Summary
from .schema import END, Punctuation, Schema, millis, seconds
from .query import Query, Stream
from .replica import ReplicaCore
from .engines import RunResult, run_reference
from .network import Server, default_servers
from .scenario import Event, Scenario
from .progress import quiet

__version__ = "0.1.0"


def __getattr__(name):
    # The Ray engine is imported on first use, so the core stays light to import.
    if name in ("deploy", "Deployment", "GCConfig", "attach"):
        from .engines import ray

        return getattr(ray, name)
    if name == "FileSource":  # pyarrow is imported on first use too
        from .files import FileSource

        return FileSource
    if name == "ParquetSink":
        from .sinks import ParquetSink

        return ParquetSink
    raise AttributeError(f"module 'replistream' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, with those loaded on first use (``deploy``, ``FileSource``, ...), so tab
    completion and ``help()`` find them.

    >>> import replistream as rs
    >>> {"deploy", "FileSource", "Deployment", "GCConfig"} <= set(dir(rs))
    True
    """
    return sorted(set(globals()) | set(__all__))

__all__ = [
    "DeadLetter", "PunctuationViolation", "QueryError", "ReplistreamError", "RunFailed", "SchemaError",
    "UserFunctionError",
    "Summary", "END", "Punctuation", "Schema", "millis", "seconds", "Query", "Stream",
    "ReplicaCore", "RunResult", "run_reference", "Server", "default_servers", "Deployment", "deploy", "GCConfig", "FileSource",
    "ParquetSink", "attach", "Event", "Scenario", "quiet", "__version__",
]
