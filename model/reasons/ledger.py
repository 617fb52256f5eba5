"""A node actor's no to a reservation (docs/contract.md §3 B2, §6): `LedgersRefused`, the
set-level reason when every candidate node's ledger refused the prepare, and its data, one
`NodeRefusal` per candidate node whose `why` is a `LedgerNo` (not reasons of their own: no
code). Built by `actors.node_actor` and `actors.reservation`.

Pure; imports only `model.reasons.codes` and `model.reasons.nodes` (`Short` lists `NoRoom`s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Code, Reason
from model.reasons.nodes import NoRoom


# --- a node actor's no to a reservation (B2, docs/contract.md §6) -----------------------------
# Not reasons of their own (no code): the data of `LedgersRefused`, one `NodeRefusal` per
# candidate node, whose `why` is one of the `LedgerNo` types below.


@dataclass(frozen=True, slots=True)
class NodeUnfit:
    """The node actor found its node unfit for any placement: `problems` are its own
    (`NodeGone`, or `model.types.Node.placement_reasons`: cordoned, not Ready, …)."""
    problems: tuple[Reason, ...]

    def render(self) -> str:
        return "node is " + " and ".join(p.render() for p in self.problems)

    __str__ = render


@dataclass(frozen=True, slots=True)
class Short:
    """The node's ledger has too few free units: one `NoRoom` per resource short."""
    rooms: tuple[NoRoom, ...]

    def render(self) -> str:
        return "; ".join(r.render() for r in self.rooms)

    __str__ = render


@dataclass(frozen=True, slots=True)
class LedgerRebuilt:
    """A commit refused: the ledger was rebuilt (incarnation `incarnation`) since the
    prepare (made in `prepared_in`)."""
    incarnation: int
    prepared_in: int

    def render(self) -> str:
        return f"ledger rebuilt: incarnation {self.incarnation}, prepared in {self.prepared_in}"

    __str__ = render


@dataclass(frozen=True, slots=True)
class NoReservation:
    """A commit refused: the prepared hold is gone (expired or aborted)."""

    def render(self) -> str:
        return "no reservation (expired or aborted)"

    __str__ = render


@dataclass(frozen=True, slots=True)
class NoNodeActor:
    """No node actor runs for the candidate node (not started yet, or stopped)."""

    def render(self) -> str:
        return "no node actor"

    __str__ = render


@dataclass(frozen=True, slots=True)
class NodeActorUnavailable:
    """The node actor gave no answer: `reply` names what came instead (the exception's
    type, e.g. "TimeoutError", "ActorStopped")."""
    reply: str

    def render(self) -> str:
        return f"node actor unavailable ({self.reply})"

    __str__ = render


@dataclass(frozen=True, slots=True)
class DevicesTaken:
    """Device mode (DR2): a prepare named devices the node's ledger does not have free:
    `devices` (names) held by another reservation, recorded by a Bound GPUDevice outside the
    request, or allocated by a claim / tainted (`Node.taken_devices`)."""
    devices: tuple[str, ...]

    def render(self) -> str:
        return f"{'device' if len(self.devices) == 1 else 'devices'} {', '.join(self.devices)} taken"

    __str__ = render


LedgerNo = (NodeUnfit | Short | DevicesTaken | LedgerRebuilt | NoReservation | NoNodeActor
            | NodeActorUnavailable)
"""Why one node actor did not reserve: a prepare's `NodeUnfit`/`Short`, a commit's
`LedgerRebuilt`/`NoReservation`, or no answer (`NoNodeActor`, `NodeActorUnavailable`)."""


@dataclass(frozen=True, slots=True)
class NodeRefusal:
    """One candidate `node` that did not reserve a set, and why: "<node>: <why>"."""
    node: str
    why: LedgerNo

    def render(self) -> str:
        return f"{self.node}: {self.why.render()}"

    __str__ = render


@dataclass(frozen=True, slots=True)
class LedgersRefused(Reason):
    """The model found room but every node actor refused its prepare (their `refusals`, one
    `NodeRefusal` per candidate): the coordinator's view was behind the ledgers; a retry
    decides again."""
    code: ClassVar[Code] = Code.LEDGERS_REFUSED
    refusals: tuple[NodeRefusal, ...]

    def render(self) -> str:
        said = "; ".join(r.render() for r in self.refusals)
        return f"node ledgers refused every candidate: {said or 'no candidate node'}"
