"""Month-long traces: 100+ real cities, time-varying, seedable, and replayable through the CSV loader."""
import numpy as np
import pytest

from replistream.sim import Simulator
from replistream.sim.traces import MONTH_S, load_trace, month_model, trace_stats, write_trace
from replistream.workloads import fig1_inputs, fig1_query


@pytest.mark.slow
def test_month_model_at_100_servers_varies_over_a_month():
    m = month_model(100, seed=4)
    assert len(m.names) == 100
    a, b = "boston", "tokyo"
    series = np.array([m.latency_ms(a, b, t) for t in np.arange(0, MONTH_S, 3600.0)])
    finite = series[np.isfinite(series)]
    assert finite.min() >= m.base_ms(a, b)
    assert finite.max() > finite.min() * 1.05  # congestion and jitter move it
    s = trace_stats(m, duration_s=MONTH_S, step_s=3600, pairs=400, seed=1)
    assert 0.001 < s["outage_fraction"] < 0.05  # minutes-long outages happen, rarely
    assert s["latency_ms"]["max"] > 5 * s["latency_ms"][99]  # heavy-tailed spikes


def test_seeds_differ_and_repeat():
    t = 12345.0
    assert month_model(30, seed=1).matrix(None, t).tolist() == month_model(30, seed=1).matrix(None, t).tolist()
    assert month_model(30, seed=1).matrix(None, t).tolist() != month_model(30, seed=2).matrix(None, t).tolist()


def test_csv_trace_replays_exactly_in_the_simulator(tmp_path):
    """A trace written from a static model and loaded with the runtime's loader gives the same run."""
    q = fig1_query(2, window_s=10)
    data = fig1_inputs(2, duration_s=200, period_s=10, seed=2)
    model = month_model(4, seed=3, static=True)
    path = tmp_path / "trace.csv"
    rows = write_trace(model, path, duration_s=300, step_s=100)
    assert rows == 3 * 4 * 3
    trace = load_trace(path)
    names = model.names
    plan = {n: names[:2] for n in ["entry", *q.operators]} | {"alerts": [names[3]]}
    a = Simulator(q, plan, model).run(data)
    b = Simulator(q, plan, trace).run(data)
    assert np.allclose(a.arrivals["alerts"], b.arrivals["alerts"], rtol=0, atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_servers must be in 1..119"):
        month_model(0)
    with pytest.raises(ValueError, match="step_s and duration_s must be > 0"):
        write_trace(month_model(2), "/tmp/never.csv", step_s=0)
