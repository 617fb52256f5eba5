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


def _uses_system(item) -> bool:
    return "system" in getattr(item, "fixturenames", ())


def _own_system(item) -> bool:
    """True when the item's module defines a `system` fixture of its own (other replica
    arguments than conftest's), directly or imported from tests.support."""
    return getattr(item, "module", None) is not None and "system" in vars(item.module)


def _order(item) -> tuple[bool, bool, bool, str]:
    """KubeVirt's tests last (it starts once, when the first of them runs, and every test
    before it runs without virt-api's webhooks, kube-scheduler or KWOK); within each part,
    modules that run no replicas first, then those on conftest's `system`, then those with a
    `system` of their own, grouped by that fixture (tests.support.kubevirt_vmis' is shared by
    several): so modules on the same replicas run one after another and share them
    (`_SystemPool`)."""
    module_uses = item.session.config.stash.get(_SYSTEM_MODULES, frozenset())
    own = _own_system(item)
    fixture = vars(item.module)["system"] if own else None
    return (_uses_kubevirt(item), item.nodeid.split("::")[0] in module_uses, own,
            f"{fixture.__module__}.{fixture.__name__}" if own else "")


_SYSTEM_MODULES = pytest.StashKey[frozenset]()


def pytest_collection_modifyitems(config, items):
    """Mark tests/e2e items `e2e`, then order them by `_order` (stable: the collected order
    within each part, so a module's tests stay together and in file order)."""
    for item in items:
        if "/tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
    config.stash[_SYSTEM_MODULES] = frozenset(
        i.nodeid.split("::")[0] for i in items if _uses_system(i))
    items[:] = sorted(items, key=_order)


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
        _POOL.release()   # the replicas the session's modules shared, before their API server
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


class _SystemPool:
    """The session's running controller replicas, shared by consecutive modules that ask for
    the same arguments (starting two replicas costs 10-20 s on two cores; the modules are
    ordered so that those on the same replicas run together, `_order`). At most one set
    runs: asking for other arguments stops it first, and so does a test that does not ask for
    them (`_replicas_only_where_asked`); the session's control plane stops them before it
    stops. Tests use their own namespaces, classes and nodes, so a
    module leaves nothing in the next one's way; a replica a test killed is started again
    after it (`_replicas_restored`)."""

    def __init__(self) -> None:
        self.args: tuple[str, ...] | None = None
        self.lc = None
        self.control_plane = None

    def get(self, control_plane, tmp_path_factory, args: tuple[str, ...]):
        """The running replicas for `args` on `control_plane`, started (after stopping any
        others) when there are none. The Lease is deleted before a start so replicas stopped
        before do not hold it."""
        from localcluster.cluster import LocalCluster

        if (self.lc is not None and self.args == args and self.control_plane is control_plane
                and tuple(self.lc.controller_args) == args):   # (a test may restart them with others)
            if self.lc.claim_controller is not None:   # a module before started device mode's side
                self.lc.claim_controller.stop()        # (`start_dra` starts it again when asked)
            return self.lc
        self.release()
        control_plane.kubectl("delete", "lease", "gpu-binder", "-n", "cozy-system",
                              "--ignore-not-found")
        lc = LocalCluster(controllers=2, controller_args=args, control_plane=control_plane,
                          log_dir=tmp_path_factory.mktemp("controller-logs"))
        lc.start()
        self.lc, self.args, self.control_plane = lc, args, control_plane
        return lc

    def release(self) -> None:
        """Stop the running replicas, if any, and delete the webhook configuration."""
        lc, cp, self.lc, self.args, self.control_plane = self.lc, self.control_plane, None, None, None
        if lc is not None:
            lc.stop()
            cp.kubectl("delete", "mutatingwebhookconfiguration", "gpu-binder", "--ignore-not-found")


_POOL = _SystemPool()


@pytest.fixture(autouse=True)
def _replicas_only_where_asked(request):
    """Before a test that does not ask for `system` (directly or through another fixture),
    stop the pool's replicas: such a test runs with no replicas of ours (several set the
    settings ConfigMap by hand, or start replicas of their own), as when each module started
    its own only for the tests that asked."""
    if "system" not in request.fixturenames:
        _POOL.release()
    elif request.getfixturevalue("system") is not _POOL.lc:
        pytest.fail("this module's `system` was stopped by a test between its tests that did not "
                    "ask for it: give that test `system` too, or move it to the module's end")


def controller_replicas(control_plane, tmp_path_factory, args: tuple[str, ...] = FAST_CONTROLLER_ARGS):
    """Two controller replicas run with `args` on the session's control plane, webhook
    registered; a generator for a module fixture. The replicas are the session pool's
    (`_SystemPool`): the next module asking for the same `args` gets the same replicas, and
    they are stopped when other arguments are asked for, before a test that does not ask for
    them, or at the session's end. Device mode's claim controller, started by a module with
    `start_dra`, is stopped before the next module gets the replicas."""
    yield _POOL.get(control_plane, tmp_path_factory, args)


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two controller replicas (short Lease and grace for tests), shared with the other
    modules on the same arguments (`controller_replicas`)."""
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
