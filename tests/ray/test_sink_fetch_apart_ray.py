"""An application replica answers the driver's fetch on a thread apart from its data path
(replistream.engines.ray.actors.SinkActor.fetch, concurrency group ``fetch``), holding its lock only
to take the list of batches; the driver joins them (results.joined). Before, a first fetch after
millions of results (``wait()`` after a long ``feed()``) joined them on the data path's thread, and
no result arrived for about a second (bench/rescale.py --op count --keys 4000000: 11,000 results
arrived at once, the oldest 960 ms late). Here the data path's thread is held by a call that waits
(``wait_done`` before any input): the fetch must answer before that call returns. The batches'
way through the driver is what every other Ray test's results take."""
from __future__ import annotations

import pytest
import ray

from replistream import Query, deploy, seconds

pytestmark = pytest.mark.usefixtures("ray_session")

HOLD_S = 15.0  # how long the data path's thread is held (the fetch normally answers in milliseconds)


def test_a_fetch_answers_while_the_applications_data_thread_is_held():
    q = Query("fetch_apart")
    s = q.source("s", {"k": "i8"}, punctuate_every=seconds(1))
    s.filter(lambda b: b["k"] >= 0, name="f").sink("out")
    with deploy(q.build(), servers=2, k=1, progress=False) as dep:
        (app,) = [h for label, h in dep.handles.items() if label.startswith("out")]
        ray.get(app.probe.remote(), timeout=60)  # (started)
        held = app.wait_done.remote(HOLD_S)  # the data path's thread: nothing was fed, so it waits HOLD_S
        fetch = app.fetch.remote(0)
        done, _ = ray.wait([fetch, held], num_returns=1, timeout=HOLD_S * 4)
        assert done == [fetch], "the fetch waited for the call holding the data path's thread"
        parts, arrs, count, punct = ray.get(fetch, timeout=HOLD_S * 4)  # (done already)
        assert parts == [] and arrs == [] and count == 0
        assert ray.get(held, timeout=HOLD_S * 4) is False  # (released before the deployment shuts down)
