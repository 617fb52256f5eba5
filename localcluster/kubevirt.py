"""The real consumers of the binder's pin on a local control plane: KubeVirt's virt-api and
virt-controller, kube-scheduler, and KWOK (node heartbeats and Pod phases), all built from
pinned Go modules (`tools/build-kubevirt.sh`, `tools/build-controlplane.sh`).

`KubeVirt(cp).start()` installs KubeVirt's own CRDs and RBAC (printed by its own code, see
`tools/kubevirt/gen-manifests`), a KubeVirt CR marked Deployed whose `permittedHostDevices`
lists the given resources, starts the four processes on loopback, and registers virt-api's
webhooks by URL. A VMI then gets a virt-launcher Pod from virt-controller that kube-scheduler
binds to a node; without virt-handler the VMI stops at phase Scheduled, enough to check
placement. `Fleet.node(..., kwok=True)` makes nodes KWOK keeps Ready.

Used by `gpu-binder cluster up --kubevirt`, the e2e fixture `kubevirt` and `make demo`.
Every process is in its own process group with a parent-death signal; `stop()` ends them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster.paths import REPO_ROOT
from localcluster.controlplane import (FEATURE_GATES, ControlPlane, ControlPlaneError, built_dir, free_port,
                             spawn_logged, stop_process)
from localcluster.fleet import KWOK_ANNOTATION

BUILD_SCRIPT = REPO_ROOT / "tools" / "build-kubevirt.sh"
NAMESPACE = "kubevirt"
KUBEVIRT_CR = "kubevirt"
LAUNCHER_IMAGE = "gpu-binder.local/virt-launcher:v1.8.3"  # never pulled: no kubelet
_RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


@dataclass(frozen=True, slots=True)
class KubeVirtBinaries:
    """The built consumers and the generated files, all in one cache directory."""

    virt_controller: Path
    virt_api: Path
    kwok: Path
    manifests: Path
    """KubeVirt's CRDs, RBAC and virt-api webhook configurations (a JSON v1 List)."""
    stages: Path
    """KWOK's stages (node initialise and heartbeat, Pod ready/complete/delete)."""


def find_kubevirt_binaries(*, build: bool = True) -> KubeVirtBinaries:
    """Locate (and, when `build`, build) virt-controller, virt-api, kwok and the generated
    manifests. `GPU_BINDER_KUBEVIRT_DIR` points at a directory that already holds them;
    otherwise `tools/build-kubevirt.sh` runs (it skips what is cached) and its last stdout
    line is the directory. Raises ControlPlaneError when something is missing."""
    d = built_dir(BUILD_SCRIPT, "GPU_BINDER_KUBEVIRT_DIR", build=build)
    bins = KubeVirtBinaries(d / "virt-controller", d / "virt-api", d / "kwok",
                            d / "kubevirt-manifests.json", d / "kwok-stages.yaml")
    for p in (bins.virt_controller, bins.virt_api, bins.kwok):
        if not os.access(p, os.X_OK):
            raise ControlPlaneError(f"KubeVirt harness binary missing or not executable: {p}")
    for p in (bins.manifests, bins.stages):
        if not p.is_file():
            raise ControlPlaneError(f"KubeVirt harness file missing: {p}")
    return bins


def kubevirt_objects(bins: KubeVirtBinaries, kinds: tuple[str, ...]) -> list[dict]:
    """The generated objects of the given kinds, in file order."""
    docs = json.loads(bins.manifests.read_text()).get("items") or []
    return [d for d in docs if isinstance(d, dict) and d.get("kind") in kinds]


def install_crds(cp: ControlPlane, bins: KubeVirtBinaries | None = None) -> None:
    """Apply KubeVirt's own CRDs (the real VMI schema) and wait until they are Established;
    once a control plane and manifest file (a test session installs per module: the 2 MB
    apply and its wait cost about 4.5 s, and nothing deletes these CRDs)."""
    bins = bins or find_kubevirt_binaries()
    done = _CRDS_APPLIED.setdefault(cp, set())
    if bins.manifests in done:
        return
    crds = kubevirt_objects(bins, ("CustomResourceDefinition",))
    _apply(cp, crds)
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               *[f"crd/{c['metadata']['name']}" for c in crds])
    done.add(bins.manifests)


_CRDS_APPLIED: "weakref.WeakKeyDictionary[ControlPlane, set[Path]]" = weakref.WeakKeyDictionary()
"""Per control plane of this process, the KubeVirt manifest files whose CRDs `install_crds`
applied (forgotten with the control plane)."""


def _apply(cp: ControlPlane, objs: list[dict]) -> None:
    """Server-side apply `objs` as one JSON List (KubeVirt's CRDs are 2 MB: JSON is written
    in 20 ms where YAML took 2.7 s)."""
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=gpu-binder-kubevirt",
               "-f", "-", input=body, timeout=120)


GPUS_WITH_DRA = "GPUsWithDRA"
"""KubeVirt's feature gate for VMI GPUs taken from ResourceClaims (alpha in v1.8, beta and on
by default in v1.9): `gpus[].claimName/requestName` and `spec.resourceClaims` (DR5). It must be
in the CR before virt-controller starts: enabled later, virt-controller exits to reinitialise."""


def kubevirt_cr(permitted: list[str] | tuple[str, ...], feature_gates: tuple[str, ...] = ()) -> dict:
    """The KubeVirt CR permitting `permitted` resource names as externally provided PCI
    host devices (`spec.configuration.permittedHostDevices.pciHostDevices`), with
    `feature_gates` in `developerConfiguration.featureGates`."""
    configuration: dict = {"permittedHostDevices": {"pciHostDevices": [
        {"pciVendorSelector": "10DE:2330", "resourceName": r, "externalResourceProvider": True}
        for r in sorted(set(permitted))]}}
    if feature_gates:
        configuration["developerConfiguration"] = {"featureGates": sorted(set(feature_gates))}
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": KUBEVIRT_CR, "namespace": NAMESPACE},
            "spec": {"configuration": configuration}}


class KubeVirt:
    """virt-api, virt-controller, kube-scheduler and KWOK against `cp`.

    `permitted`: the resource names KubeVirt's CR permits. `scheduler_profiles`: extra
    kube-scheduler profiles (KubeSchedulerConfiguration `profiles` entries, each with its own
    `schedulerName`), run by the same kube-scheduler after the default profile; a VMI picks one
    with `spec.schedulerName` (the packing benchmark's MostAllocated peer). `start()` raises
    ControlPlaneError (with the log tail) when a process exits or virt-api is not serving
    within `start_timeout` s; `stop()` is idempotent (SIGTERM, SIGKILL after 10 s).
    `feature_gates`: KubeVirt feature gates in the CR from the start (e.g. `GPUS_WITH_DRA`)."""

    def __init__(self, cp: ControlPlane, *, permitted: tuple[str, ...] = (),
                 bins: KubeVirtBinaries | None = None, log_dir: Path | None = None,
                 start_timeout: float = 90.0, scheduler_profiles: tuple[dict, ...] = (),
                 kwok_args: tuple[str, ...] = (), feature_gates: tuple[str, ...] = ()) -> None:
        self.cp = cp
        self.feature_gates = tuple(feature_gates)
        self.kwok_args = tuple(kwok_args)
        self.scheduler_profiles = tuple(scheduler_profiles)
        self.bins = bins or find_kubevirt_binaries()
        self.permitted = tuple(permitted)
        # absolute: each process runs in this folder (spawn_logged's cwd) and is given paths in it
        self.dir = (Path(log_dir) if log_dir else cp.dir / "kubevirt").resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.start_timeout = start_timeout
        self.procs: dict[str, subprocess.Popen] = {}
        self.api_port = 0

    def __enter__(self) -> "KubeVirt":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- public --------------------------------------------------------------------------
    def start(self) -> "KubeVirt":
        try:
            install_crds(self.cp, self.bins)
            self._install()
            self._start_scheduler()
            self._start_kwok()
            self._start_virt_api()
            self._register_webhooks()
            self._start_virt_controller()
        except BaseException:
            self.stop()
            raise
        return self

    def set_permitted(self, permitted: tuple[str, ...] | list[str]) -> None:
        """Replace the KubeVirt CR's permitted host devices by `permitted`."""
        self.permitted = tuple(permitted)
        _apply(self.cp, [kubevirt_cr(self.permitted, self.feature_gates)])

    def alive(self) -> list[str]:
        """Names of the processes that exited (empty when all run)."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def log_tail(self, name: str, lines: int = 25) -> str:
        try:
            text = (self.dir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """Stop every process this harness started and unregister virt-api's webhooks (so
        the control plane keeps admitting VMIs without them)."""
        for name in ("virt-controller", "virt-api", "kwok", "kube-scheduler"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            stop_process(proc)
        if self.cp.procs.get("kube-apiserver") is not None:
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                self.cp.kubectl("delete", kind, "-l", "gpu-binder.local/harness=kubevirt",
                                "--ignore-not-found", check=False)

    # -- internals -----------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        proc = self.procs[name] = spawn_logged(self.dir, name, args)
        return proc

    def _install(self) -> None:
        k = self.cp.kubectl
        if k("get", "namespace", NAMESPACE, check=False).returncode != 0:
            k("create", "namespace", NAMESPACE)
        _apply(self.cp, kubevirt_objects(self.bins, _RBAC_KINDS))
        _apply(self.cp, [kubevirt_cr(self.permitted, self.feature_gates)])
        # virt-operator would write these; without it KubeVirt ignores the CR
        k("patch", "kubevirt", KUBEVIRT_CR, "-n", NAMESPACE, "--subresource=status", "--type=merge",
          "-p", '{"status":{"phase":"Deployed","defaultArchitecture":"amd64"}}')
        # virt-api authenticates the API server's proxied requests with this CA
        ca = self.cp.ca.cert_pem.decode()
        k("patch", "configmap", "extension-apiserver-authentication", "-n", "kube-system",
          "--type=merge", "-p", yaml.safe_dump({"data": {"requestheader-client-ca-file": ca}}))

    def _token_kubeconfig(self, sa: str) -> Path:
        token = self.cp.kubectl("create", "token", sa, "-n", NAMESPACE, "--duration=48h").stdout.strip()
        cfg = {"apiVersion": "v1", "kind": "Config",
               "clusters": [{"name": "local", "cluster": {
                   "server": self.cp.server,
                   "certificate-authority-data": base64.b64encode(self.cp.ca.cert_pem).decode()}}],
               "users": [{"name": sa, "user": {"token": token}}],
               "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa,
                                                     "namespace": NAMESPACE}}],
               "current-context": sa}
        path = self.dir / f"{sa}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def _start_scheduler(self) -> None:
        sched = self.cp.binaries.kube_scheduler
        if sched is None or not os.access(sched, os.X_OK):
            raise ControlPlaneError(f"kube-scheduler missing or not executable: {sched} "
                                    "(tools/build-controlplane.sh builds it)")
        cfg = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
               "clientConnection": {"kubeconfig": str(self.cp.admin_kubeconfig), "qps": 200, "burst": 400},
               "leaderElection": {"leaderElect": False}}
        if self.scheduler_profiles:
            cfg["profiles"] = [{"schedulerName": "default-scheduler"}, *self.scheduler_profiles]
        path = self.dir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self._spawn("kube-scheduler", [str(sched), f"--config={path}", "--secure-port=0",
                                       f"--feature-gates={FEATURE_GATES}", "--v=2"])

    def _start_kwok(self) -> None:
        key, value = KWOK_ANNOTATION
        self._spawn("kwok", [
            str(self.bins.kwok), f"--kubeconfig={self.cp.admin_kubeconfig}",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            f"--config={self.bins.stages}", f"--server-address=127.0.0.1:{free_port()}",
            "--node-ip=127.0.0.1", *self.kwok_args])

    def _start_virt_api(self) -> None:
        self.api_port = free_port()
        pair = self.cp.ca.issue_server(["127.0.0.1", "localhost"])
        d = self.dir / "virt-api-certs"
        d.mkdir(exist_ok=True)
        (d / "tls.crt").write_bytes(pair.cert_pem)
        (d / "tls.key").write_bytes(pair.key_pem)
        (d / "tls.key").chmod(0o600)
        kc = self._token_kubeconfig("kubevirt-apiserver")
        proc = self._spawn("virt-api", [
            str(self.bins.virt_api), f"--kubeconfig={kc}", "--listen=127.0.0.1",
            f"--port={self.api_port}", f"--tls-cert-file={d / 'tls.crt'}",
            f"--tls-key-file={d / 'tls.key'}", f"--handler-cert-file={d / 'tls.crt'}",
            f"--handler-key-file={d / 'tls.key'}"])
        import ssl

        ctx = ssl.create_default_context(cafile=None)
        ctx.load_verify_locations(cadata=self.cp.ca.cert_pem.decode())
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(f"virt-api exited with code {proc.returncode}:\n"
                                        f"{self.log_tail('virt-api')}")
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.api_port}/healthz",
                                            timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError:
                return  # serving (healthz may want auth); the webhooks answer
            except OSError:
                pass
            time.sleep(0.3)
        raise ControlPlaneError(f"virt-api not serving within {self.start_timeout:.0f} s:\n"
                                f"{self.log_tail('virt-api')}")

    def _register_webhooks(self) -> None:
        """virt-api's own webhook configurations, pointed at the loopback virt-api."""
        ca = base64.b64encode(self.cp.ca.cert_pem).decode()
        docs = kubevirt_objects(self.bins, ("MutatingWebhookConfiguration",
                                            "ValidatingWebhookConfiguration"))
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {})["gpu-binder.local/harness"] = "kubevirt"
            for hook in doc.get("webhooks") or []:
                svc = (hook.get("clientConfig") or {}).get("service") or {}
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.api_port}{svc.get('path', '/')}",
                                        "caBundle": ca}
        _apply(self.cp, docs)

    def _start_virt_controller(self) -> None:
        kc = self._token_kubeconfig("kubevirt-controller")
        self._spawn("virt-controller", [
            str(self.bins.virt_controller), f"--kubeconfig={kc}", f"--launcher-image={LAUNCHER_IMAGE}",
            "--listen=127.0.0.1", f"--port={free_port()}"])
        time.sleep(0.5)
        dead = self.alive()
        if dead:
            raise ControlPlaneError(f"{', '.join(dead)} exited during start-up:\n"
                                    + "\n".join(self.log_tail(n) for n in dead))
