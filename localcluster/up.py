"""`gpu-binder cluster up`: a local control plane (optionally with controllers and KubeVirt)
in the foreground, for trying the binder by hand."""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path

from localcluster.cluster import LocalCluster
from localcluster.controlplane import ControlPlane


def main_up(directory: Path, *, tenant: str = "tenant-a", controllers: int = 0,
            kubevirt: bool = False, permitted: tuple[str, ...] = (), dra: bool = False,
            hgx: int = 4, l40s: int = 1) -> int:
    """`gpu-binder cluster up --dir D [--controllers N] [--kubevirt [--permit R1,R2]]
    [--dra [--hgx-nodes H] [--l40s-nodes L]]`: run a control plane (and, with N > 0, the
    manifests and N controller replicas with the webhook registered; with `kubevirt`,
    KubeVirt's virt-api and virt-controller, kube-scheduler and KWOK, the KubeVirt CR
    permitting `permitted`; with `dra`, device mode's world: kube-controller-manager's
    resourceclaim-controller, NVIDIA's DeviceClass, `hgx` HGX and `l40s` L40S KWOK nodes
    publishing ResourceSlices and the device-mode GPUClasses, `localcluster.dra_world`,
    KubeVirt with `GPUsWithDRA`) in the foreground. Writes D/admin.kubeconfig and
    D/<tenant>.kubeconfig (a tenant namespace bound to the tenant role), prints the API URL
    and a line `ready: ...` once everything runs, stops everything on SIGINT/SIGTERM."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stop = {"now": False}

    def on_signal(signum, frame):  # noqa: ARG001
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"starting: {_what_runs(controllers, kubevirt, dra)} (etcd, kube-apiserver "
          f"first; about 15-40 s) ...", flush=True)
    with ControlPlane() as cp:
        lc = LocalCluster(controllers=controllers, control_plane=cp, log_dir=directory / "logs",
                          kubevirt=kubevirt, permitted=permitted, dra=dra)
        try:
            if controllers:
                lc.start()
            else:
                lc.install()
                if dra:
                    lc.start_dra()
                if kubevirt:
                    lc.start_kubevirt()
            if dra:
                _build_dra_world(cp, hgx, l40s)
            shutil.copy(cp.admin_kubeconfig, directory / "admin.kubeconfig")
            cp.kubectl("create", "namespace", tenant)
            cp.kubectl("label", "namespace", tenant, "gpu.cozystack.io/tenant=true")
            cp.kubectl("create", "rolebinding", "gpu-tenant", "-n", tenant,
                       "--clusterrole=gpu-binder:tenant", f"--user={tenant}")
            cp.kubectl("create", "rolebinding", "vmi-editor", "-n", tenant,
                       "--clusterrole=gpu-binder-testing:vmi-editor", f"--user={tenant}")
            cp.write_user_kubeconfig(directory / f"{tenant}.kubeconfig", tenant,
                                     ("gpu-binder:tenants",), namespace=tenant)
            print(f"API server: {cp.server}", flush=True)
            print(f"admin kubeconfig: {directory / 'admin.kubeconfig'}", flush=True)
            print(f"tenant kubeconfig: {directory / (tenant + '.kubeconfig')}", flush=True)
            print(f"kubectl: {cp.binaries.kubectl}", flush=True)
            if controllers:
                print(f"controllers: {controllers} (logs in {directory / 'logs'}), webhook on "
                      f"https://127.0.0.1:{lc.webhook_port}/mutate-vmi", flush=True)
            if lc.kubevirt is not None:
                print(f"KubeVirt: virt-api on https://127.0.0.1:{lc.kubevirt.api_port}, virt-controller, "
                      f"kube-scheduler, KWOK (logs in {lc.kubevirt.dir}); permitted host devices: "
                      f"{', '.join(permitted) or 'none'}", flush=True)
            if dra:
                from localcluster.dra_world import describe

                print(f"{describe(hgx, l40s)}; kube-controller-manager (resourceclaim-controller, "
                      f"log in {directory / 'logs'})", flush=True)
            print(f"ready: {_what_runs(controllers, kubevirt, dra)}", flush=True)
            if not controllers:
                print("no controller runs (--controllers 0): no webhook admits or refuses "
                      "VMIs here, every create is stored as it is", flush=True)
            print("Ctrl-C stops it.", flush=True)
            while not stop["now"]:
                dead = lc.dead()
                if dead:
                    print(f"{', '.join(dead)} exited unexpectedly; stopping everything",
                          file=sys.stderr)
                    return 1
                for i, r in enumerate(lc.replicas):  # as a Deployment would: restart it
                    if not r.alive and not stop["now"]:
                        print(f"controller {r.identity} exited with code "
                              f"{r.proc.returncode}; restarting it", file=sys.stderr, flush=True)
                        lc.start_replica(i)
                time.sleep(0.5)
        finally:
            lc.stop()
    print("stopped everything.", flush=True)
    return 0


def _what_runs(controllers: int, kubevirt: bool, dra: bool) -> str:
    """The ready line's account: which parts run."""
    parts = ["control plane"]
    if controllers:
        parts.append(f"{controllers} controller replica{'s' if controllers != 1 else ''}")
    if kubevirt:
        parts.append("KubeVirt" + (" (GPUsWithDRA)" if dra else ""))
    if dra:
        parts.append("device-mode world")
    return ", ".join(parts)


def _build_dra_world(cp: ControlPlane, hgx: int, l40s: int) -> None:
    """`localcluster.dra_world.build_world` on `cp` as admin."""
    import anyio

    async def build() -> None:
        from kubernetes_asyncio.config import new_client_from_config

        from localcluster.dra_world import build_world
        from localcluster.fleet import Fleet

        api = await new_client_from_config(config_file=str(cp.admin_kubeconfig))
        try:
            await build_world(Fleet(api), hgx, l40s)
        finally:
            await api.close()

    anyio.run(build)
