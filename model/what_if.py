"""What-if (pure; docs/contract.md §3 B1, B5, B6): cordon or drain some nodes, then re-admit
every held set on them in turn, as the binder would judge each one's next admission: does
the set stay (B5: kept on the cordoned node), move (B1: gathered where, with which moves) or
get refused; which running VMIs are stranded. Every verdict is `model.decide.decide`'s, on
the requests `model.explain.set_request` builds, each decision applied before the next.
Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Iterable, Sequence

from model.decide import Move, Request, Rule, apply_decision, decide
from model.device.view import recorded_choice, takes
from model.device.dra import DeviceRef
from model.explain import DEVICE_MODE_ONLY, live_vmi_keys, set_request
from model.housekeeping import VMIs
from model.parse import VMIAsk
from model.reasons import Outcome as DecisionOutcome
from model.reasons import SetRefused
from model.snapshot import Snapshot
from model.types import DeviceKey, GPUDevice, Labels, Result, Toleration


# --- what-if ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeldSet:
    """Devices Bound on one of the what-if nodes that would be admitted together next time:
    the devices attached to one VMI (`vmi`, `running` when it exists), or, for held devices
    attached to no live VMI, one tenant's idle held devices on that node (`vmi` None).
    `held` are held device names; `templates` (class, count) the template devices the VMI's
    next admission creates anew (its old ones are deleted with it, H2). `node_selector`
    is the VMI's own, as its last bind request recorded it (B3; the re-created VMI carries
    it again)."""

    namespace: str
    vmi: str | None
    node: str
    held: tuple[str, ...]
    templates: tuple[tuple[str, int], ...] = ()
    running: bool = False
    node_selector: Labels = ()
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the binder does on the set's next admission after the cordon or drain:
    `action` "stay" (B5: kept on the cordoned node, the VMI waits for the cordon to lift),
    "move" (B1: gathered on `node` with `moves`), "refused" (`reason` says why); `rule`
    the binder's rule; `said` what the decision says, typed (`model.reasons`), rendered by
    `message`. `stranded`: a running VMI that could not run again elsewhere. Device mode
    (DR3, DR4): `devices` the device of `node` each device-mode member takes (or keeps),
    `takes` per class those devices rendered with their module ids."""

    set: HeldSet
    action: str
    rule: Rule
    node: str | None
    moves: tuple[Move, ...]
    said: DecisionOutcome
    stranded: bool
    devices: tuple[tuple[DeviceKey, DeviceRef], ...] = field(default=(), metadata=DEVICE_MODE_ONLY)
    takes: tuple[tuple[str, str], ...] = field(default=(), metadata=DEVICE_MODE_ONLY)

    @property
    def message(self) -> str:
        """The binder's message (`said` rendered)."""
        return self.said.render()

    @property
    def reason(self) -> SetRefused | None:
        """The typed refusal when `action` is "refused", else None."""
        return self.said if isinstance(self.said, SetRefused) else None


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The answer of `what_if`: `mode` "cordon" or "drain", the `nodes`, one outcome per held
    set in the order they were judged (namespace, then VMI or node), and the running VMIs
    stranded ((namespace, name), sorted). Under drain every running VMI on the nodes is
    stopped (`evicted`); under cordon they keep running and the outcome is that of their
    next admission."""

    mode: str
    nodes: tuple[str, ...]
    outcomes: tuple[Outcome, ...]
    stranded: tuple[tuple[str, str], ...]
    evicted: tuple[tuple[str, str], ...]


def held_sets(snapshot: Snapshot, nodes: Iterable[str],
              live_vmis: VMIs | set[tuple[str, str]]) -> list[HeldSet]:
    """The held sets (see `HeldSet`) with a device Bound on one of `nodes`, sorted by
    namespace, then VMI (attached sets) before idle sets by node. Template devices attached
    to no live VMI are left out: housekeeping deletes them (H1/H2)."""
    wanted = set(nodes)
    live_vmis = live_vmi_keys(live_vmis)
    by_vmi: dict[tuple[str, str], list[GPUDevice]] = {}
    idle: dict[tuple[str, str], list[str]] = {}
    for d in snapshot.devices.values():
        att = d.status.attached_to
        if att is not None and (d.namespace, att.vmi) in live_vmis:
            by_vmi.setdefault((d.namespace, att.vmi), []).append(d)
        elif d.bound_node in wanted and d.template_for is None:
            idle.setdefault((d.namespace, d.bound_node), []).append(d.name)
    out: list[HeldSet] = []
    for (ns, vmi), devs in by_vmi.items():
        on = [d.bound_node for d in devs if d.bound_node in wanted]
        if not on:
            continue
        templates: dict[str, int] = {}
        for d in devs:
            if d.template_for is not None:
                templates[d.class_name] = templates.get(d.class_name, 0) + 1
        held = tuple(sorted(d.name for d in devs if d.template_for is None))
        last = next((d.status.bind_request for d in sorted(devs, key=lambda d: d.name)
                     if d.status.bind_request is not None
                     and d.status.bind_request.vmi == vmi), None)
        out.append(HeldSet(ns, vmi, min(on), held, tuple(sorted(templates.items())), True,
                           last.node_selector if last else (),
                           last.tolerations if last else ()))
    for (ns, node), names in idle.items():
        out.append(HeldSet(ns, None, node, tuple(sorted(names))))
    out.sort(key=lambda s: (s.namespace, s.vmi is None, s.vmi or "", s.node))
    return out


def what_if(snapshot: Snapshot, mode: str, nodes: Sequence[str], *,
            live_vmis: VMIs | set[tuple[str, str]], now: datetime) -> WhatIf:
    """Cordon (`mode` "cordon") or drain ("drain": cordon, and every running VMI on the
    nodes stopped) `nodes`, then judge each held set on them with `decide` (B1–B6) as its
    next admission would, in `held_sets` order, each decision applied before the next (so
    two sets do not both count on one free unit). A set's old template devices are replaced
    by new Pending ones (the VMI's re-admission creates them). `now` stamps the simulated
    placements. Raises ValueError for a node not in the snapshot or an unknown mode."""
    if mode not in ("cordon", "drain"):
        raise ValueError(f"mode must be cordon or drain, got {mode!r}")
    unknown = sorted(set(nodes) - set(snapshot.nodes))
    if unknown:
        raise ValueError(f"no such node: {', '.join(repr(n) for n in unknown)}")
    targets = tuple(sorted(set(nodes)))
    snap = snapshot.with_nodes(replace(n, unschedulable=True) if n.name in targets else n
                               for n in snapshot.nodes.values())
    sets = held_sets(snap, targets, live_vmis)
    outcomes: list[Outcome] = []
    for hs in sets:
        vmi = hs.vmi or f"(idle on {hs.node})"
        if hs.vmi is not None:  # its old templates go with the VMI (H2)
            snap = snap.without_devices([d.key for d in snap.devices_in(hs.namespace).values()
                                         if d.template_for == hs.vmi])
        ask = VMIAsk(hs.held, hs.templates)
        snap, request = set_request(snap, hs.namespace, vmi, ask, hs.node_selector,
                                    hs.tolerations)
        decision = decide(snap, request, limit=1)
        if decision.result is Result.SUCCEEDED:
            placement = decision.placements[0]
            action = "stay" if decision.rule in (Rule.B5A, Rule.B5B) else "move"
            if decision.rule is Rule.B6:
                action = "stay"
            chosen = _outcome_devices(snap, request, placement)
            shown = takes(snap, placement.node, chosen) if chosen else ()
            snap = apply_decision(snap, request, decision, now=now)
            outcomes.append(Outcome(hs, action, decision.rule, decision.node, placement.moves,
                                    decision.outcome, hs.running and action == "stay"
                                    and decision.node in targets, chosen, shown))
        else:
            snap = snap.without_devices([(hs.namespace, n) for n in request.devices
                                         if snap.device(hs.namespace, n) is not None
                                         and snap.device(hs.namespace, n).template_for == vmi
                                         and snap.device(hs.namespace, n).bound_node is None])
            outcomes.append(Outcome(hs, "refused", decision.rule, None, (), decision.outcome,
                                    hs.running))
    stranded = tuple(sorted((o.set.namespace, o.set.vmi) for o in outcomes
                            if o.stranded and o.set.vmi is not None))
    evicted = tuple(sorted((s.namespace, s.vmi) for s in sets if s.running and s.vmi)
                    ) if mode == "drain" else ()
    return WhatIf(mode, targets, tuple(outcomes), stranded, evicted)


def _outcome_devices(snap: Snapshot, request: Request, placement
                     ) -> tuple[tuple[DeviceKey, DeviceRef], ...]:
    """Device mode: the devices of the placement's node the set's device-mode members take
    (B1) or keep (B5/B6: their records); empty in count mode."""
    if placement.devices:
        return placement.devices
    members = [m for n in request.devices if (m := snap.device(request.namespace, n)) is not None]
    return recorded_choice(members, placement.node)
