"""Revival in the simulator (Hwang §V-C): new replicas are created mid-run, and damping."""
from __future__ import annotations


def _setting():
    from replistream.engines import run_reference
    from replistream.placement import min_cost
    from replistream.sim.experiments import _snapshot, fig1_setting

    st = fig1_setting(n_servers=8, monitored=3, duration_s=300.0, seed=0)
    plan = min_cost(st.problem, 1).plan()
    return st, plan, _snapshot(st, plan), run_reference(st.query, st.inputs)


def test_a_create_decision_starts_the_planned_replica_and_the_output_stays_exact():
    """An application hindered although every input is functioning: §V-C creates a new upstream
    replica (placed by _placer); the simulator starts it under the planned label, and with its
    stream replicas live the run is still exact."""
    from replistream.gc import apply_revival, plan_revival
    from replistream.sim import Simulator
    from replistream.sim.experiments import FIG5_BATCH_S, _check_exact, _placer

    st, plan, snap, ref = _setting()
    app = st.query.sinks[0]
    sim = Simulator(st.query, plan, st.network, sources=st.sources, retain=True, batch_s=FIG5_BATCH_S)
    (e,) = plan_revival(snap, {app: 30.0}, threshold_s=0.5, place=_placer(st, sim))
    assert e.action == "create-replica"
    (new,) = e.new_replicas
    assert new.server not in plan[new.operator]
    assert sim.add_replica(new.operator, new.server) == new.label
    after = apply_revival(snap, e)
    sim.apply_snapshot(after)
    res = sim.run(st.inputs)
    _check_exact(st, res, ref)
    assert any(lk["sender"] == new.label and lk["tuples"] > 0 for lk in res.links)


def test_gc_run_damped_revives_no_more_than_undamped():
    from replistream.gc import collect_garbage
    from replistream.sim.experiments import FIG5_DAMPING, _gc_run

    st, plan, snap, ref = _setting()
    g = collect_garbage(snap.evolve(theta=0))
    a = _gc_run(st, plan, g.snapshot, ref, revival=True, progress=False, damping=None)
    b = _gc_run(st, plan, g.snapshot, ref, revival=True, progress=False, damping=FIG5_DAMPING)
    assert a["exact"] and b["exact"]
    assert b["revivals"] <= a["revivals"]
