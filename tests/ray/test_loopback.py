"""A local Ray started by replistream listens on the loopback interface only (#15, docs/reliability.md):
during a deployment, every listening TCP socket of the driver and of Ray's processes (GCS, raylet,
runtime-env agent, every actor) is bound to 127.0.0.0/8 (or its IPv4-mapped IPv6 form, or ::1).
Read from /proc (Linux), so it needs no tool."""
from __future__ import annotations

import ipaddress
import os
import sys

import pytest

from replistream import Query, deploy

pytestmark = [pytest.mark.usefixtures("ray_session"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


def _ray_pids() -> set[int]:
    pids = {os.getpid()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(word in cmd for word in ("gcs_server", "raylet", "ray::", "default_worker.py", "runtime_env",
                                        "dashboard/agent", "log_monitor", "monitor.py")):
            pids.add(int(entry))
    return pids


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:
        pass
    return out


def _listeners() -> list[tuple[str, str]]:
    """(address, inode) of every listening TCP socket on the machine."""
    out = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state != "0A":  # LISTEN
                continue
            hexaddr = local.split(":")[0]
            raw = bytes.fromhex(hexaddr)
            if width == 8:
                addr = ipaddress.IPv4Address(raw[::-1])
            else:  # four little-endian 32-bit words
                addr = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            out.append((str(addr), inode))
    return out


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_a_local_deployment_listens_on_loopback_only():
    q = Query()
    q.source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0, name="f").sink("out")
    with deploy(q.build(), servers=3, k=2) as dep:
        assert dep.run({"s": [{"ts": 1, "x": 1}]}, timeout=120).complete
        inodes = {i for pid in _ray_pids() for i in _socket_inodes(pid)}
        ours = [(addr, inode) for addr, inode in _listeners() if inode in inodes]
    assert len(ours) >= 5, f"expected the GCS, the raylet and the actors among the listeners, found {ours}"
    exposed = [addr for addr, _ in ours if not _loopback(addr)]
    assert not exposed, f"listeners outside 127.0.0.0/8: {exposed}"


@pytest.mark.slow
def test_ray_messages_stay_off_stdout_and_routine_ones_are_dropped(capsys):
    """The raylet's messages to the driver (printed by Ray on stdout) go to stderr, the routine
    "worker processes have been started" warning not at all (#17): stdout is the verdict's."""
    import ray._private.worker as worker

    from replistream.engines.ray.deployment import quiet_ray_messages

    quiet_ray_messages()  # idempotent: the session's init_ray installed it already
    assert worker.print_to_stdstream.replistream_quiet
    worker.print_to_stdstream({"lines": ["WARNING: 12 PYTHON worker processes have been started on node: x"],
                               "pid": "raylet", "is_err": False}, ignore_prefix=False)
    worker.print_to_stdstream({"lines": ["A worker died or was killed while executing a task"],
                               "pid": "raylet", "is_err": False}, ignore_prefix=False)
    out, err = capsys.readouterr()
    assert "PYTHON worker processes" not in out + err
    assert out == "" and "A worker died or was killed" in err
