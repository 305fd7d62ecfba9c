"""Failure-injection scenarios (replistream.scenario)."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replistream.network import GeoLatencyModel, NetworkConditions, ZeroLatency
from replistream.scenario import ACTIONS, Event, Scenario

SERVERS = ["boston", "london", "tokyo", "zurich"]
OPERATORS = {"union": 2, "join": 3}

EXAMPLE = {"events": [
    {"at": 30, "action": "restore", "a": "london", "b": "tokyo"},
    {"at": 5, "action": "kill_server", "server": "boston"},
    {"at": 10, "action": "cut_link", "a": "london", "b": "tokyo"},
    {"at": 12.5, "action": "delay_link", "a": "boston", "b": "zurich", "extra_ms": 250, "duration": 20},
    {"at": 15, "action": "slow_server", "server": "zurich", "factor": 3},
    {"at": 20, "action": "kill_replica", "operator": "join", "replica": 2},
]}

EXAMPLE_TOML = """
[[events]]
at = 30
action = "restore"
a = "london"
b = "tokyo"

[[events]]
at = 5
action = "kill_server"
server = "boston"

[[events]]
at = 10
action = "cut_link"
a = "london"
b = "tokyo"

[[events]]
at = 12.5
action = "delay_link"
a = "boston"
b = "zurich"
extra_ms = 250
duration = 20

[[events]]
at = 15
action = "slow_server"
server = "zurich"
factor = 3

[[events]]
at = 20
action = "kill_replica"
operator = "join"
replica = 2
"""


# -- parsing -----------------------------------------------------------------

def test_from_dict_sorts_by_time_and_converts_numbers():
    sc = Scenario.from_dict(EXAMPLE)
    assert [e.at for e in sc] == [5.0, 10.0, 12.5, 15.0, 20.0, 30.0]
    assert all(isinstance(e.at, float) for e in sc)
    assert sc[2] == Event(12.5, "delay_link", a="boston", b="zurich", extra_ms=250.0, duration=20.0)
    assert sc[2].end == 32.5 and sc[1].end is None
    assert sc[4].replica == 2 and isinstance(sc[4].replica, int)
    assert len(sc) == 6
    sc.validate(SERVERS, OPERATORS)


def test_sort_is_stable_for_equal_times():
    sc = Scenario([Event(1, "kill_server", server="b"), Event(0, "kill_server", server="z"),
                   Event(1, "kill_server", server="a")])
    assert [e.server for e in sc] == ["z", "b", "a"]


def test_json_and_toml_files_give_the_same_scenario(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(EXAMPLE))
    (tmp_path / "s.toml").write_text(EXAMPLE_TOML)
    a = Scenario.from_file(tmp_path / "s.json")
    b = Scenario.from_file(str(tmp_path / "s.toml"))
    assert a == b == Scenario.from_dict(EXAMPLE)


@pytest.mark.parametrize("ext", ["json", "toml", "JSON"])
def test_to_file_round_trip(tmp_path, ext):
    sc = Scenario.from_dict(EXAMPLE)
    path = tmp_path / f"out.{ext}"
    sc.to_file(path)
    assert Scenario.from_file(path) == sc


def test_empty_scenario_round_trips(tmp_path):
    for ext in ("json", "toml"):
        Scenario().to_file(tmp_path / f"e.{ext}")
        assert len(Scenario.from_file(tmp_path / f"e.{ext}")) == 0


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario format"):
        Scenario.from_file(tmp_path / "s.yaml")
    with pytest.raises(ValueError, match="unknown scenario format"):
        Scenario().to_file(tmp_path / "s.txt")
    (tmp_path / "bad.json").write_text("{\"events\": [")
    with pytest.raises(ValueError, match="cannot parse"):
        Scenario.from_file(tmp_path / "bad.json")
    (tmp_path / "bad.toml").write_text("[[events]\nat = ")
    with pytest.raises(ValueError, match="cannot parse"):
        Scenario.from_file(tmp_path / "bad.toml")
    (tmp_path / "typo.json").write_text(json.dumps({"events": [{"at": 1, "action": "kill_server", "sever": "x"}]}))
    with pytest.raises(ValueError, match=r"typo.json: event 0: field 'sever': unknown field"):
        Scenario.from_file(tmp_path / "typo.json")


@pytest.mark.parametrize("data, match", [
    ({"events": [{"action": "kill_server", "server": "x"}]}, r"event 0: field 'at': missing"),
    ({"events": [{"at": 1, "server": "x"}]}, r"event 0: field 'action': missing"),
    ({"events": [{"at": 1, "action": "kill_server", "server": "x"}, 5]}, r"event 1: expected a table"),
    ({"events": {"at": 1}}, r"'events' must be a list"),
    ({"evnts": []}, r"unknown top-level key 'evnts'"),
    ([], r"scenario must be a table"),
])
def test_structural_errors(data, match):
    with pytest.raises(ValueError, match=match):
        Scenario.from_dict(data)


# -- validation -----------------------------------------------------------------

def _one(**kw):
    return Scenario([Event(**kw)])


VALID = [
    dict(at=0, action="kill_replica", operator="join", replica=0),
    dict(at=1, action="kill_server", server="boston"),
    dict(at=2, action="slow_server", server="tokyo", factor=1.0),
    dict(at=2, action="slow_server", server="tokyo", factor=2.0, duration=5),
    dict(at=3, action="delay_link", a="boston", b="tokyo", extra_ms=0.0),
    dict(at=3, action="delay_link", a="boston", b="tokyo", extra_ms=100, duration=1),
    dict(at=4, action="cut_link", a="boston", b="tokyo"),
    dict(at=4, action="cut_link", a="boston", b="tokyo", duration=60),
    dict(at=5, action="restore", a="boston", b="tokyo"),
    dict(at=5, action="restore", server="boston"),
]


@pytest.mark.parametrize("kw", VALID)
def test_valid_events_pass(kw):
    _one(**kw).validate(SERVERS, OPERATORS)
    _one(**kw).validate()


INVALID = [
    (dict(at=1, action="explode"), "action", "unknown action"),
    (dict(at=-1, action="kill_server", server="boston"), "at", "negative time"),
    (dict(at=math.inf, action="kill_server", server="boston"), "at", "finite"),
    (dict(at=math.nan, action="kill_server", server="boston"), "at", "finite"),
    (dict(at="soon", action="kill_server", server="boston"), "at", "finite"),
    (dict(at=1, action="kill_replica", replica=0), "operator", "missing"),
    (dict(at=1, action="kill_replica", operator="join"), "replica", "missing"),
    (dict(at=1, action="kill_server"), "server", "missing"),
    (dict(at=1, action="slow_server", server="boston"), "factor", "missing"),
    (dict(at=1, action="slow_server", factor=2.0), "server", "missing"),
    (dict(at=1, action="delay_link", a="boston", b="tokyo"), "extra_ms", "missing"),
    (dict(at=1, action="delay_link", a="boston", extra_ms=3.0), "b", "missing"),
    (dict(at=1, action="cut_link", b="tokyo"), "a", "missing"),
    (dict(at=1, action="restore"), "server", "needs a and b"),
    (dict(at=1, action="restore", a="boston"), "b", "needs both a and b"),
    (dict(at=1, action="restore", a="boston", b="tokyo", server="zurich"), "server", "not both"),
    (dict(at=1, action="kill_server", server="atlantis"), "server", "unknown server"),
    (dict(at=1, action="cut_link", a="boston", b="atlantis"), "b", "unknown server"),
    (dict(at=1, action="delay_link", a="mars", b="tokyo", extra_ms=1.0), "a", "unknown server"),
    (dict(at=1, action="kill_replica", operator="sorter", replica=0), "operator", "unknown operator"),
    (dict(at=1, action="kill_replica", operator="join", replica=3), "replica", "out of range"),
    (dict(at=1, action="kill_replica", operator="join", replica=-1), "replica", ">= 0"),
    (dict(at=1, action="kill_replica", operator="join", replica=1.0), "replica", "integer"),
    (dict(at=1, action="cut_link", a="boston", b="tokyo", duration=0.0), "duration", "> 0"),
    (dict(at=1, action="cut_link", a="boston", b="tokyo", duration=-5.0), "duration", "> 0"),
    (dict(at=1, action="slow_server", server="boston", factor=0.5), "factor", ">= 1"),
    (dict(at=1, action="delay_link", a="boston", b="tokyo", extra_ms=-1.0), "extra_ms", ">= 0"),
    (dict(at=1, action="kill_server", server="boston", duration=5.0), "duration", "not used by kill_server"),
    (dict(at=1, action="kill_server", server="boston", factor=2.0), "factor", "not used"),
    (dict(at=1, action="cut_link", a="boston", b="boston"), "b", "two different servers"),
    (dict(at=1, action="kill_server", server=""), "server", "non-empty string"),
    (dict(at=1, action="slow_server", server="boston", factor="fast"), "factor", "must be a number"),
]


@pytest.mark.parametrize("kw, field, what", INVALID, ids=[f"{f}-{w}" for _, f, w in INVALID])
def test_each_validation_error_names_event_field_and_problem(kw, field, what):
    ok = Event(0, "kill_server", server="boston")
    sc = Scenario([ok, Event(**kw)]) if kw["at"] != -1 else Scenario([Event(**kw), ok])
    idx = [i for i, e in enumerate(sc) if e is not ok][0]
    with pytest.raises(ValueError) as info:
        sc.validate(SERVERS, OPERATORS)
    msg = str(info.value)
    assert f"event {idx} " in msg
    assert f"field {field!r}" in msg
    assert what in msg


def test_references_are_only_checked_when_given():
    _one(at=1, action="kill_server", server="atlantis").validate()
    _one(at=1, action="kill_replica", operator="nosuch", replica=7).validate(servers=SERVERS)
    with pytest.raises(ValueError, match="unknown server"):
        _one(at=1, action="kill_server", server="atlantis").validate(servers=SERVERS)


def test_every_action_is_documented_in_the_validator():
    assert set(ACTIONS) == {"kill_replica", "kill_server", "slow_server", "delay_link", "cut_link", "restore"}


# -- applying to the network ---------------------------------------------------------

@pytest.fixture
def conditions():
    return NetworkConditions(GeoLatencyModel(SERVERS, seed=1, static=True))


def test_apply_to_installs_network_events_and_returns_kills(conditions):
    base = conditions.base
    todo = Scenario.from_dict(EXAMPLE).apply_to(conditions)
    assert [(e.at, e.action) for e in todo] == [(5.0, "kill_server"), (20.0, "kill_replica")]
    # cut london-tokyo from 10 until the restore at 30
    assert conditions.latency_ms("london", "tokyo", 9.9) == base.latency_ms("london", "tokyo", 0)
    assert math.isinf(conditions.latency_ms("tokyo", "london", 10))
    assert math.isinf(conditions.latency_ms("london", "tokyo", 29.9))
    assert conditions.latency_ms("london", "tokyo", 30) == base.latency_ms("london", "tokyo", 0)
    # delay boston-zurich +250 ms for 20 s from 12.5
    bz = base.latency_ms("boston", "zurich", 0)
    assert conditions.latency_ms("zurich", "boston", 12.5) == bz + 250
    assert conditions.latency_ms("boston", "zurich", 32.4) == bz + 250
    assert conditions.latency_ms("boston", "zurich", 32.5) == bz
    # zurich slowed 3x from 15, until restored (never here)
    assert conditions.slowdown("zurich", 14.9) == 1.0
    assert conditions.slowdown("zurich", 15) == 3.0 and conditions.slowdown("zurich", 1e6) == 3.0


def test_apply_to_with_offset_shifts_everything(conditions):
    sc = Scenario([Event(1, "cut_link", a="boston", b="tokyo", duration=2),
                   Event(4, "kill_replica", operator="join", replica=0),
                   Event(5, "slow_server", server="london", factor=2, duration=1),
                   Event(5.5, "restore", server="london")])
    todo = sc.apply_to(conditions, t0=100.0)
    assert todo == [Event(104.0, "kill_replica", operator="join", replica=0)]
    assert math.isfinite(conditions.latency_ms("boston", "tokyo", 1.5))
    assert math.isinf(conditions.latency_ms("boston", "tokyo", 101.5))
    assert math.isfinite(conditions.latency_ms("boston", "tokyo", 103))
    assert conditions.slowdown("london", 105.2) == 2.0
    assert conditions.slowdown("london", 105.6) == 1.0  # restored early
    assert sc.runtime_events() == [Event(4, "kill_replica", operator="join", replica=0)]


def test_apply_to_validates_against_the_network(conditions):
    with pytest.raises(ValueError, match="event 0 .*unknown server 'atlantis'"):
        _one(at=1, action="cut_link", a="boston", b="atlantis").apply_to(conditions)
    with pytest.raises(ValueError, match="factor"):
        _one(at=1, action="slow_server", server="boston", factor=0.1).apply_to(conditions)
    assert conditions.overrides() == []  # nothing installed by a rejected scenario


def test_apply_to_restore_link_keeps_other_links():
    net = NetworkConditions(ZeroLatency(["a", "b", "c"]))
    Scenario.from_dict({"events": [
        {"at": 0, "action": "cut_link", "a": "a", "b": "b"},
        {"at": 0, "action": "cut_link", "a": "a", "b": "c"},
        {"at": 10, "action": "restore", "a": "b", "b": "a"},
    ]}).apply_to(net)
    assert net.latency_ms("a", "b", 10) == 0.0
    assert math.isinf(net.latency_ms("a", "c", 10))


# -- round trips (property) -----------------------------------------------------------

_name = st.sampled_from(SERVERS)
_time = st.floats(0, 1e6, allow_nan=False)
_pos = st.floats(0.001, 1e5, allow_nan=False)


@st.composite
def _events(draw):
    action = draw(st.sampled_from(ACTIONS))
    at = draw(_time)
    if action == "kill_replica":
        op = draw(st.sampled_from(sorted(OPERATORS)))
        return Event(at, action, operator=op, replica=draw(st.integers(0, OPERATORS[op] - 1)))
    if action == "kill_server":
        return Event(at, action, server=draw(_name))
    dur = draw(st.one_of(st.none(), _pos))
    if action == "slow_server":
        return Event(at, action, server=draw(_name), factor=draw(st.floats(1, 100)), duration=dur)
    a, b = draw(st.lists(_name, min_size=2, max_size=2, unique=True))
    if action == "delay_link":
        return Event(at, action, a=a, b=b, extra_ms=draw(st.floats(0, 1e4)), duration=dur)
    if action == "cut_link":
        return Event(at, action, a=a, b=b, duration=dur)
    if draw(st.booleans()):
        return Event(at, action, a=a, b=b)
    return Event(at, action, server=draw(_name))


@settings(max_examples=40, deadline=None)
@given(st.lists(_events(), max_size=12))
def test_round_trips_property(tmp_path_factory, events):
    sc = Scenario(events)
    sc.validate(SERVERS, OPERATORS)
    assert Scenario.from_dict(sc.to_dict()) == sc
    assert Scenario.from_dict(json.loads(json.dumps(sc.to_dict()))) == sc
    d = tmp_path_factory.mktemp("sc")
    for ext in ("json", "toml"):
        sc.to_file(d / f"s.{ext}")
        assert Scenario.from_file(d / f"s.{ext}") == sc
    ats = [e.at for e in sc]
    assert ats == sorted(ats)
    net = NetworkConditions(ZeroLatency(SERVERS))
    todo = sc.apply_to(net)
    assert todo == [e for e in sc if e.action in ("kill_replica", "kill_server")]
