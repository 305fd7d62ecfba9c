"""The failure detector for slowness on its own (no Ray): suspicion and failure only while a peer of
the same node progresses, failure only once a peer has gone past the silent replica's position, and
clearing when it answers again (replistream.engines.ray.detector)."""
from __future__ import annotations

import pytest

from replistream.engines.ray.detector import FailureDetector, check_bounds


def watched(*labels, node="f", **kw):
    d = FailureDetector(**kw)
    for label in labels:
        d.watch(label, node, now=0.0)
    return d


def states(d, now):
    return [(v.label, v.state) for v in d.check(now)]


def test_a_silent_replica_is_suspected_then_failed_while_its_peer_answers_and_goes_past_it():
    d = watched("f#0", "f#1", suspect_after_s=1.0, fail_after_s=3.0)
    d.answered("f#0", 0.2, position=5)
    d.asked("f#0", 0.3)
    for t in (0.5, 1.0, 1.5, 2.0, 2.5):
        d.answered("f#1", t, position=int(t * 10))
    assert states(d, 1.4) == [("f#0", "suspected")]
    assert d.is_suspected("f#0") and not d.is_suspected("f#1")
    d.answered("f#1", 3.3, position=40)
    assert states(d, 3.3) == [("f#0", "failed")]
    assert states(d, 10.0) == []  # failed stays failed, reported once


def test_nothing_is_declared_when_no_peer_progresses():
    d = watched("f#0", "f#1", suspect_after_s=1.0, fail_after_s=3.0)
    d.asked("f#0", 0.0)
    d.asked("f#1", 0.0)
    assert states(d, 100.0) == []  # the whole node is silent: nothing to mask with


def test_a_peer_stuck_at_the_same_position_does_not_make_it_fail():
    """A user function hanging on some rows hangs every replica there: the first to reach them is
    suspected, but not declared failed while its peer has not gone past it."""
    d = watched("f#0", "f#1", suspect_after_s=1.0, fail_after_s=3.0)
    d.answered("f#0", 0.0, busy_s=0.0, position=7)
    d.answered("f#0", 5.0, busy_s=5.0, position=7)  # busy in one call for 5 s
    d.answered("f#1", 5.0, busy_s=0.0, position=7)  # answering, but not past position 7
    assert states(d, 5.0) == [("f#0", "suspected")]
    d.answered("f#1", 5.5, position=9)
    assert states(d, 5.5) == [("f#0", "failed")]


def test_a_replica_just_watched_is_no_progressing_peer_until_it_answers():
    """A replica added mid-run (a move's receiver) is watched before its actor answers: until its
    first answer it must not make a busy peer (a sender taking a large checkpoint) fail."""
    d = watched("f#0", suspect_after_s=1.0, fail_after_s=3.0)
    d.answered("f#0", 0.0, position=7)
    d.answered("f#0", 5.0, busy_s=4.5, position=7)  # in one long call
    d.watch("f#1", "f", now=5.0)  # the new replica, not started yet
    assert states(d, 5.2) == []  # nobody to compare with
    d.answered("f#1", 5.4, position=None, pending=True)  # it answers, still waiting for its state
    assert states(d, 5.4) == []
    d.answered("f#1", 6.0, position=9)  # it has its state and goes past f#0
    assert states(d, 6.0) == [("f#0", "failed")]


def test_answering_again_clears_a_suspicion():
    d = watched("f#0", "f#1", suspect_after_s=1.0, fail_after_s=5.0)
    d.asked("f#0", 0.0)
    d.answered("f#1", 1.5, position=1)
    assert states(d, 1.5) == [("f#0", "suspected")]
    d.answered("f#0", 2.0, position=1)
    assert states(d, 2.0) == [("f#0", "cleared")] and not d.is_suspected("f#0")


def test_replicas_of_other_nodes_are_no_peers():
    d = FailureDetector(suspect_after_s=1.0, fail_after_s=2.0)
    d.watch("f#0", "f", 0.0)
    d.watch("g#0", "g", 0.0)
    d.asked("f#0", 0.0)
    d.answered("g#0", 3.0, position=100)
    assert states(d, 3.0) == []


@pytest.mark.parametrize("bad", [(0, 1), (2, 1), (float("nan"), 1), (1, float("inf")), (True, 2), ("1", 2)])
def test_bounds_are_checked(bad):
    with pytest.raises(ValueError):
        check_bounds(*bad)


def test_a_replica_in_a_call_its_peer_also_took_long_for_gets_that_long_on_top():
    """A punctuation that releases a large backlog makes one long call on every replica; on a busier
    core one replica finishes seconds after its peer. It is declared failed only after
    ``fail_after_s`` plus twice the longest call the peer past it was seen in (here 3 + 2 x 5 s),
    not as soon as its call outlasts ``fail_after_s``; one whose probes go unanswered gets no
    such allowance, and one that hangs in a call its peer passed quickly fails as before."""
    d = watched("f#0", "f#1", suspect_after_s=1.0, fail_after_s=3.0)
    for t in (1.0, 3.0, 5.0):  # f#1 in the long call, then past it
        d.answered("f#1", t, busy_s=t, position=7)
    d.answered("f#1", 5.5, position=9)
    d.answered("f#0", 6.0, busy_s=6.0, position=7)  # the same call, still running
    assert states(d, 6.0) == [("f#0", "suspected")]
    d.answered("f#0", 12.5, busy_s=12.5, position=7)
    d.answered("f#1", 12.5, position=11)
    assert states(d, 12.5) == []  # 12.5 s < 3 + 2 x 5 s
    d.answered("f#0", 13.5, busy_s=13.5, position=7)
    d.answered("f#1", 13.5, position=12)
    assert states(d, 13.5) == [("f#0", "failed")]

    d = watched("f#0", "f#1", suspect_after_s=1.0, fail_after_s=3.0)
    d.answered("f#1", 5.0, busy_s=5.0, position=7)
    d.answered("f#1", 5.5, position=9)
    d.answered("f#0", 1.0, position=7)
    d.asked("f#0", 1.5)  # never answered: a stopped process
    assert states(d, 3.9) == [("f#0", "suspected")]
    assert states(d, 4.1) == [("f#0", "failed")]  # 3 s after its last answer, the peer's long call no matter

    d = watched("f#0", "f#1", suspect_after_s=1.0, fail_after_s=3.0)
    d.answered("f#1", 0.5, busy_s=0.2, position=7)
    d.answered("f#1", 1.0, position=9)
    d.answered("f#0", 3.5, busy_s=3.5, position=7)  # hangs where its peer spent 0.2 s
    assert states(d, 3.5) == [("f#0", "failed")]  # 3.5 s >= 3 + 2 x 0.2 s
