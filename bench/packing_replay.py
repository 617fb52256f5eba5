"""The packing benchmark's replay (`bench.packing`): what the watches see of the cluster
(`Seen`), one system on one load (`Lane`), the request body of one GPU set (`vmi_body`) and
the replay of a lane's trace window by window (`Replayer`)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import anyio

from bench import packing_hgx as ph, packing_trace as pt
from bench.common import DEV_GROUP, DEV_VERSION, VMI_GROUP, VMI_VERSION, base_vmi, gpu_vmi
from localcluster.dra_profiles import DEVICE_CLASS
from model.claim import parse_claim
from model.device.topology import resolve_attribute
from model.types import TEMPLATE_FOR_LABEL

SYSTEMS = {"a": "gpu-binder", "b": "kube-scheduler (default)", "c": "kube-scheduler MostAllocated",
           "d": "repacking bound", "e": "gpu-binder + defrag"}
HGX_SYSTEMS = {"a": "gpu-binder, device mode", "b": "kube-scheduler DRA allocator alone",
               "c": "gpu-binder, count mode + device plugin", "d": "repacking bound"}
"""The systems of the HGX pools (issue 33; `bench.packing_hgx`)."""
MOST_ALLOCATED = "most-allocated"


@dataclass
class Seen:
    """The watched cluster: Bound GPUDevices and Pods of the benchmark's namespaces."""

    devices: dict[tuple[str, str], tuple[str | None, str]] = field(default_factory=dict)
    """(namespace, name) -> (nodeName once Bound else None, template-for VMI name or "")."""
    pods: dict[tuple[str, str], dict] = field(default_factory=dict)
    """(namespace, name) -> {uid: created-by VMI uid, node, unschedulable, gpus, claims}."""
    claims: dict[tuple[str, str], tuple[str, tuple[str, ...]] | None] = field(default_factory=dict)
    """(namespace, name) of a ResourceClaim -> (pool, device names) once allocated, else None."""
    lists: list[tuple[float, str, str, int]] = field(default_factory=list)
    """Every list of a watch (`bench.common.watch_namespaced`'s `on_list`): (monotonic time,
    resource, why, objects listed)."""

    def on_list(self, resource: str):
        """The `on_list` callback of the watch of `resource`."""
        return lambda why, items: self.lists.append((time.monotonic(), resource, why, items))

    def used_per_node(self, lane: "Lane") -> dict[str, int]:
        """{node: GPUs in use} of `lane`: its Bound devices (a, e) or its bound Pods' GPUs."""
        used: dict[str, int] = defaultdict(int)
        if lane.by_binder:
            for (ns, _), (node, _t) in self.devices.items():
                if ns == lane.ns and node:
                    used[node] += 1
        else:
            for (ns, _), p in self.pods.items():
                if ns == lane.ns and p["node"]:
                    used[p["node"]] += p["gpus"]
        return used

    def pod_of(self, ns: str, uid: str) -> tuple[str, dict] | None:
        """(name, pod) of the launcher Pod in `ns` of the VMI `uid`, None when none."""
        for (pns, name), p in self.pods.items():
            if pns == ns and p["uid"] == uid:
                return name, p
        return None


def device_event(seen: Seen, kind: str, obj: dict) -> None:
    """One watch event of a GPUDevice into `seen.devices`."""
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    if kind == "DELETED":
        seen.devices.pop(key, None)
        return
    st = obj.get("status") or {}
    seen.devices[key] = (st.get("nodeName") if st.get("phase") == "Bound" else None,
                         (obj["metadata"].get("labels") or {}).get(TEMPLATE_FOR_LABEL, ""))


def pod_event(res_of: dict[str, str], seen: Seen, kind: str, obj: dict) -> None:
    """One watch event of a Pod into `seen.pods` (`res_of`: namespace -> the lane's GPU
    resource, whose requests are counted)."""
    meta = obj["metadata"]
    key = (meta["namespace"], meta["name"])
    if kind == "DELETED":
        seen.pods.pop(key, None)
        return
    res = res_of.get(meta["namespace"], "")
    gpus = sum(int(((c.get("resources") or {}).get("requests") or {}).get(res, 0))
               for c in obj["spec"].get("containers") or [])
    unsched = any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                  and c.get("reason") == "Unschedulable"
                  for c in (obj.get("status") or {}).get("conditions") or [])
    claims = [c["resourceClaimName"] for c in (obj["spec"].get("resourceClaims") or [])
              + ((obj.get("status") or {}).get("resourceClaimStatuses") or [])
              if c.get("resourceClaimName")]
    seen.pods[key] = {"uid": (meta.get("labels") or {}).get("kubevirt.io/created-by", ""),
                      "node": obj["spec"].get("nodeName"), "unschedulable": unsched, "gpus": gpus,
                      "claims": claims}


def claim_event(seen: Seen, kind: str, obj: dict) -> None:
    """One watch event of a ResourceClaim into `seen.claims` (its allocation's pool and
    devices; a claim's devices all lie in one node's pool on the HGX pools)."""
    claim = parse_claim(obj)
    key = (claim.namespace, claim.name)
    if kind == "DELETED":
        seen.claims.pop(key, None)
        return
    refs = claim.allocated
    seen.claims[key] = (refs[0].pool, tuple(r.device for r in refs)) if refs else None


async def wait_cached(cond, timeout: float) -> bool:
    """Poll the watch caches until cond() holds; False after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.05)
    return True


# -- one lane --------------------------------------------------------------------------------

@dataclass
class Lane:
    """One system on one load: its namespace, resource, class (a, e), nodes and what it did."""

    system: str
    trace: pt.Trace
    ns: str
    res: str
    cls: str
    nodes: list[str]
    outcome: pt.Outcome = field(default_factory=pt.Outcome)
    placed: dict[int, str] = field(default_factory=dict)   # started set id -> node
    vmi_uid: dict[int, str] = field(default_factory=dict)
    running: int = 0
    held_idle: int = 0
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    replayed: list[tuple[int, int, bool]] = field(default_factory=list)
    seconds: float = 0.0
    mode: str = "count"
    """"count" (issue 21's pools) or "hgx" (issue 33's HGX pools, `HGX_SYSTEMS`)."""
    taken: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """HGX: started set id -> the GPU indices it got (a, b: its claim's allocation; c: the
    device plugin's pick)."""
    holding: dict[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """HGX: set id -> (node, GPU indices) while they are in use."""
    timeouts: list[dict] = field(default_factory=list)
    """Every wait for a release that ran out (`Replayer.release_timeout`): the set, what was
    awaited, when, and which of the objects the watch still showed exist in a live read."""

    @property
    def by_binder(self) -> bool:
        """VMIs through gpu-binder's webhook (GPUDevices, held sets by name)."""
        return self.system in (("a", "c", "e") if self.mode == "hgx" else ("a", "e"))

    @property
    def claims(self) -> bool:
        """The launcher Pod takes its GPUs from a ResourceClaim (HGX a, b)."""
        return self.mode == "hgx" and self.system in ("a", "b")

    @property
    def dra_alone(self) -> bool:
        """HGX (b): kube-scheduler's DRA allocator alone, claims from templates."""
        return self.mode == "hgx" and self.system == "b"

    def free_gpus(self, node: str) -> frozenset[int]:
        """HGX: the GPU indices of `node` no set of this lane holds."""
        used = {g for n, gpus in self.holding.values() if n == node for g in gpus}
        return frozenset(range(pt.GPUS_PER_NODE)) - used


def vmi_body(name: str, lane: Lane, s: pt.GpuSet) -> dict:
    """KubeVirt's vmi-gpu example for set `s` of `lane`: through our webhook (a, e) asking for
    its held devices or its class's templates; for kube-scheduler (b, c) its GPUs in
    `spec.domain.devices.gpus`, (c) on the MostAllocated profile."""
    labels = {"pk-bench/set": str(s.id)}
    if lane.by_binder:
        return gpu_vmi(name, held=tuple(held_names(s)) if s.held else (), cls=lane.cls,
                       size=s.size, labels=labels)
    v = base_vmi()
    v["apiVersion"] = f"{VMI_GROUP}/{VMI_VERSION}"
    v["metadata"] = {"name": name, "labels": labels}
    if lane.dra_alone:  # its own claim from the lane's template of its size, on the lane's nodes
        v["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": f"gpu-{s.size}"}]
        v["spec"]["domain"]["devices"]["gpus"] = [
            {"name": f"gpu{k}", "claimName": "gpus", "requestName": f"gpu{k}"} for k in range(s.size)]
        v["spec"]["nodeSelector"] = {LANE_LABEL: lane.ns}
        return v
    v["spec"]["domain"]["devices"]["gpus"] = [{"name": f"gpu{k}", "deviceName": lane.res}
                                              for k in range(s.size)]
    if lane.system == "c":
        v["spec"]["schedulerName"] = MOST_ALLOCATED
    return v


LANE_LABEL = "pk-bench/lane"
"""The label of an HGX lane's nodes (its namespace's name): its class's or VMIs' nodeSelector."""


def claim_template(size: int) -> dict:
    """HGX (b): the ResourceClaimTemplate `gpu-<size>` a user without gpu-binder writes, in the
    form NVIDIA's driver documents: `size` count-1 requests of the passthrough DeviceClass
    sharing `gpu.nvidia.com/partition<size>`."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"gpu-{size}"},
            "spec": {"spec": {"devices": {
                "requests": [{"name": f"gpu{k}", "exactly": {"deviceClassName": DEVICE_CLASS,
                                                            "count": 1}} for k in range(size)],
                "constraints": [{"matchAttribute": resolve_attribute(ph.PARTITION, size)}]}}}}


def held_names(s: pt.GpuSet) -> list[str]:
    """The names of set `s`'s held GPUDevices."""
    return [f"h{s.id}-{k}" for k in range(s.size)]


class Replayer:
    """Replays lanes against the cluster through one ApiClient and the shared watch caches."""

    def __init__(self, api, seen: Seen, *, deadline: float, release_timeout: float = 60.0) -> None:
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

        self.core = CoreV1Api(api)
        self.custom = CustomObjectsApi(api)
        self.seen = seen
        self.deadline = deadline
        self.release_timeout = release_timeout

    async def lane(self, lane: Lane, window: float) -> None:
        """Replay `lane.trace` window by window (module docstring); fills `lane.outcome`."""
        started = time.monotonic()
        events = lane.trace.events()
        sent: set[int] = set()
        carried: list[tuple[str, pt.GpuSet]] = []
        k = 0
        while k < len(events) or carried:
            w = int(events[k][0] // window) if k < len(events) else int(lane.trace.end // window) + 1
            batch = []
            while k < len(events) and int(events[k][0] // window) == w:
                batch.append(events[k])
                k += 1
            # a set that arrives in this window leaves in the next one at the earliest
            leaves, carried = carried, []
            for _, _, kind, s in batch:
                if kind != "arrive":
                    (leaves if s.id in sent else carried).append((kind, s))
            per_set: dict[int, list[tuple[str, pt.GpuSet]]] = defaultdict(list)
            for kind, s in leaves:
                per_set[s.id].append((kind, s))
            async with anyio.create_task_group() as tg:
                for steps in per_set.values():
                    tg.start_soon(self._leave_all, lane, steps)
            async with anyio.create_task_group() as tg:
                for _, _, kind, s in batch:
                    if kind == "arrive":
                        sent.add(s.id)
                        lane.replayed.append((s.id, s.size, s.held))
                        tg.start_soon(self._arrive, lane, s)
            if lane.claims:  # the largest free partition
                big = ph.largest_partition([lane.free_gpus(n) for n in lane.nodes])
            else:
                used = self.seen.used_per_node(lane)
                big = pt.largest_placeable([pt.GPUS_PER_NODE - used.get(n, 0) for n in lane.nodes])
            lane.outcome.timeline.append(((w + 0.5) * window, lane.running, lane.held_idle, big))
        lane.seconds = time.monotonic() - started

    async def _arrive(self, lane: Lane, s: pt.GpuSet) -> None:
        from kubernetes_asyncio.client import ApiException

        name = f"s{s.id}"
        if lane.by_binder and s.held:
            for dev in held_names(s):
                await self.custom.create_namespaced_custom_object(
                    DEV_GROUP, DEV_VERSION, lane.ns, "gpudevices",
                    {"apiVersion": f"{DEV_GROUP}/{DEV_VERSION}", "kind": "GPUDevice",
                     "metadata": {"name": dev}, "spec": {"class": lane.cls}})
        try:
            made = await self._create_vmi(lane, name, s)
        except ApiException as exc:
            lane.counts["refused" if exc.status in (400, 403, 422) else f"error_{exc.status}"] += 1
            if lane.by_binder and s.held:
                await self._delete_held(lane, s)
            return
        uid = made["metadata"]["uid"]
        lane.vmi_uid[s.id] = uid

        def outcome() -> bool:
            got = self.seen.pod_of(lane.ns, uid)
            return got is not None and (bool(got[1]["node"]) or got[1]["unschedulable"])
        await wait_cached(outcome, self.deadline)
        got = self.seen.pod_of(lane.ns, uid)
        gpus = await self._gpus_of(lane, s, got[1]) if got is not None and got[1]["node"] else None
        if got is not None and got[1]["node"] and (gpus is not None or lane.mode != "hgx"):
            lane.placed[s.id] = got[1]["node"]
            lane.outcome.started.add(s.id)
            lane.running += s.size
            if gpus is not None:
                lane.taken[s.id] = gpus
                lane.holding[s.id] = (got[1]["node"], gpus)
            if lane.by_binder:
                pin = (made["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
                lane.counts["pin_agrees"] += pin == got[1]["node"]
            return
        lane.counts["no_launcher_pod" if got is None else
                    "claim_not_allocated" if got[1]["node"] else "unschedulable"] += 1
        await self._stop_vmi(lane, s)
        if lane.by_binder:  # admitted, yet its Pod never bound: withdraw it whole
            lane.counts["admitted_not_bound"] += 1
            if s.held:
                await self._delete_held(lane, s)

    async def _gpus_of(self, lane: Lane, s: pt.GpuSet, pod: dict) -> tuple[int, ...] | None:
        """HGX: the GPU indices of started set `s` (bound `pod`): (a, b) its claim's
        allocation once the watch saw it (within the deadline; None when not: counted as
        `claim_not_allocated`), checked to lie on the Pod's node; (c) the device plugin's
        pick, the lowest-index GPUs of the node this lane holds no set on
        (`bench.packing_hgx.lowest_free`). None for issue 21's pools."""
        if lane.mode != "hgx":
            return None
        if not lane.claims:
            return ph.lowest_free(lane.free_gpus(pod["node"]), s.size)
        keys = [(lane.ns, c) for c in pod["claims"]]
        if not keys or not await wait_cached(lambda: all(self.seen.claims.get(k) for k in keys),
                                             self.deadline):
            return None
        out = []
        for k in keys:
            pool, devices = self.seen.claims[k]
            lane.counts["allocation_off_node"] += pool != pod["node"]
            out += [ph.NAMES.index(d) for d in devices]
        lane.counts["allocated_other_size"] += len(out) != s.size
        return tuple(sorted(out))

    async def _create_vmi(self, lane: Lane, name: str, s: pt.GpuSet) -> dict:
        """Create the VMI; a denial naming a held device "not found" (the webhook's informer
        has not seen the tenant's brand-new GPUDevice yet) is retried for up to 5 s, counted
        as `retried_device_not_found`: a harness race, not a placement refusal."""
        from kubernetes_asyncio.client import ApiException

        deadline = time.monotonic() + 5
        while True:
            try:
                return await self.custom.create_namespaced_custom_object(
                    VMI_GROUP, VMI_VERSION, lane.ns, "virtualmachineinstances", vmi_body(name, lane, s))
            except ApiException as exc:
                if not (s.held and exc.status == 422 and "not found" in str(exc.body)
                        and time.monotonic() < deadline):
                    raise
                lane.counts["retried_device_not_found"] += 1
                await anyio.sleep(0.25)

    async def _leave_all(self, lane: Lane, steps: list[tuple[str, pt.GpuSet]]) -> None:
        for kind, s in steps:  # a set's stop before its release
            await self._leave(lane, kind, s)

    async def _leave(self, lane: Lane, kind: str, s: pt.GpuSet) -> None:
        if s.id not in lane.placed:
            return
        if kind == "stop":
            node = lane.placed[s.id]
            lane.running -= s.size
            if s.idle and lane.dra_alone:  # its VMI, Pod and claim keep the GPUs until release
                lane.held_idle += s.size
                return
            await self._stop_vmi(lane, s)
            if lane.mode == "hgx" and not lane.claims:  # (c): kubelet frees the Pod's GPUs
                lane.holding.pop(s.id, None)
            if s.idle:
                lane.held_idle += s.size
                if not lane.by_binder:
                    await self._placeholder(lane, s, node)
                return
        else:
            lane.held_idle -= s.size
            if lane.dra_alone:
                await self._stop_vmi(lane, s)
            elif not lane.by_binder:
                await self._delete_pod(lane.ns, f"idle-{s.id}")
        lane.holding.pop(s.id, None)
        if lane.by_binder and s.held:
            await self._delete_held(lane, s)
        elif lane.by_binder:  # H2 deletes the template devices
            vmi = f"s{s.id}"
            started = time.monotonic()
            ok = await wait_cached(lambda: not any(ns == lane.ns and t == vmi
                                              for (ns, _), (_, t) in self.seen.devices.items()),
                              self.release_timeout)
            lane.counts["release_timeout"] += 0
            if not ok:
                await self._timed_out(lane, s, "template devices", started, [
                    name for (ns, name), (_, t) in self.seen.devices.items()
                    if ns == lane.ns and t == vmi])
        lane.placed.pop(s.id)

    async def _stop_vmi(self, lane: Lane, s: pt.GpuSet) -> None:
        from kubernetes_asyncio.client import ApiException

        name, uid = f"s{s.id}", lane.vmi_uid.get(s.id, "")
        for attempt in ("delete", "unfinalize"):
            try:
                if attempt == "delete":
                    await self.custom.delete_namespaced_custom_object(
                        VMI_GROUP, VMI_VERSION, lane.ns, "virtualmachineinstances", name,
                        grace_period_seconds=0)
                else:
                    await self.custom.patch_namespaced_custom_object(
                        VMI_GROUP, VMI_VERSION, lane.ns, "virtualmachineinstances", name,
                        {"metadata": {"finalizers": None}},
                        _content_type="application/merge-patch+json")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        got = self.seen.pod_of(lane.ns, uid)
        if got is not None:
            await self._delete_pod(lane.ns, got[0])
        ok = await wait_cached(lambda: self.seen.pod_of(lane.ns, uid) is None, self.release_timeout)
        lane.counts["pod_gone_timeout"] += not ok
        if got is not None and got[1]["claims"]:  # its claim deallocated or deleted (DRA)
            keys = [(lane.ns, c) for c in got[1]["claims"]]
            ok = await wait_cached(lambda: not any(self.seen.claims.get(k) for k in keys),
                                   self.release_timeout)
            lane.counts["claim_free_timeout"] += not ok

    async def _delete_pod(self, ns: str, name: str) -> None:
        from kubernetes_asyncio.client import ApiException

        try:
            await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
        await wait_cached(lambda: (ns, name) not in self.seen.pods, self.release_timeout)

    async def _delete_held(self, lane: Lane, s: pt.GpuSet) -> None:
        from kubernetes_asyncio.client import ApiException

        names = held_names(s)
        deadline = time.monotonic() + self.release_timeout
        for dev in names:
            while True:  # refused (403) while still attached, until H2 clears the attachment
                try:
                    await self.custom.delete_namespaced_custom_object(
                        DEV_GROUP, DEV_VERSION, lane.ns, "gpudevices", dev)
                    break
                except ApiException as exc:
                    if exc.status == 404:
                        break
                    if exc.status != 403 or time.monotonic() > deadline:
                        raise
                    await anyio.sleep(0.2)
        started = time.monotonic()
        ok = await wait_cached(lambda: not any((lane.ns, d) in self.seen.devices for d in names),
                          self.release_timeout)
        lane.counts["release_timeout"] += 0
        if not ok:
            await self._timed_out(lane, s, "held devices", started,
                                  [d for d in names if (lane.ns, d) in self.seen.devices])

    async def _timed_out(self, lane: Lane, s: pt.GpuSet, what: str, started: float,
                         cached: list[str]) -> None:
        """A wait for set `s`'s GPUDevices to go ran out: counted as `release_timeout`, and
        as `release_timeout_gone` when a live read finds none of the devices the watch still
        shows (the watch missed their deletion); recorded in `lane.timeouts`."""
        from kubernetes_asyncio.client import ApiException

        live = []
        for name in cached:
            try:
                await self.custom.get_namespaced_custom_object(
                    DEV_GROUP, DEV_VERSION, lane.ns, "gpudevices", name)
                live.append(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        lane.counts["release_timeout"] += 1
        lane.counts["release_timeout_gone"] += bool(cached) and not live
        lane.timeouts.append({"set": s.id, "size": s.size, "held": s.held, "what": what,
                              "started": started, "cached": cached, "live": live})

    async def _placeholder(self, lane: Lane, s: pt.GpuSet, node: str) -> None:
        """(b, c) an idle held set: a Pod bound to `node` requesting the set's GPUs."""
        await self.core.create_namespaced_pod(lane.ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"idle-{s.id}", "labels": {"pk-bench/idle": "true"}},
            "spec": {"nodeName": node, "containers": [{
                "name": "hold", "image": "bench/none",
                "resources": {"requests": {lane.res: str(s.size)},
                              "limits": {lane.res: str(s.size)}}}]}})
        await wait_cached(lambda: (lane.ns, f"idle-{s.id}") in self.seen.pods, self.release_timeout)
