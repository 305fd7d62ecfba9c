"""Issue #15 on Ray: every run ends complete and exact or with an error naming what was lost, at once,
never a silent timeout (docs/reliability.md). An error raised by a replica's own code is not the death
of that replica; losing every replica of an operator or of the application ends the run at once."""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from replistream import Query, RunFailed, UserFunctionError, deploy, seconds
from replistream.sources import Call, KillReplica, KillServer, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

SERVERS = ["boston", "london", "tokyo"]


def raising(b):
    """Keeps v > 0 and raises on rows with k == 3, whatever the batch."""
    if (b["k"] == 3).any():
        raise ValueError("k is 3")
    return b["v"] > 0


def query(pred=raising, on_error=None, window=False):
    q = Query("semantics")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    f = s.filter(pred, name="pick", on_error=on_error)
    if window:
        f = f.window(size=seconds(2), by="k", name="per_k")
    f.sink("out")
    return q.build()


def inputs(n=300, chunk=10, seed=1):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(30), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def raised(result):
    return sorted((d.where, d.reason, int(i)) for d in result.dead_letters if " raised " in d.reason
                  for i in d.batch["id"])


@pytest.mark.slow
def test_rows_a_user_function_raises_on_are_dead_lettered_once_and_nothing_else_is_lost():
    q = query()
    ref = run_reference(q, inputs())
    with deploy(q, servers=SERVERS, k=2, placement={"entry": SERVERS[:2], "pick": SERVERS[1:], "out": SERVERS[:1]}) as dep:
        res = dep.run(inputs(), timeout=120)
    assert res.complete and len(raised(ref)) > 0
    assert raised(res) == raised(ref)
    assert sorted(map(tuple, res.outputs["out"].tolist())) == sorted(map(tuple, ref.outputs["out"].tolist()))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["fail", "wrong_length"])
def test_an_error_in_a_replica_ends_the_run_at_once_naming_operator_and_replica(case):
    q = query(raising, on_error="fail") if case == "fail" else query(lambda b: np.ones(len(b) + 1, dtype=bool))
    with deploy(q, servers=SERVERS, k=2) as dep:
        with pytest.raises(UserFunctionError) as e:
            dep.run(inputs(), timeout=600)  # returns long before: the error ends the wait
    assert e.value.operator == "pick" and e.value.replica in ("pick#0", "pick#1")
    assert e.value.result is not None
    if case == "fail":
        assert "predicate raised ValueError: k is 3" in str(e.value) and e.value.row[2] == 3


@pytest.mark.slow  # a full Ray run: 11.7 s of the quick subset (#31)
def test_deploy_on_error_overrides_the_query_policy():
    with deploy(query(), servers=SERVERS, k=2, on_error="fail") as dep:
        with pytest.raises(UserFunctionError, match="k is 3"):
            dep.run(inputs(), timeout=600)
    with pytest.raises(ValueError, match="on_error must be 'dead_letter' or 'fail'"):
        deploy(query(), servers=SERVERS, k=2, on_error="ignore")


@pytest.mark.slow
def test_a_record_an_entry_point_refuses_ends_the_run_and_is_not_an_entry_death():
    data = [{"ts": i * 1000, "k": 1, "v": 1.0} for i in range(1, 60)]
    data[10] = {"ts": 5, "k": [1, 2], "v": 1.0}
    with deploy(query(), servers=SERVERS, k=2, on_malformed="raise") as dep:
        with pytest.raises(RunFailed, match=r"'s' failed \(replica entry#\d.*SchemaError.*field 'k'") as e:
            dep.run({"s": data}, timeout=600)
        assert not [ev for ev in dep.events if ev.get("event") == "dead"]  # no replica taken for dead
    assert e.value.operator == "s"
    with deploy(query(), servers=SERVERS, k=2) as dep:  # the default: set aside with its reason
        res = dep.run({"s": data}, timeout=120)
    assert res.complete and res.dead_letter_count() == 1 and len(res.outputs["out"]) == 58
    assert "field 'k' has 2 values" in res.dead_letters[0].reason


@pytest.mark.slow
def test_losing_every_replica_of_an_operator_ends_the_run_at_once_naming_it():
    q = query(lambda b: b["v"] > 0, window=True)
    data = inputs()
    mid = seconds(15)
    data["s"] = inject_at(inject_at(data["s"], mid, KillReplica("per_k", 0)), mid + seconds(1), KillReplica("per_k", 1))
    with deploy(q, servers=SERVERS, k=2) as dep:
        with pytest.raises(RunFailed, match=r"every replica of 'per_k' is lost: per_k#0 .*per_k#1") as e:
            dep.run(data, timeout=600)
    assert e.value.operator == "per_k" and e.value.result is not None


def crash(label):
    """A death the deployment does not cause (as a crashed process or an OOM kill): the actor is
    killed behind its back, so only the driver's liveness check can tell."""
    return Call(lambda d: ray.kill(d.topology.handle(label), no_restart=True))


@pytest.mark.slow
def test_replicas_that_die_on_their_own_are_noticed_and_losing_all_ends_the_run_naming_them():
    q = query(lambda b: b["v"] > 0, window=True)
    data = inputs()
    mid = seconds(15)
    data["s"] = inject_at(inject_at(data["s"], mid, crash("per_k#0")), mid + seconds(1), crash("per_k#1"))
    with deploy(q, servers=SERVERS, k=2) as dep:
        with pytest.raises(RunFailed, match=r"every replica of 'per_k' is lost: per_k#0 \(died.*per_k#1 \(died") as e:
            dep.run(data, timeout=600)  # before: no error until the timeout
    assert e.value.operator == "per_k"


@pytest.mark.slow
def test_one_replica_that_dies_on_its_own_is_masked_and_logged():
    q = query(lambda b: b["v"] > 0, window=True)
    data = inputs()
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(15), crash("per_k#1"))
    with deploy(q, servers=SERVERS, k=2) as dep:
        res = dep.run(data, timeout=600)
        deadline = time.time() + 60
        while not any(e.get("actor") == "per_k#1" for e in dep.events if e.get("event") == "dead"):
            assert time.time() < deadline, "the death of per_k#1 was never noticed"
            dep.check_failures()  # nothing to raise: one replica of two is lost
            time.sleep(0.05)
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])


def hangs(b):
    """A user function that never returns on rows with k == 5 (as a call to a dead service would)."""
    if (b["k"] == 5).any():
        time.sleep(3600)
    return b["v"] > 0


@pytest.mark.slow
def test_a_timeout_names_the_operator_that_holds_the_run_back():
    with deploy(query(hangs), servers=SERVERS, k=2) as dep:
        dep.ASK_TIMEOUT_S = 2.0  # the hung replicas never answer: do not wait long for them
        with pytest.raises(RunFailed, match=r"'pick' holds the run back: pick#\d busy in a call .*pick#\d busy") as e:
            dep.run(inputs(), timeout=6)
    assert e.value.operator == "pick" and e.value.result is not None
    assert {"pick#0", "pick#1"} <= {a["actor"] for a in e.value.result.events if a.get("event") == "no_answer"}


@pytest.mark.slow
def test_losing_the_only_application_replica_ends_the_run_naming_the_application():
    data = inputs()
    data["s"] = inject_at(data["s"], seconds(15), KillServer("boston"))
    placement = {"entry": SERVERS[1:], "pick": SERVERS[1:], "out": ["boston"]}
    with deploy(query(lambda b: b["v"] > 0), servers=SERVERS, k=2, placement=placement) as dep:
        with pytest.raises(RunFailed, match="every replica of 'out' is lost") as e:
            dep.run(data, timeout=600)
    assert e.value.operator == "out"


def test_misuse_gets_a_clear_error():
    q = query(lambda b: b["v"] > 0)
    with pytest.raises(ValueError, match="k .* must be an integer >= 1, got 2.5"):
        deploy(q, servers=SERVERS, k=2.5)
    dep = deploy(q, servers=SERVERS, k=2)
    try:
        assert dep.run(inputs(n=40), timeout=120).complete
        with pytest.raises(RuntimeError, match="already been fed"):
            dep.run(inputs(n=40))
    finally:
        dep.shutdown()
    with pytest.raises(RuntimeError, match="was shut down"):
        dep.run(inputs(n=40))


@pytest.mark.slow
def test_parquet_files_stay_inside_the_folder_given(tmp_path):
    from replistream.engines.ray.common import inside

    with pytest.raises(ValueError, match="would lie outside"):
        inside(str(tmp_path / "pq" / "inner"), "../escape")
    with deploy(query(lambda b: b["v"] > 0), servers=SERVERS, k=2, parquet_dir=str(tmp_path / "pq")) as dep:
        dep.run(inputs(n=60), timeout=120)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert files and all(f.startswith("pq/out/out-") for f in files)


@pytest.mark.slow
def test_applications_as_replicas_mask_the_loss_of_one_and_count_each_result_once():
    """app_replicas=2: each application replica has its duplicate filter, the driver keeps the first
    copy of each result; killing one application's server loses nothing and duplicates nothing."""
    q = query(lambda b: b["v"] > 0, window=True)
    data = inputs()
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(15), KillServer("boston"))
    placement = {"entry": SERVERS[1:], "pick": SERVERS[1:], "per_k": SERVERS[1:], "out": ["boston"]}
    with deploy(q, servers=SERVERS, k=2, placement=placement, app_replicas=2) as dep:
        assert dep.plan["out"] == ["boston", "london"]
        res = dep.run(data, timeout=120)
        assert not dep.alive["out"] and dep.alive["out#1"]
        assert dep.metrics()["applications"]["out"]["delivered"] == len(res.outputs["out"])
    assert res.complete
    assert sorted(map(tuple, res.outputs["out"].tolist())) == sorted(map(tuple, ref.outputs["out"].tolist()))
    with pytest.raises(ValueError, match="app_replicas must be an integer between 1 and 3"):
        deploy(q, servers=SERVERS, k=2, app_replicas=4)
