"""Foreign GPU consumers (docs/contract.md §2 capacity, §4 W7): the extended-resource requests of Pods
on a node beyond what the binder's own records already count there. Their units are
`Node.foreign`, counted as used next to the Bound devices, so a GPU Pod outside the binder (a
system namespace, a raw Pod or VMI while `rawResourceNames=allowed`) is never double-booked.

A Pod's units are its effective requests as kube-scheduler computes them (`pod_requests`).
A virt-launcher Pod's GPUs are already counted as its VMI's Bound GPUDevices, so they are
excused — but only from the binder's own status records, never from what a tenant writes:
per VMI incarnation (the uid a Pod names in its `kubevirt.io/created-by` label), at most
one unit per GPUDevice that is Bound on the Pod's node, in the Pod's namespace, whose
`status.attachedTo` belongs to that incarnation (`attachment_uid`). VMI annotations, the
VMI's `gpus` entries and the pin play no part, so adding, removing or editing them changes
nothing in the count.

Why that is safe whatever a tenant forges: each Bound device is counted once as used, and
excuses at most one unit of one Pod on its own node, so the used units of a node (Bound
devices plus foreign) are never fewer than the units kube-scheduler sees its Pods request,
nor than the Bound devices. A forged label only moves an excuse from one Pod to another.

Pure: parsers from plain dicts and functions over values; the cache feeds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from model.housekeeping import VMIRecord
from model.parse import parse_quantity_int
from model.types import GPUDevice, VMIKey

CREATED_BY_LABEL = "kubevirt.io/created-by"
"""virt-controller's label on a launcher Pod: the uid of the VMI it runs."""

_IGNORED_PREFIXES = ("devices.kubevirt.io/",)
"""Extended resources every launcher Pod requests (kvm, tun, vhost-net); never a GPU class's."""

SIDECAR_RESTART_POLICY = "Always"
"""An init container with this `restartPolicy` is a sidecar: it keeps running next to the
Pod's containers (Kubernetes' restartable init container)."""

Units = tuple[tuple[str, int], ...]
"""Units per extended resource, sorted by resource name, only positive counts."""

Excuses = Mapping[tuple[str, str], Mapping[str, int]]
"""One node's excuses: (namespace, VMI uid) -> units per resource its launcher Pods may have
left out (`launcher_excuses`)."""


@dataclass(frozen=True, slots=True)
class PodUse:
    """A Pod bound to a node, trimmed to what capacity needs: its effective extended-resource
    requests (`pod_requests`) and the VMI uid it claims to run (`kubevirt.io/created-by`), if
    any. The claim alone excuses nothing (`foreign_units`)."""

    namespace: str
    name: str
    node: str
    requests: Units
    created_by: str | None = None


def _extended(res: Any) -> bool:
    return isinstance(res, str) and "/" in res and not res.startswith(_IGNORED_PREFIXES)


def _mapping(obj: Any, key: str) -> Mapping[str, Any]:
    got = obj.get(key) if isinstance(obj, Mapping) else None
    return got if isinstance(got, Mapping) else {}


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    got = obj.get(key)
    return got if isinstance(got, list) else []


def _quantities(resources: Mapping[str, Any]) -> dict[str, int]:
    """The positive integer extended-resource quantities of a ResourceList."""
    out: dict[str, int] = {}
    for res, q in resources.items():
        if _extended(res):
            n = parse_quantity_int(q)
            if n is not None and n > 0:
                out[res] = n
    return out


def _container_requests(c: Any) -> dict[str, int]:
    """A container's extended-resource requests; a resource with a limit and no request
    requests its limit (what the API server's defaulting stores)."""
    resources = _mapping(c, "resources")
    return _quantities({**_mapping(resources, "limits"), **_mapping(resources, "requests")})


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for res, n in more.items():
        into[res] = into.get(res, 0) + n


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for res, n in other.items():
        if n > into.get(res, 0):
            into[res] = n


def pod_requests(spec: Mapping[str, Any]) -> Units:
    """The effective extended-resource requests of a Pod `spec` (a dict), as kube-scheduler
    computes them (k8s.io/component-helpers `resource.PodRequests`, the sidecar KEP-753
    formula), per resource:

        max(sum(containers) + sum(sidecars),
            max over init containers i of (i's requests + sum(sidecars before i)))
        + spec.overhead

    where sidecars are the init containers with `restartPolicy: Always` (a sidecar's own
    term, the sidecars up to and including it, never exceeds the first). Pod-level
    `spec.resources` carry cpu, memory and hugepages only, so they never change an extended
    resource. Malformed parts count as nothing; never raises."""
    if not isinstance(spec, Mapping):
        return ()
    total: dict[str, int] = {}
    for c in _list(spec, "containers"):
        _add(total, _container_requests(c))
    sidecars: dict[str, int] = {}   # the sidecars started so far
    init: dict[str, int] = {}       # the most any moment of initialisation needs
    for c in _list(spec, "initContainers"):
        own = _container_requests(c)
        if isinstance(c, Mapping) and c.get("restartPolicy") == SIDECAR_RESTART_POLICY:
            _add(total, own)
            _add(sidecars, own)
            _max(init, sidecars)
        else:
            during = dict(own)
            _add(during, sidecars)
            _max(init, during)
    _max(total, init)
    _add(total, _quantities(_mapping(spec, "overhead")))
    return tuple(sorted((r, n) for r, n in total.items() if n > 0))


def parse_pod_use(obj: Mapping[str, Any]) -> PodUse | None:
    """A Pod dict → PodUse, or None when it is not bound to a node, has ended (phase
    Succeeded or Failed: kube-scheduler no longer counts it), or requests no extended
    resource (`pod_requests`). Never raises for malformed input (None)."""
    if not isinstance(obj, Mapping):
        return None
    meta, spec, status = _mapping(obj, "metadata"), _mapping(obj, "spec"), _mapping(obj, "status")
    node, ns, name = spec.get("nodeName"), meta.get("namespace"), meta.get("name")
    if not (isinstance(node, str) and node and isinstance(ns, str) and isinstance(name, str)):
        return None
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    requests = pod_requests(spec)
    if not requests:
        return None
    created_by = _mapping(meta, "labels").get(CREATED_BY_LABEL)
    return PodUse(ns, name, node, requests,
                  created_by if isinstance(created_by, str) and created_by else None)


def attachment_uid(device: GPUDevice, vmis: Mapping[VMIKey, VMIRecord]) -> str | None:
    """The uid of the VMI incarnation `device`'s attachment belongs to, from what only the
    binder and the API server write: the attachment's recorded `uid` (H2: written by
    earlier versions on one device of a set, and on attachments without an admission id),
    else the uid of the live VMI (in `vmis`, by (namespace, name)) of the attachment's `vmi`
    name (since issue 40 no uid is recorded for an admitted set, so this is the usual case;
    it was already the case for every device of a set but the one linked). None when the
    device is not attached or no such VMI exists. No annotation is read (W7): narrowing the
    excuse to the VMI carrying the attachment's admission id would let a tenant (with the
    policies off) strip that annotation and have its GPUs counted twice. A newer incarnation
    of the name is excused for the older set's devices only until H2 releases them."""
    att = device.status.attached_to
    if att is None:
        return None
    if att.uid:
        return att.uid
    rec = vmis.get((device.namespace, att.vmi))
    return rec.uid if rec is not None and rec.uid else None


def launcher_excuses(node: str, devices: Iterable[GPUDevice], resource_of: Mapping[str, str],
                     vmis: Mapping[VMIKey, VMIRecord]) -> dict[tuple[str, str], dict[str, int]]:
    """The excuses of `node` (W7): for each (namespace, VMI uid), one unit of its class's
    resource (`resource_of`: class name → resource name) per device of `devices` that is
    Bound on `node` and attached to that VMI incarnation (`attachment_uid`). A device whose
    class is unknown excuses nothing (the ledger does not count it either)."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for d in devices:
        if d.bound_node != node:
            continue
        res = resource_of.get(d.class_name)
        uid = attachment_uid(d, vmis)
        if res is None or uid is None:
            continue
        units = out.setdefault((d.namespace, uid), {})
        units[res] = units.get(res, 0) + 1
    return out


def foreign_units(pods: Iterable[PodUse], excuses: Excuses) -> Units:
    """The foreign units of one node's Pods: every Pod's requests, less, per VMI
    incarnation a Pod names (`created_by`, in the Pod's own namespace), at most that
    incarnation's excused units on the node (`launcher_excuses`) in total, however many Pods
    name it. `pods` are the Pods bound to the node `excuses` were made for."""
    total: dict[str, int] = {}
    used: dict[tuple[str, str, str], int] = {}  # (namespace, uid, resource) -> excused so far
    for pod in pods:
        room = excuses.get((pod.namespace, pod.created_by), {}) if pod.created_by else {}
        for res, n in pod.requests:
            key = (pod.namespace, pod.created_by or "", res)
            skip = min(n, max(room.get(res, 0) - used.get(key, 0), 0))
            if skip:
                used[key] = used.get(key, 0) + skip
                n -= skip
            if n:
                total[res] = total.get(res, 0) + n
    return tuple(sorted(total.items()))


def node_foreign(node: str, pods: Iterable[PodUse], devices: Iterable[GPUDevice],
                 resource_of: Mapping[str, str], vmis: Mapping[VMIKey, VMIRecord]) -> Units:
    """`Node.foreign` of `node`: `foreign_units` of its Pods (those of `pods` bound to it)
    against its `launcher_excuses`."""
    return foreign_units((p for p in pods if p.node == node),
                         launcher_excuses(node, devices, resource_of, vmis))
