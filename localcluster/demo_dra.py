"""`gpu-binder demo --dra`: device mode (docs/contract.md §3b) on an embedded local control plane.

Starts what `gpu-binder demo` starts (control plane, two controller replicas with the webhook,
KubeVirt's virt-api and virt-controller, kube-scheduler, KWOK) plus device mode's world
(`LocalCluster(dra=True)`: kube-controller-manager's resourceclaim-controller, NVIDIA's
DeviceClass, KubeVirt with `GPUsWithDRA`; `localcluster.dra_world`: HGX H100 nodes and one
L40S node publishing ResourceSlices, the device-mode GPUClasses). Then creates VMIs of 1, 2, 4
and 8 GPUs one after the other, as their tenants, and prints for each admitted one its node,
its exact GPUs (devices and module ids) and the partition they form, read three ways: the
binder's record (each GPUDevice's `status.device`, DR2), the VMI's claim (`spec.resourceClaims`,
DR5) and what kube-scheduler allocated for its launcher Pod (the claim's
`status.allocation.devices.results`, DR6); and for each refused one the reason.

Every VMI has an expected outcome (admitted or refused); the demo says which were not as
expected and exits 1, so a build without device mode's admission fails clearly (e.g. "admitted
without a ResourceClaim") instead of hanging: every wait is bounded.
"""

from __future__ import annotations

import textwrap

import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from localcluster.cluster import LocalCluster
from localcluster.demo import Row, create_all, find_launchers, hold
from localcluster.dra_world import (CLASSES, DEVICE_BUDGET_KEY, HGX_CLASS, L40S_CLASS, build_world,
                                    describe, group_formed, module_ids)
from localcluster.fleet import Fleet

HGX_NODES, L40S_NODES = 2, 1
TENANTS = {"tenant-acme": {DEVICE_BUDGET_KEY: 24}, "tenant-blue": {DEVICE_BUDGET_KEY: 2}}
"""Budgets per tenant: one per DeviceClass (both classes count under its quota key, DR1)."""
TEMPLATES = "gpu.cozystack.io/templates"


@dataclass(frozen=True, slots=True)
class Ask:
    """One VMI of the demo: tenant, name, class, GPUs, and whether it should be admitted."""

    tenant: str
    name: str
    cls: str
    gpus: int
    admit: bool
    why: str
    expect: str = ""
    """A refusal's text must contain this (a refusal for another reason is not as planned)."""


PLAN = (
    Ask("tenant-acme", "train-8", HGX_CLASS.name, 8, True, "a whole HGX board: partition8"),
    Ask("tenant-acme", "infer-1", HGX_CLASS.name, 1, True, "one GPU on the other board"),
    Ask("tenant-acme", "infer-2", HGX_CLASS.name, 2, True, "a pair inside the started 4-block"),
    Ask("tenant-acme", "train-4", HGX_CLASS.name, 4, True, "the untouched 4-block stays whole"),
    Ask("tenant-acme", "odd-3", HGX_CLASS.name, 3, False, "no partition has 3 GPUs",
        "sizes that exist: 1, 2, 4, 8"),
    Ask("tenant-acme", "train-8b", HGX_CLASS.name, 8, False, "no whole board is free",
        "needs 8"),
    Ask("tenant-acme", "infer-1b", HGX_CLASS.name, 1, True, "the last GPU of the board"),
    Ask("tenant-acme", "render-2", L40S_CLASS.name, 2, True, "two L40S on one PCIe root"),
    Ask("tenant-blue", "blue-4", HGX_CLASS.name, 4, False, "over tenant-blue's budget of 2",
        "budget of tenant tenant-blue"),
)


@dataclass
class Outcome:
    """What became of one Ask: the webhook's answer (`row`), then for an admitted VMI the
    devices on the binder's record, its claim, the claim's allocation and the launcher Pod."""

    ask: Ask
    row: Row
    recorded: list[str] = field(default_factory=list)
    """`pool/device` of each GPUDevice's status.device (DR2)."""
    claim: str | None = None
    allocated: list[str] = field(default_factory=list)
    """`pool/device` of each allocation result of the claim (DR6)."""
    modules: list[int] = field(default_factory=list)
    group: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return self.row.node is not None

    @property
    def as_expected(self) -> bool:
        return self.admitted == self.ask.admit and not self.problems and self.reason_as_planned

    @property
    def reason_as_planned(self) -> bool:
        """A planned refusal's text says why it was planned (`Ask.expect`)."""
        return self.admitted or self.ask.expect in (self.row.reason or "")


async def read_set(api, out: Outcome, inventory) -> None:
    """Fill in `out` for an admitted VMI from the API: the VMI's claim and GPUs, each
    GPUDevice's `status.device`, the claim's allocation; note each planned interface that is
    missing or disagrees as a problem (device mode not wired in this build)."""
    from kubernetes_asyncio.client import ApiException, CustomObjectsApi

    from model.types import GROUP, VERSION

    custom = CustomObjectsApi(api)
    ns, name = out.ask.tenant, out.ask.name
    vmi = await custom.get_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", name)
    spec = vmi.get("spec") or {}
    claims = spec.get("resourceClaims") or []
    gpus = ((spec.get("domain") or {}).get("devices") or {}).get("gpus") or []
    if len(claims) != 1 or not claims[0].get("resourceClaimName"):
        out.problems.append("admitted without a ResourceClaim in spec.resourceClaims (DR5: the "
                            "webhook of this build does not write device mode's claim)")
        return
    out.claim = claims[0]["resourceClaimName"]
    if len(gpus) != out.ask.gpus or any(g.get("claimName") != claims[0].get("name") for g in gpus):
        out.problems.append(f"spec.domain.devices.gpus has {len(gpus)} entries, not {out.ask.gpus} "
                            f"taking claim {claims[0].get('name')!r}")
    for g in gpus:
        try:
            dev = await custom.get_namespaced_custom_object(GROUP, VERSION, ns, "gpudevices", g["name"])
        except ApiException as exc:
            out.problems.append(f"GPUDevice {g.get('name')}: {exc.status} {exc.reason}")
            continue
        ref = (dev.get("status") or {}).get("device")
        if not ref:
            out.problems.append(f"GPUDevice {g['name']} has no status.device (DR2 record)")
            continue
        out.recorded.append(f"{ref['pool']}/{ref['device']}")
    devices = sorted((d for d in inventory.get(out.row.node, ())
                      if f"{d.ref.pool}/{d.ref.device}" in out.recorded),
                     key=lambda d: f"{d.ref.pool}/{d.ref.device}")
    # one module id per device, in the order the devices are printed (sorted ids read as
    # if the first device had the first: newcomer)
    out.modules = [m for d in devices for m in module_ids([d])]
    cls = next(c for c in CLASSES if c.name == out.ask.cls)
    out.group = group_formed(devices, cls.match_attribute)
    if out.recorded and out.group is None:
        out.problems.append(f"the recorded devices form no {cls.match_attribute} group (DR3)")


async def read_allocation(api, out: Outcome) -> None:
    """The claim's `status.allocation.devices.results` as `pool/device` (after the launcher
    Pod is bound); a problem when it differs from the record (DR6)."""
    from kubernetes_asyncio.client import ApiException, CustomObjectsApi

    from model.claim import parse_claim

    try:
        claim = await CustomObjectsApi(api).get_namespaced_custom_object(
            "resource.k8s.io", "v1", out.ask.tenant, "resourceclaims", out.claim)
    except ApiException as exc:
        out.problems.append(f"claim {out.claim}: {exc.status} {exc.reason}")
        return
    out.allocated = sorted(f"{r.pool}/{r.device}" for r in parse_claim(claim).allocated)
    if not out.allocated:
        out.problems.append(f"claim {out.claim} not allocated (launcher Pod not scheduled)")
    elif out.allocated != sorted(out.recorded):
        out.problems.append(f"claim {out.claim} allocated {out.allocated}, the record says "
                            f"{sorted(out.recorded)} (DR6)")


async def inventory_now(api):
    """The ResourceSlices' devices by node, as the binder gathers them
    (`model.device.dra.pool_devices`: each pool's current generation)."""
    from kubernetes_asyncio.client import CustomObjectsApi

    from model.device.dra import parse_resource_slice, pool_devices

    got = await CustomObjectsApi(api).list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
    return pool_devices(parse_resource_slice(s) for s in got.get("items") or [])


async def play(lc: LocalCluster, kubeconfigs: dict[str, Path]) -> list[Outcome]:
    """Build the world, create the PLAN's VMIs one after the other, read back every set."""
    from kubernetes_asyncio.config import new_client_from_config

    api = await new_client_from_config(config_file=str(lc.cp.admin_kubeconfig))
    try:
        fleet = Fleet(api)
        await build_world(fleet, HGX_NODES, L40S_NODES)
        for tenant, budgets in TENANTS.items():
            await fleet.tenant(tenant, budgets=budgets, user=tenant)
        await anyio.sleep(1.0)  # the informers see the world
        inventory = await inventory_now(api)
        outcomes = []
        for ask in PLAN:
            (row,) = await create_all(lc, kubeconfigs, [
                (ask.tenant, ask.name, {TEMPLATES: f"{ask.cls}={ask.gpus}"})])
            out = Outcome(ask, row)
            if out.admitted:
                await read_set(api, out, inventory)
            outcomes.append(out)
            print(f"  {ask.name}: {'admitted on ' + row.node if row.node else 'refused'}", flush=True)
        wired = [o for o in outcomes if o.claim]
        await find_launchers(api, [o.row for o in wired], timeout=60.0)
        for o in wired:
            if o.row.launcher_node is None:
                o.problems.append("launcher Pod not bound within 60 s")
            elif o.row.launcher_node != o.row.node:
                o.problems.append(f"launcher Pod bound on {o.row.launcher_node}, pinned {o.row.node}")
            await read_allocation(api, o)
        return outcomes
    finally:
        await api.close()


def print_outcomes(outcomes: list[Outcome]) -> int:
    """One block per VMI, then the verdict; returns how many were not as expected."""
    print()
    print(f"{'VMI':<10} {'TENANT':<12} {'ASKED':<12} RESULT")
    print("-" * 120)
    for o in outcomes:
        asked = f"{o.ask.cls}={o.ask.gpus}"
        if o.admitted:
            devices = ", ".join(d.split("/", 1)[1] for d in sorted(o.recorded)) or "?"
            modules = ", ".join(map(str, o.modules))
            modules = (f" (module ids {modules}, in that order)" if len(o.modules) > 1
                       else f" (module id {modules})" if o.modules else "")
            print(f"{o.ask.name:<10} {o.ask.tenant:<12} {asked:<12} admitted on {o.row.node}: "
                  f"{devices}{modules}" + (f", forming {o.group}" if o.group else ""))
            if o.claim:
                pod = (f"launcher Pod bound on {o.row.launcher_node}" if o.row.launcher_node
                       else "launcher Pod not bound")
                alloc = "allocated as recorded" if o.allocated == sorted(o.recorded) and o.allocated \
                    else f"allocated {', '.join(o.allocated) or 'nothing'}"
                print(f"{'':<36}claim {o.claim}: {alloc}; {pod}")
        else:
            # the whole reason, wrapped (a cut hid the per-node part and the budget: newcomer),
            # without the "GPU set of VMI … cannot be placed: " every refusal starts with
            reason = (o.row.reason or "no answer").split(" cannot be placed: ", 1)[-1]
            lines = textwrap.wrap(reason, 84) or [""]
            print(f"{o.ask.name:<10} {o.ask.tenant:<12} {asked:<12} REFUSED: {lines[0]}")
            for line in lines[1:]:
                print(f"{'':<45}{line}")
        if not o.as_expected:
            want = "admitted" if o.ask.admit else "refused"
            if o.admitted == o.ask.admit and not o.reason_as_planned:
                want = f"refused saying {o.ask.expect!r}"
            for p in o.problems or [f"expected {want} ({o.ask.why})"]:
                print(f"{'':<36}NOT AS EXPECTED: {p}")
    print("-" * 120)
    wrong = [o for o in outcomes if not o.as_expected]
    admitted = sum(o.admitted for o in outcomes)
    print(f"{len(outcomes)} VMIs: {admitted} admitted, {len(outcomes) - admitted} refused; "
          f"{len(outcomes) - len(wrong)} of {len(outcomes)} as expected")
    return len(wrong)


def run(*, log_dir: Path = Path("logs"), keep: bool = False) -> int:
    """The device-mode demo; 0 when every VMI went as planned, 1 otherwise (said above)."""
    from localcluster.demo import clear_log_dir

    log_dir = log_dir.resolve()
    clear_log_dir(log_dir)
    print(f"starting a local control plane, 2 controller replicas, kube-controller-manager "
          f"(resourceclaim-controller), KubeVirt with GPUsWithDRA, kube-scheduler and KWOK "
          f"(logs in {log_dir}) ...", flush=True)
    with LocalCluster(controllers=2, log_dir=log_dir, kubevirt=True, dra=True) as lc:
        kubeconfigs = {t: lc.cp.write_user_kubeconfig(lc.cp.dir / f"{t}.kubeconfig", t,
                                                      ("gpu-binder:tenants",), namespace=t)
                       for t in TENANTS}
        print(describe(HGX_NODES, L40S_NODES), flush=True)
        print(f"creating {len(PLAN)} VMIs one after the other ...", flush=True)
        started = time.monotonic()
        outcomes = anyio.run(play, lc, kubeconfigs)
        wrong = print_outcomes(outcomes)
        print(f"({time.monotonic() - started:.1f} s)")
        if wrong:
            print(f"\ndevice-mode demo: {wrong} VMI(s) not as expected (see NOT AS EXPECTED "
                  f"above); controller logs in {log_dir}")
        print("\nResourceClaims afterwards (kubectl get resourceclaims -A):")
        print(lc.cp.kubectl("get", "resourceclaims", "-A", check=False).stdout)
        if keep:
            hold(lc)
    print("stopped everything.")
    return 1 if wrong else 0
