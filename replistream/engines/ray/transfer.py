"""The coordinator's side of a staged state transfer on Ray (Megaphone §3.3, docs/migration.md).

:meth:`ReplicaManager.replace_replica(..., strategy=...)
<replistream.engines.ray.control.ReplicaManager.replace_replica>` starts the new
replica pending and subscribed to every live upstream replica (as for any
hand-over), then calls :func:`staged_install`, which

1. plans the steps (:func:`replistream.replica.plan_transfer`; one step if the
   operator's state does not split by key);
2. turns the new replica into a :class:`~replistream.replica.StagedReplica`
   (``begin_transfer``): what it buffered goes through it;
3. for each step, asks a live peer to take it (``request_step``): the peer takes
   the checkpoint of those bins at its next punctuation (a logical time), between
   two deliveries, and sends it straight to the receiver (``install_step``), then
   goes on processing; the coordinator waits for the receiver to report the step
   installed before asking for the next, so the peer serves data between steps;
4. if the peer dies before a step arrives, asks another live peer for that step
   and the rest (any live peer will do: each step carries its own filter state);
5. waits until the receiver has merged everything into one core
   (``transfer_status()["complete"]``), after which the manager connects its
   outputs and retires what the event replaces.

It works through the control loop's public methods (``peers``, ``cover_peer``,
``notice_failures``, ``record``), its topology and the deployment's
``mark_failed``.

Progress is a dict per transfer in ``manager.transfers`` (and
``Deployment.transfers()``): strategy, bins, steps done, peer(s), restarts,
times; each step and restart is also a coordinator event (``kind="transfer"``).

>>> dep.move_replica("counts", 0, "s3", strategy="fluid", bits=6)["handover"]   # doctest: +SKIP
"""
from __future__ import annotations

import time

import ray

from ...replica.transfer import plan_transfer, splittable
from .common import is_actor_death

__all__ = ["staged_install"]


def staged_install(mgr, label: str, handle, pending: set, strategy: str, bins_per_step: int | None = None,
                   bits: int = 8, step_timeout_s: float = 120.0, force_after_s: float = 0.5,
                   poll_s: float = 0.002) -> dict:
    """Move a live peer's state into the pending replica ``label`` (``handle``) in steps.

    ``force_after_s``: if the peer has not taken a step after this long (no punctuation came,
    e.g. the input paused), it is asked to take it at once. Returns the hand-over record. A
    transfer that cannot finish (the receiver died, no live peer is left, a step timed out) is
    marked ``"failed"`` with the reason in ``dep.transfers()``, and the error is raised.
    """
    before = len(mgr.transfers)
    try:
        return _staged_install(mgr, label, handle, pending, strategy, bins_per_step, bits, step_timeout_s,
                               force_after_s, poll_s)
    except Exception as e:
        progress = mgr.transfers[before] if len(mgr.transfers) > before else None
        receiver_died = is_actor_death(e) or not mgr.topology.is_running(label)
        why = (f"receiver {label} died: {type(e).__name__}" if receiver_died else f"{type(e).__name__}: {e}")
        if progress is not None:
            progress["state"], progress["error"] = "failed", why
        mgr.record({"kind": "transfer", "action": "failed", "replica": label, "error": why,
                    "text": f"transfer to {label} failed: {why}"})
        raise


def _staged_install(mgr, label, handle, pending, strategy, bins_per_step, bits, step_timeout_s, force_after_s,
                    poll_s) -> dict:
    topo = mgr.topology
    op = topo.replica(label).operator
    split = splittable(mgr.dep.query, op)
    steps = plan_transfer(strategy, bits, bins_per_step, split)
    ray.get(handle.begin_transfer.remote(bits), timeout=120)
    progress = {"replica": label, "operator": op, "strategy": strategy, "bits": bits,
                "splittable": split, "steps": len(steps), "done": 0, "peer": None, "peers": [],
                "restarts": 0, "state": "running", "started_s": round(mgr.now(), 3), "step_s": [],
                "added_streams": []}
    mgr.transfers.append(progress)
    t0 = time.time()

    def pick_peer() -> str:
        peers = mgr.peers(label, pending)
        if not peers:
            progress["state"] = "failed"
            raise RuntimeError(f"transfer to {label}: no live peer of {op!r} left")
        peer = peers[0]
        progress["added_streams"] += mgr.cover_peer(label, peer)
        progress["peer"] = peer
        return peer

    peer = pick_peer()
    for i, bins in enumerate(steps):
        asked_at = None
        forced = False
        while True:
            if not topo.is_running(peer):
                dead = peer
                mgr.notice_failures()
                peer = pick_peer()
                progress["restarts"] += 1
                mgr.record({"kind": "transfer", "action": "restart", "replica": label, "step": i,
                            "dead_peer": dead, "peer": peer,
                            "text": f"transfer to {label}: peer {dead} died before step {i}; "
                                    f"steps {i}..{len(steps) - 1} restart from {peer}"})
                asked_at = None
            if asked_at is None:
                try:
                    ray.get(topo.handle(peer).request_step.remote(handle, i, bins, bits), timeout=60)
                except Exception:  # the peer died: marked failed, and the loop picks another
                    if topo.is_running(peer):
                        mgr.dep.mark_failed(peer, "died during a state transfer")
                    continue
                asked_at, forced = time.time(), False
            status = ray.get(handle.transfer_status.remote(), timeout=60)
            if i in status["installed"] or status["complete"]:
                break
            if time.time() - asked_at > step_timeout_s:
                progress["state"] = "failed"
                raise TimeoutError(f"transfer to {label}: step {i} not installed after {step_timeout_s} s")
            if not forced and time.time() - asked_at > force_after_s:
                # sent, not awaited: if the peer died, the next round notices it (topology)
                topo.handle(peer).request_step.remote(handle, i, bins, bits, True)
                forced = True
            time.sleep(poll_s)
        progress["done"] = i + 1
        progress["peers"].append(peer)
        progress["step_s"].append(round(time.time() - t0, 4))
    # every bin is in; the receiver completes once its cores agree on a punctuation
    deadline = time.time() + step_timeout_s
    while True:
        status = ray.get(handle.transfer_status.remote(), timeout=60)
        if status["complete"]:
            break
        if time.time() > deadline:
            progress["state"] = "failed"
            raise TimeoutError(f"transfer to {label}: all steps installed but no common punctuation "
                               f"after {step_timeout_s} s ({status})")
        time.sleep(poll_s)
    progress["state"] = "complete"
    progress["seconds"] = round(time.time() - t0, 4)
    reports = {}
    for p in set(progress["peers"]):
        try:
            reports[p] = ray.get(topo.handle(p).transfer_report.remote(), timeout=30)
        except Exception:  # a peer that died after its steps: no report from it (its steps count anyway)
            reports[p] = None
    taken = [r for rep in reports.values() if rep for r in rep]
    progress["max_checkpoint_s"] = max((r["checkpoint_s"] + r["send_s"] for r in taken), default=None)
    progress["bytes"] = sum(r["bytes"] for r in taken)
    mgr.record({"kind": "transfer", "action": "complete", "replica": label, "strategy": strategy,
                "steps": len(steps), "seconds": progress["seconds"], "restarts": progress["restarts"],
                "text": f"transfer to {label}: {len(steps)} step(s) of {strategy} in {progress['seconds']:.3f} s"})
    return {"peer": progress["peers"][-1] if progress["peers"] else None, "strategy": strategy,
            "steps": len(steps), "restarts": progress["restarts"], "seconds": progress["seconds"],
            "extra_streams": progress["added_streams"], "max_checkpoint_s": progress["max_checkpoint_s"],
            "bytes": progress["bytes"], **{k: status.get(k) for k in ("merges", "early_tuples")}}
