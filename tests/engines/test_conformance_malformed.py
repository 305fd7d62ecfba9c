"""Records an entry point cannot read, on every engine (#31): under ``on_malformed="dead_letter"``
(the default of every engine) the reference engine, the in-process
replicated engine, the simulator and a Ray deployment set aside the same records with the same
``where`` and reason and deliver the same outputs; under ``on_malformed="raise"`` each stops with
the same :class:`~replistream.errors.SchemaError` text (a deployment wraps it in
:class:`~replistream.errors.RunFailed` naming the source and the entry replica,
docs/reliability.md).

The input is seeded: 200 readings in 4 chunks of records, with one record of each kind the entry
points refuse (docs/reliability.md's table) at fixed places, so every chunk mixes good and bad.
"""
from __future__ import annotations

import numpy as np
import pytest

from replistream import END, Query, RunFailed, SchemaError, seconds
from replistream.engines.result import dead_letter_summary
from replistream.network import ZeroLatency, default_servers
from replistream.testing import assert_same_output, run_reference, run_replicated

K = 2
SERVERS = [s.name for s in default_servers(3)]
BAD = {  # position in the input -> an unreadable record, and what its reason must say
    7: ({"ts": seconds(7), "k": [1, 2], "v": 1.0}, "field 'k' has 2 values"),
    31: ((seconds(31), 1, 1.0), "a record is a tuple, expected a mapping"),
    64: (None, "a record is a NoneType"),
    90: ({"ts": 2**63, "k": 1, "v": 1.0}, "beyond int64"),
    120: ({"ts": END, "k": 1, "v": 1.0}, "reserved for the end of the stream"),
    151: ({"ts": seconds(151), "v": 1.0}, "'k'"),
    170: ({"ts": "170", "k": 1, "v": 1.0}, "field 'ts'"),
}


def query() -> Query:
    q = Query("malformed")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(10))
    s.filter(lambda b: b["v"] > 0.2, name="keep").sink("kept")
    s.window(size=seconds(20), by="k", aggs={"n": "count", "total": ("v", "sum")}, name="per_k").sink("per_k_out")
    return q.build()


def inputs() -> dict:
    rng = np.random.default_rng(31)
    records = [{"ts": seconds(t), "k": int(rng.integers(0, 5)), "v": float(rng.random())} for t in range(200)]
    for pos, (record, _) in BAD.items():
        records[pos] = record
    return {"s": [records[a:a + 50] for a in range(0, 200, 50)]}


PLAN = {"entry": SERVERS[:2], "keep": SERVERS[1:], "per_k": [SERVERS[2], SERVERS[0]],
        "kept": SERVERS[:1], "per_k_out": SERVERS[:1]}


def policy_kw(policy) -> dict:
    """``on_malformed=policy``, or no argument at all for ``None`` (the engine's default)."""
    return {} if policy is None else {"on_malformed": policy}


def reference(policy):
    return run_reference(query(), inputs(), **policy_kw(policy))


def inprocess(policy):
    return run_replicated(query(), inputs(), k=K, seed=31, placement=PLAN, **policy_kw(policy))


def sim(policy):
    from replistream.sim import Simulator

    return Simulator(query(), PLAN, ZeroLatency(SERVERS), **policy_kw(policy)).run(inputs())


ENGINES = {"reference": reference, "inprocess": inprocess, "sim": sim}


def letters(result) -> list[tuple[str, str, str]]:
    """Every dead-lettered record with its where and reason, in a comparable order."""
    return sorted((d.where, d.reason, repr(r)) for d in result.dead_letters for r in d.batch)


@pytest.fixture(scope="module")
def ideal():
    return reference("dead_letter")


def test_the_reference_sets_aside_each_unreadable_record_with_its_reason(ideal):
    assert ideal.complete
    got = letters(ideal)
    assert len(got) == len(BAD) and {w for w, _, _ in got} == {"source 's'"}
    for _, (record, says) in BAD.items():
        assert any(says in reason and repr(record) == rec for _, reason, rec in got), (record, says)
    assert all(reason.startswith("malformed: ") for _, reason, _ in got)
    assert int(ideal.outputs["per_k_out"]["n"].sum()) == 200 - len(BAD)  # every readable record counted


@pytest.mark.parametrize("engine", ["inprocess", "sim"])
def test_every_engine_dead_letters_alike(engine, ideal):
    res = ENGINES[engine]("dead_letter")
    assert res.complete
    for app in ideal.outputs:
        assert_same_output(ideal.outputs[app], res.outputs[app])
    assert letters(res) == letters(ideal)
    assert dead_letter_summary(res.dead_letters) == dead_letter_summary(ideal.dead_letters)


@pytest.mark.parametrize("engine", ["reference", "inprocess", "sim"])
def test_the_default_policy_is_the_dead_letter_on_every_engine(engine, ideal):
    """No ``on_malformed`` given: every engine sets the records aside with the same where and
    reason as the reference under the explicit policy (a deployment's default: the Ray case below)."""
    res = ENGINES[engine](None)
    assert res.complete
    assert letters(res) == letters(ideal) and len(letters(res)) == len(BAD)
    for app in ideal.outputs:
        assert_same_output(ideal.outputs[app], res.outputs[app])


def refusal(engine: str) -> str:
    with pytest.raises(SchemaError) as e:
        ENGINES[engine]("raise")
    return str(e.value)


@pytest.mark.parametrize("engine", ["inprocess", "sim"])
def test_every_engine_raises_the_same_error_under_raise(engine):
    ideal = refusal("reference")
    assert ideal.startswith("source 's': record ")
    assert "on_malformed='dead_letter'" in ideal  # the in-driver engines name the other policy
    assert refusal(engine).split(" (on_malformed=")[0] == ideal.split(" (on_malformed=")[0]


@pytest.mark.slow
def test_a_ray_deployment_dead_letters_as_the_reference_does(ray_session, ideal):
    """The one Ray case: the deployment's default policy gives the reference's dead letters and
    outputs; under ``on_malformed="raise"`` the run ends with the entry point's SchemaError text."""
    from replistream import deploy

    with deploy(query(), servers=SERVERS, k=K, placement=PLAN, network="zero") as dep:  # default: dead_letter
        res = dep.run(inputs(), timeout=120)
    assert res.complete
    for app in ideal.outputs:
        assert_same_output(ideal.outputs[app], res.outputs[app])
    assert letters(res) == letters(ideal)
    assert dead_letter_summary(res.dead_letters) == dead_letter_summary(ideal.dead_letters)
    with deploy(query(), servers=SERVERS, k=K, placement=PLAN, network="zero", on_malformed="raise") as dep:
        with pytest.raises(RunFailed) as e:
            dep.run(inputs(), timeout=120)
    assert e.value.operator == "s"
    assert refusal("reference").split(" (on_malformed=")[0] in str(e.value)
