"""The Ray runtime: replicated queries on Ray actors (Hwang §II-B, docs/design.md, decisions 3-6), with the
coordinator loop of garbage collection and revival (Hwang §V-B, §V-C; :mod:`.manager`)."""
from .deployment import PLACEMENTS, RAY_SYSTEM_CONFIG, Deployment, DeploymentResult, deploy, init_ray, spread_placement
from .control import GCConfig, ReplicaManager

__all__ = ["Deployment", "DeploymentResult", "deploy", "init_ray", "spread_placement", "PLACEMENTS", "RAY_SYSTEM_CONFIG",
           "GCConfig", "ReplicaManager"]
