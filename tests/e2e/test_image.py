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


def read_only_run(ctr: str, argv: list[str], *, user: str | None = USER,
                  timeout: float = 120) -> subprocess.CompletedProcess:
    """Run argv chrooted into the container's root, bind-mounted read-only in a private mount
    namespace, with a fresh tmpfs on /tmp, /proc and the host's /dev; `user` None runs it as
    root (to show that even root cannot write). Never raises on a non-zero exit."""
    root = _run("buildah", "mount", ctr).stdout.strip()
    env = ["/usr/bin/env", "-i", "PATH=/opt/gpu-binder/bin:/usr/bin:/bin", "HOME=/tmp",
           "PYTHONDONTWRITEBYTECODE=1"]
    chroot = ["chroot", *([f"--userspec={user}"] if user else []), root, *env, *argv]
    script = ('set -e; r="$1"; shift; mount --bind "$r" "$r"; mount -o remount,bind,ro "$r"; '
              'mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"; mount -t proc proc "$r/proc"; '
              'mount --rbind /dev "$r/dev"; cd "$r/tmp"; exec "$@"')
    try:
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               script, "sh", root, *chroot], capture_output=True, text=True,
                              timeout=timeout)
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
