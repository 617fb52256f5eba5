"""The local cluster's DRA world against the real kube-apiserver (docs/contract.md §3b): the hardware
profiles' DeviceClass and ResourceSlices pass the real `resource.k8s.io/v1` schema and read
back into the same inventory, and kube-controller-manager's resourceclaim-controller (the
harness's `ClaimController`, with only its own bootstrap RBAC) makes a Pod's claim from a
ResourceClaimTemplate. No GPUs and no DRA driver: nothing is prepared."""

from __future__ import annotations

import time

import orjson
import pytest
import yaml

from localcluster.claimcontroller import ClaimController
from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, L40S_4, device_class, resource_slice
from model.device.cel import Selector
from model.device.dra import parse_resource_slice, pool_devices
from tests.e2e.conftest import unique


@pytest.fixture(scope="module")
def claim_controller(control_plane, tmp_path_factory):
    with ClaimController(control_plane, tmp_path_factory.mktemp("kcm")) as cc:
        yield cc


def _apply(cp, *docs):
    cp.kubectl("apply", "--server-side", "--field-manager=gpu-binder-tests", "-f", "-",
               input=yaml.safe_dump_all(docs))


def _get(cp, *args):
    return orjson.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def test_DR1_profile_slices_pass_the_real_schema_and_read_back_the_same(control_plane):
    hgx, pcie = unique("hgx"), unique("pcie")
    _apply(control_plane, device_class(), resource_slice(hgx, HGX_H100_8),
           resource_slice(pcie, L40S_4))
    try:
        served = [_get(control_plane, "resourceslice", f"{n}-gpu.nvidia.com") for n in (hgx, pcie)]
        inventory = pool_devices(parse_resource_slice(s) for s in served)
        expected = pool_devices([parse_resource_slice(resource_slice(hgx, HGX_H100_8)),
                                 parse_resource_slice(resource_slice(pcie, L40S_4))])
        assert inventory == expected
        assert [len(inventory[n]) for n in (hgx, pcie)] == [8, 4]
        cls = _get(control_plane, "deviceclass", DEVICE_CLASS)
        selector = Selector.compile(cls["spec"]["selectors"][0]["cel"]["expression"])
        assert all(selector.match(d.cel_view()).matched
                   for n in (hgx, pcie) for d in inventory[n])
    finally:
        control_plane.kubectl("delete", "resourceslice", f"{hgx}-gpu.nvidia.com",
                              f"{pcie}-gpu.nvidia.com", "--ignore-not-found", check=False)


def test_DR5_the_claim_controller_makes_a_pods_claim_from_its_template(control_plane, claim_controller):
    ns = unique("dra")
    control_plane.kubectl("create", "namespace", ns)
    _apply(control_plane, device_class())
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "two-gpus", "namespace": ns},
                "spec": {"spec": {"devices": {
                    "requests": [{"name": f"gpu-{i}", "exactly": {
                        "deviceClassName": DEVICE_CLASS, "count": 1}} for i in range(2)],
                    "constraints": [{"matchAttribute": "gpu.nvidia.com/partition2"}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
           "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
                    "containers": [{"name": "c", "image": "none",
                                    "resources": {"claims": [{"name": "gpus"}]}}]}}
    _apply(control_plane, template, pod)
    try:
        _claim_made_for_the_pod(control_plane, claim_controller, ns)
    finally:
        # the Pod would stay Pending and take the first free partition of pairs some later
        # test's node publishes (a foreign claim to that test): delete it and its claim
        control_plane.kubectl("delete", "pod", "p", "-n", ns, "--ignore-not-found",
                              "--grace-period=0", "--force", check=False)
        control_plane.kubectl("delete", "resourceclaims", "--all", "-n", ns,
                              "--ignore-not-found", "--wait=false", check=False)


def _claim_made_for_the_pod(control_plane, claim_controller, ns: str) -> None:
    """Wait (20 s at most) for the claim the controller makes for Pod `p` and check it."""
    deadline = time.monotonic() + 20
    claims: list = []
    while time.monotonic() < deadline and not claims:
        claims = _get(control_plane, "resourceclaims", "-n", ns)["items"]
        if not claims:
            assert claim_controller.alive(), claim_controller.log_tail()
            time.sleep(0.2)
    assert len(claims) == 1, f"no claim made within 20 s:\n{claim_controller.log_tail()}"
    claim = claims[0]
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Pod", "p")
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpus"
    assert [r["name"] for r in claim["spec"]["devices"]["requests"]] == ["gpu-0", "gpu-1"]
    status = _get(control_plane, "pod", "p", "-n", ns)["status"]
    assert status["resourceClaimStatuses"] == [{"name": "gpus",
                                                "resourceClaimName": claim["metadata"]["name"]}]
