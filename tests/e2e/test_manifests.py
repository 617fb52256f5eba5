"""Deployable manifests (issue 7): every manifest applies with server-side dry run, and the
shipped ValidatingAdmissionPolicies enforce `rawResourceNames` from the settings ConfigMap."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.e2e.conftest import MANIFESTS, unique

RES = "nvidia.com/GH100_H100"
# the same field manager as k8s.localcluster's install, so the tests' applies co-own fields
INSTALL = ("apply", "--server-side", "--force-conflicts", "--field-manager=gpu-binder-install")


def test_every_manifest_applies_with_server_side_dry_run(control_plane):
    control_plane.kubectl(*INSTALL, "-f", str(MANIFESTS / "controller" / "namespace.yaml"))
    out = control_plane.kubectl(*INSTALL, "--dry-run=server", "-k", str(MANIFESTS))
    kinds = sorted(line.split("/")[0] for line in out.stdout.splitlines() if "/" in line)
    assert kinds == sorted([
        "namespace", "customresourcedefinition.apiextensions.k8s.io",
        "customresourcedefinition.apiextensions.k8s.io",
        "clusterrole.rbac.authorization.k8s.io", "clusterrole.rbac.authorization.k8s.io",
        "clusterrolebinding.rbac.authorization.k8s.io", "role.rbac.authorization.k8s.io",
        "rolebinding.rbac.authorization.k8s.io", "serviceaccount", "service", "configmap",
        "deployment.apps", "mutatingwebhookconfiguration.admissionregistration.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",
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


def _until(fn, timeout: float = 20.0):
    """Policies and their params reach the API server's admission informers after a moment."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


@pytest.fixture
def tenant_ns(control_plane):
    control_plane.kubectl(*INSTALL, "-f", str(MANIFESTS / "controller" / "namespace.yaml"),
                          "-f", str(MANIFESTS / "policies"))
    ns = unique("tenant")
    control_plane.kubectl("create", "namespace", ns)
    control_plane.kubectl("label", "namespace", ns, "gpu.cozystack.io/tenant=true")
    yield ns
    control_plane.kubectl("delete", "configmap", "gpu-settings", "-n", "cozy-system",
                          "--ignore-not-found")


def test_denied_policy_refuses_raw_pod_and_raw_vmi_in_tenant_namespace(control_plane,
                                                                        tenant_ns):
    _settings(control_plane, "denied")

    def refused_pod():
        out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", check=False,
                                    input=_pod(unique("p")))
        return out.returncode != 0 and out.stderr
    err = _until(refused_pod)
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
    # outside tenant namespaces the policy does not apply
    other = unique("infra")
    control_plane.kubectl("create", "namespace", other)
    out = control_plane.kubectl("create", "-n", other, "-f", "-", input=_pod("ok"))
    assert out.returncode == 0


def test_allowed_policy_admits_raw_pod_and_raw_vmi(control_plane, tenant_ns):
    _settings(control_plane, "allowed")

    def admitted_pod():
        out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", "--dry-run=server",
                                    check=False, input=_pod("p"))
        return out.returncode == 0
    assert _until(admitted_pod)
    out = control_plane.kubectl("create", "-n", tenant_ns, "-f", "-", input=_raw_vmi("raw"))
    assert out.returncode == 0
