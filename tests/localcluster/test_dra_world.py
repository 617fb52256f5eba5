"""Device mode's world and demo without a cluster (localcluster.dra_world, localcluster.demo_dra):
the world's GPUClasses parse as device-mode classes whose own selectors split the two profiles,
the group a set forms is named from the slices (DR3), budgets use Kubernetes' DRA quota key, and
the demo's account says what was not as expected instead of passing quietly."""

from __future__ import annotations

from localcluster.demo import Row
from localcluster.demo_dra import PLAN, Ask, Outcome, print_outcomes
from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, L40S_4, resource_slice
from localcluster.dra_world import (CLASSES, DEVICE_BUDGET_KEY, HGX_CLASS, L40S_CLASS, group_formed,
                                    module_ids, node_names)
from localcluster.fleet import quota_key
from model.device.cel import Selector
from model.device.dra import parse_resource_slice, pool_devices
from model.parse import parse_gpu_class


def _devices(profile, node="n", names=None):
    devs = pool_devices([parse_resource_slice(resource_slice(node, profile))])[node]
    return [d for d in devs if names is None or d.ref.device in names]


def test_DR1_the_worlds_classes_are_device_mode_and_their_selectors_split_the_profiles():
    for cls in CLASSES:
        parsed = parse_gpu_class({"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUClass",
                                  "metadata": {"name": cls.name}, "spec": cls.spec()})
        assert parsed.device_mode and parsed.problem is None
        assert (parsed.device_class_name, parsed.match_attribute) == (DEVICE_CLASS, cls.match_attribute)
        assert parsed.resource_name == DEVICE_BUDGET_KEY
    hgx, l40s = (Selector.compile(c.selector) for c in (HGX_CLASS, L40S_CLASS))
    assert all(hgx.match(d.cel_view()).matched for d in _devices(HGX_H100_8))
    assert not any(hgx.match(d.cel_view()).matched for d in _devices(L40S_4))
    assert all(l40s.match(d.cel_view()).matched for d in _devices(L40S_4))


def test_DR3_the_group_a_set_forms_is_read_from_its_devices_attributes():
    # PCI indices 0 and 3 are modules 2 and 1: one pair; 0 and 1 are modules 2 and 4: none
    pair = _devices(HGX_H100_8, names={"gpu-vfio-0", "gpu-vfio-3"})
    assert (group_formed(pair, HGX_CLASS.match_attribute), module_ids(pair)) == (
        "gpu.nvidia.com/partition2=3", [1, 2])
    assert group_formed(_devices(HGX_H100_8, names={"gpu-vfio-0", "gpu-vfio-1"}),
                        HGX_CLASS.match_attribute) is None
    assert group_formed(_devices(HGX_H100_8), HGX_CLASS.match_attribute) == "gpu.nvidia.com/partition8=0"
    three = _devices(HGX_H100_8, names={"gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-2"})
    assert group_formed(three, HGX_CLASS.match_attribute) is None   # no partition3 attribute
    root = _devices(L40S_4, names={"gpu-vfio-0", "gpu-vfio-1"})
    assert group_formed(root, L40S_CLASS.match_attribute) == "resource.kubernetes.io/pcieRoot=pci0000:16"
    assert module_ids(root) == []
    assert group_formed([], HGX_CLASS.match_attribute) is None


def test_budgets_of_a_device_class_use_kubernetes_dra_quota_key():
    assert quota_key(DEVICE_BUDGET_KEY) == "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    assert quota_key("nvidia.com/GH100_H100") == "requests.nvidia.com/GH100_H100"


def test_the_fleet_names_its_nodes_by_profile():
    assert node_names(2, 1) == [("hgx-node-00", HGX_H100_8), ("hgx-node-01", HGX_H100_8),
                                ("l40s-node-00", L40S_4)]


def test_the_demo_plan_asks_every_size_and_expects_refusals_with_reasons():
    hgx = {a.gpus for a in PLAN if a.cls == HGX_CLASS.name and a.admit}
    assert hgx == {1, 2, 4, 8}
    assert {a.name for a in PLAN if not a.admit} == {"odd-3", "train-8b", "blue-4"}


def test_the_demo_says_what_was_not_as_expected_and_counts_it(capsys):
    ask = Ask("tenant-acme", "train-4", HGX_CLASS.name, 4, True, "why")
    ok = Outcome(ask, Row("train-4", "tenant-acme", "", node="hgx-node-01", launcher_node="hgx-node-01"),
                 recorded=[f"hgx-node-01/gpu-vfio-{i}" for i in (4, 5, 6, 7)], claim="train-4-gpus",
                 allocated=[f"hgx-node-01/gpu-vfio-{i}" for i in (4, 5, 6, 7)], modules=[5, 6, 7, 8],
                 group="gpu.nvidia.com/partition4=2")
    unwired = Outcome(ask, Row("train-4", "tenant-acme", "", node="hgx-node-00"),
                      problems=["admitted without a ResourceClaim in spec.resourceClaims (DR5)"])
    refused = Outcome(Ask("tenant-acme", "odd-3", HGX_CLASS.name, 3, False, "no partition of 3"),
                      Row("odd-3", "tenant-acme", "", reason="no partition of 3 GPUs; sizes 1, 2, 4, 8"))
    wrongly = Outcome(ask, Row("train-4", "tenant-acme", "", reason="timeout"))
    # refused, but for another reason than planned (room instead of the sizes: newcomer)
    odd = Ask("tenant-acme", "odd-3", HGX_CLASS.name, 3, False, "no partition of 3",
              "sizes that exist")
    other_reason = Outcome(odd, Row("odd-3", "tenant-acme", "", reason="needs 3, has 1 free"))
    assert print_outcomes([ok, unwired, refused, wrongly, other_reason]) == 3
    out = capsys.readouterr().out
    assert ("admitted on hgx-node-01: gpu-vfio-4, gpu-vfio-5, gpu-vfio-6, gpu-vfio-7 (module ids "
            "5, 6, 7, 8, in that order), forming gpu.nvidia.com/partition4=2") in out
    assert "claim train-4-gpus: allocated as recorded; launcher Pod bound on hgx-node-01" in out
    assert "NOT AS EXPECTED: admitted without a ResourceClaim" in out
    assert "REFUSED: no partition of 3 GPUs; sizes 1, 2, 4, 8" in out
    assert "NOT AS EXPECTED: expected admitted (why)" in out
    assert "NOT AS EXPECTED: expected refused saying 'sizes that exist' (no partition of 3)" in out
    assert "5 VMIs: 2 admitted, 3 refused; 2 of 5 as expected" in out


def test_every_planned_refusal_says_what_it_must_contain():
    assert all(a.expect for a in PLAN if not a.admit)
