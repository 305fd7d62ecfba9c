"""A quicker end for a script that started its own Ray (issue #42: the whole process as a user
times it).

At the interpreter's exit Ray's own hook (``ray.shutdown(_exiting_interpreter=True)``) first
sleeps 0.5 s so that the workers' last log lines reach the driver, then stops Ray's processes one
after another, giving each up to a second to exit after SIGTERM: about 1.4 s here for a local
instance of five processes, most of it waiting for the autoscaler's monitor, which does not
exit on SIGTERM within the second Ray gives it. A script that started Ray
through :func:`~replistream.engines.ray.deployment.init_ray` without ``verbose`` has no worker
log lines sent to it (``log_to_driver=False``), so the sleep waits for nothing; and once the
raylet is gone (first, so that it stops its workers), the others can be stopped together.

:func:`install` registers a hook that runs before Ray's (``atexit`` runs its hooks last
registered first): ``ray.shutdown()`` as Ray's would, without the sleep, with the node's
processes stopped in two waves (the raylet, then the rest together) before Ray's own stop
runs over them and finds them gone. Each wave waits at most one second, then kills what is
left, as Ray does. If Ray's internals are not what this expects, Ray's own stop does it all.

A script that joined a running cluster stops no process at its exit, only disconnects; Ray's hook
sleeps the same 0.5 s first, and its exit took 0.98 s against 0.13 s after ``ray.shutdown()``
(a quiet machine, a driver joined to ``replistream up``'s cluster). The hook disconnects at once.

>>> install()   # doctest: +SKIP
"""
from __future__ import annotations

import atexit
import subprocess
import time

__all__ = ["install", "stop_in_waves"]

_INSTALLED = False


def install() -> None:
    """Register the exit hook (once per process); for a Ray started here, quiet."""
    global _INSTALLED
    if not _INSTALLED:
        _INSTALLED = True
        atexit.register(_at_exit)


def stop_in_waves(node, grace_s: float = 1.0, rest_grace_s: float = 0.25) -> list[str]:
    """Stop ``node``'s processes (a ``ray._private.node.Node`` this process started): SIGTERM to the
    raylet, wait for it (up to ``grace_s``), then SIGTERM to every other process but the reaper at
    once, wait for them (up to ``rest_grace_s``); any still running then is killed. Measured here,
    each alone after SIGTERM: the raylet exits in 0.03 s and the GCS in 0.02 s once the raylet is
    gone, but Ray's autoscaler monitor not within 3 s, which Ray's own stop waits a second for.
    Returns the process types stopped.

    >>> stop_in_waves(ray._private.worker._global_node)   # doctest: +SKIP
    ['raylet', 'gcs_server', 'log_monitor', 'ray_client_server']
    """
    from ray._private import ray_constants

    infos = {kind: [i.process for i in found] for kind, found in node.all_processes.items()}
    raylet = ray_constants.PROCESS_TYPE_RAYLET
    rest = [kind for kind in infos if kind not in (raylet, ray_constants.PROCESS_TYPE_REAPER)]
    for wave, grace in (([raylet] if raylet in infos else [], grace_s), (rest, rest_grace_s)):
        procs = [p for kind in wave for p in infos[kind] if p.poll() is None]
        for p in procs:
            p.terminate()
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    pass  # Ray's own stop, next, logs it and leaves it
    return ([raylet] if raylet in infos else []) + rest


def _at_exit() -> None:
    import ray

    try:
        from ray._private import worker as ray_worker

        node = ray_worker._global_node
        if node is None or not ray.is_initialized():
            return  # already stopped
        if not node.is_head():
            ray.shutdown()  # joined a cluster: a disconnect, without Ray's sleep for log lines no one sends
            return
        own = node.kill_all_processes

        def kill_all_processes(check_alive: bool = True, allow_graceful: bool = False, wait: bool = False):
            try:
                stop_in_waves(node)
            except Exception as e:  # noqa: BLE001 - said; Ray's own stop, next, does it all then
                _say(f"stopping Ray's processes in waves failed ({e!r}); Ray stops them one by one")
            return own(check_alive=False, allow_graceful=allow_graceful, wait=wait)

        node.kill_all_processes = kill_all_processes
        ray.shutdown()  # as Ray's hook does, without its sleep for log lines no one sends here
    except Exception as e:  # noqa: BLE001 - said; at exit, Ray's own hook runs next and stops what is left
        _say(f"the quick stop of Ray failed ({e!r}); Ray's own exit hook stops it")


def _say(text: str) -> None:
    """One line on stderr (at exit: no logger is configured any more)."""
    import sys

    print(f"replistream: {text}", file=sys.stderr)
