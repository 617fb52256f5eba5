"""A real local Kubernetes control plane (etcd + kube-apiserver) on loopback.

`ControlPlane` builds nothing itself: `find_binaries()` runs `tools/build-controlplane.sh`
(pinned Go modules, cached outside the checkout) when the binaries are missing. It picks free
loopback ports, makes throwaway CAs with `localcluster.pki`, starts etcd then kube-apiserver with RBAC
on and an AdmissionConfiguration that makes it present a client certificate (of a CA of its
own) to the webhook port it reserves (`webhook_port`), waits for readiness within a
deadline and writes kubeconfigs. Every process it starts is
in its own process group with a parent-death signal, and is stopped by `stop()`, by the
context manager, at interpreter exit, and when the launching process dies. A process killed
with SIGKILL cannot remove its work directory (etcd's data, the PKI with the CA key, the admin
kubeconfig), so each one records its owner (`owner.json`: pid and the kernel's start time of
that pid) and the next ControlPlane sweeps the directories whose owner is gone
(`sweep_stale_workdirs`).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster.paths import REPO_ROOT
from localcluster.pki import CertificateAuthority, rsa_service_account_keys

BUILD_SCRIPT = REPO_ROOT / "tools" / "build-controlplane.sh"
ADMIN_USER = "gpu-binder-admin"
WEBHOOK_CLIENT_USER = "kube-apiserver-webhook-client"
FEATURE_GATES = "DRADeviceTaintRules=true"
"""Feature gates of kube-apiserver, kube-scheduler and kube-controller-manager: DeviceTaintRules
(HL1/HL2, off by default in 1.36, whose `DRADeviceTaints` is on by default)."""
RUNTIME_CONFIG = "resource.k8s.io/v1beta2=true"
"""kube-apiserver's --runtime-config: the beta `resource.k8s.io/v1beta2`, which serves
DeviceTaintRules (off by default; `resource.k8s.io/v1` serves every other DRA kind)."""


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message says which part and why,
    and ends with the tail of that process's log when there is one."""


@dataclass(frozen=True, slots=True)
class Binaries:
    """Paths of the control-plane executables (`kube_scheduler` is checked by its user,
    `localcluster.kubevirt`, only)."""

    etcd: Path
    kube_apiserver: Path
    kubectl: Path
    kube_scheduler: Path | None = None


_BUILT: dict[Path, Path] = {}
"""Per build script, the directory its run in this process printed (a script is run once a
process: the test session applies KubeVirt's CRDs once a module, and its check of the cache
costs about a second)."""


def built_dir(script: Path, override_env: str, *, build: bool = True) -> Path:
    """The directory of cached binaries a build script made: `$<override_env>` when set,
    else the last stdout line of `bash script` (which skips what is cached; its messages go
    to stderr; run once a process, then remembered). Raises ControlPlaneError when the
    script fails or building is disabled."""
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    if script in _BUILT:
        return _BUILT[script]
    if not build:
        raise ControlPlaneError(f"{override_env} is not set and building is disabled")
    proc = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ControlPlaneError(f"tools/{script.name} failed with exit code {proc.returncode} "
                                "(its messages are above)")
    _BUILT[script] = Path(lines[-1])
    return _BUILT[script]


def find_binaries(*, build: bool = True) -> Binaries:
    """Locate (and, when `build`, build) etcd, kube-apiserver and kubectl.

    `GPU_BINDER_BIN_DIR` points at a directory that already holds all three; otherwise the
    build script is run (it skips what is cached) and its last stdout line is the directory.
    Raises ControlPlaneError when Go or the module proxy is missing or a binary is absent.
    """
    d = built_dir(BUILD_SCRIPT, "GPU_BINDER_BIN_DIR", build=build)
    bins = Binaries(d / "etcd", d / "kube-apiserver", d / "kubectl", d / "kube-scheduler")
    for p in (bins.etcd, bins.kube_apiserver, bins.kubectl):
        if not os.access(p, os.X_OK):
            raise ControlPlaneError(f"control-plane binary missing or not executable: {p}")
    return bins


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PR_SET_PDEATHSIG = 1
_live: set["ControlPlane"] = set()


def die_with_parent() -> None:
    """The `preexec_fn` of the harness's children (it runs in the child between fork and
    exec): the kernel kills the child (SIGKILL) when its parent dies (prctl
    PR_SET_PDEATHSIG; skipped where there is no libc prctl), and the child leads a session
    of its own (`os.setsid`). Raises nothing the caller need handle."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    os.setsid()


@atexit.register
def _stop_all() -> None:
    for cp in list(_live):
        cp.stop()


def _exit_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit (when nobody handles it yet), so `finally` blocks and
    atexit stop what was started; SIGKILL is covered by the children's parent-death signal."""
    import threading

    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def handler(signum, frame):  # noqa: ARG001
            raise SystemExit(128 + signum)
        signal.signal(signal.SIGTERM, handler)


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop `proc`'s process group: SIGTERM, then SIGKILL after `grace` seconds; returns once
    it has exited (at once when it already has)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def spawn_logged(directory: Path, name: str, args: list[str]) -> subprocess.Popen:
    """Start `args` in `directory`, stdout and stderr appended to `directory/<name>.log`,
    stdin closed, killed with its parent (Linux PR_SET_PDEATHSIG). Raises OSError when the
    binary cannot be started."""
    log = open(directory / f"{name}.log", "ab")
    try:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
                                cwd=directory)
    finally:
        log.close()


def kubeconfig(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes,
               user: str, namespace: str | None = None) -> dict:
    """A kubeconfig dict with embedded CA and client certificate for `user` at `server`."""
    import base64

    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    ctx: dict = {"cluster": "local", "user": user}
    if namespace:
        ctx["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": user, "context": ctx}],
        "current-context": user,
    }


OWNER_FILE = "owner.json"
WORKDIR_PREFIX = "gpu-binder-cp-"


def _process_start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` in clock ticks since boot (field 22 of
    /proc/<pid>/stat), or None when no such process exists. A pid and its start time name one
    process: a recycled pid has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    return int(stat.rsplit(")", 1)[1].split()[19])


def _record_owner(workdir: Path) -> None:
    """Write `owner.json` (this process's pid and start time) into `workdir`."""
    pid = os.getpid()
    (workdir / OWNER_FILE).write_text(json.dumps({"pid": pid, "start": _process_start_ticks(pid)}))


def _owner_alive(workdir: Path) -> bool:
    """Whether the process recorded in `workdir`'s `owner.json` still runs. A directory
    without a readable record counts as alive (it may be being made right now, or belong to
    an older version): only a recorded owner that is gone makes a directory stale."""
    try:
        owner = json.loads((workdir / OWNER_FILE).read_text())
        pid, start = int(owner["pid"]), owner["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return _process_start_ticks(pid) == start


def sweep_stale_workdirs(root: Path | None = None) -> list[Path]:
    """Remove the `gpu-binder-cp-*` work directories under `root` (default: the temp dir)
    whose recorded owner process is gone (killed with SIGKILL, so it could not clean up),
    and return them. Directories of live owners, without an owner record, or of another
    user are left alone."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for d in sorted(root.glob(WORKDIR_PREFIX + "*")):
        try:
            if not d.is_dir() or d.stat().st_uid != os.getuid() or _owner_alive(d):
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


class ControlPlane:
    """etcd + kube-apiserver on loopback, in a private work directory.

    Usage: `with ControlPlane() as cp: cp.admin_kubeconfig ...`. `start()` raises
    ControlPlaneError (with the failing process's log tail) when a part does not become
    ready within `start_timeout` seconds. `stop()` is idempotent: SIGTERM to each process
    group, SIGKILL after 10 s, then the work directory is removed (unless `keep_dir`); one
    left behind by a SIGKILLed owner is removed by the next ControlPlane made here.
    """

    def __init__(self, *, binaries: Binaries | None = None, workdir: Path | None = None,
                 start_timeout: float = 90.0, keep_dir: bool = False) -> None:
        self.binaries = binaries or find_binaries()
        self._own_dir = workdir is None
        if workdir is None:
            sweep_stale_workdirs()
        self.dir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._own_dir:
            _record_owner(self.dir)
        self.start_timeout = start_timeout
        self.keep_dir = keep_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.etcd_port = 0
        self.api_port = 0
        self.ca = CertificateAuthority("gpu-binder-local-ca")
        self._admin = self.ca.issue_client(ADMIN_USER, ("system:masters",))
        # the API server's identity towards admission webhooks (W6: a webhook trusts only
        # this CA, never the cluster CA that also signs tenants' client certificates)
        self.webhook_client_ca = CertificateAuthority("gpu-binder-webhook-client-ca")
        self._webhook_client = self.webhook_client_ca.issue_client(WEBHOOK_CLIENT_USER)
        self.webhook_port = free_port()

    # -- public --------------------------------------------------------------------------
    @property
    def server(self) -> str:
        """The API server URL, https://127.0.0.1:<port>."""
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        """Path of the admin (system:masters) kubeconfig."""
        return self.dir / "admin.kubeconfig"

    @property
    def webhook_client_ca_file(self) -> Path:
        """PEM of the CA that signed the API server's webhook client certificate: what a
        webhook served on `webhook_port` passes as `--webhook-client-ca`."""
        return self.dir / "pki" / "webhook-client-ca.crt"

    @property
    def webhook_client_files(self) -> tuple[Path, Path]:
        """(certificate, key) the API server presents to webhooks at 127.0.0.1/localhost on
        `webhook_port` (tests use them to stand in for the API server)."""
        d = self.dir / "pki"
        return d / "webhook-client.crt", d / "webhook-client.key"

    @property
    def pids(self) -> list[int]:
        """PIDs of the processes this control plane started."""
        return [p.pid for p in self.procs.values()]

    def __enter__(self) -> "ControlPlane":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "ControlPlane":
        """Start etcd, then kube-apiserver; return when /readyz is ok. Idempotent-safe:
        on failure everything started so far is stopped before the error propagates."""
        _exit_on_sigterm()
        _live.add(self)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig(self.admin_kubeconfig, self._admin, ADMIN_USER)
        except BaseException:
            self.stop()
            raise
        return self

    def write_user_kubeconfig(self, path: Path, user: str, groups: tuple[str, ...] = (),
                              namespace: str | None = None) -> Path:
        """Issue a client certificate for `user`/`groups` and write its kubeconfig to `path`."""
        pair = self.ca.issue_client(user, groups)
        self._write_kubeconfig(Path(path), pair, user, namespace)
        return Path(path)

    def write_service_account_kubeconfig(self, path: Path, namespace: str, name: str,
                                         duration: int = 3600) -> Path:
        """Write a kubeconfig at `path` holding a TokenRequest token (valid `duration`
        seconds) of ServiceAccount `namespace/name`: a client with exactly that account's
        RBAC. Raises ControlPlaneError when the account does not exist."""
        token = self.kubectl("create", "token", name, "-n", namespace,
                             f"--duration={duration}s").stdout.strip()
        cfg = kubeconfig(self.server, self.ca.cert_pem, b"", b"", name, namespace)
        cfg["users"] = [{"name": name, "user": {"token": token}}]
        path = Path(path)
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the built kubectl against this control plane (admin by default)."""
        cmd = [str(self.binaries.kubectl), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
               *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def stop(self) -> None:
        """Stop every process (apiserver first), wait for them, remove the work directory."""
        for name in ("kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            stop_process(proc)
        _live.discard(self)
        if self._own_dir and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart_apiserver(self) -> None:
        """Kill kube-apiserver (SIGKILL) and start it again on the same port and etcd;
        returns once /readyz answers (ControlPlaneError after `start_timeout`). Call it from
        a thread that outlives the new process (the main thread, or one long-lived worker):
        processes are started with PR_SET_PDEATHSIG, which the kernel fires when the
        *thread* that forked them exits — an anyio/asyncio worker thread exits when idle."""
        self.stop_apiserver()
        self.start_apiserver()

    def stop_apiserver(self) -> None:
        """Kill kube-apiserver (SIGKILL) and wait for it; etcd keeps running. Clients get
        connection errors until `start_apiserver()`."""
        proc = self.procs.pop("kube-apiserver", None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def start_apiserver(self) -> None:
        """Start kube-apiserver again on the same port and etcd; return when /readyz is ok."""
        self._start_apiserver(port=self.api_port)

    # -- internals -----------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        proc = self.procs[name] = spawn_logged(self.dir, name, args)
        return proc

    def _log_tail(self, name: str, lines: int = 25) -> str:
        try:
            text = (self.dir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def _wait(self, name: str, probe) -> None:
        deadline = time.monotonic() + self.start_timeout
        proc = self.procs[name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {proc.returncode} during start-up:\n"
                    f"{self._log_tail(name)}")
            try:
                if probe():
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{name} not ready within {self.start_timeout:.0f} s:\n{self._log_tail(name)}")

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [
            str(self.binaries.etcd), "--name=default", f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}", "--unsafe-no-fsync",
            "--log-level=warn", "--quota-backend-bytes=4294967296",
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"

        self._wait("etcd", healthy)

    def _start_apiserver(self, port: int | None = None) -> None:
        self.api_port = port or free_port()
        d = self.dir / "pki"
        d.mkdir(exist_ok=True)
        serving = self.ca.issue_server(["127.0.0.1", "localhost", "::1"])
        sa = rsa_service_account_keys()
        files = {"ca.crt": self.ca.cert_pem, "apiserver.crt": serving.cert_pem,
                 "apiserver.key": serving.key_pem, "sa.pub": sa.cert_pem, "sa.key": sa.key_pem}
        if not (d / "sa.key").exists():  # keep SA keys across restarts: tokens stay valid
            for n, data in files.items():
                (d / n).write_bytes(data)
        else:
            for n in ("apiserver.crt", "apiserver.key"):
                (d / n).write_bytes(files[n])
        admission = self._admission_config(d)
        self._spawn("kube-apiserver", [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--secure-port={self.api_port}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--cert-dir={d}",
            f"--tls-cert-file={d / 'apiserver.crt'}", f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            f"--admission-control-config-file={admission}",
            f"--service-account-issuer=https://127.0.0.1:{self.api_port}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            f"--feature-gates={FEATURE_GATES}", f"--runtime-config={RUNTIME_CONFIG}",
            "--v=1",
        ])
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        cert_file, key_file = d / "admin.crt", d / "admin.key"
        cert_file.write_bytes(self._admin.cert_pem)
        key_file.write_bytes(self._admin.key_pem)
        ctx.load_cert_chain(str(cert_file), str(key_file))

        def ready() -> bool:
            req = urllib.request.Request(f"{self.server}/readyz")
            with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
                return r.status == 200

        self._wait("kube-apiserver", ready)

    def _admission_config(self, d: Path) -> Path:
        """Write the AdmissionConfiguration that makes the API server present its webhook
        client certificate to webhooks at 127.0.0.1/localhost:`webhook_port` (the
        WebhookAdmission kubeconfig is matched by the webhook URL's host:port); every other
        webhook gets no client certificate. Returns the configuration file's path."""
        import base64

        cert, key = self.webhook_client_files
        cert.write_bytes(self._webhook_client.cert_pem)
        key.write_bytes(self._webhook_client.key_pem)
        key.chmod(0o600)
        self.webhook_client_ca_file.write_bytes(self.webhook_client_ca.cert_pem)
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        user = {"client-certificate-data": b64(self._webhook_client.cert_pem),
                "client-key-data": b64(self._webhook_client.key_pem)}
        kubeconfig_file = d / "webhook-admission.kubeconfig"
        kubeconfig_file.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "users": [{"name": f"{host}:{self.webhook_port}", "user": user}
                      for host in ("127.0.0.1", "localhost")]}))
        kubeconfig_file.chmod(0o600)
        plugin = {"apiVersion": "apiserver.config.k8s.io/v1",
                  "kind": "WebhookAdmissionConfiguration",
                  "kubeConfigFile": str(kubeconfig_file)}
        config_file = d / "admission.yaml"
        config_file.write_text(yaml.safe_dump({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
            "plugins": [{"name": name, "configuration": plugin}
                        for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")]}))
        return config_file

    def _write_kubeconfig(self, path: Path, pair, user: str, namespace: str | None = None) -> None:
        cfg = kubeconfig(self.server, self.ca.cert_pem, pair.cert_pem, pair.key_pem, user, namespace)
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
