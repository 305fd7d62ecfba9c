"""A host restored while a repair was between two tries (engines/ray/repair.py tries a failed
repair again) schedules it again: a try that will be made again is not a repair done
(``lifecycle._repairs_cut_short``); a repair whose last try failed is not tried once more."""
from __future__ import annotations

from types import SimpleNamespace

from replistream.engines.ray.lifecycle import _repairs_cut_short
from replistream.engines.ray.topology import Topology
from replistream.plan import PhysicalPlan
from replistream.workloads import fig1_query


def fig1_topology(servers: list[str], parallelism: dict | None = None):
    """The Fig. 1 query and a topology of it with every operator on ``servers`` (applications on
    the first), every replica attached to a stand-in handle (also used by test_repair_back_at_k.py)."""
    q = fig1_query(2)
    placement = {n: list(servers) for n in ["entry", *q.operators]}
    placement.update({n: [servers[0]] for n in q.sinks})
    topo = Topology(PhysicalPlan(q, placement, parallelism=parallelism or {}))
    for r in topo.replicas():
        topo.attach(r.label, f"handle:{r.label}")
    return q, topo


def _deployment(repairs):
    q, topo = fig1_topology(["a", "b"])
    topo.mark_failed("correlate#0")
    scheduled = []
    repairer = SimpleNamespace(repairs=repairs, _schedule_repair=lambda label, why: scheduled.append(label))
    return SimpleNamespace(topology=topo, query=q, k=2, repairer=repairer, changes=[]), scheduled


def test_a_repair_between_two_tries_is_scheduled_again_by_the_restored_host():
    dep, scheduled = _deployment([{"replica": "correlate#0", "repaired": False, "attempt": 1, "retrying": True}])
    assert _repairs_cut_short(dep) == ["correlate#0"] and scheduled == ["correlate#0"]


def test_a_repair_whose_last_try_failed_or_that_was_never_begun():
    dep, scheduled = _deployment([{"replica": "correlate#0", "repaired": False, "attempt": 3, "retrying": False}])
    assert _repairs_cut_short(dep) == [] and scheduled == []  # (its warning was given; k-1 live)
    dep, scheduled = _deployment([])
    assert _repairs_cut_short(dep) == ["correlate#0"]  # queued, not begun, when the host was lost


def test_a_partitions_repair_is_scheduled_again_though_the_operator_has_k_live_replicas():
    """A partitioned operator is k replicas per partition: a failed replica of partition 1 is one
    lacking from its partition, whatever the other partition holds (before, the operator's replicas
    were counted together, 3 live of 4 >= k = 2, and the repair was never scheduled again)."""
    q, topo = fig1_topology(["a", "b"], parallelism={"correlate": 2})
    assert [r.label for r in topo.copies("correlate.1#0")] == ["correlate.1#0", "correlate.1#1"]
    topo.mark_failed("correlate.1#0")
    scheduled = []
    repairer = SimpleNamespace(repairs=[], _schedule_repair=lambda label, why: scheduled.append(label))
    dep = SimpleNamespace(topology=topo, query=q, k=2, repairer=repairer, changes=[])
    assert _repairs_cut_short(dep) == ["correlate.1#0"] and scheduled == ["correlate.1#0"]



def test_an_operators_own_k_after_set_replication():
    """After ``set_replication("correlate", 3)`` (three replicas placed, one failed: two live), the
    restored host schedules its repair; with the deployment's k = 2 it would not."""
    q, topo = fig1_topology(["a", "b", "c"])
    topo.mark_failed("correlate#0")
    for changes, want in (([{"change": "set_replication", "operator": "correlate", "k": 3}], ["correlate#0"]),
                          ([], [])):
        scheduled = []
        repairer = SimpleNamespace(repairs=[], _schedule_repair=lambda label, why: scheduled.append(label))
        dep = SimpleNamespace(topology=topo, query=q, k=2, repairer=repairer, changes=changes)
        assert _repairs_cut_short(dep) == want and scheduled == want
