"""The incremental housekeeping plan (`model.housekeeping_index`) equals the full plan
(`model.housekeeping.plan` over every device) round after round, on random sequences of
changes: devices put and deleted, VMIs created and deleted (tombstones), VirtualMachines,
nominations' victims, keeps, time passing; only what changed is told to it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model.housekeeping import ClearAttachment, VMIRecord, VMIs, VMRecord, plan
from model.housekeeping_index import Incremental, PlanIndex, group_of
from model.housekeeping_reasons import Rule, VmiDeleted
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
GRACE = timedelta(seconds=120)
WINDOW = timedelta(seconds=10)
NAMES = ("vm0", "vm1", "vm2", "vm3")
ADMS = ("a0", "a1", "a2", "a3", "a4")
NS = ("t1", "t2")


def _device(ns, name, cls, attached, vmi, adm, uid_k, owner, kept_s, since_s, template,
            request, created_s, now) -> GPUDevice:
    att = None
    br = None
    if attached:
        att = Attachment(vmi, now - timedelta(seconds=since_s), adm,
                         None if uid_k is None else f"{vmi}#{uid_k}",
                         f"owner-{vmi}" if owner else None,
                         None if kept_s is None else now + timedelta(seconds=kept_s))
        if request is not None:
            br = BindRequest(adm or "x", vmi, (name,),
                             requested_at=now - timedelta(seconds=request[1]),
                             result=Result.REFUSED if request[0] else Result.SUCCEEDED,
                             node="n1")
    status = DeviceStatus(Phase.BOUND if attached or template else Phase.PENDING,
                          "n1" if attached or template else None, attached_to=att,
                          bind_request=br)
    return GPUDevice(ns, name, cls, template_for=vmi if template else None, status=status,
                     uid=f"uid-{name}", created_at=now - timedelta(seconds=created_s))


device_args = st.tuples(
    st.sampled_from(NS), st.sampled_from([f"d{i}" for i in range(8)]),
    st.sampled_from(["c0", "c1"]), st.booleans(), st.sampled_from(NAMES),
    st.sampled_from((None, *ADMS)), st.sampled_from((None, 0, 1)), st.booleans(),
    st.sampled_from((None, -30, 60, 300)), st.sampled_from((0, 5, 100, 119, 200)),
    st.booleans(), st.one_of(st.none(), st.tuples(st.booleans(), st.sampled_from((0, 5, 20)))),
    st.sampled_from((0, 100, 500)))

change = st.one_of(
    st.tuples(st.just("device"), device_args),
    st.tuples(st.just("device"), device_args),
    st.tuples(st.just("drop"), st.tuples(st.sampled_from(NS), st.sampled_from([f"d{i}" for i in range(8)]))),
    st.tuples(st.just("vmi"), st.tuples(st.sampled_from(NS), st.sampled_from(NAMES),
                                        st.sampled_from((0, 1)), st.sampled_from((None, *ADMS)))),
    st.tuples(st.just("vmi"), st.tuples(st.sampled_from(NS), st.sampled_from(NAMES),
                                        st.sampled_from((0, 1)), st.sampled_from((None, *ADMS)))),
    st.tuples(st.just("novmi"), st.tuples(st.sampled_from(NS), st.sampled_from(NAMES))),
    st.tuples(st.just("novmi"), st.tuples(st.sampled_from(NS), st.sampled_from(NAMES))),
    st.tuples(st.just("vm"), st.tuples(st.sampled_from(NS), st.sampled_from(NAMES),
                                       st.booleans(), st.booleans())),
    st.tuples(st.just("novm"), st.tuples(st.sampled_from(NS), st.sampled_from(NAMES))),
    st.tuples(st.just("yield"), st.frozensets(st.tuples(st.sampled_from(NS), st.sampled_from(NAMES)),
                                              max_size=2)),
    st.tuples(st.just("time"), st.sampled_from((0, 1, 5, 10, 20, 30, 60, 119, 120, 121, 400))),
    st.tuples(st.just("time"), st.sampled_from((0, 1, 5, 10, 20, 30, 60, 119, 120, 121, 400))),
    # a tombstone made or forgotten with no VMI event of the name (the cache prunes old ones)
    st.tuples(st.just("tomb"), st.tuples(st.sampled_from(NS), st.sampled_from(ADMS))),
    st.tuples(st.just("forget"), st.tuples(st.sampled_from(NS), st.sampled_from(ADMS))),
)
rare = st.one_of(
    st.tuples(st.just("keeps"), st.sampled_from(({}, {"c0": timedelta(minutes=5)},
                                                 {"c0": timedelta(minutes=5), "c1": timedelta(minutes=1)}))),
    st.tuples(st.just("vms_known"), st.booleans()),
    st.tuples(st.just("round"), st.just(True)),   # a full round (the safety net)
)
batch = st.tuples(st.lists(change, max_size=3), st.lists(rare, max_size=1))
"""The changes between two rounds: up to three ordinary ones, rarely one that makes the
next round judge every set."""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(st.lists(device_args, min_size=1, max_size=6), st.booleans()),
       st.lists(batch, max_size=25))
def test_the_incremental_plan_equals_the_full_plan_after_any_changes(start, batches):
    now = T0
    devices: dict = {}
    live: dict = {}
    deleted: set = set()
    vms: dict = {}
    yielded: frozenset = frozenset()
    keeps: dict = {}
    vms_known = True
    inc = Incremental()
    changed: set | None = None  # the first round: not known
    names: set = set()
    rounds = 0
    steps = [("device", a) for a in start[0]]
    if start[1]:  # VMIs and VMs for every name at first, uid #0, their devices' admissions
        steps += [("vmi", (ns, n, 0, next((a[5] for a in start[0] if a[0] == ns and a[4] == n), None)))
                  for ns in NS for n in NAMES]
        steps += [("vm", (ns, n, True, False)) for ns in NS for n in NAMES]
    steps.append(("round", False))
    for changes, rarely in batches:
        steps += [*changes, *rarely, ("round", False)]
    for kind, arg in steps:
        if kind == "device":
            d = _device(*arg, now=now)
            devices[d.key] = d
            if changed is not None:
                changed.add(d.key)
        elif kind == "drop":
            devices.pop(arg, None)
            if changed is not None:
                changed.add(arg)
        elif kind == "vmi":
            ns, name, k, adm = arg
            old = live.get((ns, name))
            if old is not None and old.uid != f"{name}#{k}" and old.admission:
                deleted.add((ns, old.admission))
            live[(ns, name)] = VMIRecord(ns, name, f"{name}#{k}", adm)
            names.add((ns, name))
        elif kind == "novmi":
            old = live.pop(arg, None)
            if old is not None and old.admission:
                deleted.add((arg[0], old.admission))
            names.add(arg)
        elif kind == "tomb":
            deleted.add(arg)
        elif kind == "forget":
            deleted.discard(arg)
        elif kind == "vm":
            ns, name, same, deleting = arg
            vms[(ns, name)] = VMRecord(ns, name, f"owner-{name}" if same else "other", "Always", deleting)
            names.add((ns, name))
        elif kind == "novm":
            vms.pop(arg, None)
            names.add(arg)
        elif kind == "yield":
            yielded = arg
        elif kind == "time":
            now += timedelta(seconds=arg)
        elif kind == "keeps":
            keeps = dict(arg)
        elif kind == "vms_known":
            vms_known = arg
        elif kind == "round":
            vmis = VMIs(dict(live), frozenset(deleted))
            known = vms if vms_known else None
            want = plan(devices.values(), vmis, now, GRACE, WINDOW, keeps=keeps, vms=known,
                        yielded=yielded)
            got = inc.plan_round(dict(devices), None if arg else changed, names, vmis, now,
                                 GRACE, WINDOW, keeps=keeps, vms=known, yielded=yielded)
            assert [repr(a) for a in got] == [repr(a) for a in want]
            changed, names = set(), set()
            rounds += 1


def _attached(name, vmi, adm, uid=None):
    return GPUDevice("t", name, "h100", status=DeviceStatus(
        Phase.BOUND, "n1", attached_to=Attachment(vmi, T0 - timedelta(hours=1), adm, uid)))


def test_a_quiet_round_judges_nothing_and_a_changed_vmi_judges_only_its_set():
    devices = {d.key: d for d in (_attached("g0", "vm-a", "a", "u-a"), _attached("g1", "vm-a", "a"),
                                  _attached("g2", "vm-b", "b", "u-b"))}
    vmis = VMIs({("t", "vm-a"): VMIRecord("t", "vm-a", "u-a", "a"),
                 ("t", "vm-b"): VMIRecord("t", "vm-b", "u-b", "b")})
    inc = Incremental()
    args = dict(vmis=vmis, now=T0, grace=GRACE, answer_window=WINDOW, keeps={}, vms=None,
                yielded=frozenset())
    assert inc.due(devices, None, (), **args) == [("set", "t", "a"), ("set", "t", "b")]
    inc.settle(inc.due(devices, set(), (), **args), [], T0)
    assert inc.due(devices, set(), (), **args) == []                 # nothing changed
    gone = VMIs({("t", "vm-b"): VMIRecord("t", "vm-b", "u-b", "b")}, frozenset({("t", "a")}))
    groups = inc.due(devices, set(), {("t", "vm-a")}, **{**args, "vmis": gone})
    assert groups == [("set", "t", "a")]                              # only vm-a's set
    actions = inc.plan_groups(groups, gone, T0)
    assert [type(a) for a in actions] == [ClearAttachment, ClearAttachment]
    assert actions[0].reason == VmiDeleted("vm-a", "u-a") and actions[0].rule is Rule.H2
    inc.settle(groups, actions, T0)
    assert inc.due(devices, set(), (), **{**args, "vmis": gone}) == [("set", "t", "a")]  # retried


def test_a_threshold_reached_judges_the_set_again():
    young = GPUDevice("t", "g0", "h100", status=DeviceStatus(
        Phase.BOUND, "n1", attached_to=Attachment("vm-a", T0, "a")))
    inc = Incremental()
    devices = {young.key: young}
    assert inc.plan_round(devices, None, (), VMIs(), T0, GRACE) == []
    assert inc.plan_round(devices, set(), (), VMIs(), T0 + GRACE, GRACE) == []   # not past
    late = inc.plan_round(devices, set(), (), VMIs(), T0 + GRACE + timedelta(seconds=1), GRACE)
    assert [a.rule for a in late] == [Rule.H1]


def test_the_index_follows_a_device_from_one_set_to_another():
    index = PlanIndex()
    a = _attached("g0", "vm-a", "a")
    assert index.put(a.key, a) == {("set", "t", "a")}
    b = _attached("g0", "vm-b", "b")
    assert index.put(b.key, b) == {("set", "t", "a"), ("set", "t", "b")}
    assert index.groups_named(("t", "vm-a")) == set()
    assert index.groups_named(("t", "vm-b")) == {group_of(b)}
    assert index.put(b.key, None) == {("set", "t", "b")} and not list(index.groups())


def test_a_tombstone_alone_judges_its_set_again():
    # the tombstone of admission a0 comes with no VMI event of the device's VMI name
    d = _device("t1", "d0", "c0", True, "vm0", "a0", None, False, None, 5, False, None, 0, now=T0)
    inc = Incremental()
    assert inc.plan_round({d.key: d}, None, set(), VMIs(), T0, GRACE, WINDOW) == []
    gone = VMIs({}, frozenset({("t1", "a0")}))
    got = inc.plan_round({d.key: d}, set(), set(), gone, T0, GRACE, WINDOW)
    assert got == plan([d], gone, T0, GRACE, WINDOW) and [a.rule for a in got] == [Rule.H2]
