"""A warm process for a script's file reads, taken from the running cluster's warm pool (issue #42).

A :class:`~replistream.files.FileSource` given to ``run``/``feed`` is read outside the driver, file
by file, into Ray's object store. In a script of its own Ray that is a Ray task, whose worker
process ``deploy()`` starts beside the replicas (:func:`~replistream.files.warm_reader`). A script
that joins a running cluster cannot have a worker started ahead for it in the same way: Ray's
worker processes belong to one job, so the first read of every new script paid for a new process
(``import ray``, pyarrow's readers: about a CPU-second here), beside its replicas. Joined to
``replistream up``'s cluster, W1's ``run()`` waited 1.1 s of 2.9 s for its first chunks, and ran at
half the rate of a fresh process.

:class:`ReaderActor` is such a process kept ready by the cluster's pool (:mod:`.warm`, with
pyarrow's readers imported): ``deploy()`` takes one and the script's file reads go through it
(:func:`~replistream.files.use_reader`), several files at once (threads). It is leased to the
script like the replicas taken from the pool, and stopped by the pool once the script ends.

>>> r = ReaderActor.remote()                                   # doctest: +SKIP
>>> gen = r.read.options(num_returns="streaming").remote(path, "csv", plan, 10_000)  # doctest: +SKIP
"""
from __future__ import annotations

import os

import ray

__all__ = ["ReaderActor"]


@ray.remote(num_cpus=0, max_concurrency=8)
class ReaderActor:
    """Reads files into the object store for one script: :meth:`read` is
    :func:`~replistream.files.read_file` as a streaming generator (each chunk's batch, then its
    metadata), the same chunks as the Ray task of a script with its own Ray.

    >>> r = ReaderActor.remote()                 # doctest: +SKIP
    >>> ray.get(r.preload.remote()) > 0          # doctest: +SKIP
    True
    """

    def preload(self) -> int:
        """Import what reading needs, now (the pool calls it once the process started)."""
        import pyarrow.csv  # noqa: F401 (imported for the reads to come)
        import pyarrow.dataset  # noqa: F401
        import pyarrow.parquet  # noqa: F401

        from ...files import read_file  # noqa: F401

        return os.getpid()

    def stop_sending(self) -> None:
        """Nothing to stop (the pool's protocol for a started actor: it sends nothing)."""

    def settled(self) -> bool:
        """It answers (the pool asks a restored idle actor)."""
        return True

    def read(self, path: str, fmt: str, plan, chunk_size: int):
        """``path``'s chunks: each chunk's batch, then its metadata (``num_returns="streaming"``; a
        chunk's metadata that arrives vouches for its batch)."""
        from ...files import read_file
        from ...reading import rows_then_meta

        yield from rows_then_meta(read_file(path, fmt, plan, chunk_size))
