"""The Ray engine: a replicated query on Ray actors over an emulated wide-area network
(Hwang §II-B; docs/design.md, decisions 3-7), with the coordinator loop of garbage
collection and revival (Hwang §V-B, §V-C) and changes at logical times (decision 8).

Read top-down:

* :mod:`.deployment`: :func:`deploy` (every check before any actor starts);
  :mod:`.client`: :class:`Deployment`, what a user holds: a thin client that
  forwards run, feed, wait, results, metrics, failure injection, network
  conditions, moves and changes to the control plane;
* :mod:`.plane`: the control plane, split by responsibility: :mod:`.monitor`
  (failure detection), :mod:`.repair`, :mod:`.coordlink`, :mod:`.results`,
  :mod:`.faults`, :mod:`.ingest`, :mod:`.changes`; :mod:`.host` and
  :mod:`.lifecycle` run it detached and restore it;
* :mod:`.resolve`: what ``deploy()`` was given, resolved: servers, placement
  (:func:`spread_placement`, :data:`PLACEMENTS`), the emulated network;
* :mod:`.topology`: the one live view of replicas and stream replicas, built from
  :class:`~replistream.plan.PhysicalPlan`;
* :mod:`.feeder`: the driver-side feeder (event-time merge, pacing, sentinels,
  markers after everything fed);
* :mod:`.actors`: entry points, operator replicas, applications (each hosting the
  core); :mod:`.coordinator`: the coordinator actor (the placement plan);
* :mod:`.channels`: stream replicas between actors (batching, emulated delay,
  backpressure, retention and replay with :class:`~replistream.replica.ReplayLog`);
* :mod:`.control`: :class:`GCConfig` and :class:`ReplicaManager`, the garbage
  collection and revival loop (:mod:`.meter`: what it measures; :mod:`.handover`:
  the hand-overs it applies); :mod:`.transfer`: the coordinator's side of a
  staged state transfer;
* :mod:`.reconfigure`: changes to the running query.

**Locks of the driver** (the actors have their own, in their processes). Four
locks exist; a thread holding one may take only those *below* it, never one
above:

1. ``ReplicaManager.lock`` (re-entrant; :mod:`.control`): one control action at a
   time: a utility period, a revival or hand-over by request, a change to the
   running query. Held across actor calls (seconds).
2. ``Feeder.lock`` (re-entrant; :mod:`.feeder`): what the feeder has sent (sequence
   numbers, open sources, the largest timestamp): no chunk is sent while it is held,
   so a marker goes after everything fed so far. Held across the sending of one chunk.
3. ``Delivered.lock`` (:mod:`.results`): the applications' outputs fetched so far
   (polling, and adding an application at run time).
4. ``Topology.lock`` (re-entrant; :mod:`.topology`): the replica and stream-replica
   table. Innermost: nothing is called (no actor call, no other lock) while it is held.

Who takes what: the feeder thread takes 2 (then 4) per chunk, and none while it
runs a sentinel, so a sentinel may call anything (including what takes 1); the
control loop takes 1, and 2 only for a change to the running query
(``ControlPlane.quiet()``: 1 then 2; a rescale's ``ControlPlane.gated()`` holds 1
and takes 2 only to set and clear the feeder's gate, while the feeder thread, at a
chunk past the gate, waits on 2's condition, releasing it); ``Results.poll`` takes 3 (then 4);
adding an operator takes 1, 2, 3, 4 in that order. Locks 1-3 may be held while
waiting for actor calls; nothing waits for anything while holding 4.

The package's names are loaded on first use (PEP 562): the data-path actors'
processes import only :mod:`.actors` and :mod:`.channels` (and the core), never
the deployment, placement (scipy) or the garbage collector.

>>> import replistream.engines.ray as engine
>>> sorted(engine.__all__)[:4]
['Deployment', 'DeploymentClient', 'GCConfig', 'PLACEMENTS']
>>> dep = engine.deploy(query, servers=4, k=2)   # doctest: +SKIP
"""
from __future__ import annotations

import importlib

__all__ = ["Deployment", "deploy", "init_ray", "RAY_SYSTEM_CONFIG", "spread_placement", "PLACEMENTS", "GCConfig",
           "ReplicaManager", "attach", "list_deployments", "DeploymentClient"]

_WHERE = {"Deployment": "client", "deploy": "deployment", "init_ray": "deployment",
          "RAY_SYSTEM_CONFIG": "deployment", "spread_placement": "resolve", "PLACEMENTS": "resolve",
          "GCConfig": "control", "ReplicaManager": "control", "attach": "host", "list_deployments": "host",
          "DeploymentClient": "host"}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
