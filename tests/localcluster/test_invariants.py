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


# --- §3c P6 over nominations ------------------------------------------------------------------

from datetime import datetime, timedelta, timezone  # noqa: E402

AT = datetime(2026, 12, 6, 12, tzinfo=timezone.utc)


def nomination(preemptor=("p", "big"), node="n1", *, units=(("r", 2),), devices=(),
               victims=(("t", "a", None),), expires=AT + timedelta(minutes=2)):
    """A GPUNomination as the API returns it (controller namespace)."""
    return {"metadata": {"namespace": "cozy-system", "name": f"{preemptor[0]}.{preemptor[1]}"},
            "spec": {"preemptor": {"namespace": preemptor[0], "vmi": preemptor[1], "priority": 1000},
                     "node": node, "units": [{"resource": r, "count": c} for r, c in units],
                     "devices": [{"driver": "gpu.nvidia.com", "pool": node, "device": d} for d in devices],
                     "victims": [dict({"namespace": ns, "vmi": v, "priority": 0,
                                       "started": "2026-12-06T10:00:00Z"}, **({"admission": adm} if adm else {}))
                                 for ns, v, adm in victims],
                     "created": "2026-12-06T12:00:00Z", "expires": expires.isoformat()}}


def p6_snap(devices, *, noms=(), alloc=4, vmis=(), late=()):
    return inv.Snapshot(vmis=list(vmis), devices=list(devices), resource={"c": "r"},
                        allocatable={"n1": {"r": alloc}}, budget={}, nominations=list(noms),
                        late_nominations=list(late), at=AT)


def test_P6_nominated_units_bound_for_nobody_else():
    # n1 (4): set o holds 2, victim a holds 2; the preemptor is promised 2: a's room
    o = [dev("u", "o1", vmi="o"), dev("u", "o2", vmi="o")]
    victim = [dev("t", "a1", vmi="a"), dev("t", "a2", vmi="a")]
    assert inv.check_nominations(p6_snap(o + victim, noms=[nomination()])) == []
    # the victim gone, the preemptor landed (one template device, one held): still fine
    landed = [dev("p", "b1", vmi="big"), dev("p", "big-c-0", template="big")]
    assert inv.check_nominations(p6_snap(o + landed, noms=[nomination()])) == []
    # another set took one of the nominated units once the victim left: a violation
    taken = p6_snap(o + [dev("q", "x1", vmi="x")], noms=[nomination()])
    got = inv.check_nominations(taken)
    assert kinds(got) == [inv.NOMINATED_TAKEN] and got[0].item == "3c.P6"
    assert got[0].obj == ("Node", "", "n1", "r") and "p/big" in got[0].message
    # an idle device Bound there is another set's too
    assert kinds(inv.check_nominations(p6_snap(o + [dev("q", "x1", rid=None)], noms=[nomination()]))) == [
        inv.NOMINATED_TAKEN]
    # an expired nomination (or one about to expire: the binder's clock is not ours) holds nothing
    for expires in (AT - timedelta(seconds=1), AT + inv.LIVE_SLACK):
        assert inv.check_nominations(p6_snap(o + [dev("q", "x1", vmi="x")],
                                             noms=[nomination(expires=expires)])) == []
    # two nominations on the node add up
    both = [nomination(), nomination(("p", "other"), victims=[("u", "o", None)])]
    assert inv.check_nominations(p6_snap(o + victim, noms=both)) == []
    assert kinds(inv.check_nominations(p6_snap(o + victim + [dev("q", "x1", vmi="x")], noms=both))) == [
        inv.NOMINATED_TAKEN]
    # a victim named with its admission: its VMI created again (another admission) and placed
    # on the nominated room is another set
    again = [dev("t", "a3", vmi="a"), dev("t", "a4", vmi="a")]
    for d in again:
        d["status"]["attachedTo"]["admission"] = "adm-2"
    assert inv.check_nominations(p6_snap(o + again, noms=[nomination()])) == []  # no admission named
    assert kinds(inv.check_nominations(p6_snap(o + again, noms=[nomination(victims=[("t", "a", "adm-1")])]))) == [
        inv.NOMINATED_TAKEN]


def test_P6_a_nomination_whose_preemptor_is_admitted_or_stopped_holds_nothing():
    """The hold counts nothing once the preemptor's set is Bound, on its node or on another
    (docs/contract.md P4), nor once the preemptor is itself a victim of a later nomination
    (spent). The priorities soak counted both until the leader deleted the nomination (up to a
    preemption round later: 87 s in one run) and read them as nominated-room-taken."""
    o = [dev("u", f"o{i}", vmi="o") for i in range(3)]
    # n1 (4): 3 of another set, the preemptor admitted on another node (room came free there
    # first); a fourth set took the victim's room meanwhile: nobody's room was promised
    elsewhere = dev("p", "b1", vmi="big", node="n2")
    stale = nomination(units=(("r", 1),))
    assert inv.check_nominations(p6_snap(o + [elsewhere, dev("q", "x1", vmi="x")], noms=[stale])) == []
    # not yet Succeeded there (a request in flight): the nomination still holds
    pending = dev("p", "b1", vmi="big", node="n2", result=None)
    assert kinds(inv.check_nominations(p6_snap(o + [pending, dev("q", "x1", vmi="x")], noms=[stale]))) == [
        inv.NOMINATED_TAKEN]
    # a second nomination made on the same victim's room once the first preemptor landed
    # elsewhere: one holder of the one unit, not two
    second = nomination(("p", "other"), units=(("r", 1),))
    victim = [dev("t", "a1", vmi="a")]
    assert inv.check_nominations(p6_snap(o + victim + [elsewhere], noms=[stale, second])) == []
    assert kinds(inv.check_nominations(p6_snap(o + victim, noms=[stale, second]))) == [inv.NOMINATED_TAKEN]
    # spent: the preemptor was admitted on its room, then named the victim of a later
    # nomination and stopped (its set gone); the first nomination, not yet deleted, holds
    # nothing: 1 other + the later's 2 fit n1 (4), with the first's 2 they would not
    first = nomination()
    later = nomination(("p", "top"), victims=[("p", "big", None)])
    later["spec"]["created"] = "2026-12-06T12:01:00Z"
    one = [dev("q", "x1", vmi="x")]
    assert inv.check_nominations(p6_snap(one, noms=[first, later])) == []
    # ... while the later one holds its 2: a third other set on them is taken
    three = one + [dev("q", "x2", vmi="x"), dev("q", "x3", vmi="x")]
    assert kinds(inv.check_nominations(p6_snap(three, noms=[first, later]))) == [inv.NOMINATED_TAKEN]
    # a nomination made after the one naming its preemptor (its VMI created again, refused,
    # nominated anew) is not spent by it: 1 + 2 + 2 > 4
    again = nomination(victims=[("t", "a", None)])
    again["spec"]["created"] = "2026-12-06T12:02:00Z"
    assert kinds(inv.check_nominations(p6_snap(one, noms=[again, later]))) == [inv.NOMINATED_TAKEN]


def test_P6_nominated_devices_recorded_by_nobody_else():
    def rec(d, device):
        d["status"]["device"] = {"driver": "gpu.nvidia.com", "pool": "n1", "device": device}
        return d

    n = nomination(units=(), devices=("gpu-vfio-0", "gpu-vfio-1"))
    victim = rec(dev("t", "a1", cls="hgx", vmi="a"), "gpu-vfio-0")
    assert inv.check_nominations(p6_snap([victim, rec(dev("p", "b1", cls="hgx", vmi="big"), "gpu-vfio-1")],
                                         noms=[n])) == []
    got = inv.check_nominations(p6_snap([victim, rec(dev("q", "x1", cls="hgx", vmi="x"), "gpu-vfio-1")],
                                        noms=[n]))
    assert kinds(got) == [inv.NOMINATED_TAKEN]
    assert got[0].obj == ("Device", "", "gpu.nvidia.com/n1/gpu-vfio-1") and "q/x1" in got[0].message
    # another device of the node is anybody's
    assert inv.check_nominations(p6_snap([victim, rec(dev("q", "x1", cls="hgx", vmi="x"), "gpu-vfio-5")],
                                         noms=[n])) == []


def test_P6_device_mode_nominations_are_judged_by_their_devices_and_moves_are_leaving():
    """The device priorities soak flagged every device-mode nomination: its units were
    counted against the node's allocatable, which lists no DRA devices ("0 Bound for other
    sets + 8 nominated > allocatable 0"); and a nominated device still recorded by the idle
    held device the plan moves off (D-moves) as another set's."""
    def rec(d, device):
        d["status"]["device"] = {"driver": "gpu.nvidia.com", "pool": "n1", "device": device}
        return d

    n = nomination(units=(("r", 2),), devices=("gpu-vfio-0", "gpu-vfio-1"), victims=())
    assert inv.check_nominations(p6_snap([], noms=[n], alloc=0)) == []
    held = rec(dev("t", "held-0", cls="hgx", rid=None), "gpu-vfio-0")
    got = inv.check_nominations(p6_snap([held], noms=[n], alloc=0))
    assert [v.obj for v in got] == [("Device", "", "gpu.nvidia.com/n1/gpu-vfio-0")]
    n["spec"]["moves"] = [{"namespace": "t", "name": "held-0", "class": "hgx", "resource": "r",
                           "fromNode": "n1", "toNode": "n2",
                           "fromDevice": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-vfio-0"},
                           "toDevice": {"driver": "gpu.nvidia.com", "pool": "n2", "device": "gpu-vfio-4"}}]
    assert inv.check_nominations(p6_snap([held], noms=[n], alloc=0)) == []


def test_P6_no_vmi_of_ours_gone_unless_deleted_by_the_caller_or_a_victim():
    known = {("t", "a"), ("t", "b"), ("t", "c"), ("t", "d")}
    s = p6_snap([], vmis=[vmi("t", "d", ["g1"])], noms=[nomination(victims=[("t", "a", None)])],
                late=[nomination(("p", "other"), victims=[("t", "e", None)])])
    got = inv.check_gone(s, known, deleted={("t", "b")})
    assert kinds(got) == [inv.STOPPED_NOT_VICTIM] and got[0].obj == ("VirtualMachineInstance", "t", "c")
    assert got[0].item == "3c.P6"
    # a victim of a nomination seen in an earlier read (deleted since: its preemptor landed)
    assert inv.check_gone(s, known, deleted={("t", "b")}, victims={("t", "c")}) == []
    assert inv.victims_of(s.nominations + s.late_nominations) == {("t", "a"), ("t", "e")}


def test_P6_a_victim_being_stopped_is_not_an_admitted_vmi_lost():
    s = p6_snap([dev("t", "g1", vmi="a", phase="Pending", result=None)], vmis=[vmi("t", "a", ["g1"])],
                noms=[nomination(victims=[("t", "a", None)])])
    assert inv.check(s, settled={("t", "a")}) == []
    gone = p6_snap([], noms=[])
    assert kinds(inv.check(gone, settled={("t", "a")}, final=True)) == [inv.ADMITTED_GONE]
    assert inv.check(gone, settled={("t", "a")}, final=True, victims={("t", "a")}) == []


def test_within_keeps_the_nominations_of_the_prefix():
    s = p6_snap([], noms=[nomination(("soak-1", "x"), victims=()), nomination(("other", "y"), victims=()),
                          nomination(("other", "z"), victims=[("soak-2", "v", None)])])
    assert [n["spec"]["preemptor"]["vmi"] for n in s.within("soak-").nominations] == ["x", "z"]
    assert s.within("soak-").at == AT


def test_the_soak_judges_P6_with_the_victims_it_has_seen():
    from bench.soak.driver import judge

    before = {("t", "a"), ("t", "b")}
    first = p6_snap([dev("t", "g1", vmi="a")], vmis=[vmi("t", "a", ["g1"]), vmi("t", "b", ["g2"], uid="u2")],
                    noms=[nomination(victims=[("t", "b", None)])])
    got, seen = judge(first, before, before, set(), set())
    assert set(seen) == {("t", "b")} and inv.NOMINATED_TAKEN not in kinds(got)
    # b is gone by the next read, and its nomination too: excused by what was seen
    later = p6_snap([dev("t", "g1", vmi="a")], vmis=[vmi("t", "a", ["g1"])])
    got, _ = judge(later, before, before, set(), seen)
    assert got == []
    got, _ = judge(later, before, before, set(), set())
    assert kinds(got) == [inv.STOPPED_NOT_VICTIM]
    assert judge(later, before, before, {("t", "b")}, set())[0] == []  # the soak deleted it


@pytest.mark.anyio
async def test_nominations_are_none_where_the_API_has_no_such_resource():
    """A chart older than §3c (the upgrade tests install one first) has no GPUNomination CRD:
    its list answers 404, read as no nomination; another error is raised."""
    from kubernetes_asyncio.client import ApiException

    async def missing(*args, **kw):
        raise ApiException(status=404, reason="Not Found")

    async def listed(*args, **kw):
        assert args == (inv.GROUP, inv.VERSION, "gpunominations")
        return {"items": [nomination()]}

    async def forbidden(*args, **kw):
        raise ApiException(status=403, reason="Forbidden")

    assert await inv._nominations(missing) == []
    assert await inv._nominations(listed) == [nomination()]
    with pytest.raises(ApiException):
        await inv._nominations(forbidden)


# --- §3c P6: no lower-priority start on room a waiting higher-priority set could use --------

T0 = datetime(2026, 12, 7, 14, tzinfo=timezone.utc)
OLD = T0 - timedelta(minutes=10)


def started(ns, vmi_name, node, n, *, priority=100, requested=T0, bound=None, adm="adm-1"):
    """The `n` template devices of VMI `ns/vmi_name` admitted (Bound, Succeeded) on `node`,
    its request (recorded `priority`) made at `requested`, Bound at `bound` (`requested`
    plus a second when None)."""
    out = []
    for k in range(n):
        d = dev(ns, f"{vmi_name}-c-{k}", node=node, vmi=vmi_name, template=vmi_name, rid=f"{vmi_name}-r")
        d["status"]["attachedTo"]["admission"] = adm
        d["status"]["bindRequest"].update({"priority": priority, "requestedAt": requested.isoformat()})
        d["status"]["boundAt"] = (bound or requested + timedelta(seconds=1)).isoformat()
        out.append(d)
    return out


def read(devices, started_at, *, noms=(), placeable=("n1", "n2"), budget=None):
    return inv.Snapshot(vmis=[], devices=list(devices), resource={"c": "r"},
                        allocatable={"n1": {"r": 8}, "n2": {"r": 8}}, budget=budget or {},
                        nominations=list(noms), at=started_at + timedelta(seconds=2),
                        started=started_at, placeable=frozenset(placeable))


FULL_N2 = started("u", "big", "n2", 8, priority=0, requested=OLD)
W = inv.Waiting("t", "od", "c", 8, 1000, T0 - timedelta(seconds=60))


def window(*, before=(), after=(), first=T0 - timedelta(seconds=25), **kw):
    """Two reads: one begun at `first`, n2 full, plus `before`; one 3 s after R's request,
    n2 full, R (2 GPUs, priority 100) Bound on n1, plus `after`."""
    r = started("s", "spot", "n1", 2)
    return [read([*FULL_N2, *before], first, **kw), read([*FULL_N2, *r, *after], T0 + timedelta(seconds=3), **kw)]


def test_P6_a_lower_priority_set_started_on_room_a_waiting_higher_one_could_use():
    judged: dict = {}
    got = inv.check_line_order(window(), [W], judged)
    assert kinds(got) == [inv.LINE_INVERSION] and got[0].item == "3c.P6"
    assert got[0].obj == ("VirtualMachineInstance", "s", "spot", "od")
    assert "n1" in got[0].message and "t/od" in got[0].message
    assert judged == {("s", "spot", "adm-1"): 1, ("u", "big", "adm-1"): None}
    # each set is judged once
    assert inv.check_line_order(window(), [W], judged) == []


def test_P6_line_order_clean_cases():
    def none(win, waiting=(W,)):
        judged: dict = {}
        assert inv.check_line_order(win, list(waiting), judged) == []
        return judged

    assert none(window(), ())[("s", "spot", "adm-1")] == 0                 # nobody waits
    none(window(), [inv.Waiting("t", "od", "c", 8, 100, W.since)])         # equal priority
    none(window(), [inv.Waiting("t", "od", "other", 8, 1000, W.since)])    # another class
    none(window(), [inv.Waiting("t", "od", "c", 8, 1000, T0 + timedelta(seconds=1))])  # came later
    # W fits n2 beside the sets there: R was backfill
    none([read(r.devices[8:], r.started) for r in window()])
    # a 1-GPU set on n1 in the first read (gone by the last) may have kept W out of n1
    none(window(before=started("q", "brief", "n1", 1, priority=0, requested=OLD)))
    # a nomination on n1 for another preemptor held a unit there
    held = nomination(("p", "other"), units=(("r", 1),), victims=(), expires=T0 + timedelta(minutes=2))
    none(window(noms=[held]))
    # W itself is nominated: its room is held, P6's second rule covers it
    none(window(noms=[nomination(("t", "od"), units=(("r", 8),), node="n2", victims=(),
                                 expires=T0 + timedelta(minutes=2))]))
    # W's tenant had no budget for it
    none(window(budget={("t", "r"): 4}))
    # no read begun LINE_LAG before R's request: R is not judged (and said so)
    assert none(window(first=T0 - timedelta(seconds=5)))[("s", "spot", "adm-1")] is False


def test_P6_line_order_counts_a_node_free_only_when_it_surely_was():
    # n2's sets were Bound only 5 s before R's request: the binder's view may not have had
    # them yet, so W may have fitted there in its eyes: no violation
    late = started("u", "late", "n2", 8, priority=0, requested=T0 - timedelta(seconds=6))
    wins = [read(late, T0 - timedelta(seconds=25)), read([*late, *started("s", "spot", "n1", 2)],
                                                         T0 + timedelta(seconds=3))]
    assert inv.check_line_order(wins, [W], {}) == []
    # n2 not placeable in any read (cordoned): W could use n1 only: a violation
    assert kinds(inv.check_line_order(window(placeable=("n1",)),
                                      [W], {})) == [inv.LINE_INVERSION]
    # placeable in one read of the window: counted as a place W might have gone
    wins = window()
    empty_n2 = [read(started("s", "spot", "n1", 2), T0 - timedelta(seconds=25)),
                read(started("s", "spot", "n1", 2), T0 + timedelta(seconds=3), placeable=("n1",))]
    assert inv.check_line_order(empty_n2, [W], {}) == []
    assert kinds(inv.check_line_order(wins, [W], {})) == [inv.LINE_INVERSION]


# --- the soak's P6 across reads (bench.soak.driver.P6Check) ---------------------------------

def soak_read(vmis, devices, started_at, *, noms=(), late=(), alloc=4):
    return inv.Snapshot(vmis=list(vmis), devices=list(devices), resource={"c": "r"},
                        allocatable={"n1": {"r": alloc}}, budget={}, nominations=list(noms),
                        late_nominations=list(late), at=started_at + timedelta(seconds=2),
                        started=started_at, placeable=frozenset({"n1"}))


def test_the_soak_stops_only_victims_of_a_live_nomination():
    from bench.soak.driver import P6Check

    a, b = vmi("t", "a", ["g1"]), vmi("t", "b", ["g2"], uid="u2")
    known = {("t", "a"), ("t", "b")}   # seen before; none held as admitted (§7.5 not judged here)
    live = nomination(victims=[("t", "a", None)], expires=AT + timedelta(minutes=2))
    # clean: a named a victim by a live nomination, then gone (its preemptor admitted, the
    # nomination deleted): excused, and handed back as a victim gone, once
    p6 = P6Check("t")
    got, gone = p6.read(soak_read([a, b], [], AT, noms=[live]), known, set(), set())
    assert got == [] and gone == set()
    got, gone = p6.read(soak_read([b], [], AT + timedelta(seconds=5)), known, set(), set())
    assert got == [] and gone == {("t", "a")}
    assert p6.read(soak_read([b], [], AT + timedelta(seconds=10)), known, set(), set()) == ([], set())
    assert p6.nominations[("p/big", "2026-12-06T12:00:00Z")]["victims"] == ["t/a"]
    # a victim whose every nomination had expired when it was last seen alive was stopped by
    # no live nomination: a violation
    p6 = P6Check("t")
    expired = nomination(victims=[("t", "a", None)], expires=AT - timedelta(seconds=30))
    p6.read(soak_read([a, b], [], AT, noms=[expired]), known, set(), set())
    got, gone = p6.read(soak_read([b], [], AT + timedelta(seconds=5)), known, set(), set())
    assert kinds(got) == [inv.STOPPED_NOT_VICTIM] and got[0].obj == ("VirtualMachineInstance", "t", "a")
    assert "expired" in got[0].message
    # ... unless it was being deleted since before the nomination expired (its grace period)
    p6 = P6Check("t")
    p6.read(soak_read([a, b], [], AT - timedelta(minutes=1)), known, set(), set())
    dying = {**a, "metadata": {**a["metadata"], "deletionTimestamp": "2026-12-06T11:59:10Z"}}
    p6.read(soak_read([dying, b], [], AT, noms=[expired]), known, set(), set())
    assert p6.read(soak_read([b], [], AT + timedelta(seconds=5)), known, set(), set())[0] == []
    # a nomination seen only by the watch (made and deleted between two reads) excuses too
    p6 = P6Check("t")
    p6.read(soak_read([a, b], [], AT), known, set(), set())
    p6.note_nomination(live)
    assert p6.read(soak_read([b], [], AT + timedelta(seconds=5)), known, set(), set()) == ([], {("t", "a")})
    # nobody named b: a violation; the soak's own delete is none
    got, _ = p6.read(soak_read([], [], AT + timedelta(seconds=10)), known, set(), set())
    assert kinds(got) == [inv.STOPPED_NOT_VICTIM] and got[0].obj[2] == "b"
    assert P6Check("t").read(soak_read([], [], AT), {("t", "b")}, set(), {("t", "b")})[0] == []


def test_the_soak_flags_each_P6_violation_and_passes_a_clean_run():
    """The three invariants on one soak's reads (`P6Check` with the line): a clean run, then
    a victim stopped with no live nomination, a nominated unit Bound for another set, and a
    lower-priority set started on room a waiting higher-priority set could use."""
    from bench.soak.driver import P6Check

    def run(reads, known=frozenset(), waiting=()):
        p6 = P6Check("", line=True)
        p6.waiting = {(w.namespace, w.vmi): w for w in waiting}
        out = []
        for r in reads:
            out += p6.read(r, set(known), set(known), set())[0]
        return kinds(out)

    wins = window()
    assert run(wins) == []                                                          # clean
    assert run(wins, waiting=[W]) == [inv.LINE_INVERSION]                          # rule 3
    a = vmi("t", "a", ["g1"])
    expired = nomination(victims=[("t", "a", None)], expires=T0 - timedelta(minutes=1))
    gone = [read([], T0 - timedelta(seconds=10)), read([], T0)]
    gone[0].vmis.append(a)
    gone[0].nominations.append(expired)
    assert run(gone, known={("t", "a")}) == [inv.STOPPED_NOT_VICTIM]                 # rule 1
    held = nomination(("p", "big"), node="n1", units=(("r", 8),), victims=(),
                      expires=T0 + timedelta(minutes=2))
    taken = [read(started("q", "x", "n1", 1, priority=0), T0, noms=[held])]
    assert run(taken) == [inv.NOMINATED_TAKEN]                                       # rule 2


def test_a_node_is_placeable_when_uncordoned_ready_and_untainted():
    from kubernetes_asyncio.client import (V1Node, V1NodeCondition, V1NodeSpec, V1NodeStatus,
                                           V1ObjectMeta, V1Taint)

    def node(*, cordoned=False, ready="True", taints=()):
        return V1Node(metadata=V1ObjectMeta(name="n"),
                      spec=V1NodeSpec(unschedulable=cordoned, taints=list(taints) or None),
                      status=V1NodeStatus(conditions=[V1NodeCondition(type="Ready", status=ready)]))

    assert inv._placeable(node())
    assert not inv._placeable(node(cordoned=True))
    assert not inv._placeable(node(ready="False"))
    assert not inv._placeable(node(taints=[V1Taint(key="gpu.example.com/reserved", effect="NoSchedule")]))
    assert inv._placeable(node(taints=[V1Taint(key="x", effect="PreferNoSchedule")]))
    assert not inv._placeable(V1Node(metadata=V1ObjectMeta(name="n"), spec=V1NodeSpec()))  # no Ready


def test_the_soak_never_judges_a_preemptor_its_watch_saw_as_a_lower_priority_start():
    """A nomination made and deleted between two reads (its victims gone within seconds, its
    preemptor admitted, the nomination dropped) is in no read's list, only in what the soak's
    watch noted: its preemptor started on room held for it, as one listed in a read would."""
    from bench.soak.driver import P6Check

    first, last = window()
    p6 = P6Check("", line=True)
    p6.waiting[("t", "od")] = W
    p6.window.append(inv.line_read(first))
    assert kinds(p6._line_order(last)) == [inv.LINE_INVERSION]   # nobody said R preempted
    p6 = P6Check("", line=True)
    p6.waiting[("t", "od")] = W
    p6.window.append(inv.line_read(first))
    p6.note_nomination(nomination(("s", "spot"), units=(("r", 2),), victims=(("u", "x", None),),
                                  expires=T0 + timedelta(minutes=2)))
    assert p6._line_order(last) == []
    assert p6.judged[("s", "spot", "adm-1")] == 1


# --- §3c P6 line order in device mode (DR3's groups) ------------------------------------------

from localcluster.dra_profiles import DRIVER, HGX_H100_8, device_class, resource_slice  # noqa: E402
from localcluster.dra_world import HGX_CLASS  # noqa: E402

HGX = {"metadata": {"name": "hgx"}, "spec": HGX_CLASS.spec()}
"""A device-mode GPUClass of whole Fabric Manager partitions (partition{size}): on an HGX H100
board of `dra_profiles`, gpu-vfio-0..3 are one 4-GPU partition, gpu-vfio-4..7 the other."""
DW = inv.Waiting("t", "od", "hgx", 4, 1000, T0 - timedelta(seconds=60))
NOT_SERVED = object()


def dstarted(ns, vmi_name, node, gpus, *, priority=100, requested=T0, adm="adm-1"):
    """`started`, of class hgx, member k recording gpu-vfio-`gpus[k]` on `node`."""
    out = started(ns, vmi_name, node, len(gpus), priority=priority, requested=requested, adm=adm)
    for d, i in zip(out, gpus):
        d["spec"]["class"] = "hgx"
        d["status"]["device"] = {"driver": DRIVER, "pool": node, "device": f"gpu-vfio-{i}"}
        d["metadata"]["resourceVersion"] = "7"
    return out


def taint_rule(name, pool, *, generation=1, made=OLD):
    return {"metadata": {"name": name, "creationTimestamp": made.isoformat(), "generation": generation},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": pool},
                     "taint": {"key": "gpu.example.com/soak", "effect": "NoSchedule"}}}


def dread(devices, started_at, *, rules=(), taints=None, dra=True, placeable=("n1", "n2")):
    """A read of two HGX boards n1, n2 (n1's slice with `taints` by GPU index)."""
    got = inv.DraRead(classes=(HGX,), device_classes=(device_class(),),
                      slices=(resource_slice("n1", HGX_H100_8, taints=taints),
                              resource_slice("n2", HGX_H100_8)),
                      claims=(), rules=None if rules is NOT_SERVED else tuple(rules))
    return inv.Snapshot(vmis=[], devices=list(devices), resource={}, allocatable={}, budget={},
                        at=started_at + timedelta(seconds=2), started=started_at,
                        placeable=frozenset(placeable), dra=got if dra else None)


D_FULL_N2 = dstarted("u", "big", "n2", range(8), priority=0, requested=OLD)
R1 = ("s", "spot", "adm-1")


def dwindow(n1_before, *, r_gpus=(0,), first_kw=None, **kw):
    """Two reads: one begun 25 s before R's request, n2 full, n1 holding `n1_before`; one 3 s
    after it, the same plus R (1 GPU, priority 100) Bound on n1's gpu-vfio-`r_gpus`."""
    r = dstarted("s", "spot", "n1", r_gpus)
    return [dread([*D_FULL_N2, *n1_before], T0 - timedelta(seconds=25), **(first_kw or kw)),
            dread([*D_FULL_N2, *n1_before, *r], T0 + timedelta(seconds=3), **kw)]


QUAD_2 = dstarted("u", "other", "n1", (4, 5, 6, 7), priority=0, requested=OLD)


def test_P6_device_mode_a_lower_priority_set_started_on_the_only_free_partition():
    # n1: gpu-vfio-4..7 taken, 0..3 (one 4-GPU partition) free; R (1 GPU) starts on gpu-vfio-0:
    # W (4 GPUs, waiting above it) could have taken that partition and fits nowhere after
    judged: dict = {}
    got = inv.check_line_order(dwindow(QUAD_2), [DW], judged)
    assert kinds(got) == [inv.LINE_INVERSION] and got[0].item == "3c.P6"
    assert got[0].obj == ("VirtualMachineInstance", "s", "spot", "od")
    assert "n1" in got[0].message and "t/od" in got[0].message and "partition" in got[0].message
    assert judged[R1] == 1
    assert inv.check_line_order(dwindow(QUAD_2), [DW], judged) == []   # judged once


def test_P6_device_mode_free_gpus_split_across_partitions_are_no_room():
    # n1: pairs gpu-vfio-{0,3} and {5,7} taken: 4 free (1, 2 | 4, 6) but no 4-GPU partition
    # whole; R takes gpu-vfio-1: W could not have started on n1 (DR3), no violation, judged
    split = [*dstarted("u", "a", "n1", (0, 3), priority=0, requested=OLD),
             *dstarted("u", "b", "n1", (5, 7), priority=0, requested=OLD)]
    judged: dict = {}
    assert inv.check_line_order(dwindow(split, r_gpus=(1,)), [DW], judged) == []
    assert judged[R1] == 1
    # the same room whole (gpu-vfio-4..7 taken) is a violation: the group decides, not the count
    assert kinds(inv.check_line_order(dwindow(QUAD_2), [DW], {})) == [inv.LINE_INVERSION]


def test_P6_device_mode_backfill_and_held_room_are_no_violation():
    def judged_clean(win):
        judged: dict = {}
        assert inv.check_line_order(win, [DW], judged) == []
        return judged[R1]

    # n2 keeps one whole partition free (gpu-vfio-0..3 taken): W fits there, R was backfill
    half_n2 = dstarted("u", "big", "n2", (0, 1, 2, 3), priority=0, requested=OLD)
    r = dstarted("s", "spot", "n1", (0,))
    assert judged_clean([dread([*half_n2, *QUAD_2], T0 - timedelta(seconds=25)),
                         dread([*half_n2, *QUAD_2, *r], T0 + timedelta(seconds=3))]) == 1
    # ... but n2 placeable in no read (cordoned): W fits nowhere else: a violation
    assert kinds(inv.check_line_order(
        [dread([*half_n2, *QUAD_2], T0 - timedelta(seconds=25), placeable=("n1",)),
         dread([*half_n2, *QUAD_2, *r], T0 + timedelta(seconds=3), placeable=("n1",))],
        [DW], {})) == [inv.LINE_INVERSION]
    # a nomination of gpu-vfio-3 on n1 for another preemptor held a device of the partition
    held = nomination(("p", "other"), units=(), devices=("gpu-vfio-3",), victims=(),
                      expires=T0 + timedelta(minutes=2))
    win = dwindow(QUAD_2)
    win[0].nominations.append(held)
    assert judged_clean(win) == 1


def test_P6_device_mode_counts_taints_only_where_certain():
    # a slice taint on gpu-vfio-2 in the first read: the binder may have seen partition 1
    # broken: W may not have fitted n1: no violation (judged)
    judged: dict = {}
    assert inv.check_line_order(dwindow(QUAD_2, first_kw={"taints": {2: [
        {"key": "k", "value": "", "effect": "NoExecute"}]}}), [DW], judged) == []
    assert judged[R1] == 1
    # n2 empty but all under a DeviceTaintRule in force since long before: W fits nowhere
    n2_empty = [dread(QUAD_2, T0 - timedelta(seconds=25), rules=[taint_rule("sick", "n2")]),
                dread([*QUAD_2, *dstarted("s", "spot", "n1", (0,))], T0 + timedelta(seconds=3),
                      rules=[taint_rule("sick", "n2")])]
    assert kinds(inv.check_line_order(n2_empty, [DW], {})) == [inv.LINE_INVERSION]
    # the rule changed since (generation 2) or made only 5 s before R's request: n2 may have
    # been free in the binder's eyes: R was backfill as far as the reads can tell
    for rule in (taint_rule("sick", "n2", generation=2),
                 taint_rule("sick", "n2", made=T0 - timedelta(seconds=5))):
        wins = [dread(QUAD_2, T0 - timedelta(seconds=25), rules=[rule]),
                dread([*QUAD_2, *dstarted("s", "spot", "n1", (0,))], T0 + timedelta(seconds=3),
                      rules=[rule])]
        assert inv.check_line_order(wins, [DW], {}) == []


def test_P6_device_mode_not_judged_without_what_the_reads_need():
    # DeviceTaintRules not served (the binder's health marks out of sight), or no DRA read:
    # R is not judged (False), never flagged
    for win in (dwindow(QUAD_2, rules=NOT_SERVED), dwindow(QUAD_2, dra=False)):
        judged: dict = {}
        assert inv.check_line_order(win, [DW], judged) == []
        assert judged[R1] is False
    # nobody waits above R: judged against none, whatever the reads hold
    judged = {}
    assert inv.check_line_order(dwindow(QUAD_2, dra=False), [], judged) == [] and judged[R1] == 0


@pytest.mark.anyio
async def test_the_DRA_read_keeps_device_mode_classes_and_reads_no_rules_where_not_served():
    """`snapshot(..., dra=True)`'s read of device mode: the device-mode GPUClasses of those
    listed, the DeviceClasses, slices, claims (every namespace) and DeviceTaintRules; rules
    answered 404 (not served) read as None (which devices are tainted is then unknown)."""
    from kubernetes_asyncio.client import ApiException

    count_class = {"metadata": {"name": "c"}, "spec": {"resourceName": "r"}}
    served = {"deviceclasses": [device_class()], "resourceslices": [resource_slice("n1", HGX_H100_8)],
              "resourceclaims": [{"metadata": {"namespace": "t", "name": "x"}}],
              "devicetaintrules": [taint_rule("sick", "n1")]}
    asked = []

    async def listed(group, version, plural, **kw):
        asked.append((group, version, plural))
        if plural not in served:
            raise ApiException(status=404, reason="Not Found")
        return {"items": served[plural]}

    got = await inv._dra_read(listed, [count_class, HGX], _request_timeout=5)
    assert got == inv.DraRead((HGX,), (device_class(),), (resource_slice("n1", HGX_H100_8),),
                              ({"metadata": {"namespace": "t", "name": "x"}},), (taint_rule("sick", "n1"),))
    assert asked[-1] == ("resource.k8s.io", "v1beta2", "devicetaintrules")
    del served["devicetaintrules"]
    assert (await inv._dra_read(listed, [HGX])).rules is None
    served.pop("resourceslices")
    with pytest.raises(ApiException):
        await inv._dra_read(listed, [HGX])
