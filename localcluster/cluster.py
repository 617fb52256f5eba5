"""The whole system on loopback: a `ControlPlane`, the manifests, and N controller replicas
as subprocesses with the webhook registered by URL + caBundle.

Used by `gpu-binder cluster up --controllers N`, the e2e tests, `make demo` and the e2e
benchmark, so they all run the same code path. Replicas share one webhook port
(SO_REUSEPORT), as pods behind a Service would. Replicas run with the shipped
ServiceAccount's token (TokenRequest), not as admin, so the shipped RBAC is what they get.
KubeVirt's own CRDs are always installed (`localcluster.kubevirt.install_crds`); with `kubevirt=True`
virt-api, virt-controller, kube-scheduler and KWOK run too (`localcluster.kubevirt.KubeVirt`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster.paths import MANIFESTS, REPO_ROOT, TESTING_MANIFESTS
from localcluster.controlplane import ControlPlane, ControlPlaneError, _die_with_parent, free_port

SA_NAMESPACE, SA_NAME = "cozy-system", "gpu-binder"   # controller/rbac.yaml
CRDS = ("gpuclasses.gpu.cozystack.io", "gpudevices.gpu.cozystack.io")


@dataclass
class Replica:
    """One controller subprocess."""

    identity: str
    metrics_port: int
    log_path: Path
    proc: subprocess.Popen | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """Control plane + manifests + `controllers` replicas. `controller_args` are extra
    `gpu-binder controller` flags (e.g. short leases for tests). `start()` returns when every
    replica is ready; `stop()` stops replicas (SIGTERM, then SIGKILL after 10 s) and the
    control plane. Raises ControlPlaneError with the replica's log tail on failure.

    Replicas authenticate with a TokenRequest token of ServiceAccount cozy-system/gpu-binder
    (the shipped RBAC, never more), unless `kubeconfig` names another API access, or
    `service_account` is False (admin). `install=False` leaves the manifests and the webhook
    registration to the caller (e.g. a Helm release pointing its webhook at `webhook_url`;
    it then passes `kubeconfig` for the release's ServiceAccount)."""

    def __init__(self, *, controllers: int = 2, controller_args: tuple[str, ...] = (),
                 log_dir: Path | None = None, control_plane: ControlPlane | None = None,
                 install: bool = True, kubeconfig: Path | None = None,
                 service_account: bool = True,
                 kubevirt: bool = False, permitted: tuple[str, ...] = ()) -> None:
        self.own_cp = control_plane is None
        self.install_manifests = install
        self.kubeconfig = kubeconfig
        self.with_kubevirt = kubevirt
        self.permitted = tuple(permitted)
        self.kubevirt = None  # the localcluster.kubevirt.KubeVirt harness once started
        self.cp = control_plane or ControlPlane()
        self.n = controllers
        self.controller_args = tuple(controller_args)
        self.log_dir = Path(log_dir) if log_dir else None
        self.replicas: list[Replica] = []
        self.webhook_port = 0
        self.service_account = service_account

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- setup -------------------------------------------------------------------------
    def start(self) -> "LocalCluster":
        try:
            if self.own_cp:
                self.cp.start()
            if self.install_manifests:
                self.install()
            if self.kubeconfig is None and self.service_account:
                self.kubeconfig = self.cp.write_service_account_kubeconfig(
                    self.cp.dir / f"{SA_NAME}-sa.kubeconfig", SA_NAMESPACE, SA_NAME,
                    duration=48 * 3600)
            self._webhook_certs()
            for i in range(self.n):
                self.replicas.append(self._new_replica(i))
                self.start_replica(i)
            for i in range(self.n):
                self.wait_ready(i)
            if self.install_manifests:
                self.register_webhook()
            if self.with_kubevirt:
                self.start_kubevirt()
        except BaseException:
            self.stop()
            raise
        return self

    def start_kubevirt(self) -> None:
        """Start virt-api, virt-controller, kube-scheduler and KWOK (KubeVirt CR permitting
        `permitted`)."""
        from localcluster.kubevirt import KubeVirt

        self.kubevirt = KubeVirt(self.cp, permitted=self.permitted,
                                 log_dir=(self.log_dir / "kubevirt") if self.log_dir else None)
        self.kubevirt.start()

    def install(self) -> None:
        """Apply CRDs (ours and KubeVirt's own), RBAC, the settings namespace and the policies."""
        from localcluster.kubevirt import install_crds

        k = self.cp.kubectl
        k("apply", "--server-side", "--field-manager=gpu-binder-install",
          "-f", str(MANIFESTS / "controller" / "namespace.yaml"),
          "-f", str(MANIFESTS / "crds"), "-f", str(MANIFESTS / "rbac"),
          "-f", str(TESTING_MANIFESTS), "-f", str(MANIFESTS / "controller" / "rbac.yaml"))
        k("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{c}" for c in CRDS])
        install_crds(self.cp)
        k("apply", "--server-side", "--field-manager=gpu-binder-install",
          "-f", str(MANIFESTS / "policies"))

    @property
    def webhook_url(self) -> str:
        """The replicas' webhook URL (https://127.0.0.1:<port>/mutate-vmi; serving cert
        signed by the control plane's CA). Fixed before `start()` on first use."""
        self._webhook_certs()
        return f"https://127.0.0.1:{self.webhook_port}/mutate-vmi"

    def _webhook_certs(self) -> None:
        if self.webhook_port:
            return
        pair = self.cp.ca.issue_server(["127.0.0.1", "localhost"])
        d = self.cp.dir / "webhook"
        d.mkdir(exist_ok=True)
        (d / "tls.crt").write_bytes(pair.cert_pem)
        (d / "tls.key").write_bytes(pair.key_pem)
        (d / "tls.key").chmod(0o600)
        self.webhook_dir = d
        # the API server presents its webhook client certificate to this port only
        self.webhook_port = self.cp.webhook_port

    def register_webhook(self) -> None:
        """The shipped MutatingWebhookConfiguration, pointed at the loopback replicas."""
        import base64

        doc = yaml.safe_load((MANIFESTS / "webhook" / "mutatingwebhookconfiguration.yaml")
                             .read_text())
        for hook in doc["webhooks"]:
            hook["clientConfig"] = {
                "url": self.webhook_url,
                "caBundle": base64.b64encode(self.cp.ca.cert_pem).decode()}
        self.cp.kubectl("apply", "--server-side", "--field-manager=gpu-binder-install",
                        "-f", "-", input=yaml.safe_dump(doc))

    # -- replicas ----------------------------------------------------------------------
    def _new_replica(self, i: int) -> Replica:
        logs = self.log_dir or self.cp.dir
        logs.mkdir(parents=True, exist_ok=True)
        return Replica(f"replica-{i}", free_port(), logs / f"controller-{i}.log")

    def start_replica(self, i: int) -> None:
        """(Re)start replica `i` as a subprocess."""
        r = self.replicas[i]
        args = [sys.executable, "-m", "cli.main", "controller",
                f"--kubeconfig={self.kubeconfig or self.cp.admin_kubeconfig}",
                f"--identity={r.identity}",
                f"--metrics-port={r.metrics_port}", "--metrics-host=127.0.0.1",
                f"--webhook-port={self.webhook_port}", "--webhook-host=127.0.0.1",
                f"--webhook-cert={self.webhook_dir / 'tls.crt'}",
                f"--webhook-key={self.webhook_dir / 'tls.key'}",
                f"--webhook-client-ca={self.cp.webhook_client_ca_file}", *self.controller_args]
        if self.log_dir:
            args.append(f"--log-dir={self.log_dir / r.identity}")
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        log = open(r.log_path, "ab")
        try:
            r.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT,
                                      preexec_fn=_die_with_parent)
        finally:
            log.close()

    def wait_ready(self, i: int, timeout: float = 60.0) -> None:
        r = self.replicas[i]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not r.alive:
                raise ControlPlaneError(f"controller {r.identity} exited "
                                        f"({r.proc.returncode}):\n{self.log_tail(i)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{r.metrics_port}/readyz",
                                            timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise ControlPlaneError(f"controller {r.identity} not ready in {timeout:.0f} s:\n"
                                f"{self.log_tail(i)}")

    def log_tail(self, i: int, lines: int = 30) -> str:
        try:
            text = self.replicas[i].log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def kill_replica(self, i: int, sig: int = signal.SIGKILL) -> int | None:
        """Send `sig` to replica `i` and wait for it; returns its exit code."""
        r = self.replicas[i]
        if r.alive:
            os.killpg(r.proc.pid, sig)
            try:
                r.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
        return r.proc.returncode if r.proc else None

    def leader(self) -> str | None:
        """The Lease holder's identity, or None."""
        out = self.cp.kubectl("get", "lease", "gpu-binder", "-n", "cozy-system", "-o",
                              "jsonpath={.spec.holderIdentity}", check=False)
        return out.stdout.strip() or None if out.returncode == 0 else None

    def metrics(self, i: int) -> str:
        with urllib.request.urlopen(
                f"http://127.0.0.1:{self.replicas[i].metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.kubevirt is not None:
            self.kubevirt.stop()
            self.kubevirt = None
        for i in range(len(self.replicas)):
            self.kill_replica(i, signal.SIGTERM)
        if self.own_cp:
            self.cp.stop()
