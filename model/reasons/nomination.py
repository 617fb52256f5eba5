"""The refusal of a set while lower-priority sets are stopped to make room for it
(docs/contract.md §3c P4): retryable (503 with Retry-After), naming the node and the victims.
Built by the decision loop (`model.plan`) when it nominates, or finds the nomination it made
before; the webhook answers its code 503.

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Code, Reason


@dataclass(frozen=True, slots=True)
class PreemptionNominated(Reason):
    """P4: no room for the set now; `victims` ("<namespace>/<vmi>", each of a priority below
    the set's `priority`) are being stopped on `node` to make room for it, held for it
    until then; the caller retries after `retry_after` seconds. `request` names the request
    ("<namespace>/<vmi> request <id>"; empty: not named)."""
    code: ClassVar[Code] = Code.PREEMPTION_NOMINATED
    node: str
    victims: tuple[str, ...]
    priority: int
    retry_after: int
    request: str = ""

    def render(self) -> str:
        head = f"refused {self.request} for now: " if self.request else ""
        n = len(self.victims)
        return (f"{head}no room for the set now; stopping {n} lower-priority "
                f"{'VM' if n == 1 else 'VMs'} on {self.node} to make room for it (priority "
                f"{self.priority}): {', '.join(self.victims)}; its room is held for it, retry in "
                f"{self.retry_after}s")
