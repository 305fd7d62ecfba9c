"""One replica, whatever engine hosts it: the core, its replay log, checkpoints, staged
transfers, dormant copies, and changes at logical times (pure: no Ray, no clock).

* :mod:`.core`: :class:`ReplicaCore` (duplicate filters -> sorters -> logic) and
  :class:`ReplayLog`, the one retained-output log of every engine;
* :mod:`.checkpoint`: :class:`ReplicaCheckpoint`, what hand-over moves;
* :mod:`.transfer`: staged state transfer in bins (Megaphone §3.3):
  :func:`plan_transfer`, :class:`StagedReplica`;
* :mod:`.dormant`: :class:`DormantReplica`, kept fresh by deltas (Del Monte 2017);
* :mod:`.changes`: changes to a running query at logical times (Bartnik et al. 2019).
"""
from .checkpoint import CHECKPOINT_VERSION, ReplicaCheckpoint
from .core import ReplayLog, ReplicaCore
from .dormant import DormantReplica
from .transfer import STRATEGIES, StagedReplica, plan_transfer, splittable

__all__ = ["CHECKPOINT_VERSION", "ReplicaCheckpoint", "ReplayLog", "ReplicaCore", "DormantReplica",
           "STRATEGIES", "StagedReplica", "plan_transfer", "splittable"]
