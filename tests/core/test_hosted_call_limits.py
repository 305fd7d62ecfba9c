"""A detached deployment's client waits for a forwarded call as long as the call may itself take
(its ``timeout``, by keyword, by position or by default) plus ``Hosted.call_timeout_s``: with only a
keyword ``timeout`` counted, ``dep.rescale(op, 2)`` (300 s by default) and ``dep.run(inputs, None,
900)`` gave up after 120 s while the host went on. No Ray is started: the host is never asked."""
from __future__ import annotations

import pytest

from replistream.engines.ray.client import Hosted


@pytest.mark.parametrize("method, args, kwargs, own", [
    ("rescale", ("agg", 2), {}, 300.0),                       # the default
    ("rescale", ("agg", 2), {"timeout": 30}, 30.0),           # by keyword
    ("rescale", ("agg", 2, "fluid", None, 1.0, 45.0), {}, 45.0),  # by position
    ("run", ({}, None, 900.0), {}, 900.0),                    # how Deployment.run forwards it
    ("wait", (), {"timeout": 7}, 7.0),
    ("partitions", ("agg",), {}, 0.0),                        # no timeout of its own
    ("rescale", ("agg", 2), {"timeout": float("inf")}, 0.0),  # not a bound
])
def test_a_forwarded_call_waits_as_long_as_the_call_may_take(monkeypatch, method, args, kwargs, own):
    limits = []
    client = Hosted(host=None, name="demo")
    monkeypatch.setattr(client, "_ask", lambda what, send, limit: limits.append((what, limit)))
    client.call(method, args, kwargs)
    assert limits == [(method, Hosted.call_timeout_s + own)]


@pytest.mark.parametrize("method", ["control_loop", "quiet"])
def test_a_call_whose_answer_stays_in_the_host_is_refused_in_one_line_before_anything_is_sent(monkeypatch, method):
    sent = []
    client = Hosted(host=None, name="demo")
    monkeypatch.setattr(client, "_ask", lambda what, send, limit: sent.append(what))
    with pytest.raises(TypeError, match=rf"^{method}\(\) cannot be called on detached deployment 'demo' from a "
                                        r"client: [^\n]+$"):
        client.call(method, (), {})
    assert sent == []
