"""Why the binder or the webhook says no (docs/contract.md §3 B1/B3, §4 W1), as types: a
`Code` (an Enum, with its `Category`) and the data of each reason (one frozen dataclass per
code). The English wording of every reason is written once, beside its data (`render()`, also
`str()`); decisions, verdicts, assessments and refusals carry the typed reason, and the edges
(status writes, webhook denials, metrics, the operator's tools) render it or read its code.
Nothing parses a message back.

The webhook's own denials (its steps on the API server, its transport and decoder, its
availability) are reasons too, so every denial the tenant sees has a code and one `Category`
(the same type the webhook's HTTP status table reads). A binder refusal crosses the status
boundary typed: its code is written beside its message (`bindRequest.code`) and read back by
the webhook (`BinderRefused`).

One module per section; this package re-exports every public name, so callers import from
`model.reasons`:
- `codes`: the catalogue, `Code` (grouped by section), `Category`, the `Reason` base;
- `sets`: the set whatever the node (B1, W1; device mode DR1) and over the nodes (B1);
- `nodes`: one node for the whole set (B3), `CAPACITY_CODES`, the device taints a node's
  room refusal names (`TaintedDevices`, no code), a set's record on a tainted device
  (`RecordTainted`, HL1: what `explain` names);
- `ledger`: a node actor's no to a reservation (B2: `NodeRefusal`, `LedgersRefused`);
- `decision`: what a decision says, `SetRefused` or the wording of a Succeeded one
  (`Placed`, `AlreadyPlaced`, `KeptCordoned`, `Resumed`: no code, not reasons to refuse);
- `admission`: the webhook's own checks (W1) and its denial `CannotPlace`;
- `steps`: the webhook's steps on the API server (W1's live read, W3, W4);
- `claims`: the webhook's ResourceClaim of a device-mode set (DR5, W4, W5);
- `transport`: the webhook's transport and decoder (W6), and its own availability;
- `priority`: a set's priority that cannot be had (P1: a PriorityClass not found).
- `line`: the waiting line (P5): a set behind another, a reserved node, and `explain`'s
  place in line (`LinePlace`, no code).
- `preemption`: why a set refused for room gets no preemption plan (P2, P3), and a plan's
  Event and VM condition words (`Preempts`, `StoppedAs`, `PreemptedFor`, `WaitingForVictims`);
- `nomination`: a set refused while victims are stopped for it (P4, `PreemptionNominated`).
Every module imports only `codes` (`ledger` also `nodes`). Pure; imports nothing from the
rest of `model`.
"""

from __future__ import annotations

from model.reasons.codes import DRA_DEVICES_SUFFIX, Category, Code, Reason, resource_label
from model.reasons.sets import (BudgetExhausted, ClassNotFound, ClassProblem, DeviceListedTwice,
                                DeviceNotFound, MixedModes, NoDevices, NoEligibleNode, NoFreeUnit,
                                NoNodeServes, NodeProblems, NotEntitled, WrongNamespace)
from model.reasons.nodes import (CAPACITY_CODES, ClassesNotServed, Cordoned, LostCapacity,
                                 NoDeviceGroup, NoRoom, NodeGone, NotKubevirtSchedulable, NotReady,
                                 RecordTainted, SelectorMismatch, TaintedDevices, TaintsNotTolerated,
                                 taint_source)
from model.reasons.ledger import (DevicesTaken, LedgerNo, LedgerRebuilt, LedgersRefused,
                                  NoNodeActor, NoReservation, NodeActorUnavailable, NodeRefusal,
                                  NodeUnfit, Short)
from model.reasons.decision import (AlreadyPlaced, DeviceAt, KeptCordoned, Outcome, Placed,
                                    RequestRef, Resumed, SetRefused, new_device_class,
                                    new_device_name)
from model.reasons.admission import (W1_DEVICE_CODES, BudgetInFlight, CannotPlace,
                                     ClassNotPermitted, DeviceAttached, DeviceBeingDeleted,
                                     DeviceKept, GpuEntryNotPermitted, HeldDeviceNotFound,
                                     KeptForVM, NameTaken, NoRoomForSet, SameNameConflict,
                                     SelectorEntryTooLong, SetNeeds, TemplateBeingDeleted,
                                     TemplateNamedAsHeld, TenantBusy, TolerationTooLong,
                                     TooManySelectorEntries, TooManyTolerations, UnknownAnnotation)
from model.reasons.steps import (ApiForbidden, ApiInvalid, ApiThrottled, ApiUnavailable,
                                 AttachmentRefused, BinderRefused, DeviceDeleted, DeviceDisappeared,
                                 DeviceKeptChanging, DeviceMalformed, NameUnconfirmed,
                                 NotBoundInTime, VmiExists)
from model.reasons.claims import (ClaimBeingDeleted, ClaimInUse, ClaimNameTaken, ClaimOverQuota,
                                  DeviceUnrecorded)
from model.reasons.preemption import (FitsWithoutPreemption, NoEligibleVictim, NotRefusedForRoom,
                                      NothingFreesEnough, PreemptedFor, PreemptorNever, Preempts,
                                      StoppedAs, WaitingForVictims)
from model.reasons.nomination import PreemptionNominated
from model.reasons.transport import (AdmissionCrashed, AdmissionTimedOut, BodyNotJson, BodyTooLarge,
                                     DryRunNotBoolean, InvalidAnnotations, InvalidVmi,
                                     MalformedMetadata, NoName, NotACreate, NotAReview, NotAVmi,
                                     NotSynced, ShuttingDown, WrongMediaType)
from model.reasons.priority import PriorityClassNotFound
from model.reasons.line import BehindInLine, InLine, LinePlace, NodeReserved, Waiter, WaitsInLine
