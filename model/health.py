"""HL2, the binder's own signal of a broken passthrough GPU (docs/contract.md §3b HL2,
docs/device-mode.md "A GPU that fails its VMs"): failed starts as evidence, per device.

NVIDIA's DRA driver does not health-check a GPU bound to vfio-pci, so a GPU fallen off the
bus (Xid 79) shows only as VMs that never start on it. The evidence is a *failed start*: a
VMI the binder admitted whose launcher Pod reached `Failed`, or which itself reached
`Failed`, before the VMI was ever `Running` (`judge_start`). It counts against every
`Target` the VMI's set was placed on: in device mode the exact device its GPUDevice records
(`status.device`), in count mode the node and class (the device plugin's pick is unknown).
A target on which `HealthSettings.failed_starts` *different* VMIs (namespace and name: one
VM failing again and again counts once) failed within `HealthSettings.window` is suspected
(`Evidence.suspects`).

Failures that are not the GPU's never count (`Excuse`): an image that cannot be pulled, a
VMI or launcher Pod deleted while starting, a Pod the kubelet refused at admission (out of
a resource, node affinity, an eviction), a launcher Pod Kubernetes disrupted (condition
`DisruptionTarget`: kube-controller-manager's eviction for a `NoExecute` device or node
taint, HL1, a preemption, an eviction through the API, garbage collection), a VMI that ran
and then failed. A VMI the webhook refused never exists, so it cannot count.

Pure: no clock (every `now` is an argument), no I/O. The objects read are plain dicts as
the API server sends them (a VMI: `metadata.uid`, `metadata.deletionTimestamp`,
`status.phase`, `status.phaseTransitionTimestamps`, `status.conditions`; a Pod:
`metadata.deletionTimestamp`, `status.phase`, `status.reason`, its `DisruptionTarget`
condition, the containers' and init containers' `state`/`lastState` reasons).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Iterable, Mapping

from model.device.dra import DeviceRef
from model.serialize import parse_time
from model.types import GPUClass, GPUDevice

DEFAULT_FAILED_STARTS = 3
"""`health.failedStarts`'s default: different VMIs failing on one target before it is suspected."""

DEFAULT_WINDOW = timedelta(minutes=30)
"""`health.window`'s default: how far back a failed start counts."""

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                "ErrImageNeverPull", "RegistryUnavailable",
                                "SignatureValidationFailed"})
"""Container waiting reasons (and VMI condition reasons) of an image that cannot be pulled."""

KUBELET_REFUSALS = frozenset({"NodeAffinity", "NodeSelectorMismatching", "UnexpectedAdmissionError",
                              "InvalidNodeInfo", "PodOSNotSupported", "Evicted", "Preempting",
                              "Shutdown", "NodeShutdown", "Terminated"})
"""A failed Pod's `status.reason` when the kubelet refused or removed it before it ran for
reasons of the node (with every `OutOf<resource>`), not of a GPU."""


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """`failed_starts` (>= 1) different VMIs failing within `window` (> 0) make a suspect.
    Raises ValueError otherwise."""

    failed_starts: int = DEFAULT_FAILED_STARTS
    window: timedelta = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if self.failed_starts < 1 or self.window <= timedelta(0):
            raise ValueError(f"health needs failedStarts >= 1 and a positive window, not "
                             f"{self.failed_starts!r} and {self.window!r}")


@dataclass(frozen=True, slots=True, order=True)
class Target:
    """What a failed start counts against: the `node` and `class_name` of a placed device,
    and in device mode the exact `device` (None in count mode)."""

    node: str
    class_name: str
    device: DeviceRef | None = None

    def __str__(self) -> str:
        return str(self.device) if self.device is not None else f"{self.node}/{self.class_name}"


class Excuse(str, Enum):
    """Why a VMI that did not start is no evidence against its GPUs."""

    IMAGE_PULL = "image-pull"
    DELETED = "deleted-while-starting"
    DISRUPTED = "disrupted"
    REFUSED = "kubelet-refused"
    RAN = "ran-before"


@dataclass(frozen=True, slots=True)
class FailedStart:
    """One VMI that failed to start: `namespace`/`vmi` (its incarnation `uid`), `at` (when
    it failed: the VMI's `Failed` transition, else when it was seen) and `why` (what failed:
    "launcher Pod virt-launcher-x-abc Failed (reason)" or "VMI Failed (reason)")."""

    namespace: str
    vmi: str
    uid: str
    at: datetime
    why: str

    @property
    def who(self) -> tuple[str, str]:
        """(namespace, name): the identity counted once however often it fails."""
        return (self.namespace, self.vmi)


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _ever_running(vmi: Mapping[str, Any]) -> bool:
    status = vmi.get("status") or {}
    if status.get("phase") == "Running":
        return True
    return any(isinstance(t, dict) and t.get("phase") == "Running"
               for t in status.get("phaseTransitionTimestamps") or ())


def _failed_at(vmi: Mapping[str, Any]) -> datetime | None:
    for t in (vmi.get("status") or {}).get("phaseTransitionTimestamps") or ():
        if isinstance(t, dict) and t.get("phase") == "Failed":
            return parse_time(t.get("phaseTransitionTimestamp"))
    return None


def _container_reasons(pod: Mapping[str, Any]) -> set[str]:
    out: set[str] = set()
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            if not isinstance(cs, dict):
                continue
            for state_key in ("state", "lastState"):
                for part in ((cs.get(state_key) or {}).values()):
                    if isinstance(part, dict) and isinstance(part.get("reason"), str):
                        out.add(part["reason"])
    return out


def _image_pull(vmi: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> bool:
    if any(_container_reasons(p) & IMAGE_PULL_REASONS for p in pods):
        return True
    return any(isinstance(c, dict) and c.get("reason") in IMAGE_PULL_REASONS
               for c in (vmi.get("status") or {}).get("conditions") or ())


DISRUPTION_CONDITION = "DisruptionTarget"
"""The Pod condition Kubernetes sets (status True) on a Pod it is about to delete for a
disruption: reason `DeletionByDeviceTaintManager` (a NoExecute device taint, HL1),
`DeletionByTaintManager`, `PreemptionByScheduler`, `EvictionByEvictionAPI`,
`DeletionByPodGC`, `TerminationByKubelet`."""


def disrupted(pod: Mapping[str, Any]) -> bool:
    """Whether Pod `pod` (a dict) carries the condition `DisruptionTarget` True."""
    return any(isinstance(c, dict) and c.get("type") == DISRUPTION_CONDITION and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _refused(pod: Mapping[str, Any]) -> bool:
    reason = (pod.get("status") or {}).get("reason")
    return isinstance(reason, str) and (reason in KUBELET_REFUSALS or reason.startswith("OutOf"))


def judge_start(vmi: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
                now: datetime) -> FailedStart | Excuse | None:
    """Whether VMI `vmi` (a dict) failed to start, with `pods` its launcher Pods (dicts):
    a `FailedStart` when its launcher Pod or itself reached `Failed` before it was ever
    `Running` and no `Excuse` applies; the `Excuse` when it failed but not for its GPUs;
    None when nothing failed. `pods` may include a launcher Pod already deleted (its last
    state): one Kubernetes disrupted excuses the failure (`Excuse.DISRUPTED`). `now` stamps a
    failure whose time the VMI does not say."""
    pods = list(pods)
    status = vmi.get("status") or {}
    failed_pods = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    vmi_failed = status.get("phase") == "Failed"
    if not vmi_failed and not failed_pods:
        return None
    if _ever_running(vmi):
        return Excuse.RAN
    if _deleting(vmi) or any(_deleting(p) for p in failed_pods):
        return Excuse.DELETED
    if any(disrupted(p) for p in pods):
        return Excuse.DISRUPTED
    if _image_pull(vmi, pods):
        return Excuse.IMAGE_PULL
    if failed_pods and all(_refused(p) for p in failed_pods):
        return Excuse.REFUSED
    meta = vmi.get("metadata") or {}
    if failed_pods:
        pod = sorted(failed_pods, key=lambda p: str((p.get("metadata") or {}).get("name")))[0]
        pst = pod.get("status") or {}
        reason = pst.get("reason") or ", ".join(sorted(_container_reasons(pod))) or "no reason"
        why = f"launcher Pod {(pod.get('metadata') or {}).get('name')} Failed ({reason})"
    else:
        reasons = [c.get("reason") for c in status.get("conditions") or ()
                   if isinstance(c, dict) and c.get("reason")]
        why = f"VMI Failed ({', '.join(reasons) or 'no reason'})"
    return FailedStart(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                       str(meta.get("uid") or ""), _failed_at(vmi) or now, why)


def targets_of(devices: Iterable[GPUDevice], classes: Mapping[str, GPUClass],
               failure: FailedStart) -> tuple[Target, ...]:
    """What `failure` counts against: each of `devices` (GPUDevices) attached to its VMI
    (same namespace and name, and the same incarnation when the attachment records a uid)
    and Bound on a node; a device-mode class's device only when it records its device
    (`status.device`), a count-mode one as its node and class. Sorted, each once."""
    out: set[Target] = set()
    for d in devices:
        att = d.status.attached_to
        if (d.namespace != failure.namespace or att is None or att.vmi != failure.vmi
                or (att.uid and failure.uid and att.uid != failure.uid) or d.bound_node is None):
            continue
        cls = classes.get(d.class_name)
        if cls is None:
            continue
        if cls.device_mode:
            if d.status.device is not None:
                out.add(Target(d.bound_node, cls.name, d.status.device))
        else:
            out.add(Target(d.bound_node, cls.name))
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class Suspect:
    """A suspected `target` and its `evidence`: the failed starts that count now (one per
    VMI, the latest, oldest first)."""

    target: Target
    evidence: tuple[FailedStart, ...]


@dataclass(frozen=True, slots=True)
class Evidence:
    """The failed starts seen per target (an immutable value: every change returns a new
    one). `cleared` is, per target, when an operator last lifted its suspicion: failures up
    to then no longer count."""

    failures: Mapping[Target, tuple[FailedStart, ...]] = field(default_factory=dict)
    cleared: Mapping[Target, datetime] = field(default_factory=dict)

    def record(self, targets: Iterable[Target], failure: FailedStart) -> "Evidence":
        """`failure` counted against each of `targets`; the same VMI incarnation (uid) is
        recorded once per target."""
        out = dict(self.failures)
        for t in set(targets):
            known = out.get(t, ())
            if any(f.uid == failure.uid and f.who == failure.who for f in known):
                continue
            out[t] = (*known, failure)
        return Evidence(out, self.cleared)

    def prune(self, now: datetime, settings: HealthSettings) -> "Evidence":
        """Without the failures older than the window (and those before a clear), and
        targets left with none."""
        since = now - settings.window
        out: dict[Target, tuple[FailedStart, ...]] = {}
        for t, fs in self.failures.items():
            lifted = self.cleared.get(t)
            kept = tuple(f for f in fs if f.at >= since and (lifted is None or f.at > lifted))
            if kept:
                out[t] = kept
        cleared = {t: c for t, c in self.cleared.items() if c > since}
        return Evidence(out, cleared)

    def clear(self, target: Target, now: datetime) -> "Evidence":
        """The suspicion of `target` lifted at `now`: its failures so far no longer count."""
        return Evidence({t: fs for t, fs in self.failures.items() if t != target},
                        {**self.cleared, target: now})

    def suspects(self, now: datetime, settings: HealthSettings) -> tuple[Suspect, ...]:
        """The targets on which at least `settings.failed_starts` different VMIs failed
        within the window ending `now` (sorted by target)."""
        out = []
        for t, fs in sorted(self.prune(now, settings).failures.items()):
            latest: dict[tuple[str, str], FailedStart] = {}
            for f in fs:
                if f.who not in latest or f.at >= latest[f.who].at:
                    latest[f.who] = f
            if len(latest) >= settings.failed_starts:
                out.append(Suspect(t, tuple(sorted(latest.values(), key=lambda f: (f.at, f.who)))))
        return tuple(out)


__all__ = ["DEFAULT_FAILED_STARTS", "DEFAULT_WINDOW", "DISRUPTION_CONDITION", "Evidence", "Excuse",
           "FailedStart", "HealthSettings", "IMAGE_PULL_REASONS", "KUBELET_REFUSALS", "Suspect",
           "Target", "disrupted", "judge_start", "targets_of"]
