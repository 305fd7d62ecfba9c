"""Deployments that live in the cluster: a detached, named host actor runs the deployment, and a
thin client talks to it from any driver (issue #29, points 1 and 2).

``deploy(q, ..., name="monitor", detached=True)`` starts :class:`DeploymentHost`, a detached Ray
actor named ``monitor`` in the namespace :data:`NAMESPACE`, and the host deploys the query
itself: every replica, the coordinator and the deployment's threads (feeder, failure monitor,
repairs, control loop) are created by the host and live as long as it does, not as long as the
script that asked for them. What ``deploy`` returns is a :class:`DeploymentClient` with the
deployment's API (``feed``, ``wait``, ``run``, ``metrics``, ``kill_replica``,
``move_replica``, ...): each call is forwarded to the host. A driver that exits (or is killed)
without :meth:`DeploymentClient.stop` leaves the deployment running; :func:`attach` returns a
client from another driver on the cluster, and ``replistream status`` lists what runs.

What a detached deployment needs: a Ray cluster that outlives the script (``replistream up``, or
one named by ``RAY_ADDRESS``, e.g. ``RAY_ADDRESS=auto`` for one started with ``ray start --head``), inputs the host can hold (``FileSource``, lists
of chunks or records; not a generator of the driver) and results that need no driver
(``sinks={app: ParquetSink(...)}``; ``collect()`` still returns what the applications hold).

>>> dep = deploy(q, servers=3, k=2, name="monitor", detached=True,          # doctest: +SKIP
...              sinks={"alerts": ParquetSink("out/alerts")})
>>> dep.feed({"s": FileSource("in/")}, pace=1.0)                              # doctest: +SKIP
>>> attach("monitor").wait(600)                                               # doctest: +SKIP
True
"""
from __future__ import annotations

import threading
import time

import ray

from ...schema import END

__all__ = ["NAMESPACE", "DeploymentHost", "DeploymentClient", "attach", "list_deployments", "cluster_address"]

#: The Ray namespace of detached deployments' host actors.
NAMESPACE = "replistream"


def cluster_address() -> str | None:
    """The address of the Ray cluster a script joins instead of starting its own: ``RAY_ADDRESS``
    if set (``auto`` included: a cluster started with ``ray start --head`` on this machine), else
    the one ``replistream up`` started and that still runs, else None. Another script's own Ray
    (``ray.init()``) is never joined: it ends with that script.

    >>> cluster_address() is None or ":" in cluster_address() or cluster_address() == "auto"   # doctest: +SKIP
    True
    """
    import os

    from .cluster import recorded

    addr = os.environ.get("RAY_ADDRESS")
    if addr:
        return addr
    mine = recorded()
    return None if mine is None else mine["address"]


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=32)
class DeploymentHost:
    """A detached deployment's home in the cluster: it runs :func:`~.deployment.deploy` and holds
    the :class:`~.deployment.Deployment`; its methods run the deployment's (several at once: a
    ``wait`` does not hold a ``metrics``).

    Ray restarts it when its process dies (``max_restarts=-1``), and the new process takes the
    deployment up from what it kept in Ray's key-value store (:mod:`.lifecycle`): the replicas,
    the coordinator and the leased warm actors are detached and ran on meanwhile. A call in flight
    when it died is sent again to the new process (``max_task_retries=-1``); ``feed`` carries an id
    so that a feed sent again is not taken twice.

    >>> host = DeploymentHost.options(name="m", namespace=NAMESPACE, lifetime="detached").remote()  # doctest: +SKIP
    """

    def __init__(self):
        from . import warm
        from .lifecycle import restore

        warm.use_cluster(True)  # it runs in the cluster: its deployment takes warm actors from the cluster's pool
        self.started = time.time()
        self.name = ray.get_runtime_context().get_actor_name()
        self.lock = threading.Lock()
        self.restore_error: str | None = None
        try:
            self.dep = restore(self.name)  # None unless an earlier process of this host deployed
        except Exception as e:  # noqa: BLE001 - kept and raised by every call (stop() still works)
            import traceback

            self.dep = None
            self.restore_error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
        self.fed = self.dep is not None and self.dep.started
        if self.dep is not None:
            self._watched()

    def _watched(self) -> None:
        """Ask the deployment's coordinator to watch this host (a stopped host is fenced, then
        restarted by Ray); a coordinator that replaces a lost one is asked again by the deployment."""
        self.dep._host_actor = ray.get_runtime_context().current_actor
        self.dep.coordinator.watch_host.remote(self.dep._host_actor, self.name, self.dep.detector.fail_after_s)

    def _check(self) -> None:
        if self.restore_error is not None:
            from ...errors import RunFailed

            raise RunFailed(f"detached deployment {self.name!r} lost its host process, and the new one could not "
                            f"take it up from its kept state: {self.restore_error}; stop it and deploy again",
                            operator="host")

    def start(self, query, options: dict) -> bool:
        """Deploy ``query`` with ``deploy``'s ``options`` here (its errors reach the caller). A start
        cut short by the loss of this host's process is started again from scratch: the actors it had
        started are stopped first (:func:`~.lifecycle.discard`)."""
        from .deployment import DETACHED_AS, deploy
        from .lifecycle import discard

        with self.lock:
            if self.dep is None:
                discard(self.name)
                token = DETACHED_AS.set(self.name)
                try:
                    dep = deploy(query, **options)
                finally:
                    DETACHED_AS.reset(token)
                dep._persister.options(query, options)
                dep._persister.start()
                self.dep = dep
                self._watched()
        return True

    def feed(self, feed_id: str, args: tuple = (), kwargs: dict | None = None) -> None:
        """``dep.feed(*args, **kwargs)``, once per ``feed_id`` (a call sent again after this host's
        process was lost and restarted finds it fed already)."""
        from .lifecycle import Persister, get_value, put_value

        self._check()
        with self.lock:
            key = Persister.key(self.name, "feed_id")
            if self.dep.started and get_value(key) == feed_id:
                return None
            put_value(key, feed_id)
            self.fed = True
        return self.dep.feed(*args, **(kwargs or {}))

    def call(self, method: str, args: tuple = (), kwargs: dict | None = None):
        """Run ``dep.<method>(*args, **kwargs)`` and return its answer."""
        if method.startswith("_"):
            raise AttributeError(f"{method!r} is not part of the deployment's API")
        self._check()
        if method == "feed":
            with self.lock:
                self.fed = True
        return getattr(self.dep, method)(*args, **(kwargs or {}))

    def get(self, name: str):
        """The deployment's attribute ``name`` (``events``, ``plan``, ``topology``, ...)."""
        if name.startswith("_"):
            raise AttributeError(f"{name!r} is not part of the deployment's API")
        self._check()
        return getattr(self.dep, name)

    def process(self) -> dict:
        """This host's process: ``{"pid", "node", "restored"}`` (``restored``: the deployment was taken
        up from its kept state by this process, after an earlier one was lost)."""
        import os

        from .common import process_start

        return {"pid": os.getpid(), "start": process_start(os.getpid()), "node": ray.get_runtime_context().get_node_id(),
                "restored": self.dep is not None and any(e.get("event") == "control_restored"
                                                         for e in self.dep.events)}

    def kinds(self) -> dict[str, str]:
        """``{public name: "method" | "value"}`` of the deployment."""
        from .deployment import Deployment

        out = {}
        for n in dir(Deployment):
            if not n.startswith("_"):
                out[n] = "method" if callable(getattr(Deployment, n)) else "value"
        for n in vars(self.dep) if self.dep is not None else ():
            if not n.startswith("_"):
                out.setdefault(n, "value")
        return out

    def status(self, since: int = 0) -> dict:
        """What ``replistream status`` shows: the query, how long it runs, per application the
        tuples delivered and whether the end of the stream came, and the fault tolerance; merged
        with :func:`.view.describe` (replicas and their states, rates, latencies, dead letters, the
        timeline after ``since``): the dashboard's data. ``failure``: the run's failure, if it has
        one (a detached deployment checks it whether or not a client waits)."""
        from .view import describe

        self._check()
        d = self.dep
        poll_error = None
        try:
            d.poll(0.5)
        except Exception as e:  # said in the status; the deployment's own waits raise it
            poll_error = f"{type(e).__name__}: {e}"
        apps = {a: {"delivered": d.delivered.count(a), "complete": d.delivered.punctuation.get(a) == END}
                for a in d.query.sinks}
        view = describe(d, since)
        for a, v in view.pop("applications").items():
            apps.setdefault(a, {}).update(v)
        return {**view, "name": self.name, "query": d.query.name, "running_s": round(time.time() - self.started, 1),
                "fed": self.fed, "complete": all(a["complete"] for a in apps.values()), "applications": apps,
                "poll_error": poll_error, "failure": d.failure,
                **d.fault_tolerance()}

    def stop(self) -> bool:
        """Shut the deployment down: every actor it started, and what it kept in Ray's key-value
        store (its own and its coordinator's); the caller then kills the host."""
        from .lifecycle import discard

        if self.dep is not None:
            self.dep.shutdown()
        discard(self.name)
        return True


class DeploymentClient:
    """A driver's handle on a detached deployment (see the module doc): the deployment's methods
    and attributes, forwarded to its host actor. ``wait(timeout)`` waits in the host; no call
    waits on the host without a deadline (``call_timeout_s``, or the call's own timeout plus that).

    >>> dep = attach("monitor")        # doctest: +SKIP
    >>> dep.wait(60), dep.fault_tolerance()["fault_tolerance"]   # doctest: +SKIP
    (True, 1)
    """

    #: Seconds a forwarded call may take beyond its own ``timeout`` argument (if any).
    call_timeout_s = 120.0

    def __init__(self, host, name: str):
        self._host, self.name = host, name
        self._kinds = ray.get(host.kinds.remote(), timeout=self.call_timeout_s)

    def _call(self, method: str, *args, timeout: float | None = None, **kwargs):
        limit = self.call_timeout_s + (float(kwargs.get("timeout", 0) or 0) if timeout is None else timeout)
        try:
            return ray.get(self._host.call.remote(method, args, kwargs), timeout=limit)
        except ray.exceptions.GetTimeoutError as e:
            from ...errors import RunFailed

            raise RunFailed(f"the host of detached deployment {self.name!r} did not answer {method!r} within "
                            f"{limit:g} s", operator="host") from e
        except ray.exceptions.RayActorError as e:
            from ...errors import RunFailed

            raise RunFailed(f"the host of detached deployment {self.name!r} is gone ({type(e).__name__}): the "
                            f"deployment ended with it", operator="host") from e

    def __getattr__(self, name: str):
        kinds = self.__dict__.get("_kinds", {})
        if name.startswith("_") or name not in kinds:
            raise AttributeError(f"a deployment has no attribute {name!r}")
        if kinds[name] == "method":
            return lambda *args, **kwargs: self._call(name, *args, **kwargs)
        return ray.get(self._host.get.remote(name), timeout=self.call_timeout_s)

    def __dir__(self):
        return sorted(set(self._kinds) | {"stop", "status", "run", "name"})

    def run(self, inputs, pace: float | None = None, timeout: float = 600.0, **kwargs):
        """Feed ``inputs`` and wait for the end of the stream, in the host (see ``Deployment.run``)."""
        if kwargs.get("scenario") is not None or kwargs.get("progress") is not None:
            return self._call("run", inputs, pace, timeout, **kwargs)
        feed_kw = {k: v for k, v in kwargs.items() if k in ("chunk_size", "idle_timeout", "chunk_ms")}
        self.feed(inputs, pace, **feed_kw)
        ok = self._call("wait", timeout=timeout)
        res = self._call("collect")
        if not ok:
            from ...errors import RunFailed

            raise RunFailed(f"detached deployment {self.name!r} did not complete within {timeout:g} s", result=res)
        return res

    def feed(self, inputs, pace: float | None = None, **kwargs) -> None:
        """Hand ``inputs`` to the host, which feeds them (``Deployment.feed``). Only inputs the host
        can keep and read again: a Python generator or iterator of this script is refused in one line
        (it would end with this script)."""
        import uuid
        from collections.abc import Iterator

        for src, data in dict(inputs).items():
            if isinstance(data, Iterator):
                raise ValueError(f"source {src!r} is fed from a Python iterator of this script, which a detached "
                                 f"deployment outlives: give a list, an array or a FileSource")
        limit = self.call_timeout_s
        try:
            return ray.get(self._host.feed.remote(uuid.uuid4().hex, (inputs, pace), kwargs), timeout=limit)
        except ray.exceptions.GetTimeoutError as e:
            from ...errors import RunFailed

            raise RunFailed(f"the host of detached deployment {self.name!r} did not answer 'feed' within "
                            f"{limit:g} s", operator="host") from e

    def status(self, since: int = 0) -> dict:
        """The host's :meth:`DeploymentHost.status` (timeline entries after ``since``)."""
        return ray.get(self._host.status.remote(since), timeout=self.call_timeout_s)

    def stop(self) -> None:
        """Stop the deployment: every actor it started, then its host."""
        try:
            ray.get(self._host.stop.remote(), timeout=self.call_timeout_s)
        finally:
            ray.kill(self._host, no_restart=True)

    def shutdown(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Leaving a ``with`` block does not stop a detached deployment (it outlives its script):
        call :meth:`stop` for that."""

    def __repr__(self) -> str:
        return f"DeploymentClient({self.name!r}, detached)"


def attach(name: str, address: str | None = None) -> DeploymentClient:
    """A client for the detached deployment ``name`` running on the cluster (``address``: the
    cluster's; default: the one this process is connected to, ``RAY_ADDRESS``, or the one
    started on this machine). Raises ``LookupError`` naming the deployments that run.

    >>> dep = attach("monitor")      # doctest: +SKIP
    """
    from .deployment import init_ray

    if not ray.is_initialized():
        addr = address or cluster_address()
        if addr is None:
            raise LookupError(f"no Ray cluster to find deployment {name!r} on: start one with `replistream up` "
                              f"(or set RAY_ADDRESS) before deploying with detached=True")
        init_ray(addr)
    from .warm import NAME as WARM_POOL

    try:
        if name == WARM_POOL:  # the cluster's warm pool of actors, not a deployment
            raise ValueError(name)
        host = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        running = list_deployments()
        raise LookupError(f"no detached deployment named {name!r} on this cluster; running: "
                          f"{running or 'none'}") from None
    return DeploymentClient(host, name)


def list_deployments() -> list[str]:
    """The names of the detached deployments running on the connected cluster.

    >>> list_deployments()   # doctest: +SKIP
    ['monitor']
    """
    from .warm import NAME as WARM_POOL

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and a["name"] != WARM_POOL)  # (the cluster's warm pool)
