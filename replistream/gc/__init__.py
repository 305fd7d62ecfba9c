"""Replica utility, garbage collection (Algorithm 6, Hwang §V-B) and revival (§V-C).

Imported as ``replistream.gc`` (a top-level ``gc`` would collide with Python's
built-in module, which is also why the collector is :func:`collect_garbage`
and not ``collect``). Pure decisions over plain data, shared by the Ray
runtime's coordinator and the simulator; the engines apply them.

* :mod:`~replistream.gc.snapshot`: :class:`Snapshot` of a deployment
  (:class:`OperatorReplica`, :class:`StreamReplica` with rate, latency, cost
  = rate x latency, duplicate-filter weight), :func:`snapshot_from_plan`,
  JSON round trip;
* :mod:`~replistream.gc.utility`: :func:`utilities` propagated from the
  applications upstream;
* :mod:`~replistream.gc.garbage`: :func:`dependents`, :func:`choose_discard`
  (``D*``), :func:`collect_step` (one period), :func:`collect_garbage`
  (until cost <= theta), each decision an explained :class:`Discard`;
* :mod:`~replistream.gc.revival`: :func:`plan_revival` on delays,
  :func:`revive_proactively` under theta, :class:`RevivalPolicy`, each
  decision an explained :class:`RevivalEvent`; :class:`RevivalDamper`
  (persistence, hysteresis and a hold period against revive/discard oscillation);
* :mod:`~replistream.gc.partitions`: :func:`partition_view`, the snapshot in which
  both work per partition replica of a partitioned operator (issue #41).

docs/gc.md explains the model and every decision the paper leaves open.

>>> from replistream import Query
>>> q = Query(); s = q.source("s", {"x": "i8"})
>>> s.filter(lambda b: b["x"] > 0, name="f").sink("app")
'app'
>>> lat = {("a", "a"): 1, ("a", "b"): 10, ("a", "c"): 50, ("b", "d"): 10, ("c", "d"): 60}
>>> snap = snapshot_from_plan(q.build(), {"entry": ["a"], "f": ["b", "c"], "app": ["d"]},
...                           latency=lat, weights={"f#0->app:0": 9, "f#1->app:0": 1}, theta=50)
>>> result = collect_garbage(snap)
>>> [d.replicas for d in result.decisions], result.cost_after
([('f#1',)], 20.0)
"""
from .partitions import PartitionView, partition_view
from .garbage import (Discard, GCResult, Group, candidate_groups, choose_discard, collect_garbage, collect_step,
                      dependents, discard, explain_dependents)
from .revival import ACTIONS, RevivalDamper, RevivalEvent, RevivalPolicy, apply_revival, plan_revival, revive_proactively
from .snapshot import ENTRY, OperatorReplica, Snapshot, StreamReplica, replica_index, snapshot_from_plan
from .utility import Utilities, shares, utilities

__all__ = [
    "ENTRY", "OperatorReplica", "StreamReplica", "Snapshot", "snapshot_from_plan", "replica_index",
    "Utilities", "utilities", "shares",
    "Group", "Discard", "GCResult", "dependents", "explain_dependents", "candidate_groups", "choose_discard",
    "discard", "collect_step", "collect_garbage",
    "PartitionView", "partition_view",
    "ACTIONS", "RevivalEvent", "RevivalPolicy", "RevivalDamper", "plan_revival", "revive_proactively", "apply_revival",
]
