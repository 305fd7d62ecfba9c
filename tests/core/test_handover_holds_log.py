"""A new replica's output links are connected one at a time (engines/ray/handover.py, step 4 of
_apply_revival): its log (the peer's retained output it adopted) must stay whole until the last
one is connected, or the first receiver's acknowledgements trim it past what a later receiver has,
that receiver's replay starts too late, and its punctuation passes the receiver's duplicate filter
ahead of tuples still coming from slower senders, which the filter then drops as copies. Found by
a chaos trial (docs/reliability.md, "A silent loss"). Here with the Fig. 1 topology and stand-in
handles that log every call: the new replica's log is held before its first output link and
released after its last."""
from __future__ import annotations

import importlib.util
import pathlib
from types import SimpleNamespace

import replistream.engines.ray.handover as handover_mod
from replistream.engines.ray.channels import NO_ACK
from replistream.engines.ray.handover import HandOver

_spec = importlib.util.spec_from_file_location(
    "repairs_cut_short", pathlib.Path(__file__).with_name("test_repairs_cut_short.py"))
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
fig1_topology = _mod.fig1_topology


class _Recorder:
    """A stand-in actor handle: every ``handle.method.remote(*args)`` is logged and returns its args."""

    def __init__(self, label: str, log: list):
        self.label, self.log = label, log

    def __getattr__(self, method):
        def remote(*args):
            self.log.append((self.label, method, args))
            return 0 if method in ("add_channel", "connect") else True
        return SimpleNamespace(remote=remote)


def _revive(monkeypatch):
    q, topo = fig1_topology(["a", "b"])
    log: list = []
    for r in topo.replicas():
        topo.attach(r.label, _Recorder(r.label, log))
    topo.mark_failed("pings#1")
    mgr = SimpleNamespace(topology=topo, connect_marks={}, dep=SimpleNamespace(query=q, repairer=None))
    ho = HandOver(mgr)
    monkeypatch.setattr(handover_mod.ray, "get", lambda ref, timeout=None: ref)

    def start(rep, ins, replay=True):
        h = _Recorder(rep.label, log)
        topo.attach(rep.label, h)
        for s in ins:
            topo.put_stream(handover_mod.replace(s, live=True), 0)
        return h
    monkeypatch.setattr(ho, "_start", start)
    monkeypatch.setattr(ho, "_install", lambda label, handle, pending, how: {})
    monkeypatch.setattr(ho, "_apply_discard", lambda streams, replicas: None)
    e = ho._replacement("pings#1", "b", False, "request", "test")
    ho._apply_revival(e)
    new = e.new_replicas[0].label
    return new, [(who, what, args) for who, what, args in log if who == new]


def test_the_new_replicas_log_is_held_until_its_last_output_link_is_connected(monkeypatch):
    new, calls = _revive(monkeypatch)
    what = [m for _, m, _ in calls]
    connects = [i for i, m in enumerate(what) if m == "connect"]
    assert len(connects) == 2, calls  # to correlate#0 and correlate#1
    held = [i for i, (_, m, a) in enumerate(calls) if m == "hold_retention" and a == (HandOver.CONNECTING, NO_ACK)]
    released = [i for i, (_, m, a) in enumerate(calls) if m == "raise_holds" and a == ({HandOver.CONNECTING: None},)]
    assert held and held[0] < connects[0], calls
    assert released and released[0] > connects[-1], calls
