"""`gpu-binder demo` (`make demo`): the whole system on an embedded local control plane.

Starts etcd + kube-apiserver, installs the manifests, runs two controller replicas with the
webhook registered, and KubeVirt's virt-api and virt-controller with kube-scheduler and KWOK
(`localcluster.kubevirt`), creates a fleet (KWOK-managed nodes with two GPU models, one cordoned;
three tenants with budgets; held devices), then creates VirtualMachines at once, as Cozystack
does — KubeVirt's own vm-cirros example, runStrategy Always, our annotations on its template —
as the tenants' own users through the API server (virt-controller creates the VMIs; with
`vmi_only`, the VMIs themselves, KubeVirt's vmi-gpu example), and prints what happened to each:
its state and, for a started one, the node kube-scheduler bound its virt-launcher Pod to and
the GPUs that Pod requests; for a waiting one, why (its GPUSetReady condition, in the binder's
words). Everything it started is stopped on exit or Ctrl-C.
"""

from __future__ import annotations

import copy
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import yaml

from localcluster.paths import KUBEVIRT_FIXTURES
from localcluster.fleet import Fleet
from localcluster.cluster import LocalCluster

FIXTURE = KUBEVIRT_FIXTURES / "vmi-gpu.yaml"
VM_FIXTURE = KUBEVIRT_FIXTURES / "vm-cirros.yaml"
MODELS = {"h100": ("nvidia.com/GH100_H100", 4), "l40s": ("nvidia.com/NVIDIA_L40S-24C", 2)}
TENANTS = {"tenant-acme": {"nvidia.com/GH100_H100": 8, "nvidia.com/NVIDIA_L40S-24C": 4},
           "tenant-blue": {"nvidia.com/GH100_H100": 4},
           "tenant-corp": {"nvidia.com/NVIDIA_L40S-24C": 6, "nvidia.com/GH100_H100": 0}}


@dataclass
class Row:
    vmi: str
    tenant: str
    asked: str
    node: str | None = None
    reason: str | None = None
    seconds: float = 0.0
    uid: str | None = None
    resource: str | None = None
    launcher_node: str | None = None
    launcher_gpus: int = 0
    state: str | None = None
    """A VM's printableStatus (None for a VMI)."""


def load_fixture() -> dict:
    """KubeVirt's own vmi-gpu example (a dict), shipped with the harness."""
    return yaml.safe_load(FIXTURE.read_text())


async def build_fleet(fleet: Fleet, nodes: int) -> None:
    await fleet.gpu_class("h100", MODELS["h100"][0])
    await fleet.gpu_class("l40s", MODELS["l40s"][0], on_cordon="Stay")
    for i in range(nodes):
        model = "h100" if i % 2 == 0 else "l40s"
        res, units = MODELS[model]
        await fleet.node(f"gpu-node-{i:02d}", {res: units}, labels={"gpu-model": model},
                         cordoned=(i == 3), kwok=True)
    for tenant, budgets in TENANTS.items():
        await fleet.tenant(tenant, budgets=budgets, user=tenant)
    for i in range(2):  # held devices, placed by the first VMIs that name them
        await fleet.device("tenant-acme", f"acme-h100-{i}", "h100")
    await fleet.device("tenant-corp", "corp-l40s-0", "l40s")


def plan_vmis(count: int, seed: int) -> list[tuple[str, str, dict[str, str]]]:
    """(tenant, vmi name, annotations) for `count` VMIs, deterministic for `seed`."""
    rng = random.Random(seed)
    out = [("tenant-acme", "acme-held", {"gpu.cozystack.io/devices": "acme-h100-0,acme-h100-1"}),
           ("tenant-corp", "corp-held", {"gpu.cozystack.io/devices": "corp-l40s-0",
                                         "gpu.cozystack.io/templates": "l40s=1"})]
    while len(out) < count:
        tenant = rng.choice(list(TENANTS))
        allowed = [m for m, (res, _) in MODELS.items() if TENANTS[tenant].get(res)]
        if rng.random() < 0.15:
            allowed = list(MODELS)  # sometimes ask for a model outside the budget
        model = rng.choice(allowed)
        n = rng.choice([1, 1, 1, 2, 2, 4]) if model == "h100" else rng.choice([1, 1, 2, 3])
        out.append((tenant, f"vm-{len(out):02d}-{model}x{n}",
                    {"gpu.cozystack.io/templates": f"{model}={n}"}))
    return out[:count]


async def _each_as_tenant(kubeconfigs: dict[str, Path], plan: list[tuple[str, str, dict[str, str]]],
                          one) -> None:
    """Run `await one(client, tenant, name, annotations)` for every plan entry at once, each
    with an ApiClient of its tenant's own kubeconfig (one client per tenant, closed after)."""
    from kubernetes_asyncio.config import new_client_from_config

    clients = {t: await new_client_from_config(config_file=str(p)) for t, p in kubeconfigs.items()}
    try:
        async with anyio.create_task_group() as tg:
            for tenant, name, ann in plan:
                tg.start_soon(one, clients[tenant], tenant, name, ann)
    finally:
        for c in clients.values():
            await c.close()


async def create_all(lc: LocalCluster, kubeconfigs: dict[str, Path],
                     plan: list[tuple[str, str, dict[str, str]]]) -> list[Row]:
    """Create one VMI per plan entry at once as its tenant; a Row per VMI (`node` its pin,
    `reason` the webhook's denial)."""
    from kubernetes_asyncio.client import ApiException, CustomObjectsApi

    base = load_fixture()
    rows: list[Row] = []

    async def one(client, tenant: str, name: str, ann: dict[str, str]) -> None:
        vmi = copy.deepcopy(base)
        vmi["metadata"]["name"] = name
        vmi["metadata"]["annotations"] = ann
        # the example's own entry names a P40, which this fleet has not: ours replace it
        vmi["spec"]["domain"]["devices"].pop("gpus", None)
        row = Row(name, tenant, ", ".join(f"{v}" for v in ann.values()))
        rows.append(row)
        started = time.monotonic()
        try:
            made = await CustomObjectsApi(client).create_namespaced_custom_object(
                "kubevirt.io", "v1", tenant, "virtualmachineinstances", vmi)
            row.node = made["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            row.uid = made["metadata"]["uid"]
            gpus = made["spec"]["domain"]["devices"].get("gpus") or []
            row.resource = gpus[0].get("deviceName") if gpus else None   # none in device mode
        except ApiException as exc:
            try:
                row.reason = json.loads(exc.body)["message"]
            except (TypeError, ValueError, KeyError):
                row.reason = f"{exc.status} {exc.reason}"
        row.seconds = time.monotonic() - started

    await _each_as_tenant(kubeconfigs, plan, one)
    return sorted(rows, key=lambda r: r.vmi)


async def create_all_vms(kubeconfigs: dict[str, Path], plan: list[tuple[str, str, dict[str, str]]],
                         timeout: float = 30.0) -> list[Row]:
    """Create one VirtualMachine per plan entry at once (vm-cirros, runStrategy Always, the
    annotations on its template) as the tenant, then wait up to `timeout` s until each has
    started (its VMI admitted) or shows GPUSetReady=False; a Row per VM (`node` the node its
    devices are Bound on, `reason` the condition's message while it waits)."""
    from kubernetes_asyncio.client import ApiException, CustomObjectsApi

    from model.types import ADMISSION_ANNOTATION
    from model.vm import CONDITION

    base = yaml.safe_load(VM_FIXTURE.read_text())
    rows: list[Row] = []

    async def one(client, tenant: str, name: str, ann: dict[str, str]) -> None:
        vm = copy.deepcopy(base)
        vm["metadata"] = {"name": name, "labels": {"kubevirt.io/vm": name}}
        vm["spec"]["runStrategy"] = "Always"
        vm["spec"]["template"]["metadata"]["annotations"] = ann
        row = Row(name, tenant, ", ".join(ann.values()))
        rows.append(row)
        api = CustomObjectsApi(client)
        started = time.monotonic()
        try:
            await api.create_namespaced_custom_object("kubevirt.io", "v1", tenant, "virtualmachines", vm)
        except ApiException as exc:
            row.reason, row.state = f"VM not created: {exc.status} {exc.reason}", "Error"
            return
        with anyio.move_on_after(timeout):
            while True:
                await anyio.sleep(0.5)
                got = await api.get_namespaced_custom_object("kubevirt.io", "v1", tenant,
                                                             "virtualmachines", name)
                row.state = (got.get("status") or {}).get("printableStatus")
                try:
                    vmi = await api.get_namespaced_custom_object(
                        "kubevirt.io", "v1", tenant, "virtualmachineinstances", name)
                except ApiException:
                    vmi = None
                if vmi and (vmi["metadata"].get("annotations") or {}).get(ADMISSION_ANNOTATION):
                    row.uid = vmi["metadata"]["uid"]
                    gpus = vmi["spec"]["domain"]["devices"].get("gpus") or []
                    row.resource = gpus[0]["deviceName"] if gpus else None
                    dev = await api.get_namespaced_custom_object(
                        "gpu.cozystack.io", "v1alpha1", tenant, "gpudevices", gpus[0]["name"])
                    row.node = (dev.get("status") or {}).get("nodeName")
                    row.reason = None
                    break
                cond = next((c for c in (got.get("status") or {}).get("conditions") or []
                             if c.get("type") == CONDITION and c.get("status") == "False"), None)
                if cond:
                    row.reason = f"waiting ({cond.get('reason')}): {cond.get('message')}"
                    row.state = "Waiting"   # virt-controller says Stopped: no VMI exists
                    break
        row.seconds = time.monotonic() - started
        if row.node:   # admitted: virt-controller's view once it has synced the new VMI
            with anyio.move_on_after(5):
                while row.state in (None, "Stopped"):
                    await anyio.sleep(0.5)
                    got = await api.get_namespaced_custom_object(
                        "kubevirt.io", "v1", tenant, "virtualmachines", name)
                    row.state = (got.get("status") or {}).get("printableStatus")

    await _each_as_tenant(kubeconfigs, plan, one)
    return sorted(rows, key=lambda r: r.vmi)


async def find_launchers(api, rows: list[Row], timeout: float = 60.0) -> None:
    """Fill in, per admitted row, the node kube-scheduler bound its virt-launcher Pod to
    (`spec.nodeName`) and the GPUs of its resource that Pod requests; waits up to `timeout`
    seconds for every one to be bound."""
    from kubernetes_asyncio.client import CoreV1Api

    core = CoreV1Api(api)
    want = [r for r in rows if r.uid]
    with anyio.move_on_after(timeout):
        while any(r.launcher_node is None for r in want):
            for r in want:
                if r.launcher_node is not None:
                    continue
                pods = await core.list_namespaced_pod(r.tenant, label_selector=f"kubevirt.io/created-by={r.uid}")
                for p in pods.items:
                    if p.spec.node_name:
                        r.launcher_node = p.spec.node_name
                        r.launcher_gpus = sum(int((c.resources.requests or {}).get(r.resource, 0))
                                              for c in p.spec.containers)
            await anyio.sleep(0.5)


async def refresh_vm_states(api, rows: list[Row], timeout: float = 20.0) -> None:
    """Re-read the printableStatus of each admitted VM still shown as Stopped (or unknown):
    virt-controller writes a VM's status after it has synced the new VMI, which under load
    comes after the admission the table reports; waits up to `timeout` seconds for all."""
    from kubernetes_asyncio.client import CustomObjectsApi

    custom = CustomObjectsApi(api)
    stale = [r for r in rows if r.uid and r.state in (None, "Stopped")]
    with anyio.move_on_after(timeout):
        while stale:
            for r in stale:
                got = await custom.get_namespaced_custom_object("kubevirt.io", "v1", r.tenant,
                                                                "virtualmachines", r.vmi)
                r.state = (got.get("status") or {}).get("printableStatus")
            stale = [r for r in stale if r.state in (None, "Stopped")]
            if stale:
                await anyio.sleep(0.5)


DENIED_PREFIX = 'admission webhook "vmi.gpu.cozystack.io" denied the request: '


def short_reason(reason: str, limit: int = 200) -> str:
    """A denial or a waiting VM's message as the table shows it: without the API server's own
    `DENIED_PREFIX`, and, when longer than `limit` characters, its beginning up to the last
    whole word that fits, then "…" (at most `limit` characters in all). The beginning says
    which request and what kind of no it is, so it is what is kept; the whole message is in
    the VM's GPUSetReady condition and in `kubectl get events`. The default `limit` shows a
    one-reason refusal whole (a budget's or a set's need, about 190 characters). The text of gpu-binder's
    reasons is not parsed: it is rendered once, in `model.reasons`. Raises ValueError when
    `limit` is below 2 (no room for one character and the ellipsis)."""
    if limit < 2:
        raise ValueError(f"limit must be at least 2, got {limit}")
    reason = reason.replace(DENIED_PREFIX, "")
    if len(reason) <= limit:
        return reason
    head = reason[:limit - 1]
    cut = reason.rfind(" ", 0, limit)   # the last word end that leaves room for "…"
    if cut > limit // 2:   # end on a whole word, unless that throws away more than half
        head = reason[:cut]
    return head.rstrip(" ,;:") + "…"


def print_table(rows: list[Row]) -> None:
    """Print one line per VM (or VMI) with labelled columns, then the totals. ANSWER AFTER is
    the seconds from the create call to the answer: for a VMI the webhook's admit or denial,
    for a VM its VMI admitted or its GPUSetReady=False condition seen (polled every 0.5 s)."""
    print()
    vms = any(r.state is not None for r in rows)
    kind = "VM" if vms else "VMI"
    print(f"{kind:<22} {'TENANT':<12} {'GPUs ASKED':<28} {'STATE':<10} {'ANSWER AFTER':<13} RESULT")
    print("-" * 150)
    for r in rows:
        if r.node:
            pod = (f"virt-launcher Pod bound to {r.launcher_node} by kube-scheduler, requests "
                   f"{r.launcher_gpus} GPU{'s' if r.launcher_gpus != 1 else ''}"
                   if r.launcher_node else "virt-launcher Pod NOT bound")
            result = f"admitted, pinned to {r.node}; {pod}"
        elif vms:
            result = short_reason(r.reason or "no answer yet (neither started nor waiting)")
        else:
            result = f"REFUSED: {short_reason(r.reason or '')}"
        state = r.state or ("Admitted" if r.node else "Refused")
        took = f"{r.seconds:.2f} s"
        print(f"{r.vmi:<22} {r.tenant:<12} {r.asked:<28} {state:<10} {took:<13} {result}")
    admitted = [r for r in rows if r.node]
    on_pin = [r for r in admitted if r.launcher_node == r.node]
    print("-" * 150)
    print(f"{len(rows)} {kind}s: {len(admitted)} admitted, {len(rows) - len(admitted)} "
          f"{'waiting' if vms else 'refused'}; "
          f"{len(on_pin)} of {len(admitted)} launcher Pods bound on their pinned node")
    per_node: dict[str, int] = {}
    for r in admitted:
        per_node[r.node] = per_node.get(r.node, 0) + 1
    print("admitted per node: " + ", ".join(f"{n}={c}" for n, c in sorted(per_node.items())))


def write_whole_reasons(rows: list[Row], path: Path) -> int:
    """The reasons the table cut with "…" (`short_reason`), each whole on one line
    "<vm> <tenant>: <reason>", written to `path` (the cluster, its Events and conditions are
    gone once the demo stops); returns how many, and writes nothing when none was cut."""
    cut = [r for r in rows if not r.node and r.reason
           and short_reason(r.reason) != r.reason.replace(DENIED_PREFIX, "")]
    if cut:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{r.vmi} {r.tenant}: {r.reason.replace(DENIED_PREFIX, '')}\n"
                                for r in cut))
    return len(cut)


def hold(lc: LocalCluster) -> None:
    """`--keep`: leave everything running until Ctrl-C."""
    print(f"kept running; admin kubeconfig: {lc.cp.admin_kubeconfig}. Ctrl-C stops it.")
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass


LOG_MARKER = ".gpu-binder-demo-logs"
"""The file a demo writes into its `--log-dir`, so that the next run may clear that directory
(`clear_log_dir`) and nothing else."""


def clear_log_dir(log_dir: Path) -> None:
    """Empty `log_dir` for a new demo run and mark it (`LOG_MARKER`): only a directory that
    is absent, empty, or a demo's own (the marker, or an earlier demo's `controller-0.log`)
    is cleared. Raises ValueError naming it for anything else (a file, or a directory with
    other contents: `--log-dir .` or `~` must never be deleted)."""
    import shutil

    if log_dir.exists():
        if not log_dir.is_dir():
            raise ValueError(f"--log-dir {log_dir} is a file, not a directory")
        entries = list(log_dir.iterdir())
        ours = (log_dir / LOG_MARKER).exists() or (log_dir / "controller-0.log").exists()
        if entries and not ours:
            raise ValueError(f"--log-dir {log_dir} is not empty and not a demo's log directory; "
                             f"choose another or empty it yourself")
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    (log_dir / LOG_MARKER).write_text("written by gpu-binder demo; the next demo run empties this directory\n")


def run(*, nodes: int = 8, vmis: int = 30, seed: int = 7, log_dir: Path = Path("logs"),
        keep: bool = False, vmi_only: bool = False) -> int:
    """The demo; returns the exit code (0 when it ran to the table). `vmi_only`: create
    VMIs directly instead of VirtualMachines. ValueError (nothing started) when `log_dir`
    may not be cleared (`clear_log_dir`)."""
    log_dir = log_dir.resolve()
    clear_log_dir(log_dir)
    print(f"starting a local control plane, 2 controller replicas, KubeVirt (virt-api, virt-controller), "
          f"kube-scheduler and KWOK (logs in {log_dir}) ...",
          flush=True)
    permitted = tuple(res for res, _ in MODELS.values())
    with LocalCluster(controllers=2, log_dir=log_dir, kubevirt=True, permitted=permitted) as lc:
        kubeconfigs = {t: lc.cp.write_user_kubeconfig(lc.cp.dir / f"{t}.kubeconfig", t,
                                                      ("gpu-binder:tenants",), namespace=t)
                       for t in TENANTS}

        async def main() -> list[Row]:
            from kubernetes_asyncio.config import new_client_from_config

            api = await new_client_from_config(config_file=str(lc.cp.admin_kubeconfig))
            try:
                await build_fleet(Fleet(api), nodes)
            finally:
                await api.close()
            await anyio.sleep(1.0)  # the informers see the fleet
            plan = plan_vmis(vmis, seed)
            print(f"fleet: {nodes} KWOK nodes (gpu-node-03 cordoned), {len(TENANTS)} tenants; "
                  f"creating {len(plan)} {'VMIs' if vmi_only else 'VirtualMachines'} at once ...",
                  flush=True)
            if vmi_only:
                rows = await create_all(lc, kubeconfigs, plan)
            else:
                rows = await create_all_vms(kubeconfigs, plan)
            api = await new_client_from_config(config_file=str(lc.cp.admin_kubeconfig))
            try:
                await find_launchers(api, rows)
                if not vmi_only:
                    await refresh_vm_states(api, rows)
            finally:
                await api.close()
            return rows

        rows = anyio.run(main)
        print_table(rows)
        whole = log_dir / "reasons.txt"
        if write_whole_reasons(rows, whole):
            print(f"reasons cut with … above are whole in {whole}")
        print(f"\nleader: {lc.leader()}; per-node decision logs: "
              f"{log_dir}/<replica>/<node>.jsonl (e.g. tail -f {log_dir}/{lc.leader()}/gpu-node-00.jsonl)")
        print("\nevery GPUDevice afterwards (kubectl get gpudevices -A, by node):")
        print(lc.cp.kubectl("get", "gpudevices", "-A", "--sort-by=.status.nodeName").stdout)
        if keep:
            hold(lc)
    print("stopped everything.")
    return 0
