"""A campaign's audit (replistream/chaos.py, _unseen_drops): every running non-entry replica is asked
for its duplicate filters' stats at once; the ones whose filters dropped tuples as copies without
ever passing them are named with the port, the count and the sample, the others left out, and a
replica that does not answer within the deadline is left out too."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import ray

from replistream.chaos import _unseen_drops

pytestmark = pytest.mark.usefixtures("ray_session")


@ray.remote
def _never_answers():
    time.sleep(60)


class _Handle:
    def __init__(self, answer=None):
        self.refs = []

        def remote():
            ref = ray.put(answer) if answer is not None else _never_answers.remote()
            self.refs.append(ref)
            return ref
        self.stats = SimpleNamespace(remote=remote)


def test_the_replicas_that_dropped_unseen_tuples_are_named():
    lost = {"unseen_drops": 2, "unseen_sample": [(0, 5, 13), (0, 6, 14)]}
    clean = {"unseen_drops": 0, "unseen_sample": []}
    handles = {"join#0": _Handle({"core": {"filters": [clean, lost]}}),
               "join#1": _Handle({"core": {"filters": [clean, clean]}}),
               "out": _Handle({"filters": [lost]}),
               "entry#0": _Handle({"filters": [lost]}),  # (entry points have no duplicate filter: not asked)
               "stopped#0": _Handle()}
    replicas = [SimpleNamespace(label=lab, kind="entry" if lab.startswith("entry") else "operator") for lab in handles]
    topo = SimpleNamespace(replicas=lambda: replicas, handle=handles.get, is_running=lambda lab: True)
    try:
        got = _unseen_drops(SimpleNamespace(topology=topo), wait_s=1.0)
    finally:
        for ref in handles["stopped#0"].refs:
            ray.cancel(ref, force=True)
    sample = [(0, 5, 13), (0, 6, 14)]
    assert got == {"join#0": {1: {"n": 2, "sample": sample}}, "out": {0: {"n": 2, "sample": sample}}}
    assert not handles["entry#0"].refs
