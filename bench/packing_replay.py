"""The packing benchmark's replay (`bench.packing`): what the watches see of the cluster
(`Seen`), one system on one load (`Lane`), the request body of one GPU set (`vmi_body`) and
the replay of a lane's trace window by window (`Replayer`)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import anyio

from bench import packing_trace as pt
from bench.common import DEV_GROUP, DEV_VERSION, VMI_GROUP, VMI_VERSION, base_vmi, gpu_vmi
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
    """(namespace, name) -> {uid: created-by VMI uid, node, unschedulable, gpus}."""

    def used_per_node(self, lane: "Lane") -> dict[str, int]:
        """{node: GPUs in use} of `lane`: its Bound devices (a, e) or its bound Pods' GPUs."""
        used: dict[str, int] = defaultdict(int)
        if lane.system in ("a", "e"):
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
    seen.pods[key] = {"uid": (meta.get("labels") or {}).get("kubevirt.io/created-by", ""),
                      "node": obj["spec"].get("nodeName"), "unschedulable": unsched, "gpus": gpus}


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


def vmi_body(name: str, lane: Lane, s: pt.GpuSet) -> dict:
    """KubeVirt's vmi-gpu example for set `s` of `lane`: through our webhook (a, e) asking for
    its held devices or its class's templates; for kube-scheduler (b, c) its GPUs in
    `spec.domain.devices.gpus`, (c) on the MostAllocated profile."""
    labels = {"pk-bench/set": str(s.id)}
    if lane.system in ("a", "e"):
        return gpu_vmi(name, held=tuple(held_names(s)) if s.held else (), cls=lane.cls,
                       size=s.size, labels=labels)
    v = base_vmi()
    v["apiVersion"] = f"{VMI_GROUP}/{VMI_VERSION}"
    v["metadata"] = {"name": name, "labels": labels}
    v["spec"]["domain"]["devices"]["gpus"] = [{"name": f"gpu{k}", "deviceName": lane.res}
                                              for k in range(s.size)]
    if lane.system == "c":
        v["spec"]["schedulerName"] = MOST_ALLOCATED
    return v


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
            used = self.seen.used_per_node(lane)
            free = [pt.GPUS_PER_NODE - used.get(n, 0) for n in lane.nodes]
            lane.outcome.timeline.append(((w + 0.5) * window, lane.running, lane.held_idle,
                                          pt.largest_placeable(free)))
        lane.seconds = time.monotonic() - started

    async def _arrive(self, lane: Lane, s: pt.GpuSet) -> None:
        from kubernetes_asyncio.client import ApiException

        name = f"s{s.id}"
        if lane.system in ("a", "e") and s.held:
            for dev in held_names(s):
                await self.custom.create_namespaced_custom_object(
                    DEV_GROUP, DEV_VERSION, lane.ns, "gpudevices",
                    {"apiVersion": f"{DEV_GROUP}/{DEV_VERSION}", "kind": "GPUDevice",
                     "metadata": {"name": dev}, "spec": {"class": lane.cls}})
        try:
            made = await self._create_vmi(lane, name, s)
        except ApiException as exc:
            lane.counts["refused" if exc.status in (400, 403, 422) else f"error_{exc.status}"] += 1
            if lane.system in ("a", "e") and s.held:
                await self._delete_held(lane, s)
            return
        uid = made["metadata"]["uid"]
        lane.vmi_uid[s.id] = uid

        def outcome() -> bool:
            got = self.seen.pod_of(lane.ns, uid)
            return got is not None and (bool(got[1]["node"]) or got[1]["unschedulable"])
        await wait_cached(outcome, self.deadline)
        got = self.seen.pod_of(lane.ns, uid)
        if got is not None and got[1]["node"]:
            lane.placed[s.id] = got[1]["node"]
            lane.outcome.started.add(s.id)
            lane.running += s.size
            if lane.system in ("a", "e"):
                pin = (made["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
                lane.counts["pin_agrees"] += pin == got[1]["node"]
            return
        lane.counts["unschedulable" if got is not None else "no_launcher_pod"] += 1
        await self._stop_vmi(lane, s)
        if lane.system in ("a", "e"):  # admitted, yet its Pod never bound: withdraw it whole
            lane.counts["admitted_not_bound"] += 1
            if s.held:
                await self._delete_held(lane, s)

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
            await self._stop_vmi(lane, s)
            lane.running -= s.size
            if s.idle:
                lane.held_idle += s.size
                if lane.system in ("b", "c"):
                    await self._placeholder(lane, s, node)
                return
        else:
            lane.held_idle -= s.size
            if lane.system in ("b", "c"):
                await self._delete_pod(lane.ns, f"idle-{s.id}")
        if lane.system in ("a", "e") and s.held:
            await self._delete_held(lane, s)
        elif lane.system in ("a", "e"):  # H2 deletes the template devices
            vmi = f"s{s.id}"
            ok = await wait_cached(lambda: not any(ns == lane.ns and t == vmi
                                              for (ns, _), (_, t) in self.seen.devices.items()),
                              self.release_timeout)
            lane.counts["release_timeout"] += not ok
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
        ok = await wait_cached(lambda: not any((lane.ns, d) in self.seen.devices for d in names),
                          self.release_timeout)
        lane.counts["release_timeout"] += not ok

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
