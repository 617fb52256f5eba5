"""A Deployment's Pods run as processes from their image, replaced as a rolling update would
(the upgrade tests, tests/e2e/test_upgrade.py).

The local control plane has no kubelet (KWOK only fakes Pods), so a Helm release's
Deployment cannot run. `Kubelet` plays the part for one container: it reads the Deployment
the API server holds (whatever chart version applied it), and runs its pod template's
container inside the image the template names, as a kubelet would start a Pod of it:

- the image's root filesystem (`buildah from` + `buildah mount`, one working container per
  image), bind-mounted read-only in a private mount namespace (`readOnlyRootFilesystem`),
  chrooted into as the pod's `runAsUser:runAsGroup`, with the image's entry point and the
  container's `args`;
- the container's `volumeMounts` materialised from the live objects: a Secret's or a
  ConfigMap's keys as files of mode 0644, an emptyDir as a tmpfs, and the ServiceAccount
  (`serviceAccountName`) token (TokenRequest), the cluster CA and the namespace under
  /var/run/secrets/kubernetes.io/serviceaccount, with KUBERNETES_SERVICE_HOST/PORT set:
  the controller's in-cluster configuration is what it uses;
- the container's `env` (`value`, and `fieldRef` metadata.name/metadata.namespace: the pod's
  name, its Lease identity).

The one liberty is the network: every pod shares the host's loopback, so the harness adds
`--webhook-host/--webhook-port` and `--metrics-host/--metrics-port` (ports of each pod's
own) to the container's arguments, and `Service` stands for the Deployment's Service: it
forwards the webhook's connections to the ready pods. Ready is the container's readiness
probe's path (`/readyz`) answering 200.

`Deployment.rolling_update` replaces the running pods with the new template one at a time,
new pod ready before the old one is stopped (maxSurge 1, maxUnavailable 0);
`Deployment.recreate` stops every pod before starting new ones, so for a moment no replica
serves (a single-replica Deployment's update, or the Recreate strategy). A stopped pod gets
SIGTERM, then SIGKILL after its `terminationGracePeriodSeconds`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from localcluster.controlplane import ControlPlane, ControlPlaneError, die_with_parent, free_port

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"   # where a kubelet mounts it


def _run(*argv: str, timeout: float = 120) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


@dataclass
class Pod:
    """One replica: a pod `name` of template `revision` (a hash of the pod template), running
    `image` (its version label `version`) as process `proc`, metrics on `metrics_port`."""

    name: str
    revision: str
    image: str
    version: str
    metrics_port: int
    webhook_port: int
    log_path: Path
    grace: float
    proc: subprocess.Popen | None = None
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None       # time.monotonic() of the first ready probe
    stopping_at: float | None = None    # SIGTERM sent
    stopped_at: float | None = None     # exited

    def windows(self, *, after: float = 0.0) -> list[tuple[float, float]]:
        """The (start, end) time.monotonic() spans in which this pod was not a steady,
        ready replica: from its start until ready, and from SIGTERM until it exited,
        each widened by `after` seconds at the end (open spans end now)."""
        now = time.monotonic()
        spans = [(self.started_at, (self.ready_at or now) + after)]
        if self.stopping_at is not None:
            spans.append((self.stopping_at, (self.stopped_at or now) + after))
        return spans

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        """The readiness probe: GET /readyz on the metrics port answers 200."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz",
                                        timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        """The replica's /metrics text (raises OSError when it does not answer)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as resp:
            return resp.read().decode()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Images:
    """One mounted working container per image (`buildah from --pull-never` + `buildah
    mount`), shared read-only by every pod of that image; `close()` unmounts and removes
    them. Raises ControlPlaneError when buildah fails (e.g. the image is not built)."""

    def __init__(self) -> None:
        self._roots: dict[str, tuple[str, str]] = {}

    def root(self, image: str) -> str:
        """The host path of `image`'s root filesystem."""
        if image not in self._roots:
            ctr = _run("buildah", "from", "--pull-never", image).strip().splitlines()[-1]
            self._roots[image] = (ctr, _run("buildah", "mount", ctr).strip())
        return self._roots[image][1]

    def config(self, image: str) -> dict:
        """The image's OCI config (Entrypoint, Cmd, User, Labels, ...)."""
        return json.loads(_run("buildah", "inspect", "--type", "image", image))["OCIv1"]["config"]

    def close(self) -> None:
        for ctr, _ in self._roots.values():
            subprocess.run(["buildah", "umount", ctr], capture_output=True)
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
        self._roots.clear()


class Kubelet:
    """Runs pods of Deployments held by control plane `cp` as processes (see the module's
    docstring); `workdir`: where volumes and logs go."""

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.cp, self.workdir = cp, Path(workdir)
        self.images = Images()
        admin = yaml.safe_load(Path(cp.admin_kubeconfig).read_text())["clusters"][0]["cluster"]
        self.server = urllib.parse.urlsplit(admin["server"])
        self.cluster_ca = base64.b64decode(admin["certificate-authority-data"])

    def close(self) -> None:
        self.images.close()

    def _get(self, kind: str, namespace: str, name: str) -> dict:
        return json.loads(self.cp.kubectl("get", kind, name, "-n", namespace, "-o",
                                          "json").stdout)

    def _volume(self, pod_dir: Path, namespace: str, volume: dict) -> Path | None:
        """The host directory holding `volume`'s files (None: an emptyDir, a tmpfs)."""
        d = pod_dir / "volumes" / volume["name"]
        d.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            data = {k: base64.b64decode(v) for k, v in
                    (self._get("secret", namespace, volume["secret"]["secretName"])
                     .get("data") or {}).items()}
        elif "configMap" in volume:
            data = {k: v.encode() for k, v in
                    (self._get("configmap", namespace, volume["configMap"]["name"])
                     .get("data") or {}).items()}
        elif "emptyDir" in volume:
            return None
        else:
            raise ControlPlaneError(f"volume {volume['name']}: kind not supported here")
        for key, value in data.items():
            (d / key).write_bytes(value)
            (d / key).chmod(0o644)
        return d

    def _service_account(self, pod_dir: Path, namespace: str, name: str) -> Path:
        d = pod_dir / "serviceaccount"
        d.mkdir(parents=True, exist_ok=True)
        (d / "token").write_text(self.cp.kubectl("create", "token", name, "-n", namespace,
                                                 "--duration=2h").stdout.strip())
        (d / "ca.crt").write_bytes(self.cluster_ca)
        (d / "namespace").write_text(namespace)
        for f in d.iterdir():
            f.chmod(0o644)
        return d

    def start(self, deployment: dict, name: str) -> Pod:
        """Start pod `name` of `deployment` (an apps/v1 Deployment as the API server returns
        it); returns at once (see `wait_ready`). Raises ControlPlaneError when an object a
        volume names is missing or the image cannot be mounted."""
        meta, tmpl = deployment["metadata"], deployment["spec"]["template"]
        namespace, spec = meta["namespace"], tmpl["spec"]
        container = spec["containers"][0]
        image = container["image"]
        root = self.images.root(image)
        config = self.images.config(image)
        pod_dir = self.workdir / name
        pod_dir.mkdir(parents=True, exist_ok=True)
        volumes = {v["name"]: self._volume(pod_dir, namespace, v) for v in spec["volumes"]}
        mounts: list[tuple[Path | None, str]] = [
            (volumes[m["name"]], m["mountPath"]) for m in container.get("volumeMounts") or []]
        mounts.append((self._service_account(pod_dir, namespace,
                                             spec.get("serviceAccountName", "default")), SA_DIR))
        security = {**(spec.get("securityContext") or {}),
                    **(container.get("securityContext") or {})}
        user = f"{security.get('runAsUser', 0)}:{security.get('runAsGroup', 0)}"
        env = {"KUBERNETES_SERVICE_HOST": self.server.hostname,
               "KUBERNETES_SERVICE_PORT": str(self.server.port),
               "PATH": next((e.split("=", 1)[1] for e in config.get("Env") or []
                             if e.startswith("PATH=")), "/usr/bin:/bin"),
               "HOME": "/tmp"}
        fields = {"metadata.name": name, "metadata.namespace": namespace}
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "fieldRef" in (e.get("valueFrom") or {}):
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        metrics_port, webhook_port = free_port(), free_port()
        argv = [*(container.get("command") or config.get("Entrypoint") or []),
                *container.get("args", config.get("Cmd") or []),
                "--webhook-host=127.0.0.1", f"--webhook-port={webhook_port}",
                "--metrics-host=127.0.0.1", f"--metrics-port={metrics_port}"]
        labels = config.get("Labels") or {}
        pod = Pod(name=name, revision=template_hash(tmpl), image=image,
                  version=labels.get("org.opencontainers.image.version", "?"),
                  metrics_port=metrics_port, webhook_port=webhook_port,
                  log_path=pod_dir / "log",
                  grace=float(spec.get("terminationGracePeriodSeconds", 30)))
        cmd = _chrooted(root, argv, user=user, env=env,
                        read_only=bool(security.get("readOnlyRootFilesystem")), mounts=mounts)
        with open(pod.log_path, "ab") as log:
            pod.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL,
                                        preexec_fn=die_with_parent)  # (its own session)
        return pod

    @staticmethod
    def wait_ready(pod: Pod, timeout: float = 90.0) -> None:
        """Wait for the readiness probe. Raises ControlPlaneError with the log's tail when the
        pod exits or is not ready within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pod.alive:
                raise ControlPlaneError(f"pod {pod.name} exited ({pod.proc.returncode}):\n"
                                        f"{pod.log_tail()}")
            if pod.ready():
                pod.ready_at = time.monotonic()
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"pod {pod.name} not ready in {timeout:.0f} s:\n{pod.log_tail()}")

    @staticmethod
    def stop(pod: Pod) -> int | None:
        """SIGTERM, SIGKILL after the pod's grace period; returns the exit code."""
        if pod.alive:
            pod.stopping_at = time.monotonic()
            os.killpg(pod.proc.pid, signal.SIGTERM)
            try:
                pod.proc.wait(pod.grace)
            except subprocess.TimeoutExpired:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
            pod.stopped_at = time.monotonic()
        return pod.proc.returncode if pod.proc else None


class Service:
    """The Deployment's Service on loopback: a TCP balancer on 127.0.0.1:`port` (the port
    kube-apiserver presents its webhook client certificate to) forwarding each connection,
    TLS untouched, to the next ready pod (round robin over `endpoints`, as kube-proxy picks
    an endpoint per connection). kube-apiserver keeps its connections to a webhook alive, so
    a pod started later would get no reviews while older connections last; like a
    connection-age limit on a real load balancer, a connection older than `max_age` seconds
    is closed once it has been idle `idle` seconds, so reviews spread over every ready pod;
    one that busy (reviews back to back, as kube-apiserver's most recently used connection
    is under a steady churn) is closed, once three times that old, at its first 20 ms pause
    after an answer (between reviews, not under one),
    or a pod that does not close connections itself (one older than
    --webhook-keepalive-reviews) would keep every review.
    `forced` holds the time.monotonic() of each such close: a request the client began
    sending on that connection at that moment fails with EOF or a reset (kube-apiserver
    reports "failed calling webhook"), an artifact of this balancer to tell from a replica's
    error. Raises OSError when the port cannot be bound."""

    def __init__(self, port: int, *, max_age: float = 2.0, idle: float = 0.3) -> None:
        import socket
        import threading

        self.port, self.max_age, self.idle = port, max_age, idle
        self.endpoints: list[int] = []       # the ready pods' webhook ports
        self._next = 0
        self._lock = threading.Lock()
        # [client, backend, opened, last activity, last bytes were the pod's (an answer)]
        self._conns: list[list] = []
        self.forced: list[float] = []
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._listener.settimeout(0.2)
        for target in (self._accept, self._reap):
            threading.Thread(target=target, daemon=True).start()

    def add(self, port: int) -> None:
        with self._lock:
            if port not in self.endpoints:
                self.endpoints.append(port)

    def remove(self, port: int) -> None:
        with self._lock:
            if port in self.endpoints:
                self.endpoints.remove(port)

    def _pick(self) -> int | None:
        with self._lock:
            if not self.endpoints:
                return None
            self._next = (self._next + 1) % len(self.endpoints)
            return self.endpoints[self._next]

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            port = self._pick()
            try:
                if port is None:
                    raise OSError("no ready endpoint")
                backend = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                client.close()               # the client sees the connection refused/reset
                continue
            conn = [client, backend, time.monotonic(), time.monotonic(), False]
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    def _pump(self, conn: list) -> None:
        import select

        client, backend = conn[0], conn[1]
        peer = {client: backend, backend: client}
        try:
            while True:
                ready, _, _ = select.select([client, backend], [], [], 1.0)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peer[sock].sendall(data)
                    conn[3], conn[4] = time.monotonic(), sock is backend
        except OSError:
            return
        finally:
            for sock in (client, backend):
                sock.close()
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)

    def _reap(self) -> None:
        import socket

        while not self._closed.wait(0.01):
            now = time.monotonic()
            with self._lock:
                old = [c for c in self._conns if now - c[2] > self.max_age and (
                    now - c[3] > self.idle
                    or (now - c[2] > 3 * self.max_age and c[4] and now - c[3] > 0.02))]
                for c in old:
                    c[2] = float("inf")      # closing: not again
            for c in old:
                self.forced.append(time.monotonic())
                for sock in (c[0], c[1]):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def close(self) -> None:
        self._closed.set()
        self._listener.close()


def template_hash(template: dict) -> str:
    """A short, stable hash of a pod template (as a ReplicaSet's pod-template-hash)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:8]


def _chrooted(root: str, argv: Sequence[str], *, user: str, env: dict[str, str],
              read_only: bool, mounts: Sequence[tuple[Path | None, str]]) -> list[str]:
    """The host command running argv chrooted into `root` in a private mount namespace: root
    bind-mounted read-only when `read_only`, each (host dir, path) of `mounts` bind-mounted
    read-only there (host dir None: a tmpfs), /proc and the host's /dev, /tmp a tmpfs unless
    mounted; as `user` ("uid:gid") with exactly `env`. Mount points are made in the image's
    container layer first (as a runtime does), resolved inside the image (Debian's /var/run
    is a link to /run)."""
    script = ['set -e; r="$1"; shift']
    for i, (_, dst) in enumerate(mounts):
        script.append(f'd{i}="$r$(chroot "$r" /usr/bin/realpath -m "{dst}")"; mkdir -p "$d{i}"')
    script.append('mount --bind "$r" "$r"')
    if read_only:
        script.append('mount -o remount,bind,ro "$r"')
    dsts = {dst for _, dst in mounts}
    for i, (src, _) in enumerate(mounts):
        script.append(f'mount -t tmpfs -o mode=1777 tmpfs "$d{i}"' if src is None
                      else f'mount --bind -o ro "{src}" "$d{i}"')
    if "/tmp" not in dsts:
        script.append('mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"')
    script.append('mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; exec "$@"')
    chroot = ["chroot", f"--userspec={user}", root, "/usr/bin/env", "-i",
              *[f"{k}={v}" for k, v in env.items()], *argv]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(script),
            "sh", root, *chroot]


class Deployment:
    """The pods of Deployment `namespace/name` as `kubelet` runs them, behind `service`
    (a pod is an endpoint from ready until it is told to stop); `pods` in start order.
    `read()` is the Deployment the API server holds now (what the last helm install, upgrade
    or rollback applied)."""

    def __init__(self, kubelet: Kubelet, service: Service, namespace: str, name: str) -> None:
        self.kubelet, self.service, self.namespace, self.name = kubelet, service, namespace, name
        self.pods: list[Pod] = []
        self._seq = 0

    def read(self) -> dict:
        return json.loads(self.kubelet.cp.kubectl("get", "deployment", self.name, "-n",
                                                  self.namespace, "-o", "json").stdout)

    def _start(self, deployment: dict) -> Pod:
        self._seq += 1
        rev = template_hash(deployment["spec"]["template"])
        pod = self.kubelet.start(deployment, f"{self.name}-{rev}-{self._seq}")
        self.pods.append(pod)
        return pod

    def outdated(self) -> list[Pod]:
        """The running pods whose template is not the Deployment's now."""
        rev = template_hash(self.read()["spec"]["template"])
        return [p for p in self.running if p.revision != rev]

    def surge(self) -> Pod:
        """One rolling-update step's first half: a pod of the Deployment's template now,
        started and ready (raises ControlPlaneError when it is not)."""
        pod = self._start(self.read())
        self.kubelet.wait_ready(pod)
        self.service.add(pod.webhook_port)
        return pod

    def stop_pod(self, pod: Pod) -> int | None:
        """One rolling-update step's second half: `pod` stopped (SIGTERM, then SIGKILL past
        its grace period); returns its exit code."""
        self.service.remove(pod.webhook_port)
        return self.kubelet.stop(pod)

    @property
    def running(self) -> list[Pod]:
        return [p for p in self.pods if p.alive]

    def scale_up(self, replicas: int | None = None) -> list[Pod]:
        """Start pods of the current template until `replicas` (default the Deployment's
        spec.replicas) run, and wait until each is ready."""
        deployment = self.read()
        want = deployment["spec"]["replicas"] if replicas is None else replicas
        new = [self._start(deployment) for _ in range(want - len(self.running))]
        for pod in new:
            self.kubelet.wait_ready(pod)
            self.service.add(pod.webhook_port)
        return new

    def rolling_update(self, order: Callable[[list[Pod]], list[Pod]] | None = None,
                       between: Callable[[Pod, Pod], None] | None = None) -> list[Pod]:
        """Replace every running pod whose template differs from the Deployment's now, one
        at a time: a new pod started and ready, then the old one stopped (maxSurge 1,
        maxUnavailable 0). `order` picks the order the old pods go in (default: oldest
        first); `between(new, old)` runs after the new pod is ready and before the old one
        stops. Returns the new pods."""
        new = []
        for pod in (order or list)(self.outdated()):
            fresh = self.surge()
            if between is not None:
                between(fresh, pod)
            self.stop_pod(pod)
            new.append(fresh)
        return new

    def recreate(self) -> list[Pod]:
        """Stop every running pod, then start the Deployment's replicas of its template now
        (no replica serves in between); returns the new pods once ready."""
        for pod in self.running:
            self.stop_pod(pod)
        return self.scale_up()

    def stop(self) -> None:
        for pod in self.running:
            self.stop_pod(pod)
