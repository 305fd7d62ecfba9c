"""Failure-injection scenarios: a timed script of faults for a run.

A :class:`Scenario` is a list of :class:`Event` s, each at a time in seconds
from the start of the run. Network-side events (``delay_link``, ``cut_link``,
``slow_server`` and ``restore``) are installed into a
:class:`~replistream.network.NetworkConditions` by :meth:`Scenario.apply_to`, so
the emulated network (on Ray or in the simulator) follows the script by
itself; the events that kill things (``kill_replica``, ``kill_server``) are
handed back for the runtime to carry out.

Scenarios are written in JSON or TOML::

    {"events": [{"at": 5, "action": "kill_server", "server": "boston"},
                {"at": 10, "action": "cut_link", "a": "london", "b": "tokyo", "duration": 30}]}

    [[events]]
    at = 5
    action = "kill_server"
    server = "boston"

Actions and their fields (``duration`` optional: without it an override lasts
until a ``restore``):

=============  ==========================================
action         fields
=============  ==========================================
kill_replica   operator, replica (0-based index)
kill_server    server
slow_server    server, factor (>= 1), [duration]
delay_link     a, b, extra_ms (>= 0), [duration]
cut_link       a, b, [duration]
restore        a and b (the link), or server (everything about it)
=============  ==========================================

>>> from replistream.network import NetworkConditions, ZeroLatency
>>> sc = Scenario.from_dict({"events": [
...     {"at": 10, "action": "kill_replica", "operator": "join", "replica": 1},
...     {"at": 2, "action": "cut_link", "a": "x", "b": "y", "duration": 3}]})
>>> [e.action for e in sc]
['cut_link', 'kill_replica']
>>> sc.validate(servers=["x", "y"], operators={"join": 2})
>>> net = NetworkConditions(ZeroLatency(["x", "y"]))
>>> todo = sc.apply_to(net)
>>> [net.latency_ms("x", "y", t) for t in (1, 2, 4.9, 5)], [(e.at, e.action) for e in todo]
([0.0, inf, inf, 0.0], [(10.0, 'kill_replica')])
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["Event", "Scenario", "ACTIONS", "NETWORK_ACTIONS", "RUNTIME_ACTIONS"]

#: Required fields of each action.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "kill_replica": ("operator", "replica"),
    "kill_server": ("server",),
    "slow_server": ("server", "factor"),
    "delay_link": ("a", "b", "extra_ms"),
    "cut_link": ("a", "b"),
    "restore": (),  # a + b, or server: checked separately
}
#: Optional fields of each action.
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "kill_replica": (),
    "kill_server": (),
    "slow_server": ("duration",),
    "delay_link": ("duration",),
    "cut_link": ("duration",),
    "restore": ("a", "b", "server"),
}
ACTIONS: tuple[str, ...] = tuple(_REQUIRED)
#: Actions that :meth:`Scenario.apply_to` installs into the network.
NETWORK_ACTIONS: frozenset[str] = frozenset({"slow_server", "delay_link", "cut_link", "restore"})
#: Actions the runtime carries out itself.
RUNTIME_ACTIONS: frozenset[str] = frozenset({"kill_replica", "kill_server"})

_OPTIONAL_FIELDS = ("operator", "replica", "server", "a", "b", "duration", "extra_ms", "factor")
_STR_FIELDS = ("operator", "server", "a", "b")
_NUM_FIELDS = ("duration", "extra_ms", "factor")


@dataclass(frozen=True)
class Event:
    """One scripted fault at ``at`` seconds from the start of the run.

    Only the fields its ``action`` needs are set (see the module docs);
    :meth:`Scenario.validate` checks them.

    >>> Event(5.0, "kill_server", server="boston").to_dict()
    {'at': 5.0, 'action': 'kill_server', 'server': 'boston'}
    """

    at: float
    action: str
    operator: str | None = None
    replica: int | None = None
    server: str | None = None
    a: str | None = None
    b: str | None = None
    duration: float | None = None
    extra_ms: float | None = None
    factor: float | None = None

    @property
    def end(self) -> float | None:
        """``at + duration``, or None when the event has no duration."""
        return None if self.duration is None else self.at + self.duration

    def to_dict(self) -> dict[str, Any]:
        """The event as a plain dict, without unset fields."""
        d: dict[str, Any] = {"at": self.at, "action": self.action}
        for name in _OPTIONAL_FIELDS:
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], index: int | None = None) -> "Event":
        """Build an event from a mapping; unknown keys raise ``ValueError``."""
        where = "event" if index is None else f"event {index}"
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected a table/object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where}: field {unknown[0]!r}: unknown field (known: {', '.join(sorted(known))})")
        for req in ("at", "action"):
            if req not in d:
                raise ValueError(f"{where}: field {req!r}: missing")
        kw = dict(d)
        at = kw["at"]
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            kw["at"] = float(at)
        for name in _NUM_FIELDS:
            v = kw.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                kw[name] = float(v)
        return cls(**kw)


def _is_real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


class Scenario:
    """A timed script of :class:`Event` s, kept sorted by time (stable).

    >>> sc = Scenario([Event(9, "kill_server", server="b"), Event(1, "kill_server", server="a")])
    >>> [e.server for e in sc]
    ['a', 'b']
    >>> Scenario.from_dict(sc.to_dict()) == sc
    True
    """

    def __init__(self, events: Iterable[Event] = ()):
        evs = list(events)
        for i, e in enumerate(evs):
            if not isinstance(e, Event):
                raise TypeError(f"event {i}: expected an Event, got {type(e).__name__}")
        self.events: tuple[Event, ...] = tuple(sorted(evs, key=lambda e: _sort_key(e.at)))

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __getitem__(self, i: int) -> Event:
        return self.events[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, Scenario) and self.events == other.events

    def __repr__(self) -> str:
        return f"Scenario({list(self.events)!r})"

    # -- (de)serialisation ---------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Scenario":
        """From ``{"events": [{...}, ...]}``."""
        if not isinstance(d, Mapping):
            raise ValueError(f"scenario must be a table/object with an 'events' list, got {type(d).__name__}")
        extra = sorted(set(d) - {"events"})
        if extra:
            raise ValueError(f"scenario: unknown top-level key {extra[0]!r} (expected only 'events')")
        evs = d.get("events", [])
        if not isinstance(evs, list):
            raise ValueError(f"scenario: 'events' must be a list, got {type(evs).__name__}")
        return cls(Event.from_dict(e, i) for i, e in enumerate(evs))

    def to_dict(self) -> dict[str, Any]:
        """``{"events": [...]}`` with plain values (inverse of :meth:`from_dict`)."""
        return {"events": [e.to_dict() for e in self.events]}

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Scenario":
        """Read a ``.json`` or ``.toml`` scenario (chosen by the extension)."""
        p = Path(path)
        ext = p.suffix.lower()
        try:
            if ext == ".json":
                with open(p, encoding="utf-8") as f:
                    data = json.load(f)
            elif ext == ".toml":
                with open(p, "rb") as f:
                    data = tomllib.load(f)
            else:
                raise ValueError(f"{p}: unknown scenario format {ext!r} (use .json or .toml)")
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
            raise ValueError(f"{p}: cannot parse: {e}") from e
        except RecursionError:
            raise ValueError(f"{p}: cannot parse: nested too deeply (a scenario is a list of flat events)") from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from None

    def to_file(self, path: str | os.PathLike) -> None:
        """Write as ``.json`` or ``.toml`` (chosen by the extension)."""
        p = Path(path)
        ext = p.suffix.lower()
        if ext == ".json":
            p.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        elif ext == ".toml":
            p.write_text(_to_toml(self.to_dict()["events"]), encoding="utf-8")
        else:
            raise ValueError(f"{p}: unknown scenario format {ext!r} (use .json or .toml)")

    # -- checking --------------------------------------------------------------
    def validate(self, servers: Iterable[str] | None = None,
                 operators: Mapping[str, int] | None = None) -> None:
        """Check every event; raise ``ValueError`` naming the event, field and problem.

        ``servers`` (names) and ``operators`` (name -> number of replicas),
        when given, are checked against; otherwise only the shape is checked.
        """
        server_set = None if servers is None else set(servers)
        for i, e in enumerate(self.events):
            _validate_event(i, e, server_set, operators)

    # -- running ---------------------------------------------------------------
    def apply_to(self, conditions, t0: float = 0.0) -> list[Event]:
        """Install the network-side events into ``conditions`` and return the rest.

        Each event happens at ``t0 + event.at`` on the conditions' clock:
        ``delay_link`` -> :meth:`NetworkConditions.add_delay`, ``cut_link`` ->
        ``cut``, ``slow_server`` -> ``slow_server`` (links in both directions;
        without a duration an override lasts until restored), ``restore`` ->
        ``restore``. The
        scenario is validated first (against the conditions' server names when
        it knows any). Returns the ``kill_replica`` / ``kill_server`` events,
        in time order, with ``at`` shifted by ``t0``, for the runtime to carry
        out.
        """
        names = list(getattr(conditions, "names", []) or [])
        self.validate(servers=names or None)
        todo: list[Event] = []
        for e in self.events:
            t = t0 + e.at
            end = None if e.duration is None else t + e.duration
            if e.action == "delay_link":
                conditions.add_delay(e.a, e.b, t, end, e.extra_ms)
            elif e.action == "cut_link":
                conditions.cut(e.a, e.b, t, end)
            elif e.action == "slow_server":
                conditions.slow_server(e.server, t, end, e.factor)
            elif e.action == "restore":
                if e.server is not None:
                    conditions.restore(server=e.server, at=t)
                else:
                    conditions.restore(e.a, e.b, at=t)
            else:
                todo.append(dataclasses.replace(e, at=t) if t0 else e)
        return todo

    def runtime_events(self) -> list[Event]:
        """The events the runtime must carry out itself (kills), in time order."""
        return [e for e in self.events if e.action in RUNTIME_ACTIONS]


def _sort_key(at):
    return at if _is_real(at) else -math.inf  # bad times sort first; validate() reports them


def _validate_event(i: int, e: Event, servers: set[str] | None, operators: Mapping[str, int] | None) -> None:
    def fail(field: str, msg: str):
        raise ValueError(f"event {i} (at={e.at!r}, action={e.action!r}): field {field!r}: {msg}")

    if not isinstance(e.action, str) or e.action not in _REQUIRED:
        fail("action", f"unknown action (expected one of {', '.join(ACTIONS)})")
    if not _is_real(e.at) or not math.isfinite(e.at):
        fail("at", "must be a finite number of seconds")
    if e.at < 0:
        fail("at", "negative time")
    required, optional = _REQUIRED[e.action], _OPTIONAL[e.action]
    for name in required:
        if getattr(e, name) is None:
            fail(name, f"missing (required by {e.action})")
    for name in _OPTIONAL_FIELDS:
        if getattr(e, name) is not None and name not in required and name not in optional:
            fail(name, f"not used by {e.action}")
    # types and ranges
    for name in _STR_FIELDS:
        v = getattr(e, name)
        if v is not None and (not isinstance(v, str) or not v):
            fail(name, f"must be a non-empty string, got {v!r}")
    for name in _NUM_FIELDS:
        v = getattr(e, name)
        if v is not None and not _is_real(v):
            fail(name, f"must be a number, got {v!r}")
    if e.replica is not None and (not isinstance(e.replica, int) or isinstance(e.replica, bool)):
        fail("replica", f"must be an integer, got {e.replica!r}")
    if e.duration is not None and not e.duration > 0:
        fail("duration", f"must be > 0, got {e.duration!r}")
    if e.extra_ms is not None and not (e.extra_ms >= 0 and math.isfinite(e.extra_ms)):
        fail("extra_ms", f"must be a finite number >= 0, got {e.extra_ms!r}")
    if e.factor is not None and not (e.factor >= 1 and math.isfinite(e.factor)):
        fail("factor", f"slow-down factor must be a finite number >= 1, got {e.factor!r}")
    if e.action == "restore":
        if (e.a is None) != (e.b is None):
            fail("b" if e.b is None else "a", "restore of a link needs both a and b")
        if e.a is None and e.server is None:
            fail("server", "restore needs a and b (a link) or server")
        if e.a is not None and e.server is not None:
            fail("server", "give either a and b, or server, not both")
    if e.a is not None and e.a == e.b:
        fail("b", f"a link needs two different servers, got {e.a!r} twice")
    # references
    if servers is not None:
        for name in ("server", "a", "b"):
            v = getattr(e, name)
            if v is not None and v not in servers:
                fail(name, f"unknown server {v!r}")
    if e.replica is not None and e.replica < 0:
        fail("replica", f"replica index must be >= 0, got {e.replica}")
    if operators is not None and e.operator is not None:
        if e.operator not in operators:
            fail("operator", f"unknown operator {e.operator!r} (known: {', '.join(sorted(operators))})")
        k = operators[e.operator]
        if e.replica is not None and e.replica >= k:
            fail("replica", f"replica index {e.replica} out of range for {e.operator!r} with {k} replicas")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    raise TypeError(f"cannot write {v!r} to TOML")


def _to_toml(events: list[dict[str, Any]]) -> str:
    out = []
    for d in events:
        out.append("[[events]]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in d.items())
        out.append("")
    return "\n".join(out) if out else "events = []\n"
