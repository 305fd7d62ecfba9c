"""Who hands state over to a new replica and which feeders it needs (replistream.replica.handover):
the pure decisions the Ray control loop applies (docs/design.md, decision 7)."""
from __future__ import annotations

from replistream.gc import StreamReplica as S
from replistream.replica.handover import missing_feeders, rank_peers, shares_feeders


def streams_two_ports():
    """j#0 and j#1 fed by e#0/e#1 on ports 0 and 1; the new j#2 fed by e#0 on port 0 only."""
    return [S("e#0", "j#0", 0), S("e#1", "j#0", 1),
            S("e#1", "j#1", 0), S("e#0", "j#1", 1),
            S("e#0", "j#2", 0)]


def test_sharing_needs_a_common_feeder_on_every_port_the_peer_is_fed_on():
    st = streams_two_ports()
    assert not shares_feeders(st, "j#2", "j#0")  # port 1 of j#0 comes from e#1 only
    st.append(S("e#1", "j#2", 1))
    assert shares_feeders(st, "j#2", "j#0")
    assert not shares_feeders(st, "j#2", "j#1")  # port 0 of j#1: e#1, not a feeder of j#2's port 0


def test_discarded_stream_replicas_do_not_count():
    st = [S("e#0", "j#0"), S("e#0", "j#1", live=False), S("e#1", "j#1")]
    assert not shares_feeders(st, "j#1", "j#0")  # j#1's e#0 input was discarded
    assert [s.id for s in missing_feeders(st, "j#1", "j#0")] == ["e#0->j#1:0"]
    assert missing_feeders(st, "j#1", "j#0")[0].live


def test_peers_sharing_feeders_come_first_then_by_label():
    st = streams_two_ports() + [S("e#1", "j#2", 1)]
    assert rank_peers("j#2", ["j#1", "j#0"], st) == ["j#0", "j#1"]
    assert rank_peers("j#2", ["j#1"], st) == ["j#1"]
    assert rank_peers("j#2", [], st) == []


def test_missing_feeders_make_the_new_replica_share_them():
    st = streams_two_ports()
    rate = S("e#1", "j#0", 1, rate=7.0, latency_ms=3.0, weight=2.0)
    st[1] = rate
    extra = missing_feeders(st, "j#2", "j#0")
    assert [(s.src, s.dst, s.port, s.rate, s.latency_ms, s.weight) for s in extra] == [("e#1", "j#2", 1, 7.0, 3.0, 0.0)]
    assert shares_feeders(st + extra, "j#2", "j#0")
    assert missing_feeders(st + extra, "j#2", "j#0") == []
