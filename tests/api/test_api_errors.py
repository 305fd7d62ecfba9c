"""Python API mistakes answered as the command line answers them (#44 point 5): unknown keywords
with "did you mean" and every keyword, a missing file as FileNotFoundError with its absolute path,
a field typo naming the call, the operator's name and the nearest field, and operators named by
what the user wrote (``"join"``) or told exactly what to write. No Ray: every check comes first."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from replistream import FileSource, Query, deploy, seconds
from replistream.errors import QueryError, SchemaError
from replistream.query import resolve_operator
from replistream.summary import WaitSummary


def fig1_like():
    q = Query("monitor")
    load = q.source("load", {"server": "i8", "cpu": "f8"}, punctuate_every=seconds(1))
    mem = q.source("mem", {"server": "i8", "free": "f8"}, punctuate_every=seconds(1))
    j = load.join(mem, window=seconds(2), on="server")
    j.window(size=seconds(1), by="server_l", aggs={"n": "count"}).sink("per_server")
    return q


def test_deploy_names_an_unknown_keyword_and_the_nearest():
    with pytest.raises(TypeError) as e:
        deploy(fig1_like(), servrs=3)
    msg = str(e.value)
    assert "deploy() got an unexpected keyword argument 'servrs'; did you mean 'servers'?" in msg
    assert "Its keywords: query, servers, k, placement," in msg and "detached" in msg
    with pytest.raises(TypeError, match=r"'paralelism'(; did you mean '\w+'\?|\.) Its keywords: query, servers"):
        deploy(fig1_like(), paralelism=2)


def test_a_missing_file_is_file_not_found_with_the_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        FileSource("readings/today")
    full = str(tmp_path / "readings" / "today")
    assert e.value.filename == full and full in str(e.value)
    assert isinstance(e.value, SchemaError)  # what it was before: code catching SchemaError still does
    with pytest.raises(FileNotFoundError, match="the folder to watch"):
        FileSource("incoming", watch=True, idle_timeout=1)


def test_a_field_typo_names_the_call_the_operator_and_the_nearest_field():
    q = Query()
    s = q.source("readings", {"server": "i8", "cpu": "f8"})
    with pytest.raises(QueryError) as e:
        s.window(size=seconds(1), by="sever")
    assert str(e.value) == ("window(..., by='sever') named 'window_1': 'sever' is not a field of its input "
                            "'readings' (fields: ts, server, cpu); did you mean 'server'?")
    with pytest.raises(QueryError, match=r"count_window\(..., by='cpuu'\) named 'busy'.*did you mean 'cpu'"):
        s.count_window(10, by="cpuu", name="busy")
    other = q.source("mem", {"host": "i8"})
    with pytest.raises(QueryError, match=r"join\(..., right_key='hots'\) named 'join_\d+': 'hots' is not a field "
                                         r"of its input 'mem' \(fields: ts, host\); did you mean 'host'\?"):
        s.join(other, window=10, left_key="server", right_key="hots")
    assert "TimeWindowAggregateLogic" not in str(e.value)


def test_operators_are_named_by_what_the_user_wrote():
    q = fig1_like()
    assert resolve_operator(q, "join") == "join_1" and resolve_operator(q, "window") == "window_2"
    assert q.operator("per_server") == "per_server" and q.operator("entry") == "entry"
    with pytest.raises(QueryError, match=r"no operator 'jion' \(operators: join_1, window_2\); did you mean"):
        q.operator("jion")
    q2 = Query()
    a, b = q2.source("a", {"k": "i8"}), q2.source("b", {"k": "i8"})
    a.join(b, 10, on="k").join(b, 10, left_key="k_l", right_key="k").sink("out")
    with pytest.raises(QueryError, match=r"2 operators made by join\(\): join_1, join_2; name one of them"):
        resolve_operator(q2, "join")


def test_the_wait_summary_is_truthy_when_complete_and_travels():
    s = WaitSummary(True, {"out": 3}, dead_letters=0, faults_masked=1)
    assert s and s == True and (WaitSummary(False, {"out": 0}, 0) == False)  # noqa: E712 (the old API's answers)
    back = pickle.loads(pickle.dumps(s))  # what a detached deployment's client receives from its host
    assert (back.complete, back.outputs, back.dead_letters, back.faults_masked) == (True, {"out": 3}, 0, 1)
    assert repr(back) == "WaitSummary(complete; out: 3 tuples; 0 dead letters; 1 fault masked)"

    class Dep:  # counts dead letters only when asked (a deployment asks its replicas then)
        asked = 0

        def collect(self):
            Dep.asked += 1
            return type("R", (), {"dead_letter_count": lambda self: 2})()

    lazy = WaitSummary(True, {"out": 1}, None, 0, source=Dep())
    assert Dep.asked == 0 and lazy.dead_letters == 2 and lazy.dead_letters == 2 and Dep.asked == 1
    assert pickle.loads(pickle.dumps(WaitSummary(True, {}, None, 0, source=Dep()))).dead_letters == 2
