"""Deployable manifests (issue 7): every manifest applies with server-side dry run, and the
shipped ValidatingAdmissionPolicies enforce `rawResourceNames` from the settings ConfigMap."""

from __future__ import annotations

import pytest
import yaml

from tests.e2e.conftest import MANIFESTS, unique
from tests.e2e.helpers import until_sync

RES = "nvidia.com/GH100_H100"
# the same field manager as localcluster.cluster's install, so the tests' applies co-own fields
INSTALL = ("apply", "--server-side", "--force-conflicts", "--field-manager=gpu-binder-install")


def test_every_manifest_applies_with_server_side_dry_run(control_plane):
    control_plane.kubectl(*INSTALL, "-f", str(MANIFESTS / "controller" / "namespace.yaml"))
    out = control_plane.kubectl(*INSTALL, "--dry-run=server", "-k", str(MANIFESTS))
    kinds = sorted(line.split("/")[0] for line in out.stdout.splitlines() if "/" in line)
    assert kinds == sorted([
        "namespace", "customresourcedefinition.apiextensions.k8s.io",
        "customresourcedefinition.apiextensions.k8s.io",
        "customresourcedefinition.apiextensions.k8s.io",   # GPUNominations (P4)
        "clusterrole.rbac.authorization.k8s.io", "clusterrole.rbac.authorization.k8s.io",
        "clusterrolebinding.rbac.authorization.k8s.io", "role.rbac.authorization.k8s.io",
        "rolebinding.rbac.authorization.k8s.io", "serviceaccount", "service", "configmap",
        "configmap",   # the dashboard, and gpu-settings (the policies' parameter)
        "deployment.apps", "mutatingwebhookconfiguration.admissionregistration.k8s.io",
        "networkpolicy.networking.k8s.io",
        "flowschema.flowcontrol.apiserver.k8s.io",                  # VMI creates (issue 23)
        "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",   # admitted-vmis (W7)
        "validatingadmissionpolicy.admissionregistration.k8s.io",   # raw-device-claims (DR5)
        "validatingadmissionpolicybinding.admissionregistration.k8s.io",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io"]), out.stdout


def _settings(cp, raw: str) -> None:
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=gpu-binder-tests",
               "-f", "-", input=yaml.safe_dump({
                   "apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "gpu-settings", "namespace": "cozy-system"},
                   "data": {"resourceNames": f"{RES},nvidia.com/NVIDIA_L40S-24C",
                            "rawResourceNames": raw}}))


def _pod(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                           "spec": {"containers": [{"name": "c", "image": "busybox",
                                                    "resources": {"limits": {RES: "1"}}}]}})


def _raw_vmi(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                           "metadata": {"name": name},
                           "spec": {"domain": {"devices": {"gpus": [
                               {"name": "g", "deviceName": RES}]}}}})


@pytest.fixture
def tenant_ns(control_plane):
    control_plane.kubectl(*INSTALL, "-f", str(MANIFESTS / "controller" / "namespace.yaml"),
                          "-f", str(MANIFESTS / "policies"))
    ns = unique("tenant")
    control_plane.kubectl("create", "namespace", ns)
    control_plane.kubectl("label", "namespace", ns, "gpu.cozystack.io/tenant=true")
    yield ns
    # back to the shipped ConfigMap (rawResourceNames: allowed): the bindings deny while it is
    # missing (parameterNotFoundAction: Deny), and later modules create Pods and VMIs
    control_plane.kubectl("delete", "configmap", "gpu-settings", "-n", "cozy-system",
                          "--ignore-not-found")
    control_plane.kubectl(*INSTALL, "-f", str(MANIFESTS / "policies"))


def test_denied_policy_refuses_raw_pod_and_raw_vmi_in_tenant_namespace(control_plane,
                                                                        tenant_ns):
    _settings(control_plane, "denied")

    def refused_pod():
        out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", check=False,
                                    input=_pod(unique("p")))
        return out.returncode != 0 and out.stderr
    err = until_sync(refused_pod)
    assert "gpu-binder-raw-pods" in err and "cannot be requested directly" in err
    out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", check=False,
                                input=_raw_vmi("raw"))
    assert out.returncode != 0 and "gpu-binder-raw-vmis" in out.stderr
    # a VMI asking through the binder's annotations is not the policy's business
    vmi = yaml.safe_load(_raw_vmi("annotated"))
    vmi["metadata"]["annotations"] = {"gpu.cozystack.io/templates": "h100=1"}
    out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", "--dry-run=server",
                                check=False, input=yaml.safe_dump(vmi))
    assert out.returncode == 0, out.stderr
    # in the system namespaces the policy does not apply
    out = control_plane.kubectl("create", "-n", "kube-system", "-f", "-", "--dry-run=server",
                                input=_pod("ok"))
    assert out.returncode == 0


def test_allowed_policy_admits_raw_pod_and_raw_vmi(control_plane, tenant_ns):
    _settings(control_plane, "allowed")

    def admitted_pod():
        out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", "--dry-run=server",
                                    check=False, input=_pod("p"))
        return out.returncode == 0
    assert until_sync(admitted_pod)
    out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", input=_raw_vmi("raw"))
    assert out.returncode == 0


def _vmi(name: str, *, annotations: dict | None = None, gpus: bool = False,
         host_devices: bool = False, limits: bool = False, requests: bool = False) -> dict:
    domain: dict = {"devices": {}}
    if gpus:
        domain["devices"]["gpus"] = [{"name": "g", "deviceName": RES}]
    if host_devices:
        domain["devices"]["hostDevices"] = [{"name": "h", "deviceName": RES}]
    if limits or requests:
        domain["resources"] = {k: {RES: "1"} for k, on in (("limits", limits),
                                                           ("requests", requests)) if on}
    meta: dict = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": meta, "spec": {"domain": domain}}


ASKS = {"gpu.cozystack.io/templates": "h100=1"}


@pytest.mark.parametrize("raw", ["hostDevices", "limits", "requests"])
def test_denied_policy_refuses_annotated_vmi_that_also_names_a_gpu_directly(control_plane,
                                                                           tenant_ns, raw):
    """A VMI that carries our annotations (so the binder places its set) and also a
    hostDevices entry or resources naming a GPU resource would get GPUs outside the binder:
    refused. The webhook's own result (gpus entries, annotated) still passes."""
    _settings(control_plane, "denied")
    bad = _vmi(unique("both"), annotations=ASKS, gpus=True, host_devices=raw == "hostDevices",
               limits=raw == "limits", requests=raw == "requests")

    def refused():
        out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", "--dry-run=server",
                                    check=False, input=yaml.safe_dump(bad))
        return out.returncode != 0 and out.stderr
    err = until_sync(refused)
    assert err and "gpu-binder-raw-vmis" in err, err
    assert ("hostDevices" if raw == "hostDevices" else "spec.domain.resources") in err, err
    ok = _vmi(unique("ok"), annotations=ASKS, gpus=True)
    out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", "--dry-run=server",
                                check=False, input=yaml.safe_dump(ok))
    assert out.returncode == 0, out.stderr


def test_denied_policy_covers_a_namespace_without_the_tenant_label(control_plane, tenant_ns):
    """A namespace entitled to a class by its namespaceSelector but lacking the tenant label
    is no way around the policy: every namespace but the system ones is in scope."""
    _settings(control_plane, "denied")
    cls = unique("cls")
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": cls},
        "spec": {"resourceName": RES, "namespaceSelector": {"matchLabels": {"team": cls}}}}))
    ns = unique("entitled")
    control_plane.kubectl("create", "namespace", ns)
    control_plane.kubectl("label", "namespace", ns, f"team={cls}")
    until_sync(lambda: control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", check=False,
                                         input=_raw_vmi(unique("warm"))).returncode != 0)
    for what, body in (("pod", _pod(unique("p"))),
                       ("gpus", yaml.safe_dump(_vmi(unique("v"), gpus=True))),
                       ("hostDevices", yaml.safe_dump(_vmi(unique("v"), host_devices=True))),
                       ("limits", yaml.safe_dump(_vmi(unique("v"), limits=True)))):
        out = control_plane.kubectl("create", "-n", ns, "-f", "-", check=False, input=body)
        assert out.returncode != 0 and "gpu-binder-raw-" in out.stderr, (what, out.stdout)
    control_plane.kubectl("delete", "gpuclass", cls)


def test_denied_policy_refuses_an_update_that_adds_a_gpu_to_an_admitted_vmi(control_plane,
                                                                            tenant_ns):
    """The webhook sees CREATE only: an UPDATE may not add or change entries naming a GPU
    resource (KubeVirt's own updates of the VMI, which leave them alone, still pass)."""
    _settings(control_plane, "allowed")
    name = unique("vm")
    control_plane.kubectl("create", "-n", tenant_ns, "-f", "-",
                          input=yaml.safe_dump(_vmi(name, annotations=ASKS, gpus=True)))
    _settings(control_plane, "denied")

    def refused():
        grown = _vmi(name, annotations=ASKS, gpus=True, host_devices=True)
        grown["spec"]["domain"]["devices"]["gpus"].append({"name": "g2", "deviceName": RES})
        out = control_plane.kubectl("apply", "--server-side", "--force-conflicts",
                                    "-n", tenant_ns, "-f", "-", check=False,
                                    input=yaml.safe_dump(grown))
        return out.returncode != 0 and out.stderr
    err = until_sync(refused)
    assert err and "gpu-binder-raw-vmis" in err, err
    out = control_plane.kubectl("label", "vmi", name, "-n", tenant_ns, "kubevirt.io/nodeName=n1")
    assert out.returncode == 0


def test_attached_devices_policy_says_delete_the_vmi_or_for_a_kept_device_the_vm(control_plane,
                                                                               tenant_ns):
    """The shipped policy `gpu-binder-attached-devices` refuses deleting an attached device
    (B3, H2) by anyone, the administrator too; its message tells what to delete: the VMI, or
    for a device kept for a stopped VirtualMachine (H4: `attachedTo.keptUntil`) the VM, or to
    wait until the keep runs out. Unattached, it is deleted."""
    control_plane.kubectl(*INSTALL, "-f", str(MANIFESTS / "crds"))

    def device(name: str, attached: dict | None) -> None:
        control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", input=yaml.safe_dump({
            "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": name}, "spec": {"class": "h100"}}))
        if attached is not None:
            control_plane.kubectl("patch", "gpudevice", name, "-n", tenant_ns,
                                  "--subresource=status", "--type=merge", "-p",
                                  yaml.safe_dump({"status": {"attachedTo": attached}}))

    def refused(name: str):
        def probe():
            out = control_plane.kubectl("delete", "gpudevice", name, "-n", tenant_ns,
                                        "--wait=false", check=False)
            if out.returncode == 0:
                raise AssertionError(f"attached device {name} was deleted: {out.stdout}")
            return out.stderr if "gpu-binder-attached-devices" in out.stderr else None
        return until_sync(probe)

    device("running", {"vmi": "vm-a", "since": "2026-01-01T00:00:00Z"})
    device("kept", {"vmi": "vm-b", "since": "2026-01-01T00:00:00Z", "owner": "u-1",
                    "keptUntil": "2026-01-02T03:04:05Z"})
    device("free", None)
    err = refused("running")
    assert ("GPU device running is attached to VMI vm-a and cannot be deleted while attached: "
            "delete the VMI first") in err, err
    assert "VirtualMachine" not in err, err
    err = refused("kept")
    assert ("GPU device kept is kept for VirtualMachine vm-b until 2026-01-02T03:04:05Z and "
            "cannot be deleted while kept: delete the VirtualMachine (its kept devices are "
            "released within seconds) or wait until 2026-01-02T03:04:05Z") in err, err
    assert "delete the VMI" not in err, err
    control_plane.kubectl("delete", "gpudevice", "free", "-n", tenant_ns)
    # released (housekeeping clears attachedTo first): deleted
    control_plane.kubectl("patch", "gpudevice", "kept", "-n", tenant_ns, "--subresource=status",
                          "--type=json", "-p", '[{"op": "remove", "path": "/status/attachedTo"}]')
    assert until_sync(lambda: control_plane.kubectl("delete", "gpudevice", "kept", "-n", tenant_ns,
                                                check=False).returncode == 0)
