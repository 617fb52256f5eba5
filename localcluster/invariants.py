"""The invariants of docs/contract.md §7 (and what housekeeping §5 promises once churn stops), checked
against a real API server: one read of the cluster (`snapshot`, pure reads through
kubernetes_asyncio), then pure checks on it (`check`, `leftovers`) that return typed
`Violation`s naming the object each concerns. Count-mode capacity and budgets are checked
per extended resource; device-mode classes (no `spec.resourceName`, docs/contract.md §3b) are checked
for DR6's "no device on two records" (their capacity is in ResourceSlices, not on Nodes). Used by the upgrade tests and the soak
(`bench/soak.py`, `tests/e2e/test_soak.py`).

Two moments:
- *while churn runs* (`check(snap, settled=...)`): what must hold at every instant —
  §7.1 no node over allocatable, §7.3 `Succeeded` ⇒ Bound on the result node, §7.4 no tenant
  over budget, §7.5 no device named by two VMIs, and for the VMIs the caller knows to be
  admitted and not being deleted (`settled`): their whole set Bound on their pin.
- *after settling* (`leftovers` empty, then `check(snap, final=True)`): also no device
  attached to a VMI that does not exist and no template device without its VMI (H1/H2),
  every request with a result (§7.2), every existing VMI of ours checked as admitted
  (§7.5), and every launcher Pod of an admitted VMI bound on its pinned node (§2 capacity,
  B3: what the binder placed is where kube-scheduler runs it).

And §3c P6 over the GPUNominations the read lists (`check_nominations`, at every instant):
the room of a live nomination is Bound for nobody but its preemptor and its victims (count
mode: its units fit on its node beside every other set; device mode: each nominated DRA device
is recorded by nobody else); (`check_gone`) no VMI of ours the caller knew is gone unless
the caller deleted it or a nomination seen named it a victim (given when the VMI was last
read alive, one that was still live then); and (`check_line_order`, over a window of
reads) no set started on a node where a set of strictly higher priority the caller knows to
be waiting in line could have started, and nowhere after (count mode by units; device mode by
DR3's groups of the devices the reads' ResourceSlices publish, `snapshot(..., dra=True)`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Sequence

GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"
KV = ("kubevirt.io", "v1", "virtualmachineinstances")
ANNOTATION_PREFIX = "gpu.cozystack.io/"
TEMPLATE_LABEL = "gpu.cozystack.io/template-for"
PIN_LABEL = "kubernetes.io/hostname"
CREATED_BY = "kubevirt.io/created-by"

# Violation kinds, with the contract item each breaks
NODE_OVER = "node-over-allocatable"          # §7.1
NO_RESULT = "request-without-result"         # §7.2 (after settling only)
SUCCEEDED_NOT_BOUND = "succeeded-not-bound"  # §7.3
TENANT_OVER = "tenant-over-budget"           # §7.4
DOUBLE_NAMED = "device-named-twice"          # §7.5 (no device attached to two VMIs)
DOUBLE_RECORDED = "device-recorded-twice"    # DR6 (no DRA device on two Bound records)
ADMITTED_NOT_PLACED = "admitted-not-placed"  # §7.5 (whole set Succeeded on the pin)
ATTACHED_TO_GONE = "attached-to-missing-vmi" # H1/H2 (after settling only)
TEMPLATE_ORPHAN = "template-without-vmi"     # H1/H2 (after settling only)
LAUNCHER_OFF_PIN = "launcher-not-on-pin"     # §2/B3 (after settling only)
ADMITTED_GONE = "admitted-vmi-gone"          # a VMI the caller holds as admitted is missing
NOMINATED_TAKEN = "nominated-room-taken"     # 3c.P6 (a live nomination's room Bound for another set)
STOPPED_NOT_VICTIM = "vmi-gone-not-victim"   # 3c.P6 (a VMI of ours gone: not deleted by the caller, no victim)
LINE_INVERSION = "lower-priority-start"      # 3c.P6 (a set started on room a waiting higher-priority set could use)
ITEMS = {NODE_OVER: "7.1", NO_RESULT: "7.2", SUCCEEDED_NOT_BOUND: "7.3", TENANT_OVER: "7.4",
         DOUBLE_NAMED: "7.5", DOUBLE_RECORDED: "3b.DR6", ADMITTED_NOT_PLACED: "7.5", ATTACHED_TO_GONE: "5.H1/H2",
         TEMPLATE_ORPHAN: "5.H1/H2", LAUNCHER_OFF_PIN: "2/B3", ADMITTED_GONE: "7.5",
         NOMINATED_TAKEN: "3c.P6", STOPPED_NOT_VICTIM: "3c.P6", LINE_INVERSION: "3c.P6"}
LIVE_SLACK = timedelta(seconds=5)
"""A nomination counts as live for `check_nominations` only when it expires more than this
after the read: the binder's clock and the moment of its decision are not the reader's."""
# kinds that mean an admission's devices are not where its answer said (counted as "lost")
LOST_KINDS = frozenset({ADMITTED_NOT_PLACED, SUCCEEDED_NOT_BOUND, ADMITTED_GONE,
                        LAUNCHER_OFF_PIN})


@dataclass(frozen=True)
class Violation:
    """One broken invariant. `kind` one of the module's kind constants, `item` the contract
    item it breaks, `obj` the object it concerns as (kind, namespace or "", name[, resource]),
    `message` what was seen."""

    kind: str
    obj: tuple
    message: str

    @property
    def item(self) -> str:
        return ITEMS[self.kind]

    @property
    def key(self) -> tuple:
        """(kind, obj): the same breakage seen by two samples has the same key."""
        return (self.kind, self.obj)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "item": self.item, "obj": list(self.obj),
                "message": self.message[:400]}


DRA = "resource.k8s.io"
"""The API group of ResourceSlices, DeviceClasses, ResourceClaims (v1) and DeviceTaintRules
(v1beta2), read for device mode (`DraRead`)."""


@dataclass(frozen=True)
class DraRead:
    """What one read gives of device mode (docs/contract.md §3b DR1, DR2), the API's dicts:
    `classes` the device-mode GPUClasses (`spec.deviceClassName`), `device_classes` the
    DeviceClasses, `slices` the ResourceSlices, `claims` the ResourceClaims of every namespace
    (another's allocation takes a device, DR2), `rules` the DeviceTaintRules (None: the API
    does not serve them, so the binder keeps its HL2 marks in a ConfigMap this read does not
    see, and which devices are tainted is unknown)."""

    classes: tuple[dict, ...] = ()
    device_classes: tuple[dict, ...] = ()
    slices: tuple[dict, ...] = ()
    claims: tuple[dict, ...] = ()
    rules: tuple[dict, ...] | None = ()


@dataclass
class Snapshot:
    """One read of the cluster. `vmis`, `devices`: the API's dicts; `resource`: GPUClass ->
    resource name; `allocatable`: node -> {resource: int}; `budget`: (namespace, resource) ->
    the smallest quota `requests.<resource>`; `pods`: VMI uid -> the nodeName of its launcher
    Pod ("" while unbound), when read (`snapshot(..., pods=True)`), else None.
    `nominations`: the GPUNominations (§3c P4), listed before everything else (so the devices
    read show the state after each was made); `late_nominations`: listed again after
    everything (victims of nominations made during the read); `at`: when the read ended
    (UTC; None: unknown, every nomination counts as live); `started`: when it began (UTC;
    None: unknown); `placeable`: the nodes a set with no tolerations may use (not cordoned,
    Ready, no NoSchedule or NoExecute taint; None: not read); `dra`: device mode's objects
    (`DraRead`, `snapshot(..., dra=True)`; None: not read, device-mode sets are then not
    judged by `check_line_order`)."""

    vmis: list[dict]
    devices: list[dict]
    resource: dict[str, str]
    allocatable: dict[str, dict[str, int]]
    budget: dict[tuple[str, str], int]
    pods: dict[str, str] | None = None
    nominations: list[dict] = field(default_factory=list)
    late_nominations: list[dict] = field(default_factory=list)
    at: datetime | None = None
    started: datetime | None = None
    placeable: frozenset[str] | None = None
    dra: DraRead | None = None

    def within(self, prefix: str) -> "Snapshot":
        """The VMIs, devices, budgets and Pods of namespaces named `prefix`… only (the
        soak's own, on a control plane other tests share; nodes, classes and `dra` as read:
        another namespace's claim takes a device as well)."""
        vmis = [v for v in self.vmis if v["metadata"]["namespace"].startswith(prefix)]
        uids = {v["metadata"].get("uid") for v in vmis}
        return Snapshot(
            vmis=vmis,
            devices=[d for d in self.devices if d["metadata"]["namespace"].startswith(prefix)],
            resource=self.resource, allocatable=self.allocatable,
            budget={k: v for k, v in self.budget.items() if k[0].startswith(prefix)},
            pods=None if self.pods is None else {u: n for u, n in self.pods.items() if u in uids},
            nominations=[n for n in self.nominations if _concerns(n, prefix)],
            late_nominations=[n for n in self.late_nominations if _concerns(n, prefix)], at=self.at,
            started=self.started, placeable=self.placeable, dra=self.dra)

    @property
    def existing(self) -> set[tuple[str, str]]:
        return {(v["metadata"]["namespace"], v["metadata"]["name"]) for v in self.vmis}


def _int(v) -> int | None:
    return int(v) if isinstance(v, str) and v.isdigit() else (v if isinstance(v, int) else None)


def _too_many(exc: BaseException) -> bool:
    """A 429 (flow control, or "storage is (re)initializing" while a CRD's storage is
    rebuilt, as a chart upgrade that changes the CRD does): to be retried after a pause."""
    return getattr(exc, "status", None) == 429


async def _listed(call, *args, **kw):
    """`await call(*args, **kw)`, a 429 answer retried with tenacity (exponential pauses from
    0.2 s, at most 2 s apart, for at most 20 s; then the 429 is raised)."""
    from tenacity import (AsyncRetrying, retry_if_exception, stop_after_delay,
                          wait_exponential)

    async for attempt in AsyncRetrying(retry=retry_if_exception(_too_many),
                                       wait=wait_exponential(multiplier=0.2, max=2),
                                       stop=stop_after_delay(20), reraise=True):
        with attempt:
            return await call(*args, **kw)


async def _nominations(custom_list, **kw) -> list[dict]:
    """Every GPUNomination (any namespace); none when the API has no such resource (a chart
    older than §3c, as the upgrade tests install first)."""
    from kubernetes_asyncio.client import ApiException

    try:
        return (await _listed(custom_list, GROUP, VERSION, "gpunominations", **kw))["items"]
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise


async def _dra_read(custom_list, classes: list[dict], **kw) -> DraRead:
    """Device mode's objects (`DraRead`): the device-mode GPUClasses of `classes`, then the
    DeviceClasses, ResourceSlices, ResourceClaims and DeviceTaintRules (None when the API
    does not serve them: 404)."""
    from kubernetes_asyncio.client import ApiException

    async def items(version: str, plural: str) -> tuple[dict, ...]:
        return tuple((await _listed(custom_list, DRA, version, plural, **kw))["items"])

    device_classes = await items("v1", "deviceclasses")
    slices = await items("v1", "resourceslices")
    claims = await items("v1", "resourceclaims")
    try:
        rules: tuple[dict, ...] | None = await items("v1beta2", "devicetaintrules")
    except ApiException as exc:
        if exc.status != 404:
            raise
        rules = None
    return DraRead(tuple(c for c in classes
                         if isinstance((c.get("spec") or {}).get("deviceClassName"), str)),
                   device_classes, slices, claims, rules)


async def snapshot(api, *, pods: bool = False, dra: bool = False, timeout: float = 30) -> Snapshot:
    """Read GPUNominations, VMIs, GPUDevices, GPUClasses, Nodes, ResourceQuotas (and, with
    `pods`, the Pods labelled `kubevirt.io/created-by`; with `dra`, device mode's objects,
    `DraRead`), then GPUNominations again, through `api` (a kubernetes_asyncio ApiClient with
    list rights on them). A 429 is retried for up
    to 20 s (`_listed`: a CRD's storage re-initializing during a chart upgrade answers so).
    Raises ApiException / aiohttp errors as the client does."""
    from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

    custom, core = CustomObjectsApi(api), CoreV1Api(api)
    kw = {"_request_timeout": timeout}
    started = datetime.now(timezone.utc)
    custom_list = custom.list_cluster_custom_object
    nominations = await _nominations(custom_list, **kw)
    vmis = (await _listed(custom_list, *KV, **kw))["items"]
    devices = (await _listed(custom_list, GROUP, VERSION, "gpudevices", **kw))["items"]
    classes = (await _listed(custom_list, GROUP, VERSION, "gpuclasses", **kw))["items"]
    nodes = (await _listed(core.list_node, **kw)).items
    quotas = (await _listed(core.list_resource_quota_for_all_namespaces, **kw)).items
    budget: dict[tuple[str, str], int] = {}
    for q in quotas:
        for k, v in (q.spec.hard or {}).items():
            n, key = _int(v), (q.metadata.namespace, k.removeprefix("requests."))
            if n is not None and k.startswith("requests."):
                budget[key] = min(n, budget.get(key, n))
    snap = Snapshot(
        vmis=vmis, devices=devices,
        resource={c["metadata"]["name"]: c["spec"]["resourceName"] for c in classes
                  if isinstance((c.get("spec") or {}).get("resourceName"), str)},
        allocatable={n.metadata.name: {k: _int(v) for k, v in (n.status.allocatable or {}).items()
                                       if _int(v) is not None} for n in nodes},
        budget=budget, nominations=nominations, started=started,
        placeable=frozenset(n.metadata.name for n in nodes if _placeable(n)))
    if pods:
        got = await _listed(core.list_pod_for_all_namespaces, label_selector=CREATED_BY, **kw)
        snap.pods = {p.metadata.labels[CREATED_BY]: p.spec.node_name or "" for p in got.items
                     if p.metadata.deletion_timestamp is None}
    if dra:
        snap.dra = await _dra_read(custom_list, classes, **kw)
    snap.late_nominations = await _nominations(custom_list, **kw)
    snap.at = datetime.now(timezone.utc)
    return snap


def _placeable(node) -> bool:
    """A Node (kubernetes_asyncio's V1Node) a set with no tolerations may use: not cordoned,
    Ready, no NoSchedule or NoExecute taint."""
    spec, status = node.spec, node.status
    if spec is not None and (spec.unschedulable or any(
            t.effect in ("NoSchedule", "NoExecute") for t in spec.taints or [])):
        return False
    return any(c.type == "Ready" and c.status == "True"
               for c in (status.conditions if status is not None else None) or [])


def ours(vmi: dict) -> bool:
    """A VMI asking the binder for GPUs (one of our annotations)."""
    return any(k.startswith(ANNOTATION_PREFIX) for k in vmi["metadata"].get("annotations") or {})


def check(snap: Snapshot, *, settled: set[tuple[str, str]] | None = None,
          final: bool = False, victims: Iterable[tuple[str, str]] = ()) -> list[Violation]:
    """What breaks §7 in `snap`. `settled`: the (namespace, name) of VMIs the caller holds as
    admitted and not being deleted across the whole read — each must have its whole set
    Bound on its pin, attached to it, request `Succeeded` there (§7.5); with `final`, every
    VMI of ours in the snapshot is so checked, each must exist when named in `settled`, and
    (when `snap.pods` was read) its launcher Pod must be bound on its pin. `victims`: the
    (namespace, name) of VMIs a nomination named victims (§3c P4: being stopped, or gone, by
    the binder's right), excused from the checks of `settled` (`check_gone` judges them), as
    are the victims of `snap`'s own nominations. Pure."""
    excused = set(victims) | victims_of([*snap.nominations, *snap.late_nominations])
    if settled is not None and excused:
        settled = settled - excused
    out: list[Violation] = []
    devs = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in snap.devices}
    named: Counter = Counter()
    exists = snap.existing
    for vmi in snap.vmis:
        ns, name = vmi["metadata"]["namespace"], vmi["metadata"]["name"]
        gpus = [g["name"] for g in (vmi["spec"].get("domain") or {}).get("devices", {}).get("gpus") or []]
        named.update((ns, g) for g in gpus)
        if not ours(vmi):
            continue
        if not final and (settled is None or (ns, name) not in settled):
            continue
        pin = (vmi["spec"].get("nodeSelector") or {}).get(PIN_LABEL)
        for g in gpus or [None]:
            st = (devs.get((ns, g)) or {}).get("status") or {}
            br = st.get("bindRequest") or {}
            ok = (pin and g and st.get("phase") == "Bound" and st.get("nodeName") == pin
                  and (st.get("attachedTo") or {}).get("vmi") == name
                  and br.get("result") == "Succeeded" and br.get("node") == pin)
            if not ok:
                out.append(Violation(ADMITTED_NOT_PLACED, ("VirtualMachineInstance", ns, name),
                                     f"pin {pin}: device {g} status {st}"))
        if final and snap.pods is not None:
            uid = vmi["metadata"].get("uid")
            on = snap.pods.get(uid)
            if on != pin:
                out.append(Violation(LAUNCHER_OFF_PIN, ("VirtualMachineInstance", ns, name),
                                     f"pin {pin}: launcher Pod on {on!r}"))
    if final and settled:
        for ns, name in sorted(settled - exists):
            out.append(Violation(ADMITTED_GONE, ("VirtualMachineInstance", ns, name),
                                 "admitted, never deleted, not in the API"))
    for (ns, g), n in sorted(named.items()):
        if n > 1:
            out.append(Violation(DOUBLE_NAMED, ("GPUDevice", ns, g), f"named by {n} VMIs"))
    bound_node: Counter = Counter()
    bound_tenant: Counter = Counter()
    recorded: dict[tuple, list[str]] = {}
    for (ns, name), d in devs.items():
        st = d.get("status") or {}
        rec = st.get("device")
        if st.get("phase") == "Bound" and isinstance(rec, dict):
            ref = (rec.get("driver"), rec.get("pool"), rec.get("device"))
            recorded.setdefault(ref, []).append(f"{ns}/{name}")
        res = snap.resource.get((d.get("spec") or {}).get("class"))
        if st.get("phase") == "Bound" and res:
            bound_node[(st.get("nodeName"), res)] += 1
            bound_tenant[(ns, res)] += 1
        br = st.get("bindRequest") or {}
        if br.get("result") == "Succeeded" and (st.get("phase"), st.get("nodeName")) != (
                "Bound", br.get("node")):
            out.append(Violation(SUCCEEDED_NOT_BOUND, ("GPUDevice", ns, name),
                                 f"Succeeded on {br.get('node')} but {st.get('phase')} "
                                 f"on {st.get('nodeName')}"))
    for ref, holders in sorted(recorded.items(), key=str):
        if len(holders) > 1:
            out.append(Violation(DOUBLE_RECORDED, ("Device", "", "/".join(map(str, ref))),
                                 f"recorded by {len(holders)} Bound GPUDevices: {', '.join(sorted(holders))}"))
    for (node, res), n in sorted(bound_node.items(), key=str):
        cap = snap.allocatable.get(node, {}).get(res, 0)
        if n > cap:
            out.append(Violation(NODE_OVER, ("Node", "", node, res),
                                 f"{n} Bound of {res} > allocatable {cap}"))
    for (ns, res), n in sorted(bound_tenant.items()):
        if (ns, res) in snap.budget and n > snap.budget[(ns, res)]:
            out.append(Violation(TENANT_OVER, ("Namespace", "", ns, res),
                                 f"{n} Bound of {res} > budget {snap.budget[(ns, res)]}"))
    return out


def _concerns(nomination: dict, prefix: str) -> bool:
    """The nomination's preemptor or one of its victims is in a namespace named `prefix`…."""
    spec = nomination.get("spec") or {}
    spaces = [(spec.get("preemptor") or {}).get("namespace")]
    spaces += [v.get("namespace") for v in spec.get("victims") or [] if isinstance(v, dict)]
    return any(isinstance(ns, str) and ns.startswith(prefix) for ns in spaces)


def victims_of(nominations: Iterable[dict]) -> set[tuple[str, str]]:
    """The (namespace, name) of every VMI the GPUNominations `nominations` name victims."""
    out = set()
    for n in nominations:
        for v in (n.get("spec") or {}).get("victims") or []:
            if isinstance(v, dict) and isinstance(v.get("namespace"), str) and isinstance(v.get("vmi"), str):
                out.add((v["namespace"], v["vmi"]))
    return out


def victim_expiries(nominations: Iterable[dict]) -> dict[tuple[str, str], datetime | None]:
    """(namespace, name) of every VMI the GPUNominations `nominations` name victims -> the
    latest `spec.expires` among those naming it (None when one has none readable: it counts
    as live whenever)."""
    from model.serialize import parse_time

    out: dict[tuple[str, str], datetime | None] = {}
    for n in nominations:
        exp = parse_time((n.get("spec") or {}).get("expires"))
        out = merge_expiries(out, dict.fromkeys(victims_of([n]), exp))
    return out


def merge_expiries(a, b) -> dict:
    """Two (namespace, name) -> expiry mappings (`victim_expiries`; a set: expiries unknown)
    as one, each key's latest expiry (None, unknown, wins)."""
    out = dict(a) if isinstance(a, dict) else dict.fromkeys(a)
    for key, exp in (b.items() if isinstance(b, dict) else dict.fromkeys(b).items()):
        if key in out and (out[key] is None or exp is None):
            out[key] = None
        else:
            out[key] = exp if key not in out else max(out[key], exp)
    return out


def _parsed(nominations: Iterable[dict]):
    """The nominations as `model.nomination.Nomination`s, the malformed left out (the binder
    ignores them too)."""
    from model.nomination import parse_nomination
    from model.parse import ParseError

    out = []
    for n in nominations:
        try:
            out.append(parse_nomination(n))
        except ParseError:
            continue
    return out


def check_nominations(snap: Snapshot) -> list[Violation]:
    """§3c P6 "a nominated device is never placed for anyone but its preemptor", on `snap`:
    for each nomination listed first (`snap.nominations`) that expires more than
    `LIVE_SLACK` after `snap.at` and still holds (docs/contract.md P4 "the hold"): neither
    *admitted* (a device of the preemptor's namespace attached to its VMI is Bound with its
    request Succeeded, on the nominated node or on another) nor *spent* (its preemptor is a
    victim of another such nomination made no earlier, `model.nomination.spent`: admitted
    since, now being stopped),
    a Bound device is *another set's* when it is attached to
    neither the preemptor nor one of the victims (their VMIs by namespace and name; a victim
    named with an admission id only in that incarnation) nor a template of theirs. Count
    mode (`spec.units`): per resource, another set's Bound units on the node plus the units
    of every such nomination there must fit its allocatable (the victims' room is the
    nomination's). Device mode (`spec.devices`; its units are not counted: the node's
    allocatable does not list DRA devices): no nominated DRA device is recorded
    (`status.device`) by another set's Bound device. An idle held device the nomination
    moves off its node (`spec.moves`, D-moves) is not another set's: it is leaving. One `NOMINATED_TAKEN` per node and
    resource, or per device. Pure."""
    from model.nomination import spent

    live = [n for n in _parsed(snap.nominations)
            if snap.at is None or n.expires > snap.at + LIVE_SLACK]
    landed = {(d["metadata"]["namespace"], ((d.get("status") or {}).get("attachedTo") or {}).get("vmi"))
              for d in snap.devices
              if (d.get("status") or {}).get("phase") == "Bound"
              and ((d.get("status") or {}).get("bindRequest") or {}).get("result") == "Succeeded"}
    at = snap.at or datetime.min.replace(tzinfo=timezone.utc)   # None: every one read counts
    noms = [n for n in live if (n.namespace, n.vmi) not in landed and not spent(n, live, at)]
    if not noms:
        return []
    by_node: dict[str, list] = {}
    for n in noms:
        by_node.setdefault(n.node, []).append(n)

    def theirs(d: dict, group: list) -> bool:
        ns = d["metadata"]["namespace"]
        att = (d.get("status") or {}).get("attachedTo") or {}
        tmpl = (d["metadata"].get("labels") or {}).get(TEMPLATE_LABEL)
        for n in group:
            if any(m.key == (ns, d["metadata"]["name"]) for m in n.moves):
                return True   # an idle held device the plan moves off (D-moves): leaving
            if ns == n.namespace and n.vmi in (att.get("vmi"), tmpl):
                return True
            for v in n.victims:
                if ns != v.namespace or v.vmi not in (att.get("vmi"), tmpl):
                    continue
                if v.admission is None or att.get("admission") in (None, v.admission):
                    return True
        return False

    out: list[Violation] = []
    others: Counter = Counter()
    recorded: dict[tuple, str] = {}
    for d in snap.devices:
        st = d.get("status") or {}
        node = st.get("nodeName")
        if st.get("phase") != "Bound" or node not in by_node or theirs(d, by_node[node]):
            continue
        res = snap.resource.get((d.get("spec") or {}).get("class"))
        if res:
            others[(node, res)] += 1
        rec = st.get("device")
        if isinstance(rec, dict):
            recorded[(rec.get("driver"), rec.get("pool"), rec.get("device"))] = (
                f"{d['metadata']['namespace']}/{d['metadata']['name']}")
    for node, group in sorted(by_node.items()):
        held: Counter = Counter()
        for n in group:
            if not n.devices:   # device mode is judged by its devices (no allocatable count)
                held.update(dict(n.units))
            for ref in n.devices:
                holder = recorded.get((ref.driver, ref.pool, ref.device))
                if holder is not None:
                    out.append(Violation(NOMINATED_TAKEN, ("Device", "", f"{ref.driver}/{ref.pool}/{ref.device}"),
                                         f"nominated for {n.preemptor} (nomination {n.name}), recorded "
                                         f"by {holder}"))
        for res, units in sorted(held.items()):
            cap = snap.allocatable.get(node, {}).get(res, 0)
            if others[(node, res)] + units > cap:
                out.append(Violation(NOMINATED_TAKEN, ("Node", "", node, res),
                                     f"{others[(node, res)]} Bound of {res} for other sets + {units} "
                                     f"nominated ({', '.join(n.preemptor for n in group)}) > allocatable {cap}"))
    return out


def check_gone(snap: Snapshot, known: Iterable[tuple[str, str]], *,
               deleted: Iterable[tuple[str, str]] = (),
               victims: Iterable[tuple[str, str]] | dict = (),
               alive: dict[tuple[str, str], datetime] | None = None) -> list[Violation]:
    """§3c P6 "no set is stopped unless it is a victim of a live nomination": every VMI of
    `known` (namespace, name: VMIs of ours the caller saw exist before the read) missing from
    `snap` must be in `deleted` (the caller deleted it itself) or a victim of a nomination:
    one of `victims` (read from the nominations the caller saw in earlier reads: a nomination
    is deleted once its preemptor is admitted) or of `snap`'s own (`victims_of`). The caller
    must see every nomination at least once (it lives until its victims are gone and its
    preemptor is admitted).

    *Live*: with `alive` ((namespace, name) -> when the caller last read the VMI existing and
    not being deleted, UTC) and `victims` a mapping to the latest expiry of the nominations
    naming it (`victim_expiries`; None: live whenever), a victim is excused only when a
    nomination naming it was still live (its expiry plus `LIVE_SLACK`, the clocks' play,
    after) when the VMI was last seen alive: a VMI seen alive after every nomination naming
    it expired was deleted by no live nomination. One `STOPPED_NOT_VICTIM` each. Pure."""
    expiry = merge_expiries(victims, victim_expiries([*snap.nominations, *snap.late_nominations]))
    exists = snap.existing
    out = []
    for ns, name in sorted(set(known) - exists - set(deleted)):
        key = (ns, name)
        if key in expiry:
            seen, exp = (alive or {}).get(key), expiry[key]
            if seen is None or exp is None or exp + LIVE_SLACK > seen:
                continue
            out.append(Violation(STOPPED_NOT_VICTIM, ("VirtualMachineInstance", ns, name),
                                 f"gone; seen alive at {seen.isoformat()}, after every nomination "
                                 f"naming it a victim had expired ({exp.isoformat()})"))
            continue
        out.append(Violation(STOPPED_NOT_VICTIM, ("VirtualMachineInstance", ns, name),
                             "gone; not deleted by the caller, no nomination named it a victim"))
    return out


LINE_LAG = timedelta(seconds=20)
"""How far the binder's view may lag the API (`check_line_order`): a set is judged only on a
window of reads begun this long before its request, and a device counts as surely taken only
when Bound this long before it."""


@dataclass(frozen=True)
class Waiting:
    """A set the caller knows to be waiting in the binder's line (§3c P5): its create
    (`namespace/vmi`, `gpus` template devices of class `cls`, priority value `priority`) was
    answered 503 for room at its first retry by `since` (UTC: its place in line was taken by
    then), and every answer since was such a 503 (no admission, the client retrying)."""

    namespace: str
    vmi: str
    cls: str
    gpus: int
    priority: int
    since: datetime


def _time(value) -> datetime | None:
    from model.serialize import parse_time

    return parse_time(value)


def _bound(snap: Snapshot) -> dict[tuple[str, str], tuple[str, str, datetime | None, tuple]]:
    """(namespace, name) -> (node, resource, boundAt, (attached VMI, admission)) of every
    Bound device of a count-mode class in `snap`."""
    out = {}
    for d in snap.devices:
        st = d.get("status") or {}
        res = snap.resource.get((d.get("spec") or {}).get("class"))
        if st.get("phase") != "Bound" or not st.get("nodeName") or not res:
            continue
        att = st.get("attachedTo") or {}
        out[(d["metadata"]["namespace"], d["metadata"]["name"])] = (
            st["nodeName"], res, _time(st.get("boundAt")), (att.get("vmi"), att.get("admission")))
    return out


def _started_sets(snap: Snapshot) -> dict[tuple[str, str, str | None], dict]:
    """The admitted sets of count-mode classes in `snap`, by (namespace, VMI, admission):
    {node, resource, class, priority, requested (bindRequest.requestedAt), devices [names]}
    of those whose every member is Bound on one node with the request Succeeded."""
    sets: dict[tuple, dict] = {}
    bad: set[tuple] = set()
    for d in snap.devices:
        st = d.get("status") or {}
        att, br = st.get("attachedTo") or {}, st.get("bindRequest") or {}
        if not att.get("vmi"):
            continue
        key = (d["metadata"]["namespace"], att["vmi"], att.get("admission"))
        cls = (d.get("spec") or {}).get("class")
        res = snap.resource.get(cls)
        prio = br.get("priority", 0)
        if (st.get("phase") != "Bound" or br.get("result") != "Succeeded" or not res
                or not isinstance(prio, int) or br.get("vmi") not in (None, att["vmi"])):
            bad.add(key)
            continue
        got = sets.setdefault(key, {"node": st.get("nodeName"), "resource": res, "class": cls,
                                    "priority": prio, "requested": _time(br.get("requestedAt")),
                                    "devices": []})
        if (got["node"], got["resource"]) != (st.get("nodeName"), res):
            bad.add(key)
        got["devices"].append(d["metadata"]["name"])
    return {k: v for k, v in sets.items() if k not in bad and v["requested"] is not None}


def _records(snap: Snapshot) -> dict[tuple[str, str], tuple]:
    """(namespace, name) -> (node, recorded device name, class, boundAt, resourceVersion) of
    every Bound GPUDevice in `snap` recording a DRA device (`status.device`, device mode)."""
    out = {}
    for d in snap.devices:
        st = d.get("status") or {}
        rec = st.get("device")
        if (st.get("phase") != "Bound" or not st.get("nodeName") or not isinstance(rec, dict)
                or not isinstance(rec.get("device"), str)):
            continue
        out[(d["metadata"]["namespace"], d["metadata"]["name"])] = (
            st["nodeName"], rec["device"], (d.get("spec") or {}).get("class"),
            _time(st.get("boundAt")), d["metadata"].get("resourceVersion"))
    return out


def _started_device_sets(snap: Snapshot) -> dict[tuple[str, str, str | None], dict]:
    """The admitted sets of device-mode classes in `snap` (members of a class `snap.resource`
    does not name, recording a DRA device), by (namespace, VMI, admission): {node, class,
    priority, requested, devices [names], mixed (of several classes)} of those whose every
    member is Bound on one node, recording a device, with the request Succeeded."""
    sets: dict[tuple, dict] = {}
    bad: set[tuple] = set()
    for d in snap.devices:
        st = d.get("status") or {}
        att, br = st.get("attachedTo") or {}, st.get("bindRequest") or {}
        cls = (d.get("spec") or {}).get("class")
        if not att.get("vmi") or cls in snap.resource:
            continue
        key = (d["metadata"]["namespace"], att["vmi"], att.get("admission"))
        rec, prio = st.get("device"), br.get("priority", 0)
        if (st.get("phase") != "Bound" or br.get("result") != "Succeeded" or not isinstance(rec, dict)
                or not isinstance(prio, int) or br.get("vmi") not in (None, att["vmi"])):
            bad.add(key)
            continue
        got = sets.setdefault(key, {"node": st.get("nodeName"), "class": cls, "priority": prio,
                                    "requested": _time(br.get("requestedAt")), "devices": [],
                                    "mixed": False})
        if got["node"] != st.get("nodeName"):
            bad.add(key)
        got["mixed"] = got["mixed"] or got["class"] != cls
        got["devices"].append(d["metadata"]["name"])
    return {k: v for k, v in sets.items() if k not in bad and v["requested"] is not None}


@dataclass(frozen=True)
class DeviceRead:
    """What `check_line_order` keeps of one read's device mode (`device_read`), by node and
    device name as the binder keys them: `boards` (node, class) -> the class's devices there
    as topology sees them (`model.device.topology.Device`s: DR1's devices, the current pool
    generation's, node-local, matching the DeviceClass's selectors and the class's own, as
    the binder's cache `k8s.dra_index.DraIndex` gathers them); `matches` and `resource` each
    class's `spec.topology.matchAttribute` and quota key; `tainted` the devices a
    NoSchedule/NoExecute taint covers (the slice's own or a DeviceTaintRule's, DR2);
    `claimed` -> the (namespace, claim-for VMI or None, ours) of each claim allocating it
    (DR2); `ruled` -> the creation times of the hard DeviceTaintRules tainting it that were
    never changed (`metadata.generation` 1: in force ever since)."""

    boards: dict[tuple[str, str], tuple]
    matches: dict[str, str | None]
    resource: dict[str, str]
    tainted: frozenset[tuple[str, str]]
    claimed: dict[tuple[str, str], frozenset[tuple]]
    ruled: dict[tuple[str, str], tuple[datetime | None, ...]]


def device_read(dra: DraRead | None) -> DeviceRead | None:
    """`dra` as `check_line_order` keeps it; None when not read or when the DeviceTaintRules
    are not served (which devices the binder holds tainted is then unknown). Malformed
    slices, classes, rules and claims are left out, as the binder's cache leaves them."""
    from k8s.dra_index import DraIndex
    from model.claim import parse_claim
    from model.device.dra import HARD_DEVICE_TAINTS, SliceError
    from model.device.taint_rules import parse_taint_rule
    from model.parse import ParseError, parse_gpu_class

    if dra is None or dra.rules is None:
        return None
    index = DraIndex()
    for obj in dra.slices:
        try:
            index.put_slice(obj)
        except SliceError:
            continue
    for obj in dra.device_classes:
        index.put_device_class(obj)
    classes = []
    for obj in dra.classes:
        try:
            classes.append(parse_gpu_class(obj))
        except ParseError:
            continue
    index.set_classes(classes)
    generation: dict[str, tuple[datetime | None, bool]] = {}
    for obj in dra.rules:
        try:
            rule = parse_taint_rule(obj)
        except SliceError:
            continue
        index.put_rule(rule)
        meta = obj.get("metadata") or {}
        generation[rule.name] = (_time(meta.get("creationTimestamp")), meta.get("generation") == 1)
    boards: dict[tuple[str, str], tuple] = {}
    tainted: set[tuple[str, str]] = set()
    ruled: dict[tuple[str, str], tuple[datetime | None, ...]] = {}
    nodes_of = {}
    for node in sorted(index.nodes()):
        for name, devices in index.node_fields(node, ()).class_devices:
            boards[(node, name)] = tuple(devices.devices)
        for d in index.devices(node):
            nodes_of[d.ref] = node
            if d.tainted:
                tainted.add((node, d.ref.device))
            for t in d.taints:
                made, unchanged = generation.get(t.rule, (None, False))
                if t.effect in HARD_DEVICE_TAINTS and t.rule and unchanged:
                    ruled[(node, d.ref.device)] = ruled.get((node, d.ref.device), ()) + (made,)
    claimed: dict[tuple[str, str], set[tuple]] = {}
    for obj in dra.claims:
        c = parse_claim(obj)
        for ref in () if c.problem else c.allocated:
            if ref in nodes_of:
                claimed.setdefault((nodes_of[ref], ref.device), set()).add(
                    (c.namespace, c.vmi, c.managed))
    return DeviceRead(boards, {c.name: c.match_attribute for c in classes},
                      {c.name: c.resource_name for c in classes}, frozenset(tainted),
                      {k: frozenset(v) for k, v in claimed.items()}, ruled)


@dataclass(frozen=True)
class LineRead:
    """What `check_line_order` keeps of an earlier read (`line_read`): when it began, the
    nodes placeable then, its nominations and its Bound count-mode devices (`_bound`); for
    device mode its Bound records (`_records`), what it read of DRA (`device_read`; None:
    not read) and when it ended: a window of these costs far less than of whole snapshots."""

    started: datetime | None
    placeable: frozenset[str] | None
    nominations: tuple[dict, ...]
    bound: dict
    records: dict = field(default_factory=dict)
    devices: DeviceRead | None = None
    at: datetime | None = None


def line_read(snap: Snapshot | LineRead) -> LineRead:
    """`snap` as `check_line_order` keeps it (a LineRead as it is)."""
    if isinstance(snap, LineRead):
        return snap
    return LineRead(snap.started, snap.placeable, (*snap.nominations, *snap.late_nominations),
                    _bound(snap), _records(snap), device_read(snap.dra), snap.at)


def _judged_from(key: tuple, rs: dict, waiting: Sequence, window: Sequence,
                 judged: dict) -> tuple[list, int] | None:
    """For started set `key` (`rs`: its priority, class, requested time), the waiting sets
    of higher priority in its class waiting since before its request and the index of the
    last read of `window` begun `LINE_LAG` before that request; None when there is nothing to
    judge. Records in `judged` what `check_line_order` says of it: None (requested before
    the window), False (no read early enough), else the number of such waiting sets."""
    ws = [w for w in waiting if w.priority > rs["priority"] and w.cls == rs["class"]
          and w.since < rs["requested"]]
    if window[0].started is None or rs["requested"] < window[0].started:
        judged[key] = None   # requested before the window: started before it was read
        return None
    begun = [i for i, r in enumerate(window)
             if r.started is not None and r.started <= rs["requested"] - LINE_LAG]
    judged[key] = len(ws) if begun else False
    if not begun or not ws:
        return None
    return ws, begun[-1]


def check_line_order(window: Sequence[Snapshot | LineRead], waiting: Iterable[Waiting],
                     judged: dict[tuple, int | bool | None], *,
                     preemptors: Iterable[tuple[str, str]] = (),
                     last_read: LineRead | None = None) -> list[Violation]:
    """§3c P6 "no lower-priority set starts on devices a waiting higher-priority set could
    start on now", count and device mode, from what the API shows. `window`: the caller's reads, oldest
    first, each with `started` and `placeable` (earlier ones may be `LineRead`s); the last, a
    `Snapshot`, is judged. `waiting`: the sets
    the caller knows to be waiting (`Waiting`) still after the last read ended. `judged`:
    (namespace, VMI, admission) of each set looked at before -> the number of waiting sets
    it was judged against (0: none waited above it), False when no read of the window began
    `LINE_LAG` before its request or, device mode, the reads lack what judging it needs (not
    judged), None when it was requested before the
    window's first read (started before the caller looked); updated; each set is looked at
    once. `preemptors`: (namespace, VMI) of the preemptors of nominations the caller saw
    besides the reads' (a watch: one made and deleted between two reads is in no read).
    `last_read`: `line_read` of the last read when the caller made it already (it keeps it
    for its next window; device mode builds a DRA index for it), else made here.

    A set R first seen started in the last read (whole set Bound on node N, of recorded
    priority p, requested at r) breaks it when a waiting W of the same class with a priority
    above p, in line since before r, not a preemptor of any nomination read or of
    `preemptors` (its room is held) while R is none, could have used N and nothing else. Judged pessimistically so
    that a violation is certain (the binder's view lags the API by up to LINE_LAG and the
    reads are seconds apart): with the window from the last read begun LINE_LAG before r,
    W fits N with R's new room even counting every device Bound on N in any read of the
    window and every nominated unit there; and W fits on no node after R, counting as taken
    only devices Bound LINE_LAG before r and still Bound (on N, R's new room too), every
    node placeable in some read counted; and W's tenant had budget for it, counting every
    device of its Bound in any read. Placement rules the reads do not show (held devices,
    node selectors) are left out: W asks template devices only.

    Device mode (R's members record DRA devices, `status.device`; `_device_inversions` says
    how): "fits" is DR3's, a valid group of W's size among the free devices of the class on
    the node by the binder's own choice (`model.device.topology.choose_devices`), from the
    ResourceSlices, DeviceClasses, claims and DeviceTaintRules each read holds
    (`Snapshot.dra`, `device_read`), just as pessimistic: N's free devices count every device
    recorded, nominated, tainted or claimed there in any read of the window, the other
    nodes' only what is surely taken. A set whose reads lack DRA (not read, or
    DeviceTaintRules not served: the binder's health marks are then out of sight), of
    several classes, or whose node's devices were not read is not judged (False). One
    `LINE_INVERSION` per (R, W). Pure."""
    if not window:
        return []
    last = window[-1]
    assert isinstance(last, Snapshot), "the read judged is a whole Snapshot"
    window = [line_read(r) for r in window[:-1]] + [last_read or line_read(last)]
    waiting = list(waiting)
    seen_preemptors = set(preemptors)
    out: list[Violation] = []
    sets = _started_sets(last)
    bounds = [r.bound for r in window]
    for key, rs in sorted(sets.items(), key=lambda kv: str(kv[0])):
        if key in judged:
            continue
        start = _judged_from(key, rs, waiting, window, judged)
        if start is None:
            continue
        ws, i0 = start
        reads, seen = window[i0:], bounds[i0:]
        node, res = rs["node"], rs["resource"]
        ns_r = key[0]
        first = seen[0]
        new = {(ns_r, n) for n in rs["devices"]
               if (first.get((ns_r, n)) or ("",))[0] != node}   # R's room: not on N before
        taken_hi: dict[str, set] = {}
        tenant_hi: dict[tuple[str, str], set] = {}
        for b in seen:
            for dk, (dn, dres, _, _) in b.items():
                if dres == res:
                    taken_hi.setdefault(dn, set()).add(dk)
                    tenant_hi.setdefault((dk[0], dres), set()).add(dk)
        cutoff = rs["requested"] - LINE_LAG
        taken_lo: Counter = Counter()
        for dk, (dn, dres, at, _) in seen[-1].items():
            if dres == res and at is not None and at <= cutoff and dk not in new:
                taken_lo[dn] += 1
        placeable = (set(last.allocatable) if any(r.placeable is None for r in reads)
                     else set().union(*(r.placeable for r in reads)))
        noms = [n for r in reads for n in _parsed(r.nominations)]
        preemptors = {(n.namespace, n.vmi) for n in noms} | seen_preemptors
        if (key[0], key[1]) in preemptors:
            continue   # R started on room nominated for it
        nominated = sum(k for n in noms if n.node == node for r_, k in n.units if r_ == res)
        alloc = last.allocatable
        for w in ws:
            if (w.namespace, w.vmi) in preemptors:
                continue
            budget = last.budget.get((w.namespace, res))
            if budget is not None and len(tenant_hi.get((w.namespace, res), ())) + w.gpus > budget:
                continue
            cap = alloc.get(node, {}).get(res, 0)
            if cap - len(taken_hi.get(node, set()) - new) - nominated < w.gpus:
                continue   # W may not have fitted N even with R's room
            if cap - taken_lo[node] - len(new) >= w.gpus:
                continue   # W fits N beside R
            if any(alloc.get(y, {}).get(res, 0) - taken_lo[y] >= w.gpus
                   for y in placeable if y != node):
                continue   # W fits elsewhere: R was backfill
            out.append(_inversion(key, node, rs, w, "there"))
    for key, rs in sorted(_started_device_sets(last).items(), key=lambda kv: str(kv[0])):
        if key in judged:
            continue
        start = _judged_from(key, rs, waiting, window, judged)
        if start is None:
            continue
        ws, i0 = start
        got = _device_inversions(key, rs, ws, window[i0:], window, last.budget, seen_preemptors)
        if got is None:
            judged[key] = False   # the reads lack what judging it needs
        else:
            out += got
    return out


def _inversion(key: tuple, node: str, rs: dict, w: Waiting, where: str) -> Violation:
    """The `LINE_INVERSION` of set `key` (`rs`), started on `node`, against waiting set `w`,
    which could have started `where` and nowhere after."""
    return Violation(LINE_INVERSION, ("VirtualMachineInstance", key[0], key[1], w.vmi),
                     f"started on {node} (priority {rs['priority']}, requested "
                     f"{rs['requested'].isoformat()}) while {w.namespace}/{w.vmi} "
                     f"(priority {w.priority}, {w.gpus} GPUs of {w.cls}, waiting "
                     f"since {w.since.isoformat()}) could start {where} and nowhere after")


def _device_inversions(key: tuple, rs: dict, ws: list[Waiting], reads: list[LineRead],
                       window: list[LineRead], budget: dict[tuple[str, str], int],
                       preemptors: set[tuple[str, str]]) -> list[Violation] | None:
    """`check_line_order` for device-mode set `key` (`rs` as `_started_device_sets` gives it,
    started on node N) against the waiting sets `ws` above it, on `reads` (the window from the
    last read begun LINE_LAG before its request; `window` all of it, for a read that ended
    before then): None when they cannot judge it (a read without DRA, `device_read`; a set
    of several classes; N's devices of its class not read).

    DR3 by the binder's own rule (`model.device.topology.choose_devices`: a group of the
    class's matchAttribute with W's size among the free devices). W fits N with R's new
    room: the free devices are N's devices of the class published alike in every read, less
    every device recorded on N in any read (by another than R's new members), nominated on
    N by any nomination read, tainted NoSchedule/NoExecute or allocated by a claim other than
    R's own in any read, plus R's new devices. W fits N beside R, or another node placeable
    in some read: the free devices are that node's of the last read, less only those surely
    taken: recorded by the same GPUDevice unchanged (its resourceVersion) since a read that
    ended LINE_LAG before R's request, Bound then (boundAt), and on N R's own devices; and
    those a DeviceTaintRule in force since then (created by then, never changed) taints.
    Slices' own taints, claims and nominations count there as free. Budget: W's tenant's
    devices of the class's quota key recorded in any read plus those claims not of the binder
    allocate in its namespace. One `LINE_INVERSION` per W."""
    from model.device.match import MatchAttribute
    from model.device.topology import GroupChoice, choose_devices

    if rs["mixed"] or any(r.devices is None for r in reads):
        return None
    cls, node, ns_r = rs["class"], rs["node"], key[0]
    last = reads[-1].devices
    board = last.boards.get((node, cls))
    if not board or cls not in last.matches:
        return None
    noms = [n for r in reads for n in _parsed(r.nominations)]
    if (key[0], key[1]) in {(n.namespace, n.vmi) for n in noms} | preemptors:
        return []   # R started on room nominated for it
    held = {(n.namespace, n.vmi) for n in noms} | preemptors
    match, res = MatchAttribute.of(last.matches[cls]), last.resource[cls]
    first, recs = reads[0].records, reads[-1].records
    new = {(ns_r, n) for n in rs["devices"] if (first.get((ns_r, n)) or ("",))[0] != node}
    new_names = {recs[k][1] for k in new if k in recs}
    r_names = {recs[(ns_r, n)][1] for n in rs["devices"] if (ns_r, n) in recs}

    def fits(devices: tuple, free: set[str], count: int) -> bool:
        return isinstance(choose_devices(devices, frozenset(free), count, match), GroupChoice)

    common = set(board)
    for r in reads:
        common &= set(r.devices.boards.get((node, cls), ()))
    names_hi = {d.name for d in common}
    taken_hi = {rec[1] for r in reads for k, rec in r.records.items() if rec[0] == node and k not in new}
    taken_hi |= {ref.device for n in noms if n.node == node for ref in n.devices}
    for r in reads:
        taken_hi |= {d for (y, d) in r.devices.tainted if y == node}
        taken_hi |= {d for (y, d), owners in r.devices.claimed.items() if y == node
                     and any(o != (ns_r, key[1], True) for o in owners)}
    free_hi = (names_hi - taken_hi) | (new_names & names_hi)
    cutoff = rs["requested"] - LINE_LAG
    since = [r.records for r in window if r.at is not None and r.at <= cutoff]
    sure = {k for k, rec in recs.items() if k not in new and rec[3] is not None and rec[3] <= cutoff
            and rec[4] is not None and any(b.get(k) == rec for b in since)}

    def free_lo(y: str, devices: tuple) -> set[str]:
        out = {d.name for d in devices} - {recs[k][1] for k in sure if recs[k][0] == y}
        out -= {d for (z, d), made in last.ruled.items()
                if z == y and any(t is not None and t <= cutoff for t in made)}
        return out - r_names if y == node else out

    placeable = (None if any(r.placeable is None for r in reads)
                 else set().union(*(r.placeable for r in reads)))
    out = []
    for w in ws:
        if (w.namespace, w.vmi) in held:
            continue
        cap = budget.get((w.namespace, res))
        if cap is not None:
            used = {k for r in reads for k, rec in r.records.items()
                    if k[0] == w.namespace and last.resource.get(rec[2]) == res}
            foreign = {d for r in reads for d, owners in r.devices.claimed.items()
                       if any(o[0] == w.namespace and not o[2] for o in owners)}
            if len(used) + len(foreign) + w.gpus > cap:
                continue
        if not fits(board, free_hi & {d.name for d in board}, w.gpus):
            continue   # W may not have fitted N even with R's room
        if fits(board, free_lo(node, board), w.gpus):
            continue   # W fits N beside R
        if any(fits(devices, free_lo(y, devices), w.gpus) for (y, c), devices in last.boards.items()
               if c == cls and y != node and (placeable is None or y in placeable)):
            continue   # W fits elsewhere: R was backfill
        out.append(_inversion(key, node, rs, w, f"there (a group of "
                              f"{match.resolve(w.gpus) if match else 'the node'} free)"))
    return out


def leftovers(snap: Snapshot) -> list[Violation]:
    """What housekeeping still has to clear once churn stops (H1/H2, §7.2): devices attached
    to a VMI that does not exist, template devices whose VMI does not exist, requests
    without a result. While churn runs these are normal (grace periods); after settling
    they are violations. Pure."""
    out: list[Violation] = []
    exists = snap.existing
    for d in snap.devices:
        ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
        st = d.get("status") or {}
        vmi = (st.get("attachedTo") or {}).get("vmi")
        tmpl = (d["metadata"].get("labels") or {}).get(TEMPLATE_LABEL)
        br = st.get("bindRequest") or {}
        if vmi and (ns, vmi) not in exists:
            out.append(Violation(ATTACHED_TO_GONE, ("GPUDevice", ns, name),
                                 f"attached to {vmi}, which does not exist"))
        if tmpl and (ns, tmpl) not in exists:
            out.append(Violation(TEMPLATE_ORPHAN, ("GPUDevice", ns, name),
                                 f"template of {tmpl}, which does not exist"))
        if br.get("id") and not br.get("result"):
            out.append(Violation(NO_RESULT, ("GPUDevice", ns, name),
                                 f"request {br.get('id')} of {br.get('vmi')} without a result"))
    return out


@dataclass
class Tally:
    """Violations seen across samples, each distinct `key` once (the first sighting kept),
    and how many samples were taken."""

    seen: dict[tuple, Violation] = field(default_factory=dict)
    samples: int = 0

    def add(self, violations: list[Violation]) -> list[Violation]:
        """Record one sample's violations; returns those not seen before."""
        self.samples += 1
        new = [v for v in violations if v.key not in self.seen]
        for v in new:
            self.seen[v.key] = v
        return new

    @property
    def violations(self) -> list[Violation]:
        return list(self.seen.values())

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.seen.values()))
