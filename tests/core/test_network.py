"""Servers and the emulated wide-area network (replistream.network)."""
from __future__ import annotations

import math
import os
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replistream.network import (
    CITIES, FIBRE_KM_PER_MS, REGION, GeoLatencyModel, LatencyModel, NetworkConditions, Server,
    TraceLatencyModel, ZeroLatency, city, default_servers, delivery_time, haversine_km, to_csv,
)

NAMES30 = [s.name for s in default_servers(30)]


@pytest.fixture(scope="module")
def geo():
    return GeoLatencyModel(default_servers(30), seed=11)


@pytest.fixture(scope="module")
def static():
    return GeoLatencyModel(default_servers(30), seed=11, static=True)


# -- servers and cities ---------------------------------------------------------

def test_server_fields_and_validation():
    s = Server("boston", 42.36, -71.06, capacity=2.0, node="node-1")
    assert (s.name, s.capacity, s.node) == ("boston", 2.0, "node-1")
    with pytest.raises(Exception):
        s.name = "x"  # frozen
    for bad in (dict(lat=91.0, lon=0.0), dict(lat=0.0, lon=-181.0), dict(lat=0.0, lon=0.0, capacity=0.0)):
        with pytest.raises(ValueError):
            Server("x", **bad)
    with pytest.raises(ValueError):
        Server("", 0.0, 0.0)
    assert not Server("tr", math.nan, math.nan).located and s.located


def test_cities_are_many_unique_real_and_spread():
    assert len(CITIES) >= 100
    names = [c.name for c in CITIES]
    assert len(set(names)) == len(names)
    assert all(n.isidentifier() and n == n.lower() and n.isascii() for n in names)
    assert set(REGION.values()) == {"na", "eu", "as", "sa", "oc", "af"}
    assert all(-90 <= c.lat <= 90 and -180 <= c.lon <= 180 for c in CITIES)
    # spot checks of real coordinates (hemispheres and rough position)
    assert city("sydney").lat < -30 and city("sydney").lon > 150
    assert city("saopaulo").lat < -20 and city("saopaulo").lon < -40
    assert city("tokyo").lon > 139 and 35 < city("tokyo").lat < 36
    assert 51 < city("london").lat < 52 and -1 < city("london").lon < 1
    with pytest.raises(KeyError, match="atlantis"):
        city("atlantis")


def test_default_servers_prefix_is_diverse_and_deterministic():
    first30 = default_servers(30)
    assert first30 == list(CITIES[:30]) == default_servers()
    assert default_servers(10) == first30[:10]
    assert {REGION[s.name] for s in first30} == {"na", "eu", "as", "sa", "oc", "af"}
    assert {REGION[s.name] for s in default_servers(9)} == {"na", "eu", "as", "sa", "oc", "af"}
    a, b = default_servers(20, seed=1), default_servers(20, seed=1)
    assert a == b and len({s.name for s in a}) == 20
    assert a != default_servers(20, seed=2)
    assert len(default_servers(len(CITIES))) == len(CITIES)
    for bad in (-1, len(CITIES) + 1, 2.5):
        with pytest.raises(ValueError):
            default_servers(bad)


def test_haversine_known_distances():
    assert 5200 < haversine_km(42.36, -71.06, 51.51, -0.13) < 5330  # Boston-London ~5,265 km
    assert 16800 < haversine_km(-33.87, 151.21, 51.51, -0.13) < 17200  # Sydney-London ~16,990 km
    assert haversine_km(10.0, 20.0, 10.0, 20.0) == pytest.approx(0.0, abs=1e-9)
    # antipodes: half the circumference
    assert haversine_km(0.0, 0.0, 0.0, 180.0) == pytest.approx(math.pi * 6371.0088)


# -- GeoLatencyModel: base component -----------------------------------------

def test_base_is_symmetric_and_local_is_small(static, geo):
    b = static.base_matrix()
    assert np.array_equal(b, b.T)
    assert np.array_equal(np.diag(b), np.full(30, 0.05))
    m = static.matrix(None, 123.0)
    assert np.array_equal(m, m.T)
    assert np.array_equal(geo.base_matrix(), b)  # the static flag does not change the base
    assert geo.latency_ms("boston", "boston", 5.0) == 0.05


@pytest.mark.parametrize("seed", range(5))
def test_boston_london_one_way_base_is_realistic(seed):
    m = GeoLatencyModel(["boston", "london"], seed=seed, static=True)
    assert 25.0 < m.latency_ms("boston", "london", 0.0) < 80.0


def test_base_respects_light_in_fibre_and_inflation_bounds(static):
    d = static.distance_km
    off = ~np.eye(len(d), dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        infl = (static.base_matrix() - static.overhead_ms) / (d / FIBRE_KM_PER_MS)
    assert np.all(infl[off] >= 1.2 - 1e-9) and np.all(infl[off] <= 2.5 + 1e-9)
    # typical route inflation 1.5-2x
    assert 1.4 < np.median(infl[off]) < 2.0


def test_latency_grows_with_distance_on_average(static):
    d = static.distance_km[np.triu_indices(30, 1)]
    b = static.base_matrix()[np.triu_indices(30, 1)]
    assert np.corrcoef(d, b)[0, 1] > 0.8
    order = np.argsort(d)
    q = len(d) // 4
    assert b[order[-q:]].mean() > 3 * b[order[:q]].mean()


def test_inflation_differs_by_pair_and_seed():
    a = GeoLatencyModel(NAMES30, seed=1, static=True).base_matrix()
    b = GeoLatencyModel(NAMES30, seed=2, static=True).base_matrix()
    assert not np.allclose(a, b)
    assert len(np.unique(np.round(a[np.triu_indices(30, 1)], 9))) > 400


# -- GeoLatencyModel: determinism ---------------------------------------------

def test_same_seed_same_values_any_call_order():
    m1 = GeoLatencyModel(NAMES30, seed=5)
    m2 = GeoLatencyModel(NAMES30, seed=5)
    rng = random.Random(0)
    queries = [(rng.choice(NAMES30), rng.choice(NAMES30), rng.uniform(0, 200_000)) for _ in range(300)]
    forward = [m1.latency_ms(a, b, t) for a, b, t in queries]
    backward = [m2.latency_ms(a, b, t) for a, b, t in reversed(queries)][::-1]
    assert forward == backward
    assert forward == [m1.latency_ms(a, b, t) for a, b, t in queries]  # repeatable


def test_different_seeds_differ():
    m1 = GeoLatencyModel(NAMES30, seed=5)
    m2 = GeoLatencyModel(NAMES30, seed=6)
    v1 = [m1.latency_ms("boston", "tokyo", t) for t in range(50)]
    v2 = [m2.latency_ms("boston", "tokyo", t) for t in range(50)]
    assert v1 != v2


def test_values_do_not_depend_on_which_other_servers_exist():
    big = GeoLatencyModel(NAMES30, seed=9)
    small = GeoLatencyModel(["tokyo", "boston"], seed=9)
    for t in (0.0, 17.5, 9999.0):
        assert big.latency_ms("boston", "tokyo", t) == small.latency_ms("boston", "tokyo", t)


def test_same_values_in_a_fresh_process_with_another_hash_seed():
    code = ("from replistream.network import GeoLatencyModel, default_servers\n"
            "m = GeoLatencyModel(default_servers(30), seed=7)\n"
            "print(repr([m.latency_ms('boston', 'tokyo', t) for t in (0.0, 1.5, 3600.0, 86400.0)]))\n")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    m = GeoLatencyModel(default_servers(30), seed=7)
    assert out.stdout.strip() == repr([m.latency_ms("boston", "tokyo", t) for t in (0.0, 1.5, 3600.0, 86400.0)])


def test_pickle_round_trip_keeps_values(geo):
    g2 = pickle.loads(pickle.dumps(geo))
    for t in (0.0, 1234.5):
        assert np.array_equal(g2.matrix(None, t), geo.matrix(None, t))


@settings(max_examples=60, deadline=None)
@given(i=st.integers(0, 29), j=st.integers(0, 29), t=st.floats(0, 3e6, allow_nan=False))
def test_latency_is_at_least_base_or_inf(geo, i, j, t):
    a, b = NAMES30[i], NAMES30[j]
    v = geo.latency_ms(a, b, t)
    assert v == math.inf or v >= geo.base_ms(a, b)
    assert v == geo.latency_ms(a, b, t)


def test_matrix_matches_pointwise(geo):
    names = NAMES30[:12]
    for t in (0.0, 59.9, 7200.3, 86400.0 * 5 + 11):
        m = geo.matrix(names, t)
        p = np.array([[geo.latency_ms(a, b, t) for b in names] for a in names])
        assert np.array_equal(np.isinf(m), np.isinf(p))
        fin = np.isfinite(p)
        np.testing.assert_allclose(m[fin], p[fin], rtol=1e-12)


def test_matrix_matches_pointwise_with_outages():
    m = GeoLatencyModel(NAMES30[:8], seed=3, outages=1 / 300, outage_duration=(60, 200))
    seen_inf = False
    for t in np.arange(0.0, 3600.0, 97.0):
        mm = m.matrix(None, t)
        p = np.array([[m.latency_ms(a, b, t) for b in m.names] for a in m.names])
        assert np.array_equal(np.isinf(mm), np.isinf(p))
        seen_inf |= bool(np.isinf(p).any())
    assert seen_inf


def test_unknown_server_and_nan_time_are_errors(geo):
    with pytest.raises(KeyError, match="atlantis"):
        geo.latency_ms("boston", "atlantis", 0.0)
    with pytest.raises(KeyError):
        geo.matrix(["boston", "atlantis"], 0.0)
    with pytest.raises(ValueError):
        geo.latency_ms("boston", "london", math.nan)
    with pytest.raises(ValueError):
        GeoLatencyModel([Server("nowhere", math.nan, math.nan)])
    with pytest.raises(ValueError, match="duplicate"):
        GeoLatencyModel(["boston", "boston"])


# -- GeoLatencyModel: time-varying components ------------------------------------

def test_static_is_constant_in_time_and_dynamic_is_not(static, geo):
    assert np.array_equal(static.matrix(None, 0.0), static.matrix(None, 4321.0))
    assert not np.array_equal(geo.matrix(None, 0.0), geo.matrix(None, 4321.0))
    off = GeoLatencyModel(NAMES30, seed=11, jitter=False, congestion=False, spikes=False, outages=False)
    assert np.array_equal(off.matrix(None, 0.0), off.matrix(None, 99999.0))


def test_jitter_is_piecewise_constant_per_step_and_direction_dependent():
    m = GeoLatencyModel(NAMES30, seed=2, congestion=False, spikes=False, outages=False)
    a, b = "boston", "london"
    assert m.latency_ms(a, b, 10.0) == m.latency_ms(a, b, 10.99)
    vals = [m.latency_ms(a, b, float(k)) for k in range(200)]
    assert len(set(vals)) > 150
    base = m.base_ms(a, b)
    jit = np.array(vals) - base
    assert np.all(jit >= 0)
    assert 0.01 * base < jit.mean() < 0.06 * base  # mean 3% of base
    assert [m.latency_ms(b, a, float(k)) for k in range(200)] != vals


def test_congestion_is_diurnal():
    m = GeoLatencyModel(NAMES30, seed=2, jitter=False, spikes=False, outages=False)
    a, b = "boston", "berkeley"
    base = m.base_ms(a, b)
    day = [m.latency_ms(a, b, h * 3600.0) for h in range(24)]
    assert all(base <= v <= base * 1.2 + 1e-9 for v in day)
    assert max(day) - min(day) > 0.1 * base
    assert m.latency_ms(a, b, 5 * 3600.0) == pytest.approx(m.latency_ms(a, b, 5 * 3600.0 + 86400.0))
    # peak near 21:00 local time: Boston is UTC-4.7 by longitude -> ~01:45 UTC
    peak_hour = int(np.argmax(day))
    assert peak_hour in (2, 3, 4, 5)  # between the two endpoints' peaks (~1.7 and ~5.2 UTC)


def test_spikes_are_rare_heavy_tailed_and_last_seconds():
    m = GeoLatencyModel(NAMES30[:6], seed=4, jitter=False, congestion=False, outages=False, spikes=1 / 120)
    a, b = "boston", "tokyo"
    base = m.base_ms(a, b)
    extra = np.array([m.latency_ms(a, b, t) - base for t in np.arange(0, 36000.0, 1.0)])
    spiky = extra > 1e-9
    assert 0.005 < spiky.mean() < 0.2
    assert extra[spiky].min() >= 20.0 - 1e-9  # Pareto scale
    assert extra.max() > 5 * np.median(extra[spiky])  # heavy tail
    assert extra.max() <= m.spike_max_ms
    runs = np.diff(np.flatnonzero(np.diff(np.r_[0, spiky.astype(int), 0])))[::2]
    assert runs.max() <= 11 and runs.mean() > 1.5  # 1-10 s episodes


def test_outages_are_inf_both_ways_and_last_minutes():
    m = GeoLatencyModel(NAMES30[:4], seed=8, outages=1 / 1800)
    a, b = "boston", "london"
    t = next(t for t in np.arange(0.0, 200_000.0, 30.0) if math.isinf(m.latency_ms(a, b, t)))
    start, end = m.outage(a, b, t)
    assert start <= t < end and 60.0 <= end - start <= 1200.0
    assert math.isinf(m.latency_ms(b, a, t))
    assert math.isfinite(m.latency_ms(a, b, end + 1e-6))
    assert math.isfinite(m.latency_ms(a, b, start - 1e-6))
    assert m.outage(a, b, end + 1e-6) is None
    # delivery waits for the link to come back (TCP retransmission)
    d = delivery_time(m, a, b, t)
    assert end <= d <= end + 1e-3 + m.latency_ms(a, b, end + 1e-3) / 1000.0 + 1e-9
    # a link with outages disabled never goes down
    never = GeoLatencyModel(NAMES30[:4], seed=8, outages=False)
    assert math.isfinite(never.latency_ms(a, b, t))


def test_outage_fraction_is_of_the_order_of_one_percent():
    m = GeoLatencyModel(NAMES30, seed=1)
    off = ~np.eye(30, dtype=bool)
    frac = np.mean([np.isinf(m.matrix(None, t)[off]).mean() for t in np.arange(0.0, 3 * 86400.0, 600.0)])
    assert 0.001 < frac < 0.03


def test_knob_values_are_checked():
    with pytest.raises(ValueError):
        GeoLatencyModel(["boston", "london"], jitter=-1.0)
    with pytest.raises(ValueError):
        GeoLatencyModel(["boston", "london"], inflation=(0.5, 2.0))
    with pytest.raises(TypeError):
        GeoLatencyModel(["boston", "london"], seed="x")


# -- traces ------------------------------------------------------------------

def _write(path, text):
    path.write_text(text)
    return path


def test_trace_piecewise_constant_and_reverse_fallback(tmp_path):
    p = _write(tmp_path / "t.csv", "time_s,src,dst,latency_ms\n"
               "0,a,b,10\n10,a,b,\n20,a,b,12.5\n5,b,c,inf\n15,b,c,7\n0,b,a,99\n")
    m = TraceLatencyModel.from_csv(p)
    assert m.names == ["a", "b", "c"]
    assert [m.latency_ms("a", "b", t) for t in (-1, 0, 9.99, 10, 19, 20, 1e9)] == \
        [10.0, 10.0, 10.0, math.inf, math.inf, 12.5, 12.5]
    assert m.latency_ms("b", "a", 50) == 99.0  # own direction wins
    assert m.latency_ms("c", "b", 0) == math.inf  # reverse fallback, before first sample -> first
    assert m.latency_ms("c", "b", 15) == 7.0
    assert m.latency_ms("a", "a", 3) == 0.05
    with pytest.raises(KeyError, match="no samples"):
        m.latency_ms("a", "c", 0)
    assert m.matrix(["a", "b"], 20).tolist() == [[0.05, 12.5], [99.0, 0.05]]


@pytest.mark.parametrize("body, line, what", [
    ("0,a,b,10\n1,a,b\n", 3, "expected 4 fields"),
    ("0,a,b,10\nsoon,a,b,3\n", 3, "time_s"),
    ("0,a,b,fast\n", 2, "latency_ms"),
    ("0,a,b,10\n1,a,b,10\n2,a,b,-4\n", 4, "latency_ms"),
    ("0,,b,10\n", 2, "src and dst"),
    ("nan,a,b,10\n", 2, "finite"),
])
def test_malformed_trace_names_the_line(tmp_path, body, line, what):
    p = _write(tmp_path / "bad.csv", "time_s,src,dst,latency_ms\n" + body)
    with pytest.raises(ValueError, match=f"line {line}: .*{what}"):
        TraceLatencyModel.from_csv(p)


def test_trace_header_is_checked(tmp_path):
    with pytest.raises(ValueError, match="line 1: .*missing"):
        TraceLatencyModel.from_csv(_write(tmp_path / "h.csv", "t,src,dst,latency_ms\n0,a,b,1\n"))
    with pytest.raises(ValueError, match="line 1: empty"):
        TraceLatencyModel.from_csv(_write(tmp_path / "e.csv", ""))
    # columns in another order and extra columns are fine
    m = TraceLatencyModel.from_csv(_write(tmp_path / "o.csv", "src,dst,note,latency_ms,time_s\na,b,x,4,0\n"))
    assert m.latency_ms("a", "b", 0) == 4.0


def test_trace_round_trip_from_geo_model(tmp_path):
    geo = GeoLatencyModel(NAMES30[:6], seed=3, outages=1 / 600, outage_duration=(60, 300))
    times = [float(t) for t in range(0, 3600, 10)]
    rows = to_csv(geo, None, times, tmp_path / "geo.csv")
    assert rows == len(times) * 6 * 5
    tr = TraceLatencyModel.from_csv(tmp_path / "geo.csv")
    assert tr.names == geo.names
    n_inf = 0
    for t in times:
        m = geo.matrix(None, t)
        np.fill_diagonal(m, tr.local_ms)
        assert np.array_equal(tr.matrix(None, t), m)
        n_inf += int(np.isinf(m).sum())
        assert np.array_equal(tr.matrix(None, t + 9.5), tr.matrix(None, t))  # piecewise constant
    assert n_inf > 0  # outages survive the round trip as inf


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.one_of(st.floats(0, 1e5), st.just(math.inf))),
                min_size=1, max_size=20, unique_by=lambda r: r[0]))
def test_trace_round_trip_property(tmp_path_factory, samples):
    src = TraceLatencyModel({("x", "y"): samples})
    path = tmp_path_factory.mktemp("rt") / "t.csv"
    times = sorted(t for t, _ in samples)
    to_csv(src, ["x", "y"], times, path)
    back = TraceLatencyModel.from_csv(path)
    for t in times:
        assert back.latency_ms("x", "y", t) == dict(samples)[t]
        assert back.latency_ms("y", "x", t) == dict(samples)[t]  # written from the reverse fallback


def test_trace_with_explicit_servers():
    servers = default_servers(2)
    m = TraceLatencyModel({("boston", "london"): [(0, 40.0)]}, servers=servers)
    assert m.servers == servers
    with pytest.raises(ValueError, match="not in"):
        TraceLatencyModel({("boston", "tokyo"): [(0, 1.0)]}, servers=servers)


# -- ZeroLatency ---------------------------------------------------------------

def test_zero_latency():
    z = ZeroLatency(["a", "b", "c"])
    assert isinstance(z, LatencyModel)
    assert z.latency_ms("a", "c", 123.0) == 0.0 and z.latency_ms("b", "b", 0.0) == 0.0
    assert np.array_equal(z.matrix(), np.zeros((3, 3)))
    assert ZeroLatency(default_servers(4)).names == NAMES30[:4]
    assert delivery_time(z, "a", "b", 7.25) == 7.25


# -- NetworkConditions ----------------------------------------------------------

@pytest.fixture
def net(static):
    return NetworkConditions(static)


def test_add_delay_both_directions_and_one_direction(net, static):
    base = static.latency_ms("boston", "london", 0)
    net.add_delay("boston", "london", 10, 20, 100.0)
    net.add_delay("boston", "tokyo", 10, 20, 7.0, both_directions=False)
    assert net.latency_ms("boston", "london", 9.99) == base
    assert net.latency_ms("boston", "london", 10) == base + 100.0
    assert net.latency_ms("london", "boston", 19.9) == base + 100.0
    assert net.latency_ms("london", "boston", 20) == base
    bt = static.latency_ms("boston", "tokyo", 0)
    assert net.latency_ms("boston", "tokyo", 15) == bt + 7.0
    assert net.latency_ms("tokyo", "boston", 15) == bt
    net.add_delay("boston", "london", 15, None, 1.0)  # overlapping delays add up
    assert net.latency_ms("boston", "london", 16) == base + 101.0
    assert net.latency_ms("boston", "london", 1e6) == base + 1.0


def test_cut_and_restore_link(net, static):
    net.cut("boston", "london", 5, None)
    net.cut("boston", "london", 100, 110)  # scheduled later: kept by an earlier restore
    assert math.isinf(net.latency_ms("boston", "london", 5))
    assert math.isinf(net.latency_ms("london", "boston", 50))
    assert math.isfinite(net.latency_ms("boston", "tokyo", 50))
    net.restore("london", "boston", at=60)
    assert math.isinf(net.latency_ms("boston", "london", 59.9))
    assert net.latency_ms("boston", "london", 60) == static.latency_ms("boston", "london", 60)
    assert math.isinf(net.latency_ms("boston", "london", 105))
    assert net.latency_ms("boston", "london", 110) == static.latency_ms("boston", "london", 110)


def test_slow_server_and_restore_server(net):
    assert net.slowdown("boston", 0) == 1.0
    net.slow_server("boston", 10, 30, 2.0)
    net.slow_server("boston", 20, None, 4.0)
    assert [net.slowdown("boston", t) for t in (9, 10, 20, 30, 1000)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert net.slowdown("london", 20) == 1.0
    net.slow_server("boston", 25, 26, 1.5)  # overlapping slow-downs: the largest factor wins
    assert net.slowdown("boston", 25.5) == 4.0
    net.cut("boston", "tokyo", 0, None)
    net.cut("london", "tokyo", 0, None)
    net.restore(server="boston", at=500)
    assert net.slowdown("boston", 499) == 4.0 and net.slowdown("boston", 500) == 1.0
    assert math.isfinite(net.latency_ms("tokyo", "boston", 500))  # links touching boston restored
    assert math.isinf(net.latency_ms("tokyo", "london", 500))  # other links untouched
    net.restore(at=600)
    assert math.isfinite(net.latency_ms("tokyo", "london", 600))


def test_conditions_matrix_applies_overrides(net, static):
    net.add_delay("boston", "london", 0, 10, 5.0, both_directions=False)
    net.cut("tokyo", "boston", 0, 10)
    m = net.matrix(["boston", "london", "tokyo"], 1.0)
    b = static.matrix(["boston", "london", "tokyo"], 1.0)
    assert m[0, 1] == b[0, 1] + 5.0 and m[1, 0] == b[1, 0]
    assert math.isinf(m[0, 2]) and math.isinf(m[2, 0])
    assert np.array_equal(net.matrix(["boston", "london", "tokyo"], 10.0), b)
    assert net.names == static.names


def test_conditions_argument_checks(net):
    with pytest.raises(ValueError):
        net.slow_server("boston", 0, 10, 0.5)
    with pytest.raises(ValueError):
        net.add_delay("boston", "london", 10, 5, 1.0)
    with pytest.raises(ValueError):
        net.add_delay("boston", "london", 0, 5, -1.0)
    with pytest.raises(ValueError):
        net.cut("boston", "boston", 0, 5)
    with pytest.raises(KeyError):
        net.cut("boston", "atlantis", 0, 5)
    with pytest.raises(ValueError):
        net.restore("boston", at=1)
    with pytest.raises(TypeError):
        NetworkConditions("not a model")


def test_conditions_pickle(net):
    net.add_delay("boston", "london", 1, 2, 3.0)
    net.slow_server("tokyo", 0, 5, 2.5)
    n2 = pickle.loads(pickle.dumps(net))
    assert n2.overrides() == net.overrides()
    assert n2.latency_ms("boston", "london", 1.5) == net.latency_ms("boston", "london", 1.5)
    assert n2.slowdown("tokyo", 1) == 2.5


# -- delivery_time ----------------------------------------------------------------

def test_delivery_time_normal_cut_and_horizon(net, static):
    lat = static.latency_ms("boston", "london", 0)
    assert delivery_time(net, "boston", "london", 3.0) == pytest.approx(3.0 + lat / 1000)
    net.cut("boston", "london", 10, 25.4)
    d = delivery_time(net, "boston", "london", 12.0)
    assert 25.4 + lat / 1000 <= d <= 25.4 + 1e-3 + lat / 1000
    assert delivery_time(net, "boston", "london", 25.4) == pytest.approx(25.4 + lat / 1000)
    net.cut("boston", "london", 1000, 1000 + 7200)
    assert delivery_time(net, "boston", "london", 1000) == math.inf
    assert delivery_time(net, "boston", "london", 1000, horizon=8000) == pytest.approx(8200 + lat / 1000, abs=1e-3)


@settings(max_examples=40, deadline=None)
@given(t=st.floats(0, 1e5), cut_start=st.floats(0, 1e5), cut_len=st.floats(0.5, 600))
def test_delivery_time_is_never_before_send_or_inside_a_cut(t, cut_start, cut_len):
    net = NetworkConditions(ZeroLatency(["a", "b"]))
    net.add_delay("a", "b", 0, None, 20.0)
    net.cut("a", "b", cut_start, cut_start + cut_len)
    d = delivery_time(net, "a", "b", t)
    assert d >= t + 0.02 - 1e-9
    if cut_start <= t < cut_start + cut_len:
        assert d >= cut_start + cut_len + 0.02 - 1e-9
        assert d <= cut_start + cut_len + 0.02 + 1e-3
    else:
        assert d == pytest.approx(t + 0.02)


def test_conditions_pickle_a_copy_taken_under_their_lock():
    """Faults are added to the conditions from one thread (a cut, a delay, a slow-down) while another
    pickles them or reads their matrix (a replica started or told the network, a placement): the
    state pickled is a copy taken under the conditions' lock, so a later change does not reach it,
    and the copy pickles without the lock (a new one is made when it is read back)."""
    from replistream.network.conditions import NetworkConditions
    from replistream.network.latency import ZeroLatency

    names = [f"s{i}" for i in range(6)]
    net = NetworkConditions(ZeroLatency(names))
    net.cut("s0", "s1", 0, None)
    state = net.__getstate__()
    net.cut("s2", "s3", 0, None)
    net.restore("s0", "s1", at=5.0)
    assert set(state["_links"]) == {("s0", "s1"), ("s1", "s0")} and "_lock" not in state
    assert state["_links"][("s0", "s1")][0][2] == math.inf  # (the restore changed the live one only)
    back = pickle.loads(pickle.dumps(net))
    assert back.overrides() == net.overrides() and back.latency_ms("s2", "s3", 1.0) == math.inf
    back.cut("s4", "s5", 0, 1)  # its lock is its own
    assert back.matrix(["s4", "s5"], 0.5)[0, 1] == math.inf and len(net.overrides()) == 4
