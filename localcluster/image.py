"""Processes inside the controller image (`make image`, tools/build-image.sh), for
the e2e tests and the harness.

This sandbox cannot use `podman run` (crun's setrlimit is refused), so a process runs in a
buildah working container of the image the way a kubelet runs a Pod's container with
`readOnlyRootFilesystem: true`: the container's root (`buildah mount`) is bind-mounted
read-only in a private mount namespace, with a fresh tmpfs on /tmp, /proc, the host's /dev
and the Pod's volumes bind-mounted read-only, then `chroot --userspec` into it as the image's
user with exactly the given environment, on the host's network. Every step `exec`s, so the
Popen's pid is the process inside the container (a SIGKILL to it is a kill -9 inside).

`LocalCluster.add_replica(image=...)` runs a controller replica this way with in-cluster
configuration (`write_service_account`).
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.parse
from pathlib import Path

import yaml

from localcluster.paths import REPO_ROOT

IMAGE_USER = 65532                    # the Dockerfile's USER (and the chart's runAsUser)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"   # where a kubelet mounts it


class ImageError(RuntimeError):
    """buildah or the image build failed; the message carries its stderr's tail."""


def _buildah(*argv: str, timeout: float = 120) -> str:
    proc = subprocess.run(["buildah", *argv], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ImageError(f"buildah {' '.join(argv)} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


def build_image(env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    """Build (warm: re-use) the controller image with tools/build-image.sh, `env` added to
    the environment (e.g. IMAGE, BASE_IMAGE); returns its tag (localhost/gpu-binder:<version>
    by default). Raises ImageError with the script's stderr tail."""
    import os

    proc = subprocess.run(["bash", str(REPO_ROOT / "tools/build-image.sh")], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise ImageError(f"build-image.sh failed ({proc.returncode}): {proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


def image_config(image: str) -> dict:
    """The image's OCI config (User, Entrypoint, Cmd, Labels, ...)."""
    return json.loads(_buildah("inspect", "--type", "image", image))["OCIv1"]["config"]


class Container:
    """A buildah working container of `image` (`buildah from --pull-never`), its root
    mounted on first use of `root`; `remove()` unmounts and removes it (idempotent)."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.name = _buildah("from", "--pull-never", image).splitlines()[-1]
        self._root: str | None = None

    @property
    def root(self) -> str:
        """The host path of the container's root filesystem (`buildah mount`)."""
        if self._root is None:
            self._root = _buildah("mount", self.name)
        return self._root

    def run(self, *argv: str, user: str = f"{IMAGE_USER}:{IMAGE_USER}",
            timeout: float = 120) -> subprocess.CompletedProcess:
        """argv run to its end with `buildah run --isolation chroot` as `user` (writable
        root); never raises on a non-zero exit."""
        return subprocess.run(["buildah", "run", "--isolation", "chroot", "--user", user,
                               self.name, "--", *argv], capture_output=True, text=True,
                              timeout=timeout)

    def read_only_argv(self, argv: list[str], **kw) -> list[str]:
        """`read_only_argv(self.root, argv, **kw)`."""
        return read_only_argv(self.root, argv, **kw)

    def remove(self) -> None:
        if self.name is None:
            return
        subprocess.run(["buildah", "umount", self.name], capture_output=True)
        subprocess.run(["buildah", "rm", self.name], capture_output=True)
        self.name, self._root = None, None


def read_only_argv(root: str, argv: list[str], *, user: str | None = f"{IMAGE_USER}:{IMAGE_USER}",
                   env: dict[str, str] | None = None,
                   mounts: dict[str, str] | None = None) -> list[str]:
    """The host command running argv chrooted into `root` (a mounted container), bind-mounted
    read-only in a private mount namespace, with a fresh tmpfs on /tmp, /proc and the host's
    /dev, `mounts` (host path -> path inside) bind-mounted read-only as a kubelet mounts
    volumes (their mount points made in the container's layer first, as a runtime does), the
    environment exactly `env` plus PATH and HOME, as `user` ("uid:gid"; None: root)."""
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


def readable_copy(src: Path, dst: Path) -> Path:
    """Copy `src` to `dst` with mode 0644 (a Secret/ConfigMap volume's default mode: uid
    65532 reads it); returns `dst`."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.parent.chmod(0o755)
    dst.write_bytes(Path(src).read_bytes())
    dst.chmod(0o644)
    return dst


def write_service_account(cp, dest: Path, namespace: str, name: str,
                          duration: str = "48h") -> dict[str, str]:
    """What a kubelet gives a Pod of ServiceAccount namespace/name to reach the API server:
    `dest` gets token (a TokenRequest token), ca.crt (the cluster CA) and namespace (mode
    0644, to be mounted at SA_DIR); returns the KUBERNETES_SERVICE_HOST/PORT environment
    (the API server's loopback address). Raises ControlPlaneError if the token request fails."""
    admin = yaml.safe_load(Path(cp.admin_kubeconfig).read_text())["clusters"][0]["cluster"]
    server = urllib.parse.urlsplit(admin["server"])
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)
    token = cp.kubectl("create", "token", name, "-n", namespace,
                       f"--duration={duration}").stdout.strip()
    (dest / "token").write_text(token)
    (dest / "ca.crt").write_bytes(base64.b64decode(admin["certificate-authority-data"]))
    (dest / "namespace").write_text(namespace)
    for f in dest.iterdir():
        f.chmod(0o644)
    return {"KUBERNETES_SERVICE_HOST": server.hostname,
            "KUBERNETES_SERVICE_PORT": str(server.port)}
