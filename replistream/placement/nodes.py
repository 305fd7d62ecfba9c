"""Servers on Ray nodes: how a placement becomes Ray scheduling (docs/design.md, decision 6).

A :class:`~replistream.network.Server` may name where it runs in ``node``:

* a Ray node id (56 hex digits, optionally written ``node:<id>``): the
  server's replicas are scheduled with hard node affinity
  (``NodeAffinitySchedulingStrategy(soft=False)``);
* ``label:KEY=VALUE``: on a node started with that label
  (``ray start --labels``, ``Cluster.add_node(labels=...)``), via Ray's
  ``label_selector``;
* ``resource:NAME``: on a node that offers the custom resource ``NAME``
  (``ray start --resources``); each replica asks for a tiny share of it;
* nothing (``None``): a logical server; its replicas go wherever Ray puts
  them (one machine, or any node).

Several logical servers may share one Ray node (:func:`servers_on_nodes`).
Nothing here imports Ray at module import.

>>> from replistream.network import Server
>>> sorted(ray_options(Server("x", 0.0, 0.0, node="label:zone=eu")))
['label_selector']
>>> ray_options(Server("y", 0.0, 0.0, node="resource:server_y"))
{'resources': {'server_y': 0.001}}
>>> ray_options(Server("z", 0.0, 0.0))
{}
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from ..network import CITIES, Server, city

__all__ = ["ray_options", "servers_on_nodes", "cluster_servers", "RESOURCE_SHARE", "parse_node"]

#: Share of a custom resource each replica asks for, so any number fit on the node.
RESOURCE_SHARE = 0.001

_NODE_ID = re.compile(r"^[0-9a-fA-F]{56}$")


def parse_node(spec: str | None) -> tuple[str, str | tuple[str, str]] | None:
    """``Server.node`` as ``(kind, value)``: ``("id", hex)``, ``("label", (key, value))``, ``("resource", name)``.

    >>> parse_node("label:replistream.server=boston")
    ('label', ('replistream.server', 'boston'))
    >>> parse_node("rack7")
    Traceback (most recent call last):
    ...
    ValueError: node 'rack7' is neither a Ray node id (56 hex digits, or node:<id>), label:KEY=VALUE, nor resource:NAME
    """
    if spec is None or spec == "":
        return None
    if spec.startswith("label:"):
        key, eq, value = spec[6:].partition("=")
        if not key or not eq:
            raise ValueError(f"node {spec!r}: a label is written label:KEY=VALUE")
        return "label", (key, value)
    if spec.startswith("resource:"):
        if not spec[9:]:
            raise ValueError(f"node {spec!r}: a resource is written resource:NAME")
        return "resource", spec[9:]
    node = spec[5:] if spec.startswith("node:") else spec
    if not _NODE_ID.match(node):
        raise ValueError(f"node {spec!r} is neither a Ray node id (56 hex digits, or node:<id>), label:KEY=VALUE, "
                         f"nor resource:NAME")
    return "id", node.lower()


def ray_options(server: Server) -> dict:
    """Actor options that put a replica on ``server``'s Ray node (empty for a logical server).

    >>> opts = ray_options(Server("x", 0.0, 0.0, node="ab" * 28))
    >>> type(opts["scheduling_strategy"]).__name__, opts["scheduling_strategy"].soft
    ('NodeAffinitySchedulingStrategy', False)
    """
    try:
        parsed = parse_node(getattr(server, "node", None))
    except ValueError as e:
        raise ValueError(f"server {server.name!r}: {e}") from None
    if parsed is None:
        return {}
    kind, value = parsed
    if kind == "label":
        return {"label_selector": {value[0]: value[1]}}
    if kind == "resource":
        return {"resources": {value: RESOURCE_SHARE}}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=value, soft=False)}


def servers_on_nodes(servers: Sequence[Server], nodes: Sequence[str]) -> list[Server]:
    """Pin ``servers`` to ``nodes`` (node ids or ``label:``/``resource:`` specs), round robin.

    With fewer nodes than servers, several logical servers share a node.

    >>> from replistream.network import default_servers
    >>> [s.node for s in servers_on_nodes(default_servers(3), ["label:n=a", "label:n=b"])]
    ['label:n=a', 'label:n=b', 'label:n=a']
    """
    if not nodes:
        raise ValueError("servers_on_nodes needs at least one node")
    for n in nodes:
        parse_node(n)
    return [dataclasses.replace(s, node=nodes[i % len(nodes)]) for i, s in enumerate(servers)]


def cluster_servers(per_node: int = 1, cities: Sequence[Server] | None = None,
                    label: str = "replistream.server") -> list[Server]:
    """Servers for the alive nodes of the Ray cluster this process is connected to.

    A node labelled ``label=<city>`` becomes that city's server, pinned by
    label; every other node (head first, then by node id) gets ``per_node``
    servers from ``cities`` (default: the built-in cities in order, skipping
    those taken by labels), pinned by node id.

    >>> cluster_servers()  # doctest: +SKIP
    [Server(name='boston', lat=42.36, lon=-71.06, capacity=1.0, node='45b5...'), ...]
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError("cluster_servers needs a running Ray (ray.init or replistream.runtime.init_ray)")
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    nodes.sort(key=lambda n: ("node:__internal_head__" not in n.get("Resources", {}), n["NodeID"]))
    out: list[Server] = []
    unlabelled = []
    for n in nodes:
        name = (n.get("Labels") or {}).get(label)
        if name:
            try:
                c = city(name)
                out.append(Server(name, c.lat, c.lon, node=f"label:{label}={name}"))
            except KeyError:
                out.append(Server(name, float("nan"), float("nan"), node=f"label:{label}={name}"))
        else:
            unlabelled.append(n["NodeID"])
    taken = {s.name for s in out}
    pool = [c for c in (cities if cities is not None else CITIES) if c.name not in taken]
    need = per_node * len(unlabelled)
    if need > len(pool):
        raise ValueError(f"{need} servers needed for {len(unlabelled)} nodes x {per_node}, only {len(pool)} cities")
    for i in range(need):
        out.append(dataclasses.replace(pool[i], node=unlabelled[i // per_node]))
    return out
