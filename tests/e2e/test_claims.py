"""The claims of device mode against the real kube-apiserver (docs/contract.md §3b DR5, §5 H1/H2):
the claim `model.claim.build_claim` makes passes resource.k8s.io/v1 and reads back with the
same spec; the shipped policy `gpu-binder-raw-claims` refuses a tenant's ResourceClaim and
ResourceClaimTemplate on a managed DeviceClass under `rawResourceNames: denied` (exactly or as
a firstAvailable alternative) and admits them under `allowed`, never refusing the controller's
own; the tenant role may read but not create, patch or delete claims (an attacker against the
binder's claim); housekeeping deletes a claim the binder made whose VMI never appeared, after
the grace, and keeps one whose VMI exists and a tenant's own.

The policy tests set the settings ConfigMap by hand (no controller overwrites it here, as in
test_manifests.py) and restore the shipped one after each test."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from localcluster.dra_profiles import DEVICE_CLASS
from model.claim import ClaimMember, build_claim, parse_claim, same_spec
from model.device.dra import DeviceRef
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, MANIFESTS, unique
from tests.e2e.helpers import until_sync, eventually, housekeeping_rounds
from tests.support.dra_worlds import device_class

pytestmark = pytest.mark.anyio
RESOURCE = "resource.k8s.io"
INSTALL = ("apply", "--server-side", "--force-conflicts", "--field-manager=gpu-binder-install")
CONTROLLER = "system:serviceaccount:cozy-system:gpu-binder"
OTHER_CLASS = "other.example.com"
GRACE = 8.0  # --attachment-grace of FAST_CONTROLLER_ARGS
assert "--attachment-grace=8" in FAST_CONTROLLER_ARGS


def binders_claim(ns: str, vmi: str, *, when: datetime | None = None) -> dict:
    """The claim the webhook makes for a one-GPU set of `vmi` (model.claim.build_claim)."""
    members = [ClaimMember("gpu-a", device_class(), DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-3"),
                           "0f0e5fd2-2d6c-5c1e-9d8a-1f3b1c9d0a11")]
    return build_claim(ns, vmi, members, "adm-1", when or datetime.now(timezone.utc))


def tenant_claim(name: str, device_class_name: str, *, template: bool = False,
                 first_available: bool = False) -> dict:
    """A tenant's own claim (or claim template) of one device of `device_class_name`."""
    if first_available:
        request = {"name": "gpu", "firstAvailable": [
            {"name": "other", "deviceClassName": OTHER_CLASS},
            {"name": "managed", "deviceClassName": device_class_name}]}
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": device_class_name}}
    spec = {"devices": {"requests": [request]}}
    if template:
        return {"apiVersion": f"{RESOURCE}/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name}, "spec": {"spec": spec}}
    return {"apiVersion": f"{RESOURCE}/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": spec}


def _settings(cp, raw: str, device_classes: str | None) -> None:
    data = {"resourceNames": "nvidia.com/GH100_H100", "rawResourceNames": raw}
    if device_classes is not None:
        data["deviceClassNames"] = device_classes
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=gpu-binder-tests",
               "-f", "-", input=yaml.safe_dump({
                   "apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "gpu-settings", "namespace": "cozy-system"},
                   "data": data}))


@pytest.fixture
def claimer(control_plane, tmp_path):
    """A tenant namespace with the shipped policies, and a kubeconfig of a tenant user whose
    Role lets it create claims and claim templates there (as a platform's tenant-admin role
    may: the policy is the guard, not RBAC). Restores the shipped settings ConfigMap after."""
    cp = control_plane
    cp.kubectl(*INSTALL, "-f", str(MANIFESTS / "controller" / "namespace.yaml"),
               "-f", str(MANIFESTS / "controller" / "rbac.yaml"), "-f", str(MANIFESTS / "policies"))
    ns = unique("claims")
    user = f"user-{ns}"
    cp.kubectl("create", "namespace", ns)
    cp.kubectl("create", "role", "claims", "-n", ns, "--verb=create,get,delete",
               "--resource=resourceclaims.resource.k8s.io,resourceclaimtemplates.resource.k8s.io")
    cp.kubectl("create", "rolebinding", "claims", "-n", ns, "--role=claims", f"--user={user}")
    kubeconfig = cp.write_user_kubeconfig(tmp_path / f"{ns}.kubeconfig", user, namespace=ns)
    yield ns, kubeconfig
    cp.kubectl("delete", "configmap", "gpu-settings", "-n", "cozy-system", "--ignore-not-found")
    cp.kubectl(*INSTALL, "-f", str(MANIFESTS / "policies"))


def _create(cp, ns: str, obj: dict, kubeconfig=None):
    return cp.kubectl("create", "-n", ns, "-f", "-", "--dry-run=server", check=False,
                      kubeconfig=kubeconfig, input=yaml.safe_dump(obj))


def test_DR5_denied_refuses_a_tenants_claim_and_template_on_a_managed_device_class(control_plane, claimer):
    cp = control_plane
    ns, kc = claimer
    _settings(cp, "denied", f"{OTHER_CLASS}-x,{DEVICE_CLASS}")

    def refused():
        out = _create(cp, ns, tenant_claim(unique("c"), DEVICE_CLASS), kc)
        return out.returncode != 0 and out.stderr
    err = until_sync(refused)
    assert err and "gpu-binder-raw-claims" in err and "managed by gpu-binder" in err, err
    for obj in (tenant_claim("t", DEVICE_CLASS, template=True),
                tenant_claim("fa", DEVICE_CLASS, first_available=True),
                tenant_claim("fat", DEVICE_CLASS, template=True, first_available=True)):
        out = _create(cp, ns, obj, kc)
        assert out.returncode != 0 and "gpu-binder-raw-claims" in out.stderr, (obj, out.stderr)
    # another DeviceClass is not the policy's business; nor is a system namespace
    for obj in (tenant_claim("other", OTHER_CLASS), tenant_claim("other-t", OTHER_CLASS, template=True)):
        out = _create(cp, ns, obj, kc)
        assert out.returncode == 0, out.stderr
    assert _create(cp, "kube-system", tenant_claim("sys", DEVICE_CLASS)).returncode == 0
    # the controller's own claim (the binder's, made by its ServiceAccount) is excepted
    sa = cp.write_service_account_kubeconfig(cp.dir / "claims-sa.kubeconfig", "cozy-system", "gpu-binder")
    out = cp.kubectl("create", "-n", ns, "-f", "-", kubeconfig=sa, check=False,
                     input=yaml.safe_dump(binders_claim(ns, "vm")))
    assert out.returncode == 0, out.stderr


def test_DR5_denied_without_published_device_classes_refuses_every_claim(control_plane, claimer):
    cp = control_plane
    ns, kc = claimer
    _settings(cp, "denied", None)    # a controller that has not written deviceClassNames yet

    def refused():
        out = _create(cp, ns, tenant_claim(unique("c"), OTHER_CLASS), kc)
        return out.returncode != 0 and out.stderr
    err = until_sync(refused)
    assert err and "no deviceClassNames yet" in err, err


def test_DR5_allowed_admits_a_tenants_claim_and_template_on_the_managed_device_class(control_plane, claimer):
    cp = control_plane
    ns, kc = claimer
    _settings(cp, "allowed", DEVICE_CLASS)

    def admitted():
        return _create(cp, ns, tenant_claim(unique("c"), DEVICE_CLASS), kc).returncode == 0
    assert until_sync(admitted)
    out = cp.kubectl("create", "-n", ns, "-f", "-", kubeconfig=kc, check=False,
                     input=yaml.safe_dump(tenant_claim("t", DEVICE_CLASS, template=True)))
    assert out.returncode == 0, out.stderr


async def test_DR5_the_built_claim_passes_the_schema_and_reads_back_the_same(control_plane, fleet):
    ns = unique("claims")
    await fleet.core.create_namespace({"metadata": {"name": ns}})
    built = binders_claim(ns, "vm")
    made = await fleet.custom.create_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", built)
    assert same_spec(parse_claim(made), built["spec"]), made["spec"]
    assert made["metadata"]["labels"] == built["metadata"]["labels"]


async def test_the_tenant_role_reads_the_binders_claim_but_cannot_create_patch_or_delete_it(
        control_plane, make_tenant, tenant_client, fleet):
    from kubernetes_asyncio.client import CustomObjectsApi
    t = make_tenant()
    claim = binders_claim(t.namespace, "vm")
    await fleet.custom.create_namespaced_custom_object(RESOURCE, "v1", t.namespace, "resourceclaims", claim)
    api = CustomObjectsApi(await tenant_client(t.kubeconfig))
    got = await api.get_namespaced_custom_object(RESOURCE, "v1", t.namespace, "resourceclaims", "vm-gpus")
    assert got["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-binder"
    attacks = [
        ("delete", api.delete_namespaced_custom_object(RESOURCE, "v1", t.namespace, "resourceclaims", "vm-gpus")),
        ("strip our label", api.patch_namespaced_custom_object(
            RESOURCE, "v1", t.namespace, "resourceclaims", "vm-gpus",
            {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}},
            _content_type="application/merge-patch+json")),
        ("create another", api.create_namespaced_custom_object(
            RESOURCE, "v1", t.namespace, "resourceclaims", tenant_claim("mine", OTHER_CLASS))),
        ("forge the allocation", api.patch_namespaced_custom_object_status(
            RESOURCE, "v1", t.namespace, "resourceclaims", "vm-gpus", {"status": {"allocation": {}}},
            _content_type="application/merge-patch+json")),
    ]
    for what, call in attacks:
        with pytest.raises(ApiException) as raised:
            await call
        assert raised.value.status == 403, what
    after = await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", t.namespace, "resourceclaims", "vm-gpus")
    assert after["metadata"]["resourceVersion"] == got["metadata"]["resourceVersion"]


def test_the_controller_may_write_claims(control_plane):
    control_plane.kubectl(*INSTALL, "-f", str(MANIFESTS / "controller" / "namespace.yaml"),
                          "-f", str(MANIFESTS / "controller" / "rbac.yaml"))
    for verb in ("get", "list", "create", "patch", "delete"):
        out = control_plane.kubectl("auth", "can-i", verb, "resourceclaims.resource.k8s.io",
                                    f"--as={CONTROLLER}", "-n", "some-tenant", check=False)
        assert out.stdout.strip() == "yes", (verb, out.stdout, out.stderr)
    out = control_plane.kubectl("auth", "can-i", "update", "resourceclaims.resource.k8s.io/status",
                                f"--as={CONTROLLER}", "-n", "some-tenant", check=False)
    assert out.stdout.strip() == "no"          # the binder never writes status.allocation


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    from tests.e2e.conftest import controller_replicas
    yield from controller_replicas(control_plane, tmp_path_factory)


async def claim_exists(fleet, ns: str, name: str) -> bool:
    try:
        await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", name)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


async def test_H1_an_orphan_claim_is_deleted_after_the_grace_and_others_are_kept(system, fleet):
    ns = unique("claims")
    await fleet.core.create_namespace({"metadata": {"name": ns}})
    # a live VMI of the name keeps its claim (a bare VMI: not the webhook's business)
    await fleet.custom.create_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "alive"}, "spec": {"domain": {"devices": {}}}})
    for vmi in ("never", "alive"):
        await fleet.custom.create_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims",
                                                           binders_claim(ns, vmi))
    tenants = binders_claim(ns, "mine")
    del tenants["metadata"]["labels"]["app.kubernetes.io/managed-by"]   # a tenant's: never ours
    await fleet.custom.create_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", tenants)
    t0 = time.monotonic()
    await housekeeping_rounds(system, 2)
    assert await claim_exists(fleet, ns, "never-gpus")            # within the grace: kept

    async def gone():
        return not await claim_exists(fleet, ns, "never-gpus")
    await eventually(gone, timeout=GRACE + 15, what="the orphan claim deleted (H1)")
    assert time.monotonic() - t0 >= GRACE - 1.5
    await housekeeping_rounds(system, 2)
    assert await claim_exists(fleet, ns, "alive-gpus") and await claim_exists(fleet, ns, "mine-gpus")
