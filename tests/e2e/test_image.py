"""The controller image (`make image`, tools/build-image.sh; issue 20 items 1 and 2): built here
with buildah and no registry, it runs `gpu-binder` as uid 65532, prints the package's version,
carries it in its OCI labels, holds the production packages only (no local-cluster harness,
fakes, bench or tests, no installer) and needs no writable root filesystem.

Processes run inside the image with `buildah run --isolation chroot` (this sandbox cannot use
`podman run`), and, for the read-only check, chrooted into the image's root bind-mounted
read-only in a private mount namespace with a tmpfs on /tmp — what a kubelet does for
`readOnlyRootFilesystem: true`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
PRODUCTION = {"model", "actors", "supervisor", "k8s", "cli"}
NOT_SHIPPED = {"localcluster", "fakes", "bench", "tests", "pip", "setuptools", "wheel"}
USER = "65532:65532"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(*argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image() -> str:
    """The image's tag, built by tools/build-image.sh (warm: the cached base and layers)."""
    proc = subprocess.run(["bash", str(REPO / "tools/build-image.sh")], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture
def container(image: str) -> Iterator[str]:
    """A working container of the image (buildah's), removed afterwards."""
    ctr = _run("buildah", "from", "--pull-never", image).stdout.strip().splitlines()[-1]
    try:
        yield ctr
    finally:
        _run("buildah", "rm", ctr, check=False)


def in_image(ctr: str, *argv: str, user: str = USER) -> subprocess.CompletedProcess:
    """Run argv inside the container as `user`, on the host's network; never raises on a
    non-zero exit (the caller asserts the return code)."""
    return _run("buildah", "run", "--isolation", "chroot", "--user", user, ctr, "--", *argv,
                check=False)


def _config(image: str) -> dict:
    return json.loads(_run("buildah", "inspect", "--type", "image", image).stdout)["OCIv1"]["config"]


def test_version_inside_the_image_is_the_package_version_and_the_label(image, container):
    out = in_image(container, "gpu-binder", "--version")
    assert (out.returncode, out.stdout) == (0, f"gpu-binder {VERSION}\n"), out.stderr
    labels = _config(image)["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"] == "https://github.com/cozystack/gpu-binder"
    head = _run("git", "-C", str(REPO), "rev-parse", "HEAD", check=False).stdout.strip()
    if head:  # a source checkout: the commit it was built from (+ "-dirty" with local edits)
        assert labels["org.opencontainers.image.revision"] in (head, f"{head}-dirty")


def test_runs_as_65532_the_controller_by_default(image, container):
    config = _config(image)
    assert config["User"] == USER
    assert (config["Entrypoint"], config["Cmd"]) == (["gpu-binder"], ["controller"])
    ident = in_image(container, "id", "-u", user=config["User"])
    assert ident.stdout.strip() == "65532"
    out = in_image(container, "gpu-binder", "controller", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: gpu-binder controller")
    for flag in ("--kubeconfig", "--leader-election", "--webhook-cert", "--bind-timeout"):
        assert flag in out.stdout


# Inside the image: every top-level module on sys.path, which of NOT_SHIPPED import (a
# namespace package included), the installed distributions, and the top-level folders of the
# files the gpu-binder distribution installed (its wheel's RECORD).
_LIST = """
import importlib.metadata as md, importlib.util, json, pkgutil, sys
files = md.files("gpu-binder")
print(json.dumps({
    "modules": sorted({m.name for m in pkgutil.iter_modules()}),
    "importable": sorted(n for n in sys.argv[1:] if importlib.util.find_spec(n) is not None),
    "distributions": sorted({d.metadata["Name"].lower() for d in md.distributions()}),
    "record_tops": sorted({f.parts[0] for f in files if not f.parts[0].endswith(".dist-info")
                           and f.parts[0] != ".."}),
}))
"""


def test_image_holds_production_packages_only(container):
    out = in_image(container, "python3", "-c", _LIST, *sorted(NOT_SHIPPED | PRODUCTION))
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert set(found["record_tops"]) == PRODUCTION
    assert PRODUCTION <= set(found["modules"])
    assert set(found["importable"]) == PRODUCTION, found["importable"]
    assert "gpu-binder" in found["distributions"]
    assert not {"pip", "setuptools", "wheel"} & set(found["distributions"])


def _read_only_argv(root: str, argv: list[str], *, user: str | None = USER,
                    env: dict[str, str] | None = None,
                    mounts: dict[str, str] | None = None) -> list[str]:
    """The host command running argv chrooted into `root` (a mounted container), bind-mounted
    read-only in a private mount namespace, with a fresh tmpfs on /tmp, /proc and the host's
    /dev, `mounts` (host path -> path inside) bind-mounted read-only as a kubelet mounts
    volumes (their mount points made in the container's layer first, as a runtime does), the
    environment exactly `env` plus PATH and HOME, as `user` (None: root)."""
    mounts = mounts or {}
    # a mount point is resolved inside the image (Debian's /var/run is a link to /run: followed
    # from the host it would lead out of the image)
    script = ['set -e; r="$1"; shift',
              *[f'd{i}="$r$(chroot "$r" /usr/bin/realpath -m "{dst}")"; mkdir -p "$d{i}"'
                for i, dst in enumerate(mounts.values())],
              'mount --bind "$r" "$r"; mount -o remount,bind,ro "$r"',
              *[f'mount --bind -o ro "{src}" "$d{i}"' for i, src in enumerate(mounts)],
              'mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"; mount -t proc proc "$r/proc"; '
              'mount --rbind /dev "$r/dev"; cd "$r/tmp"; exec "$@"']
    environ = {"PATH": "/opt/gpu-binder/bin:/usr/bin:/bin", "HOME": "/tmp",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    chroot = ["chroot", *([f"--userspec={user}"] if user else []), root,
              "/usr/bin/env", "-i", *[f"{k}={v}" for k, v in environ.items()], *argv]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(script),
            "sh", root, *chroot]


def read_only_run(ctr: str, argv: list[str], *, user: str | None = USER,
                  timeout: float = 120) -> subprocess.CompletedProcess:
    """Run argv to its end as `_read_only_argv` describes; never raises on a non-zero exit."""
    root = _run("buildah", "mount", ctr).stdout.strip()
    try:
        return subprocess.run(_read_only_argv(root, argv, user=user), capture_output=True,
                              text=True, timeout=timeout)
    finally:
        _run("buildah", "umount", ctr, check=False)


def test_works_on_a_read_only_root_filesystem(container):
    # the mount is read-only indeed: root inside cannot write outside /tmp, anyone can in /tmp
    probe = read_only_run(container, ["sh", "-c", "touch /opt/gpu-binder/x; touch /tmp/x && "
                                      "echo tmp-writable"], user=None)
    assert "Read-only file system" in probe.stderr and probe.stdout == "tmp-writable\n", probe
    for argv in (["gpu-binder", "--version"], ["gpu-binder", "controller", "--help"],
                 ["kubectl-gpu", "top", "--help"],
                 # every production module imports (the controller's whole import graph)
                 ["python3", "-c", "import k8s.controller, k8s.webhook.admission, cli.tools"]):
        out = read_only_run(container, argv)
        assert out.returncode == 0, (argv, out.stderr[-2000:])
    assert read_only_run(container, ["gpu-binder", "--version"]).stdout == f"gpu-binder {VERSION}\n"


# -- one controller replica from the image, with in-cluster configuration ------------------

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"   # where a kubelet mounts it


def _readable_copy(src: Path, dst: Path) -> str:
    """Copy `src` to `dst` with mode 0644 (uid 65532 reads it, as a Secret volume's 0644)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    dst.chmod(0o644)
    return str(dst)


class ImageReplica:
    """The image replica's process, seen as tests.e2e.helpers sees a LocalCluster's replicas
    (`replicas[i].alive`, `metrics(i)`), so `make_pool(seen_by=...)` waits on its informers."""

    def __init__(self, cluster, proc: subprocess.Popen, metrics_port: int, log_path: Path):
        self.cluster, self.proc, self.metrics_port, self.log_path = (cluster, proc,
                                                                     metrics_port, log_path)
        self.replicas = [self]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def metrics(self, i: int) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as resp:
            return resp.read().decode()


@pytest.fixture
def image_replica(control_plane, container, tmp_path):
    """One `gpu-binder controller` inside the image as uid 65532 on a read-only root, with
    the chart's arguments and nothing else to reach the API server than what a kubelet gives
    a Pod: the ServiceAccount cozy-system/gpu-binder's token, the cluster CA and the namespace
    under SA_DIR, and KUBERNETES_SERVICE_HOST/PORT (no kubeconfig: kubernetes_asyncio's
    in-cluster loader, k8s.controller.make_api_client(None)). The shipped manifests are
    installed and the webhook registered to it (LocalCluster with no replicas of its own).
    Yields an ImageReplica; the replica is stopped at the end."""
    import base64
    import urllib.parse

    import yaml

    from localcluster.cluster import SA_NAME, SA_NAMESPACE, LocalCluster
    from localcluster.controlplane import free_port

    cp = control_plane
    cp.kubectl("delete", "lease", "gpu-binder", "-n", "cozy-system", "--ignore-not-found")
    lc = LocalCluster(controllers=0, control_plane=cp, log_dir=tmp_path / "logs")
    lc.start()
    admin = yaml.safe_load(Path(cp.admin_kubeconfig).read_text())["clusters"][0]["cluster"]
    server = urllib.parse.urlsplit(admin["server"])
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(cp.kubectl("create", "token", SA_NAME, "-n", SA_NAMESPACE,
                                         "--duration=2h").stdout.strip())
    (sa / "ca.crt").write_bytes(base64.b64decode(admin["certificate-authority-data"]))
    (sa / "namespace").write_text(SA_NAMESPACE)
    for f in sa.iterdir():
        f.chmod(0o644)
    _readable_copy(lc.webhook_dir / "tls.crt", tmp_path / "tls/tls.crt")
    _readable_copy(lc.webhook_dir / "tls.key", tmp_path / "tls/tls.key")
    _readable_copy(Path(cp.webhook_client_ca_file), tmp_path / "client-ca/ca.crt")
    metrics_port = free_port()
    # the chart's ConfigMap keys (values.yaml's config), here with the loopback ports and
    # short leases of the other e2e replicas
    settings = {"webhook_host": "127.0.0.1", "webhook_port": lc.webhook_port,
                "metrics_host": "127.0.0.1", "metrics_port": metrics_port,
                "lease_duration": 4, "renew_deadline": 3, "retry_period": 0.5,
                "bind_timeout": 6}
    config_file = tmp_path / "config/config.yaml"
    config_file.parent.mkdir()
    config_file.write_text(yaml.safe_dump(settings))
    config_file.chmod(0o644)
    root = _run("buildah", "mount", container).stdout.strip()
    argv = ["gpu-binder", "controller", "--config=/etc/gpu-binder/config.yaml",
            "--webhook-cert=/tls/tls.crt", "--webhook-key=/tls/tls.key",
            "--webhook-client-ca=/client-ca/ca.crt"]
    cmd = _read_only_argv(root, argv, env={
        "POD_NAME": "image-0", "KUBERNETES_SERVICE_HOST": server.hostname,
        "KUBERNETES_SERVICE_PORT": str(server.port)}, mounts={
        str(sa): SA_DIR, str(tmp_path / "tls"): "/tls",
        str(tmp_path / "client-ca"): "/client-ca", str(tmp_path / "config"): "/etc/gpu-binder"})
    log_path = tmp_path / "image-0.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        yield ImageReplica(lc, proc, metrics_port, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        lc.stop()
        cp.kubectl("delete", "mutatingwebhookconfiguration", "gpu-binder", "--ignore-not-found")
        _run("buildah", "umount", container, check=False)


@pytest.mark.anyio
async def test_replica_in_the_image_with_in_cluster_config_admits_and_binds(image_replica,
                                                                           fleet):
    import urllib.request

    import anyio

    from tests.e2e.helpers import eventually, make_pool
    from tests.e2e.test_webhook import annotated, create, devices, fixture

    replica = image_replica
    lc, proc, metrics_port, log_path = (replica.cluster, replica.proc, replica.metrics_port,
                                        replica.log_path)

    async def ready() -> bool:
        assert proc.poll() is None, log_path.read_text()[-3000:]

        def get() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz",
                                            timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False
        return await anyio.to_thread.run_sync(get)
    await eventually(ready, timeout=90, interval=0.5, what="the image replica ready")

    async def leading() -> bool:
        return lc.leader() == "image-0"
    await eventually(leading, timeout=30, what="the image replica holding the Lease")

    _, cls, nodes, tenant, _ = await make_pool(fleet, {"small": 1, "big": 2}, seen_by=replica)
    pinned = {}
    for i in range(2):  # through its webhook (the only one registered), bound by its binder
        ok, spec = await create(fleet, tenant, annotated(fixture("vmi-fedora.yaml"), f"vm-{i}",
                                                         templates=f"{cls}=1"))
        assert ok, spec
        pinned[f"vm-{i}"] = json.loads(spec)["nodeSelector"]["kubernetes.io/hostname"]
    assert set(pinned.values()) <= set(nodes.values())
    devs = await devices(fleet, tenant)
    assert sorted((d["status"]["attachedTo"]["vmi"], d["status"]["phase"], d["status"]["nodeName"])
                  for d in devs) == [(v, "Bound", n) for v, n in sorted(pinned.items())]
    log = log_path.read_text()
    assert "Traceback" not in log and "Read-only file system" not in log, log[-3000:]
