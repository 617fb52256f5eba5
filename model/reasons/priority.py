"""Why a set's priority cannot be had (docs/contract.md §3c P1): a PriorityClass that does not
exist. Kubernetes' Priority admission plugin refuses such a Pod with 403 Forbidden ("no
PriorityClass with name X was found"); the webhook refuses the VMI the same way (POLICY).

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Code, Reason


@dataclass(frozen=True, slots=True)
class PriorityClassNotFound(Reason):
    """The VMI's (or its VirtualMachine template's) `spec.priorityClassName` names no
    PriorityClass of the cluster (P1)."""
    code: ClassVar[Code] = Code.PRIORITY_CLASS_NOT_FOUND
    name: str

    def render(self) -> str:
        return f"no PriorityClass with name {self.name} was found"
