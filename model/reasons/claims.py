"""The webhook's ResourceClaim of a device-mode set (docs/contract.md §3b DR5, §4 W4, W5;
`model.claim`, `k8s.webhook.steps`): a member's exact device not recorded yet, the claim's
name taken by a claim the binder did not make, the claim being deleted or still reserved
by a Pod, or refused by the namespace's ResourceQuota.

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Code, Reason


# --- the webhook's ResourceClaim of a device-mode set (DR5, W4, W5) ---------------------------


@dataclass(frozen=True, slots=True)
class DeviceUnrecorded(Reason):
    """DR5: the binder answered Succeeded on `node` but device `device`'s record of its exact
    device is not in the cache yet, or names a device (`recorded`) the node's slices do not
    list with a uuid: its claim cannot be written now (the cache is behind, or the device
    vanished); retryable."""
    code: ClassVar[Code] = Code.DEVICE_UNRECORDED
    device: str
    node: str
    recorded: str | None = None

    def render(self) -> str:
        what = (f"its recorded device {self.recorded} is not published with a uuid on node "
                f"{self.node}" if self.recorded else f"its exact device on node {self.node} "
                "is not recorded yet")
        return f"GPU device {self.device}: {what}, so its ResourceClaim cannot be written; retry"


@dataclass(frozen=True, slots=True)
class ClaimNameTaken(Reason):
    """DR5: a ResourceClaim named `claim` exists in `namespace` that the binder did not make
    for VMI `vmi` (no managed-by label or claim-for annotation naming it): never adopted."""
    code: ClassVar[Code] = Code.CLAIM_NAME_TAKEN
    namespace: str
    claim: str
    vmi: str

    def render(self) -> str:
        return (f"ResourceClaim {self.namespace}/{self.claim} exists and was not made by "
                f"gpu-binder for VMI {self.vmi}; delete or rename it, or rename the VMI")


@dataclass(frozen=True, slots=True)
class ClaimBeingDeleted(Reason):
    """W4: the VMI's claim `claim` is being deleted (a finalizer holds it: an older
    incarnation's, or one being replaced); retryable once it is gone."""
    code: ClassVar[Code] = Code.CLAIM_BEING_DELETED
    namespace: str
    claim: str

    def render(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.claim} is being deleted; retry"


@dataclass(frozen=True, slots=True)
class ClaimInUse(Reason):
    """W4: the VMI's claim `claim` names other devices than the set now records (they were
    re-pointed) and a Pod still holds it (`status.reservedFor`: an older incarnation's
    launcher Pod is still going away), so it cannot be replaced yet; retryable."""
    code: ClassVar[Code] = Code.CLAIM_IN_USE
    namespace: str
    claim: str

    def render(self) -> str:
        return (f"ResourceClaim {self.namespace}/{self.claim} names other devices and is still "
                "reserved by a Pod; retry once that Pod is gone")


@dataclass(frozen=True, slots=True)
class ClaimOverQuota(Reason):
    """DR5: the API server refused the claim for the namespace's ResourceQuota (`error`:
    its message; Kubernetes counts `<deviceClass>.deviceclass.resource.k8s.io/devices`)."""
    code: ClassVar[Code] = Code.CLAIM_OVER_QUOTA
    namespace: str
    claim: str
    error: str

    def render(self) -> str:
        return (f"ResourceClaim {self.namespace}/{self.claim} refused by the namespace's "
                f"ResourceQuota: {self.error[:300]}")
