"""Where a runtime change can be placed (``Feeder.marker_time``), in each state of a feed: no Ray."""
from __future__ import annotations

import threading

import pytest

from replistream.engines.ray.feeder import Feeder


def _feeder() -> Feeder:
    return Feeder(None, on_start=lambda ts0: None, on_sentinel=lambda s: None, on_entry_failed=lambda l, w: None)


def test_a_change_is_refused_with_what_the_feed_is_doing():
    """Before ``feed()``, before the first chunk, while it runs, after its last chunk was sent but
    before every entry point took it (the window a chaos trial's rescale met: the refusal then
    said to call feed() first), and after the end: each refusal says why, and a running feed
    places the change after the largest timestamp it sent."""
    f = _feeder()
    with pytest.raises(RuntimeError, match="call feed\\(\\) first"):
        f.marker_time()
    f.thread = threading.Thread(target=lambda: None)  # feed() called: its thread reads the first chunks
    with pytest.raises(RuntimeError, match="sends nothing yet"):
        f.marker_time()
    f.sources, f.open_sources, f.feeding, f.max_fed = ["s", "t"], {"s", "t"}, True, 1_500
    assert f.marker_time() == 1_500
    f.open_sources.discard("s")
    assert f.marker_time() == 1_500  # one source still open
    f.open_sources.discard("t")
    f.feeding = False  # every chunk sent; the acknowledgements not all in yet (fed_all not set)
    with pytest.raises(RuntimeError, match="every source has ended: nothing is left to change"):
        f.marker_time()
    f.fed_all.set()
    with pytest.raises(RuntimeError, match="every source has ended: nothing is left to change"):
        f.marker_time()
    f.error = ValueError("bad chunk")
    with pytest.raises(RuntimeError, match="the feed failed \\(ValueError: bad chunk\\)"):
        f.marker_time()
