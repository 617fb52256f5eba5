"""W7 "admitted is final" (issue 23, item 2), as a hostile tenant would try it: the tenant
edits its own admitted VMIs through the real API server (the shipped policies, webhook and
two controller replicas in the path) and must not change, remove or add a
`gpu.cozystack.io/` annotation or the pin; ordinary updates keep working; and with KubeVirt
in the loop, virt-controller's own updates and the deletion of an admitted VMI go through.
"""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes_asyncio.client import ApiException, CustomObjectsApi

from tests.e2e.helpers import eventually
from tests.support.kubevirt_vmis import bound_launcher, kubevirt, pool  # noqa: F401 - fixture
from tests.support.kubevirt_vmis import vmi as kubevirt_vmi
from tests.support.tools import make_pool, vmi

pytestmark = pytest.mark.anyio
VMIS = ("kubevirt.io", "v1")
MERGE = "application/merge-patch+json"
DEVICES, TEMPLATES, ADMISSION = ("gpu.cozystack.io/devices", "gpu.cozystack.io/templates",
                                 "gpu.cozystack.io/admission")
HOSTNAME = "kubernetes.io/hostname"


async def _api(tenant_client, pool_) -> CustomObjectsApi:
    return CustomObjectsApi(await tenant_client(pool_.kubeconfig))


async def _created(api: CustomObjectsApi, ns: str, body: dict) -> dict:
    return await api.create_namespaced_custom_object(*VMIS, ns, "virtualmachineinstances", body)


async def _patch(api: CustomObjectsApi, ns: str, name: str, body: dict) -> tuple[int, str, str]:
    """Merge-patch VMI `ns/name` as the tenant: (200, "", "") when the API server took it,
    else (HTTP status, Status reason, message) as the tenant's client receives them."""
    try:
        await api.patch_namespaced_custom_object(*VMIS, ns, "virtualmachineinstances", name,
                                                 body, _content_type=MERGE)
        return 200, "", ""
    except ApiException as exc:
        got = json.loads(exc.body) if exc.body else {}
        return exc.status, got.get("reason", ""), got.get("message", "")


def _ann(changes: dict[str, str | None]) -> dict:
    return {"metadata": {"annotations": changes}}


async def _admitted_gpu_vmi(api, p, name: str) -> dict:
    """A VMI holding one device `held-0` and one template, admitted and pinned."""
    made = await _created(api, p.tenant, vmi(name, p.tenant, devices="held-0",
                                             templates=f"{p.cls}=1"))
    ann = made["metadata"]["annotations"]
    assert {DEVICES, TEMPLATES, ADMISSION} <= set(ann) and HOSTNAME in made["spec"]["nodeSelector"]
    return made


async def test_W7_tenant_cannot_remove_add_or_edit_our_annotations_on_an_admitted_vmi(
        system, fleet, control_plane, tmp_path, tenant_client):
    """Each of our annotations removed or edited, one added, by merge patch and by a full
    update (`kubectl edit`): every change is denied 403 Forbidden naming the VMI and the
    annotation, and the VMI keeps what admission gave it."""
    p = await make_pool(system, fleet, control_plane, tmp_path, {"a": 4}, held=1)
    api = await _api(tenant_client, p)
    made = await _admitted_gpu_vmi(api, p, "victim")
    ann = made["metadata"]["annotations"]
    cases = {
        "remove devices": _ann({DEVICES: None}),
        "remove templates": _ann({TEMPLATES: None}),
        "remove admission": _ann({ADMISSION: None}),
        "remove all": _ann({DEVICES: None, TEMPLATES: None, ADMISSION: None}),
        "edit devices": _ann({DEVICES: "held-0,held-9"}),
        "edit templates": _ann({TEMPLATES: f"{p.cls}=3"}),
        "edit admission": _ann({ADMISSION: "0" * 32}),
        "add another": _ann({"gpu.cozystack.io/extra": "x"}),
    }
    got = {case: await _patch(api, p.tenant, "victim", body) for case, body in cases.items()}
    stripped = copy.deepcopy(made)  # a full update without our annotations
    for key in (DEVICES, TEMPLATES, ADMISSION):
        del stripped["metadata"]["annotations"][key]
    try:
        await api.replace_namespaced_custom_object(*VMIS, p.tenant, "virtualmachineinstances",
                                                   "victim", stripped)
        got["replace without them"] = (200, "", "")
    except ApiException as exc:
        body = json.loads(exc.body)
        got["replace without them"] = (exc.status, body["reason"], body["message"])
    named = {"remove devices": [DEVICES], "remove templates": [TEMPLATES],
             "remove admission": [ADMISSION], "remove all": [DEVICES, TEMPLATES, ADMISSION],
             "edit devices": [DEVICES], "edit templates": [TEMPLATES],
             "edit admission": [ADMISSION], "add another": ["gpu.cozystack.io/extra"],
             "replace without them": [DEVICES, TEMPLATES, ADMISSION]}
    for case, (status, reason, message) in got.items():
        assert (status, reason) == (403, "Forbidden"), (case, status, message)
        assert f"VMI {p.tenant}/victim" in message and "cannot be added, changed or removed" \
            in message, (case, message)
        assert all(k in message for k in named[case]), (case, message)
    now = await api.get_namespaced_custom_object(*VMIS, p.tenant, "virtualmachineinstances",
                                                 "victim")
    assert {k: v for k, v in now["metadata"]["annotations"].items()
            if k.startswith("gpu.cozystack.io/")} == ann


async def test_W7_tenant_cannot_change_or_remove_the_pin(system, fleet, control_plane, tmp_path,
                                                         tenant_client):
    """The pin (`spec.nodeSelector[kubernetes.io/hostname]`, written by the webhook) moved
    to another node, removed, or the whole nodeSelector dropped: denied 403, naming the VMI,
    the field and the node its GPUs are on."""
    p = await make_pool(system, fleet, control_plane, tmp_path, {"a": 4, "b": 4}, held=1)
    api = await _api(tenant_client, p)
    made = await _admitted_gpu_vmi(api, p, "pinned")
    node = made["spec"]["nodeSelector"][HOSTNAME]
    other = next(n for n in p.nodes.values() if n != node)
    cases = {"move": {"spec": {"nodeSelector": {HOSTNAME: other}}},
             "remove": {"spec": {"nodeSelector": {HOSTNAME: None}}},
             "drop nodeSelector": {"spec": {"nodeSelector": None}}}
    for case, body in cases.items():
        status, reason, message = await _patch(api, p.tenant, "pinned", body)
        assert (status, reason) == (403, "Forbidden"), (case, status, message)
        assert f"VMI {p.tenant}/pinned" in message and \
            'spec.nodeSelector["kubernetes.io/hostname"]' in message and node in message, \
            (case, message)
    now = await api.get_namespaced_custom_object(*VMIS, p.tenant, "virtualmachineinstances",
                                                 "pinned")
    assert now["spec"]["nodeSelector"] == {HOSTNAME: node}


async def test_W7_tenant_cannot_add_our_annotations_to_a_vmi_admitted_without_them(
        system, fleet, control_plane, tmp_path, tenant_client):
    """Issue 23's second hole: a VMI created without GPU annotations (raw GPU entries and a
    pin of the tenant's own choosing, `rawResourceNames=allowed`) gains
    `gpu.cozystack.io/templates` (or devices, or a forged admission id) afterwards: denied
    403, naming the VMI and the annotation."""
    p = await make_pool(system, fleet, control_plane, tmp_path, {"a": 2}, held=1)
    api = await _api(tenant_client, p)
    raw = vmi("raw", p.tenant, selector={HOSTNAME: p.nodes["a"]})
    raw["spec"]["domain"]["devices"]["gpus"] = [{"name": "g0", "deviceName": p.res}]
    made = await _created(api, p.tenant, raw)
    assert not (made["metadata"].get("annotations") or {})  # not ours: admitted unchanged
    for key, value in ((TEMPLATES, f"{p.cls}=1"), (DEVICES, "held-0"), (ADMISSION, "f" * 32)):
        status, reason, message = await _patch(api, p.tenant, "raw", _ann({key: value}))
        assert (status, reason) == (403, "Forbidden"), (key, status, message)
        assert f"VMI {p.tenant}/raw was admitted without GPUs" in message and key in message, \
            (key, message)


async def test_W7_ordinary_updates_stay_allowed(system, fleet, control_plane, tmp_path,
                                                tenant_client):
    """What W7 does not judge: labels, other annotations and finalizers of an admitted GPU
    VMI, and anything of a VMI without our annotations (annotations, labels, its
    nodeSelector)."""
    p = await make_pool(system, fleet, control_plane, tmp_path, {"a": 4}, held=1)
    api = await _api(tenant_client, p)
    await _admitted_gpu_vmi(api, p, "gpu")
    await _created(api, p.tenant, vmi("plain", p.tenant, selector={HOSTNAME: p.nodes["a"]}))
    allowed = [
        ("gpu", {"metadata": {"labels": {"team": "x"}}}),
        ("gpu", {"metadata": {"labels": {"team": "y"}}}),
        ("gpu", _ann({"example.com/note": "hello"})),
        ("gpu", _ann({"example.com/note": None})),
        ("gpu", {"metadata": {"finalizers": ["example.com/keep"]}}),
        ("gpu", {"metadata": {"finalizers": None}}),
        ("plain", _ann({"example.com/note": "hello"})),
        ("plain", {"metadata": {"labels": {"team": "x"}}}),
        ("plain", {"spec": {"nodeSelector": {HOSTNAME: "elsewhere"}}}),
        ("plain", {"spec": {"nodeSelector": None}}),
    ]
    got = [(name, body, await _patch(api, p.tenant, name, body)) for name, body in allowed]
    assert [g for g in got if g[2][0] != 200] == []
    gpu = await api.get_namespaced_custom_object(*VMIS, p.tenant, "virtualmachineinstances",
                                                 "gpu")
    assert gpu["metadata"]["labels"] == {"team": "y"}


@pytest.mark.kubevirt
async def test_W7_admitted_vmi_runs_through_virt_controllers_updates_and_its_deletion(
        system, kubevirt, fleet):  # noqa: F811 - the imported fixture
    """KubeVirt in the loop: virt-controller updates the admitted GPU VMI (its finalizer,
    status, phase Scheduled once the launcher Pod is bound on the pin) through the policy,
    and deleting the VMI completes (virt-controller's finalizer removal is an UPDATE too);
    H2 then releases the devices."""
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 2}})
    made = await fleet.custom.create_namespaced_custom_object(
        *VMIS, tenant, "virtualmachineinstances", kubevirt_vmi("runs", cls, 2))
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == made["spec"]["nodeSelector"][HOSTNAME] == nodes["n"]

    async def scheduled():
        got = await fleet.custom.get_namespaced_custom_object(*VMIS, tenant,
                                                              "virtualmachineinstances", "runs")
        return got if (got.get("status") or {}).get("phase") == "Scheduled" else None
    now = await eventually(scheduled, timeout=60, what="VMI runs reaches phase Scheduled")
    writers = {(m["manager"], m["operation"]) for m in now["metadata"]["managedFields"]}
    assert ("virt-controller", "Update") in writers, writers  # its updates went through
    assert "kubevirt.io/foregroundDeleteVirtualMachine" in now["metadata"]["finalizers"]
    assert {k: v for k, v in now["metadata"]["annotations"].items()
            if k.startswith("gpu.cozystack.io/")} == \
        {k: v for k, v in made["metadata"]["annotations"].items()
         if k.startswith("gpu.cozystack.io/")}
    await fleet.custom.delete_namespaced_custom_object(*VMIS, tenant, "virtualmachineinstances",
                                                       "runs")

    async def gone():
        try:
            await fleet.custom.get_namespaced_custom_object(*VMIS, tenant,
                                                            "virtualmachineinstances", "runs")
            return False
        except ApiException as exc:
            return exc.status == 404
    await eventually(gone, timeout=60, what="VMI runs deleted (finalizers removed)")

    async def released():
        got = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1",
                                                               tenant, "gpudevices")
        return got["items"] == []
    await eventually(released, timeout=40, what="H2: the deleted VMI's templates removed")
    log = kubevirt.log_tail("virt-controller", 5000)
    assert log != "(no log)"
    # Nothing of this VMI denied (other modules' VMs do meet the policy: virt-controller's
    # LiveUpdate patch of a VM's VMI pin is denied there, by design).
    ours = [line for line in log.splitlines() if f'"namespace":"{tenant}"' in line]
    assert not [line for line in ours if "gpu-binder-admitted-vmis" in line], ours
