"""Fixtures for tests that run against a real kube-apiserver and etcd (marker `e2e`).

One control plane per test session (started on loopback, stopped at the end); each test
gets namespaces of its own. Clients are created inside the running event loop.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from localcluster.controlplane import ControlPlane
from localcluster.paths import KUBEVIRT_FIXTURES, MANIFESTS, TESTING_MANIFESTS

REPO = Path(__file__).resolve().parents[2]
FIXTURES = KUBEVIRT_FIXTURES
CRD_NAMES = (
    "gpuclasses.gpu.cozystack.io",
    "gpudevices.gpu.cozystack.io",
)
TENANT_GROUP = "gpu-binder:tenants"


_KUBEVIRT_FIXTURE_NAMES = ("kubevirt", "kubevirt_shared")


def _uses_kubevirt(item) -> bool:
    return any(f in _KUBEVIRT_FIXTURE_NAMES for f in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(items):
    """Mark tests/e2e items `e2e`; then move the tests that use the session's KubeVirt
    (`kubevirt_shared`, directly or through a module's `kubevirt`) after all others, in
    their collected order: KubeVirt starts once, when the first of them runs, and every
    test before it runs without virt-api's webhooks, kube-scheduler or KWOK, as before."""
    for item in items:
        if "/tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
    items[:] = sorted(items, key=_uses_kubevirt)  # stable: the collected order within each part


@pytest.fixture(scope="session")
def anyio_backend():
    return "asyncio"


def install_base(cp: ControlPlane) -> None:
    """Apply our CRDs, the tenant role, the VMI-editor role and KubeVirt's own CRDs (the
    real VMI schema, printed by KubeVirt's code); wait until Established."""
    from localcluster.kubevirt import install_crds

    cp.kubectl("apply", "--server-side", "--field-manager=gpu-binder-tests",
               "-f", str(MANIFESTS / "crds"), "-f", str(MANIFESTS / "rbac"),
               "-f", str(TESTING_MANIFESTS))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               *[f"crd/{n}" for n in CRD_NAMES])
    install_crds(cp)


@pytest.fixture(scope="session")
def control_plane():
    """A running ControlPlane with the base manifests installed, for the whole session."""
    cp = ControlPlane()
    cp.start()
    try:
        install_base(cp)
        yield cp
    finally:
        cp.stop()


class Tenant:
    """A tenant namespace plus a user bound to the tenant ClusterRole there."""

    def __init__(self, cp: ControlPlane, tmp: Path, name: str) -> None:
        self.namespace = name
        self.user = f"user-{name}"
        cp.kubectl("create", "namespace", name)
        cp.kubectl("create", "rolebinding", "gpu-tenant", "-n", name,
                   "--clusterrole=gpu-binder:tenant", f"--user={self.user}")
        self.kubeconfig = cp.write_user_kubeconfig(tmp / f"{name}.kubeconfig", self.user,
                                                   (TENANT_GROUP,), namespace=name)


@pytest.fixture
def make_tenant(control_plane, tmp_path):
    """Factory: `make_tenant()` creates a fresh tenant namespace and user for this test."""
    def make() -> Tenant:
        return Tenant(control_plane, tmp_path, f"t-{uuid.uuid4().hex[:8]}")
    return make


@pytest.fixture
async def admin_client(control_plane):
    """An admin kubernetes_asyncio ApiClient (closed after the test)."""
    from kubernetes_asyncio.config import new_client_from_config

    client = await new_client_from_config(config_file=str(control_plane.admin_kubeconfig))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def tenant_client():
    """Factory: `await tenant_client(kubeconfig_path)` gives an ApiClient, closed after the test."""
    from kubernetes_asyncio.config import new_client_from_config

    made = []

    async def make(path: Path):
        c = await new_client_from_config(config_file=str(path))
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            await c.close()


# -- the whole system: control plane + controllers + webhook -----------------------------

FAST_CONTROLLER_ARGS = (
    "--lease-duration=4", "--renew-deadline=3", "--retry-period=0.5",
    "--attachment-grace=8", "--bind-timeout=6", "--housekeeping-period=1",
)


def controller_replicas(control_plane, tmp_path_factory, args: tuple[str, ...] = FAST_CONTROLLER_ARGS):
    """Two controller replicas run with `args` on the session's control plane, webhook
    registered; a generator for a module fixture (stopped, and the webhook configuration
    deleted, at its end). The Lease is deleted first so a previous module's replicas do not
    hold it."""
    from localcluster.cluster import LocalCluster

    control_plane.kubectl("delete", "lease", "gpu-binder", "-n", "cozy-system",
                          "--ignore-not-found")
    lc = LocalCluster(controllers=2, controller_args=args, control_plane=control_plane,
                      log_dir=tmp_path_factory.mktemp("controller-logs"))
    lc.start()
    try:
        yield lc
    finally:
        lc.stop()
        control_plane.kubectl("delete", "mutatingwebhookconfiguration", "gpu-binder",
                              "--ignore-not-found")


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two controller replicas (short Lease and grace for tests) for the module."""
    yield from controller_replicas(control_plane, tmp_path_factory)


@pytest.fixture(scope="session")
def kubevirt_shared(control_plane, tmp_path_factory):
    """virt-api, virt-controller, kube-scheduler and KWOK (`localcluster.kubevirt.KubeVirt`)
    on the session's control plane, started once for every test that uses KubeVirt (those
    run last, see `pytest_collection_modifyitems`) and stopped, with its CR deleted, at the
    session's end. Tests add the resources they need to its permitted host devices
    (`set_permitted`); each uses its own nodes, class and tenant, so what one test leaves
    (VMIs, launcher Pods on its KWOK nodes) is not in another's way. `GPUsWithDRA` is on (as
    it is by default from KubeVirt v1.9): count-mode tests run with it, device-mode tests
    need it."""
    from localcluster.kubevirt import GPUS_WITH_DRA, KUBEVIRT_CR, NAMESPACE, KubeVirt

    kv = KubeVirt(control_plane, log_dir=tmp_path_factory.mktemp("kubevirt-logs"),
                  feature_gates=(GPUS_WITH_DRA,))
    kv.start()
    try:
        yield kv
    finally:
        kv.stop()
        control_plane.kubectl("delete", "kubevirt", KUBEVIRT_CR, "-n", NAMESPACE,
                              "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
async def fleet(admin_client):
    """`localcluster.fleet.Fleet` on the admin client."""
    from localcluster.fleet import Fleet

    return Fleet(admin_client)


def unique(prefix: str) -> str:
    """A name unique to this test run (cluster-scoped objects are shared by tests)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(autouse=True)
def _replicas_restored(request):
    """After a test that used `system`, every replica runs again (a test that killed one
    and then failed must not take the next tests down with it)."""
    yield
    if "system" in request.fixturenames:
        lc = request.getfixturevalue("system")
        for i, replica in enumerate(lc.replicas):
            if not replica.alive:
                lc.start_replica(i)
        for i in range(len(lc.replicas)):
            lc.wait_ready(i)
