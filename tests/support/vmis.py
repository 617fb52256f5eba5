"""VMIs for the e2e tests that go through the webhook: bodies from the KubeVirt fixtures
with gpu annotations, created (or denied) through the real API server, the namespace's
GPUDevices, and AdmissionReviews sent to the webhook directly with the API server's client
certificate."""

from __future__ import annotations

import copy
import json
import ssl

import yaml
from kubernetes_asyncio.client import ApiException

from localcluster.paths import KUBEVIRT_FIXTURES as FIXTURES

VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"


def fixture(name: str) -> dict:
    """The VMI of `tests/fixtures/kubevirt/<name>` (localcluster.paths.KUBEVIRT_FIXTURES), as
    KubeVirt's schema accepts it."""
    vmi = yaml.safe_load((FIXTURES / name).read_text())
    chassis = vmi["spec"]["domain"].get("chassis") or {}
    if isinstance(chassis.get("asset"), int):  # vmi-fedora.yaml: KubeVirt's schema wants a string
        chassis["asset"] = str(chassis["asset"])
    return vmi


def annotated(vmi: dict, name: str, *, templates: str | None = None,
              devices: str | None = None) -> dict:
    """A copy of `vmi` named `name` with the gpu annotations given (templates "class=n,...",
    devices "name,..."), for the v1 endpoint."""
    vmi = copy.deepcopy(vmi)
    vmi["apiVersion"] = "kubevirt.io/v1"  # the client posts to the v1 endpoint
    vmi["metadata"]["name"] = name
    ann = vmi["metadata"].setdefault("annotations", {})
    if templates:
        ann["gpu.cozystack.io/templates"] = templates
    if devices:
        ann["gpu.cozystack.io/devices"] = devices
    return vmi


async def create(fleet, ns: str, vmi: dict) -> tuple[bool, str]:
    """Create through the API server (webhook in the path): (admitted, message)."""
    try:
        made = await fleet.custom.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns,
                                                                  VMIS, vmi)
        return True, json.dumps(made["spec"])
    except ApiException as exc:
        return False, json.loads(exc.body).get("message", "") if exc.body else str(exc)


async def create_denied(fleet, ns: str, vmi: dict) -> tuple[int, str, str]:
    """Create through the API server, expecting the webhook to deny it: (HTTP status,
    Status reason, message) as the tenant's client receives them."""
    try:
        made = await fleet.custom.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns,
                                                                  VMIS, vmi)
    except ApiException as exc:
        body = json.loads(exc.body) if exc.body else {}
        return exc.status, body.get("reason", ""), body.get("message", "")
    raise AssertionError(f"admitted: {made['metadata']['name']}")


async def devices(fleet, ns: str) -> list[dict]:
    """Every GPUDevice of `ns`, as the API server returns them."""
    got = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", ns,
                                                           "gpudevices")
    return got["items"]


def review(uid: str, vmi: dict, namespace: str, **over) -> dict:
    """An AdmissionReview of the CREATE of `vmi` in `namespace`, as the API server sends
    it; `over` replaces fields of its request."""
    req = {"uid": uid, "kind": {"group": "kubevirt.io", "version": "v1",
                                "kind": "VirtualMachineInstance"},
           "resource": {"group": "kubevirt.io", "version": "v1",
                        "resource": "virtualmachineinstances"},
           "namespace": namespace, "name": vmi["metadata"]["name"], "operation": "CREATE",
           "object": vmi, "dryRun": False, "userInfo": {"username": "test"}}
    req.update(over)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def client_ssl(system) -> ssl.SSLContext:
    """A TLS client context that verifies the webhook and presents the API server's own
    webhook client certificate (these tests stand in for the API server)."""
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=system.cp.ca.cert_pem.decode())
    ctx.load_cert_chain(*map(str, system.cp.webhook_client_files))
    return ctx
