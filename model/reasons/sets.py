"""Why a set is refused whatever the node, or over all the nodes (docs/contract.md §3 B1, §4 W1):
its devices (not found, listed twice, none), its classes (not found, not entitled; device
mode, DR1: a class that cannot serve, device-mode and count-mode classes mixed), its
tenant's budget, a free unit of its class; then no node serving its classes, or none
eligible (`NoEligibleNode`: each node's `model.reasons.nodes` problems).

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import DRA_DEVICES_SUFFIX, Code, Reason, plural, resource_label


# --- the set, whatever the node ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceNotFound(Reason):
    """A listed (or ordered) device does not exist in the tenant's namespace."""
    code: ClassVar[Code] = Code.DEVICE_NOT_FOUND
    device: str

    def render(self) -> str:
        return f"device {self.device} not found"


@dataclass(frozen=True, slots=True)
class DeviceListedTwice(Reason):
    """A request (or set) names one device twice."""
    code: ClassVar[Code] = Code.DEVICE_LISTED_TWICE
    device: str

    def render(self) -> str:
        return f"device {self.device} listed twice"


@dataclass(frozen=True, slots=True)
class NoDevices(Reason):
    """A bind request lists no device (`asked` False), or a set asks for none (`asked`)."""
    code: ClassVar[Code] = Code.NO_DEVICES
    asked: bool = False

    def render(self) -> str:
        return "no devices asked for" if self.asked else "request lists no devices"


@dataclass(frozen=True, slots=True)
class ClassNotFound(Reason):
    """A member's (or order's) GPUClass does not exist."""
    code: ClassVar[Code] = Code.CLASS_NOT_FOUND
    class_name: str

    def render(self) -> str:
        return f"class {self.class_name} not found"


@dataclass(frozen=True, slots=True)
class NotEntitled(Reason):
    """The class's namespaceSelector does not match the tenant's namespace."""
    code: ClassVar[Code] = Code.NOT_ENTITLED
    namespace: str
    class_name: str

    def render(self) -> str:
        return f"tenant {self.namespace} not entitled to class {self.class_name}"


@dataclass(frozen=True, slots=True)
class BudgetExhausted(Reason):
    """The tenant's budget of `resource` (devices): `bound` Bound now and `reserved` being
    bound (held by decisions whose writes have not landed yet), `budget` the cap, `adds`
    what the set (or order) would add. `scope`: for a ResourceQuota scoped on PriorityClass
    (P1), the scope as it reads ("PriorityClass In (on-demand)"; the counts are then those
    of the sets it matches); None for a quota on every set."""
    code: ClassVar[Code] = Code.BUDGET_EXHAUSTED
    namespace: str
    resource: str
    bound: int
    budget: int
    adds: int
    reserved: int = 0
    scope: str | None = None

    @property
    def usage(self) -> int:
        """What counts against the budget now: `bound` + `reserved`."""
        return self.bound + self.reserved

    def render(self) -> str:
        scoped = f" of sets of {self.scope}" if self.scope else ""
        if self.budget == 0 and not self.bound and not self.reserved:
            return (f"tenant {self.namespace} has no budget for {resource_label(self.resource)}{scoped} "
                    f"(its ResourceQuota allows 0), request adds {self.adds}")
        being = f" + {self.reserved} being bound" if self.reserved else ""
        # "exhausted" only when nothing is left; else the request is what does not fit
        state = "exhausted" if self.usage >= self.budget else "too small for the request"
        return (f"budget of tenant {self.namespace} for {resource_label(self.resource)}{scoped} {state}: "
                f"{self.bound} bound{being} of {self.budget}, request adds {self.adds}")


@dataclass(frozen=True, slots=True)
class WrongNamespace(Reason):
    """An order of namespace `namespace` in a set of tenant `tenant`."""
    code: ClassVar[Code] = Code.WRONG_NAMESPACE
    namespace: str
    tenant: str

    def render(self) -> str:
        return f"device of namespace {self.namespace} in a set of tenant {self.tenant}"


@dataclass(frozen=True, slots=True)
class NoFreeUnit(Reason):
    """W1 for one device: no placeable node serving the class has a free unit."""
    code: ClassVar[Code] = Code.NO_FREE_UNIT
    class_name: str
    resource: str

    def render(self) -> str:
        one = resource_label(self.resource).removesuffix("devices") + "device" \
            if self.resource.endswith(DRA_DEVICES_SUFFIX) else self.resource
        return f"no schedulable node serving class {self.class_name} has a free {one}"


# --- device mode: the set whatever the node (DR1) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ClassProblem(Reason):
    """The GPUClass cannot serve (its `problem`: both or neither of resourceName and
    deviceClassName, a DeviceClass that does not exist, a selector that does not compile)."""
    code: ClassVar[Code] = Code.CLASS_PROBLEM
    class_name: str
    problem: str

    def render(self) -> str:
        return f"class {self.class_name} cannot serve: {self.problem}"


@dataclass(frozen=True, slots=True)
class MixedModes(Reason):
    """The set mixes device-mode classes (`devices`) and count-mode ones (`counts`): KubeVirt
    refuses a VMI taking GPUs both from ResourceClaims and from device plugins (DR1, W1)."""
    code: ClassVar[Code] = Code.MIXED_MODES
    devices: tuple[str, ...]
    counts: tuple[str, ...]

    def render(self) -> str:
        return ("KubeVirt refuses a VMI mixing DRA GPUs and device-plugin GPUs: device-mode "
                + plural("class", self.devices) + " with count-mode "
                + plural("class", self.counts) + " in one set")


# --- the set over the nodes (B1) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoNodeServes(Reason):
    """No node serves the set's classes (or holds a member)."""
    code: ClassVar[Code] = Code.NO_NODE_SERVES
    classes: tuple[str, ...]

    def render(self) -> str:
        return "no node serves " + ("class " + self.classes[0] if len(self.classes) == 1
                                    else "any of classes " + ", ".join(self.classes))


@dataclass(frozen=True, slots=True)
class NodeProblems:
    """One node and why it is not eligible for the set (B3)."""
    node: str
    problems: tuple[Reason, ...]

    def render(self) -> str:
        return f"{self.node}: {', '.join(p.render() for p in self.problems)}"

    __str__ = render


@dataclass(frozen=True, slots=True)
class NoEligibleNode(Reason):
    """No node is eligible: the `nodes` shown (at most `model.decide.MESSAGE_NODES`) with
    their problems, and `more` nodes not shown."""
    code: ClassVar[Code] = Code.NO_ELIGIBLE_NODE
    nodes: tuple[NodeProblems, ...]
    more: int = 0

    def render(self) -> str:
        lines = [n.render() for n in self.nodes]
        if self.more:
            lines.append(f"and {self.more} more node{'s' if self.more != 1 else ''}")
        return "; ".join(lines)
