"""Why a set refused for room gets no preemption plan (docs/contract.md §3c P2, P3), and the
words of a plan's Events and VM conditions (`Preempts`, `StoppedAs`, `PreemptedFor`,
`WaitingForVictims`: no code, not reasons to refuse). Built by
`model.preemption.plan_preemption`; a `NoPlan` carries one of these.

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Code, Reason


def _priority(value: int, class_name: str | None) -> str:
    """"priority 1000" or "priority 1000 (on-demand)" when a PriorityClass gave it."""
    return f"priority {value}" + (f" ({class_name})" if class_name else "")


@dataclass(frozen=True, slots=True)
class PreemptorNever(Reason):
    """P1/P2: the set's PriorityClass says `preemptionPolicy: Never`: it waits, it never
    makes another set yield."""
    code: ClassVar[Code] = Code.PREEMPTOR_NEVER
    priority: int
    class_name: str | None = None

    def render(self) -> str:
        return (f"the set's {_priority(self.priority, self.class_name)} has preemptionPolicy "
                "Never: it waits and preempts no one")


@dataclass(frozen=True, slots=True)
class FitsWithoutPreemption(Reason):
    """The set fits now, on `node`, without stopping anyone: no plan is needed."""
    code: ClassVar[Code] = Code.FITS_WITHOUT_PREEMPTION
    node: str

    def render(self) -> str:
        return f"the set fits on {self.node} without preemption"


@dataclass(frozen=True, slots=True)
class NotRefusedForRoom(Reason):
    """The set is refused for a reason room does not cure (`refusal`: the code of its first
    reason, e.g. budget_exhausted, not_entitled, no_node_serves): stopping others would not
    let it start (P5 "refused for room")."""
    code: ClassVar[Code] = Code.NOT_REFUSED_FOR_ROOM
    refusal: Code

    def render(self) -> str:
        return f"the set is refused for {self.refusal.value}, not for room: preemption would not help"


@dataclass(frozen=True, slots=True)
class NoEligibleVictim(Reason):
    """P2: no running set may yield to the set's `priority`: `lower` running sets have a
    strictly lower priority, of which `too_young` have run less than `min_runtime` (text,
    e.g. "10m0s") and `protected` are of a class with `spec.preemption: Never`."""
    code: ClassVar[Code] = Code.NO_ELIGIBLE_VICTIM
    priority: int
    lower: int
    too_young: int = 0
    protected: int = 0
    min_runtime: str = ""

    def render(self) -> str:
        if not self.lower:
            return f"no running set has a priority below {self.priority}"
        why = []
        if self.too_young:
            why.append(f"{self.too_young} ran less than {self.min_runtime}")
        if self.protected:
            why.append(f"{self.protected} of a class with preemption Never")
        return (f"no running set may yield to priority {self.priority}: {self.lower} of lower "
                f"priority" + (f" ({', '.join(why)})" if why else ""))


@dataclass(frozen=True, slots=True)
class NothingFreesEnough(Reason):
    """P3: stopping every one of the `victims` sets that may yield, on the `nodes` nodes
    they run on, makes room for the whole set on none of them (too few units, no valid
    group of devices (DR3), or a node the set may not use)."""
    code: ClassVar[Code] = Code.NOTHING_FREES_ENOUGH
    victims: int
    nodes: int

    def render(self) -> str:
        sets = f"{self.victims} set{'s' if self.victims != 1 else ''}"
        nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        return f"stopping the {sets} that may yield, on {nodes}, makes room for the set on none"


@dataclass(frozen=True, slots=True)
class Preempts:
    """A plan's Event text for one victim: `victim` ("<namespace>/<vmi>") of
    `victim_priority` yields to `preemptor` of `preemptor_priority` on `node`."""
    victim: str
    victim_priority: int
    preemptor: str
    preemptor_priority: int
    node: str

    def render(self) -> str:
        return (f"preempts {self.victim} (priority {self.victim_priority}) for "
                f"{self.preemptor} (priority {self.preemptor_priority}) on {self.node}")

    __str__ = render


def _vms(n: int) -> str:
    return f"{n} lower-priority {'VM' if n == 1 else 'VMs'}"


@dataclass(frozen=True, slots=True)
class StoppedAs:
    """What follows a victim's stop, by its VirtualMachine's `run_strategy` as virt-controller
    treats a deleted VMI (KubeVirt v1.8 `syncRunStrategy`): None when the VMI has no
    VirtualMachine. Always and Once create the VMI again (it then waits for room, P5);
    Manual and RerunOnFailure leave the VM stopped, as `virtctl stop` would (its stop request
    deletes the VMI the same way); Halted stays stopped; any other strategy does what it
    does with a deleted VMI. The tail of the victim's `GPUSetPreempted` Event."""
    run_strategy: str | None

    def render(self) -> str:
        rs = self.run_strategy
        if rs is None:
            return "the VMI has no VirtualMachine: nothing creates it again but its owner"
        vm = f"its VirtualMachine (runStrategy {rs})"
        if rs == "Always":
            return f"{vm} starts it again, and it waits for room"
        if rs == "Once":
            return (f"{vm} starts it again (virt-controller creates a deleted VMI of a Once VM "
                    "anew), and it waits for room")
        if rs in ("Manual", "RerunOnFailure"):
            return (f"stopped as a user's stop would stop it: {vm} stays stopped until its "
                    "owner starts it")
        if rs == "Halted":
            return f"{vm} stays stopped"
        return f"{vm} does with it what that strategy does with a deleted VMI"


@dataclass(frozen=True, slots=True)
class PreemptedFor:
    """A victim VM's `GPUSetReady` words while it waits for room again (P4): its VMI was
    stopped on `node` to make room for `preemptor` ("<namespace>/<vmi>") of
    `preemptor_priority`; `priority` is the VM's own."""
    preemptor: str
    preemptor_priority: int
    priority: int
    node: str

    def render(self) -> str:
        return (f"stopped by gpu-binder on {self.node} to make room for {self.preemptor} "
                f"(priority {self.preemptor_priority}), of higher priority than this VM "
                f"(priority {self.priority}); it starts again when room for its GPU set returns")


@dataclass(frozen=True, slots=True)
class WaitingForVictims:
    """The preemptor VM's `GPUSetReady` words (P4): `running` victims (`victims`,
    "<namespace>/<vmi>", those still running, else all of them) still run on `node`, whose
    room is held for the set (of `priority`) until `until` (RFC 3339 text). With none
    running, their GPUs are still being released."""
    running: int
    victims: tuple[str, ...]
    priority: int
    node: str
    until: str

    def render(self) -> str:
        if self.running:
            head = f"waiting for {_vms(self.running)} to stop on {self.node}"
        else:
            head = f"the lower-priority VMs on {self.node} stopped; waiting for their GPUs to be released"
        return (f"{head} to make room for this set (priority {self.priority}): "
                f"{', '.join(self.victims)}; its room is held for it until {self.until}")
