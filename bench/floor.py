"""The API's floor beside our admission, in the same run (`gpu-binder bench floor`, issue 40).

Starts the whole system (`localcluster.cluster.LocalCluster`: etcd, kube-apiserver, two
controller replicas, the webhook registered, the shipped API Priority and Fairness objects,
and with device mode NVIDIA's DeviceClass) and a fleet of 8-GPU nodes per mode (count: the
extended resource; device: HGX boards publishing their ResourceSlices). Then per mode and set
size (8, 4, 1 GPUs: larger first, on the emptiest fleet), on the one API server:

(a) **the floor**: the contract's writes of one admission made by a plain kubernetes-asyncio
    client in sequence, as the controller's own ServiceAccount (so its requests meet the same
    priority level as ours): the template GPUDevices created (in parallel), the
    attachment+request JSON Patch of each (in parallel; `test` of the resourceVersion the
    create answered: no read), the first watch delivery (the patches seen on a watch), the
    binder's status write of each (in parallel; its `test`s, phase Bound, node, result; device
    mode the `status.device` record), the second watch delivery, in device mode the VMI's
    ResourceClaim (the spec our webhook made for a set of that size), and the VMI's own create
    (as the tenant, no GPU annotation: no webhook). Its devices name a GPUClass that does not
    exist and one more member that never appears, so our binder never acts on them; each
    sample's objects are deleted, untimed, before the next.
(b) **ours**: a VMI of that size created through the API server as a tenant's user (so the
    shipped FlowSchema classifies it, not the admin's `exempt`), quiet (one at a time,
    interleaved with (a): the same moment) and at concurrency 20.

Around every level it reads the replicas' /metrics (the phase histogram
`gpu_binder_admission_phase_seconds`, `gpu_binder_admission_seconds`,
`gpu_binder_decision_seconds`) and kube-apiserver's `apiserver_flowcontrol_*`, so each level
has the mean ms per phase of our answer (`bench.floor_report.phase_means`: the gap named) and
each priority level's dispatched, rejected and queue-wait figures. After every level of ours
it reads the replicas' logs (LocalCluster's `controller-<i>.log`) and splits the webhook's
`wait-result` of each VMI that level admitted by its request id
(`bench.floor_report.wait_split`: delivery to the leader, its queue, the decision, the status
write, delivery back, the rest; admissions whose lines are missing counted as unjoined). `seats`: the concurrency-20
level of 1-GPU VMIs again per mode with the shipped PriorityLevelConfiguration's
nominalConcurrencyShares set to give about that many seats (`bench.apf.shares_for`; the
report gives the seats the server then says), then restored. Writes `floor.json`; prints one
line per level and the load before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from bench import apf, floor_report as fr
from bench.common import (Benchmark, add_modes, add_out, add_quick, commit, error_text,
                          machine, mode_fleet, modes as parse_modes, positive_ints,
                          replica_samples, watch_namespaced)
from model.types import GROUP, TEMPLATE_FOR_LABEL, VERSION

if TYPE_CHECKING:  # the cluster's harness is imported when the benchmark runs
    from localcluster.cluster import LocalCluster

RES = "nvidia.com/GH100_H100"
CLASS_OF = {"count": "h100", "device": "hgx-h100"}  # device: localcluster.dra_world.HGX_CLASS
NODE_PREFIX = {"count": "floor-node", "device": "floor-hgx"}
OURS, FLOOR = "floor-vmis", "floor-api"
"""The tenants: our webhook's VMIs, and the floor's objects."""
USER = "floor-user"
TENANTS = "gpu-binder:tenants"
FLOOR_CLASS = "floor-none"   # a GPUClass that does not exist: the binder counts nothing of it
FLOOR_NODE = "floor-nowhere"  # a node that does not exist
FIELD_MANAGER = "gpu-binder-floor"
SIZES = (8, 4, 1)
CONCURRENCY = 20
WARM = 3  # admitted warm-up VMIs per mode (both replicas' caches and connections ready)
JSON_PATCH, MERGE = "application/json-patch+json", "application/merge-patch+json"


def _plan(quick: bool) -> dict:
    """Samples per level: quiet (one at a time, each with a floor sample), busy (VMIs at
    concurrency 20), seats (VMIs per seat count)."""
    return {"quiet": 8, "busy": 20, "seats": 20} if quick else \
        {"quiet": 40, "busy": 60, "seats": 60}


def nodes_needed(plan: dict, sizes: tuple[int, ...], seats: tuple[int, ...]) -> int:
    """8-GPU nodes per mode for every VMI the run admits (VMIs never stop), with room to
    spare for packing."""
    gpus = WARM + sum(g * (plan["quiet"] + plan["busy"]) for g in sizes) \
        + len(seats) * plan["seats"]
    return math.ceil(gpus * 1.3 / 8) + 2


class Watched:
    """The floor's watch of GPUDevices in FLOOR: the last resourceVersion seen per name;
    `until(name, rv)` returns once the watch delivered that version (or a later one)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.waits: dict[str, list[tuple[int, anyio.Event]]] = {}

    def on_event(self, kind: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.seen.pop(name, None)
            return
        rv = int(obj["metadata"]["resourceVersion"])
        self.seen[name] = rv
        left = []
        for want, ev in self.waits.pop(name, []):
            (ev.set() if want <= rv else left.append((want, ev)))  # type: ignore[func-returns-value]
        if left:
            self.waits[name] = left

    async def until(self, name: str, rv: int, timeout: float = 30.0) -> None:
        """Raises TimeoutError when the watch has not shown it within `timeout` s."""
        if self.seen.get(name, -1) >= rv:
            return
        ev = anyio.Event()
        self.waits.setdefault(name, []).append((rv, ev))
        with anyio.fail_after(timeout):
            await ev.wait()


async def _all(fn, items) -> list:
    """`await fn(item)` for each item at once; the answers in order."""
    out: list = [None] * len(items)

    async def one(i: int) -> None:
        out[i] = await fn(items[i])
    async with anyio.create_task_group() as tg:
        for i in range(len(items)):
            tg.start_soon(one, i)
    return out


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _vmi(name: str, templates: str | None = None) -> dict:
    meta: dict = {"name": name}
    if templates:
        meta["annotations"] = {"gpu.cozystack.io/templates": templates}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
            "spec": {"domain": {"devices": {}}}}


class Floor:
    """The floor's clients: `sa` (CustomObjectsApi as the controller's ServiceAccount),
    `tenant` (as the tenant's user), `admin` (clean-up), the watch."""

    def __init__(self, sa, tenant, admin, watched: Watched) -> None:
        self.sa, self.tenant, self.admin, self.watched = sa, tenant, admin, watched

    async def once(self, mode: str, g: int, i: int, claim_spec: dict | None) -> dict[str, float]:
        """One admission's writes and deliveries in order; seconds per step."""
        from model.claim import (CLAIM_ADMISSION, CLAIM_FOR, CLAIMED_AT, MANAGED_BY,
                                 MANAGED_BY_LABEL, RESOURCE_API, claim_for_label, claim_name)

        vmi = f"fl-{mode[0]}{g}-{i}"
        names = [f"{vmi}-{k}" for k in range(g)]
        admission = uuid.uuid4().hex
        steps: dict[str, float] = {}
        t = time.perf_counter()

        def lap(step: str) -> None:
            nonlocal t
            now = time.perf_counter()
            steps[step], t = now - t, now

        async def create(name: str) -> int:
            got = await self.sa.create_namespaced_custom_object(
                GROUP, VERSION, FLOOR, "gpudevices", {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                    "metadata": {"name": name, "labels": {TEMPLATE_FOR_LABEL: vmi}},
                    "spec": {"class": FLOOR_CLASS}}, field_manager=FIELD_MANAGER)
            return int(got["metadata"]["resourceVersion"])
        versions = dict(zip(names, await _all(create, names)))
        lap("template-create")
        request = {"id": admission, "vmi": vmi, "devices": [*names, f"{vmi}-absent"],
                   "requestedAt": _now()}
        attachment = {"vmi": vmi, "since": _now(), "admission": admission}

        async def patch(name: str, ops: list[dict]) -> int:
            got = await self.sa.patch_namespaced_custom_object_status(
                GROUP, VERSION, FLOOR, "gpudevices", name, ops, field_manager=FIELD_MANAGER,
                _content_type=JSON_PATCH)
            return int(got["metadata"]["resourceVersion"])

        async def attach(name: str) -> int:
            return await patch(name, [
                {"op": "test", "path": "/metadata/resourceVersion", "value": str(versions[name])},
                {"op": "add", "path": "/status",
                 "value": {"attachedTo": attachment, "bindRequest": request}}])
        versions = dict(zip(names, await _all(attach, names)))
        lap("attach")
        await _all(lambda n: self.watched.until(n, versions[n]), names)
        lap("watch-1")

        async def answer(name: str) -> int:
            k = names.index(name)
            ops = [{"op": "test", "path": "/status/bindRequest/id", "value": admission},
                   {"op": "test", "path": "/metadata/resourceVersion", "value": str(versions[name])},
                   {"op": "add", "path": "/status/phase", "value": "Bound"},
                   {"op": "add", "path": "/status/nodeName", "value": FLOOR_NODE},
                   {"op": "add", "path": "/status/boundAt", "value": _now()}]
            if mode == "device":
                ops.append({"op": "add", "path": "/status/device", "value": {
                    "driver": "gpu.nvidia.com", "pool": FLOOR_NODE, "device": f"gpu-{k}"}})
            ops += [{"op": "add", "path": "/status/bindRequest/node", "value": FLOOR_NODE},
                    {"op": "add", "path": "/status/bindRequest/result", "value": "Succeeded"},
                    {"op": "add", "path": "/status/bindRequest/message",
                     "value": f"placed on {FLOOR_NODE}"}]
            return await patch(name, ops)
        versions = dict(zip(names, await _all(answer, names)))
        lap("binder-write")
        await _all(lambda n: self.watched.until(n, versions[n]), names)
        lap("watch-2")
        if mode == "device" and claim_spec is not None:
            await self.sa.create_namespaced_custom_object(
                "resource.k8s.io", "v1", FLOOR, "resourceclaims", {
                    "apiVersion": RESOURCE_API, "kind": "ResourceClaim",
                    "metadata": {"name": claim_name(vmi),
                                 "labels": {MANAGED_BY_LABEL: MANAGED_BY,
                                            CLAIM_FOR: claim_for_label(vmi)},
                                 "annotations": {CLAIM_FOR: vmi, CLAIM_ADMISSION: admission,
                                                 CLAIMED_AT: _now()}},
                    "spec": claim_spec}, field_manager=FIELD_MANAGER)
            lap("claim")
        await self.tenant.create_namespaced_custom_object("kubevirt.io", "v1", FLOOR,
                                                          "virtualmachineinstances", _vmi(vmi))
        lap("vmi-create")
        return steps

    async def clean(self, mode: str, g: int, i: int) -> None:
        """Delete sample i's objects (its devices' status cleared first: the shipped policy
        refuses deleting an attached device); untimed, errors ignored."""
        from kubernetes_asyncio.client import ApiException

        from model.claim import claim_name

        vmi = f"fl-{mode[0]}{g}-{i}"

        async def device(name: str) -> None:
            try:
                await self.admin.patch_namespaced_custom_object_status(
                    GROUP, VERSION, FLOOR, "gpudevices", name,
                    {"status": {"attachedTo": None, "bindRequest": None}}, _content_type=MERGE)
                await self.admin.delete_namespaced_custom_object(GROUP, VERSION, FLOOR,
                                                                 "gpudevices", name)
            except ApiException:
                pass

        async def other(what: tuple[str, str, str, str]) -> None:
            try:
                await self.admin.delete_namespaced_custom_object(what[0], what[1], FLOOR,
                                                                 what[2], what[3])
            except ApiException:
                pass
        await _all(device, [f"{vmi}-{k}" for k in range(g)])
        await _all(other, [("kubevirt.io", "v1", "virtualmachineinstances", vmi)]
                   + ([("resource.k8s.io", "v1", "resourceclaims", claim_name(vmi))]
                      if mode == "device" else []))


async def _ours_once(tenant, mode: str, g: int, name: str) -> float | str:
    """Our admission of one VMI: seconds to the API server's answer, or the refusal's text."""
    from kubernetes_asyncio.client import ApiException

    t0 = time.perf_counter()
    try:
        await tenant.create_namespaced_custom_object(
            "kubevirt.io", "v1", OURS, "virtualmachineinstances",
            _vmi(name, f"{CLASS_OF[mode]}={g}"), _request_timeout=60)
    except ApiException as exc:
        return error_text(exc, f"create VMI {name}")[:200]
    return time.perf_counter() - t0


async def _busy(tenant, mode: str, g: int, count: int, tag: str,
                admitted: list[str] | None = None) -> dict:
    """`count` VMIs from CONCURRENCY clients: latency figures, admissions/s, refusals; the
    names of the VMIs admitted appended to `admitted` when given."""
    latencies: list[float] = []
    refused: list[str] = []
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            name = f"{tag}-{queue.pop()}"
            got = await _ours_once(tenant, mode, g, name)
            (latencies.append(got) if isinstance(got, float) else refused.append(got))  # type: ignore[func-returns-value]
            if isinstance(got, float) and admitted is not None:
                admitted.append(name)
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(CONCURRENCY):
            tg.start_soon(worker)
    elapsed = time.perf_counter() - started
    return {**fr.latency(latencies), "concurrency": CONCURRENCY,
            "admissions_per_s": round(len(latencies) / elapsed, 2), "refused": len(refused),
            "first_refusal": refused[0] if refused else None}


async def _scrape(lc: LocalCluster, admin) -> tuple[fr.Samples, fr.Samples]:
    """(the live replicas' samples summed, kube-apiserver's flow-control samples)."""
    return await replica_samples(lc), await apf.flow_samples(admin)


def _wait_split(lc: LocalCluster, vmis: list[str]) -> dict:
    """`bench.floor_report.wait_split` of our VMIs `vmis` from every replica's log file."""
    logs = {r.identity: fr.log_entries(r.log_path.read_text(errors="replace"))
            for r in lc.replicas if r.log_path.exists()}
    return fr.wait_split(logs, OURS, vmis)


def _inside(before: tuple[fr.Samples, fr.Samples], after: tuple[fr.Samples, fr.Samples]) -> dict:
    rep = fr.delta(before[0], after[0])
    return {"phases": fr.phase_means(rep), "replicas": fr.replica_means(rep),
            "apf": fr.apf(fr.delta(before[1], after[1]))}


async def _claim_spec(admin, vmi: str) -> dict | None:
    """The spec of the ResourceClaim our webhook made for VMI `vmi` (None: none)."""
    from kubernetes_asyncio.client import ApiException

    from model.claim import claim_name

    try:
        got = await admin.get_namespaced_custom_object("resource.k8s.io", "v1", OURS,
                                                       "resourceclaims", claim_name(vmi))
    except ApiException:
        return None
    return got.get("spec")


async def _make_fleet(fleet, nodes: int, modes: tuple[str, ...]) -> None:
    await mode_fleet(fleet, nodes, modes, res=RES, class_of=CLASS_OF, node_prefix=NODE_PREFIX)
    await fleet.tenant(OURS, user=USER)
    await fleet.tenant(FLOOR, user=USER)


async def _warm(tenant, mode: str) -> None:
    """Until WARM VMIs of 1 GPU are admitted (the replicas' caches hold the fleet); raises
    RuntimeError after 90 s."""
    admitted, i = 0, 0
    with anyio.move_on_after(90):
        while admitted < WARM:
            got = await _ours_once(tenant, mode, 1, f"warm-{mode}-{i}")
            i += 1
            if isinstance(got, float):
                admitted += 1
            else:
                await anyio.sleep(0.5)  # the caches are still filling: a retry's pause
    if admitted < WARM:
        raise RuntimeError(f"{mode}: no admission within 90 s of warm-up")


async def _measure(lc: LocalCluster, report: dict, plan: dict, sizes: tuple[int, ...],
                   modes: tuple[str, ...], seats: tuple[int, ...], workdir: Path) -> None:
    from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi
    from kubernetes_asyncio.config import load_kube_config

    from localcluster.fleet import Fleet

    async def client(path: Path, pool: int) -> ApiClient:
        cfg = Configuration()
        await load_kube_config(config_file=str(path), client_configuration=cfg)
        cfg.connection_pool_maxsize = pool
        return ApiClient(configuration=cfg)

    admin_api = await client(Path(lc.cp.admin_kubeconfig), 32)
    user_path = lc.cp.write_user_kubeconfig(workdir / f"{USER}.kubeconfig", USER, (TENANTS,),
                                            namespace=OURS)
    tenant_api = await client(user_path, 2 * CONCURRENCY)
    sa_api = await client(Path(lc.kubeconfig), 32)
    try:
        admin, tenant, sa = (CustomObjectsApi(admin_api), CustomObjectsApi(tenant_api),
                             CustomObjectsApi(sa_api))
        await _make_fleet(Fleet(admin_api), report["nodes"], modes)
        watched = Watched()
        floor = Floor(sa, tenant, admin, watched)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_namespaced, sa.list_namespaced_custom_object,
                          (GROUP, VERSION, FLOOR, "gpudevices"), watched.on_event, FLOOR)
            for mode in modes:
                await _warm(tenant, mode)
            report["rows"] = []
            for g in sizes:
                for mode in modes:
                    report["rows"].append(await _row(lc, admin_api, floor, tenant, mode, g, plan))
            report["seats"] = await _seats(lc, admin_api, admin, tenant, modes, seats, plan) \
                if seats else []
            tg.cancel_scope.cancel()
    finally:
        for api in (admin_api, tenant_api, sa_api):
            await api.close()


async def _row(lc: LocalCluster, admin_api, floor: Floor, tenant, mode: str, g: int,
               plan: dict) -> dict:
    """One mode and set size: the quiet samples (ours then the floor's, in turn) and the
    busy level, each with what the replicas and the API server counted meanwhile."""
    ours: list[float] = []
    admitted: list[str] = []
    refused: list[str] = []
    steps: list[dict[str, float]] = []
    failed: list[str] = []
    claim_spec = None
    before = await _scrape(lc, admin_api)
    load = os.getloadavg()
    for i in range(plan["quiet"]):
        name = f"q{mode[0]}{g}-{i}"
        got = await _ours_once(tenant, mode, g, name)
        (ours.append(got) if isinstance(got, float) else refused.append(got))  # type: ignore[func-returns-value]
        if isinstance(got, float):
            admitted.append(name)
        if mode == "device" and claim_spec is None and isinstance(got, float):
            claim_spec = await _claim_spec(floor.admin, name)
        try:
            steps.append(await floor.once(mode, g, i, claim_spec))
        except Exception as exc:  # noqa: BLE001 - a failed floor sample is reported, not fatal
            failed.append(repr(exc)[:300])
        await floor.clean(mode, g, i)
    quiet_inside = _inside(before, await _scrape(lc, admin_api))
    floor_seconds = [sum(s.values()) for s in steps]
    row = {"mode": mode, "gpus": g, "load": load,
           "floor": {**fr.latency(floor_seconds), "steps_mean_ms": fr.step_means(steps),
                     "claim": mode == "device" and claim_spec is not None,
                     "failed": len(failed), "first_failure": failed[0] if failed else None},
           "quiet": {**fr.latency(ours), "refused": len(refused),
                     "first_refusal": refused[0] if refused else None},
           "quiet_inside": quiet_inside, "quiet_wait_split": _wait_split(lc, admitted)}
    before = await _scrape(lc, admin_api)
    busy_admitted: list[str] = []
    row["busy"] = await _busy(tenant, mode, g, plan["busy"], f"b{mode[0]}{g}", busy_admitted)
    row["busy_inside"] = _inside(before, await _scrape(lc, admin_api))
    row["busy_wait_split"] = _wait_split(lc, busy_admitted)
    row["ratio"] = fr.ratios(row)
    for line in fr.summary_lines({"rows": [row]}):
        print(line, flush=True)
    return row


async def _seats(lc: LocalCluster, admin_api, admin, tenant, modes: tuple[str, ...],
                 seats: tuple[int, ...], plan: dict) -> list[dict]:
    """The concurrency-20 level of 1-GPU VMIs per mode at each seat count, the shipped
    shares restored afterwards."""
    out = []
    async with apf.SeatCounts(admin, admin_api) as level_seats:
        for target in seats:
            shares, got = await level_seats.seats(target)
            for mode in modes:
                before = await _scrape(lc, admin_api)
                admitted: list[str] = []
                lvl = await _busy(tenant, mode, 1, plan["seats"], f"s{target}{mode[0]}",
                                  admitted)
                inside = _inside(before, await _scrape(lc, admin_api))
                waited = (inside["apf"].get(apf.APF) or {}).get("waited_mean_ms")
                row = {"mode": mode, "seats_target": target, "shares": shares, "seats": got,
                       **lvl, "inside": inside, "apf_waited_mean_ms": waited,
                       "wait_split": _wait_split(lc, admitted)}
                print(fr.summary_lines({"seats": [row]})[0], flush=True)
                out.append(row)
    return out


def run(out: Path, *, quick: bool = False, modes: tuple[str, ...] = ("count", "device"),
        sizes: tuple[int, ...] = SIZES, seats: tuple[int, ...] = (5, 12, 25)) -> dict:
    """Run the benchmark; write floor.json into `out`; return the report (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    plan = _plan(quick)
    sizes = tuple(sorted(set(sizes), reverse=True))
    report: dict = {"benchmark": "floor", "quick": quick, "commit": commit(), "modes": list(modes),
                    "sizes": list(sizes), "plan": plan, "concurrency": CONCURRENCY,
                    "nodes": nodes_needed(plan, sizes, seats), "gpus_per_node": 8,
                    "machine": machine(), "load_before": os.getloadavg()}
    from localcluster.cluster import LocalCluster

    with LocalCluster(controllers=2, log_dir=out / "logs", dra="device" in modes) as lc:
        anyio.run(_measure, lc, report, plan, sizes, modes, seats, out / "logs")
    report["load_after"] = os.getloadavg()
    report["targets"] = fr.targets(report["rows"])
    (out / "floor.json").write_text(json.dumps(report, indent=2))
    print("summary:")
    for line in fr.summary_lines(report):
        print(line, flush=True)
    for name, t in report["targets"].items():
        met = {True: "met", False: "NOT met", None: "not available"}[t["met"]]
        print(f"target {name}: {t['value']} ({t['target']}): {met}", flush=True)
    return report


# -- the command line -----------------------------------------------------------------------

def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_quick(p, "8 quiet samples per mode and size, 20 VMIs per busy and seats level "
                 "(full: 40, 60, 60)")
    add_modes(p, "each mode's floor and admissions run on one API server")
    p.set_defaults(modes="count,device")
    p.add_argument("--sizes", default="8,4,1",
                   help="GPUs per VMI, comma separated, run largest first (default: %(default)s)")
    p.add_argument("--seats", default="5,12,25",
                   help="seat counts of the VMI-create priority level to rerun the "
                        "concurrency-20 level of 1-GPU VMIs at, comma separated; 0 skips it "
                        "(default: %(default)s)")


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    seats = () if args.seats.strip() == "0" else positive_ints(args.seats, "--seats")
    run(out, quick=args.quick, modes=parse_modes(args.modes),
        sizes=positive_ints(args.sizes, "--sizes"), seats=seats)
    print(f"report: {out}/floor.json")
    return 0


BENCHMARK = Benchmark("floor", "the API's floor beside our admission in the same run: the "
                               "contract's writes by a plain client vs our webhook's answer, "
                               "quiet and at concurrency 20, the gap by phase, and the VMI-create "
                               "level's seats", _arguments, _run)
