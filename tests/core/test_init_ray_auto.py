"""``address="auto"`` (or ``RAY_ADDRESS=auto``): the cluster ``ray start`` recorded on this machine,
checked and joined on the loopback interface (engines/ray/deployment.py). Before, Ray turned the
recorded 127.0.0.1 into the machine's own address, where ``replistream up``'s cluster does not
listen, and ``deploy()`` waited for its GCS without end (seen: ten minutes, no output)."""
from __future__ import annotations

import socket

import pytest
import ray
from ray._private import services

from replistream.engines.ray import deployment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def never(**kwargs):
        raise AssertionError(f"ray.init was called: {kwargs}")

    monkeypatch.setattr(ray, "init", never)


def test_auto_with_no_cluster_recorded_says_so_in_one_line(monkeypatch, no_ray):
    def none_found(addr, temp_dir):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(services, "get_ray_address_from_environment", none_found)
    with pytest.raises(ConnectionError, match=r"no Ray cluster runs on this machine.*replistream up") as e:
        deployment.init_ray("auto")
    assert "\n" not in str(e.value)


def test_auto_is_the_recorded_address_checked_before_ray_starts_waiting(monkeypatch, no_ray):
    port = free_port()  # nothing listens there
    monkeypatch.setattr(services, "get_ray_address_from_environment", lambda addr, temp_dir: f"127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        deployment.init_ray("auto")
