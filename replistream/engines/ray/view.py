"""What a running deployment looks like, as one JSON-ready dict: the dashboard's data (issue #43).

:func:`describe` reads a deployment's :class:`~.plane.ControlPlane` (the topology's replicas, the
failure detector's ``is_suspected``, ``events``, the control loop's decisions, repairs, transfers,
the fault tolerance, what was delivered, the actor handles' ``dead_letters``) in the process that
runs it (a script, a detached deployment's host actor). :func:`status` merges it with what
``replistream status`` shows, so ``replistream status --json``, ``Deployment.status()`` and the
dashboard's ``/api/deployments/<name>`` carry the same data.

The timeline numbers every fault and control action once (``seq``, from 1, in the order this
module first saw them in the deployment's logs), so a caller asks only for what is new:
``describe(dep, since=last_seq)``. The numbering and the delivered-count samples behind the rates
live beside the deployment (one record per ``Deployment`` object, dropped with it).

>>> d = describe(dep)                         # doctest: +SKIP
>>> [(r["label"], r["state"]) for r in d["replicas"]][:2]      # doctest: +SKIP
[('entry#0', 'live'), ('entry#1', 'live')]
>>> describe(dep, since=d["seq"])["timeline"]                   # doctest: +SKIP
[]
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import deque

import numpy as np
import ray

__all__ = ["describe", "status", "STATES", "SCHEMA_VERSION", "event_kind", "event_text"]

#: Version of :func:`describe`'s output schema (raised when a key changes meaning or goes away).
SCHEMA_VERSION = 1

#: Every state a replica is shown in.
STATES = ("live", "suspected", "failed", "dormant", "moving", "spare")

#: Seconds of history behind the rate and latency series.
HISTORY_S = 300.0
#: Width of one bin of those series, in seconds.
BIN_S = 2.0
#: Timeline entries kept per deployment (the oldest are dropped; ``timeline_dropped`` counts them).
TIMELINE_KEEP = 2000
#: Seconds ``describe`` waits for the replicas' dead letters (a replica that does not answer is named).
ASK_S = 1.0
#: Seconds the replicas' dead letters are kept before ``describe`` asks them again (several callers
#: a second cost one round of calls).
LETTERS_EVERY_S = 2.0

_FAULTS = {"dead", "declared_failed", "stopped", "cut_link", "delay_link", "slow_server", "kill_server",
           "kill_replica", "link_failed", "broken_contract", "monitor_stalled", "failure", "not_signalled",
           "suspected"}
_REPAIRS = {"repaired", "entry_repaired", "revived_from_dormant", "link_reconnected", "coordinator_replaced",
            "resumed", "restore", "dormant_on"}
_ERRORS = {"repair_failed", "error", "monitor_error", "reconnect_failed", "kill_failed", "not_repaired",
           "standby_failed"}
_CONTROL = {"gc", "revival", "rebalance", "reconfiguration", "change", "congestion", "theta"}


def event_kind(ev: dict) -> str:
    """The timeline class of a deployment or control-loop event: ``fault``, ``repair``, ``control``,
    ``error`` or ``info``.

    >>> event_kind({"event": "dead", "actor": "join#0"}), event_kind({"kind": "gc", "action": "discard"})
    ('fault', 'control')
    """
    name = ev.get("event") or ev.get("kind") or ""
    if name in _FAULTS:
        return "fault"
    if name in _REPAIRS:
        return "repair"
    if name in _ERRORS:
        return "error"
    if name in _CONTROL or "kind" in ev:
        return "control"
    return "info"


def event_text(ev: dict) -> str:
    """One line saying what an event is.

    >>> event_text({"event": "dead", "actor": "join#0", "reason": "replica killed"})
    'dead: join#0 (replica killed)'
    >>> event_text({"event": "repaired", "actor": "join#0", "new": "join#2", "seconds": 1.5})
    'repaired: join#0 by join#2 in 1.5 s'
    """
    if ev.get("text"):
        return f"{ev.get('kind', 'control')}: {ev['text']}"
    name = ev.get("event") or ev.get("action") or ev.get("kind") or "event"
    who = ev.get("actor") or ev.get("replica") or ev.get("target") or ev.get("server")
    if who is None and ev.get("a") is not None:
        who = f"{ev['a']} - {ev['b']}"
    if who is None and ev.get("from") is not None:
        who = f"{ev['from']} -> {ev.get('to')}"
    out = f"{name}: {who}" if who is not None else str(name)
    if ev.get("new"):
        out += f" by {ev['new']}"
    if ev.get("seconds") is not None and name in ("repaired", "entry_repaired"):
        out += f" in {ev['seconds']:g} s"
    why = ev.get("reason") or ev.get("why") or ev.get("error")
    if why:
        out += f" ({why})"
    return out


class _State:
    """What :func:`describe` keeps per deployment: the timeline and delivered-count samples."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen_events = 0  # dep.events taken into the timeline
        self.seen_gc = 0  # dep.gc_events() taken
        self.seq = 0
        self.timeline: deque = deque(maxlen=TIMELINE_KEEP)
        self.dropped = 0
        self.samples: dict[str, deque] = {}  # app -> (wall time, delivered)
        self.letters: tuple | None = None  # (dead letters, silent replicas), asked at letters_at
        self.letters_at = 0.0
        self.letters_lock = threading.Lock()


_states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def _state(dep) -> _State:
    with _states_lock:
        st = _states.get(dep)
        if st is None:
            st = _states[dep] = _State()
        return st


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if np.isfinite(f) else None
    if v is None or isinstance(v, (str, int, bool)):
        return v
    return repr(v)


def _update_timeline(dep, st: _State) -> None:
    events = list(dep.events)
    gcs = list(dep.reconfig.gc_events())
    fresh = [("deployment", e) for e in events[st.seen_events:]] + [("control", e) for e in gcs[st.seen_gc:]]
    st.seen_events, st.seen_gc = len(events), len(gcs)
    fresh = [(src, e) for src, e in fresh if e.get("action") != "none"]  # a control period that did nothing
    fresh.sort(key=lambda se: se[1].get("t") or 0.0)
    for src, e in fresh:
        st.seq += 1
        if len(st.timeline) == st.timeline.maxlen:
            st.dropped += 1
        st.timeline.append({"seq": st.seq, "t": _jsonable(e.get("t")), "source": src,
                            "event": e.get("event") or e.get("kind"), "kind": event_kind(e),
                            "text": event_text(e),
                            "detail": _jsonable({k: v for k, v in e.items() if k not in ("traceback",)})})


def _replicas(dep) -> list[dict]:
    topo = dep.topology
    moving = {t.get("replica") for t in dep.reconfig.transfers() if t.get("state") == "running"}
    out = []
    for r in topo.replicas():
        running = topo.is_running(r.label)
        if r.state == "failed":
            state = "failed"
        elif r.state == "dormant":
            state = "dormant"
        elif r.label in moving or (r.state == "live" and not running):
            state = "moving"  # its state is being handed over, or its actor is being started
        elif dep.detector.is_suspected(r.label):
            state = "suspected"
        else:
            state = "live"
        out.append({"label": r.label, "operator": r.operator, "server": r.server, "state": state, "kind": r.kind,
                    "running": bool(running)})
    spares = 0
    if getattr(dep, "spares", 0):
        from .pool import pooled

        spares = min(int(dep.repairer.spares), pooled().get("ReplicaActor", 0))
    out += [{"label": f"spare#{i}", "operator": None, "server": None, "state": "spare", "kind": "spare",
             "running": True} for i in range(spares)]
    return out


def _graph(dep) -> tuple[list[dict], list[list[str]]]:
    from ...plan import ENTRY

    q = dep.query
    ft = dep.output.fault_tolerance()["fault_tolerance_per_node"]
    nodes = [{"name": ENTRY, "kind": "entry", "sources": list(q.sources), "survives": ft.get(ENTRY)}]
    nodes += [{"name": n, "kind": "operator", "survives": ft.get(n)} for n in q.operators]
    nodes += [{"name": n, "kind": "application", "survives": ft.get(n)} for n in q.sinks]
    edges = []
    for n in [*q.operators, *q.sinks]:
        for u in q.inputs_of(n):
            e = [ENTRY if u in q.sources else u, n]
            if e not in edges:
                edges.append(e)
    return nodes, edges


def _upstream(q, app: str) -> set[str]:
    """Every node ``app`` depends on (sources as ``entry``, and the sources' own names)."""
    from ...plan import ENTRY

    seen, todo = set(), [app]
    while todo:
        n = todo.pop()
        for u in q.inputs_of(n):
            if u not in seen:
                seen.add(u)
                todo.append(u)
    if seen & set(q.sources):
        seen.add(ENTRY)
    return seen


def _where_node(where: str) -> str:
    return where.split("[")[0].split(":")[0].strip()


def _dead_letters(dep) -> tuple[list, list[str]]:
    """Every running replica's dead letters (merged by id), and the replicas that did not answer."""
    from ...errors import merge_dead_letters

    topo = dep.topology
    running = [(r.label, topo.handle(r.label)) for r in topo.replicas() if topo.is_running(r.label)]
    refs = {label: h.dead_letters.remote() for label, h in running if h is not None}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=ASK_S) if refs else ([], [])
    ready = set(ready)
    letters, silent = [], []
    for label, ref in refs.items():
        if ref not in ready:
            silent.append(label)
            continue
        try:
            letters.extend(ray.get(ref))
        except Exception:  # noqa: BLE001 - died since the topology listed it: its peers hold the same letters
            silent.append(label)
    return merge_dead_letters(letters), silent


def _series(arrivals: np.ndarray, lat: np.ndarray | None, now: float, t0: float) -> tuple[list, list]:
    """Per bin of :data:`BIN_S` over the last :data:`HISTORY_S`: ``[t, tuples/s]`` and
    ``[t, p50 ms, p99 ms]`` (``t``: the bin's end in seconds since the start)."""
    lo = max(now - HISTORY_S, t0)
    if now - lo < BIN_S:  # not one whole bin since the start (t0 may lie a moment ahead: feed() sets it so)
        return [], []
    edges = now - BIN_S * np.arange(int((now - lo) // BIN_S) + 1)[::-1]  # bins ending now, none before t0
    keep = arrivals >= edges[0]
    arr = arrivals[keep]
    counts, _ = np.histogram(arr, bins=edges)
    rate = [[round(float(e - t0), 2), round(float(c) / BIN_S, 3)] for e, c in zip(edges[1:], counts)]
    lat_series = []
    if lat is not None and len(arr):
        lk = lat[keep]
        idx = np.digitize(arr, edges) - 1
        for b in np.unique(idx):
            if 0 <= b < len(counts):
                vals = lk[idx == b]
                p50, p99 = np.percentile(vals, [50, 99])
                lat_series.append([round(float(edges[b + 1] - t0), 2), round(float(p50), 3), round(float(p99), 3)])
    return rate, lat_series


def _applications(dep, st: _State, letters: list) -> dict:
    q = dep.query
    now = time.time()
    out = {}
    for app in q.sinks:
        count = dep.delivered.count(app)
        samples = st.samples.setdefault(app, deque())
        samples.append((now, count))
        while samples and samples[0][0] < now - HISTORY_S - BIN_S:
            samples.popleft()
        arrivals = dep.delivered.arrivals(app)
        kept = len(arrivals) == count
        lat_all = latency = None
        note = None
        if not kept:
            note = "its tuples are not kept by the deployment (a ParquetSink): latency unknown here"
        elif not dep.speed:
            note = "not paced: latency is measured on paced runs only (feed(..., pace=))"
        elif count:
            t_rel, lat_all = dep.output.latencies_ms(app)  # (it may fetch more: both from the same fetch)
            arrivals = t_rel + dep.t0
            p50, p99 = np.percentile(lat_all, [50, 99])
            latency = {"count": int(len(lat_all)), "p50": round(float(p50), 3), "p99": round(float(p99), 3)}
        if kept:
            rate, lat_series = _series(arrivals, lat_all, now, dep.t0)
        else:  # from the counts seen by describe's callers: averages between two calls
            pts = list(samples)
            rate = [[round(b[0] - dep.t0, 2), round((b[1] - a[1]) / max(b[0] - a[0], 1e-9), 3)]
                    for a, b in zip(pts, pts[1:])]
            lat_series = []
        ups = _upstream(q, app)
        mine = [d for d in letters if _where_node(d.where) in ups]
        by_reason: dict[str, int] = {}
        for d in mine:
            key = d.reason.split(":")[0].strip()
            by_reason[key] = by_reason.get(key, 0) + d.count
        out[app] = {"delivered": int(count), "rate": rate, "latency_ms": latency, "latency_series": lat_series,
                    "latency_note": note,
                    "dead_letters": {"total": int(sum(d.count for d in mine)), "by_reason": by_reason}}
    return out


def describe(dep, since: int = 0) -> dict:
    """The state of deployment ``dep`` for a person watching it (the dashboard, ``replistream status
    --json``), JSON-ready. ``since``: the last timeline ``seq`` the caller has; only later entries
    are returned (0: every entry kept).

    Output schema (version :data:`SCHEMA_VERSION`; times ``t`` in seconds since the run started,
    i.e. ``dep.t0``):

    * ``schema``: int, the version; ``t``: now; ``servers``: ``[server name]``;
    * ``replicas``: ``[{label, operator, server, state, kind, running}]``, ``state`` one of
      :data:`STATES`: ``live``; ``suspected`` (the failure detector waits on it no longer);
      ``failed`` (crashed, killed or declared failed); ``dormant`` (discarded by garbage collection,
      or an entry replica kept fed without links); ``moving`` (its state is being handed over, or
      its actor started); ``spare`` (an idle warm spare of ``deploy(..., spares=)``: ``operator``
      and ``server`` None). ``kind``: ``entry``, ``operator``, ``application`` or ``spare``;
    * ``operators``: ``[{name, kind, survives}]`` in the query's order (the entry points first, as
      ``entry``, with their ``sources``): ``survives`` is how many more replica losses the node
      masks (its live replicas - 1; -1: none left); ``edges``: ``[[upstream, downstream]]``;
    * ``applications``: ``{app: {delivered, rate, latency_ms, latency_series, latency_note,
      dead_letters}}``: ``rate`` ``[[t, tuples/s]]`` per :data:`BIN_S` s over the last
      :data:`HISTORY_S` s; ``latency_ms`` ``{count, p50, p99}`` over every delivered tuple, or None
      with the reason in ``latency_note`` (unpaced run, tuples not kept); ``latency_series``
      ``[[t, p50, p99]]`` per bin; ``dead_letters`` ``{total, by_reason}`` of the nodes it depends
      on (reason: the text before the first ``:``);
    * ``dead_letters``: ``{total, by_reason, by_operator, unanswered}`` over the whole query
      (``unanswered``: running replicas that did not give theirs within :data:`ASK_S` s); asked
      again at most every :data:`LETTERS_EVERY_S` s;
    * ``timeline``: ``[{seq, t, source, event, kind, text, detail}]`` after ``since``, ``kind``
      one of fault, repair, control, error, info (:func:`event_kind`), ``detail`` the raw record;
      ``seq``: the last number given (ask with ``since=seq`` next); ``timeline_dropped``: entries
      no longer kept (at most :data:`TIMELINE_KEEP` are);
    * ``repairs``: ``dep.repairs``; ``transfers``: ``dep.transfers()``; ``fault_tolerance``
      and ``fault_tolerance_per_node``: ``dep.fault_tolerance()``.

    >>> describe(dep)["replicas"][0]       # doctest: +SKIP
    {'label': 'entry#0', 'operator': 'entry', 'server': 's0', 'state': 'live', 'kind': 'entry', 'running': True}
    """
    st = _state(dep)
    with st.letters_lock:
        if st.letters is None or time.time() - st.letters_at >= LETTERS_EVERY_S:
            st.letters, st.letters_at = _dead_letters(dep), time.time()
        letters, silent = st.letters
    with st.lock:
        _update_timeline(dep, st)
        timeline = [e for e in st.timeline if e["seq"] > int(since)]
        seq, dropped = st.seq, st.dropped
        apps = _applications(dep, st, letters)
    nodes, edges = _graph(dep)
    by_reason: dict[str, int] = {}
    by_op: dict[str, int] = {}
    for d in letters:
        key = d.reason.split(":")[0].strip()
        by_reason[key] = by_reason.get(key, 0) + d.count
        node = _where_node(d.where)
        by_op[node] = by_op.get(node, 0) + d.count
    return {"schema": SCHEMA_VERSION, "t": round(dep.now(), 3), "servers": sorted(dep.servers),
            "replicas": _replicas(dep), "operators": nodes, "edges": edges, "applications": apps,
            "dead_letters": {"total": int(sum(d.count for d in letters)), "by_reason": by_reason,
                             "by_operator": by_op, "unanswered": silent},
            "timeline": timeline, "seq": seq, "timeline_dropped": dropped,
            "repairs": _jsonable(list(dep.repairer.repairs)), "transfers": _jsonable(dep.reconfig.transfers()),
            **dep.output.fault_tolerance()}


def status(plane, since: int = 0) -> dict:
    """What ``replistream status`` and ``Deployment.status()`` show: the query, per application the
    tuples delivered and whether the end of the stream came, the fault tolerance and the run's
    ``failure`` (a detached deployment checks it whether or not a client waits), merged with
    :func:`describe` of ``plane`` (timeline entries after ``since``): the dashboard's data.
    ``poll_error``: why fetching the results failed, if it did (the deployment's waits raise it).

    >>> status(plane)["complete"]     # doctest: +SKIP
    False
    """
    from ...schema import END

    poll_error = None
    try:
        plane.output.poll(0.5)
    except Exception as e:  # said in the status; the deployment's own waits raise it
        poll_error = f"{type(e).__name__}: {e}"
    d = plane.delivered
    apps = {a: {"delivered": d.count(a), "complete": d.punctuation.get(a) == END} for a in plane.query.sinks}
    view = describe(plane, since)
    for a, v in view.pop("applications").items():
        apps.setdefault(a, {}).update(v)
    return {**view, "name": plane.detached_as, "query": plane.query.name,
            "complete": all(a["complete"] for a in apps.values()), "applications": apps,
            "poll_error": poll_error, "failure": plane.failure, **plane.output.fault_tolerance()}
