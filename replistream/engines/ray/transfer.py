"""The coordinator's side of a staged state transfer on Ray (Megaphone §3.3, docs/migration.md).

:meth:`ReplicaManager.replace_replica(..., strategy=...)
<replistream.engines.ray.control.ReplicaManager.replace_replica>` starts the new
replica pending and subscribed to every live upstream replica (as for any
hand-over), then calls :func:`staged_install`, which

1. plans the steps (:func:`replistream.replica.plan_transfer`; one step if the
   operator's state does not split by key);
2. turns the new replica into a :class:`~replistream.replica.StagedReplica`
   (``begin_transfer``): what it buffered goes through it;
3. asks a live peer for every step at once (``request_steps``): at each of its
   punctuations (a logical time), between two deliveries, the peer takes the next
   step, and more while the pause stays within ``pause_ms`` beyond a step's fixed
   cost, as one checkpoint of those bins with the part of its retained output
   not yet sent, and sends it straight to the receiver (``install_step``), then
   goes on processing; the coordinator only watches the receiver's progress, so
   steps are paced by the peer's punctuations, not by round trips;
4. if the peer dies before every step is installed, asks another live peer for
   the steps not installed (any live peer will do: each step carries its own
   filter state);
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
                   bits: int = 8, pause_ms: float = 20.0, step_timeout_s: float = 120.0,
                   force_after_s: float = 0.5, poll_s: float = 0.005) -> dict:
    """Move a live peer's state into the pending replica ``label`` (``handle``) in steps.

    ``pause_ms``: the longest pause the peer takes at one punctuation beyond a step's fixed cost;
    it takes the next step, and as many more as fit (0: one step per punctuation).
    ``force_after_s``: if no step was installed for this long (no punctuation came, e.g. the
    input paused), the peer is asked to take its next step(s) at once, and again after each
    further ``force_after_s``. ``step_timeout_s``: with no
    step installed for this long, the transfer fails. Returns the hand-over record. A
    transfer that cannot finish (the receiver died, no live peer is left, a step timed out) is
    marked ``"failed"`` with the reason in ``dep.transfers()``, and the error is raised.
    """
    before = len(mgr.transfers)
    try:
        return _staged_install(mgr, label, handle, pending, strategy, bins_per_step, bits, pause_ms,
                               step_timeout_s, force_after_s, poll_s)
    except Exception as e:
        progress = mgr.transfers[before] if len(mgr.transfers) > before else None
        receiver_died = is_actor_death(e) or not mgr.topology.is_running(label)
        why = (f"receiver {label} died: {type(e).__name__}" if receiver_died else f"{type(e).__name__}: {e}")
        if progress is not None:
            progress["state"], progress["error"] = "failed", why
        mgr.record({"kind": "transfer", "action": "failed", "replica": label, "error": why,
                    "text": f"transfer to {label} failed: {why}"})
        raise


def _staged_install(mgr, label, handle, pending, strategy, bins_per_step, bits, pause_ms, step_timeout_s,
                    force_after_s, poll_s) -> dict:
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
    requested = False
    seen: set[int] = set()
    last_progress = time.time()
    forced = 0.0  # when the peer was last asked to take a step at once
    while True:
        if not topo.is_running(peer):
            dead = peer
            mgr.notice_failures()
            peer = pick_peer()
            progress["restarts"] += 1
            first = min(set(range(len(steps))) - seen, default=len(steps))
            mgr.record({"kind": "transfer", "action": "restart", "replica": label, "step": first,
                        "dead_peer": dead, "peer": peer,
                        "text": f"transfer to {label}: peer {dead} died with {len(steps) - len(seen)} step(s) "
                                f"not installed (first {first}); they restart from {peer}"})
            requested = False
        if not requested:
            # every step not installed yet, at once: the peer takes them at its punctuations,
            # more than one per punctuation while its pause stays within pause_ms
            todo = [(i, steps[i]) for i in range(len(steps)) if i not in seen]
            try:
                ray.get(topo.handle(peer).request_steps.remote(handle, todo, bits, pause_ms / 1e3), timeout=60)
            except Exception as e:  # the peer died: marked failed, and the loop picks another
                if not is_actor_death(e):
                    raise  # anything else fails the transfer loudly (staged_install records it)
                if topo.is_running(peer):
                    mgr.dep.mark_failed(peer, "died during a state transfer")
                continue
            requested, last_progress, forced = True, time.time(), 0.0
        status = ray.get(handle.transfer_status.remote(), timeout=60)
        new = {int(i) for i in status["installed"]} - seen
        if new:
            seen |= new
            now = round(time.time() - t0, 4)
            for i in sorted(new):
                progress["peers"].append(peer)
                progress["step_s"].append(now)
            progress["done"] = len(seen)
            last_progress, forced = time.time(), 0.0
        if len(seen) == len(steps) or status["complete"]:
            break
        if time.time() - last_progress > step_timeout_s:
            progress["state"] = "failed"
            first = min(set(range(len(steps))) - seen)
            raise TimeoutError(f"transfer to {label}: step {first} not installed after {step_timeout_s} s")
        if time.time() - max(last_progress, forced) > force_after_s:
            # no punctuation came (the input paused): the peer takes its next step(s) now, and
            # again after each further force_after_s without progress (sent, not awaited: if the
            # peer died, the next round notices it in the topology)
            topo.handle(peer).take_steps_now.remote()
            forced = time.time()
        time.sleep(poll_s)
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
    progress["sends"] = len(taken)  # checkpoints sent: steps taken at one punctuation go as one
    mgr.record({"kind": "transfer", "action": "complete", "replica": label, "strategy": strategy,
                "steps": len(steps), "seconds": progress["seconds"], "restarts": progress["restarts"],
                "text": f"transfer to {label}: {len(steps)} step(s) of {strategy} in {progress['seconds']:.3f} s"})
    return {"peer": progress["peers"][-1] if progress["peers"] else None, "strategy": strategy,
            "steps": len(steps), "restarts": progress["restarts"], "seconds": progress["seconds"],
            "extra_streams": progress["added_streams"], "max_checkpoint_s": progress["max_checkpoint_s"],
            "bytes": progress["bytes"], "sends": progress["sends"], "pause_ms": pause_ms,
            **{k: status.get(k) for k in ("merges", "early_tuples")}}
