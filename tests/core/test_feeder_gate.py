"""A change placed at ``T0`` while the feed goes on (``Feeder.gated``, issue #41): chunks up to
``T0`` are sent meanwhile, nothing past it until the change is handed out. No Ray: the feed
thread's wait (``Feeder._wait_gate``) is driven directly."""
from __future__ import annotations

import threading

import pytest

from replistream.engines.ray.feeder import Feeder
from replistream.operators.base import NO_PUNCTUATION
from replistream.schema import END, Punctuation


def _feeding() -> Feeder:
    f = Feeder(None, on_start=lambda ts0: None, on_sentinel=lambda s: None, on_entry_failed=lambda l, w: None)
    f.thread = threading.Thread(target=lambda: None)
    f.sources, f.open_sources, f.feeding, f.max_fed = ["s"], {"s"}, True, 1_500
    return f


def _send_in_thread(f: Feeder, chunk, hi):
    """The feed thread's step: wait at the gate under the lock, then 'send' (set an event)."""
    sent = threading.Event()

    def step():
        with f.lock:
            f._wait_gate("s", chunk, hi)
            sent.set()

    th = threading.Thread(target=step, daemon=True)
    th.start()
    return sent, th


def test_the_feed_goes_on_up_to_the_gate_and_waits_past_it():
    f = _feeding()
    with f.gated(lead_us=500) as t0:
        assert t0 == 2_000 and f.gate == 2_000  # the largest timestamp fed, plus the lead
        below, th1 = _send_in_thread(f, [{"ts": 1_800}, {"ts": 2_000}], 2_000)
        assert below.wait(10), "a chunk at or before T0 must be sent while the change is handed out"
        th1.join(10)
        empty, th2 = _send_in_thread(f, [], NO_PUNCTUATION)  # no tuple in it: not held
        assert empty.wait(10)
        th2.join(10)
        above, th3 = _send_in_thread(f, [{"ts": 1_900}, {"ts": 2_001}], 2_001)
        assert not above.wait(0.3), "a chunk past T0 was sent before the change was handed out"
        # the feed thread waits without the lock: the change's own thread can use the feeder
        assert f.marker_time() == 1_500
    assert above.wait(10), "the gate's end must release the feed"
    th3.join(10)
    assert f.gate is None and len(f.gate_waits) == 1


@pytest.mark.parametrize("chunk,hi", [(None, None), (Punctuation(END), NO_PUNCTUATION),
                                      ([{"x": 1}], None)])
def test_an_end_or_a_chunk_of_unknown_time_waits_for_the_gate(chunk, hi):
    """A source's end, the final punctuation and a chunk whose largest timestamp cannot be told
    may lie past ``T0``: they wait."""
    f = _feeding()
    with f.gated() as t0:
        assert t0 == 1_500
        sent, th = _send_in_thread(f, chunk, hi)
        assert not sent.wait(0.3)
    assert sent.wait(10)
    th.join(10)


def test_no_gate_is_set_when_no_change_can_be_placed():
    f = _feeding()
    f.open_sources.clear()
    with pytest.raises(RuntimeError, match="every source has ended"):
        with f.gated(lead_us=1):
            pass
    assert f.gate is None


def test_a_gate_never_released_fails_the_feed_loudly():
    f = _feeding()
    f.gate = 1_000  # as if a change set it and never ended
    with f.lock, pytest.raises(RuntimeError, match="waited 0.2 s at a change's time 1000"):
        f._wait_gate("s", [{"ts": 2_000}], 2_000, limit=0.2)
