"""The retention log of an output stream through a discard and a revival (docs/design.md, decision 7):
what a discarded stream replica's receiver has not acknowledged stays until the coordinator moves
the hold on, releases it, or the stream replica is revived. No actors: an ``Outbox`` alone."""
from __future__ import annotations

import numpy as np

from replistream.engines.ray.channels import Link, Outbox, gone_key
from replistream.schema import TS, Punctuation


def batch(lo: int, hi: int) -> np.ndarray:
    out = np.zeros(hi - lo, dtype=[(TS, "i8"), ("x", "i8")])
    out[TS] = np.arange(lo, hi)
    return out


def logged_ts(ob: Outbox) -> list[int]:
    return [int(t) for it in ob.retained() if not isinstance(it, Punctuation) for t in it[TS]]


def acknowledge(ob: Outbox, label: str, p: int) -> None:
    """``label``'s link acknowledges punctuation ``p`` (as :meth:`Outbox.collect` records it)."""
    for link in ob.links:
        if link.label == label:
            link.acked = p
    ob.collect(set())  # trims the log


def two_receivers(hot0_acked: int) -> Outbox:
    """``correlate#0``'s outbox to ``hot#0`` and ``hot#1``, ts 0-9 and punctuation 9 sent, and
    ``hot#0`` at ``hot0_acked``."""
    ob = Outbox("correlate#0", "a", None, 0.0)
    ob.add_link(Link("hot#0", "b", None, 0, 0))
    ob.add_link(Link("hot#1", "c", None, 0, 0))
    ob.emit([batch(0, 10), Punctuation(9)])
    acknowledge(ob, "hot#0", hot0_acked)
    return ob


def test_a_discard_that_leaves_its_receiver_fed_holds_what_it_lacks():
    ob = two_receivers(hot0_acked=4)
    acknowledge(ob, "hot#1", 9)
    assert logged_ts(ob) == list(range(5, 10))  # hot#0 lacks 5-9

    ob.remove_link("hot#0", 0, hold=True)  # another sender still feeds hot#0
    ob.emit([batch(10, 20), Punctuation(19)])
    acknowledge(ob, "hot#1", 19)
    assert logged_ts(ob) == list(range(5, 20))  # trimmed to the hold, not to hot#1

    assert ob.raise_holds({gone_key("hot#0", 0): 12}) == 1  # hot#0 reported 12
    assert ob.raise_holds({gone_key("hot#0", 0): 8}) == 0  # never lowered
    assert logged_ts(ob) == list(range(13, 20))

    n = ob.add_link(Link("hot#0", "b", None, 0, 1), replay=True)  # revived: replays from its position
    assert n == 7 and gone_key("hot#0", 0) not in ob.holds
    (replay,) = [l for l in ob.links if l.label == "hot#0"]
    assert [int(t) for it in replay.queue[0][1] if not isinstance(it, Punctuation) for t in it[TS]] == \
        list(range(13, 20))


def test_a_hold_is_released_once_nothing_feeds_the_receiver():
    ob = two_receivers(hot0_acked=2)
    ob.remove_link("hot#0", 0, hold=True)
    acknowledge(ob, "hot#1", 9)
    assert logged_ts(ob) == list(range(3, 10))
    assert ob.raise_holds({gone_key("hot#0", 0): None}) == 1  # hot#0 went dormant: a hand-over serves it
    assert logged_ts(ob) == [] and not ob.holds
    assert ob.raise_holds({gone_key("hot#0", 0): 5}) == 0  # a late call brings no hold back


def test_a_discard_without_hold_trims_to_the_remaining_links():
    ob = two_receivers(hot0_acked=2)
    acknowledge(ob, "hot#1", 9)
    ob.remove_link("hot#0", 0)  # the receiver is retired with it
    assert logged_ts(ob) == [] and not ob.holds


def test_the_coordinator_moves_holds_on_and_releases_them():
    """``ReplicaManager._raise_holds`` (no actors): each discarded stream replica's sender is told
    its receiver's acknowledgement while another sender feeds it, and to release the hold once
    nothing does; a receiver that did not report keeps its hold where it was."""
    from types import SimpleNamespace

    from replistream.engines.ray.meter import Meter
    from replistream.gc import StreamReplica

    sent: dict[str, list] = {}

    class Topo:
        def __init__(self, streams, running, live):
            self._streams, self._running, self._live = streams, running, live

        def streams(self, live=None, dst=None):
            return [s for s in self._streams if (live is None or s.live == live) and (dst is None or s.dst == dst)]

        def __contains__(self, label):
            return label in self._running

        def is_running(self, label):
            return self._running.get(label, False)

        def replica(self, label):
            return SimpleNamespace(live=self._live.get(label, False))

        def handle(self, label):
            return SimpleNamespace(raise_holds=SimpleNamespace(remote=lambda pts: sent.setdefault(label, []).append(pts)))

    streams = [StreamReplica("c#0", "h#0", 0, live=False), StreamReplica("c#1", "h#0", 0),
               StreamReplica("c#0", "h#1", 0), StreamReplica("c#1", "h#1", 0, live=False),
               StreamReplica("c#0", "h#2", 0, live=False)]  # h#2: fed by nothing (dormant)
    running = {"c#0": True, "c#1": True, "h#0": True, "h#1": True, "h#2": True}
    topo = Topo(streams, running, {"h#0": True, "h#1": True, "h#2": True})
    meter = Meter(SimpleNamespace(topology=topo))  # what a utility period measures (the control loop's part)
    meter._raise_holds({"h#0": {"acks": [41]}})  # h#1 did not report
    assert sent == {"c#0": [{gone_key("h#0", 0): 41, gone_key("h#2", 0): None}]}
    sent.clear()
    running["c#1"] = False  # h#0's only live feeder is gone: nothing feeds it now
    meter._raise_holds({"h#0": {"acks": [50]}, "h#1": {"acks": [60]}})
    assert sent == {"c#0": [{gone_key("h#0", 0): None, gone_key("h#2", 0): None}]}


def test_a_link_dropped_while_its_receiver_lives_holds_what_it_lacks_until_reconnected():
    """Issue #40: a link dropped for a full queue (a cut) or a stopped receiver is reconnected later
    with a replay; the log must still reach back to the receiver's acknowledgement, as for a
    discard, or the replayed punctuation passes its duplicate filter ahead of tuples it lacks."""
    ob = two_receivers(hot0_acked=4)
    (hot0,) = [l for l in ob.links if l.label == "hot#0"]
    with ob.lock:
        ob._drop_locked(hot0, "network queue over 20000 packets (link cut or far too slow)", hold=True)
    ob.emit([batch(10, 20), Punctuation(19)])
    acknowledge(ob, "hot#1", 19)
    assert logged_ts(ob) == list(range(5, 20))  # trimmed to hot#0's position, not to hot#1's
    assert ob.raise_holds({gone_key("hot#0", 0): 12}) == 1  # the deployment's monitor moves it on
    n = ob.add_link(Link("hot#0", "b", None, 0, 1), replay=True)  # reconnected: replays from there
    assert n == 7 and gone_key("hot#0", 0) not in ob.holds


def test_a_dead_receiver_releases_every_hold_on_it():
    ob = two_receivers(hot0_acked=4)
    ob.remove_link("hot#0", 0, hold=True)
    assert gone_key("hot#0", 0) in ob.holds
    ob.drop("hot#0", "receiver killed")  # (Deployment.mark_failed broadcasts drop_link)
    assert not ob.holds
    acknowledge(ob, "hot#1", 9)
    assert logged_ts(ob) == []
