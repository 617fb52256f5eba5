"""Priority as Kubernetes computes it (docs/contract.md §3c, P1), and the class's own say in
preemption (P2).

A VMI's priority is the value of the PriorityClass its `spec.priorityClassName` names
(KubeVirt copies the name to the launcher Pod), else of the `globalDefault` class, else 0;
its preemption policy likewise (`PreemptLowerPriority` unless the class says `Never`). The
webhook resolves it once, at admission, and records it in `status.bindRequest` (a status
subresource no tenant can write): from then on the binder reads only that record, never the
VMI's spec.

Pure: values and functions only; the PriorityClass informer and the webhook live in `k8s/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PreemptionPolicy(StrEnum):
    """A PriorityClass's `preemptionPolicy` (scheduling.k8s.io/v1): whether a set of this
    priority may make others yield (P1, P2). Kubernetes' default is PreemptLowerPriority."""

    PREEMPT_LOWER = "PreemptLowerPriority"
    NEVER = "Never"


class ClassPreemption(StrEnum):
    """A GPUClass's `spec.preemption`: whether its running sets may be chosen as victims (P2).
    LowerPriority (default): by a set of strictly higher priority; Never: not at all."""

    LOWER_PRIORITY = "LowerPriority"
    NEVER = "Never"


@dataclass(frozen=True, slots=True)
class Priority:
    """A set's priority as recorded at admission (P1): `value` (a PriorityClass value, an
    int32; 0 when no class applies), `policy` and `class_name` (the PriorityClass it came
    from, None when none applied). Ordered by `value` only where the contract compares."""

    value: int = 0
    policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER
    class_name: str | None = None

    @property
    def may_preempt(self) -> bool:
        """True unless the PriorityClass said `preemptionPolicy: Never` (P1, P2)."""
        return self.policy is PreemptionPolicy.PREEMPT_LOWER


DEFAULT_PRIORITY = Priority()
"""No PriorityClass named and no globalDefault: value 0, PreemptLowerPriority (P1)."""
