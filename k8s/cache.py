"""The one shared, read-only cluster cache: informers for every kind the binder, the
webhook and housekeeping read, fed into an `actors.view.IndexedView` of model values.

`ClusterCache.view` is the `ClusterView` + `ChangeFeed` the supervisor and actors use.
Every informer keeps only what the code reads (per-kind ingest transforms below: no
managedFields, no foreign annotations; tenants' own labels dropped). Objects that fail to
parse are left out and logged (on each event or relist that brings
them) as one JSON line naming the object and the field, so one malformed GPUDevice never
blocks the rest.
"""

from __future__ import annotations

import functools
import time
from collections import Counter, OrderedDict
from dataclasses import replace
from typing import Any, Callable

import anyio
import structlog
from anyio.abc import TaskStatus
from kubernetes_asyncio.client import (ApiClient, CoreV1Api, CustomObjectsApi, ResourceV1Api,
                                      ResourceV1beta2Api, SchedulingV1Api)

from actors.view import IndexedView
from k8s.dra_index import DraIndex, SliceError
from k8s.informer import Informer, Key, keep_all, key_of, slim
from model.admission import LauncherDefaults, launcher_defaults
from model.claim import Claim, parse_claim, shared_with
from model.device.records import recorded_on
from model.device.taint_rules import parse_taint_rule
from model.foreign import PodUse, attachment_uid, node_foreign, parse_pod_use
from model.health_mark import MARKS_CONFIGMAP, Mark, parse_marks, parse_rule_mark
from model.housekeeping import VMIRecord, VMIs
from model.nomination import PLURAL, parse_nomination
from model.parse import (ParseError, parse_budgets, parse_gpu_class, parse_gpu_device,
                         parse_namespace, parse_node, parse_permitted_host_devices,
                         parse_priority_class)
from model.types import ADMISSION_ANNOTATION, GROUP, VERSION, GPUClass, GPUDevice, Node

log = structlog.get_logger("gpu_binder.cache")

SETTINGS_NAME = "gpu-settings"
TOMBSTONE_TTL = 600.0
"""Seconds a deleted VMI incarnation's admission id is remembered (H2 without a recorded
uid, which since issue 40 is every admitted set: the tombstone is what releases a set at
once; past this, H1's attachmentGrace has long covered it, and a set whose VMI was deleted
while no replica watched has none and is released after that grace)."""
TOMBSTONE_MAX = 100_000


def slim_tenant_object(obj: dict) -> dict:
    """Ingest transform of tenant-owned kinds (GPUDevices): only our labels and annotations
    are kept (a tenant can fill the others up to the API server's object size)."""
    return slim(obj, foreign_labels=False)


def slim_vmi(obj: dict) -> dict:
    """Ingest transform of VMIs: as `slim_tenant_object`, and without `spec.volumes` (where
    cloud-init user data lives); the rest of spec and status are kept."""
    slim(obj, foreign_labels=False)
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.pop("volumes", None)
    return obj


def slim_node(obj: dict) -> dict:
    """Ingest transform of Nodes: `slim`, and without `status.images` (every image on the
    node) and the volume lists."""
    slim(obj)
    status = obj.get("status")
    if isinstance(status, dict):
        for key in ("images", "volumesInUse", "volumesAttached"):
            status.pop(key, None)
    return obj


def _feed(kind: str, parse: Callable[[dict], Any], put: Callable[[Any], None],
          remove: Callable[[Key], None]) -> Callable[[Key, dict | None], None]:
    """An informer listener: parse the object and put it in the view, or remove it."""

    def listener(key: Key, obj: dict | None) -> None:
        if obj is None:
            remove(key)
            return
        try:
            value = parse(obj)
        except ParseError as exc:
            log.error("skipping malformed object", kind=kind, namespace=key[0] or None,
                      name=key[1], error=str(exc))
            remove(key)
            return
        put(value)

    return listener


def _state_reasons(cs: Any) -> dict:
    """A container status's `state` and `lastState` with only their reasons
    (`{"state": {"waiting": {"reason": "ErrImagePull"}}}`); empty when none has one."""
    out: dict = {}
    for part in ("state", "lastState"):
        states = cs.get(part) if isinstance(cs, dict) else None
        for name, state in (states.items() if isinstance(states, dict) else ()):
            if isinstance(state, dict) and state.get("reason"):
                out.setdefault(part, {})[name] = {"reason": state["reason"]}
    return out


def trim_pod(obj: dict) -> dict:
    """What the Pod informer keeps of a Pod (capacity, §2): name, namespace, resourceVersion,
    the `kubevirt.io/created-by` label, nodeName, phase, and what kube-scheduler's effective
    requests read (`model.foreign.pod_requests`): the containers' and init containers'
    resources, the init containers' `restartPolicy` (sidecars) and `spec.overhead`; of a
    virt-launcher Pod also what `model.health.judge_start` reads (its deletionTimestamp,
    `status.reason`, its `DisruptionTarget` condition (type, status, reason), its
    containers' state reasons)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    labels = meta.get("labels") or {}
    keep = {k: labels[k] for k in ("kubevirt.io/created-by", "kubevirt.io") if k in labels}

    def res(cs, *, init: bool = False):
        out = []
        for c in cs if isinstance(cs, list) else []:
            c = c if isinstance(c, dict) else {}
            box = {"resources": c.get("resources") or {}}
            if init and c.get("restartPolicy") is not None:
                box["restartPolicy"] = c["restartPolicy"]
            out.append(box)
        return out

    kept = {"nodeName": spec.get("nodeName"), "containers": res(spec.get("containers")),
            "initContainers": res(spec.get("initContainers"), init=True)}
    if spec.get("overhead"):
        kept["overhead"] = spec["overhead"]
    status = obj.get("status") or {}
    out = {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                        "resourceVersion": meta.get("resourceVersion"), "labels": keep},
           "spec": kept, "status": {"phase": status.get("phase")}}
    if labels.get("kubevirt.io") == "virt-launcher":  # HL2 reads how a launcher Pod failed
        if meta.get("deletionTimestamp"):
            out["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
        if status.get("reason"):
            out["status"]["reason"] = status["reason"]
        disruption = [{k: c[k] for k in ("type", "status", "reason") if k in c}
                      for c in status.get("conditions") or ()
                      if isinstance(c, dict) and c.get("type") == "DisruptionTarget"]
        if disruption:
            out["status"]["conditions"] = disruption
        for key in ("initContainerStatuses", "containerStatuses"):
            kept_cs = [c for c in map(_state_reasons, status.get(key) or ()) if c]
            if kept_cs:
                out["status"][key] = kept_cs
    return out


def ingest_claim(obj: dict, held: Callable[[Key], Claim | None] | None = None) -> dict:
    """What the ResourceClaim informer keeps (DR2, DR5, DR6, H1/H2/H4): name, namespace and
    resourceVersion, and the claim parsed once (`model.claim.parse_claim`: the typed value
    the DRA index and housekeeping read, `parsed`). Of the spec only its digest; tenants'
    labels and annotations not at all. `held(key)`: the parsed claim the cache holds for
    that key, if any, whose equal strings and devices the new one takes
    (`model.claim.shared_with`: one copy of each, as for a listed claim). Idempotent (the
    watch may hand an ingested object back)."""
    if "parsed" in obj:
        return obj
    meta = obj.get("metadata") or {}
    parsed = parse_claim(obj)
    if held is not None:
        parsed = shared_with(parsed, held(key_of(obj)))
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "resourceVersion")
                         if meta.get(k) is not None},
            "parsed": parsed}


def ingest_slice(obj: dict, parse: Callable[[dict], Any]) -> dict:
    """What the ResourceSlice informer keeps (DR1): name and resourceVersion, and the slice
    parsed once (`parse`: `DraIndex.parse_slice`, the very value the index then holds) or,
    for a malformed one, the reason (`error`). The decoded devices are not kept (1,000 HGX
    slices: `bench.dra_memory`). Idempotent (the watch may hand an ingested object back)."""
    if "parsed" in obj:
        return obj
    meta = obj.get("metadata") or {}
    out: dict = {"metadata": {k: meta.get(k) for k in ("name", "resourceVersion")},
                 "parsed": None, "error": None}
    try:
        out["parsed"] = parse(obj)
    except (SliceError, AttributeError, TypeError) as exc:  # API-valid slices never raise
        out["error"] = str(exc) if isinstance(exc, SliceError) else \
            f"ResourceSlice {meta.get('name')}: malformed: {exc!r}"
    return out


TAINT_RELIST_S = 30.0
"""How often the DeviceTaintRule and suspect-mark informers list again besides their watch
(`Informer.relist_every`, HL1): a few small objects whose miss would place a set on a tainted
GPU. A kube-apiserver restarting under load left a rule made while it came up out of the
watches of the binder and of kube-scheduler (bench soak --mode device, 2026-12-06); this
bounds such a miss to 30 s, and the relist logs it."""


class ClusterCache:
    """Informers for GPUDevices, GPUClasses, Nodes, Namespaces, ResourceQuotas, PriorityClasses, VMIs, bound
    Pods (trimmed, for foreign usage), KubeVirt CRs, the settings ConfigMap, the
    GPUNominations of the settings namespace (P4, `Snapshot.nominations`), the DRA kinds
    (ResourceSlices, ResourceClaims, DeviceClasses, DeviceTaintRules: each rule's taint on the
    devices it selects, DR2) and the ConfigMap `gpu-suspects` (HL2's marks where
    DeviceTaintRules are not served, honoured as rules; `suspects()` reads every mark). Start with
    `await tg.start(cache.run)`: it returns once every informer has listed (the view is
    synced). Raw objects stay readable through the informers (`cache.vmis.get(key)`), model
    values through `cache.view`. Each Node value's `foreign` units come from the Pods on it
    less what the binder's own records excuse (`model.foreign`, W7), recomputed when a Pod
    on it changes, when a device's excuse there changes (Bound there, attached to another
    VMI incarnation, of another class), when the VMI an unlinked attachment names comes or
    goes, and on every GPUClass change. VMI annotations never enter the count."""

    def __init__(self, api: ApiClient, *, settings_namespace: str = "cozy-system",
                 watch_timeout: int = 240) -> None:
        core, custom, resource = CoreV1Api(api), CustomObjectsApi(api), ResourceV1Api(api)
        p = functools.partial
        inf = functools.partial(Informer, watch_timeout=watch_timeout)
        self.devices = inf("gpudevices", p(custom.list_cluster_custom_object, GROUP, VERSION,
                                           "gpudevices"), transform=slim_tenant_object)
        self.classes = inf("gpuclasses", p(custom.list_cluster_custom_object, GROUP, VERSION,
                                           "gpuclasses"))
        self.vmis = inf("virtualmachineinstances", p(custom.list_cluster_custom_object,
                                                     "kubevirt.io", "v1", "virtualmachineinstances"),
                        transform=slim_vmi)
        self.nodes = inf("nodes", core.list_node, transform=slim_node)
        self.pods = inf("pods", p(core.list_pod_for_all_namespaces, field_selector="spec.nodeName!="),
                        transform=trim_pod)
        self.kubevirts = inf("kubevirts", p(custom.list_cluster_custom_object, "kubevirt.io", "v1",
                                            "kubevirts"))
        self.namespaces = inf("namespaces", core.list_namespace)
        self.quotas = inf("resourcequotas", core.list_resource_quota_for_all_namespaces)
        # P1: a VMI's priority is its PriorityClass's (system-*-critical included: they are
        # objects the API server creates), resolved by the webhook and the VM waiting rounds
        self.priority_classes = inf("priorityclasses", SchedulingV1Api(api).list_priority_class,
                                    transform=keep_all)
        self.settings = inf("settings-configmap", p(
            core.list_namespaced_config_map, settings_namespace,
            field_selector=f"metadata.name={SETTINGS_NAME}"), transform=keep_all)
        self.settings_namespace = settings_namespace
        # P4: the binder's nominations, in its own namespace (optional: a cluster upgraded
        # before the CRD was applied reads as none)
        self.nominations = inf("gpunominations", p(custom.list_namespaced_custom_object, GROUP, VERSION,
                                                   settings_namespace, PLURAL), optional=True)
        # DRA (device mode, docs/contract.md §3b): slices, every claim's allocation, DeviceClasses
        # optional: an API the cluster does not serve (resource.k8s.io/v1 before Kubernetes
        # 1.34; docs/install.md supports 1.30) reads as empty instead of never syncing
        self.dra = DraIndex()
        self.slices = inf("resourceslices", resource.list_resource_slice, optional=True,
                          transform=functools.partial(ingest_slice, parse=self.dra.parse_slice))
        self.claims = inf("resourceclaims", resource.list_resource_claim_for_all_namespaces,
                          transform=functools.partial(ingest_claim, held=self._held_claim),
                          optional=True)
        self.device_classes = inf("deviceclasses", resource.list_device_class, transform=keep_all,
                                  optional=True)
        # DR2/HL2: DeviceTaintRules (resource.k8s.io/v1beta2, served behind the off-by-default
        # DRADeviceTaintRules gate: optional) and the binder's own marks where they are not
        # (listed again every TAINT_RELIST_S besides the watch: a rule a watch missed would
        # let a placement land on a tainted device, HL1)
        self.taint_rules = inf("devicetaintrules", ResourceV1beta2Api(api).list_device_taint_rule,
                               optional=True, relist_every=TAINT_RELIST_S)
        self.suspect_marks = inf("suspects-configmap", p(
            core.list_namespaced_config_map, settings_namespace,
            field_selector=f"metadata.name={MARKS_CONFIGMAP}"), transform=keep_all, optional=True,
            relist_every=TAINT_RELIST_S)
        self._mark_rules: set[str] = set()
        self._parsed_classes: dict[str, GPUClass] = {}
        self._warned_problems: dict[str, str] = {}  # GPUClass -> the problem last logged
        self._records: dict[Key, tuple[str, str]] = {}   # device → (node, recorded device)
        self._bad_devices: dict[str, dict[str, tuple[str, ...]]] = {}  # HL3: logged, by node
        self._ghost_nodes: set[str] = set()   # HL3: slices naming no Node, logged
        self.view = IndexedView()
        v = self.view
        v.follow_with(lambda: self.devices.healthy and self.classes.healthy)
        self.devices.add_listener(_feed("GPUDevice", parse_gpu_device, v.put_device,
                                        v.remove_device))
        self.classes.add_listener(_feed("GPUClass", parse_gpu_class, self._put_class,
                                        lambda k: self._remove_class(k[1])))
        self.slices.add_listener(self._on_slice)
        self.claims.add_listener(self._on_claim)
        self.device_classes.add_listener(self._on_device_class)
        self.taint_rules.add_listener(self._on_taint_rule)
        self.suspect_marks.add_listener(self._on_marks)
        # DR1: a list read, even empty, lets `_sync_classes` log the classes' problems
        self.device_classes.add_synced_listener(self._sync_classes)
        self.devices.add_listener(self._on_device_record)
        self._raw_nodes: dict[str, Node] = {}
        self._pod_uses: dict[Key, PodUse] = {}
        self._pods_on: dict[str, set[Key]] = {}
        # W7 excuses: per device, (node, class, VMI uid) of the unit it may excuse there; the
        # devices whose attachment records no uid (every admitted set's since issue 40: no
        # uid link is written), by the VMI (namespace, name) named
        self._excuse_of: dict[Key, tuple[str, str, str]] = {}
        self._unlinked: dict[Key, set[Key]] = {}
        self._unlinked_vmi: dict[Key, Key] = {}
        self._class_resources: dict[str, str] = {}  # GPUClass -> resource name, as excused
        self.devices.add_listener(self._on_device_excuse)   # after the view has the device
        self.classes.add_listener(self._on_class_excuse)
        self.nodes.add_listener(_feed("Node", parse_node, self._put_node, self._remove_node))
        self.pods.add_listener(self._on_pod)
        self.namespaces.add_listener(_feed("Namespace", parse_namespace, v.put_namespace,
                                           lambda k: v.remove_namespace(k[1])))
        self._quota_budgets: dict[Key, list] = {}
        self.quotas.add_listener(self._on_quota)
        self.priority_classes.add_listener(_feed("PriorityClass", parse_priority_class,
                                                 v.put_priority_class,
                                                 lambda k: v.remove_priority_class(k[1])))
        self._vmi_records: dict[Key, VMIRecord] = {}
        self._tombstones: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._vmi_state: VMIs | None = None   # built on demand, dropped on every VMI event
        self._vmi_uids: Counter[tuple[str, str]] = Counter()   # (ns, uid) of the records, kept
        self.nominations.add_listener(_feed("GPUNomination", parse_nomination, v.put_nomination,
                                            lambda k: v.remove_nomination(k[1])))
        self.vmis.add_listener(self._on_vmi)
        self.vmis.add_listener(self._on_vmi_excuse)          # after `_vmi_records` is current

    def _held_claim(self, key: Key) -> Claim | None:
        """The parsed claim the claim informer holds at `key` (`ingest_claim`'s `held`)."""
        return (self.claims.get(key) or {}).get("parsed")

    def _on_vmi(self, key: Key, obj: dict | None) -> None:
        # the uid and admission annotation of every live VMI; an incarnation that goes
        # (a DELETED event, or missing from a relist) leaves a tombstone of its admission id.
        # `vmi_state` is dropped only when a record or a tombstone changes: a VMI's status
        # or spec update (virt-controller's, the phase) leaves it, and the `VMIs.uids`
        # derived from it, as they are (each rebuild copies every live VMI: issue 40)
        old = self._vmi_records.get(key)
        self.view.set_stopping(key[0], key[1], obj is not None and bool(
            (obj.get("metadata") or {}).get("deletionTimestamp")))   # P2: no victim
        if obj is not None:
            meta = obj.get("metadata") or {}
            ann = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
            adm = ann.get(ADMISSION_ANNOTATION)
            rec = VMIRecord(key[0], key[1], str(meta.get("uid") or ""),
                            adm if isinstance(adm, str) and adm else None)
            if rec == old:
                return
            self._vmi_state = None
            self._vmi_records[key] = rec
            self._count_uid(old, -1)
            self._count_uid(rec, 1)
            if old is None or old.uid == rec.uid or not old.admission:
                return
        elif old is None:
            return
        else:
            self._vmi_state = None
            del self._vmi_records[key]
            self._count_uid(old, -1)
        if old is not None and old.admission:
            now = time.monotonic()
            self._tombstones[(key[0], old.admission)] = now
            self._tombstones.move_to_end((key[0], old.admission))
            while self._tombstones and (len(self._tombstones) > TOMBSTONE_MAX or
                                        next(iter(self._tombstones.values())) < now - TOMBSTONE_TTL):
                self._tombstones.popitem(last=False)

    def _count_uid(self, rec: VMIRecord | None, step: int) -> None:
        # `_vmi_uids` follows `_vmi_records`: a uid counted once per record holding it
        if rec is None or not rec.uid:
            return
        key = (rec.namespace, rec.uid)
        n = self._vmi_uids[key] + step
        if n > 0:
            self._vmi_uids[key] = n
        else:
            del self._vmi_uids[key]

    def vmi_state(self) -> VMIs:
        """H2/W1: the live VMIs (uid, admission annotation) and the admission ids of VMI
        incarnations this replica saw deleted in the last `TOMBSTONE_TTL` seconds (an
        immutable value, rebuilt only after a VMI event: admissions share it), with their
        uids (`VMIs.uids`) copied from the set kept as the records change, not derived by
        walking every record (issue 40)."""
        if self._vmi_state is None:
            self._vmi_state = VMIs.with_uids(dict(self._vmi_records), frozenset(self._tombstones),
                                             frozenset(self._vmi_uids))
        return self._vmi_state

    def healthy(self, *informers: Informer) -> bool:
        """True when every informer given (default: all) follows the API server."""
        return all(i.healthy for i in (informers or self.informers))

    def _on_quota(self, key: Key, obj: dict | None) -> None:
        # a namespace's budget is the smallest hard over all its quotas
        if obj is None:
            self._quota_budgets.pop(key, None)
        else:
            try:
                budgets = parse_budgets(obj)
                if self._quota_budgets.get(key) != budgets:  # equal: the view keeps the old
                    self._quota_budgets[key] = budgets
            except ParseError as exc:
                log.error("skipping malformed object", kind="ResourceQuota",
                          namespace=key[0], name=key[1], error=str(exc))
                self._quota_budgets.pop(key, None)
        ns = key[0]
        merged = [b for (qns, _), bs in self._quota_budgets.items() if qns == ns for b in bs]
        self.view.set_budgets(ns, merged)

    # -- foreign usage (§2 capacity) ------------------------------------------------------
    def _put_node(self, node: Node) -> None:
        old = self._raw_nodes.get(node.name)
        if old == node:   # the view may keep a value built from `old`: one copy, not two
            node = old
        self._raw_nodes[node.name] = node
        self._refresh_node(node.name)
        self._ghost_nodes.discard(node.name)

    def _remove_node(self, key: Key) -> None:
        self._raw_nodes.pop(key[1], None)
        self.view.remove_node(key[1])
        self._bad_devices.pop(key[1], None)
        self._log_ghost_nodes({key[1]})  # HL3: its slices, if any, now name no node

    def _refresh_node(self, name: str) -> None:
        node = self._raw_nodes.get(name)
        if node is None:
            return
        pods = (self._pod_uses[k] for k in self._pods_on.get(name, ()))
        resource_of = {c.name: c.resource_name for c in self.view.classes().values()}
        on_node = self.view.devices_on(name)
        foreign = node_foreign(name, pods, on_node, resource_of, self._vmi_records)
        dra = self.dra.node_fields(name, [d for d in on_node if d.bound_node == name])
        self._log_bad_devices(name, dra.class_devices)
        if dra.class_devices or dra.allocatable:
            mine = {r for r, _ in dra.allocatable}
            merged = dict(foreign)
            for res, n in dra.foreign:
                merged[res] = merged.get(res, 0) + n
            node = replace(node,
                           allocatable=tuple(sorted([*((r, q) for r, q in node.allocatable if r not in mine),
                                                     *dra.allocatable])),
                           class_devices=dra.class_devices, taken_devices=dra.taken_devices,
                           foreign_claimed=dra.foreign_claimed)
            foreign = tuple(sorted((r, n) for r, n in merged.items() if n))
        self.view.put_node(replace(node, foreign=foreign))

    # -- device mode (DR1, DR2) ---------------------------------------------------------------
    def _refresh_nodes(self, names: set[str]) -> None:
        for name in sorted(names):
            self._refresh_node(name)
        self._log_ghost_nodes(names)
        for selector_of, device, error in self.dra.drain_errors():
            log.warning("device selector failed; the device does not match", selector_of=selector_of,
                        device=device, error=error[:300])

    def _log_bad_devices(self, node: str, class_devices) -> None:
        """HL3 bad input: one JSON line per device of a device-mode class on `node` that is
        published without any attribute, or with attributes of the wrong type (left out,
        `SliceDevice.malformed`), when first seen so (not on every refresh of the node)."""
        bad = {d.ref.device: d.malformed for _, devs in class_devices for d in devs
               if d.malformed or not d.attributes}
        seen = self._bad_devices.get(node, {})
        for device, malformed in sorted(bad.items()):
            if seen.get(device) == malformed:
                continue
            if malformed:
                log.warning("device attributes of the wrong type left out", node=node,
                            device=device, attributes=list(malformed))
            else:
                log.warning("device published without attributes: in no group of a class "
                            "with a topology constraint (lost, attribute-lost)", node=node,
                            device=device)
        if bad:
            self._bad_devices[node] = bad
        else:
            self._bad_devices.pop(node, None)

    def _log_ghost_nodes(self, names: set[str]) -> None:
        """HL3 bad input: one JSON line when a ResourceSlice names a node that does not exist
        (its devices are on no node: not counted, never placed), naming the node and devices."""
        for name in sorted(names):
            devices = () if name in self._raw_nodes else self.dra.devices(name)
            if not devices:
                self._ghost_nodes.discard(name)
            elif name not in self._ghost_nodes:
                self._ghost_nodes.add(name)
                log.warning("ResourceSlice names a node that does not exist; its devices are "
                            "not counted", node=name,
                            devices=[str(d.ref) for d in devices[:16]], count=len(devices))

    def _put_class(self, cls: GPUClass) -> None:
        self._parsed_classes[cls.name] = cls
        self._sync_classes()

    def _remove_class(self, name: str) -> None:
        self._parsed_classes.pop(name, None)
        self.view.remove_class(name)
        self._sync_classes()

    def _sync_classes(self) -> None:
        """Put every GPUClass into the view with its device-mode problem (a DeviceClass that
        does not exist, a selector that does not compile: DR1) and recompute the nodes whose
        device-mode fields that changes."""
        effective = []
        for cls in self._parsed_classes.values():
            problem = cls.problem or self.dra.class_problem(cls)
            eff = cls if problem == cls.problem else replace(cls, problem=problem)
            if self.view.classes().get(cls.name) != eff:
                self.view.put_class(eff)
            # logged once per problem, and only once the DeviceClasses are read (listed, even
            # empty or not served: then this runs again): before that every device-mode
            # class "names a DeviceClass that does not exist"
            if not problem or problem == cls.problem:
                self._warned_problems.pop(cls.name, None)
            elif self.device_classes.healthy and self._warned_problems.get(cls.name) != problem:
                self._warned_problems[cls.name] = problem
                log.warning("GPUClass cannot serve", gpu_class=cls.name, problem=problem)
            effective.append(eff)
        self._refresh_nodes(self.dra.set_classes(effective))

    def _on_slice(self, key: Key, obj: dict | None) -> None:
        if obj is not None and obj["parsed"] is not None:
            touched = self.dra.put_slice(obj["parsed"])
        else:
            if obj is not None:
                log.error("skipping malformed object", kind="ResourceSlice", name=key[1],
                          error=obj["error"])
            touched = self.dra.remove_slice(key[1])
        self._refresh_nodes(touched)

    def _on_claim(self, key: Key, obj: dict | None) -> None:
        try:
            touched = (self.dra.put_claim(key, obj["parsed"]) if obj is not None
                       else self.dra.remove_claim(key))
        except SliceError as exc:
            log.error("skipping malformed object", kind="ResourceClaim", namespace=key[0],
                      name=key[1], error=str(exc))
            touched = self.dra.remove_claim(key)
        self._refresh_nodes(touched)

    def _on_device_class(self, key: Key, obj: dict | None) -> None:
        touched = (self.dra.put_device_class(obj) if obj is not None
                   else self.dra.remove_device_class(key[1]))
        self._sync_classes()
        self._refresh_nodes(touched)

    def _on_taint_rule(self, key: Key, obj: dict | None) -> None:
        try:
            touched = (self.dra.put_rule(parse_taint_rule(obj)) if obj is not None
                       else self.dra.remove_rule(key[1]))
        except SliceError as exc:
            log.error("skipping malformed object", kind="DeviceTaintRule", name=key[1], error=str(exc))
            touched = self.dra.remove_rule(key[1])
        self._refresh_nodes(touched)

    def _on_marks(self, key: Key, obj: dict | None) -> None:
        """The binder's ConfigMap of marks (HL2, where DeviceTaintRules are not served): each
        entry taints its device for the binder's own placements."""
        rules = {m.taint_rule() for m in parse_marks(obj)}
        touched: set[str] = set()
        for name in self._mark_rules - {r.name for r in rules}:
            touched |= self.dra.remove_rule(name)
        for rule in rules:
            touched |= self.dra.put_rule(rule)
        self._mark_rules = {r.name for r in rules}
        self._refresh_nodes(touched)

    def suspects(self) -> tuple[Mark, ...]:
        """HL2: every suspected device as marked, the binder's DeviceTaintRules and the
        entries of its ConfigMap, sorted by name."""
        found = [m for m in map(parse_rule_mark, self.taint_rules.items()) if m is not None]
        cm = self.suspect_marks.items()
        found += parse_marks(cm[0] if cm else None)
        return tuple(sorted(found, key=lambda m: (m.name, m.kind)))

    def rules_selecting_nothing(self) -> tuple[str, ...]:
        """The DeviceTaintRules (names, sorted) whose selector picks no device any
        ResourceSlice publishes now: they change no placement (DR2), and `gpu-binder top`
        names them (the binder's own ConfigMap marks are not rules and are left out)."""
        return tuple(n for n in self.dra.rules_selecting_nothing() if n not in self._mark_rules)

    def _on_device_record(self, key: Key, obj: dict | None) -> None:
        """A GPUDevice's `status.device` record on its node excuses that device from the
        node's DRA `foreign` count (DR2): refresh the nodes where it was and is."""
        on = recorded_on(self.view.device(key)) if obj is not None else None
        rec = (on[0], on[1].device) if on is not None and on[0] else None
        old = self._records.pop(key, None)
        if rec is not None:
            self._records[key] = rec  # type: ignore[assignment]
        if old != rec:
            self._refresh_nodes({r[0] for r in (old, rec) if r is not None} & self.dra.nodes())

    def _on_pod(self, key: Key, obj: dict | None) -> None:
        # a key already held stays (not popped and put back): `key` is the event's tuple,
        # the one held the list's, and both would live on (issue 41 item 5)
        old = self._pod_uses.get(key)
        use = parse_pod_use(obj) if obj is not None else None
        moved = old is None or use is None or old.node != use.node
        if old is not None and moved:
            self._pods_on.get(old.node, set()).discard(key)
        if use is None:
            self._pod_uses.pop(key, None)
        else:
            self._pod_uses[key] = use
            if moved:
                self._pods_on.setdefault(use.node, set()).add(key)
        for node in {u.node for u in (old, use) if u is not None}:
            self._refresh_node(node)

    def _recount_device(self, key: Key, dev: GPUDevice | None) -> None:
        """Refresh the nodes where device `key`'s excuse (W7) was or is, when it changed."""
        new = None
        if dev is not None and dev.bound_node is not None:
            uid = attachment_uid(dev, self._vmi_records)
            if uid is not None:
                new = (dev.bound_node, dev.class_name, uid)
        old = self._excuse_of.get(key)   # a key held stays (as `_on_pod` says)
        if new is not None:
            self._excuse_of[key] = new
        elif old is not None:
            del self._excuse_of[key]
        if old != new:
            for node in {e[0] for e in (old, new) if e is not None}:
                self._refresh_node(node)

    def _on_device_excuse(self, key: Key, obj: dict | None) -> None:
        """A GPUDevice changed (the view already has its model value, or has dropped it)."""
        dev = self.view.device(key) if obj is not None else None
        was = self._unlinked_vmi.pop(key, None)
        if was is not None:
            bucket = self._unlinked.get(was)
            if bucket is not None:
                bucket.discard(key)
                if not bucket:
                    del self._unlinked[was]
        att = dev.status.attached_to if dev is not None else None
        if att is not None and not att.uid:
            vmi = (key[0], att.vmi)
            self._unlinked_vmi[key] = vmi
            self._unlinked.setdefault(vmi, set()).add(key)
        self._recount_device(key, dev)

    def _on_vmi_excuse(self, key: Key, obj: dict | None) -> None:
        """A VMI came, went or changed: the devices whose attachment names it without a
        recorded uid may now excuse for another incarnation (or none)."""
        for dkey in tuple(self._unlinked.get(key, ())):
            self._recount_device(dkey, self.view.device(dkey))

    def _on_class_excuse(self, key: Key, obj: dict | None) -> None:
        """A GPUClass changed: its resource name decides what its devices excuse, so the
        nodes with an excuse are refreshed when some class's resource name changed (one
        came, went or names another resource). Any other update (its status: conditions,
        the waiting line; a selector, whose nodes `_sync_classes` refreshes) refreshes none:
        each refresh walks every excusing node (issue 40: 38 ms at 1,000 HGX boards)."""
        resource_of = {c.name: c.resource_name for c in self.view.classes().values()}
        if resource_of == self._class_resources:
            return
        self._class_resources = resource_of
        for name in {e[0] for e in self._excuse_of.values()}:
            self._refresh_node(name)

    def permitted_resources(self) -> frozenset[str] | None:
        """The resource names KubeVirt permits as host devices (the union over KubeVirt CRs
        of `spec.configuration.permittedHostDevices`), or None when no KubeVirt CR exists."""
        crs = self.kubevirts.items()
        if not crs:
            return None
        out: set[str] = set()
        for cr in crs:
            out |= parse_permitted_host_devices(cr)
        return frozenset(out)

    def launcher_defaults(self) -> LauncherDefaults:
        """What virt-controller adds to every launcher Pod's nodeSelector, from the KubeVirt
        CR (`model.admission.launcher_defaults`; empty without a CR)."""
        return launcher_defaults(self.kubevirts.items())

    @property
    def informers(self) -> tuple[Informer, ...]:
        """Every informer of the cache."""
        return (self.namespaces, self.device_classes, self.classes, self.nodes, self.slices,
                self.claims, self.taint_rules, self.suspect_marks, self.quotas,
                self.priority_classes, self.devices, self.vmis, self.pods, self.kubevirts,
                self.settings, self.nominations)

    async def run(self, *, task_status: TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every informer; report started once all have synced. Runs until cancelled."""
        async with anyio.create_task_group() as tg:
            for informer in self.informers:
                await tg.start(informer.run)
            task_status.started()

    async def read_once(self) -> None:
        """List every informer once, concurrently, without watching: the view then holds the
        cluster as it was (for `gpu-binder explain`/`what-if`/`top`). Read-only. Raises the
        first `k8s.errors.ApiError` (e.g. Forbidden) or transport error; a kind the server
        does not know (404: its CRD is not installed, e.g. no KubeVirt) is read as empty."""
        from k8s.errors import NotFound

        failed: list[Exception] = []

        async def one(informer: Informer) -> None:
            try:
                await informer.list_once()
            except NotFound:
                pass
            except Exception as exc:  # noqa: BLE001 - raised below, the first one as it is
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            for informer in self.informers:
                tg.start_soon(one, informer)
        if failed:
            raise failed[0]

    def vmi_keys(self) -> set[Key]:
        """(namespace, name) of every VMI that exists now."""
        return self.vmis.keys()
