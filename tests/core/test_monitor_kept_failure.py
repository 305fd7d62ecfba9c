"""A run's failure, once kept (``dep.failure``: found by a detached deployment's monitor, or by a
host that could not finish a rescale it resumed), is raised by every later wait, even when the
coordinator that was told it no longer says it (a replaced coordinator, a report that did not
arrive). Plain objects stand in for the control plane: no Ray."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from replistream.engines.ray.monitor import Monitor
from replistream.errors import RunFailed


def plane(failure):
    """A control plane whose coordinator reports nothing, with no replica lost and the feed fine."""
    p = SimpleNamespace(failure=failure, shut_down=True, feeder=SimpleNamespace(error=None),
                        coord=SimpleNamespace(ask_coordinator=lambda what, timeout: [], node_down=lambda what: None),
                        query=SimpleNamespace(operators=[], sinks=[]),
                        topology=SimpleNamespace(replicas=lambda node=None: []),
                        output=SimpleNamespace(collect=lambda: None, reached=lambda: None), events=[])
    p.monitor = Monitor(p)
    p.monitor.start_monitor = lambda: None  # (no thread)
    return p


def test_a_kept_failure_is_raised_by_every_later_check():
    p = plane("RunFailed: the rescale of 'agg' from 1 to 2 partitions could not be finished")
    for _ in range(2):
        with pytest.raises(RunFailed, match="the run failed earlier: RunFailed: the rescale of 'agg'"):
            p.monitor.check_failures()


def test_no_failure_kept_raises_nothing():
    plane(None).monitor.check_failures()
