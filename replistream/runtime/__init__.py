"""The Ray runtime: replicated queries on Ray actors (Hwang §II-B, DESIGN.md decisions 3-6)."""
from .deploy import Deployment, DeploymentResult, deploy, spread_placement, PLACEMENTS

__all__ = ["Deployment", "DeploymentResult", "deploy", "spread_placement", "PLACEMENTS"]
