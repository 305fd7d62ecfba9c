"""The user's handle on a deployment: a thin client of its control plane.

:func:`~.deployment.deploy` and :func:`~.host.attach` both return a :class:`Deployment`. It holds
no state of the run: every public name is forwarded to the part of the
:class:`~.plane.ControlPlane` that answers it (:func:`~.plane.resolve`), through a backend:

* :class:`InProcess`: the control plane runs in this process (a deployment of the script);
* :class:`Hosted`: it runs in a detached deployment's host actor (:mod:`.host`); every call has a
  deadline, and results are fetched by position (:meth:`Deployment.results_since`), so a client
  that reconnects gets each tuple once.

The methods' docstrings are those of the parts that implement them.

>>> dep = deploy(query, servers=4, k=2)          # doctest: +SKIP
>>> dep.kill_replica("join", 0); dep.wait(60)    # doctest: +SKIP
"""
from __future__ import annotations

import functools
import time
import uuid
import warnings
from collections.abc import Iterator

import ray
from ray import cloudpickle

from ...errors import RunFailed
from .common import READY_S, own_timeout
from .changes import Changes
from .coordlink import CoordinatorLink
from .faults import Faults
from .ingest import Ingest
from .monitor import Monitor
from .plane import ControlPlane, owner_of, resolve
from .repair import Repairer
from .results import Results

__all__ = ["Deployment", "InProcess", "Hosted", "plane_of"]


class InProcess:
    """The backend of a deployment whose control plane runs in this process.

    >>> InProcess(plane).call("fault_tolerance", (), {})      # doctest: +SKIP
    """

    detached = False
    name = None

    def __init__(self, plane: ControlPlane):
        self.plane = plane

    def call(self, method: str, args: tuple, kwargs: dict):
        return resolve(self.plane, method)(*args, **kwargs)

    def get(self, name: str):
        return resolve(self.plane, name)

    def set(self, name: str, value) -> None:
        setattr(owner_of(self.plane, name), name, value)

    def stop(self) -> None:
        self.plane.shutdown()

    def status(self, since: int = 0) -> dict:
        from .view import status

        return status(self.plane, since)


class Hosted:
    """The backend of a detached deployment: its control plane runs in its host actor (:mod:`.host`).
    No call waits on the host without a deadline (:attr:`call_timeout_s`, plus the call's own
    ``timeout`` argument if it has one); a host that is gone or silent raises
    :class:`~replistream.errors.RunFailed` naming it.

    >>> Hosted(ray.get_actor("monitor", namespace="replistream"), "monitor")   # doctest: +SKIP
    """

    detached = True

    #: Seconds a forwarded call may take beyond its own ``timeout`` argument (if any).
    call_timeout_s = 120.0

    #: Seconds between two looks at the lease while a call waits (a host taking over is seen then).
    LOOK_EVERY_S = 0.2

    def __init__(self, host, name: str, actor: str | None = None):
        self.host, self.name = host, name
        self.actor = actor or name  # the host actor's name (of the deployment's two: standby.py)

    def _switch(self) -> bool:
        """Take the host the lease names, if another than this client's; True if it switched.
        ``ValueError`` if it names none that runs."""
        from .host import NAMESPACE
        from .standby import holder

        lease = holder(self.name)
        actor = self.name if lease is None else lease["actor"]
        if actor == self.actor:
            return False
        self.host, self.actor = ray.get_actor(actor, namespace=NAMESPACE), actor
        return True

    def _ask(self, what: str, send, limit: float):
        """``send(host)``'s answer from the host that serves, within ``limit`` seconds in all. While the
        call waits, the lease is looked at every :attr:`LOOK_EVERY_S`: once another host serves (the
        one this call went to was lost), the call is sent to it (a call carries its id, so it is made
        once); one that reaches the host standing by (:class:`~.standby.NotServing`), or a host gone
        for good, is sent again to the one the lease names."""
        from .standby import NotServing

        deadline = time.time() + limit
        ref = send(self.host)
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise RunFailed(f"the host of detached deployment {self.name!r} did not answer {what!r} within "
                                f"{limit:g} s", operator="host")
            if not ray.wait([ref], timeout=min(self.LOOK_EVERY_S, left))[0]:
                try:
                    if self._switch():
                        _settle(ref)
                        ref = send(self.host)
                except ValueError:
                    pass  # (the host the lease names is being restarted: the call waits on)
                continue
            try:
                return ray.get(ref, timeout=READY_S)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                if isinstance(e, ray.exceptions.RayTaskError) and not isinstance(e.cause, NotServing):
                    if isinstance(e.cause, Exception):  # the host's own error (RunFailed, ValueError, ...), as
                        raise e.cause from e  # a deployment in this process raises it; Ray's trace chained
                    raise
                try:
                    if not self._switch():
                        time.sleep(0.05)  # (the lease is being taken over: asked again in a moment)
                except ValueError:
                    raise RunFailed(f"the hosts of detached deployment {self.name!r} are gone "
                                    f"({type(e).__name__}): the deployment ended with them", operator="host") from e
                ref = send(self.host)

    #: Calls whose answer is an object in the host (it cannot be sent), and what to call instead.
    HOST_ONLY = {"control_loop": "change replicas with revive_replica, add_replica, move_replica, set_replication "
                                 "or rescale, and read the loop with gc_events() or transfers()",
                 "quiet": "each change (rescale, replace_function, ...) holds the feed and the loop in the host"}

    def call(self, method: str, args: tuple, kwargs: dict):
        if method in self.HOST_ONLY:  # (before anything is sent: Ray's serialization error otherwise)
            raise TypeError(f"{method}() cannot be called on detached deployment {self.name!r} from a client: "
                            f"{self.HOST_ONLY[method]}")
        limit = self.call_timeout_s + own_timeout(getattr(Deployment, method, None), args, kwargs)
        call_id = uuid.uuid4().hex  # (the same id each time the call is sent: it is made once)
        return self._ask(method, lambda h: h.call.remote(method, args, kwargs, call_id), limit)

    def get(self, name: str):
        if name.startswith("_"):
            raise AttributeError(f"{name!r} is not part of a detached deployment's API")
        return self._ask(name, lambda h: h.get.remote(name), self.call_timeout_s)

    def set(self, name: str, value) -> None:
        raise AttributeError(f"a detached deployment's {name!r} is set in its host, not through a client")

    def feed(self, args: tuple, kwargs: dict) -> None:
        feed_id = uuid.uuid4().hex
        return self._ask("feed", lambda h: h.feed.remote(feed_id, args, kwargs), self.call_timeout_s)

    def stop(self) -> None:
        try:
            self._ask("stop", lambda h: h.stop.remote(), self.call_timeout_s)
        finally:
            ray.kill(self.host, no_restart=True)

    def status(self, since: int = 0) -> dict:
        return self._ask("status", lambda h: h.status.remote(since), self.call_timeout_s)


def _settle(ref) -> None:
    """Take, in a thread, the answer of a call sent to a host that was lost, once Ray has sent it again
    to that host's new process (which stands by: ``NotServing``): the call was sent to the serving
    host meanwhile, and this answer only says so (left untaken, Ray would print it as an unhandled
    error when the reference is dropped)."""
    import threading

    def take():
        from .standby import NotServing

        try:
            ray.get(ref, timeout=120)
        except ray.exceptions.RayTaskError as e:  # the call's answer came from the serving host (above)
            if not isinstance(e.cause, NotServing):
                warnings.warn(f"replistream: a call sent again to another host had also failed on the lost one: "
                              f"{e!r}"[:500], RuntimeWarning, stacklevel=2)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # (the lost host never answered it: the serving one did)

    threading.Thread(target=take, daemon=True, name="replistream-settle").start()


def _keepable(src: str, data) -> None:
    """Refuse in one line an input a detached deployment cannot keep to read again after its host is
    lost (a Python iterator of this script, a Spark DataFrame of its session, anything unpicklable)."""
    if isinstance(data, Iterator):
        raise ValueError(f"source {src!r} is fed from a Python iterator of this script, which a detached "
                         f"deployment outlives: give a list, an array or a FileSource")
    if type(data).__module__.startswith("replistream.spark"):
        raise ValueError(f"source {src!r} reads a Spark DataFrame of this script's Spark session, which a detached "
                         f"deployment outlives: write it to files (Parquet) and feed a FileSource, or deploy "
                         f"without detached=True")
    try:
        cloudpickle.dumps(data)
    except Exception as e:  # noqa: BLE001 - said in the error
        raise ValueError(f"source {src!r}: a detached deployment keeps its input to resume after its host is lost, "
                         f"and this one cannot be kept ({type(e).__name__}): give a list, an array or a "
                         f"FileSource") from None


def plane_of(dep: Deployment) -> ControlPlane:
    """The control plane behind ``dep``, which must run in this process (a detached deployment's host
    holds its own this way).

    >>> plane_of(deploy(query, servers=2, k=1)).output.wait(60)   # doctest: +SKIP
    """
    backend = object.__getattribute__(dep, "_backend")
    if not isinstance(backend, InProcess):
        raise ValueError("this deployment's control plane runs in its host actor, not in this process")
    return backend.plane


def _forward(impl):
    """A client method that forwards to the control plane's ``impl`` (its docstring and signature)."""
    name = impl.__name__

    @functools.wraps(impl)
    def method(self, *args, **kwargs):
        return self._backend.call(name, args, kwargs)

    method.__module__ = __name__  # (its doctests are run where ``impl`` is defined)
    return method


def _value(name: str, doc: str):
    return property(lambda self: self._backend.get(name), doc=doc)


class Deployment:
    """A replicated query running on Ray: what :func:`~.deployment.deploy` and :func:`~.host.attach`
    return (see the module doc). The same class whether the control plane runs in this process or in
    a detached deployment's host.

    Read-only views of its replicas: :attr:`alive`, :attr:`handles`, :attr:`actor_server`,
    :attr:`sinks`, :attr:`removed`. ``plan`` is the placement ``{node: [server, ...]}`` it started
    with (plus operators added at run time); ``query`` the query as changed at run time.

    >>> with deploy(query, servers=4, k=2) as dep:      # doctest: +SKIP
    ...     res = dep.run(inputs)
    """

    def __init__(self, backend):
        object.__setattr__(self, "_backend", backend)

    @classmethod
    def of(cls, plane: ControlPlane) -> "Deployment":
        """A client of ``plane``, which runs in this process.

        >>> Deployment.of(plane).fault_tolerance()     # doctest: +SKIP
        """
        return cls(InProcess(plane))

    @property
    def name(self) -> str | None:
        """A detached deployment's name (None: a deployment of this script)."""
        return self._backend.name

    @property
    def detached(self) -> bool:
        """True if the deployment runs in a host actor of the cluster and outlives this script."""
        return self._backend.detached

    # -- what only the client knows ----------------------------------------------------------
    def feed(self, inputs, pace: float | None = None, **kwargs) -> None:
        if self.detached:  # only inputs the host can keep and read again
            for src, data in dict(inputs).items():
                _keepable(src, data)
            return self._backend.feed((inputs, pace), kwargs)
        return self._backend.call("feed", (inputs, pace), kwargs)

    feed.__doc__ = Ingest.feed.__doc__ + """
        A detached deployment's feed runs in its host, which keeps the inputs to resume the feed if it
        is lost: a Python generator or iterator of this script is refused in one line."""

    def run(self, inputs, pace: float | None = None, timeout: float = 600.0, **kwargs):
        if not self.detached or kwargs.get("scenario") is not None or kwargs.get("progress") is not None:
            return self._backend.call("run", (inputs, pace, timeout), kwargs)
        self.feed(inputs, pace, **{k: v for k, v in kwargs.items() if k in ("chunk_size", "idle_timeout", "chunk_ms")})
        ok = self._backend.call("wait", (), {"timeout": timeout})
        res = self._backend.call("collect", (), {})
        if not ok:
            raise RunFailed(f"detached deployment {self.name!r} did not complete within {timeout:g} s", result=res)
        return res

    run.__doc__ = Ingest.run.__doc__

    def on_output(self, app: str, callback, keep: bool = True) -> None:
        if self.detached:
            raise ValueError("on_output runs callbacks in this script, which a detached deployment outlives: "
                             "read dep.results_since(app, position) instead, or write with ParquetSink")
        return self._backend.call("on_output", (app, callback, keep), {})

    on_output.__doc__ = Results.on_output.__doc__

    def status(self, since: int = 0) -> dict:
        """What ``replistream status`` and the dashboard show (:func:`~.view.status`): the query, per
        application the tuples delivered and whether the end came, replicas and their states, rates,
        latencies, dead letters, the timeline after ``since``, the fault tolerance and the run's failure.

        >>> dep.status()["complete"]     # doctest: +SKIP
        True
        """
        return self._backend.status(since)

    def stop(self) -> None:
        """Stop the deployment: every actor it started and what it kept (a detached one's host too).

        >>> dep.stop()     # doctest: +SKIP
        """
        self._backend.stop()

    def shutdown(self) -> None:
        """Same as :meth:`stop`."""
        self._backend.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Leaving a ``with`` block stops a deployment of this script; a detached one outlives its
        script (call :meth:`stop` for that)."""
        if not self.detached:
            self._backend.stop()

    # -- anything else the control plane has (engine internals, for tests and debugging) ---------
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._backend.get(name)

    def __setattr__(self, name: str, value) -> None:
        self._backend.set(name, value)

    def __dir__(self):
        return sorted(set(dir(type(self))) | set(API_VALUES))

    def __repr__(self) -> str:
        return f"Deployment({self.name!r}, detached)" if self.detached else "Deployment(in this process)"


#: Public names forwarded as they are, by the part that implements them.
API_METHODS = {
    ControlPlane: ["now", "control_loop", "quiet", "record_change", "tell"],
    Results: ["wait", "reached", "poll", "results", "results_since", "latencies_ms", "holdup", "collect", "metrics",
              "fault_tolerance", "metrics_json"],
    Faults: ["stop_replica", "resume_replica", "kill", "kill_replica", "kill_server", "slow_server", "delay_link",
             "cut_link", "restore", "install_scenario"],
    Ingest: ["heartbeats"],
    Changes: ["revive_replica", "add_replica", "move_replica", "transfers", "gc_events", "network_cost_history",
              "replace_function", "add_operator", "remove_operator", "set_replication", "rescale", "partitions"],
    CoordinatorLink: ["ask_coordinator"],
    Monitor: ["check_failures", "declare_failed"],
    Repairer: ["mark_failed", "repair_entry"],
}
for _part, _names in API_METHODS.items():
    for _name in _names:
        setattr(Deployment, _name, _forward(getattr(_part, _name)))

#: Public values, read from the control plane at each access.
API_VALUES = {
    "alive": "``{actor label: running}`` of every actor the deployment started, but :attr:`removed` ones.",
    "handles": "``{actor label: Ray actor handle}`` of every actor the deployment started, but :attr:`removed` ones.",
    "actor_server": "``{actor label: server}`` of every actor the deployment started.",
    "sinks": "``{application: actor handle}``.",
    "removed": "Replicas of operators removed from the running query, and of partitions a rescale retired.",
    "fed": "``(seconds since the start, source, chunk number)`` of every chunk the feeder sent.",
    "started": "True once :meth:`feed` started the run clock.",
    "plan": "The placement ``{node: [server, ...]}`` (plus operators added at run time).",
    "query": "The query, as changed at run time (:mod:`.reconfigure`).",
    "events": "Every event of the run (deaths, repairs, moves, changes, ...), as dicts with ``t``.",
    "changes": "Every change made to the running query (:mod:`replistream.replica.changes`).",
    "repairs": "One record per repair tried (``deploy(repair=True)``).",
    "k": "The degree of replication asked for.",
    "servers": "``{name: Server}`` of the deployment.",
    "placement": "The placement behind :attr:`plan`, with its network cost.",
    "topology": "The :class:`~.topology.Topology`: replicas and stream replicas, their states and handles.",
    "coordinator": "The coordinator actor's handle.",
    "failure": "The run's failure, once a detached deployment's monitor found one (None: none so far).",
}
for _name, _doc in API_VALUES.items():
    setattr(Deployment, _name, _value(_name, _doc))
del _part, _names, _name, _doc
