"""A pickled query carries its graph as plain dicts and lists (``replistream.query._PlainGraph``):
every replica's actor unpickles the query, and building its operator from it must not import
networkx (issue #42, start-up: ~50 ms of CPU per actor, ten actors starting at once on two cores
for k=3). The unpickled query answers exactly as the original does, and asking it for its graph
builds the networkx graph again.
"""
import json
import pickle
import subprocess
import sys

import pytest
from ray import cloudpickle  # how Ray sends an actor its arguments (lambdas included)

import replistream as rs
from replistream.operators.keyed import KeyedCount
from replistream.query import FilterSpec


def _queries():
    q1 = rs.Query("band")
    left = q1.source("l", {"k": "i8", "x": "f8"}, punctuate_every=10)
    right = q1.source("r", {"k": "i8", "y": "f8"}, punctuate_every=10)
    j = left.join(right, window=100, on="k", name="j")
    j.filter(lambda b: b["x"] > 0, name="f", on_error="fail").window(size=40, slide=20, by="k_l", name="w").sink("out")
    j.sink("raw")
    q2 = rs.Query("union", on_error="fail")
    s = q2.source("s", {"k": "i8"}, punctuate_every=5)
    u = q2.union(s, s.map(lambda b: {"k": b["k"] + 1}, name="m"), name="u")
    u.apply(KeyedCount(by="k"), name="kc").sink("counts")
    u.count_window(3, by="k", name="cw").sink("threes")
    return [q1.build(), q2.build()]


def _answers(q):
    nodes = q.topological()
    return {
        "topological": nodes, "sources": q.sources, "operators": q.operators, "sinks": q.sinks,
        "sorters": q.sorters,
        "spec": {n: repr(type(q.spec(n))) for n in nodes},
        "inputs": {n: q.inputs_of(n) for n in nodes},
        "outputs": {n: q.outputs_of(n) for n in nodes},
        "schema": {n: repr(q.schema_of(n)) for n in nodes},
        "on_error": {n: q.on_error_of(n) for n in nodes},
        "descendants": {n: sorted(q.descendants(n)) for n in nodes},
        "grids": {n: (q.window_grid(n), q.release_grid(n)) for n in q.sources},
        "has": [q.has_node(n) for n in nodes + ["nope"]],
    }


@pytest.mark.parametrize("which", [0, 1])
def test_an_unpickled_query_answers_as_the_original(which):
    q = _queries()[which]
    copy = pickle.loads(cloudpickle.dumps(q))
    assert copy._graph is None and copy._plain is not None  # it reads the plain copy
    assert _answers(copy) == _answers(q)
    assert copy._graph is None  # answering built no networkx graph
    g = copy.graph  # asked for: built again, and read from then on
    assert copy._graph is g
    assert sorted(g.edges(data="port")) == sorted(q.graph.edges(data="port"))
    assert {n: type(d["spec"]) for n, d in g.nodes(data=True)} == {n: type(d["spec"]) for n, d in q.graph.nodes(data=True)}
    assert _answers(copy) == _answers(q)


def test_a_change_to_an_unpickled_querys_graph_is_seen():
    """A runtime change rewrites a node's spec through ``query.graph`` (replistream.replica.changes):
    the query then answers from the graph, not from the plain copy it was unpickled with."""
    q = pickle.loads(cloudpickle.dumps(_queries()[0]))
    new = FilterSpec(lambda b: b["x"] < 0)
    q.graph.nodes["f"]["spec"] = new
    assert q.spec("f") is new
    with pytest.raises(rs.QueryError, match="no node 'g'"):
        q.spec("g")


def test_an_actor_builds_its_operator_without_networkx(tmp_path):
    """What every replica's actor does with the query it is given: unpickle it, build the entry logic
    of each source, and a replica (duplicate filters, sorters, operator) of every operator and
    application. In a fresh process, none of it imports networkx; the same process asking for the
    graph does (the probe sees an import when there is one)."""
    path = tmp_path / "queries.pkl"
    path.write_bytes(cloudpickle.dumps(_queries()))
    code = (
        "import json, pickle, sys\n"
        "from replistream.replica import ReplicaCore\n"
        f"queries = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        "built = 0\n"
        "for q in queries:\n"
        "    for n in q.sources:\n"
        "        q.build_entry(n); built += 1\n"
        "    for n in q.operators + q.sinks:\n"
        "        ReplicaCore(q, n, channels=[2] * len(q.inputs_of(n))); built += 1\n"
        "before = 'networkx' in sys.modules\n"
        "queries[0].graph\n"
        "print(json.dumps([built, before, 'networkx' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    built, before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert built == 14
    assert not before, "building an actor's operator from an unpickled query imported networkx"
    assert after
