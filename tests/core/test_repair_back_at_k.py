"""A repair (or a try of it made again, engines/ray/repair.py) that finds its group back at k live
replicas (a try before it that did finish, a revival, a host restored that scheduled it once more)
adds no replica: it is recorded as not needed, and nothing is built."""
from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from replistream.engines.ray.repair import Repairer

_spec = importlib.util.spec_from_file_location("repairs_cut_short_cases",
                                               Path(__file__).parent / "test_repairs_cut_short.py")
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)


def _plane(k: int, changes=()):
    _, topo = _cases.fig1_topology(["a", "b", "c"])
    built = []

    def control_loop():  # what a repair that goes ahead asks for: a hand-over that builds a replica
        def replace_replica(label):
            built.append(label)
            return {"new_replicas": [{"label": label + "-new"}]}
        return SimpleNamespace(handover=SimpleNamespace(replace_replica=replace_replica))

    plane = SimpleNamespace(topology=topo, k=k, shut_down=False, rescaling=threading.Event(),
                            rescale_done=threading.Event(), delivered=SimpleNamespace(complete=lambda: False),
                            events=[], now=time.time, control_loop=control_loop, changes=list(changes))
    return plane, built


def _repair_one(plane, label: str, attempt: int) -> dict:
    recorded = threading.Event()

    class Records(list):
        def append(self, rec):
            super().append(rec)
            recorded.set()

    rep = Repairer(plane)
    rep.repairs = Records()
    rep._repair_queue.put((label, time.time(), attempt))
    t = threading.Thread(target=rep._repair_loop, daemon=True)
    t.start()
    assert recorded.wait(30), "the repair loop recorded nothing in 30 s"
    plane.shut_down = True
    t.join(timeout=5)
    return rep.repairs[0]


def test_a_try_that_finds_its_group_back_at_k_builds_nothing():
    plane, built = _plane(k=2)  # three replicas placed, one failed: two live, k = 2
    plane.topology.mark_failed("correlate#0")
    rec = _repair_one(plane, "correlate#0", attempt=2)
    assert built == [] and rec["repaired"] is False and "back at k=2" in rec["why"]
    assert [e["event"] for e in plane.events] == ["not_repaired"]


def test_a_group_short_of_k_is_repaired():  # (the negative control: the same loop builds one)
    plane, built = _plane(k=3)
    plane.topology.mark_failed("correlate#0")
    rec = _repair_one(plane, "correlate#0", attempt=2)
    assert built == ["correlate#0"] and rec["repaired"] is True and rec["new"] == "correlate#0-new"


def test_k_is_the_operators_own_after_set_replication():
    """``set_replication("correlate", 3)`` on a k=2 deployment: a crash that leaves two live replicas
    of three is repaired (back at 3), and one that leaves three is not."""
    raised = [{"change": "set_replication", "operator": "correlate", "k": 3}]
    plane, built = _plane(k=2, changes=raised)
    plane.topology.mark_failed("correlate#0")
    rec = _repair_one(plane, "correlate#0", attempt=1)
    assert built == ["correlate#0"] and rec["repaired"] is True
    lowered = raised + [{"change": "set_replication", "operator": "correlate", "k": 1}]
    plane, built = _plane(k=2, changes=lowered)
    plane.topology.mark_failed("correlate#0")
    rec = _repair_one(plane, "correlate#0", attempt=1)
    assert built == [] and "back at k=1" in rec["why"]
