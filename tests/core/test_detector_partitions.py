"""The failure detector with partitioned nodes (no Ray): a replica of a partition (``out.1#0``) is
compared only with the replicas of its own partition. Another partition's replicas deliver a
different share of the stream, so their counts say nothing about it, and their progress masks
nothing of it (replistream.engines.ray.detector)."""
from __future__ import annotations

from replistream.engines.ray.detector import FailureDetector


def states(d, now):
    return [(v.label, v.state) for v in d.check(now)]


def partitioned(labels, node="out"):
    d = FailureDetector(suspect_after_s=1.0, fail_after_s=3.0)
    for label in labels:
        d.watch(label, node, now=0.0)
    return d


def test_another_partition_delivering_more_does_not_make_a_busy_replica_fail():
    """out.1#0 is in one long call (its first Parquet commit); out.0#* deliver many more tuples
    (another share of the stream); out.1#1 answers but has delivered no more than out.1#0."""
    d = partitioned(["out.0#0", "out.0#1", "out.1#0", "out.1#1"])
    for t in (0.5, 1.5, 2.5, 3.5, 4.5):
        d.answered("out.0#0", t, position=int(t * 1000))
        d.answered("out.0#1", t, position=int(t * 1000))
        d.answered("out.1#1", t, position=40)
    d.answered("out.1#0", 4.5, busy_s=4.0, position=40)
    assert states(d, 4.5) == [("out.1#0", "suspected")]  # its own partition's peer answers: nothing waits on it
    assert not d.is_suspected("out.1#1")


def test_a_partition_whose_every_replica_is_silent_is_not_failed_by_another_partition():
    """The other partition progresses; partition 1's replicas both stopped answering: nothing to
    mask them with (declaring them failed would lose the partition)."""
    d = partitioned(["out.0#0", "out.0#1", "out.1#0", "out.1#1"])
    d.answered("out.1#0", 0.2, position=5)
    d.answered("out.1#1", 0.2, position=5)
    d.asked("out.1#0", 0.3)
    d.asked("out.1#1", 0.3)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        d.answered("out.0#0", t, position=int(t * 100))
        d.answered("out.0#1", t, position=int(t * 100))
        assert states(d, t) == []
    assert d.suspected() == []


def test_a_peer_of_the_same_partition_that_goes_past_it_still_makes_it_fail():
    """The negative control: within one partition the detector works as for an unpartitioned node."""
    d = partitioned(["out.0#0", "out.0#1", "out.1#0", "out.1#1"])
    d.answered("out.1#0", 0.2, position=5)
    d.asked("out.1#0", 0.3)
    for t in (0.5, 1.0, 1.5, 2.0, 2.5):
        d.answered("out.1#1", t, position=5)
    assert states(d, 1.4) == [("out.1#0", "suspected")]
    d.answered("out.1#1", 3.4, position=6)  # past it now
    assert states(d, 3.4) == [("out.1#0", "failed")]


def test_unpartitioned_replicas_and_other_nodes_keep_their_grouping():
    d = FailureDetector(suspect_after_s=1.0, fail_after_s=2.0)
    for label, node in (("f#0", "f"), ("f#1", "f"), ("out.0#0", "out")):
        d.watch(label, node, now=0.0)
    d.asked("f#0", 0.0)
    d.answered("out.0#0", 2.5, position=100)  # another node, partitioned: no peer of f#0
    d.answered("f#1", 1.0, position=1)
    d.answered("f#1", 2.5, position=3)  # its peer moved
    assert states(d, 2.5) == [("f#0", "failed")]


def test_a_replica_slow_to_answer_its_first_probe_fails_only_once_its_peer_moved():
    """f#1 has not answered its first probe (a slow actor start on loaded cores) while f#0 answers
    from where the run starts: not declared failed for starting slower, only suspected; once f#0
    moves past its first position, f#1's silence is no progress while a peer progresses."""
    d = FailureDetector(suspect_after_s=1.0, fail_after_s=3.0)
    d.watch("f#0", "f", now=0.0)
    d.watch("f#1", "f", now=0.0)
    d.asked("f#1", 0.1)
    for t in (0.5, 1.5, 2.5, 3.5, 4.5):
        d.answered("f#0", t, position=7)  # nothing flowed yet
        d.check(t)
    assert d.watches["f#1"].state == "suspected"  # nothing waits on it
    d.answered("f#0", 5.0, position=9)
    assert [(v.label, v.state) for v in d.check(5.0)] == [("f#1", "failed")]
