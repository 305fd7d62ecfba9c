"""engines/ray/lockorder.py records what it should (issue #40, point 5): run in a process of its own,
since a deliberate inversion would stay in this process's record (tests/ray/test_lock_order.py
checks that record)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, threading
from replistream.engines.ray import lockorder as lo
outer, inner, box1, box2 = lo.lock("A.lock", 1), lo.rlock("A.inner", 2), lo.rlock("Outbox.lock", 3), lo.rlock("Outbox.lock", 3)
cv = lo.condition(box1)
with outer, inner, box1:   # in order
    with box1:             # re-entering an RLock is no violation
        pass
def waiter():
    with cv:
        cv.wait(0.05)      # a wait releases the lock whole and takes it back
t = threading.Thread(target=waiter, name="waiter"); t.start(); t.join(30)
first = lo.report()
with inner:
    with outer:            # taken after a later lock: a violation
        pass
with box1:
    with box2:             # two locks of one rank at once: a violation
        pass
print(json.dumps([first, lo.report()]))
"""


def _run(env_value: str):
    env = {**os.environ, "REPLISTREAM_LOCK_ORDER": env_value}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_an_inverted_order_and_two_locks_of_one_rank_are_recorded():
    first, last = _run("1")
    assert first["on"] and first["violations"] == [] and ["A.lock", "A.inner"] in first["nested"]
    got = [(v["held"], v["taken"], v["why"]) for v in last["violations"]]
    assert got == [("A.inner", "A.lock", "taken after a later lock"), ("Outbox.lock", "Outbox.lock", "same rank")]


def test_off_it_makes_plain_locks_and_records_nothing():
    first, last = _run("0")
    assert not last["on"] and last["acquired"] == 0 and last["violations"] == []
