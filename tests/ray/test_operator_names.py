"""On Ray (#44 points 5 and 6): an operator is named in ``kill_replica`` by what the user wrote
(``"filter"`` for ``filter_1``), a wrong name is answered with what to write, and ``wait()``
returns a summary: complete, outputs per application, dead letters, faults masked."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query, deploy, seconds
from replistream.errors import QueryError
from replistream.summary import WaitSummary
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.mark.slow  # a Ray deployment, about 10 s
def test_kill_replica_by_the_method_name_and_wait_returns_a_summary():
    q = Query("names")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.filter(lambda b: b["v"] > 0).window(size=seconds(1), by="k", aggs={"n": "count"}).sink("out")
    q = q.build()
    rng = np.random.default_rng(2)
    ts = np.sort(rng.integers(0, seconds(6), 800))
    data = {"s": [{"ts": ts, "k": rng.integers(0, 5, 800), "v": rng.normal(size=800)}]}
    ref = run_reference(q, data)
    with deploy(q, servers=3, k=2) as dep:
        with pytest.raises(QueryError, match=r"no operator 'fliter' \(operators: filter_1, window_2\); "
                                             r"did you mean 'filter_1'\?"):
            dep.kill_replica("fliter", 0)
        dep.kill_replica("filter", 0)  # filter_1#0
        assert any(e.get("event") == "dead" and e.get("actor") == "filter_1#0" for e in dep.events)
        dep.feed(data)
        got = dep.wait(120)
        assert isinstance(got, WaitSummary) and got and got.complete
        assert got.outputs == {"out": len(ref.outputs["out"])}
        assert got.faults_masked == 1 and got.dead_letters == 0
        assert repr(got).startswith(f"WaitSummary(complete; out: {len(ref.outputs['out']):,} tuples; 0 dead letters")
        assert_same_output(ref.outputs["out"], dep.collect().outputs["out"])
