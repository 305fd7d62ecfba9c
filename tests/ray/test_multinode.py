"""Replication transparency on a multi-node Ray cluster, with a node removed mid-run.

The cluster needs its own Ray instance, so the check runs in a subprocess
(tests/ray/scripts/multinode_checks.py, through the ``multinode_results`` fixture,
which also runs tests/ray/test_placement_ray.py's check) and the session's shared Ray is untouched."""
import pytest


@pytest.mark.slow
def test_multinode_cluster_node_removed_mid_run(multinode_results):
    results, code, stderr = multinode_results
    assert "node_removed" in results, f"no result; stderr:\n{stderr[-3000:]}"
    result = results["node_removed"]
    assert result["misplaced_actors"] == {}, "actors must run on their server's Ray node"
    assert result["alive_nodes_after"] == result["nodes"] - 1
    assert [k["actor"] for k in result["killed"]], "the removed node hosted replicas"
    assert result["lost"] == 0 and result["extra"] == 0
    assert result["matches_reference"] and result["complete"]
    assert code == 0, stderr[-3000:]


@pytest.mark.slow
def test_multinode_partitions_run_on_distinct_nodes(multinode_results):
    """Issue #41: a partitioned operator's partitions spread over the cluster's nodes."""
    results, code, stderr = multinode_results
    assert "partitions_on_nodes" in results, f"no result; stderr:\n{stderr[-3000:]}"
    result = results["partitions_on_nodes"]
    assert result["partitions"] == 4 and result["distinct_nodes"] == 4, result["partition_nodes"]
    assert result["matches_reference"] and result["complete"]
