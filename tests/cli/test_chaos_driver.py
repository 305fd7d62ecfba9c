"""``replistream chaos --driver-kills``: trials whose driver is killed while its detached deployment
runs (issue #29). The campaign's driver process joins the test session's Ray through RAY_ADDRESS,
as in tests/ray/test_detached.py."""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest

from replistream.chaos import (Trial, _driver_trial_faults, _summarise, _time_span, _write_parquet_inputs,
                               file_sources, is_driver_trial, run_campaign, trial_workload)
from replistream.plan import ENTRY


@pytest.mark.parametrize("kind", ["fig1", "keyed"])
def test_a_driver_trial_schedule_is_seeded_and_within_the_fault_model(kind):
    """One driver kill per trial, at most k - 1 replicas of each node killed, every moment inside the
    replay; the same seed gives the same schedule."""
    query, inputs, _, _ = trial_workload(kind, 5)
    t0, t1 = _time_span(inputs)
    with_coordinator = 0  # trials whose coordinator is lost too
    for k in (1, 2, 3):
        for seed in range(50):
            faults = _driver_trial_faults(np.random.default_rng(seed), query, k, t0, t1)
            again = _driver_trial_faults(np.random.default_rng(seed), query, k, t0, t1)
            assert faults == again
            assert [act for _, _, (_, act) in faults].count("driver") == 1
            assert 1 <= sum(act != "driver" and act[0] == "host" for _, _, (_, act) in faults) <= 2  # issue #40
            killed: dict = {}
            for t, what, (frac, act) in faults:
                assert t0 <= t <= t1 and 0 < frac < 1
                if act != "driver" and act[0] == "host":
                    assert what.startswith("host ") and act[1] in ("crashed", "stopped")
                elif act != "driver" and act[0] == "coordinator":
                    assert what.startswith("coordinator ") and act[1] in ("crashed", "stopped")
                elif act != "driver":
                    assert what.startswith("kill ") and act[0] in (ENTRY, *query.operators)
                    killed.setdefault(act[0], set()).add(act[1])
            assert all(len(v) <= k - 1 for v in killed.values())
            with_coordinator += any(act != "driver" and act[0] == "coordinator" for _, _, (_, act) in faults)
    assert 0.4 <= with_coordinator / 150 <= 0.6, with_coordinator  # about half (issue #40: at least 40% of trials)


@pytest.mark.parametrize("share", [0.3, 0.5, 1.0])
def test_driver_trials_take_their_share_evenly_from_a_seeded_phase(share):
    for seed in range(20):
        picked = [i for i in range(100) if is_driver_trial(seed, i, share)]
        assert picked == [i for i in range(100) if is_driver_trial(seed, i, share)]
        assert abs(len(picked) - 100 * share) <= 1
        assert np.diff([-1, *picked]).max() <= int(np.ceil(1 / share))  # a short campaign has its share too
    assert not any(is_driver_trial(1, i, 0.0) for i in range(10))


def test_the_parquet_input_sets_aside_each_bad_row_with_its_reason():
    """The trial's input written to files holds 1-3 rows with a null event time or field: the
    reference over the files sets each aside once, with its reason (what the deployment must match)."""
    from replistream.engines.reference import run_reference

    query, inputs, bad_source, chunk = trial_workload("keyed", 11)
    with tempfile.TemporaryDirectory() as d:
        dirs, bad = _write_parquet_inputs(inputs, bad_source, d, np.random.default_rng(11))
        assert 1 <= len(bad) <= 3 and sorted(dirs) == sorted(inputs)
        ref = run_reference(query, file_sources(dirs, chunk), on_malformed="dead_letter")
    malformed = {r: n for (where, r), n in ref.dead_letter_summary().items() if "malformed" in r}
    assert sum(malformed.values()) == len(bad)
    assert all("is null" in r for r in malformed)
    assert len(ref.outputs["totals"]) > 1000


def test_the_report_counts_driver_kills_and_fails_on_a_failed_driver_trial():
    good = {"query": "fig1", "seed": 1, "driver_kill": True, "driver_killed_mid_run": True, "outputs": 10,
            "reference_outputs": 10, "lost": 0, "duplicated": 0, "unexpected": 0, "dead_letters_expected": {},
            "dead_letters_received": {}, "complete": True, "error": None, "ok": True,
            "faults": ["1.0 s driver killed (SIGKILL) mid-replay"], "bad_records": [], "seconds": 1.0}
    trial = Trial(0, 1, "fig1", faults=[(1_000_000, "driver killed (SIGKILL) mid-replay", None)],
                  result=dict(good), driver_kill=True)
    report = _summarise([trial], 0, 2, 1.0)
    assert report["verdict"].startswith("PASS") and report["faults"] == {"driver kill": 1, "malformed record": 0}
    assert "1 driver-kill trial (detached deployments), 1 with the driver killed before the end" in report["verdict"]
    bad = Trial(1, 2, "fig1", result={**good, "ok": False, "error": "RuntimeError: the detached deployment did "
                                      "not reach the end of the stream within 180 s"}, driver_kill=True)
    report = _summarise([trial, bad], 0, 2, 1.0)
    assert report["verdict"].startswith("FAIL") and "failed trials: 1" in report["verdict"]
    plain = Trial(2, 3, "keyed", result={**good, "driver_kill": False})
    assert "no driver-kill trial among these 1 (share 0.3)" in _summarise([plain], 0, 2, 1.0, driver_share=0.3)["verdict"]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_campaign_with_a_killed_driver_matches_the_reference():
    """One driver-kill trial: its driver (a process of its own) deploys detached, feeds Parquet files
    paced and is killed with SIGKILL mid-replay; the campaign attaches, kills replicas through the
    host, and the Parquet output equals the reference exactly; the deployment is stopped after."""
    from replistream.engines.ray.host import list_deployments

    report = run_campaign(trials=1, seed=3, k=2, driver_kills=1.0)
    trial = report["trials"][0]
    assert report["matches_reference"], json.dumps(report["trials"], indent=1)[:4000]
    verdict = report["verdict"]
    assert verdict.startswith("PASS: 1 trial,") and "1 driver kill" in verdict and "1 driver kills" not in verdict, verdict
    assert trial["driver_kill"] and trial["driver_killed_mid_run"], trial
    assert trial["outputs"] == trial["reference_outputs"] > 1000
    assert trial["lost"] == trial["duplicated"] == trial["unexpected"] == 0
    assert trial["dead_letters_expected"] == trial["dead_letters_received"]
    assert sum(trial["dead_letters_expected"].values()) == len(trial["bad_records"]) >= 1
    assert report["faults"]["driver kill"] == 1 and report["faults"].get("replica kill", 0) >= 1
    assert not [n for n in list_deployments() if n.startswith(f"chaos-{os.getpid()}-")]
    assert "kept" not in trial  # the trial's folder is removed once it passed
