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

from localcluster.image import Container, build_image, image_config

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
    return build_image()


@pytest.fixture
def container(image: str) -> Iterator[Container]:
    """A working container of the image (buildah's), removed afterwards."""
    ctr = Container(image)
    try:
        yield ctr
    finally:
        ctr.remove()


def in_image(ctr: Container, *argv: str, user: str = USER) -> subprocess.CompletedProcess:
    """Run argv inside the container as `user`, on the host's network; never raises on a
    non-zero exit (the caller asserts the return code)."""
    return ctr.run(*argv, user=user)


def test_version_inside_the_image_is_the_package_version_and_the_label(image, container):
    out = in_image(container, "gpu-binder", "--version")
    assert (out.returncode, out.stdout) == (0, f"gpu-binder {VERSION}\n"), out.stderr
    labels = image_config(image)["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"] == "https://github.com/cozystack/gpu-binder"
    head = _run("git", "-C", str(REPO), "rev-parse", "HEAD", check=False).stdout.strip()
    if head:  # a source checkout: the commit it was built from (+ "-dirty" with local edits)
        assert labels["org.opencontainers.image.revision"] in (head, f"{head}-dirty")


def test_runs_as_65532_the_controller_by_default(image, container):
    config = image_config(image)
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


def read_only_run(ctr: Container, argv: list[str], *, user: str | None = USER,
                  timeout: float = 120) -> subprocess.CompletedProcess:
    """Run argv to its end as `localcluster.image.read_only_argv` describes; never raises on
    a non-zero exit."""
    return subprocess.run(ctr.read_only_argv(argv, user=user), capture_output=True, text=True,
                          timeout=timeout)


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

# the chart's ConfigMap keys (values.yaml's settings), here with the short leases and timeouts
# of the other e2e replicas
E2E_SETTINGS = {"lease_duration": 4, "renew_deadline": 3, "retry_period": 0.5,
                "bind_timeout": 6}


@pytest.fixture
def image_replica(control_plane, image, tmp_path):
    """One `gpu-binder controller` inside the image as uid 65532 on a read-only root, with
    the chart's arguments and in-cluster configuration only (LocalCluster.add_replica(image=),
    localcluster.image): the shipped manifests installed and the webhook registered to it (a
    LocalCluster with no replicas of its own). Yields the LocalCluster; its replica 0 is the
    image's. Stopped, and the webhook configuration deleted, at the end."""
    from localcluster.cluster import LocalCluster

    cp = control_plane
    cp.kubectl("delete", "lease", "gpu-binder", "-n", "cozy-system", "--ignore-not-found")
    lc = LocalCluster(controllers=0, control_plane=cp, log_dir=tmp_path / "logs")
    try:
        lc.start()
        lc.add_replica(image=image, settings=E2E_SETTINGS)
        yield lc
    finally:
        lc.stop()
        cp.kubectl("delete", "mutatingwebhookconfiguration", "gpu-binder", "--ignore-not-found")


@pytest.mark.anyio
async def test_replica_in_the_image_with_in_cluster_config_admits_and_binds(image_replica,
                                                                           fleet):
    import anyio

    from tests.e2e.helpers import eventually, make_pool
    from tests.support.vmis import annotated, create, devices, fixture

    lc = image_replica
    await anyio.to_thread.run_sync(lambda: lc.wait_ready(0, timeout=90))

    async def leading() -> bool:
        return lc.leader() == "image-0"
    await eventually(leading, timeout=30, what="the image replica holding the Lease")

    _, cls, nodes, tenant, _ = await make_pool(fleet, {"small": 1, "big": 2}, seen_by=lc)
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
    log = lc.replicas[0].log_path.read_text()
    assert "Traceback" not in log and "Read-only file system" not in log, log[-3000:]


# -- the image replica beside a source-tree replica; killed mid-admission ------------------

@pytest.fixture
def beside(control_plane, image, tmp_path):
    """A source-tree replica `replica-0` run as uid 65532 (it leads: started first) and the
    image replica `image-1` beside it, sharing the webhook port as two Pods behind the
    chart's Service (SO_REUSEPORT: one uid); both with the e2e short leases and grace, and a
    connection closed after 2 reviews (--webhook-keepalive-reviews), so that the kernel
    places the API server's connections anew all along the test."""
    from localcluster.cluster import LocalCluster
    from localcluster.image import IMAGE_USER
    from tests.e2e.conftest import FAST_CONTROLLER_ARGS

    cp = control_plane
    cp.kubectl("delete", "lease", "gpu-binder", "-n", "cozy-system", "--ignore-not-found")
    lc = LocalCluster(controllers=1, user=IMAGE_USER, control_plane=cp,
                      controller_args=FAST_CONTROLLER_ARGS + ("--webhook-keepalive-reviews=2",),
                      log_dir=tmp_path / "logs")
    try:
        lc.start()
        lc.wait_ready(lc.add_replica(image=image), timeout=90)
        yield lc
    finally:
        lc.stop()
        cp.kubectl("delete", "mutatingwebhookconfiguration", "gpu-binder", "--ignore-not-found")


RETRYABLE = (429, 500, 503, 504)   # what a tenant's client retries (500: the webhook call failed)


class Tenant:
    """Creates VMIs as a tenant would, retrying a retryable refusal (RETRYABLE) after 0.3 s
    until admitted; records each refusal and what is in flight."""

    def __init__(self, fleet, ns: str, cls: str) -> None:
        self.fleet, self.ns, self.cls = fleet, ns, cls
        self.in_flight: dict[str, float] = {}         # name -> when its current try began
        self.retryable: list[tuple[str, int, str]] = []
        self.fatal: list[tuple[str, int, str]] = []
        self.admitted: dict[str, str] = {}            # name -> pinned node

    async def create(self, name: str, deadline: float = 60.0) -> None:
        import time

        import anyio
        from kubernetes_asyncio.client.exceptions import ApiException

        from tests.support.vmis import VMI_GROUP, VMI_VERSION, VMIS, annotated, fixture

        body = annotated(fixture("vmi-fedora.yaml"), name, templates=f"{self.cls}=1")
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            self.in_flight[name] = time.monotonic()
            try:
                made = await self.fleet.custom.create_namespaced_custom_object(
                    VMI_GROUP, VMI_VERSION, self.ns, VMIS, body)
            except ApiException as exc:
                msg = (json.loads(exc.body).get("message", "") if exc.body else str(exc))
                if exc.status == 409 and "already exists" in msg:  # an earlier try got in
                    made = await self.fleet.custom.get_namespaced_custom_object(
                        VMI_GROUP, VMI_VERSION, self.ns, VMIS, name)
                elif exc.status in RETRYABLE:
                    self.retryable.append((name, exc.status, msg[:300]))
                    await anyio.sleep(0.3)
                    continue
                else:
                    self.fatal.append((name, exc.status, msg[:300]))
                    return
            finally:
                self.in_flight.pop(name, None)
            self.admitted[name] = made["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            return
        self.fatal.append((name, 0, "not admitted within the deadline"))


async def _admitted(lc, i: int) -> float:
    from tests.e2e.helpers import scrape

    return (await scrape(lc, i)).get(("gpu_binder_admissions_total", (("outcome", "admitted"),)),
                                     0.0)


@pytest.mark.anyio
async def test_image_replica_beside_a_source_replica_killed_mid_admission_loses_nothing(
        beside, fleet):
    import os
    import signal
    import time

    import anyio

    from tests.e2e.helpers import eventually, leader_idle, make_pool
    from tests.support.vmis import VMI_GROUP, VMI_VERSION, VMIS, devices

    lc, src, img = beside, 0, 1
    assert lc.replicas[src].user == lc.replicas[img].user == 65532
    assert lc.leader() == "replica-0"
    capacity = 130  # room for 12 batches of 6 and a stream of at most 6 x 30
    _, cls, nodes, ns, _ = await make_pool(fleet, {"a": capacity, "b": capacity},
                                           seen_by=lc)
    tenant = Tenant(fleet, ns, cls)
    asked: set[str] = set()

    # 1. admissions through both: batches of concurrent creates (the API server opens a
    # connection per concurrent call, and a new one after every 2 reviews on one; the
    # kernel spreads connections over the two listeners) until each replica has admitted
    # some, by its own counter
    for batch in range(12):
        async with anyio.create_task_group() as tg:
            for k in range(6):
                asked.add(f"b{batch}-{k}")
                tg.start_soon(tenant.create, f"b{batch}-{k}")
        if min(await _admitted(lc, src), await _admitted(lc, img)) >= 1:
            break
    by = {"source": await _admitted(lc, src), "image": await _admitted(lc, img)}
    assert by["source"] >= 1 and by["image"] >= 1, by
    assert (tenant.fatal, tenant.retryable) == ([], []), (tenant.fatal, tenant.retryable)

    # 2. a stream of creates that goes on until the frozen replica holds one (a fixed stream
    # could end before the freeze: CI saw 24 creates all answered by then); the image
    # replica is frozen (SIGSTOP: its reviews in flight and its connections held, as a
    # stalled Pod) until some create has waited on it for 2 s (the source replica answers
    # in well under that), then killed with SIGKILL: the process inside the container
    # (chrooted into the container's root)
    proc = lc.replicas[img].proc
    assert os.readlink(f"/proc/{proc.pid}/root") == lc.replicas[img].container.root
    stream: list[str] = []
    held: list[str] = []
    enough = anyio.Event()

    async def worker(w: int) -> None:
        for j in range(30):      # bounded: 6 x 30 creates at most
            if enough.is_set():
                return
            stream.append(f"s{w}-{j}")
            await tenant.create(f"s{w}-{j}")

    async def stuck() -> list[str]:
        now = time.monotonic()
        return [n for n, t in tenant.in_flight.items() if now - t > 2]

    async with anyio.create_task_group() as tg:
        for w in range(6):
            tg.start_soon(worker, w)
        await eventually(lambda: _admitted_since(lc, img, by["image"]), timeout=20,
                         what="the image replica admitting in the stream")
        try:
            # freeze it while its own counter shows an admission in progress (a fixed moment
            # can find it idle: CI twice saw no create held); if that one finished between the
            # scrape and the signal, let it go on and try again (bounded)
            for attempt in range(8):
                await eventually(lambda: _in_progress(lc, img), timeout=20, interval=0.02,
                                 what="an admission in progress on the image replica")
                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    held = await eventually(stuck, timeout=6, interval=0.05,
                                            what="a create held by the frozen image replica")
                    break
                except AssertionError:
                    os.kill(proc.pid, signal.SIGCONT)
            assert held, "no create held by the frozen image replica in 8 freezes"
        finally:
            enough.set()
            lc.kill_replica(img, signal.SIGKILL)
    assert not lc.replicas[img].alive

    # the tenant saw at most retryable refusals, and every VMI it asked for is admitted
    assert tenant.fatal == [], tenant.fatal
    everything = asked | set(stream)
    assert set(tenant.admitted) == everything and set(held) <= everything
    print(f"admitted by source {by['source']:.0f}, image {by['image']:.0f} before the kill; "
          f"held at the kill: {held}; retryable refusals: {tenant.retryable}")

    # nothing stays attached to a VMI that does not exist (H1/H2 clear what the killed
    # admissions left, after the 8 s grace), and each VMI's device is Bound on its node
    async def settled():
        vmis = {v["metadata"]["name"] for v in (await fleet.custom.list_namespaced_custom_object(
            VMI_GROUP, VMI_VERSION, ns, VMIS))["items"]}
        devs = await devices(fleet, ns)
        attached = [(d["status"]["attachedTo"]["vmi"], d["status"].get("phase"),
                     d["status"].get("nodeName")) for d in devs
                    if (d.get("status") or {}).get("attachedTo")]
        orphans = [a for a in attached if a[0] not in vmis]
        return (vmis, devs, attached) if not orphans else None
    vmis, devs, attached = await eventually(settled, timeout=45, interval=0.5,
                                            what="no device attached to a missing VMI")
    await leader_idle(lc)
    assert vmis == everything
    assert sorted(attached) == sorted((v, "Bound", tenant.admitted[v]) for v in everything)
    per_node: dict[str, int] = {}
    for d in devs:
        if (d.get("status") or {}).get("phase") == "Bound":
            per_node[d["status"]["nodeName"]] = per_node.get(d["status"]["nodeName"], 0) + 1
    assert all(n <= capacity for n in per_node.values()) and \
        set(per_node) <= set(nodes.values()), per_node


async def _in_progress(lc, i: int) -> bool:
    """Replica `i` holds an admission in progress now (its fair-share gate's gauge)."""
    from tests.e2e.helpers import scrape

    return (await scrape(lc, i)).get(("gpu_binder_admissions_in_progress", ()), 0.0) >= 1


async def _admitted_since(lc, i: int, before: float) -> bool:
    return await _admitted(lc, i) > before
