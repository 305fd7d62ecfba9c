"""Deployments that live in the cluster: a detached, named host actor runs the deployment, and a
thin client talks to it from any driver (issue #29, points 1 and 2).

``deploy(q, ..., name="monitor", detached=True)`` starts :class:`DeploymentHost`, a detached Ray
actor named ``monitor`` in the namespace :data:`NAMESPACE`, and the host deploys the query
itself: every replica, the coordinator and the deployment's threads (feeder, failure monitor,
repairs, control loop) are created by the host and live as long as it does, not as long as the
script that asked for them. What ``deploy`` returns is the same thin client as for a deployment
of the script (:class:`~.client.Deployment`, with a :class:`~.client.Hosted` backend): each call
is forwarded to the host. A driver that exits (or is killed) without ``stop()`` leaves the
deployment running; :func:`attach` returns a client from another driver on the cluster, and
``replistream status`` lists what runs.

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

import time

import ray

from . import lockorder
from .client import Deployment, Hosted
from .plane import resolve
from .standby import holder

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
    the deployment's :class:`~.plane.ControlPlane` (``self.dep``); its methods run the control
    plane's (several at once: a ``wait`` does not hold a ``metrics``).

    A deployment has two hosts (:mod:`.standby`): the one holding the lease serves, the other stands
    by and takes the deployment up from what was kept in Ray's key-value store (:mod:`.lifecycle`)
    the moment the serving one's process is gone (fencing it first if it stopped answering). Ray
    restarts a lost host (``max_restarts=-1``); the new process serves if the lease is still its
    own (no host stood by), and stands by otherwise. The replicas, the coordinator and the leased
    warm actors are detached and run on meanwhile. A call in flight when the host died is sent
    again by Ray (``max_task_retries=-1``); one that reaches the host standing by raises
    :class:`~.standby.NotServing` and the client sends it to the serving host; ``feed`` and every
    call carry an id, so a call sent again is not made twice.

    >>> host = DeploymentHost.options(name="m", namespace=NAMESPACE, lifetime="detached").remote()  # doctest: +SKIP
    """

    def __init__(self, deployment: str | None = None):
        import threading

        from . import warm
        from .standby import holder

        warm.use_cluster(True)  # it runs in the cluster: its deployment takes warm actors from the cluster's pool
        self.started = time.time()
        self.actor = ray.get_runtime_context().get_actor_name()
        self.name = deployment or self.actor  # the deployment's name (this host's actor may be its second)
        self.lock = lockorder.lock("DeploymentHost.lock", 0)
        self.restore_error: str | None = None
        self.dep = None
        self.gen: int | None = None  # the lease's generation this host holds (None: it does not serve)
        self.role = "new"  # "new" (start() deploys), "standby", "taking_over", "serving", "stopped"
        self.serving = threading.Event()
        self.stopping = threading.Event()
        self.watch = None
        self._seen: list[dict] = []  # what this host saw while it stood by (a fence), said once it serves
        self.fed = False
        lease = holder(self.name)
        if lease is not None:
            # this host served and its process was lost: it serves again unless the other took over first
            mine = lease["actor"] == self.actor and self._take_over(lease["gen"])
            if not mine and self._kept():
                self._stand_by()
            # (nothing kept: a start cut short, sent again by Ray to this process, or a deployment stopped)

    def _kept(self) -> bool:
        from .lifecycle import Persister, get_value

        return get_value(Persister.key(self.name, "state")) is not None

    # -- serving or standing by (standby.py) ------------------------------------------------------
    def _stand_by(self) -> None:
        from .standby import Watch

        self.role = "standby"
        fail_after = 4.0
        try:
            from .lifecycle import Persister, get_value

            st = get_value(Persister.key(self.name, "options"))
            fail_after = float((st[1] if st else {}).get("fail_after_s", fail_after))
        except Exception as e:  # noqa: BLE001 - the default deadline stands, said
            import warnings

            warnings.warn(f"replistream: the host standing by for {self.name!r} could not read its options "
                          f"({e!r}); it fences a silent host after {fail_after:g} s", RuntimeWarning, stacklevel=2)
        self.watch = Watch(self._take_over, self.name, self.actor, fail_after, NAMESPACE,
                           log=self._seen.append).start()

    def _take_over(self, gen: int) -> bool:
        """Claim generation ``gen + 1`` and restore the deployment here; False if another host claimed
        it first or nothing is kept (a deployment stopped, or whose start was cut short)."""
        from .lifecycle import restore
        from .standby import claim

        if not self._kept() or not claim(self.name, gen + 1, self.actor):
            return False
        with self.lock:
            self.role, self.gen = "taking_over", gen + 1
            try:
                self.dep = restore(self.name)
            except Exception as e:  # noqa: BLE001 - kept and raised by every call (stop() still works)
                import traceback

                self.dep = None
                self.restore_error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
            if self.dep is not None:
                self.dep._persister.gen = self.gen
                self.dep.events.extend({"t": self.dep.now(), **rec} for rec in self._seen)
                self.dep.events.append({"t": self.dep.now(), "event": "host_serves", "host": self.actor,
                                        "generation": self.gen, "at": time.time()})
                try:  # the generation's claim kept with the state at once: lost only with a write in flight
                    self.dep._persister.persist_now()
                except Exception as e:  # noqa: BLE001 - said; the persister's thread writes it on its next look
                    self.dep.events.append({"t": self.dep.now(), "event": "persist_failed", "error": repr(e)[:300]})
                self._watched()
            self.fed = self.dep is not None and self.dep.started
            self.role = "serving"
            self.serving.set()
        self._keep_pair()
        return True

    def _keep_pair(self) -> None:
        """While this host serves, a thread sees that the other host exists (Ray restarts it when its
        process dies; one killed for good is started again), so a host always stands by."""
        import threading

        def keep():
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from .standby import other_of

            other = other_of(self.actor, self.name)
            here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
            while True:  # (at once, then every KEEP_EVERY_S)
                try:
                    ray.get_actor(other, namespace=NAMESPACE)
                except ValueError:
                    try:
                        DeploymentHost.options(name=other, namespace=NAMESPACE, lifetime="detached",
                                               scheduling_strategy=here).remote(self.name)
                    except ValueError:  # (started by another meanwhile)
                        pass
                except Exception as e:  # noqa: BLE001 - said, and tried again
                    if self.dep is not None:
                        self.dep.events.append({"t": self.dep.now(), "event": "standby_error", "error": repr(e)[:300]})
                if self.stopping.wait(self.KEEP_EVERY_S):
                    return

        threading.Thread(target=keep, daemon=True, name="replistream-keep-pair").start()

    #: Seconds between two looks at whether the other host exists.
    KEEP_EVERY_S = 1.0

    def _serve(self) -> None:
        """Raise :class:`~.standby.NotServing` unless this host serves (a host taking over finishes first)."""
        from .standby import NotServing, holder

        if self.role == "taking_over":
            self.serving.wait(120)
        if self.role == "standby":
            lease = holder(self.name)
            raise NotServing(self.name, None if lease is None else lease["actor"])
        if self.role == "stopped":
            raise RuntimeError(f"detached deployment {self.name!r} was stopped")
        self._check()
        if self.dep is None:
            raise RuntimeError(f"detached deployment {self.name!r} is not deployed (its start was cut short, "
                               f"or it was stopped): deploy it again")

    def _watched(self) -> None:
        """Ask the deployment's coordinator to watch this host (a stopped host is fenced, then
        restarted by Ray); a coordinator that replaces a lost one is asked again by the deployment."""
        import os

        from .common import process_start

        self.dep._host_actor = ray.get_runtime_context().current_actor
        self.dep._host_process = (os.getpid(), process_start(os.getpid()), ray.get_runtime_context().get_node_id())
        self.dep.coordinator.watch_host.remote(self.dep._host_actor, self.name, self.dep.detector.fail_after_s,
                                               self.dep._host_process)

    def _check(self) -> None:
        if self.restore_error is not None:
            from ...errors import RunFailed

            raise RunFailed(f"detached deployment {self.name!r} lost its host process, and the new one could not "
                            f"take it up from its kept state: {self.restore_error}; stop it and deploy again",
                            operator="host")

    def start(self, query, options: dict) -> bool:
        """Deploy ``query`` with ``deploy``'s ``options`` here (its errors reach the caller), holding the
        lease's first generation; then the other host is started to stand by. A start cut short by
        the loss of this host's process is started again from scratch: the actors it had started
        are stopped first (:func:`~.lifecycle.discard`)."""
        from .client import plane_of
        from .deployment import deploy
        from .plane import DETACHED_AS
        from .lifecycle import discard
        from .standby import claim

        with self.lock:
            if self.dep is None:
                discard(self.name)
                if not claim(self.name, 1, self.actor):
                    raise RuntimeError(f"detached deployment {self.name!r} is being started by another host")
                self.gen = 1
                token = DETACHED_AS.set(self.name)
                try:
                    dep = plane_of(deploy(query, **options))
                finally:
                    DETACHED_AS.reset(token)
                dep._persister.options(query, options)
                dep._persister.gen = self.gen
                dep._persister.start()
                self.dep = dep
                self._watched()
                self.role = "serving"
                self.serving.set()
                self._keep_pair()
        return True

    def feed(self, feed_id: str, args: tuple = (), kwargs: dict | None = None) -> None:
        """``dep.feed(*args, **kwargs)``, once per ``feed_id`` (a call sent again after this host's
        process was lost and restarted finds it fed already)."""
        from .lifecycle import Persister, get_value, put_value

        self._serve()
        with self.lock:
            key = Persister.key(self.name, "feed_id")
            if self.dep.started and get_value(key) == feed_id:
                return None
            put_value(key, feed_id)
            self.fed = True
        return self.dep.ingest.feed(*args, **(kwargs or {}))

    def call(self, method: str, args: tuple = (), kwargs: dict | None = None, call_id: str | None = None):
        """Run the control plane's ``method`` (:func:`~.plane.resolve`) and return its answer.
        ``call_id`` (the client's): a change to the running query made by a call with this id already
        (a call Ray sends again after the process running it was lost) is returned, not made again."""
        if method.startswith("_"):
            raise AttributeError(f"{method!r} is not part of the deployment's API")
        self._serve()
        if method == "feed":
            with self.lock:
                self.fed = True
        from .common import snapshot
        from .plane import CALL_ID  # (a local name: the actor's class is pickled with its globals)

        token = CALL_ID.set(call_id)
        try:
            return snapshot(resolve(self.dep, method)(*args, **(kwargs or {})))  # (not a live list: snapshot)
        finally:
            CALL_ID.reset(token)

    def get(self, name: str):
        """The deployment's attribute ``name`` (``events``, ``plan``, ``topology``, ...)."""
        if name.startswith("_"):
            raise AttributeError(f"{name!r} is not part of the deployment's API")
        from .common import snapshot

        self._serve()
        return snapshot(resolve(self.dep, name))  # (Ray serializes it while the feeder and others go on)

    def process(self) -> dict:
        """This host's process: ``{"pid", "start", "node", "role", "restored"}`` (``role``: serving or
        standby; ``restored``: the deployment was taken up from its kept state by this process, after
        an earlier one was lost). Answered in any role."""
        import os

        from .common import process_start

        return {"pid": os.getpid(), "start": process_start(os.getpid()), "node": ray.get_runtime_context().get_node_id(),
                "role": self.role, "actor": self.actor,
                "restored": self.dep is not None and any(e.get("event") == "control_restored"
                                                         for e in self.dep.events)}

    def status(self, since: int = 0) -> dict:
        """:func:`~.view.status` of the deployment, with this host's name, how long it runs and
        whether it was fed."""
        from .common import snapshot
        from .view import status

        self._serve()
        return snapshot({**status(self.dep, since), "name": self.name, "host": self.actor,
                         "running_s": round(time.time() - self.started, 1), "fed": self.fed})

    def stop(self) -> bool:
        """Shut the deployment down: every actor it started, the host standing by, and what it kept in
        Ray's key-value store (its own and its coordinator's); the caller then kills this host."""
        from .lifecycle import discard
        from .standby import other_of

        self.stopping.set()
        self.role = "stopped"
        if self.watch is not None:
            self.watch.stop.set()
        if self.dep is not None:
            self.dep.shutdown()
        try:
            ray.kill(ray.get_actor(other_of(self.actor, self.name), namespace=NAMESPACE), no_restart=True)
        except ValueError:  # (none runs)
            pass
        discard(self.name)
        return True


#: The client of a detached deployment is the same class as any deployment's (kept under this name).
DeploymentClient = Deployment


def attach(name: str, address: str | None = None) -> Deployment:
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
        lease = holder(name)
        actor = name if lease is None else lease["actor"]  # the host that serves (standby.py)
        host = ray.get_actor(actor, namespace=NAMESPACE)
    except ValueError:
        running = list_deployments()
        raise LookupError(f"no detached deployment named {name!r} on this cluster; running: "
                          f"{running or 'none'}") from None
    return Deployment(Hosted(host, name, actor))


def list_deployments() -> list[str]:
    """The names of the detached deployments running on the connected cluster.

    >>> list_deployments()   # doctest: +SKIP
    ['monitor']
    """
    from .warm import NAME as WARM_POOL

    from .standby import PAIR_SUFFIX

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and a["name"] != WARM_POOL  # (the cluster's warm pool)
                  and not a["name"].endswith(PAIR_SUFFIX))  # (a deployment's second host)
