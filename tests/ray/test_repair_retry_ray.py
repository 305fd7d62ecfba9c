"""A repair that fails is tried again (engines/ray/repair.py, ``REPAIR_ATTEMPTS``): a fault during
the hand-over of a crashed replica's repair (here the first install raises, as when the peer it
copies from is killed meanwhile) is logged, the repair is tried again a second later from a
live peer, the operator is back to k replicas, and the output equals the reference."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import ray

from replistream import deploy, seconds
from replistream.sources import Call, KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference

_spec = importlib.util.spec_from_file_location("repair_cases", Path(__file__).parent / "test_repair.py")
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)
SERVERS, inputs, query, repaired = _cases.SERVERS, _cases.inputs, _cases.query, _cases.repaired

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


def _fail_first_install_then_crash(label):
    def go(d):
        handover = d.control_loop().handover
        install, calls = handover._install, []

        def failing_once(*args, **kwargs):
            calls.append(args[0])
            if len(calls) == 1:
                raise RuntimeError("injected: the peer's checkpoint could not be fetched")
            return install(*args, **kwargs)

        handover._install = failing_once
        ray.kill(d.topology.handle(label), no_restart=True)
    return Call(go)


def test_a_repair_that_fails_once_is_tried_again_and_the_operator_is_back_to_k():
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    s = inject_at(data["s"], seconds(15), _fail_first_install_then_crash("per_k#0"))
    s = inject_at(s, seconds(16), repaired("per_k#0"))
    s = inject_at(s, seconds(30), KillReplica("per_k", 1))  # the repaired replica then carries the run
    with deploy(q, servers=SERVERS, k=2, repair=True) as dep:
        res = dep.run({"s": s}, pace=None, timeout=300)
        tries = [r for r in dep.repairs if r["replica"] == "per_k#0"]
        events = [e for e in dep.events if e.get("event") == "repair_failed"]
        live = [r.label for r in dep.topology.replicas("per_k") if r.state == "live"]
    assert [(r["attempt"], r["repaired"], r.get("retrying")) for r in tries] == [(1, False, True), (2, True, None)], tries
    assert "injected" in tries[0]["why"] and events and events[0]["retrying"] is True, (tries, events)
    assert tries[1]["new"] in live  # (the half-started replica of the first try is not)
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])
