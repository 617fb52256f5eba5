"""The local control plane, the CRDs and the tenant role on a real kube-apiserver (issue 2)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiException, CustomObjectsApi

from localcluster.controlplane import ControlPlane
from tests.e2e.conftest import CRD_NAMES, FIXTURES

pytestmark = pytest.mark.anyio
G, V = "gpu.cozystack.io", "v1alpha1"
MERGE = "application/merge-patch+json"


def device(name: str, cls: str = "h100") -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "GPUDevice",
            "metadata": {"name": name}, "spec": {"class": cls}}


async def test_crds_established_and_admin_writes_status_subresource(control_plane, make_tenant,
                                                                     admin_client):
    for crd in CRD_NAMES:
        out = control_plane.kubectl("get", f"crd/{crd}", "-o",
                                    "jsonpath={.status.conditions[?(@.type=='Established')].status}")
        assert out.stdout == "True", crd
    t = make_tenant()
    api = CustomObjectsApi(admin_client)
    await api.create_namespaced_custom_object(G, V, t.namespace, "gpudevices", device("gpu-1"))
    patched = await api.patch_namespaced_custom_object_status(
        G, V, t.namespace, "gpudevices", "gpu-1",
        {"status": {"phase": "Bound", "nodeName": "node-1", "boundAt": "2026-11-30T08:00:00Z"}},
        _content_type=MERGE, field_manager="gpu-binder-binder")
    assert patched["status"] == {"phase": "Bound", "nodeName": "node-1",
                                 "boundAt": "2026-11-30T08:00:00Z"}
    # a status write through the main resource is ignored: status is a subresource
    await api.patch_namespaced_custom_object(
        G, V, t.namespace, "gpudevices", "gpu-1", {"status": {"phase": "Pending"}},
        _content_type=MERGE, field_manager="someone-else")
    got = await api.get_namespaced_custom_object(G, V, t.namespace, "gpudevices", "gpu-1")
    assert got["status"]["phase"] == "Bound"
    managers = {m["manager"] for m in got["metadata"]["managedFields"]
                if m.get("subresource") == "status"}
    assert managers == {"gpu-binder-binder"}
    # printer columns show class, phase, node
    table = control_plane.kubectl("get", "gpudevices", "-n", t.namespace).stdout.splitlines()
    assert table[0].split()[:6] == ["NAME", "CLASS", "PHASE", "NODE", "VMI", "RESULT"]
    assert table[1].split()[:4] == ["gpu-1", "h100", "Bound", "node-1"]


async def test_tenant_creates_devices_but_not_status_nor_other_namespaces(
        control_plane, make_tenant, tenant_client):
    a, b = make_tenant(), make_tenant()
    api_a = CustomObjectsApi(await tenant_client(a.kubeconfig))
    created = await api_a.create_namespaced_custom_object(G, V, a.namespace, "gpudevices",
                                                          device("mine"))
    assert created["metadata"]["name"] == "mine"
    with pytest.raises(ApiException) as err:
        await api_a.patch_namespaced_custom_object_status(
            G, V, a.namespace, "gpudevices", "mine", {"status": {"phase": "Bound"}},
            _content_type=MERGE)
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        await api_a.list_namespaced_custom_object(G, V, b.namespace, "gpudevices")
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        await api_a.create_namespaced_custom_object(G, V, b.namespace, "gpudevices",
                                                    device("theirs"))
    assert err.value.status == 403
    # the real kubectl, as the tenant, agrees
    denied = control_plane.kubectl("auth", "can-i", "patch", "gpudevices", "--subresource=status", "-n",
                                   a.namespace, kubeconfig=a.kubeconfig, check=False)
    assert denied.stdout.strip() == "no"
    allowed = control_plane.kubectl("auth", "can-i", "create", "gpudevices", "-n", a.namespace,
                                    kubeconfig=a.kubeconfig, check=False)
    assert allowed.stdout.strip() == "yes"


async def test_spec_class_is_immutable_by_cel_rule(control_plane, make_tenant, admin_client):
    t = make_tenant()
    api = CustomObjectsApi(admin_client)
    await api.create_namespaced_custom_object(G, V, t.namespace, "gpudevices", device("gpu-1"))
    with pytest.raises(ApiException) as err:
        await api.patch_namespaced_custom_object(
            G, V, t.namespace, "gpudevices", "gpu-1", {"spec": {"class": "l40s"}},
            _content_type=MERGE)
    assert err.value.status == 422
    assert "spec.class is immutable" in err.value.body
    got = await api.get_namespaced_custom_object(G, V, t.namespace, "gpudevices", "gpu-1")
    assert got["spec"]["class"] == "h100"


async def test_gpuclass_schema_rejects_bad_resource_name_and_defaults_on_cordon(
        control_plane, admin_client):
    api = CustomObjectsApi(admin_client)
    body = {"apiVersion": f"{G}/{V}", "kind": "GPUClass", "metadata": {"name": "bad-class"},
            "spec": {"resourceName": "no slash here"}}
    with pytest.raises(ApiException) as err:
        await api.create_cluster_custom_object(G, V, "gpuclasses", body)
    assert err.value.status == 422 and "spec.resourceName" in err.value.body
    body["metadata"]["name"] = "good-class"
    body["spec"]["resourceName"] = "nvidia.com/GH100_H100"
    made = await api.create_cluster_custom_object(G, V, "gpuclasses", body)
    assert made["spec"]["onCordon"] == "Move"
    await api.delete_cluster_custom_object(G, V, "gpuclasses", "good-class")


def test_kubevirt_schema_refuses_its_own_fedora_example_integer_chassis_asset(control_plane, make_tenant):
    """KubeVirt's own CRD (the real schema, `localcluster.kubevirt.install_crds`) types
    `spec.domain.chassis.asset` as a string; its examples/vmi-fedora.yaml has an integer."""
    t = make_tenant()
    out = control_plane.kubectl("create", "-n", t.namespace, "-f", str(FIXTURES / "vmi-fedora.yaml"),
                                check=False)
    assert out.returncode != 0
    assert 'spec.domain.chassis.asset in body must be of type string: "integer"' in out.stderr


@pytest.mark.parametrize("manifest", ["vmi-gpu.yaml", "vmi-dra-pgpu.yaml"])
def test_real_kubevirt_manifests_accepted_by_vmi_crd(control_plane, make_tenant, manifest):
    t = make_tenant()
    path = FIXTURES / manifest
    assert path.exists(), f"fixture missing: {path}"
    out = control_plane.kubectl("create", "-n", t.namespace, "-f", str(path), "-o", "name")
    assert out.stdout.strip().startswith("virtualmachineinstance.kubevirt.io/vmi-")
    name = out.stdout.strip().split("/")[1]
    got = control_plane.kubectl("get", "vmi", name, "-n", t.namespace, "-o",
                                "jsonpath={.spec.domain.devices.disks[0].name}")
    assert got.stdout == "containerdisk"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is not running
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_second_control_plane_leaves_no_process_and_no_temp_dir(control_plane):
    started = time.monotonic()
    cp = ControlPlane(binaries=control_plane.binaries)
    cp.start()
    elapsed = time.monotonic() - started
    print(f"warm start of a second control plane: {elapsed:.1f} s")
    pids, workdir = cp.pids, cp.dir
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    assert workdir.is_dir() and cp.kubectl("get", "--raw", "/readyz").stdout == "ok"
    cp.stop()
    assert [p for p in pids if _alive(p)] == []
    assert not workdir.exists()
    cp.stop()  # idempotent


def test_sigterm_to_the_launching_process_stops_everything_and_removes_its_dir(control_plane,
                                                                                tmp_path):
    import signal
    import subprocess
    import sys

    script = tmp_path / "launch.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from localcluster.controlplane import ControlPlane, find_binaries\n"
        "cp = ControlPlane(binaries=find_binaries())\n"
        "cp.start()\n"
        "print(cp.dir, *cp.pids, flush=True)\n"
        "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workdir, *pids = proc.stdout.readline().split()
    assert all(_alive(int(p)) for p in pids)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert [p for p in pids if _alive(int(p))] == []
    assert not Path(workdir).exists()
