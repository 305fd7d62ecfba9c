"""``replistream chaos``: seeded fault campaigns checked against the ideal run (#15)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from replistream.chaos import _summarise, Trial, keyed_query, plan_faults, run_campaign
from replistream.plan import ENTRY
from replistream.sources import KillReplica, KillServer, StopReplica
from replistream.workloads import fig1_query


@pytest.mark.parametrize("k", [2, 3])
def test_fault_schedules_stay_within_the_fault_model(k):
    """Over many seeds: at most k - 1 replicas of each node killed (server kills included), never the
    applications' server, never a spared node; the same seed gives the same schedule."""
    q = fig1_query(n_servers=3)
    servers = [f"s{i}" for i in range(k + 2)]
    nodes = [ENTRY, *q.operators]
    plan = {n: [servers[(j + i) % len(servers)] for i in range(k)] for j, n in enumerate(nodes)}
    plan["alerts"] = [servers[0]]
    kinds = set()
    for seed in range(300):
        faults = plan_faults(np.random.default_rng(seed), plan, q, k, 0, 10**7, spare=frozenset({"hot"}))
        again = plan_faults(np.random.default_rng(seed), plan, q, k, 0, 10**7, spare=frozenset({"hot"}))
        assert [(t, what) for t, what, _ in faults] == [(t, what) for t, what, _ in again]
        killed = {n: set() for n in nodes}
        for _, what, ev in faults:
            kinds.add(what.split()[0] + (" server" if isinstance(ev, KillServer) else ""))
            if isinstance(ev, (KillReplica, StopReplica)):
                killed[ev.operator].add(ev.replica)
            elif isinstance(ev, KillServer):
                assert ev.server not in plan["alerts"]
                for n in nodes:
                    killed[n] |= {i for i, s in enumerate(plan[n]) if s == ev.server}
        assert all(len(v) <= k - 1 for v in killed.values()), (seed, faults)
        assert not killed["hot"]
    assert {"kill", "kill server", "delay", "cut", "crash", "stop", "slow", "restore", "coordinator"} <= kinds


def test_the_report_fails_on_any_difference():
    """A checker that cannot fail is worthless: one lost tuple, one missing dead letter, or one
    trial that raised makes the verdict FAIL."""
    good = {"query": "keyed", "seed": 1, "outputs": 10, "reference_outputs": 10, "lost": 0, "duplicated": 0,
            "unexpected": 0, "dead_letters_expected": {"scale: map function raised": 2},
            "dead_letters_received": {"scale: map function raised": 2}, "complete": True, "error": None,
            "ok": True, "faults": [], "bad_records": [], "seconds": 1.0}
    trials = [Trial(0, 1, "keyed", result=dict(good))]
    assert _summarise(trials, 0, 2, 1.0)["verdict"].startswith("PASS")
    for change in ({"lost": 1, "ok": False}, {"dead_letters_received": {}, "ok": False},
                   {"ok": False, "error": "RunFailed: every replica of 'per_key' is lost"}):
        bad = Trial(1, 2, "keyed", result={**good, **change})
        report = _summarise(trials + [bad], 0, 2, 1.0)
        assert not report["matches_reference"] and report["verdict"].startswith("FAIL")
        assert "failed trials: 1" in report["verdict"]


def test_the_keyed_query_fails_on_a_known_tenth_of_its_keys():
    from replistream.chaos import keyed_inputs
    from replistream.testing import run_reference

    r = run_reference(keyed_query(4), keyed_inputs(4))
    letters = r.dead_letter_summary()
    assert letters and all(where == "scale" and "raised ValueError" in reason for where, reason in letters)
    assert 0.03 < sum(letters.values()) / 3000 < 0.2


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_short_campaign_passes_on_both_queries():
    report = run_campaign(trials=2, seed=3, k=2)
    assert report["trials_run"] == 2 and {t["query"] for t in report["trials"]} == {"fig1", "keyed"}
    assert report["matches_reference"], json.dumps(report["trials"], indent=1)[:4000]
    assert report["verdict"].startswith("PASS: 2 trials")
    assert report["lost"] == 0 and report["duplicated"] == 0 and report["outputs"] > 1000
    assert report["dead_letters"]["expected"] == report["dead_letters"]["received"]
    assert sum(report["dead_letters"]["expected"].values()) > 0
    assert report["faults"].get("malformed record", 0) >= 2


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_the_command_line_prints_the_verdict_first(tmp_path, monkeypatch, capsys):
    """The command's own entry (``main``, as tests/cli/test_gc_cli.py runs ``demo``) in this session's
    Ray: a fresh interpreter would start a Ray of its own (5-15 s; that start keeping stdout clean is
    checked by test_cli_examples.py's Ray demo, through the same init_ray)."""
    from replistream.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["chaos", "--trials", "1", "--seed", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    first = out.splitlines()[0]
    assert first.startswith("PASS: 1 trial,") and "0 lost, 0 duplicated" in first
    assert "trial 0 (fig1)" in err


@pytest.mark.parametrize("k", [2, 3])
def test_a_partitioned_operators_partitions_are_groups_of_their_own(k):
    """The partitioned trial's schedule counts kills per partition (each ``k`` replicas of its own):
    at most ``k - 1`` of each partition, none of a spared one (the partition a rescale to fewer
    retires), and kills of both partitions' replicas do occur over the seeds."""
    from replistream.chaos import fault_groups

    q = keyed_query(3)
    servers = [f"s{i}" for i in range(k + 2)]
    groups = [ENTRY, "scale", "per_key.0", "per_key.1"]
    plan = {n: [servers[(j + i) % len(servers)] for i in range(k)] for j, n in enumerate(groups)}
    plan["per_key"] = list(plan["per_key.0"])  # (what dep.plan names the operator itself: its partition 0)
    plan["totals"] = servers[:2]
    assert fault_groups(plan, q) == groups
    hit = set()
    for seed in range(200):
        spare = frozenset({"per_key.1"}) if seed % 2 else frozenset()
        faults = plan_faults(np.random.default_rng(seed), plan, q, k, 0, 10**7, spare=spare, repair=seed % 3 == 0)
        killed = {g: set() for g in groups}
        for _, what, ev in faults:
            assert not (isinstance(ev, (KillReplica, StopReplica)) and ev.operator == "per_key"), what
            if isinstance(ev, (KillReplica, StopReplica)) and ev.operator != "totals":  # (an application's stop)
                killed[ev.operator].add(ev.replica)
            elif isinstance(ev, KillServer):
                for g in groups:
                    killed[g] |= {i for i, s in enumerate(plan[g]) if s == ev.server}
        assert all(len(v) <= k - 1 for v in killed.values()), (seed, faults)
        assert not (spare and killed["per_key.1"]), (seed, faults)
        hit |= {g for g, v in killed.items() if v}
    assert {"per_key.0", "per_key.1"} <= hit


def test_a_rescale_after_the_stream_is_counted_not_failed():
    """A partitioned trial whose rescale came after every source ended (refused, as documented) is
    counted in the verdict, not failed; any other error of the rescale fails it."""
    good = {"query": "partitioned", "seed": 1, "outputs": 10, "reference_outputs": 10, "lost": 0, "duplicated": 0,
            "unexpected": 0, "dead_letters_expected": {}, "dead_letters_received": {}, "complete": True,
            "error": None, "ok": True, "faults": [], "bad_records": [], "seconds": 1.0}
    rescaled = Trial(0, 1, "partitioned", result={**good, "rescaled": {"from": 2, "to": 3}})
    refused = Trial(1, 2, "partitioned", result={**good, "change_refused": "rescale: RuntimeError: every source "
                                                                         "has ended: nothing is left to change"})
    report = _summarise([rescaled, refused], 0, 2, 1.0)
    assert report["verdict"].startswith("PASS")
    assert "1 of 2 partitioned trials rescaled live (1 rescale came after the stream ended: refused)" in report["verdict"]
    failed = Trial(2, 3, "partitioned", result={**good, "ok": False, "error": "rescale: RuntimeError: boom"})
    assert _summarise([rescaled, failed], 0, 2, 1.0)["verdict"].startswith("FAIL")


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_partitioned_trial_rescales_live_through_its_faults():
    """One partitioned trial (k = 2, its window in two partitions, rescaled live to three, a replica
    of the giving partition killed as the rescale begins, and the seeded faults besides): the
    output equals the reference's exactly, and the dead letters too."""
    from replistream.chaos import run_trial
    from replistream.network import default_servers

    trial = Trial(0, 264152590, "partitioned")  # (a fluid 2 -> 3, the giving partition's replica killed in it)
    res = run_trial(trial, 2, [s.name for s in default_servers(4)])
    assert res["ok"], json.dumps(res, indent=1)[:4000]
    assert any(f.split(" ", 2)[2].startswith("rescale per_key 2 -> 3 (fluid)") for f in res["faults"]), res["faults"]
    assert any(f.endswith("per_key.0#0 during the rescale") for f in res["faults"]), res["faults"]
    assert "rescaled" in res or "change_refused" in res
    assert res["lost"] == 0 and res["duplicated"] == 0 and res["outputs"] == res["reference_outputs"] > 1000


def test_a_trial_that_hits_a_bug_fails_with_its_traceback_and_the_campaign_goes_on(monkeypatch):
    """An unexpected error inside a trial (here a ``KeyError`` from the reference run, as the
    campaign's own ``KeyError`` in a partitioned schedule once was) fails that trial with its reason
    and traceback instead of ending the whole campaign; the verdict is FAIL."""
    import replistream.engines.reference as reference
    from replistream.chaos import run_trial

    def broken(*a, **k):
        raise KeyError("per_key")

    monkeypatch.setattr(reference, "run_reference", broken)
    res = run_trial(Trial(0, 1, "partitioned"), 2, ["a", "b", "c", "d"])
    assert res["ok"] is False and res["error"] == "KeyError: 'per_key'"
    assert "in broken" in res["traceback"] and "KeyError" in res["traceback"]
    assert _summarise([Trial(0, 1, "partitioned", result=res)], 0, 2, 1.0)["verdict"].startswith("FAIL")
