"""A detached deployment's two hosts: one serves, the other stands by (issue #40).

Ray restarts a host actor whose process died, but a new worker process takes it 1.3-2 s to start
on a quiet 2-core machine, and more under load. So a detached deployment runs two host actors
(:class:`~.host.DeploymentHost`), named ``NAME`` and ``NAME~2`` (:func:`pair`), each restartable by
Ray. Which one serves is said by a *lease* in Ray's key-value store: a sequence of numbered
entries ``lease/<generation>``, each written once and never overwritten (:func:`claim`: Ray's
``overwrite=False`` put is atomic in its control service), so of two hosts claiming the same
generation exactly one wins. The newest generation's holder serves (:func:`holder`); the other
host stands by, with the deployment's modules imported, and watches it (:class:`Watch`):

* a holder on the same node is watched through its process (a Linux ``pidfd`` becomes readable
  the moment the process exits: a SIGKILL, a crash or an out-of-memory kill is seen at once);
  a holder elsewhere through Ray (its calls fail with ``ActorDiedError``);
* a holder that does not answer a call within ``fail_after_s`` (a stopped process: slow is dead)
  is fenced: SIGKILL of its process, checked by pid and start time on its node;
* once the holder's process is gone, the standby claims the next generation and restores the
  deployment from its kept state (:func:`~.lifecycle.restore`). Ray restarts the lost host,
  which finds the lease held by a live host and stands by in turn.

A host that serves checks, before each write of the state, that its generation is still the
newest (:meth:`~.lifecycle.Persister.persist_now`): a host that was superseded writes nothing.
A client's call that reaches the host standing by raises :class:`NotServing`; the client reads
the lease and sends the call again to the holder (with the same call id: it is made once).

>>> pair("monitor")
('monitor', 'monitor~2')
>>> other_of("monitor~2", "monitor")
'monitor'
"""
from __future__ import annotations

import json
import os
import select
import threading
import time

import ray
from ray.experimental import internal_kv

from .common import fence_process, is_actor_death, process_start
from .coordinator import KV_NAMESPACE

__all__ = ["PAIR_SUFFIX", "NotServing", "pair", "other_of", "holder", "claim", "serving_host", "Watch"]

#: The second host's name is the deployment's with this suffix.
PAIR_SUFFIX = "~2"


class NotServing(RuntimeError):
    """Raised by a host standing by when a client's call reaches it: ``actor`` names the host that
    serves now (or None while none does). The client sends the call there.

    >>> str(NotServing("monitor", "monitor~2"))
    "deployment 'monitor': this host stands by; 'monitor~2' serves"
    """

    def __init__(self, deployment: str, actor: str | None):
        super().__init__(f"deployment {deployment!r}: this host stands by; "
                         f"{actor!r} serves" if actor else f"deployment {deployment!r}: no host serves yet")
        self.deployment, self.actor = deployment, actor

    def __reduce__(self):
        return NotServing, (self.deployment, self.actor)


def pair(name: str) -> tuple[str, str]:
    """The names of deployment ``name``'s two host actors.

    >>> pair("m")
    ('m', 'm~2')
    """
    return name, name + PAIR_SUFFIX


def other_of(actor: str, name: str) -> str:
    """The other host of deployment ``name``, given one host's actor name.

    >>> other_of("m", "m")
    'm~2'
    """
    a, b = pair(name)
    return b if actor == a else a


def _key(name: str, gen: int | None = None) -> str:
    from .lifecycle import Persister

    return Persister.key(name, "lease/" if gen is None else f"lease/{gen:09d}")


def holder(name: str) -> dict | None:
    """The newest lease of deployment ``name``: ``{"gen", "actor", "pid", "start", "node"}`` (the
    host that serves and its process), or None if none was claimed (not started, or stopped).

    >>> holder("no-such-deployment") is None   # doctest: +SKIP
    True
    """
    found = internal_kv._internal_kv_list(_key(name), namespace=KV_NAMESPACE)
    if not found:
        return None
    newest = max(k.decode() if isinstance(k, bytes) else k for k in found)
    raw = internal_kv._internal_kv_get(newest, namespace=KV_NAMESPACE)
    if raw is None:  # (dropped meanwhile: the deployment is being stopped)
        return None
    return {"gen": int(newest.rpartition("/")[2]), **json.loads(raw)}


def claim(name: str, gen: int, actor: str) -> bool:
    """Claim generation ``gen`` of deployment ``name``'s lease for host ``actor`` (this process):
    True if this call wrote it, False if another host claimed it first (atomic: Ray's key-value
    store writes a key that is absent, or nothing).

    >>> claim("m", 2, "m~2")   # doctest: +SKIP
    True
    """
    rec = {"actor": actor, "pid": os.getpid(), "start": process_start(os.getpid()),
           "node": ray.get_runtime_context().get_node_id(), "t": time.time()}
    existed = internal_kv._internal_kv_put(_key(name, gen), json.dumps(rec).encode(), overwrite=False,
                                           namespace=KV_NAMESPACE)
    return not existed


def serving_host(name: str, namespace: str):
    """The handle of the host that serves deployment ``name`` (the lease's holder; the one named
    ``name`` if no lease is kept yet). ``ValueError`` if no such actor runs.

    >>> serving_host("monitor", "replistream").process.remote()   # doctest: +SKIP
    """
    lease = holder(name)
    return ray.get_actor(name if lease is None else lease["actor"], namespace=namespace)


class Watch:
    """What a standing-by host does (module doc): watch the holder of the lease until its process is
    gone (fencing it if it stops answering), then call ``take_over(gen)`` with the generation it
    held; ``take_over`` returns True once this host serves. Runs in a thread of its own.

    >>> Watch(host, "monitor", "monitor~2", 4.0).start()   # doctest: +SKIP
    """

    #: Seconds between two calls that ask the holder for its process.
    ASK_EVERY_S = 0.25

    def __init__(self, take_over, name: str, actor: str, fail_after_s: float, namespace: str, log=None):
        self.take_over, self.name, self.actor = take_over, name, actor
        self.fail_after_s, self.namespace = float(fail_after_s), namespace
        self.log = log or (lambda rec: None)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> "Watch":
        self.thread = threading.Thread(target=self._run, daemon=True, name="replistream-standby")
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            lease = holder(self.name)
            if lease is None:
                self.stop.wait(self.ASK_EVERY_S)  # not claimed yet, or the deployment is stopping
                continue
            if lease["actor"] == self.actor or self._gone(lease):
                if self.take_over(lease["gen"]):
                    return
                self.stop.wait(self.ASK_EVERY_S)  # another host took it first: watch that one

    def _gone(self, lease: dict) -> bool:
        """Wait until the lease's holder process is gone (True), or the lease changed hands (False)."""
        pid, start, node = lease.get("pid"), lease.get("start"), lease.get("node")
        here = node == ray.get_runtime_context().get_node_id()
        if here and (start is None or process_start(pid) != start):
            return True  # gone already (its pid is free, or another process has it)
        fd = None
        if here:
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):  # gone meanwhile, or no pidfd here: watched through Ray
                fd = None
            if fd is not None and process_start(pid) != start:  # (the pid was taken again meanwhile)
                os.close(fd)
                return True
        try:
            return self._wait(lease, fd)
        finally:
            if fd is not None:
                os.close(fd)

    def _wait(self, lease: dict, fd) -> bool:
        try:
            host = ray.get_actor(lease["actor"], namespace=self.namespace)
        except ValueError:
            return True  # no such actor any more (killed for good)
        last_answer, ask, fenced, said = time.time(), None, False, None
        while not self.stop.is_set():
            if fd is not None and select.select([fd], [], [], self.ASK_EVERY_S)[0]:
                return True  # the process exited
            if fd is None:
                self.stop.wait(self.ASK_EVERY_S)
            now = holder(self.name)
            if now is None or now["gen"] != lease["gen"]:
                return False
            if ask is None:
                ask = host.process.options(max_task_retries=0).remote()
            done, _ = ray.wait([ask], timeout=0)
            if done:
                try:
                    info = ray.get(ask, timeout=0)
                    if (info["pid"], info.get("start")) == (lease.get("pid"), lease.get("start")):
                        last_answer = time.time()
                    elif fd is None:
                        return True  # the holder's actor answers from another process: the holder's is gone
                except Exception as e:  # noqa: BLE001 - a death is the holder's loss; anything else is asked again
                    if is_actor_death(e) and fd is None:
                        return True
                    if not is_actor_death(e) and repr(e) != said:  # (said once per kind of error)
                        said = repr(e)
                        self.log({"event": "standby_probe_error", "host": lease["actor"], "error": said[:300]})
                ask = None
            if not fenced and time.time() - last_answer > self.fail_after_s:
                fence_process(lease.get("pid"), lease.get("start"), lease.get("node"))
                self.log({"event": "host_fenced", "host": lease["actor"], "pid": lease.get("pid"),
                          "reason": f"no answer within {self.fail_after_s:g} s (seen by the standing-by host)"})
                fenced = True
        return False
