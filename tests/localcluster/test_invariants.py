"""localcluster.invariants on hand-written snapshots (no cluster): each §7 kind is found,
and a clean snapshot gives none."""

from __future__ import annotations

import pytest

from localcluster import invariants as inv


def dev(ns, name, *, cls="c", phase="Bound", node="n1", vmi=None, result="Succeeded",
        rnode=None, template=None, rid="r1"):
    st = {"phase": phase, "nodeName": node if phase == "Bound" else None}
    if vmi:
        st["attachedTo"] = {"vmi": vmi}
    if rid:
        st["bindRequest"] = {"id": rid, "vmi": vmi, "result": result, "node": rnode or node}
    meta = {"namespace": ns, "name": name}
    if template:
        meta["labels"] = {inv.TEMPLATE_LABEL: template}
    return {"metadata": meta, "spec": {"class": cls}, "status": st}


def vmi(ns, name, gpus, pin="n1", uid="u1"):
    return {"metadata": {"namespace": ns, "name": name, "uid": uid,
                         "annotations": {"gpu.cozystack.io/devices": ",".join(gpus)}},
            "spec": {"nodeSelector": {inv.PIN_LABEL: pin},
                     "domain": {"devices": {"gpus": [{"name": g} for g in gpus]}}}}


def snap(vmis, devices, *, alloc=2, budget=2, pods=None):
    return inv.Snapshot(vmis=vmis, devices=devices, resource={"c": "r"},
                        allocatable={"n1": {"r": alloc}}, budget={("t", "r"): budget}, pods=pods)


def kinds(vs):
    return sorted(v.kind for v in vs)


def test_a_clean_snapshot_has_no_violation_now_or_after_settling():
    s = snap([vmi("t", "a", ["g1", "g2"])],
             [dev("t", "g1", vmi="a"), dev("t", "g2", vmi="a")], pods={"u1": "n1"})
    assert inv.check(s, settled={("t", "a")}) == []
    assert inv.check(s, settled={("t", "a")}, final=True) == []
    assert inv.leftovers(s) == []


def test_node_over_allocatable_and_tenant_over_budget():
    s = snap([], [dev("t", f"g{i}", rid=None) for i in range(3)])
    got = inv.check(s)
    assert kinds(got) == [inv.NODE_OVER, inv.TENANT_OVER]
    assert {v.item for v in got} == {"7.1", "7.4"}
    assert got[0].obj == ("Node", "", "n1", "r")


def test_succeeded_not_bound_and_admitted_not_on_its_pin():
    s = snap([vmi("t", "a", ["g1"], pin="n2")], [dev("t", "g1", vmi="a", phase="Pending")])
    assert kinds(inv.check(s, settled={("t", "a")})) == [inv.ADMITTED_NOT_PLACED,
                                                           inv.SUCCEEDED_NOT_BOUND]
    # not held as admitted: only the device's own record is checked while churning
    assert kinds(inv.check(s)) == [inv.SUCCEEDED_NOT_BOUND]


def test_a_device_named_by_two_vmis():
    s = snap([vmi("t", "a", ["g1"]), vmi("t", "b", ["g1"], uid="u2")], [dev("t", "g1", vmi="a")])
    assert inv.DOUBLE_NAMED in kinds(inv.check(s))


def test_leftovers_after_the_vmi_is_gone():
    s = snap([], [dev("t", "g1", vmi="gone", template="gone"), dev("t", "g2", result=None)])
    assert kinds(inv.leftovers(s)) == [inv.ATTACHED_TO_GONE, inv.NO_RESULT, inv.TEMPLATE_ORPHAN]


def test_final_check_finds_a_launcher_off_its_pin_and_an_admitted_vmi_gone():
    s = snap([vmi("t", "a", ["g1"])], [dev("t", "g1", vmi="a")], pods={"u1": ""})
    got = inv.check(s, settled={("t", "a"), ("t", "b")}, final=True)
    assert kinds(got) == [inv.ADMITTED_GONE, inv.LAUNCHER_OFF_PIN]
    assert all(v.kind in inv.LOST_KINDS for v in got)


def test_tally_counts_each_breakage_once():
    t = inv.Tally()
    v = inv.Violation(inv.NODE_OVER, ("Node", "", "n1", "r"), "x")
    assert t.add([v]) == [v] and t.add([v]) == []
    assert t.samples == 2 and t.by_kind() == {inv.NODE_OVER: 1}


def test_DR6_a_device_on_two_bound_records_is_a_violation_and_device_mode_classes_are_no_resource():
    rec = {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-vfio-3"}
    a, b = dev("t", "g1", cls="hgx", rid=None), dev("u", "g2", cls="hgx", rid=None)
    a["status"]["device"] = b["status"]["device"] = rec
    s = snap([], [a, b])  # class "hgx" names no resource: not counted against "r"
    got = inv.check(s)
    assert kinds(got) == [inv.DOUBLE_RECORDED] and got[0].item == "3b.DR6"
    assert got[0].obj == ("Device", "", "gpu.nvidia.com/n1/gpu-vfio-3")
    assert got[0].message == "recorded by 2 Bound GPUDevices: t/g1, u/g2"
    b["status"]["device"] = dict(rec, device="gpu-vfio-4")
    assert inv.check(s) == []


@pytest.mark.anyio
async def test_a_list_answered_429_is_retried_and_another_error_is_not():
    """The API server answers 429 "storage is (re)initializing" while a chart upgrade rebuilds
    a CRD's storage (CI saw test_upgrade's invariant sampler fail on it): `_listed` retries
    a 429 and returns the answer; any other error is raised at once."""
    from kubernetes_asyncio.client import ApiException

    answers = [ApiException(status=429, reason="Too Many Requests"),
               ApiException(status=429, reason="Too Many Requests"), {"items": [1]}]
    calls = []

    async def call(*args, **kw):
        calls.append((args, kw))
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    assert await inv._listed(call, "g", "v", "gpudevices", _request_timeout=5) == {"items": [1]}
    assert calls == [(("g", "v", "gpudevices"), {"_request_timeout": 5})] * 3
    answers[:] = [ApiException(status=403, reason="Forbidden")]
    with pytest.raises(ApiException) as err:
        await inv._listed(call)
    assert err.value.status == 403 and len(calls) == 4
