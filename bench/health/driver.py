"""The health benchmark's driver: the run on a populated device-mode cluster (`HealthRun`: the
VMs, the VMI churn, the injections at their scheduled times, the claims' sampler, the final
reads), `health_on` (on a cluster already running) and `run` (on a cluster of its own,
writing health.json). The schedule is `bench.health.workload`'s, the report arithmetic
`bench.health.report`'s.

The harness has no virt-handler (no VMI is ever Running): as tests/e2e/test_health_evict.py
does, the driver stands in for virt-handler's report of a running VMI by clearing a VM's
`status.startFailure` while it waits for the VM's next VMI (`clear_start_failure`), nothing
else; without it virt-controller backs every restart off by 10 s and more. A failed start is
the launcher Pod's phase set to `Failed` once KWOK ran it (tests/e2e/test_health.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import anyio

from bench.common import (DEV_GROUP, DEV_VERSION, VMI_GROUP, VMI_VERSION, VMIS, LauncherPods,
                          admin_client, commit, machine, poll_until)
from bench.health.report import on_marked, restart_figures, suspect_figures, summary, targets
from bench.health.workload import HealthSpec, Op, pick, schedule
from bench.scale.measure import Measure
from bench.scale.population import admit, populate
from bench.scale.workload import Plan, VmiRecord
from bench.soak.driver import SOAK_ARGS
from bench.soak.workload import schedule_digest

RESOURCE = "resource.k8s.io"
KV = "kubevirt.io"
CONTROLLER_ARGS = SOAK_ARGS
"""The replicas' arguments: the soak's (short leases, bind timeout 15 s, housekeeping every
2 s); health.failedStarts 3 and health.window 30 min are the defaults."""


def _epoch(stamp: str) -> float:
    """An API timestamp ("2026-12-06T17:00:00Z") as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def uptime() -> str:
    """`uptime`'s line (the machine's load, as docs/benchmarks.md quotes it)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass
class Vm:
    """One VM of the run: its current VMI's uid, pin and recorded devices, its state
    ("starting", "running", "failed") and whether an injection took it."""

    ns: str
    name: str
    size: int
    uid: str = ""
    node: str = ""
    devices: list[str] = field(default_factory=list)
    state: str = "starting"
    touched: str = ""


class HealthRun:
    """The run on a populated cluster (`lc` a LocalCluster with KubeVirt and DRA, `api` an
    admin ApiClient): `populate()` then `run()`; `report()`."""

    def __init__(self, lc, api, spec: HealthSpec, log=print) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        from localcluster.fleet import Fleet

        self.lc, self.api, self.spec, self.log = lc, api, spec, log
        self.fleet = Fleet(api)
        self.core = CoreV1Api(api)
        self.ops = schedule(spec)
        self.pods = LauncherPods(api, spec.prefix, relist=True)
        self.vms: dict[str, Vm] = {}
        self.churn: dict[str, VmiRecord] = {}
        self.measure: Measure | None = None
        self.counts: Counter = Counter()
        self.samples: list[dict] = []           # NoExecute: one per injection
        self.marks: list[dict] = []             # devices marked: taints, suspects, losses
        self.claims: dict[str, dict] = {}       # uid -> claim as first seen allocated
        self.broken: list[dict] = []
        self.lost: list[dict] = []
        self.noschedules: list[dict] = []      # NoSchedule: one per injection
        self.fail_lock = anyio.Lock()
        self.population: dict = {}
        self.t0 = 0.0
        self.running = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- population --------------------------------------------------------------------
    async def populate(self) -> dict:
        """`bench.scale.populate` with `spec.scale_spec()`; returns its phase seconds."""
        sc = self.spec.scale_spec()
        pop = await populate(self.lc, self.lc.kubevirt, self.fleet, sc)
        self.measure = Measure(self.lc, self.fleet, pop, self.pods, Plan())
        self.population = pop.summary()
        return {f"{k}_s": round(v, 1) for k, v in pop.seconds.items()}

    # -- reads -------------------------------------------------------------------------
    async def recorded(self, ns: str, vmi: dict) -> list[str]:
        """The devices the binder recorded for admitted VMI `vmi` (its GPUDevices'
        `status.device.device`)."""
        out = []
        for g in vmi["spec"]["domain"]["devices"].get("gpus") or []:
            dev = await self.fleet.get_device(ns, g["name"])
            out.append(((dev.get("status") or {}).get("device") or {}).get("device", ""))
        return out

    async def leader_metrics(self) -> dict:
        """The leader's /metrics, parsed ({} when there is no leader or the scrape fails)."""
        from localcluster.metrics_text import parse_metrics

        who = await anyio.to_thread.run_sync(self.lc.leader)
        i = next((i for i, r in enumerate(self.lc.replicas) if r.identity == who), None)
        if i is None:
            return {}
        try:
            return parse_metrics(await anyio.to_thread.run_sync(self.lc.metrics, i))
        except OSError:
            return {}

    async def metric_sum(self, name: str, **labels: str) -> float:
        got = await self.leader_metrics()
        return sum(v for (n, ls), v in got.items()
                   if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))

    async def suspects(self) -> list[dict]:
        """The suspect DeviceTaintRules (label gpu.cozystack.io/suspect=true)."""
        from model.health_mark import SUSPECT_KEY

        got = await self.fleet.custom.list_cluster_custom_object(
            RESOURCE, "v1beta2", "devicetaintrules", label_selector=f"{SUSPECT_KEY}=true")
        return got.get("items") or []

    async def suspected(self, pool: str, device: str) -> dict | None:
        return next((r for r in await self.suspects()
                     if r["spec"]["deviceSelector"].get("pool") == pool
                     and r["spec"]["deviceSelector"].get("device") == device), None)

    async def sample_claims(self) -> None:
        """Record every allocated claim of the run's namespaces once (its creation time and
        devices)."""
        got = await self.fleet.custom.list_cluster_custom_object(RESOURCE, "v1", "resourceclaims")
        for c in got.get("items") or []:
            md = c["metadata"]
            if not md["namespace"].startswith(self.spec.prefix) or md["uid"] in self.claims:
                continue
            results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            if results:
                self.claims[md["uid"]] = {"ns": md["namespace"], "name": md["name"],
                                          "created": _epoch(md["creationTimestamp"]),
                                          "devices": [[r["pool"], r["device"]] for r in results]}

    async def claim_sampler(self) -> None:
        while self.running:
            try:
                await self.sample_claims()
            except Exception as exc:   # noqa: BLE001 — a failed read: the next one
                self.counts["claim_samples_failed"] += 1
                self.log(f"health: claims read failed: {exc!r}"[:300])
            await anyio.sleep(2)

    # -- the VMs -----------------------------------------------------------------------
    def vm_body(self, name: str, size: int) -> dict:
        """KubeVirt's vm-cirros example named `name`, runStrategy Always, asking for `size`
        template devices of the class."""
        import yaml

        from localcluster.paths import KUBEVIRT_FIXTURES

        v = copy.deepcopy(yaml.safe_load((KUBEVIRT_FIXTURES / "vm-cirros.yaml").read_text()))
        v["metadata"] = {"name": name, "labels": {"kubevirt.io/vm": name}}
        v["spec"]["runStrategy"] = "Always"
        v["spec"]["template"]["metadata"]["annotations"] = {
            "gpu.cozystack.io/templates": f"{self.spec.cls}={size}"}
        return v

    async def clear_start_failure(self, ns: str, name: str) -> None:
        """What virt-handler's report of a running VMI does to the VM: `status.startFailure`
        cleared (under a resourceVersion test; a lost race is retried by the caller's next
        poll)."""
        from kubernetes_asyncio.client import ApiException

        vm = await self.fleet.custom.get_namespaced_custom_object(KV, "v1", ns, "virtualmachines", name)
        if not (vm.get("status") or {}).get("startFailure"):
            return
        try:
            await self.fleet.custom.patch_namespaced_custom_object_status(
                KV, "v1", ns, "virtualmachines", name,
                [{"op": "test", "path": "/metadata/resourceVersion",
                  "value": vm["metadata"]["resourceVersion"]},
                 {"op": "remove", "path": "/status/startFailure"}],
                _content_type="application/json-patch+json")
            self.counts["start_failures_cleared"] += 1
        except ApiException as exc:
            if exc.status not in (409, 422):
                raise

    async def vm_running(self, vm: Vm, old_uid: str, timeout: float) -> bool:
        """Wait until VM `vm` has a VMI other than `old_uid`, admitted by our webhook, whose
        launcher Pod is bound and whose claim is allocated; fill `vm` from it. False when not
        within `timeout` s."""
        from kubernetes_asyncio.client import ApiException

        from model.types import ADMISSION_ANNOTATION

        deadline = time.monotonic() + timeout
        made = None
        while time.monotonic() < deadline:
            await self.clear_start_failure(vm.ns, vm.name)
            try:
                v = await self.fleet.custom.get_namespaced_custom_object(VMI_GROUP, VMI_VERSION, vm.ns,
                                                                         VMIS, vm.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                v = None
            if (v and v["metadata"]["uid"] != old_uid and not v["metadata"].get("deletionTimestamp")
                    and (v["metadata"].get("annotations") or {}).get(ADMISSION_ANNOTATION)):
                made = v
                break
            await anyio.sleep(0.25)
        if made is None:
            return False
        uid = made["metadata"]["uid"]
        node = await self.pods.bound(uid, max(0.0, deadline - time.monotonic()))
        if not node:
            return False
        claim = ((made["spec"].get("resourceClaims") or [{}])[0]).get("resourceClaimName")

        async def allocated():
            try:
                c = await self.fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", vm.ns,
                                                                         "resourceclaims", claim)
            except ApiException:
                return False
            return bool(((c.get("status") or {}).get("allocation") or {}).get("devices"))
        if not claim or not await poll_until(allocated, max(0.0, deadline - time.monotonic()), 0.25):
            return False
        vm.uid, vm.node, vm.state = uid, node, "running"
        vm.devices = await self.recorded(vm.ns, made)
        return True

    async def create_vm(self, op: Op) -> None:
        ns = self.spec.tenant(op.tenant)
        vm = self.vms[op.name] = Vm(ns, op.name, op.size)
        await self.fleet.custom.create_namespaced_custom_object(KV, "v1", ns, "virtualmachines",
                                                                self.vm_body(op.name, op.size))
        if await self.vm_running(vm, "", 240):
            self.counts["vms_running"] += 1
        else:
            vm.state = "failed"
            self.counts["vms_not_running"] += 1
            self.log(f"health: VM {ns}/{op.name} ({op.size} GPUs) not running in 240 s")

    def take(self, op: Op) -> Vm | None:
        """The running VM `op.pick` chooses among those no injection took yet (marked taken)."""
        name = pick(sorted(n for n, v in self.vms.items() if v.state == "running" and not v.touched),
                    op.pick)
        if name is None:
            self.counts[f"{op.kind}_no_vm"] += 1
            self.log(f"health: t={self.now():.0f}s {op.kind}: no running VM to take")
            return None
        vm = self.vms[name]
        vm.touched = op.kind
        return vm

    @staticmethod
    def gpu_of(vm: Vm, op: Op) -> str:
        """The GPU of `vm`'s set the injection takes (seeded by `op.pick`)."""
        return vm.devices[int(op.pick * 1_000_003) % len(vm.devices)]

    async def taint_rule(self, node: str, device: str, effect: str, tag: str) -> dict:
        """A DeviceTaintRule (resource.k8s.io/v1beta2) on exactly `node`'s `device`."""
        from localcluster.dra_profiles import DRIVER

        return await self.fleet.custom.create_cluster_custom_object(RESOURCE, "v1beta2", "devicetaintrules", {
            "apiVersion": f"{RESOURCE}/v1beta2", "kind": "DeviceTaintRule",
            "metadata": {"name": f"{self.spec.prefix}{tag}-{node}-{device}"},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": node, "device": device},
                     "taint": {"key": "gpu.example.com/xid", "value": "79", "effect": effect}}})

    # -- the injections ------------------------------------------------------------------
    async def noexecute(self, op: Op) -> None:
        """A NoExecute taint on a GPU of a running VM: time to the eviction (the launcher Pod
        deleted or gone) and to the VM running again (`vm_running`)."""
        vm = self.take(op)
        if vm is None:
            return
        device, node, old = self.gpu_of(vm, op), vm.node, vm.uid
        sample = {"vm": f"{vm.ns}/{vm.name}", "size": vm.size, "node": node, "device": device,
                  "at": round(self.now(), 1), "eviction_s": None, "running_s": None}
        self.samples.append(sample)
        t = time.monotonic()
        rule = await self.taint_rule(node, device, "NoExecute", "noexec")
        self.marks.append({"pool": node, "device": device, "kind": "NoExecute",
                           "since": _epoch(rule["metadata"]["creationTimestamp"])})

        async def evicted():
            got = await self.core.list_namespaced_pod(vm.ns, label_selector=f"kubevirt.io/created-by={old}")
            return not [p for p in got.items if not p.metadata.deletion_timestamp]
        if not await poll_until(evicted, 120, 0.2):
            self.log(f"health: {vm.ns}/{vm.name}'s launcher Pod not evicted in 120 s")
            return
        sample["eviction_s"] = round(time.monotonic() - t, 2)
        if await self.vm_running(vm, old, 180):
            sample["running_s"] = round(time.monotonic() - t, 2)
            sample["again_on"] = [vm.node, *vm.devices]
        else:
            vm.state = "failed"
        self.log(f"health: t={self.now():.0f}s NoExecute {node}/{device} ({vm.name}, {vm.size} "
                 f"GPUs): evicted after {sample['eviction_s']} s, running again after "
                 f"{sample['running_s']} s")

    async def noschedule(self, op: Op) -> None:
        """A NoSchedule taint on a GPU of a running VM (which keeps running)."""
        vm = self.take(op)
        if vm is None:
            return
        device = self.gpu_of(vm, op)
        rule = await self.taint_rule(vm.node, device, "NoSchedule", "nosched")
        self.marks.append({"pool": vm.node, "device": device, "kind": "NoSchedule",
                           "since": _epoch(rule["metadata"]["creationTimestamp"])})
        self.noschedules.append({"vm": f"{vm.ns}/{vm.name}", "uid": vm.uid, "node": vm.node,
                                "device": device})

    async def lose(self, op: Op) -> None:
        """A GPU of a running VM republished without the class's topology attribute
        (`gpuModuleID` and every `partitionN` dropped, the pool's generation bumped), as
        dra-driver-nvidia-gpu#1331 publishes a GPU left bound to vfio."""
        from localcluster.dra_profiles import DRIVER

        vm = self.take(op)
        if vm is None:
            return
        device = self.gpu_of(vm, op)
        name = f"{vm.node}-{DRIVER}"
        sl = await self.fleet.custom.get_cluster_custom_object(RESOURCE, "v1", "resourceslices", name)
        for d in sl["spec"]["devices"]:
            if d["name"] == device:
                d["attributes"] = {k: v for k, v in d["attributes"].items()
                                   if k != "gpuModuleID" and not k.startswith("partition")}
        sl["spec"]["pool"]["generation"] += 1
        await self.fleet.custom.replace_cluster_custom_object(RESOURCE, "v1", "resourceslices", name, sl)
        self.lost.append({"vm": f"{vm.ns}/{vm.name}", "pool": vm.node, "device": device,
                          "at": round(self.now(), 1)})
        self.marks.append({"pool": vm.node, "device": device, "kind": "attribute-lost",
                           "since": time.time()})

    async def fail_start(self, rec: VmiRecord) -> float | None:
        """`rec`'s launcher Pod, once bound and Running, set `Failed` (a GPU fallen off the
        bus), and wait until the leader counted it (`gpu_binder_failed_starts_total` up by one;
        the failures are serialised so the count is this one's). The monotonic time the
        failure was written; None when the Pod did not run or the failure was not counted
        within 90 s."""
        if not await self.pods.bound(rec.uid, 120):
            return None
        pod = None

        async def running():
            nonlocal pod
            got = await self.core.list_namespaced_pod(rec.namespace,
                                                      label_selector=f"kubevirt.io/created-by={rec.uid}")
            pod = next((p for p in got.items if p.status.phase == "Running"), None)
            return pod is not None
        if not await poll_until(running, 90, 0.3):
            return None
        async with self.fail_lock:
            before = await self.metric_sum("gpu_binder_failed_starts_total")
            await self.core.patch_namespaced_pod_status(
                pod.metadata.name, rec.namespace,
                {"status": {"phase": "Failed", "reason": "Error",
                            "message": "qemu: vfio: failed to open /dev/vfio/42 (GPU has fallen off the bus)"}},
                _content_type="application/merge-patch+json")
            failed_at = time.monotonic()

            async def counted():
                return await self.metric_sum("gpu_binder_failed_starts_total") >= before + 1
            return failed_at if await poll_until(counted, 90, 0.3) else None

    async def broken_device(self, op: Op) -> None:
        """A broken device: held GPUDevice `op.name` placed by the first of `failed_starts`
        one-GPU VMIs naming it, each failing to start in turn (so on one GPU, B6); when the
        suspect mark on that GPU was first seen (after which failure: looked for right after
        each failure was counted and again once the held device was released) and how long
        after the last failure was written (`mark_s`)."""
        s, ns = self.spec, self.spec.tenant(op.tenant)
        b = {"held": f"{ns}/{op.name}", "pool": "", "device": "", "suspected_after": None,
             "failed": 0, "mark_s": None}
        self.broken.append(b)
        await self.fleet.device(ns, op.name, s.cls)
        for i in range(s.failed_starts):
            rec = VmiRecord(ns, f"{op.name}-s{i}", s.cls, 1, held=(op.name,))
            await admit(self.fleet, rec, self.counts)
            if not rec.admitted:
                b["refused"] = rec.refusal
                self.log(f"health: broken {op.name} start {i}: refused {rec.refusal}")
                return
            if not b["device"]:
                ref = ((await self.fleet.get_device(ns, op.name)).get("status") or {}).get("device") or {}
                b["pool"], b["device"] = ref.get("pool", ""), ref.get("device", "")
            t = await self.fail_start(rec)
            if t is None:
                b["error"] = f"start {i} did not run or was not counted"
                self.log(f"health: broken {op.name}: {b['error']}")
                return
            b["failed"] = i + 1
            if i + 1 < s.failed_starts:
                if b["suspected_after"] is None and await self.suspected(b["pool"], b["device"]):
                    b["suspected_after"] = i + 1
            else:
                async def marked():
                    return await self.suspected(b["pool"], b["device"])
                if await poll_until(marked, 60, 0.3):
                    b["mark_s"] = round(time.monotonic() - t, 2)
                    if b["suspected_after"] is None:
                        b["suspected_after"] = i + 1
            await self.measure.release([rec])

            async def released():
                dev = await self.fleet.get_device(ns, op.name)
                return (dev.get("status") or {}).get("attachedTo") is None
            if i + 1 < s.failed_starts:
                if not await poll_until(released, 90, 0.5):
                    b["error"] = f"{op.name}'s attachment not cleared after start {i}"
                    return
                # seconds later (the release), still not suspected before the next failure
                if b["suspected_after"] is None and await self.suspected(b["pool"], b["device"]):
                    b["suspected_after"] = i + 1
        rule = await self.suspected(b["pool"], b["device"])
        if rule:
            self.marks.append({"pool": b["pool"], "device": b["device"], "kind": "suspect",
                               "since": _epoch(rule["metadata"]["creationTimestamp"])})
        self.log(f"health: t={self.now():.0f}s broken {b['pool']}/{b['device']}: suspected after "
                 f"failed start {b['suspected_after']} ({b['mark_s']} s after the last)")

    # -- the churn -----------------------------------------------------------------------
    async def create(self, op: Op) -> None:
        rec = self.churn[op.name] = VmiRecord(self.spec.tenant(op.tenant), op.name, self.spec.cls, op.size)
        await admit(self.fleet, rec, self.counts)
        self.counts["churn_admitted" if rec.admitted else "churn_refused"] += 1
        if rec.admitted:
            rec.node = await self.pods.bound(rec.uid, 120)
            if not rec.node:
                self.counts["churn_not_bound"] += 1

    async def delete(self, op: Op) -> None:
        rec = self.churn.get(op.name)
        if rec is None or not rec.admitted:
            return
        await self.measure.release([rec])
        self.counts["churn_deleted"] += 1

    async def _op(self, op: Op) -> None:
        try:
            await {"vm": self.create_vm, "create": self.create, "delete": self.delete,
                   "noexecute": self.noexecute, "noschedule": self.noschedule, "lose": self.lose,
                   "broken": self.broken_device}[op.kind](op)
        except Exception as exc:   # noqa: BLE001 — an op's failure is a figure, not the end
            self.counts[f"op_error_{op.kind}"] += 1
            self.log(f"health: t={self.now():.0f}s {op.kind} {op.name} failed: {exc!r}"[:600])

    # -- the whole run -------------------------------------------------------------------
    async def run(self) -> dict:
        """The ops at their scheduled times (each in its own task) with the claims' sampler
        and the launcher Pods' watch; then the final reads. Returns the report."""
        s = self.spec
        self.log(f"health: seed {s.seed}, {len(self.ops)} operations over {s.minutes:g} min, "
                 f"schedule {schedule_digest(self.ops)}")
        async with anyio.create_task_group() as outer:
            outer.start_soon(self.pods.watch)
            self.t0, self.running = time.monotonic(), True
            outer.start_soon(self.claim_sampler)
            async with anyio.create_task_group() as tg:
                for op in self.ops:
                    wait = op.at - self.now()
                    if wait > 0:
                        await anyio.sleep(wait)   # pacing the seeded schedule
                    tg.start_soon(self._op, op)
                self.log(f"health: t={self.now():.0f}s last operation started; waiting for them")
            self.ops_s = round(self.now(), 1)
            await self.sample_claims()
            self.running = False
            final = await self.final()
            outer.cancel_scope.cancel()
        return self.report(final)

    async def final(self) -> dict:
        """The last reads: every suspect mark (as marks too), the devices the leader reports
        lost (waited for up to 30 s to reach the losses injected), the NoSchedule VMs still
        running."""
        rules = await self.suspects()
        suspected = [[r["spec"]["deviceSelector"].get("pool", ""), r["spec"]["deviceSelector"].get("device", "")]
                     for r in rules]
        known = {(m["pool"], m["device"], m["kind"]) for m in self.marks}
        for r, (pool, device) in zip(rules, suspected):
            if (pool, device, "suspect") not in known:
                self.marks.append({"pool": pool, "device": device, "kind": "suspect",
                                   "since": _epoch(r["metadata"]["creationTimestamp"])})
        reported = 0.0

        async def reported_all():
            nonlocal reported
            reported = await self.metric_sum("gpu_binder_devices_lost", reason="attribute-lost")
            return reported >= len(self.lost)
        await poll_until(reported_all, 30, 1)
        kept = sum(1 for n in self.noschedules if n["uid"] in self.pods.by_uid)
        return {"suspected": suspected, "lost_reported": int(reported), "noschedule_kept": kept,
                "suspected_metric": await self.metric_sum("gpu_binder_devices_suspected"),
                "failed_starts_metric": await self.metric_sum("gpu_binder_failed_starts_total")}

    def report(self, final: dict) -> dict:
        s = self.spec
        placements = on_marked(list(self.claims.values()), self.marks)
        return {"seed": s.seed, "schedule": schedule_digest(self.ops), "nodes": s.nodes,
                "spec": {**s.__dict__, "vmi_life": list(s.vmi_life), "vms": s.n_vms,
                         "tenants": s.n_tenants},
                "ops_s": self.ops_s, "counts": dict(self.counts),
                "restart": restart_figures(self.samples), "noexecute": self.samples,
                "suspects": suspect_figures(self.broken, final["suspected"], s.failed_starts),
                "broken": self.broken,
                "placements": {**placements, "claims_seen": len(self.claims),
                               "marks": len(self.marks)},
                "noschedule": {"injected": len(self.noschedules), "vm_kept": final["noschedule_kept"]},
                "lost": {"injected": len(self.lost), "reported": final["lost_reported"],
                         "devices": self.lost},
                "metrics": {"devices_suspected": final["suspected_metric"],
                            "failed_starts": final["failed_starts_metric"]},
                "vms": {"made": len(self.vms),
                        "running_at_end": sum(1 for v in self.vms.values() if v.state == "running")}}


async def health_on(lc, spec: HealthSpec, log=print) -> dict:
    """Populate and run on a running LocalCluster `lc` (KubeVirt and DRA started); the report
    with the population's phase seconds and summary."""
    async with await admin_client(lc, 64) as api:
        h = HealthRun(lc, api, spec, log)
        phases = await h.populate()
        log(f"health: populated {spec.nodes} HGX nodes: {phases}")
        report = await h.run()
        report["population_s"] = phases
        report["population"] = h.population
        return report


def run(out: Path, *, nodes: int = 100, minutes: float = 4.0, seed: int = 1) -> dict:
    """The benchmark on a cluster of its own (2 replicas with CONTROLLER_ARGS, KubeVirt with
    `GPUsWithDRA`, kube-controller-manager's claim and device-taint eviction controllers);
    writes health.json into `out`; returns the report. ValueError (before any cluster starts)
    when the schedule does not fit."""
    from localcluster.cluster import LocalCluster

    spec = HealthSpec(nodes=nodes, minutes=minutes, seed=seed)
    ops = schedule(spec)
    out.mkdir(parents=True, exist_ok=True)
    print(f"health: seed {seed}, schedule {schedule_digest(ops)}: {len(ops)} operations over "
          f"{minutes:g} min on {nodes} HGX nodes", flush=True)
    head = {"benchmark": "health", "started": datetime.now().astimezone().isoformat(timespec="seconds"),
            "load_before": os.getloadavg(), "uptime_before": uptime(), "machine": machine(),
            "commit": commit(), "controller_args": list(CONTROLLER_ARGS)}
    t = time.monotonic()
    with LocalCluster(controllers=2, controller_args=CONTROLLER_ARGS, log_dir=out / "logs",
                      kubevirt=True, dra=True) as lc:
        report = {**head, **anyio.run(health_on, lc, spec, lambda m: print(m, flush=True))}
    report["load_after"] = os.getloadavg()
    report["uptime_after"] = uptime()
    report["wall_s"] = round(time.monotonic() - t, 1)
    report["targets"] = targets(report)
    (out / "health.json").write_text(json.dumps(report, indent=1))
    for line in summary(report):
        print(line, flush=True)
    return report
