"""Fig. 5's trials stop as soon as they break the latency guarantee (GuaranteeWatch), and only then."""
import json

import numpy as np
import pytest

from replistream.sim.experiments import FIG5_PLAIN_BATCH_S, GuaranteeWatch, fig1_setting


def test_the_p99_watch_never_fails_a_run_whose_p99_holds():
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 400))
        lat = rng.choice([0.1, 0.5, 2.0, 5.0], size=n, p=[0.7, 0.28, 0.015, 0.005])
        w = GuaranteeWatch("p99", 1.0, n_expected=n)
        broke = None
        for part in np.array_split(rng.permutation(lat), int(rng.integers(1, 6))):
            broke = w.add(part) or broke
        p99 = float(np.percentile(lat, 99))
        if broke:
            assert p99 > 1.0, (n, w.over, p99)
        if w.over <= w.allowed - 1:  # far from the bound: the percentile holds
            assert p99 <= 1.0
    # the max watch: one late tuple is enough, none is never
    w = GuaranteeWatch("max", 1.0, n_expected=3)
    assert w.add(np.array([0.2, 0.9])) is None and "1.500 s" in w.add(np.array([1.5]))
    with pytest.raises(ValueError, match="metric must be one of"):
        GuaranteeWatch("p50", 1.0, 10)


def _cut_setting(duration_s: float = 2 * 3600.0):
    """Fig. 1 on 8 servers for ``duration_s`` of input, one path left by garbage collection, and that
    path cut from 1000 s to 1120 s."""
    from replistream.gc import collect_garbage
    from replistream.network import NetworkConditions
    from replistream.placement import place
    from replistream.sim.experiments import _snapshot, fig1_setting

    st = fig1_setting(n_servers=8, monitored=3, duration_s=duration_s, seed=0)
    plan = place(st.problem, 2, "random", seed=1).plan()
    g = collect_garbage(_snapshot(st, plan).evolve(theta=0))  # one path left
    servers = {r.label: r.server for r in g.snapshot.replicas}
    remote = [s for s in g.snapshot.live_streams() if servers[s.src] != servers[s.dst]]
    net = NetworkConditions(st.network)
    net.cut(servers[remote[0].src], servers[remote[0].dst], 1000, 1120)  # on the only path
    st.network = net
    return st, plan, g.snapshot


def test_a_trial_that_breaks_the_guarantee_stops_at_the_breach_and_fails():
    from replistream.engines import run_reference
    from replistream.sim.experiments import _gc_run

    st, plan, snap = _cut_setting()
    ref = run_reference(st.query, st.inputs)
    n = sum(len(ref.outputs[a]) for a in st.query.sinks)
    full = _gc_run(st, plan, snap, ref, revival=False, progress=False)
    assert full["exact"] and full["max_s"] > 60 and full["aborted"] is None
    stopped = _gc_run(st, plan, snap, ref, revival=False, progress=False,
                      watch=lambda: GuaranteeWatch("max", 1.0, n))
    assert not stopped["exact"]
    assert stopped["aborted"].startswith("maximum latency above 1 s")
    t_stop = float(stopped["aborted"].rsplit("t=", 1)[1].split()[0])
    # at the end of the epoch (FIG5_PLAIN_BATCH_S) that holds the breach, hours before the input's end
    assert 1000 < t_stop <= FIG5_PLAIN_BATCH_S < 2 * 3600
    # a guarantee the run keeps: the watch changes nothing
    kept = _gc_run(st, plan, snap, ref, revival=False, progress=False,
                   watch=lambda: GuaranteeWatch("max", 2 * full["max_s"], n))
    assert kept["aborted"] is None and kept["exact"] and kept["max_s"] == full["max_s"]


def _count_gc_runs(monkeypatch) -> list:
    """Count the simulated GC runs Fig. 5 makes from now on (a list that grows by one per run)."""
    from replistream.sim import experiments

    calls, real = [], experiments._gc_run

    def counted(*a, **kw):
        if "_fallback" not in kw:  # a revival run calls itself once more for its look-ahead: not counted
            calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(experiments, "_gc_run", counted)
    return calls


def test_a_row_stopped_halfway_resumes_from_its_finished_runs(tmp_path, monkeypatch):
    """Every simulated run of a Fig. 5 row is kept (TrialCache); --resume takes them instead of
    simulating again, and the row is the same. Without --resume nothing is reused."""
    from replistream.sim import experiments

    first = experiments.fig5(quick=True, kmax=[2], out=str(tmp_path))["rows"][0]
    trials = list((tmp_path / "fig5_rows" / "trials").glob("*.json"))
    assert len(trials) == 1 + len(first["tried"])  # the static run and each trial
    (tmp_path / "fig5_rows" / "k2.json").unlink()  # as if the row had not finished

    calls = _count_gc_runs(monkeypatch)
    again = experiments.fig5(quick=True, kmax=[2], out=str(tmp_path), resume=True)["rows"][0]
    assert calls == [] and all(t["reused"] for t in again["tried"])
    timing = ("wall_s", "cpu_s", "reused")
    strip = lambda row: {k: ([{x: y for x, y in t.items() if x not in timing} for t in v] if k == "tried" else v)  # noqa: E731
                         for k, v in row.items() if k not in timing}
    assert strip(again) == strip(json.loads(json.dumps(first, default=experiments.jsonable)))
    experiments.fig5(quick=True, kmax=[2], out=str(tmp_path))  # no --resume: simulated again
    assert len(calls) == len(first["tried"])


def test_a_row_under_the_maximum_reuses_the_runs_of_a_row_under_p99(tmp_path, monkeypatch):
    """The static run and every run no watch stopped are the same under either metric: a max
    row after a p99 row in the same --out simulates only what the p99 row had not answered, and
    comes out as a max row made from scratch."""
    from replistream.sim import experiments

    timing = ("wall_s", "cpu_s", "reused", "static_wall_s", "static_cpu_s")
    strip = lambda row: {k: ([{x: y for x, y in t.items() if x not in timing} for t in v] if k == "tried" else v)  # noqa: E731
                         for k, v in json.loads(json.dumps(row, default=experiments.jsonable)).items()
                         if k not in timing}
    fresh = experiments.fig5(quick=True, kmax=[2], out=str(tmp_path / "max"), metric="max")["rows"][0]
    p99 = experiments.fig5(quick=True, kmax=[2], out=str(tmp_path / "both"), metric="p99")["rows"][0]
    finished = {(t["mode"], t["theta"]) for t in p99["tried"] if not t["aborted"]}
    calls = _count_gc_runs(monkeypatch)
    again = experiments.fig5(quick=True, kmax=[2], out=str(tmp_path / "both"), metric="max", resume=True)["rows"][0]
    assert again["static_wall_s"] == p99["static_wall_s"]  # the static run was not simulated again
    reused = {(t["mode"], t["theta"]) for t in again["tried"] if t.get("reused")}
    assert finished & {(t["mode"], t["theta"]) for t in again["tried"]} <= reused
    assert len(calls) == sum(not t.get("reused") for t in again["tried"])
    # the same row; a run the p99 watch stopped stops at another time than the max watch would
    verdict = lambda t: (t["mode"], t["theta"], t["exact"] and t["max_s"] <= 1.0)  # noqa: E731
    assert [verdict(t) for t in again["tried"]] == [verdict(t) for t in fresh["tried"]]
    assert {k: v for k, v in strip(again).items() if k != "tried"} == {
        k: v for k, v in strip(fresh).items() if k != "tried"}


def test_a_finer_grid_of_targets_reuses_the_runs_at_the_targets_it_shares(tmp_path, monkeypatch):
    """--thetas extends the grid; a run depends on its own target, not on the grid, so with the
    same --out only the new targets are simulated. Targets that do not decrease are refused."""
    from replistream.sim import experiments

    first = experiments.fig5(quick=True, kmax=[2], out=str(tmp_path))["rows"][0]
    calls = _count_gc_runs(monkeypatch)
    grid = (*experiments.FIG5_THETAS, 0.02, 0.01)
    finer = experiments.fig5(quick=True, kmax=[2], out=str(tmp_path), resume=True, thetas=grid)
    row = finer["rows"][0]
    assert finer["thetas"] == list(grid) and first["gc_theta"] in grid
    old = {(t["mode"], t["theta"]) for t in first["tried"]}
    assert all(t.get("reused") for t in row["tried"] if (t["mode"], t["theta"]) in old)
    assert any(t["theta"] < min(experiments.FIG5_THETAS) for t in row["tried"])  # the grid went further
    # a GC target that leaves the live stream replicas of one already run is that run: reused too
    assert len(calls) == sum(not t.get("reused") for t in row["tried"]) > 0
    with pytest.raises(ValueError, match="decreasing"):
        experiments.fig5(quick=True, kmax=[2], thetas=(0.03, 0.05))


@pytest.mark.slow
def test_a_shorter_silence_detects_a_cut_path_sooner():
    """Revival observes a cut path as silence beyond ``silence_s``: the shorter it is, the sooner
    the discarded stream replicas come back and the less the tuples behind the cut wait."""
    from replistream.engines import run_reference
    from replistream.sim.experiments import _gc_run

    st, plan, snap = _cut_setting(duration_s=1800.0)  # the cut and 680 s after it (2 h: 10 s more here)
    ref = run_reference(st.query, st.inputs)
    slow = _gc_run(st, plan, snap, ref, revival=True, progress=False, silence_s=60.0)
    fast = _gc_run(st, plan, snap, ref, revival=True, progress=False, silence_s=10.0)
    assert slow["exact"] and fast["exact"]
    assert slow["revivals"] > 0 and fast["revivals"] > 0
    assert fast["max_s"] < slow["max_s"] < 120  # the cut lasts 120 s


def test_volatility_scales_the_networks_spikes_and_outages():
    """--volatility X multiplies the latency model's rates of spikes and outages; at 1 the runs'
    parameters are those made before the option (their kept runs stay valid); 0 turns both off."""
    from replistream.sim.experiments import _fig5_params

    base = fig1_setting(n_servers=6, monitored=2, duration_s=60.0, seed=0).network
    double = fig1_setting(n_servers=6, monitored=2, duration_s=60.0, seed=0, volatility=2.0).network
    calm = fig1_setting(n_servers=6, monitored=2, duration_s=60.0, seed=0, volatility=0.0).network
    assert double.spike_rate == 2 * base.spike_rate and double.outage_rate == 2 * base.outage_rate
    assert calm.spike_rate == calm.outage_rate == 0 < base.outage_rate
    assert "volatility" not in _fig5_params(False, 0) and _fig5_params(False, 0, volatility=0.5)["volatility"] == 0.5
    with pytest.raises(ValueError, match="volatility"):
        fig1_setting(n_servers=6, monitored=2, duration_s=60.0, volatility=-1.0)


def test_a_complete_run_with_another_output_stops_fig5_and_is_kept(tmp_path, monkeypatch):
    """An inexact run is a broken guarantee, not a failed target: the row stops with what
    differs, and the run stays in the trials folder (a resume meets it again)."""
    from replistream.sim import experiments

    real, calls = experiments._check_exact, []

    def second_run_differs(st, res, ref=None):
        calls.append(1)
        if len(calls) == 2:  # the static run passes; the first GC run "loses" a tuple
            raise AssertionError("output differs from reference: 1 lost, 0 extra (0 of them duplicates)")
        return real(st, res, ref)

    monkeypatch.setattr(experiments, "_check_exact", second_run_differs)
    with pytest.raises(RuntimeError, match=r"kmax=2 gc theta=.*output other than the reference.*1 lost"):
        experiments.fig5(quick=True, kmax=[2], out=str(tmp_path))
    kept = [json.loads(p.read_text())["result"] for p in (tmp_path / "fig5_rows" / "trials").glob("*.json")]
    assert any(r.get("inexact", "").endswith("1 lost, 0 extra (0 of them duplicates)") for r in kept)
    monkeypatch.setattr(experiments, "_check_exact", real)
    with pytest.raises(RuntimeError, match="output other than the reference"):
        experiments.fig5(quick=True, kmax=[2], out=str(tmp_path), resume=True)
