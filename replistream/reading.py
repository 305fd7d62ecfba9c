"""Streaming reads into Ray's object store that outlive their process (``FileSource``, ``SparkSource``).

A file of a :class:`~replistream.files.FileSource`, or a partition of a
:class:`~replistream.spark.SparkSource`, is read and converted outside the feeder, by a Ray task (or
a reader actor) that yields its chunks one by one (``num_returns="streaming"``): each chunk's rows,
then its metadata (row count, time range). :func:`read_chunks` takes those chunks for the feeder and
masks the loss of the process that reads them, as replicas mask a lost replica:

* the process dies (killed, crashed, its actor lost): a new reading starts and passes over the chunks
  already taken (a reading cuts its input the same way every time);
* the process stops answering (stopped, hung): no chunk for :data:`READ_TIMEOUT_S` and it is treated
  like a dead one, and ended first (its task cancelled with its process, or its actor killed), so it
  never comes back to hand out chunks twice;
* :data:`READ_ATTEMPTS` readings in a row end before giving a chunk not taken yet: the feed fails,
  naming the input, the first chunk not fed and why each reading ended. Nothing is lost silently.

An error the reading itself raises (:class:`ray.exceptions.RayTaskError`: the input cannot be read
or converted) is not retried: it is the input's, and the caller names it.

Rows travel before their metadata, so the metadata that arrives vouches for the rows: a reading
that died between the two leaves its error where the next item would be, raised here, never a
reference that every entry replica would then fail on.

>>> gen = task.options(num_returns="streaming").remote(path, fmt, plan, 10_000)    # doctest: +SKIP
>>> for rows_ref, meta in read_chunks((gen, None), restart, path, "load"):          # doctest: +SKIP
...     feed(rows_ref, meta["n"])
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

#: Seconds a reading may go without giving its next chunk (its rows, or their metadata after them)
#: before it is presumed stopped: its process is ended and a new reading goes on for it.
READ_TIMEOUT_S = 15.0

#: Readings of one input that may end in a row (lost, crashed or stopped, each before it gave a
#: chunk not taken yet) before the feed fails, naming the input and the chunk it could not get.
READ_ATTEMPTS = 4


class ReadStalled(TimeoutError):
    """A reading gave no chunk within :data:`READ_TIMEOUT_S` (its process stopped answering, or the
    machine is overloaded), or :data:`READ_ATTEMPTS` readings in a row ended so.

    >>> isinstance(ReadStalled("gave no chunk within 15 s"), TimeoutError)
    True
    """


class ReadLost(RuntimeError):
    """:data:`READ_ATTEMPTS` readings of one input in a row ended, the last one lost (its process
    died), before giving a chunk not taken yet.

    >>> isinstance(ReadLost("x"), RuntimeError)
    True
    """


def positive_seconds(name: str, value, optional: bool = False) -> float | None:
    """``value`` as seconds, refused in one line unless a number > 0 (None too when ``optional``):
    the check of a source's deadlines (``read_timeout_s``, ``stall_timeout_s``).

    >>> positive_seconds("read_timeout_s", 2), positive_seconds("read_timeout_s", None, optional=True)
    (2.0, None)
    >>> positive_seconds("read_timeout_s", True)
    Traceback (most recent call last):
    ...
    ValueError: read_timeout_s must be a number of seconds > 0, got True
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def rows_then_meta(chunks) -> Iterator:
    """The items a reading yields for ``chunks`` (``(metadata, rows)`` pairs, as
    :func:`~replistream.files.read_file` and :func:`~replistream.spark.convert.convert_table` give
    them): each chunk's rows, then its metadata, the order :func:`read_chunks` takes them in.

    >>> list(rows_then_meta([({"n": 2}, "rows")]))
    ['rows', {'n': 2}]
    """
    for meta, rows in chunks:
        yield rows
        yield meta


def _next_ref(gen, timeout: float):
    """The next reference of ``gen``, waited for at most ``timeout`` seconds (else
    :class:`ReadStalled`); ``StopIteration`` once the reading ended."""
    import ray

    if not ray.wait([gen], timeout=timeout)[0]:
        raise ReadStalled(f"gave no chunk within {timeout:g} s")
    return next(gen)


def _next_chunk(gen, what: str, source: str, timeout: float) -> tuple[Any, dict]:
    """The next chunk of ``gen`` as ``(reference to its rows, its metadata)``; ``StopIteration``
    once the reading ended. A reading that failed ends its stream with the error in place of its
    next item: raised here."""
    import ray

    rows_ref = _next_ref(gen, timeout)
    try:
        meta_ref = _next_ref(gen, timeout)
    except StopIteration:  # the stream ended on an error, in place of the rows
        ray.get(rows_ref, timeout=timeout)  # (raises it)
        raise RuntimeError(f"source {source!r}: reading {what} ended between a chunk's rows and its "
                           f"metadata") from None
    return rows_ref, ray.get(meta_ref, timeout=timeout)


def _abandon(gen, via) -> None:
    """End a reading given up on: the actor ``via`` that ran it (killed: it is not used again), or
    the task behind ``gen`` (cancelled with its process, which may be stopped)."""
    import ray

    if via is not None:
        ray.kill(via)
    else:
        ray.cancel(gen, force=True)


def read_chunks(first: tuple[Any, Any], restart: Callable[[], tuple[Any, Any]], what: str,
                source: str, on_abandon: Callable[[Any], None] | None = None,
                timeout: float | None = None) -> Iterator[tuple[Any, dict]]:
    """The chunks of one input, ``(reference to its rows, its metadata)``, in order and each once,
    through the loss or stop of the processes reading it (see the module doc).

    ``first`` is the reading already started, ``(streaming generator, the actor running it or
    None for a task)``; ``restart()`` starts a new reading of the same input from its start (a task,
    unless an actor should go on: it says which); ``what`` names the input in errors (a file, a
    partition), ``source`` its source; ``on_abandon(actor)`` is told of an actor given up on;
    ``timeout`` how long a reading may give no chunk before it is ended (None:
    :data:`READ_TIMEOUT_S`).

    >>> for rows_ref, meta in read_chunks((gen, None), restart, "part-0.parquet", "load"):  # doctest: +SKIP
    ...     print(meta["n"])
    10000
    """
    import ray

    timeout = READ_TIMEOUT_S if timeout is None else float(timeout)
    gen, via = first
    done = skip = 0  # chunks yielded; chunks a new reading passes over
    failed: list[str] = []  # readings in a row that ended before giving a new chunk
    while True:
        try:
            rows_ref, meta = _next_chunk(gen, what, source, timeout)
        except StopIteration:
            return
        except ray.exceptions.RayTaskError:  # the reading raised: the input's error, the caller's to name
            raise
        except (ReadStalled, ray.exceptions.RayError) as e:
            failed.append(str(e) if isinstance(e, ReadStalled) else type(e).__name__)
            if via is not None and on_abandon is not None:
                on_abandon(via)
            _abandon(gen, via)
            if len(failed) >= READ_ATTEMPTS:
                kind = ReadStalled if isinstance(e, ReadStalled) else ReadLost
                raise kind(f"source {source!r}: reading {what} failed {len(failed)} times in a row before its "
                           f"chunk {done} ({'; '.join(failed)}; each time it was read again by a new process): "
                           f"its chunks from {done} on were never fed, and the feed stops here") from None
            (gen, via), skip = restart(), done
            continue
        if skip:
            skip -= 1
            continue
        done += 1
        failed.clear()
        yield rows_ref, meta
