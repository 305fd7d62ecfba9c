"""One conformance suite for every engine: the same queries, inputs and fault scripts on the
reference engine, the in-process replicated engine, a Ray deployment and the simulator, each
compared with the ideal run as a multiset of (id, ts, values), bit for bit (Hwang §III:
replication transparency).

Cases (every input seeded; a few hundred tuples, so the Ray cases stay fast):

* queries: the paper's Fig. 1 query (two unions, a join, a filter), a keyed sliding time-window
  aggregate, a keyed count-window aggregate, a union of three sources into a filter;
* fault scripts, each at an event time of the input: none; replica 0 of one stateful operator
  (of the filter, for the union, which has none) killed mid-stream; one replica of every operator
  and of the entry points killed, one after another (k - 1 = 1 with k = 2); one server killed
  mid-stream (every replica on it); replica 0 of the same operator as the single kill *stopped*
  mid-stream (a :class:`~replistream.sources.StopReplica`: never scheduled again, never crashes,
  never answers; issue 28), which its peers must mask as they mask a crash.

Every case runs on a :class:`~replistream.plan.PhysicalPlan` over three servers with k = 2
(:func:`plan_for`): node ``j`` on servers ``j`` and ``j + 1`` (mod 3), applications on the first
server, and the server the script kills is the second, so every operator keeps a live replica.

An engine is one fixture registered with :func:`engine`: an adapter with one method,
``run(plan, inputs, faults) -> RunResult``, whose ``events`` list ``{"event": "killed",
"replica": label}`` for every replica it killed and ``{"event": "stopped", "replica": label}`` for
every replica it stopped (labels as the plan writes them: ``"entry#1"``, ``"join#0"``), and a flag
``runs_faults`` (the reference engine ignores faults), and a flag ``fences_stopped``: an engine with
a failure detector may declare a stopped replica failed and kill it before the run ends (it then
reports it both stopped and killed); the in-process engine has none (the replica stays stopped). An engine that
cannot express a fault script skips it with ``pytest.skip`` and the reason. Adding an engine means
adding one such fixture.

* a user function that raises: a map raising on a seeded tenth of its rows; every engine dead-letters
  exactly those rows, once each, with the exception (docs/reliability.md), and nothing else is lost.

Partitioned cases (issue #41, :data:`PARTITIONED`): the same queries with some operators run as
``p`` partitions x k replicas (``parallelism=``, carried by the plan: :attr:`PhysicalPlan.parallelism`);
a fault script that names a partitioned operator names one of its partitions (``"sliding.1"``). The
reference engine ignores the partitions (it is the oracle); the in-process engine, the Ray engine
(``deploy(parallelism=)``) and the simulator honour them.

Entry and application partitions (:data:`ENTRY_APP`): the same queries with the entry points run as
``p`` partitions (``parallelism={"entry": p}``, ``entry.P#R``) or an application as ``p`` partitions
of k replicas (``out.P#R``), some beside partitioned operators; the single-replica faults name an
entry partition (``"entry.1"``) or an application partition (``"stats.1"``), and ``kill_one_of_each``
kills one replica of a partitioned application too. The in-process engine runs them under every
fault script, Ray under :data:`RAY_ENTRY_APP`; the simulator refuses both in one line (checked).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import pytest

from replistream import Query, RunResult, seconds
from replistream.network import ZeroLatency, default_servers
from replistream.partition import entry_parallelism, parse_partition_label
from replistream.plan import ENTRY, PhysicalPlan
from replistream.sources import KillReplica, KillServer, Sentinel, StopReplica, chunk_time, inject_at
from replistream.testing import assert_same_output, run_reference, run_replicated
from replistream.workloads import fig1_inputs, fig1_query

K = 2
SERVERS = [s.name for s in default_servers(3)]  # built-in cities, so a Ray deployment knows them too
VICTIM = SERVERS[1]  # the server a "server" fault script kills; the applications run on SERVERS[0]


# -- cases ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    """``sentinel`` (a :class:`KillReplica`, :class:`StopReplica` or :class:`KillServer`) at event time
    ``at`` (µs)."""

    at: int
    sentinel: Sentinel


@dataclass(frozen=True)
class Case:
    """A query, its seeded inputs, and the operator a single-replica kill targets."""

    name: str
    build: Callable[[], tuple[Query, dict]]
    target: str


def columns(ts: np.ndarray, chunk: int, **cols: np.ndarray) -> list[dict]:
    """Column chunks of ``chunk`` rows."""
    return [{"ts": ts[a:a + chunk], **{k: v[a:a + chunk] for k, v in cols.items()}} for a in range(0, len(ts), chunk)]


def fig1_case() -> tuple[Query, dict]:
    q = fig1_query(n_servers=3, window_s=3.0, punctuate_s=1.0)
    return q, fig1_inputs(n_servers=3, duration_s=60, period_s=1.0, seed=1, chunk=5)  # 360 tuples


def sliding_case() -> tuple[Query, dict]:
    q = Query("sliding")
    s = q.source("readings", {"sensor": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(10), slide=seconds(2), by="sensor",
             aggs={"n": "count", "total": ("v", "sum"), "mean": ("v", "mean")}, name="sliding").sink("stats")
    rng = np.random.default_rng(2)
    n = 300
    ts = np.sort(rng.integers(0, seconds(60), n))
    v = rng.normal(size=n) * 10.0 ** rng.integers(-6, 9, n)  # sums depend on order unless exact
    return q.build(), {"readings": columns(ts, 5, sensor=rng.integers(0, 5, n), v=v)}


def count_window_case() -> tuple[Query, dict]:
    q = Query("counts")
    s = q.source("orders", {"user": "i8", "amount": "i8"}, punctuate_every=seconds(1))
    s.count_window(size=4, slide=2, by="user", aggs={"n": "count", "total": ("amount", "sum")},
                   name="per_user").sink("totals")
    rng = np.random.default_rng(3)
    n = 300
    ts = np.sort(rng.integers(0, seconds(60), n))
    return q.build(), {"orders": columns(ts, 4, user=rng.integers(0, 6, n), amount=rng.integers(1, 1000, n))}


def union_case() -> tuple[Query, dict]:
    q = Query("union3")
    streams = [q.source(name, {"k": "i8", "v": "f8"}, punctuate_every=seconds(1)) for name in ("a", "b", "c")]
    q.union(*streams, name="merged").filter(lambda b: b["v"] > 0.0, name="positive").sink("out")
    rng = np.random.default_rng(4)
    inputs = {}
    for name in ("a", "b", "c"):
        ts = np.sort(rng.integers(0, seconds(60), 100))
        inputs[name] = columns(ts, 5, k=rng.integers(0, 10, 100), v=rng.normal(size=100))
    return q.build(), inputs


def raising(b):
    """A map that raises on rows whose ``k`` is 7 (about a tenth of them), whatever the batch."""
    if (b["k"] == 7).any():
        raise ValueError("k is 7")
    return {"k": b["k"], "w": b["v"] * 2.0}


def user_error_case() -> tuple[Query, dict]:
    q = Query("user_error")
    s = q.source("events", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.map(raising, schema={"k": "i8", "w": "f8"}, name="double").window(
        size=seconds(4), by="k", aggs={"n": "count", "total": ("w", "sum")}, name="per_key").sink("sums")
    rng = np.random.default_rng(5)
    n = 300
    ts = np.sort(rng.integers(0, seconds(60), n))
    return q.build(), {"events": columns(ts, 7, k=rng.integers(0, 10, n), v=rng.normal(size=n))}


CASES = [Case("fig1", fig1_case, "correlate"), Case("sliding_window", sliding_case, "sliding"),
         Case("count_window", count_window_case, "per_user"), Case("union_filter", union_case, "positive"),
         Case("user_error", user_error_case, "double")]


def raised_rows(result: RunResult) -> Counter:
    """The dead-lettered rows a user function raised on, as a multiset of (where, reason, id)."""
    return Counter((d.where, d.reason, int(i)) for d in result.dead_letters if " raised " in d.reason
                   for i in d.batch["id"])


def plan_for(query: Query, parallelism: dict | None = None) -> PhysicalPlan:
    """k = 2 over three servers: node ``j`` (the entry points first) on servers ``j`` and
    ``j + 1`` (mod 3), the applications on ``SERVERS[0]``; a partitioned operator's partitions
    (``parallelism``) each on its servers; entry partitions (``"entry"``) all on the entry points'
    servers; a partitioned application's partitions (k replicas each) on ``SERVERS[0]`` and
    ``SERVERS[2]``, so the server fault scripts never touch an application."""
    entry_parts, parallelism = entry_parallelism(parallelism)
    nodes = [ENTRY, *query.operators]
    placement = {n: [SERVERS[j % 3], SERVERS[(j + 1) % 3]] for j, n in enumerate(nodes)}
    placement.update({app: [SERVERS[0]] if app not in (parallelism or {}) else [SERVERS[0], SERVERS[2]]
                      for app in query.sinks})
    return PhysicalPlan(query, placement, k=K, parallelism=parallelism, applications=True,
                        entry_partitions=entry_parts if entry_parts > 1 else None)


def engine_parallelism(plan: PhysicalPlan) -> dict:
    """The ``parallelism=`` an engine takes for ``plan``: its partitioned operators and applications,
    and ``"entry"`` when the entry points are partitioned."""
    return {**({ENTRY: plan.entry_partitions} if plan.entry_partitions > 1 else {}), **plan.parallelism}


def engine_placement(plan: PhysicalPlan) -> dict:
    """The placement an engine takes for ``plan``: every node's servers, and each partition of a
    partitioned application on its own (``"out.P"``), so no engine spreads them elsewhere."""
    out = dict(plan.placement)
    out.update({f"{app}.{i}": where for app in plan.query.sinks if app in plan.parallelism
                for i, where in enumerate(plan.partition_placement[app])})
    return out


def group_name(plan: PhysicalPlan, node: str, j: int) -> str:
    """What a fault names for ``node``: the node, or partition ``j mod p`` of a partitioned one
    (the entry points' too: ``"entry.1"``)."""
    p = plan.partitions(node)
    return node if p == 1 else f"{node}.{j % p}"


def time_span(inputs: dict) -> tuple[int, int]:
    """The earliest and latest timestamps of the inputs."""
    times = [int(np.asarray(c["ts"]).min()) for chunks in inputs.values() for c in chunks]
    times += [int(np.asarray(c["ts"]).max()) for chunks in inputs.values() for c in chunks]
    return min(times), max(times)


def fault_script(name: str, case: Case, query: Query, inputs: dict, plan: PhysicalPlan | None = None) -> list[Fault]:
    """The faults of script ``name``, at event times inside the inputs (naming partitions of the
    plan's partitioned operators)."""
    t0, t1 = time_span(inputs)
    mid = t0 + (t1 - t0) // 2
    plan = plan if plan is not None else plan_for(query)
    target = group_name(plan, case.target, 1)
    if name == "none":
        return []
    if name == "kill_replica":
        return [Fault(mid, KillReplica(target, 0))]
    if name == "kill_one_of_each":  # (and of every partitioned application: it runs k replicas per partition)
        groups = [ENTRY, *query.operators, *(a for a in query.sinks if a in plan.parallelism)]
        return [Fault(t0 + (t1 - t0) * (j + 1) // (len(groups) + 1), KillReplica(group_name(plan, g, j), j % K))
                for j, g in enumerate(groups)]
    if name == "kill_server":
        return [Fault(mid, KillServer(VICTIM))]
    if name == "stop_replica":
        return [Fault(mid, StopReplica(target, 0))]
    raise ValueError(f"unknown fault script {name!r}")


FAULT_SCRIPTS = ["none", "kill_replica", "kill_one_of_each", "kill_server", "stop_replica"]


def expected_kills(plan: PhysicalPlan, faults: list[Fault]) -> set[str]:
    """The replicas the faults kill, as the plan labels them (applications are never on the victim)."""
    out = set()
    for f in faults:
        ev = f.sentinel
        if isinstance(ev, KillReplica):
            out.add(plan.replicas(ev.operator)[ev.replica].label)
        elif isinstance(ev, KillServer):
            out |= {r.label for r in plan.replicas() if plan.server(r) == ev.server and not r.application}
    return out


def expected_stops(plan: PhysicalPlan, faults: list[Fault]) -> set[str]:
    """The replicas the faults stop, as the plan labels them."""
    return {plan.replicas(f.sentinel.operator)[f.sentinel.replica].label for f in faults
            if isinstance(f.sentinel, StopReplica)}


def stops(faults: list[Fault]) -> bool:
    """Whether a fault script stops a replica (which not every engine can express yet)."""
    return any(isinstance(f.sentinel, StopReplica) for f in faults)


def with_sentinels(query: Query, inputs: dict, faults: list[Fault]) -> dict:
    """``inputs`` with each fault's sentinel placed (:class:`inject_at`) in the first source whose
    input reaches the fault's time, so it fires just before that source's first chunk at or after it."""
    out = dict(inputs)
    for f in sorted(faults, key=lambda f: f.at):
        src = next(s for s in query.sources
                   if any(chunk_time(c) is not None and chunk_time(c) >= f.at for c in inputs[s]))
        out[src] = inject_at(out[src], f.at, f.sentinel)
    return out


# -- the engines ---------------------------------------------------------------------------------

class EngineAdapter(Protocol):
    """What the suite needs of an engine."""

    runs_faults: bool
    fences_stopped: bool

    def run(self, plan: PhysicalPlan, inputs: dict, faults: list[Fault]) -> RunResult: ...


ENGINES: list[str] = []


def engine(fn):
    """Register an engine adapter fixture (session-scoped): every case runs on it."""
    ENGINES.append(fn.__name__)
    return pytest.fixture(scope="session")(fn)


class ReferenceAdapter:
    """The ideal run; faults ignored."""

    runs_faults = False
    fences_stopped = False

    def run(self, plan, inputs, faults):
        return run_reference(plan.query, inputs)


class InProcessAdapter:
    """:func:`run_replicated` on the plan's placement, faults as sentinels at their event time."""

    runs_faults = True
    fences_stopped = False

    def run(self, plan, inputs, faults):
        q = plan.query
        res = run_replicated(q, with_sentinels(q, inputs, faults), k=K, seed=11, placement=engine_placement(plan),
                             parallelism=engine_parallelism(plan))
        h = res.stats["harness"]

        def group(name):  # an entry copy is named by its source ("load_0#1", "load_0.1#1" in entry partition 1)
            base, part = parse_partition_label(name)
            return name if base not in q.sources else ENTRY if part is None else f"{ENTRY}.{part}"

        def labels(names):
            return sorted({f"{group(n)}#{i}" for n, _, i in (label.rstrip("'").rpartition("#") for label in names)})

        res.events = [{"event": "killed", "replica": label} for label in labels(h.crashed)]
        res.events += [{"event": "stopped", "replica": label} for label in labels(h.stopped)]
        return res


class RayAdapter:
    """A Ray deployment (``network="zero"``) on the plan's placement, faults as sentinels the feeder runs."""

    runs_faults = True
    fences_stopped = True

    def run(self, plan, inputs, faults):
        from replistream import deploy

        q = plan.query
        with deploy(q, servers=SERVERS, k=K, placement=engine_placement(plan), network="zero",
                    parallelism=engine_parallelism(plan), bits=plan.bits) as dep:
            res = dep.run(with_sentinels(q, inputs, faults), timeout=120)
        res.events = [{"event": {"dead": "killed", "stopped": "stopped"}[e["event"]], "replica": e["actor"]}
                      for e in res.events if e.get("event") in ("dead", "stopped")]
        return res


class SimAdapter:
    """The simulator on the plan, faults as sentinels it runs when its feeder reaches them."""

    runs_faults = True
    fences_stopped = False

    def run(self, plan, inputs, faults):
        from replistream.sim import Simulator

        if stops(faults):
            pytest.skip("simulator: no hook stops a replica (sim.engine.sentinel_kill runs only KillReplica "
                        "and KillServer); sim/ is another area of work")

        q = plan.query
        res = Simulator(q, engine_placement(plan), ZeroLatency(SERVERS),
                        parallelism=engine_parallelism(plan)).run(with_sentinels(q, inputs, faults))
        res.events = [e for e in res.events if e.get("event") == "killed"]
        return res


@engine
def reference():
    return ReferenceAdapter()


@engine
def inprocess():
    return InProcessAdapter()


@engine
def ray(ray_session):
    return RayAdapter()


@engine
def sim():
    return SimAdapter()


@pytest.fixture(params=ENGINES)
def engine_under_test(request) -> EngineAdapter:
    """Each registered engine in turn."""
    return request.getfixturevalue(request.param)


# -- the suite -----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("script", FAULT_SCRIPTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_engine_matches_the_ideal_run(engine_under_test, case, script):
    query, inputs = case.build()
    plan = plan_for(query)
    faults = fault_script(script, case, query, inputs)
    expected = run_reference(query, inputs)
    got = engine_under_test.run(plan, inputs, faults)
    assert got.complete, f"applications did not receive the end of stream: {got.punctuation}"
    for app in query.sinks:
        assert len(expected.outputs[app]) > 0, f"case {case.name}: {app} receives nothing; a vacuous case"
        assert_same_output(expected.outputs[app], got.outputs[app])
    assert raised_rows(got) == raised_rows(expected)
    if case.name == "user_error":
        assert sum(raised_rows(expected).values()) > 0, "the user_error case sets nothing aside; a vacuous case"
    if engine_under_test.runs_faults:
        killed = {e["replica"] for e in got.events if e.get("event") == "killed"}
        # a fencing engine may declare a stopped replica failed and kill it before the run ends (its
        # detector's timing); no other replica may die
        fenced = expected_stops(plan, faults) if engine_under_test.fences_stopped else set()
        assert expected_kills(plan, faults) <= killed <= expected_kills(plan, faults) | fenced
        stopped = {e["replica"] for e in got.events if e.get("event") == "stopped"}
        assert stopped == expected_stops(plan, faults)


#: (case, parallelism): the cases with some operators partitioned (issue #41)
PARTITIONED = [(CASES[1], {"sliding": 2}), (CASES[2], {"per_user": 3}), (CASES[0], {"correlate": 2, "hot": 2}),
               (CASES[3], {"merged": 2, "positive": 3}), (CASES[4], {"double": 2, "per_key": 2})]


#: the fault scripts Ray runs the partitioned cases under: a kill of one replica of every node (of
#: one partition of each partitioned node) and a stopped partition replica, fenced (all five pass
#: on Ray: 25 cases took 262 s on 2 loaded cores, too much of the suite's 30 minutes)
RAY_PARTITIONED_SCRIPTS = ("kill_one_of_each", "stop_replica")


@pytest.mark.slow
@pytest.mark.parametrize("script", FAULT_SCRIPTS)
@pytest.mark.parametrize("case, parallelism", PARTITIONED, ids=[f"{c.name}-{'+'.join(p)}" for c, p in PARTITIONED])
@pytest.mark.parametrize("engine_name", [e for e in ENGINES if e != "reference"])
def test_partitioned_engine_matches_the_ideal_run(request, engine_name, case, parallelism, script):
    """The partitioned cases: the same comparison with the ideal run, kills naming partitions. The
    engines that honour ``parallelism=`` (the reference ignores it: its partitioned runs are its
    unpartitioned ones, compared above): the in-process engine and the simulator (50 cases), Ray
    under :data:`RAY_PARTITIONED_SCRIPTS` (10 cases)."""
    if engine_name == "ray" and script not in RAY_PARTITIONED_SCRIPTS:
        pytest.skip(f"Ray runs the partitioned cases under {RAY_PARTITIONED_SCRIPTS} only (the suite's time; "
                    f"a fault run checks the fault-free output too)")
    engine_under_test = request.getfixturevalue(engine_name)
    query, inputs = case.build()
    plan = plan_for(query, parallelism)
    assert plan.parallelism == parallelism
    faults = fault_script(script, case, query, inputs, plan)
    expected = run_reference(query, inputs)
    got = engine_under_test.run(plan, inputs, faults)
    assert got.complete, f"applications did not receive the end of stream: {got.punctuation}"
    for app in query.sinks:
        assert len(expected.outputs[app]) > 0
        assert_same_output(expected.outputs[app], got.outputs[app])
    assert raised_rows(got) == raised_rows(expected)
    if engine_under_test.runs_faults:
        killed = {e["replica"] for e in got.events if e.get("event") == "killed"}
        assert killed == expected_kills(plan, faults)
        assert {e["replica"] for e in got.events if e.get("event") == "stopped"} == expected_stops(plan, faults)
        if script in ("kill_replica", "stop_replica") and case.target in parallelism:
            assert all("." in label for label in killed | expected_stops(plan, faults)), "no partition was hit"


def test_every_server_kill_leaves_each_operator_a_replica():
    """The plans keep the server fault scripts meaningful: the victim hosts one replica of some
    nodes, never both, and no application."""
    for case in CASES:
        query, _ = case.build()
        plan = plan_for(query)
        for node in [ENTRY, *query.operators]:
            assert [plan.server(r) for r in plan.replicas(node)].count(VICTIM) <= 1
        assert all(plan.server(r) != VICTIM for r in plan.replicas() if r.application)
        assert expected_kills(plan, [Fault(0, KillServer(VICTIM))])


# -- entry partitions and application partitions --------------------------------------------------

def retarget(case: Case, target: str) -> Case:
    """``case`` with its single-replica faults aimed at ``target`` (``"entry"``, or an application)."""
    return Case(f"{case.name}@{target}", case.build, target)


#: (case, parallelism) with the entry points partitioned (``parallelism={"entry": p}``; labels
#: ``entry.P#R``, docs/design.md "Entry partitions"): the single-replica faults hit an entry partition
#: (``"entry.1"``) or, for the count window, the operator beside them; some with partitioned operators too
ENTRY_PARTITIONED = [(retarget(CASES[0], ENTRY), {"entry": 2}),
                     (retarget(CASES[1], ENTRY), {"entry": 3, "sliding": 2}),
                     (CASES[2], {"entry": 2}),
                     (retarget(CASES[3], ENTRY), {"entry": 2, "merged": 2}),
                     (retarget(CASES[4], ENTRY), {"entry": 2})]

#: (case, parallelism) with an application partitioned (labels ``out.P#R``, docs/design.md
#: "Application partitions"): the single-replica faults hit a replica of an application partition
#: (``"stats.1"``), and ``kill_one_of_each`` kills one of its replicas too; some with partitioned
#: operators upstream, one with entry partitions as well
APP_PARTITIONED = [(retarget(CASES[1], "stats"), {"stats": 2}),
                   (retarget(CASES[2], "totals"), {"per_user": 2, "totals": 3}),
                   (retarget(CASES[0], "alerts"), {"correlate": 2, "alerts": 2}),
                   (retarget(CASES[3], "out"), {"out": 2}),
                   (retarget(CASES[4], "sums"), {"entry": 2, "per_key": 2, "sums": 2})]

ENTRY_APP = ENTRY_PARTITIONED + APP_PARTITIONED
ENTRY_APP_IDS = [f"{c.name}-{'+'.join(p)}" for c, p in ENTRY_APP]

#: the (case id, fault script) pairs Ray runs of :data:`ENTRY_APP` (the suite's time): an entry
#: partition's replica killed (with every other node's) and stopped, an application partition's
#: replica stopped and killed (with one of every other node's, entry partitions included)
#: (two pairs: entry partitions under kills, a partitioned application under a stop; the in-process
#: engine runs every case under every script, and tests/ray/test_entry_partitions_ray.py and
#: test_app_partitions_ray.py cover both kinds on Ray; the suite's 30 minutes)
RAY_ENTRY_APP = {("fig1@entry-entry", "kill_one_of_each"), ("sliding_window@stats-stats", "stop_replica")}


def test_entry_and_app_cases_are_the_ones_ray_runs():
    """Every Ray pair names a case of :data:`ENTRY_APP` (a renamed case would silently drop it)."""
    assert {c for c, _ in RAY_ENTRY_APP} <= set(ENTRY_APP_IDS)
    assert {s for _, s in RAY_ENTRY_APP} <= set(FAULT_SCRIPTS)


@pytest.mark.slow
@pytest.mark.parametrize("script", FAULT_SCRIPTS)
@pytest.mark.parametrize("case, parallelism", ENTRY_APP, ids=ENTRY_APP_IDS)
@pytest.mark.parametrize("engine_name", ["inprocess", "ray", "sim"])
def test_entry_and_app_partitions_match_the_ideal_run(request, engine_name, case, parallelism, script):
    """Entry and application partitions on every engine (the in-process engine and the simulator: 50
    cases each, the simulator without the scripts that stop a replica; Ray: :data:`RAY_ENTRY_APP`),
    compared with the ideal run as a multiset, under the suite's fault scripts (kills and stops
    naming ``entry.P`` or ``out.P``); a killed or stopped replica is one of the named partition's."""
    case_id = f"{case.name}-{'+'.join(parallelism)}"
    if engine_name == "ray" and (case_id, script) not in RAY_ENTRY_APP:
        pytest.skip("Ray runs the entry and application partition cases of RAY_ENTRY_APP only (the suite's time)")
    engine_under_test = request.getfixturevalue(engine_name)
    query, inputs = case.build()
    plan = plan_for(query, parallelism)
    assert engine_parallelism(plan) == parallelism
    faults = fault_script(script, case, query, inputs, plan)
    expected = run_reference(query, inputs)
    got = engine_under_test.run(plan, inputs, faults)
    assert got.complete, f"applications did not receive the end of stream: {got.punctuation}"
    for app in query.sinks:
        assert len(expected.outputs[app]) > 0, f"case {case.name}: {app} receives nothing; a vacuous case"
        assert_same_output(expected.outputs[app], got.outputs[app])
    assert raised_rows(got) == raised_rows(expected)
    killed = {e["replica"] for e in got.events if e.get("event") == "killed"}
    fenced = expected_stops(plan, faults) if engine_under_test.fences_stopped else set()
    assert expected_kills(plan, faults) <= killed <= expected_kills(plan, faults) | fenced
    assert {e["replica"] for e in got.events if e.get("event") == "stopped"} == expected_stops(plan, faults)
    if script in ("kill_replica", "stop_replica") and case.target in parallelism:
        hit = expected_kills(plan, faults) | expected_stops(plan, faults)
        assert hit and all(label.startswith(f"{case.target}.") for label in hit), f"no partition was hit: {hit}"
    if script == "kill_one_of_each":
        kinds = {"entry": ENTRY in parallelism, "app": any(a in parallelism for a in query.sinks)}
        if kinds["entry"]:
            assert any(label.startswith(f"{ENTRY}.") for label in killed), "no entry partition's replica was killed"
        if kinds["app"]:
            assert any(label.split(".")[0] in query.sinks for label in killed), "no application replica was killed"


