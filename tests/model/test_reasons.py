"""The wording of every reason (`model.reasons`), word for word, one row per code: the only
tests of the English text users see (the others assert codes and data). Rewording a reason
changes this table and nothing else. Also: every code has its row and one category, and the
composite refusals take their code from their first reason."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from model import reasons as r
from model.reasons import Category, Code
from model.reasons.codes import _CATEGORY

H = "nvidia.com/H100"
SINCE = datetime(2026, 12, 4, 10, tzinfo=timezone.utc)

WORDING = [
    (r.DeviceNotFound("gpu-x"), "device gpu-x not found"),
    (r.DeviceListedTwice("gpu-a"), "device gpu-a listed twice"),
    (r.NoDevices(), "request lists no devices"),
    (r.ClassNotFound("a100"), "class a100 not found"),
    (r.NotEntitled("tenant-a", "h100"), "tenant tenant-a not entitled to class h100"),
    (r.BudgetExhausted("tenant-a", H, 6, 8, 1, reserved=2),
     "budget of tenant tenant-a for nvidia.com/H100 exhausted: 6 bound + 2 being bound of 8, request adds 1"),
    (r.WrongNamespace("other", "tenant-a"), "device of namespace other in a set of tenant tenant-a"),
    (r.NoFreeUnit("h100", H), "no schedulable node serving class h100 has a free nvidia.com/H100"),
    (r.NodeGone(), "gone"),
    (r.Cordoned(), "cordoned"),
    (r.NotReady(), "not Ready"),
    (r.NotKubevirtSchedulable("kubevirt.io/schedulable"), "lacks label kubevirt.io/schedulable=true"),
    (r.TaintsNotTolerated(("gpu=reserved:NoSchedule",)), "taint gpu=reserved:NoSchedule not tolerated"),
    (r.ClassesNotServed(("h100",)), "does not serve class h100"),
    (r.SelectorMismatch((("zone", "a"), ("pool", "vms"))), "does not match node selector zone=a,pool=vms"),
    (r.LostCapacity(H, 1, 2, 2),
     "lost capacity of nvidia.com/H100: 1 bound (2 used by Pods outside the binder) of 2"),
    (r.NoRoom(H, 2, 1), "needs 2 × nvidia.com/H100, has 1 free"),
    (r.NoDeviceGroup("h100x", "gpu.nvidia.com/partition4", 4, 5, 3),
     "no 4 free h100x devices share gpu.nvidia.com/partition4: 5 free, the largest group has 3"),
    (r.ClassProblem("h100x", "DeviceClass vfio.gpu.nvidia.com not found"),
     "class h100x cannot serve: DeviceClass vfio.gpu.nvidia.com not found"),
    (r.MixedModes(("h100x",), ("l40s",)),
     "KubeVirt refuses a VMI mixing DRA GPUs and device-plugin GPUs: device-mode class h100x "
     "with count-mode class l40s in one set"),
    (r.NoNodeServes(("h100",)), "no node serves class h100"),
    (r.RecordTainted("gpu-b", "n1", "gpu-vfio-0", "example.com/xid", "NoSchedule", "xid-79"),
     "held device gpu-b records gpu-vfio-0 on n1, tainted example.com/xid:NoSchedule by DeviceTaintRule "
     "xid-79: its next placement re-points it within n1 or moves the set"),
    (r.NoEligibleNode((r.NodeProblems("n1", (r.Cordoned(), r.NoRoom(H, 2, 1))),
                       r.NodeProblems("n2", (r.NodeGone(),))), 4),
     "n1: cordoned, needs 2 × nvidia.com/H100, has 1 free; n2: gone; and 4 more nodes"),
    (r.LedgersRefused((r.NodeRefusal("n1", r.NodeUnfit((r.Cordoned(), r.NotReady()))),
                       r.NodeRefusal("n2", r.Short((r.NoRoom(H, 1, 0), r.NoRoom("x.com/L40S", 2, 1)))),
                       r.NodeRefusal("n3", r.LedgerRebuilt(7, 5)),
                       r.NodeRefusal("n4", r.NoReservation()),
                       r.NodeRefusal("n5", r.NoNodeActor()),
                       r.NodeRefusal("n6", r.NodeActorUnavailable("TimeoutError")))),
     "node ledgers refused every candidate: n1: node is cordoned and not Ready; "
     "n2: needs 1 × nvidia.com/H100, has 0 free; needs 2 × x.com/L40S, has 1 free; "
     "n3: ledger rebuilt: incarnation 7, prepared in 5; n4: no reservation (expired or aborted); "
     "n5: no node actor; n6: node actor unavailable (TimeoutError)"),
    (r.PreemptorNever(1000, "on-demand"),
     "the set's priority 1000 (on-demand) has preemptionPolicy Never: it waits and preempts no one"),
    (r.FitsWithoutPreemption("n1"), "the set fits on n1 without preemption"),
    (r.NotRefusedForRoom(Code.BUDGET_EXHAUSTED),
     "the set is refused for budget_exhausted, not for room: preemption would not help"),
    (r.NoEligibleVictim(1000, 3, 1, 1, "10m0s"),
     "no running set may yield to priority 1000: 3 of lower priority (1 ran less than 10m0s, "
     "1 of a class with preemption Never)"),
    (r.NothingFreesEnough(5, 3), "stopping the 5 sets that may yield, on 3 nodes, makes room for the set on none"),
    (r.PreemptionNominated("n3", ("spot/a", "spot/b"), 1000, 30, "t/vm request r1"),
     "refused t/vm request r1 for now: no room for the set now; stopping 2 lower-priority VMs on n3 "
     "to make room for it (priority 1000): spot/a, spot/b; its room is held for it, retry in 30s"),
    (r.UnknownAnnotation(("gpu.cozystack.io/tempaltes",), "gpu.cozystack.io/devices", "gpu.cozystack.io/templates"),
     'unknown annotation gpu.cozystack.io/tempaltes: gpu-binder reads gpu.cozystack.io/devices '
     '(held devices, "gpu-a,gpu-b") and gpu.cozystack.io/templates (new devices, "h100=2,l40s=1")'),
    (r.TooManySelectorEntries(65, 64),
     "the VMI's nodeSelector has 65 entries (with KubeVirt's own); gpu-binder carries at most 64"),
    (r.SelectorEntryTooLong("zone", 317, 63),
     "the VMI's nodeSelector entry 'zone' is longer than a label allows (key 317, value 63 characters)"),
    (r.TooManyTolerations(65, 64), "the VMI has 65 tolerations; gpu-binder carries at most 64"),
    (r.TolerationTooLong("gpu", 317, 63),
     "the VMI's toleration of 'gpu' is longer than a taint allows (key 317, value 63 characters)"),
    (r.HeldDeviceNotFound("nope", "t1"), "GPU device nope not found in namespace t1"),
    (r.DeviceBeingDeleted("g1"), "GPU device g1 is being deleted"),
    (r.TemplateBeingDeleted("vm-h100-0"), "GPU device vm-h100-0 is being deleted; retry"),
    (r.TemplateNamedAsHeld("vm-h100-0", "vm"),
     "GPU device vm-h100-0 is a template device of VMI vm; only held devices can be named in "
     "gpu.cozystack.io/devices"),
    (r.DeviceAttached("g1", "other"), "GPU device g1 is attached to VMI other"),
    (r.NameTaken("vm-h100-0", "h100", "vm"),
     "GPU device vm-h100-0 exists and is not a h100 template device of VMI vm; delete it or rename the VMI"),
    (r.ClassNotPermitted("h100", H),
     "GPU class h100: KubeVirt does not permit resource nvidia.com/H100 (not in the KubeVirt CR's "
     "spec.configuration.permittedHostDevices), so it would not start this VMI; ask the operator to permit it"),
    (r.GpuEntryNotPermitted("gpu1", "vendor.com/fpga"),
     "GPU entry 'gpu1' of the VMI names vendor.com/fpga, which KubeVirt does not permit (not in the "
     "KubeVirt CR's spec.configuration.permittedHostDevices), so it would not start this VMI; remove "
     "the entry or ask the operator to permit it"),
    (r.SetNeeds("h100", H, 3, 2),
     "the set needs 3 × nvidia.com/H100 (class h100) on one node; the most free on an eligible node serving it is 2"),
    (r.NoRoomForSet(), "no eligible node has room for the set"),
    (r.SameNameConflict("g1", "t1", "vm"),
     "GPU device g1 is being attached by another admission of VMI t1/vm (a concurrent create of the "
     "same name); retry once it has finished"),
    (r.DeviceKept("g1", "t1", "vm", "2026-01-01T00:30:00Z"),
     "GPU device g1 is kept for VirtualMachine t1/vm until 2026-01-01T00:30:00Z (keepSetFor): only "
     "that VM's next VMI may take it; delete the VM to release it"),
    (r.KeptForVM("n1", "nvidia.com/H100", 2, "t1", "vm", "2026-01-01T00:30:00Z"),
     "node n1: 2 × nvidia.com/H100 kept for VirtualMachine t1/vm until 2026-01-01T00:30:00Z (keepSetFor)"),
    (r.TenantBusy("t1", 4, 16, 0.0, 1),
     "tenant t1 has 4 GPU admissions in progress at this busy gpu-binder replica and 16 more "
     "wait for a turn of its fair share; too many requests, retry after 1 s"),
    (r.BudgetInFlight("t1", H, 2, 2, 4, 1, 2, 1),
     "tenant t1 has 2 GPU admissions in progress at this gpu-binder replica holding 2 × "
     "nvidia.com/H100 of its budget of 4 (2 used) and this set adds 1: more than its fair share "
     "while they last; too many requests, retry after 1 s"),
    (r.VmiExists("t1", "vm"), "VMI t1/vm already exists; delete it first or choose another name"),
    (r.NameUnconfirmed("t1", "vm", "read VMI t1/vm: 500 boom" + "x" * 300),
     "cannot confirm that VMI t1/vm does not exist yet: read VMI t1/vm: 500 boom" + "x" * 176
     + "; retry"),
    (r.DeviceMalformed("g1", "status.phase: must be Pending or Bound"),
     "GPU device g1 is malformed: status.phase: must be Pending or Bound"),
    (r.DeviceDeleted("g1"), "GPU device g1 was deleted during admission"),
    (r.AttachmentRefused("g1", "y" * 400), "GPU device g1: the API server refused the attachment: "
     + "y" * 300),
    (r.DeviceKeptChanging("g1"), "GPU device g1 kept changing while attaching it; try again"),
    (r.NotBoundInTime("t1", "vm", "r1", 30.0),
     "GPU set of VMI t1/vm was not bound within 30 s (request r1); try again"),
    (r.BinderRefused("t1", "vm", "refused t1/vm request r1: devices g1 (Pending); no room"),
     "refused t1/vm request r1: devices g1 (Pending); no room"),
    (r.DeviceDisappeared("g1"), "GPU device g1 or its class disappeared during admission; retry"),
    (r.ApiInvalid("patch GPUDevice t1/g1: 422 Invalid"), "patch GPUDevice t1/g1: 422 Invalid"),
    (r.ApiThrottled("create Event in t1: 429"), "create Event in t1: 429; retry"),
    (r.ApiForbidden("patch GPUDevice t1/g1: 403 Forbidden"), "patch GPUDevice t1/g1: 403 Forbidden"),
    (r.ApiUnavailable("read GPUDevice t1/g1: timed out"), "read GPUDevice t1/g1: timed out; retry"),
    (r.DeviceUnrecorded("gpu-a", "n1"),
     "GPU device gpu-a: its exact device on node n1 is not recorded yet, so its ResourceClaim cannot be written; retry"),
    (r.ClaimNameTaken("t1", "vm-gpus", "vm"),
     "ResourceClaim t1/vm-gpus exists and was not made by gpu-binder for VMI vm; delete or rename it, or rename the VMI"),
    (r.ClaimBeingDeleted("t1", "vm-gpus"), "ResourceClaim t1/vm-gpus is being deleted; retry"),
    (r.ClaimInUse("t1", "vm-gpus"),
     "ResourceClaim t1/vm-gpus names other devices and is still reserved by a Pod; retry once that Pod is gone"),
    (r.ClaimOverQuota("t1", "vm-gpus", "exceeded quota: q"),
     "ResourceClaim t1/vm-gpus refused by the namespace's ResourceQuota: exceeded quota: q"),
    (r.WrongMediaType("text/plain", "application/json"),
     "unsupported content type 'text/plain'; expected application/json"),
    (r.BodyTooLarge(3145728), "AdmissionReview larger than 3145728 bytes"),
    (r.BodyNotJson("unexpected character: line 1 column 1 (char 0)"),
     "request body is not valid JSON: unexpected character: line 1 column 1 (char 0)"),
    (r.NotAReview("kind", "admission.k8s.io/v1"), "expected an admission.k8s.io/v1 AdmissionReview"),
    (r.NotAVmi("", "Pod"), "gpu-binder admits only kubevirt.io VirtualMachineInstances, got ''/'Pod'"),
    (r.NotACreate("UPDATE"), "gpu-binder handles CREATE only, got 'UPDATE'"),
    (r.DryRunNotBoolean("str"), "AdmissionRequest.dryRun must be a boolean, got str"),
    (r.MalformedMetadata(), "request.object.metadata must be an object"),
    (r.InvalidAnnotations("t1", "vm", "gpu.cozystack.io/templates", "not class=count"),
     "invalid GPU annotations on VMI t1/vm: gpu.cozystack.io/templates: not class=count"),
    (r.InvalidVmi("t1", "vm", "spec.tolerations[0].effect", "unknown effect 'Sometimes'"),
     "invalid VMI t1/vm: spec.tolerations[0].effect: unknown effect 'Sometimes'"),
    (r.NoName(), "a VMI asking for GPUs needs metadata.name and a namespace (generateName is not supported)"),
    (r.NotSynced(), "gpu-binder is starting (cache not synced); retry"),
    (r.ShuttingDown(), "gpu-binder replica is shutting down; retry"),
    (r.AdmissionTimedOut(25.0), "gpu-binder admission did not finish within 25 s; retry"),
    (r.AdmissionCrashed("KeyError"), "gpu-binder admission failed internally: KeyError"),
    (r.PriorityClassNotFound("on-demnad"), "no PriorityClass with name on-demnad was found"),
    (r.BehindInLine("h100", 1, r.Waiter("t1", "big", 1000, "on-demand", SINCE), "n1"),
     "t1/big (priority 1000 on-demand, waiting since 2026-12-04T10:00:00Z) waits ahead at "
     "position 1 in the line of class h100 and could start now on node n1, where this set "
     "would take its room; it goes first; retry"),
    (r.NodeReserved("n3", "h100", r.Waiter("t2", "eight", 0, None, SINCE)),
     "node n3 is reserved for t2/eight (priority 0, waiting since 2026-12-04T10:00:00Z), ahead of "
     "this set in the line of class h100 (waiting longer than line.reserveAfter, or until its "
     "preemption victims there have run preemption.minRuntime); retry"),
    (r.WaitsInLine(r.NoFreeUnit("h100", H), 2, 10),
     "no schedulable node serving class h100 has a free nvidia.com/H100; the set waits in the line "
     "for room: retry after 2 s (its place is kept while the create is retried, lost after 10 s "
     "without one)"),
]


@pytest.mark.parametrize("reason, text", WORDING, ids=[x.code.value for x, _ in WORDING])
def test_every_code_renders_its_wording(reason, text):
    assert reason.render() == text and str(reason) == text


def test_every_code_has_a_wording_row_and_one_reason_type():
    assert sorted(x.code.value for x, _ in WORDING) == sorted(c.value for c in Code)
    types = [t for t in vars(r).values() if isinstance(t, type) and issubclass(t, r.Reason)
             and isinstance(vars(t).get("code"), Code)]
    assert sorted(t.code.value for t in types) == sorted(c.value for c in Code)


@pytest.mark.parametrize("reason, text", [
    (r.NoDevices(asked=True), "no devices asked for"),
    (r.RecordTainted("gpu-b", "n1", "gpu-vfio-4", "gpu.nvidia.com/gpu-lost", "NoExecute", running=True),
     "device gpu-b records gpu-vfio-4 on n1, tainted gpu.nvidia.com/gpu-lost:NoExecute by its ResourceSlice: "
     "its running VMI keeps it (a NoExecute taint has kube-controller-manager evict the launcher Pod)"),
    (r.RecordTainted("gpu-b", "n1", "gpu-vfio-4", "gpu.cozystack.io/suspect", "NoSchedule",
                     "ConfigMap:gpu-suspect-x"),
     "held device gpu-b records gpu-vfio-4 on n1, tainted gpu.cozystack.io/suspect:NoSchedule by gpu-binder's "
     "suspect mark gpu-suspect-x (a ConfigMap entry kube-scheduler cannot see): its next placement "
     "re-points it within n1 or moves the set"),
    (r.TaintsNotTolerated(("a:NoSchedule", "b=c:NoExecute")), "taints a:NoSchedule, b=c:NoExecute not tolerated"),
    (r.ClassesNotServed(("h100", "l40s")), "does not serve classes h100, l40s"),
    (r.LostCapacity(H, 2, 0, 1), "lost capacity of nvidia.com/H100: 2 bound of 1"),
    (r.NoRoom(H, 2, 0, 3), "needs 2 × nvidia.com/H100, has 0 free (3 used by Pods outside the binder)"),
    (r.BudgetExhausted("tenant-a", H, 8, 8, 2),
     "budget of tenant tenant-a for nvidia.com/H100 exhausted: 8 bound of 8, request adds 2"),
    (r.BinderRefused("t1", "vm"), "GPU set of VMI t1/vm was refused by the binder"),
    (r.NotAReview("object"), "AdmissionReview must be a JSON object"),
    (r.NotAReview("request"), "AdmissionReview.request with a string uid is required"),
    (r.NotAReview("uid"), "AdmissionRequest.uid must be a non-empty string"),
    (r.NotAReview("vmi"), "request.object must be an object"),
    (r.MalformedMetadata(annotations=True), "metadata.annotations must map strings to strings"),
    (r.ShuttingDown(while_admitting=True), "gpu-binder replica shut down while admitting; retry"),
    (r.NoNodeServes(("h100", "l40s")), "no node serves any of classes h100, l40s"),
    (r.NoEligibleNode((r.NodeProblems("n1", (r.Cordoned(),)),), 1), "n1: cordoned; and 1 more node"),
    (r.LedgersRefused(()), "node ledgers refused every candidate: no candidate node"),
    (r.NoDeviceGroup("h100x", "gpu.nvidia.com/partition3", 3, 8, 0, True, (1, 2, 4, 8)),
     "no h100x device carries gpu.nvidia.com/partition3 (sizes that exist: 1, 2, 4, 8)"),
    (r.NoDeviceGroup("l40sx", None, 2, 1, 1), "needs 2 free l40sx devices, has 1"),
    # HL1: a room refusal names the device taints (and their DeviceTaintRules) in the way
    (r.NoRoom("vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices", 2, 0, 6, tainted=(
        r.TaintedDevices(("gpu-vfio-6", "gpu-vfio-7"), "gpu.cozystack.io/suspect", "NoSchedule",
                         "gpu-suspect-n1-gpu-vfio-6-0a1b2c3d"),
        r.TaintedDevices(("gpu-vfio-5",), "example.com/broken", "NoExecute"))),
     "needs 2 × vfio.gpu.nvidia.com devices, has 0 free (6 used by Pods outside the binder; "
     "gpu-vfio-6, gpu-vfio-7 tainted gpu.cozystack.io/suspect:NoSchedule by DeviceTaintRule "
     "gpu-suspect-n1-gpu-vfio-6-0a1b2c3d; gpu-vfio-5 tainted example.com/broken:NoExecute by its "
     "ResourceSlice)"),
    (r.NoDeviceGroup("h100x", "gpu.nvidia.com/partition2", 2, 1, 1, tainted=(
        r.TaintedDevices(("gpu-vfio-7",), "gpu.cozystack.io/suspect", "NoSchedule",
                         "ConfigMap:gpu-suspect-n1-gpu-vfio-7-0a1b2c3d", (("b", "gpu-vfio-7"),)),)),
     "no 2 free h100x devices share gpu.nvidia.com/partition2: 1 free, the largest group has 1 "
     "(gpu-vfio-7 of held device b tainted gpu.cozystack.io/suspect:NoSchedule by gpu-binder's "
     "suspect mark gpu-suspect-n1-gpu-vfio-7-0a1b2c3d (a ConfigMap entry kube-scheduler cannot see))"),
    (r.NoDeviceGroup("h100x", None, 2, 1, 1, tainted=(
        r.TaintedDevices(tuple(f"gpu-vfio-{i}" for i in range(6)), "k", "NoSchedule", "r"),)),
     "needs 2 free h100x devices, has 1 (gpu-vfio-0, gpu-vfio-1, gpu-vfio-2, gpu-vfio-3 and 2 more "
     "tainted k:NoSchedule by DeviceTaintRule r)"),
    (r.NoDeviceGroup("h100x", None, 2, 0, 0, tainted=(
        r.TaintedDevices(("gpu-vfio-1",), "k", "NoExecute", "DeviceTaintRule:gpu-suspect-x"),)),
     "needs 2 free h100x devices, has 0 (gpu-vfio-1 tainted k:NoExecute by DeviceTaintRule gpu-suspect-x)"),
    (r.LedgersRefused((r.NodeRefusal("n1", r.DevicesTaken(("gpu-vfio-0", "gpu-vfio-3"))),
                       r.NodeRefusal("n2", r.DevicesTaken(("gpu-vfio-1",))))),
     "node ledgers refused every candidate: n1: devices gpu-vfio-0, gpu-vfio-3 taken; "
     "n2: device gpu-vfio-1 taken"),
    (r.PreemptorNever(0), "the set's priority 0 has preemptionPolicy Never: it waits and preempts no one"),
    (r.NoEligibleVictim(100, 0), "no running set has a priority below 100"),
    (r.NoEligibleVictim(100, 2), "no running set may yield to priority 100: 2 of lower priority"),
    (r.PreemptionNominated("n1", ("spot/a",), 5, 12),
     "no room for the set now; stopping 1 lower-priority VM on n1 to make room for it (priority 5): "
     "spot/a; its room is held for it, retry in 12s"),
    (r.SetNeeds("h100", H, 2, None),
     "the set needs 2 × nvidia.com/H100 (class h100) on one node; no node serving it is eligible"),
    (r.BehindInLine("h100", 17, r.Waiter("t1", "a", 0, None, SINCE), "n1", unchecked=True),
     "more sets waiting ahead in the line of class h100 could use node n1 than one decision "
     "checks, from t1/a (priority 0, waiting since 2026-12-04T10:00:00Z) at position 17; they "
     "go first; retry"),
], ids=lambda x: x.code.value if isinstance(x, r.Reason) else "")
def test_wording_variants(reason, text):
    assert reason.render() == text


def test_a_refusal_names_the_request_and_devices_and_takes_its_first_reasons_code():
    ref = r.RequestRef("tenant-a", "vm-1", "r1")
    devices = (r.DeviceAt("gpu-a", "node-1"), r.DeviceAt("gpu-b"), r.DeviceAt("gpu-x", found=False))
    refused = r.SetRefused(devices, (r.DeviceNotFound("gpu-x"), r.NotEntitled("tenant-a", "h100")), ref)
    assert refused.render() == ("refused tenant-a/vm-1 request r1: devices gpu-a (Bound on node-1), "
                                "gpu-b (Pending), gpu-x (not found); device gpu-x not found; "
                                "tenant tenant-a not entitled to class h100")
    assert (refused.code, refused.category) == (Code.DEVICE_NOT_FOUND, Category.INVALID)
    bare = r.SetRefused((), (r.NoNodeServes(("h100",)),))
    assert bare.render() == "no devices; no node serves class h100"
    w1 = r.CannotPlace("t1", "vm", (r.BudgetExhausted("t1", H, 1, 1, 1),))
    assert w1.render() == ("GPU set of VMI t1/vm cannot be placed: budget of tenant t1 for "
                           "nvidia.com/H100 exhausted: 1 bound of 1, request adds 1")
    assert (w1.code, w1.category) == (Code.BUDGET_EXHAUSTED, Category.POLICY)


def test_W1_a_refusal_counts_the_template_devices_it_judged_instead_of_listing_each():
    # newcomer: eight "new hgx-h100 #k (Pending)" before the reason
    new = tuple(r.DeviceAt(f"new hgx-h100 #{i}") for i in range(1, 9))
    nodes = (r.NoRoomForSet(),)
    assert r.SetRefused(new, nodes).render() == ("8 new hgx-h100 devices; no eligible node has "
                                                 "room for the set")
    one = r.SetRefused((r.DeviceAt("new h100 #1"),), nodes).render()
    assert one.startswith("1 new h100 device; ")
    mixed = (r.DeviceAt("gpu-a", "node-1"), r.DeviceAt("new h100 #1"), r.DeviceAt("new l40s #1"),
             r.DeviceAt("new h100 #2"))
    assert r.SetRefused(mixed, nodes).render().startswith(
        "devices gpu-a (Bound on node-1) and 2 new h100 devices, 1 new l40s device; ")


def test_a_budget_with_room_left_is_too_small_for_the_request_not_exhausted():
    # newcomer: "exhausted: 0 bound of 2, request adds 4"
    assert r.BudgetExhausted("t", H, 0, 2, 4).render() == (
        "budget of tenant t for nvidia.com/H100 too small for the request: 0 bound of 2, "
        "request adds 4")
    assert r.BudgetExhausted("t", H, 1, 2, 2, reserved=1).render().startswith(
        "budget of tenant t for nvidia.com/H100 exhausted: 1 bound + 1 being bound of 2")


def test_succeeded_wording():
    ref = r.RequestRef("tenant-a", "vm-1", "r1")
    assert r.Placed(ref, "node-2", ("gpu-b",), (("gpu-a", "node-1"),)).render() == (
        "placed tenant-a/vm-1 request r1 on node-2: bind gpu-b; move gpu-a from node-1")
    assert r.Placed(ref, "node-2", (), ()).render() == "placed tenant-a/vm-1 request r1 on node-2: nothing to change"
    assert r.Placed(ref, "node-2", ("gpu-b",), (), (("gpu-a", "gpu-vfio-3"), ("gpu-b", "gpu-vfio-0"))
                    ).render() == ("placed tenant-a/vm-1 request r1 on node-2: bind gpu-b; "
                                   "devices gpu-a=gpu-vfio-3, gpu-b=gpu-vfio-0")
    assert r.AlreadyPlaced(ref, "node-1").render() == "tenant-a/vm-1 request r1: already placed on node-1"
    assert r.KeptCordoned(ref, "node-1", "B5a").render() == (
        "tenant-a/vm-1 request r1: kept on cordoned node node-1 (B5a: the cordon is its only problem "
        "and no other node has room); the VMI waits for the cordon to lift")
    assert r.KeptCordoned(ref, "node-1", "B5b", ("a", "b")).render() == (
        "tenant-a/vm-1 request r1: kept on cordoned node node-1 (B5b: classes a, b are onCordon Stay); "
        "the VMI waits for the cordon to lift")
    assert r.Resumed(ref, "node-1").render() == (
        "placed tenant-a/vm-1 request r1 on node-1: finishing a decision made before a binder restart")
    assert r.Preempts("t/spot-1", 0, "t/od-1", 1000, "node-3").render() == (
        "preempts t/spot-1 (priority 0) for t/od-1 (priority 1000) on node-3")


@pytest.mark.parametrize("code, category", [
    (Code.BUDGET_EXHAUSTED, Category.POLICY), (Code.NOT_ENTITLED, Category.POLICY),
    (Code.NO_ELIGIBLE_NODE, Category.POLICY), (Code.CORDONED, Category.POLICY),
    (Code.DEVICE_ATTACHED, Category.POLICY), (Code.CLASS_NOT_PERMITTED, Category.POLICY),
    (Code.CLASS_NOT_FOUND, Category.INVALID), (Code.DEVICE_LISTED_TWICE, Category.INVALID),
    (Code.WRONG_NAMESPACE, Category.INVALID), (Code.UNKNOWN_ANNOTATION, Category.INVALID),
    (Code.HELD_DEVICE_NOT_FOUND, Category.INVALID),
    (Code.LEDGERS_REFUSED, Category.UNAVAILABLE), (Code.SAME_NAME_CONFLICT, Category.UNAVAILABLE),
    (Code.TEMPLATE_BEING_DELETED, Category.UNAVAILABLE), (Code.NOT_BOUND_IN_TIME, Category.UNAVAILABLE),
    (Code.API_THROTTLED, Category.THROTTLED), (Code.API_FORBIDDEN, Category.INTERNAL),
    (Code.VMI_EXISTS, Category.POLICY), (Code.ATTACHMENT_REFUSED, Category.INVALID),
    (Code.NO_DEVICE_GROUP, Category.POLICY), (Code.CLASS_PROBLEM, Category.POLICY),
    (Code.MIXED_MODES, Category.INVALID),
    (Code.PRIORITY_CLASS_NOT_FOUND, Category.POLICY),
    (Code.BEHIND_IN_LINE, Category.UNAVAILABLE), (Code.NODE_RESERVED, Category.UNAVAILABLE),
    (Code.WAITS_IN_LINE, Category.UNAVAILABLE),
    (Code.RECORD_TAINTED, Category.POLICY),
])
def test_categories(code, category):
    assert code.category is category


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.value)
def test_every_code_names_its_category_explicitly(code):
    """No default: a code added without a category fails here (and raises KeyError in
    `Code.category`), instead of being answered 403 silently."""
    assert isinstance(_CATEGORY.get(code), Category), f"{code} has no category in _CATEGORY"


def test_a_binder_refusal_takes_the_category_of_the_code_written_beside_it():
    assert r.BinderRefused("t1", "vm", "m", Code.LEDGERS_REFUSED).category is Category.UNAVAILABLE
    assert r.BinderRefused("t1", "vm", "m", Code.PREEMPTION_NOMINATED).category is Category.UNAVAILABLE
    assert r.BinderRefused("t1", "vm", "m", Code.BUDGET_EXHAUSTED).category is Category.POLICY
    assert r.BinderRefused("t1", "vm", "m", Code.DEVICE_NOT_FOUND).category is Category.INVALID
    # no code: an older replica's refusal, answered as before the code was written
    assert r.BinderRefused("t1", "vm", "m").category is Category.POLICY


def test_a_device_mode_count_key_reads_as_its_deviceclass_devices():
    """DR1: messages name `vfio.gpu.nvidia.com devices`, not the quota key."""
    from model.reasons import BudgetExhausted, NoRoom
    from model.types import dra_resource_name

    res = dra_resource_name("vfio.gpu.nvidia.com")
    assert NoRoom(res, 3, 1, 0).render() == "needs 3 × vfio.gpu.nvidia.com devices, has 1 free"
    assert "for vfio.gpu.nvidia.com devices exhausted" in BudgetExhausted("t", res, 4, 4, 1, 0).render()
    assert NoRoom("nvidia.com/H100", 1, 0, 0).render() == "needs 1 × nvidia.com/H100, has 0 free"


def test_a_budget_of_zero_reads_as_no_budget_not_zero_of_zero():
    """B4 with `hard: 0`: the tenant was given no budget; "0 bound of 0" hid that."""
    assert r.BudgetExhausted("tenant-a", H, 0, 0, 2).render() == (
        "tenant tenant-a has no budget for nvidia.com/H100 (its ResourceQuota allows 0), "
        "request adds 2")
    assert r.BudgetExhausted("tenant-a", H, 0, 0, 1, reserved=1).render().startswith(
        "budget of tenant tenant-a for nvidia.com/H100 exhausted: 0 bound + 1 being bound of 0")
