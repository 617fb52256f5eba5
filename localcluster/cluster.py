"""The whole system on loopback: a `ControlPlane`, the manifests, and N controller replicas
as subprocesses with the webhook registered by URL + caBundle.

Used by `gpu-binder cluster up --controllers N`, the e2e tests, `make demo` and the e2e
benchmark, so they all run the same code path. Replicas share one webhook port
(SO_REUSEPORT, which the kernel allows within one uid only), as pods behind a Service would;
a replica may run inside the built image (`add_replica(image=...)`, localcluster.image) as
uid 65532, beside source-tree replicas run as that uid (`user=`). Replicas run with the shipped
ServiceAccount's token (TokenRequest), not as admin, so the shipped RBAC is what they get.
KubeVirt's own CRDs are always installed (`localcluster.kubevirt.install_crds`); with `kubevirt=True`
virt-api, virt-controller, kube-scheduler and KWOK run too (`localcluster.kubevirt.KubeVirt`).
With `dra=True` (device mode, docs/contract.md §3b) NVIDIA's passthrough DeviceClass is installed,
kube-controller-manager's resourceclaim-controller runs (`localcluster.claimcontroller`) and
KubeVirt starts with `GPUsWithDRA`; `localcluster.dra_world` adds the nodes and their slices.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from localcluster.paths import MANIFESTS, REPO_ROOT, TESTING_MANIFESTS
from localcluster.controlplane import ControlPlane, ControlPlaneError, die_with_parent, free_port

SA_NAMESPACE, SA_NAME = "cozy-system", "gpu-binder"   # controller/rbac.yaml
CRDS = ("gpuclasses.gpu.cozystack.io", "gpudevices.gpu.cozystack.io")


def _reachable_by_others(path: str) -> bool:
    """Every directory up to `path` searchable, and `path` executable, by any uid."""
    p = Path(path)
    return all(os.stat(d).st_mode & 0o001 for d in [*p.parents, p])


def _interpreter_for(uid: int) -> tuple[str, tuple[str, ...]]:
    """(interpreter, extra sys.path entries) with which `uid` runs this checkout: this
    interpreter when another uid can reach it, else the system's python3 of the same version
    with this interpreter's site-packages (a venv of a pyenv Python under /root, mode 0700,
    is out of another uid's reach). Raises ControlPlaneError when there is none."""
    real = os.path.realpath(sys.executable)
    if _reachable_by_others(real):
        return sys.executable, ()
    import shutil
    import site

    for cand in ("/usr/bin/python3", shutil.which("python3") or ""):
        if cand and os.path.exists(cand) and _reachable_by_others(os.path.realpath(cand)):
            out = subprocess.run([cand, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True)
            if out.stdout.strip() == str(tuple(sys.version_info[:2])):
                return cand, tuple(site.getsitepackages())
    raise ControlPlaneError(f"no Python {sys.version_info[0]}.{sys.version_info[1]} that uid "
                            f"{uid} can run ({real} is out of its reach)")


@dataclass
class Replica:
    """One controller subprocess: from the source tree (as `user`, a uid, when set, else as
    the caller), or inside `image` (a buildah `localcluster.image.Container` of it, always as
    the image's uid 65532, with in-cluster configuration). `files` holds what it reads that
    the caller's files would not let that uid read (copies), `settings` an image replica's
    config file's keys."""

    identity: str
    metrics_port: int
    log_path: Path
    proc: subprocess.Popen | None = None
    user: int | None = None
    image: str | None = None
    container: object | None = None      # localcluster.image.Container
    files: Path | None = None
    settings: dict = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """Control plane + manifests + `controllers` replicas. `controller_args` are extra
    `gpu-binder controller` flags (e.g. short leases for tests), `controller_env` extra
    environment of their processes (e.g. PYTHONTRACEMALLOC=1). `start()` returns when every
    replica is ready; `stop()` stops replicas (SIGTERM, then SIGKILL after 10 s) and the
    control plane. Raises ControlPlaneError with the replica's log tail on failure.

    Replicas authenticate with a TokenRequest token of ServiceAccount cozy-system/gpu-binder
    (the shipped RBAC, never more), unless `kubeconfig` names another API access, or
    `service_account` is False (admin). `install=False` leaves the manifests and the webhook
    registration to the caller (e.g. a Helm release pointing its webhook at `webhook_url`;
    it then passes `kubeconfig` for the release's ServiceAccount).

    `user` (a uid) runs the `controllers` replicas from the source tree as that uid (its
    group the same number, no supplementary groups), e.g. 65532 beside an image replica:
    the kernel lets sockets share the webhook port (SO_REUSEPORT) only within one uid, as
    the Pods behind the chart's Service all run as 65532. `add_replica(image=...)` adds a
    replica inside the built image (localcluster.image)."""

    def __init__(self, *, controllers: int = 2, controller_args: tuple[str, ...] = (),
                 log_dir: Path | None = None, control_plane: ControlPlane | None = None,
                 install: bool = True, kubeconfig: Path | None = None,
                 service_account: bool = True,
                 kubevirt: bool = False, permitted: tuple[str, ...] = (),
                 user: int | None = None, controller_env: dict[str, str] | None = None,
                 dra: bool = False) -> None:
        self.own_cp = control_plane is None
        self.dra = dra
        self.claim_controller = None  # localcluster.claimcontroller.ClaimController once started
        self.controller_env = dict(controller_env or {})
        self.install_manifests = install
        self.kubeconfig = kubeconfig
        self.with_kubevirt = kubevirt
        self.permitted = tuple(permitted)
        self.kubevirt = None  # the localcluster.kubevirt.KubeVirt harness once started
        self.cp = control_plane or ControlPlane()
        self.n = controllers
        self.controller_args = tuple(controller_args)
        # absolute: the replicas run in the source tree (cwd REPO_ROOT), the harness's processes in
        # their log folders, and each is given paths under this one
        self.log_dir = Path(log_dir).resolve() if log_dir else None
        self.replicas: list[Replica] = []
        self.webhook_port = 0
        self.service_account = service_account
        self.user = user

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
            if self.dra:
                self.start_dra()
            if self.kubeconfig is None and self.service_account:
                self.kubeconfig = self.cp.write_service_account_kubeconfig(
                    self.cp.dir / f"{SA_NAME}-sa.kubeconfig", SA_NAMESPACE, SA_NAME,
                    duration=48 * 3600)
            self._webhook_certs()
            for i in range(self.n):
                self.replicas.append(self._new_replica(i))
                self.start_replica(i, user=self.user)
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
        `permitted`; with `dra`, `GPUsWithDRA` in the CR before virt-controller starts)."""
        from localcluster.kubevirt import GPUS_WITH_DRA, KubeVirt

        self.kubevirt = KubeVirt(self.cp, permitted=self.permitted,
                                 log_dir=(self.log_dir / "kubevirt") if self.log_dir else None,
                                 feature_gates=(GPUS_WITH_DRA,) if self.dra else ())
        self.kubevirt.start()

    def start_dra(self) -> None:
        """Device mode's cluster side: NVIDIA's DeviceClass `vfio.gpu.nvidia.com` and
        kube-controller-manager's resourceclaim-controller (log in `log_dir`, else the
        control plane's directory). Raises ControlPlaneError as ClaimController.start does."""
        from localcluster.claimcontroller import ClaimController
        from localcluster.dra_profiles import device_class

        self.cp.kubectl("apply", "--server-side", "--field-manager=gpu-binder-install", "-f", "-",
                        input=yaml.safe_dump(device_class()))
        if self.claim_controller is None:
            if self.log_dir:
                self.log_dir.mkdir(parents=True, exist_ok=True)
            self.claim_controller = ClaimController(self.cp, self.log_dir)
        self.claim_controller.start()

    def dead(self) -> list[str]:
        """Names of the harness's processes besides the replicas that exited (empty when all
        run): the control plane's, KubeVirt's and kube-controller-manager."""
        out = [n for n, p in self.cp.procs.items() if p.poll() is not None]
        out += self.kubevirt.alive() if self.kubevirt is not None else []
        if self.claim_controller is not None and not self.claim_controller.alive():
            out.append("kube-controller-manager")
        return out

    def install(self) -> None:
        """Apply CRDs (ours and KubeVirt's own), RBAC, the settings namespace, the API Priority
        and Fairness objects for VMI creates and the policies (with the settings ConfigMap
        gpu-settings they read, created before their bindings)."""
        from localcluster.kubevirt import install_crds

        k = self.cp.kubectl
        k("apply", "--server-side", "--field-manager=gpu-binder-install",
          "-f", str(MANIFESTS / "controller" / "namespace.yaml"),
          "-f", str(MANIFESTS / "crds"), "-f", str(MANIFESTS / "rbac"),
          "-f", str(TESTING_MANIFESTS), "-f", str(MANIFESTS / "controller" / "rbac.yaml"),
          "-f", str(MANIFESTS / "flowcontrol"))
        k("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{c}" for c in CRDS])
        install_crds(self.cp)
        # --force-conflicts: a controller's H3 may have taken gpu-settings' rawResourceNames
        k("apply", "--server-side", "--force-conflicts", "--field-manager=gpu-binder-install",
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
    def _new_replica(self, i: int, prefix: str = "replica") -> Replica:
        logs = self.log_dir or self.cp.dir
        logs.mkdir(parents=True, exist_ok=True)
        return Replica(f"{prefix}-{i}", free_port(), logs / f"controller-{i}.log")

    def add_replica(self, *, image: str | None = None, user: int | None = None,
                    settings: dict | None = None) -> int:
        """Start one more replica (not waited for: `wait_ready(i)`); returns its index i.

        With `image` (a tag of the built controller image, `localcluster.image.build_image`),
        the replica runs inside it as the image's uid 65532 on a read-only root, with the
        chart's arguments (`--config=/etc/gpu-binder/config.yaml`, the TLS and client-CA
        paths; then `controller_args` as the chart's extraArgs) and nothing else to reach the
        API server than what a kubelet gives a Pod (in-cluster configuration: the
        ServiceAccount's token, CA and namespace at SA_DIR, KUBERNETES_SERVICE_HOST/PORT,
        POD_NAME its identity `image-<i>`). Its config file holds the loopback webhook and
        metrics addresses, then `settings` (the chart's ConfigMap keys). Without `image`,
        a source-tree replica `replica-<i>`, as `user` when given. Raises
        localcluster.image.ImageError when buildah fails."""
        i = len(self.replicas)
        r = self._new_replica(i, "image" if image else "replica")
        r.image, r.settings = image, dict(settings or {})
        self.replicas.append(r)
        self.start_replica(i, user=user)
        return i

    def start_replica(self, i: int, *, user: int | None = None) -> None:
        """(Re)start replica `i` as a subprocess; `user` (a uid) runs a source-tree replica
        as that uid from now on (None: as it ran before; an image replica always runs as
        the image's uid). A replica run as another uid reads copies of the kubeconfig and
        webhook files made for it at its first start (a later rotation of `webhook_dir`
        does not reach them) and writes its --log-dir there."""
        r = self.replicas[i]
        if user is not None:
            r.user = user
        if r.image:
            self._start_in_image(r)
            return
        files = self._user_files(r) if r.user is not None else None
        kubeconfig = Path(self.kubeconfig or self.cp.admin_kubeconfig)
        cert, key = self.webhook_dir / "tls.crt", self.webhook_dir / "tls.key"
        client_ca = Path(self.cp.webhook_client_ca_file)
        if files is not None:
            kubeconfig, cert, key, client_ca = (files / "kubeconfig", files / "tls.crt",
                                                files / "tls.key", files / "client-ca.crt")
        args = [_interpreter_for(r.user)[0] if r.user is not None else sys.executable,
                "-m", "cli.main", "controller",
                f"--kubeconfig={kubeconfig}",
                f"--identity={r.identity}",
                f"--metrics-port={r.metrics_port}", "--metrics-host=127.0.0.1",
                f"--webhook-port={self.webhook_port}", "--webhook-host=127.0.0.1",
                f"--webhook-cert={cert}", f"--webhook-key={key}",
                f"--webhook-client-ca={client_ca}", *self.controller_args]
        if files is not None:
            args.append(f"--log-dir={files / 'logs'}")
        elif self.log_dir:
            args.append(f"--log-dir={self.log_dir / r.identity}")
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
               **self.controller_env}   # controller_env may set PYTHONPATH too (a test's fault point)
        as_user = {}
        if r.user is not None:
            env.update(HOME=str(files), PYTHONDONTWRITEBYTECODE="1",
                       PYTHONPATH=os.pathsep.join((str(REPO_ROOT), *_interpreter_for(r.user)[1])))
            as_user = {"user": r.user, "group": r.user, "extra_groups": []}
        log = open(r.log_path, "ab")
        try:
            r.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT,
                                      preexec_fn=die_with_parent, **as_user)
        finally:
            log.close()

    def _user_files(self, r: Replica) -> Path:
        """A directory of r.user's own (mode 0700) with copies of what the replica reads."""
        if r.files is None:
            import shutil
            import tempfile

            d = Path(tempfile.mkdtemp(prefix=f"gpu-binder-{r.identity}-"))
            for name, src in (("kubeconfig", self.kubeconfig or self.cp.admin_kubeconfig),
                              ("tls.crt", self.webhook_dir / "tls.crt"),
                              ("tls.key", self.webhook_dir / "tls.key"),
                              ("client-ca.crt", self.cp.webhook_client_ca_file)):
                shutil.copyfile(src, d / name)
                (d / name).chmod(0o600)
            (d / "logs").mkdir()
            for p in (d, *d.iterdir()):
                os.chown(p, r.user, r.user)
            r.files = d
        return r.files

    def _start_in_image(self, r: Replica) -> None:
        from localcluster import image as img

        if r.container is None:
            r.container = img.Container(r.image)
        if r.files is None:
            import tempfile

            r.files = Path(tempfile.mkdtemp(prefix=f"gpu-binder-{r.identity}-"))
        d = r.files
        # a fresh token at each start, as a kubelet's projected token
        env = img.write_service_account(self.cp, d / "serviceaccount", SA_NAMESPACE, SA_NAME)
        img.readable_copy(self.webhook_dir / "tls.crt", d / "tls/tls.crt")
        img.readable_copy(self.webhook_dir / "tls.key", d / "tls/tls.key")
        img.readable_copy(self.cp.webhook_client_ca_file, d / "client-ca/ca.crt")
        config = d / "config" / "config.yaml"
        config.parent.mkdir(exist_ok=True)
        config.parent.chmod(0o755)
        config.write_text(yaml.safe_dump({
            "webhook_host": "127.0.0.1", "webhook_port": self.webhook_port,
            "metrics_host": "127.0.0.1", "metrics_port": r.metrics_port, **r.settings}))
        config.chmod(0o644)
        argv = ["gpu-binder", "controller", "--config=/etc/gpu-binder/config.yaml",
                "--webhook-cert=/tls/tls.crt", "--webhook-key=/tls/tls.key",
                "--webhook-client-ca=/client-ca/ca.crt", *self.controller_args]
        cmd = r.container.read_only_argv(argv, env={"POD_NAME": r.identity, **env}, mounts={
            str(d / "serviceaccount"): img.SA_DIR, str(d / "tls"): "/tls",
            str(d / "client-ca"): "/client-ca", str(d / "config"): "/etc/gpu-binder"})
        r.user = img.IMAGE_USER
        log = open(r.log_path, "ab")
        try:
            r.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
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
        if self.claim_controller is not None:
            self.claim_controller.stop()
            self.claim_controller = None
        import shutil

        for i, r in enumerate(self.replicas):
            self.kill_replica(i, signal.SIGTERM)
            if r.container is not None:
                r.container.remove()
                r.container = None
            if r.files is not None:
                shutil.rmtree(r.files, ignore_errors=True)
                r.files = None
        if self.own_cp:
            self.cp.stop()
