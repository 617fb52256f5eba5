"""Foreign GPU consumers (DESIGN.md §2 capacity): the extended-resource requests of Pods on a
node that are not virt-launcher Pods of binder-admitted VMIs. Their units are `Node.foreign`,
counted as used next to the Bound devices, so a GPU Pod outside the binder (a system
namespace, a raw Pod while `rawResourceNames=allowed`) is never double-booked.

A launcher Pod's GPUs are already counted as the VMI's Bound GPUDevices, so they are left out
— but only as many units per resource as the binder-admitted VMI it names (label
`kubevirt.io/created-by` = the VMI's uid, same namespace) asks for in its
`spec.domain.devices.gpus`, and only on the node the VMI is pinned to, once per VMI and node
however many Pods name it. A Pod that forges the label can therefore hide no more than
the units the ledger already counts for that VMI there.

Pure: parsers from plain dicts and one function over values; the cache feeds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from model.parse import parse_quantity_int
from model.types import DEVICES_ANNOTATION, HOSTNAME_LABEL, TEMPLATES_ANNOTATION

CREATED_BY_LABEL = "kubevirt.io/created-by"
"""virt-controller's label on a launcher Pod: the uid of the VMI it runs."""

_IGNORED_PREFIXES = ("devices.kubevirt.io/",)
"""Extended resources every launcher Pod requests (kvm, tun, vhost-net); never a GPU class's."""

Units = tuple[tuple[str, int], ...]
"""Units per extended resource, sorted by resource name, only positive counts."""


@dataclass(frozen=True, slots=True)
class PodUse:
    """A Pod bound to a node, trimmed to what capacity needs: its effective extended-resource
    requests and the VMI uid it claims to run (`kubevirt.io/created-by`), if any."""

    namespace: str
    name: str
    node: str
    requests: Units
    created_by: str | None = None


@dataclass(frozen=True, slots=True)
class LauncherClaim:
    """A binder-admitted VMI as its launcher Pods may be excused: namespace, pinned node,
    and its GPU units per resource (`spec.domain.devices.gpus` by `deviceName`)."""

    namespace: str
    node: str
    gpus: Units


def _extended(res: Any) -> bool:
    return isinstance(res, str) and "/" in res and not res.startswith(_IGNORED_PREFIXES)


def _container_requests(c: Any) -> dict[str, int]:
    if not isinstance(c, Mapping):
        return {}
    resources = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
    req = resources.get("requests") if isinstance(resources.get("requests"), Mapping) else {}
    lim = resources.get("limits") if isinstance(resources.get("limits"), Mapping) else {}
    out: dict[str, int] = {}
    for res in set(req) | set(lim):  # an extended resource's request defaults to its limit
        if not _extended(res):
            continue
        n = parse_quantity_int(req[res] if res in req else lim[res])
        if n is not None and n > 0:
            out[res] = n
    return out


def parse_pod_use(obj: Mapping[str, Any]) -> PodUse | None:
    """A Pod dict → PodUse, or None when it is not bound to a node, has ended (phase
    Succeeded or Failed: kube-scheduler no longer counts it), or requests no extended
    resource. Requests as kube-scheduler counts them: the larger of the containers' sum and
    each init container's, per resource. Never raises for malformed input (None)."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    node, ns, name = spec.get("nodeName"), meta.get("namespace"), meta.get("name")
    if not (isinstance(node, str) and node and isinstance(ns, str) and isinstance(name, str)):
        return None
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for res, n in _container_requests(c).items():
            total[res] = total.get(res, 0) + n
    for c in spec.get("initContainers") or []:
        for res, n in _container_requests(c).items():
            total[res] = max(total.get(res, 0), n)
    if not total:
        return None
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    created_by = labels.get(CREATED_BY_LABEL)
    return PodUse(ns, name, node, tuple(sorted(total.items())),
                  created_by if isinstance(created_by, str) and created_by else None)


def parse_launcher_claim(vmi: Mapping[str, Any]) -> tuple[str, LauncherClaim] | None:
    """A VMI dict → (uid, LauncherClaim) when the binder admitted it: it carries a
    `gpu.cozystack.io/devices` or `/templates` annotation and the pin
    `spec.nodeSelector["kubernetes.io/hostname"]` (the webhook writes both before the VMI
    exists); else None. Never raises for malformed input (None)."""
    if not isinstance(vmi, Mapping):
        return None
    meta = vmi.get("metadata") if isinstance(vmi.get("metadata"), Mapping) else {}
    ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    if DEVICES_ANNOTATION not in ann and TEMPLATES_ANNOTATION not in ann:
        return None
    uid, ns = meta.get("uid"), meta.get("namespace")
    spec = vmi.get("spec") if isinstance(vmi.get("spec"), Mapping) else {}
    sel = spec.get("nodeSelector") if isinstance(spec.get("nodeSelector"), Mapping) else {}
    node = sel.get(HOSTNAME_LABEL)
    if not all(isinstance(v, str) and v for v in (uid, ns, node)):
        return None
    domain = spec.get("domain") if isinstance(spec.get("domain"), Mapping) else {}
    devices = domain.get("devices") if isinstance(domain.get("devices"), Mapping) else {}
    gpus: dict[str, int] = {}
    for g in devices.get("gpus") or []:
        res = g.get("deviceName") if isinstance(g, Mapping) else None
        if _extended(res):
            gpus[res] = gpus.get(res, 0) + 1
    return uid, LauncherClaim(ns, node, tuple(sorted(gpus.items())))


def foreign_units(pods: Iterable[PodUse], claims: Mapping[str, LauncherClaim]) -> Units:
    """The foreign units of one node's Pods (see the module docstring): every Pod's
    requests, less, per binder-admitted VMI (by uid in `claims`) whose launcher Pods run on
    its pinned node in its namespace, at most its GPU units per resource in total."""
    total: dict[str, int] = {}
    excused: dict[tuple[str, str], int] = {}  # (vmi uid, resource) -> units left out so far
    for pod in pods:
        claim = claims.get(pod.created_by) if pod.created_by else None
        if claim is not None and (claim.namespace != pod.namespace or claim.node != pod.node):
            claim = None
        allowed = dict(claim.gpus) if claim is not None else {}
        for res, n in pod.requests:
            if claim is not None:
                key = (pod.created_by, res)
                room = allowed.get(res, 0) - excused.get(key, 0)
                skip = min(n, max(room, 0))
                if skip:
                    excused[key] = excused.get(key, 0) + skip
                    n -= skip
            if n:
                total[res] = total.get(res, 0) + n
    return tuple(sorted(total.items()))
