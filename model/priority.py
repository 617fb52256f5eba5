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
from typing import Mapping

from model.reasons.priority import PriorityClassNotFound


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


SYSTEM_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")
"""The PriorityClasses kube-apiserver creates in every cluster (values 2000000000 and
2000001000). They are real objects, so the informer sees them like any other: resolution
needs no special case for them."""


@dataclass(frozen=True, slots=True)
class PriorityClassInfo:
    """A `scheduling.k8s.io/v1` PriorityClass as P1 reads it (`model.parse.parse_priority_class`):
    its `name`, `value` (int32), `global_default` and `preemption_policy`."""

    name: str
    value: int
    global_default: bool = False
    preemption_policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER

    @property
    def priority(self) -> Priority:
        """The priority a set of this class records (P1)."""
        return Priority(self.value, self.preemption_policy, self.name)


def default_class(classes: Mapping[str, PriorityClassInfo]) -> PriorityClassInfo | None:
    """The `globalDefault` PriorityClass, None when there is none. Several (kube-apiserver's
    validation allows only one, but two may race in): the lowest value wins, as in the
    Priority admission plugin's `getDefaultPriorityClass`; equal values: the first by name
    (the plugin takes the lister's first, an arbitrary order; ours is deterministic)."""
    best: PriorityClassInfo | None = None
    for name in sorted(classes):
        pc = classes[name]
        if pc.global_default and (best is None or pc.value < best.value):
            best = pc
    return best


def resolve_priority(name: str | None, classes: Mapping[str, PriorityClassInfo]
                     ) -> Priority | PriorityClassNotFound:
    """P1: a VMI's priority from its `spec.priorityClassName` (`name`; None or "" = not
    set) and the cluster's PriorityClasses by name, as kube-apiserver's Priority admission
    plugin computes a Pod's: a named class gives its value and preemptionPolicy, a name with
    no class is refused (`PriorityClassNotFound`, "no PriorityClass with name X was found",
    403); no name gives the `globalDefault` class's (`default_class`, whose name is then
    recorded as the plugin writes it into the Pod), else `DEFAULT_PRIORITY` (0,
    PreemptLowerPriority, no class). Never raises."""
    if not name:
        found = default_class(classes)
        return DEFAULT_PRIORITY if found is None else found.priority
    found = classes.get(name)
    if found is None:
        return PriorityClassNotFound(name)
    return found.priority


@dataclass(frozen=True, slots=True)
class ScopeRequirement:
    """One `scopeSelector.matchExpressions` entry of a ResourceQuota on
    `scopeName: PriorityClass` (or a `spec.scopes: [PriorityClass]` entry, i.e. Exists):
    `operator` In, NotIn, Exists or DoesNotExist, `values` the class names."""

    operator: str
    values: tuple[str, ...] = ()

    def matches(self, class_name: str | None) -> bool:
        """Whether a set whose recorded PriorityClass is `class_name` (None: none) matches,
        as kube-apiserver's quota evaluator matches a Pod (`podMatchesScopeFunc`: the class
        name as the label set {PriorityClass: name}, empty when the Pod has no class): In
        needs the name among `values`; NotIn matches a set with no class too; Exists needs a
        class; DoesNotExist needs none."""
        op = self.operator
        if op == "In":
            return class_name is not None and class_name in self.values
        if op == "NotIn":
            return class_name is None or class_name not in self.values
        if op == "Exists":
            return class_name is not None
        return class_name is None  # DoesNotExist


@dataclass(frozen=True, slots=True)
class PriorityScope:
    """The PriorityClass part of a ResourceQuota's scope: every requirement must match (the
    quota applies to a set only when all its scope requirements match it, as for Pods)."""

    requirements: tuple[ScopeRequirement, ...]

    def matches(self, class_name: str | None) -> bool:
        """True when every requirement matches `class_name` (see `ScopeRequirement`)."""
        return all(r.matches(class_name) for r in self.requirements)

    def describe(self) -> str:
        """The scope as messages name it, e.g. "PriorityClass In (on-demand)"."""
        parts = []
        for r in self.requirements:
            vals = f" ({', '.join(r.values)})" if r.values else ""
            parts.append(f"PriorityClass {r.operator}{vals}")
        return " and ".join(parts)
