"""Small helpers the driver-side parts of the Ray engine share.

* :func:`wait_quietly`: wait for actor calls whose failure is noticed elsewhere;
* :func:`json_default`: numpy values (and anything else) in metrics and event logs as JSON.

>>> import json, numpy as np
>>> json.dumps({"n": np.int64(3), "a": np.arange(2)}, default=json_default)
'{"n": 3, "a": [0, 1]}'
"""
from __future__ import annotations

import os
import traceback
from collections import deque

import numpy as np
import ray

from ...summary import WaitSummary

__all__ = ["json_default", "warm_lazy_imports", "wait_quietly", "is_actor_death", "is_unavailable", "failure_record", "process_start",
           "signal_process", "fence_process"]


#: Modules numpy imports lazily on a first call in the data path: ``numpy.ma`` on the first
#: ``np.unique`` (a keyed state's first snapshot: a transfer's first step), and
#: ``numpy.lib.recfunctions`` (which pulls ``numpy.ma`` too) on a Join's or aggregate's first
#: repack of fields.
LAZY_IMPORTS = ("numpy.ma", "numpy.lib.recfunctions")


def warm_lazy_imports() -> list[str]:
    """Import :data:`LAZY_IMPORTS` now (a data-path actor's set-up), not on the data thread the first
    time a call needs them: ``numpy.ma`` alone took 9 ms on a quiet core and 75 ms under profiling,
    at a rescale's first step (issue #42 point 1). Returns the modules it imported.

    >>> import sys
    >>> _ = warm_lazy_imports(); all(m in sys.modules for m in LAZY_IMPORTS)
    True
    """
    import importlib
    import sys

    fresh = [m for m in LAZY_IMPORTS if m not in sys.modules]
    for m in LAZY_IMPORTS:
        importlib.import_module(m)
    return fresh


def is_actor_death(e: BaseException) -> bool:
    """Whether a failed actor call means the actor is gone (its process died, its node was lost, it
    was killed) rather than that the actor's own code raised (``RayTaskError``: the actor still runs,
    and the error is the run's, reported by the actor itself, :func:`failure_record`).

    >>> import ray.exceptions as rx
    >>> is_actor_death(rx.ActorDiedError()), is_actor_death(ValueError("raised in the replica"))
    (True, False)
    """
    import ray.exceptions as rx

    return isinstance(e, (rx.RayActorError, rx.WorkerCrashedError, rx.OutOfMemoryError, rx.NodeDiedError))


def is_unavailable(e: BaseException) -> bool:
    """Whether a failed actor call means Ray could not reach the actor for now
    (``ActorUnavailableError``: a network blip, a process that stopped answering), which is not
    its death: such a replica is suspected like a silent one, and fenced before it counts as failed
    (docs/reliability.md).

    >>> import ray.exceptions as rx
    >>> is_unavailable(rx.ActorUnavailableError("unreachable", None)), is_unavailable(rx.ActorDiedError())
    (True, False)
    """
    import ray.exceptions as rx

    return isinstance(e, rx.ActorUnavailableError)


#: ``{raylet socket path: (pid, start)}`` of the raylet found listening on it (:func:`ray_node_down`).
_RAYLETS: dict = {}


def _raylet_of(path: str) -> tuple[int, int] | None:
    """``(pid, start)`` of this machine's raylet started with socket ``path`` (its command line
    names it), found once and kept; None if none is found (then the socket is asked instead)."""
    if path not in _RAYLETS:
        found = None
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != "raylet":
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if path.encode() not in f.read():
                        continue
            except OSError:
                continue
            start = process_start(pid)
            if start is not None:
                found = (pid, start)
                break
        _RAYLETS[path] = found
    return _RAYLETS[path]


def _process_gone(pid: int, start: int) -> bool:
    """Whether process ``pid`` (started at ``start``) has ended: no such process, another one with
    its pid, or a zombie left for its parent to reap."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") or int(fields[19]) != start


def ray_node_down() -> str | None:
    """Why the Ray node of this process can run nothing any more, or None if nothing says so.

    Every actor of a node is started and kept by its *raylet*; when the raylet dies, so do the
    node's actors, and no new one can start there. Ray's control service (GCS) takes seconds to
    tens of seconds to mark the node dead, and a new actor asked for meanwhile waits without an
    error, so this looks at the raylet itself: its process (found once by its socket, then one
    read of ``/proc``: cheap enough for every check of the failure monitor, and silent, where a
    connection to the raylet's socket costs it a log line), or, when its process is not found on
    this machine, its socket (refused or gone: dead). A socket that does not answer within a
    second, or a process with no raylet socket of its own (a Ray client), says nothing.

    >>> ray_node_down()   # doctest: +SKIP
    None
    """
    import socket

    try:
        path = ray._private.worker.global_worker.node.raylet_socket_name
        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # not connected, or a Ray client: nothing to look at (the caller's checks stand)
        return None
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    raylet = _raylet_of(path)
    if raylet is not None:
        if not _process_gone(*raylet):
            return None
        return (f"the Ray node of this process (node {node_id}) is down: its raylet (process {raylet[0]}), which "
                f"starts and keeps every actor of the node, has ended")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(path)
        return None
    except (ConnectionRefusedError, FileNotFoundError) as e:
        return (f"the Ray node of this process (node {node_id}) is down: its raylet, which starts and keeps every "
                f"actor of the node, refuses connections ({type(e).__name__} on {path})")
    except OSError:  # (no answer within a second: a busy raylet, not a dead one; the caller's checks stand)
        return None
    finally:
        sock.close()


def process_start(pid: int) -> int | None:
    """When process ``pid`` of this machine started (clock ticks since boot, ``/proc/<pid>/stat``),
    or None if there is no such process: with the pid, what tells one process from a later one
    that got the same pid.

    >>> import os
    >>> process_start(os.getpid()) == process_start(os.getpid()) is not None
    True
    """
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def signal_process(pid: int, start: int | None, sig: int) -> bool:
    """Send ``sig`` to process ``pid`` of this machine only if it is still the process that started at
    ``start`` (:func:`process_start`; None: not known, then nothing is sent). Returns whether it was sent.

    >>> signal_process(2 ** 22 + 1, 0, 0)
    False
    """
    import os

    if start is None or process_start(pid) != start:
        return False
    try:
        os.kill(int(pid), sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


@ray.remote(num_cpus=0)
def _kill_on_node(pid: int, start: int | None) -> bool:
    return signal_process(pid, start, 9)


def fence_process(pid: int, start: int | None, node: str | None) -> None:
    """SIGKILL process ``pid`` (started at ``start``) on Ray node ``node``, checked there
    (:func:`signal_process`): at once when it is this process's node, else by a task pinned to that
    node (not awaited).

    >>> fence_process(2 ** 22 + 1, 0, None)   # no such process: nothing is sent
    """
    import ray as _ray

    if node is None or not _ray.is_initialized() or node == _ray.get_runtime_context().get_node_id():
        signal_process(pid, start, 9)
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _kill_on_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)).remote(
        pid, start)


def failure_record(replica: str, operator: str, logical_time: int | None, error: BaseException) -> dict:
    """What a replica reports when its own code raised (docs/reliability.md): which replica of which
    operator, the logical time it had reached (the largest punctuation it had passed on), and the
    error, as plain values (so it pickles whatever the exception).

    >>> from replistream.errors import UserFunctionError
    >>> r = failure_record("hot#1", "hot", 15_000_000, UserFunctionError("hot", "predicate raised", row=(1, 2)))
    >>> r["operator"], r["user_function"], r["row"], r["logical_time"]
    ('hot', True, (1, 2), 15000000)
    """
    from ...errors import UserFunctionError

    user = isinstance(error, UserFunctionError)
    return {"replica": replica, "operator": operator, "logical_time": logical_time, "user_function": user,
            "error": type(error).__name__, "message": error.message if user else str(error),
            "row": error.row if user else None,
            "cause": None if not user or error.cause is None else f"{type(error.cause).__name__}: {error.cause}",
            "traceback": "".join(traceback.format_exception(error))[-4000:]}


def wait_quietly(refs, timeout: float = 30) -> list[BaseException]:
    """Wait for each of ``refs`` (at most ``timeout`` s each); a call that failed or timed out does
    not stop the others. Returns the errors: the callers send calls to actors that may have died,
    and a death is noticed and reported where it happens (the deployment's kills, the links' drop
    reports, the feeder's and the control loop's own calls).

    >>> wait_quietly([])
    []
    """
    errors = []
    for r in refs:
        try:
            ray.get(r, timeout=timeout)
        except Exception as e:  # returned to the caller; see the docstring
            errors.append(e)
    return errors


def json_default(o):
    """JSON for what ``json.dumps`` cannot write: numpy scalars and arrays, else ``repr``."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return repr(o)


def inside(folder: str, name: str) -> str:
    """``folder/name``, refused (ValueError) unless it lies inside ``folder`` once resolved: every
    output path replistream writes is built this way (docs/reliability.md).

    >>> inside("/tmp/out", "alerts")
    '/tmp/out/alerts'
    >>> inside("/tmp/out/inner", "../escape")
    Traceback (most recent call last):
    ...
    ValueError: output path for '../escape' would lie outside '/tmp/out/inner'
    """
    base = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(base, name))
    if os.path.commonpath([base, path]) != base or path == base:
        raise ValueError(f"output path for {name!r} would lie outside {folder!r}")
    return path


#: Seconds to fetch the value of a call ``ray.wait`` already found ready (it may still have to
#: travel from another node's object store): a deadline all the same.
READY_S = 30.0


def own_timeout(fn, args: tuple, kwargs: dict) -> float:
    """Seconds ``fn`` (a deployment's method) may itself take when called with ``args`` and
    ``kwargs``: its ``timeout`` argument, given by keyword, by position or left at its default (0
    for a method without one, or none given). A detached deployment's client waits that long plus
    ``Hosted.call_timeout_s`` for the host's answer; counting only a keyword ``timeout`` made
    ``dep.rescale(op, 2)`` (300 s by default) give up after 120 s while the host went on.

    >>> def rescale(self, operator, p, strategy="fluid", timeout=300.0): ...
    >>> own_timeout(rescale, ("agg", 2), {}), own_timeout(rescale, ("agg", 2, "fluid", 30), {})
    (300.0, 30.0)
    >>> own_timeout(lambda self, op: None, ("agg",), {}), own_timeout(None, (), {"timeout": 5})
    (0.0, 5.0)
    """
    import inspect

    t = kwargs.get("timeout")
    if callable(fn):
        try:
            bound = inspect.signature(fn).bind_partial(None, *args, **kwargs)
            bound.apply_defaults()
            t = bound.arguments.get("timeout", t)
        except (TypeError, ValueError):
            pass  # (arguments the method would refuse: it says so itself)
    ok = isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < float("inf")
    return float(t) if ok else 0.0


def snapshot(value, depth: int = 4):
    """``value`` as it is now, for Ray to serialize while the deployment's threads go on changing it:
    lists, tuples, dicts, sets and deques are copied, ``depth`` levels down (a deployment's
    ``metrics()`` nests four). A :class:`~replistream.summary.WaitSummary` is counted out here
    (:meth:`~replistream.summary.WaitSummary.detached`), not while Ray serializes it. A host actor
    that returned a live list (the feeder's ``fed``, the ``events``) had Ray serialize it while
    another thread appended to it: the length written first no longer matched the items after it, and the caller
    got Ray's ``DeserializationError`` ("unpack(b) received extra data"). Each copy is one C-level
    call under the GIL, so no append or insert lands halfway through it.

    >>> live = [{"event": "start"}]
    >>> copy = snapshot(live); live.append({"event": "later"}); live[0]["t"] = 1
    >>> copy
    [{'event': 'start'}]
    >>> snapshot({"m": {"a": [deque([1, 2], maxlen=4)]}})["m"]["a"][0]
    deque([1, 2], maxlen=4)
    >>> snapshot(WaitSummary(True, {"out": 1}, dead_letters=2))
    WaitSummary(complete; out: 1 tuple; 2 dead letters; 0 faults masked)
    """
    if depth <= 0:
        return value
    if isinstance(value, list):
        return [snapshot(v, depth - 1) for v in list(value)]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(snapshot(v, depth - 1) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: snapshot(v, depth - 1) for k, v in dict(value).items()}
    if isinstance(value, (set, frozenset)) and type(value) in (set, frozenset):
        return type(value)(value)
    if type(value) is deque:
        return deque((snapshot(v, depth - 1) for v in list(value)), value.maxlen)
    if isinstance(value, WaitSummary):
        return value.detached()
    return value
