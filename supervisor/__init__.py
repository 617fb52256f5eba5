"""The supervision tree: child specs, one-for-one restarts (one-for-all within a group) with intensity limits, and the
routing of node changes and complete bind requests to the binder's actors (docs/contract.md §6).
No placement logic lives here. Imports: `actors`, `model`.
"""

from supervisor.binder import COORDINATOR, PIPELINE, Binder, BinderConfig, ChildKind, node_child_id
from supervisor.tree import (
    ChildSpec,
    Restart,
    Supervisor,
    SupervisorConfig,
    SupervisorEscalation,
    SupervisorStatistics,
)

__all__ = [
    "COORDINATOR",
    "PIPELINE",
    "Binder",
    "BinderConfig",
    "ChildKind",
    "ChildSpec",
    "Restart",
    "Supervisor",
    "SupervisorConfig",
    "SupervisorEscalation",
    "SupervisorStatistics",
    "node_child_id",
]
