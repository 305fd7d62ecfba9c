"""The Ray runtime: replicated queries on Ray actors (Hwang §II-B, DESIGN.md decisions 3-6)."""
from .deploy import PLACEMENTS, RAY_SYSTEM_CONFIG, Deployment, DeploymentResult, deploy, init_ray, spread_placement

__all__ = ["Deployment", "DeploymentResult", "deploy", "init_ray", "spread_placement", "PLACEMENTS", "RAY_SYSTEM_CONFIG"]
