"""Shared fixtures: one Ray instance per test session (started on first use)."""
from __future__ import annotations

import os

import pytest

# A script that joins the session's Ray (RAY_ADDRESS, as the detached-deployment tests' drivers do)
# starts the cluster's warm pool of actor processes (engines/ray/warm.py): a small one in the suite.
os.environ.setdefault("REPLISTREAM_CLUSTER_POOL", "4")
# Every process of the suite (this one, and every actor: set before Ray starts) records the order it
# takes its locks in (engines/ray/lockorder.py); tests/ray/test_lock_order.py checks the records.
os.environ.setdefault("REPLISTREAM_LOCK_ORDER", "1")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that needs one."""
    import ray

    from replistream.engines.ray import init_ray

    init_ray(num_cpus=2, object_store_memory=512 * 1024 * 1024)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def spark(ray_session):
    """One Spark-on-Ray session (RayDP) shared by every Spark test; started on first use."""
    from replistream.spark import spark_session, stop_spark

    session = spark_session(app_name="replistream-tests")
    yield session
    stop_spark()
