"""Foreign Pods in the capacity (§2) and what excuses a launcher Pod (W7): Pod requests as
kube-scheduler computes them (`pod_requests`, checked shape by shape and against a timeline
oracle), and excuses only from the binder's own records (attachment with the VMI's uid, the
device Bound on the node), never from annotations, `gpus` entries or Pod labels alone."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, note, settings
from hypothesis import strategies as st

from model.foreign import (attachment_uid, foreign_units, launcher_excuses, node_foreign,
                           parse_pod_use, pod_requests)
from model.housekeeping import VMIRecord
from model.types import Attachment, DeviceStatus, GPUDevice, Phase

H = "nvidia.com/H100"
L = "nvidia.com/L40S"
NS = "tenant-a"
NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
RES = {"h100": H, "l40s": L}


def box(gpus: int = 0, *, res: str = H, limits_only: bool = False, sidecar: bool = False) -> dict:
    """A container asking for `gpus` × `res` (and some cpu, never counted)."""
    ask = {res: str(gpus)} if gpus else {}
    resources = {"limits": {**ask}} if limits_only else {"requests": {"cpu": "1", **ask}, "limits": {**ask}}
    c = {"name": "c", "resources": resources}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def spec(containers=(), init=(), overhead: dict | None = None, **extra) -> dict:
    s = {"nodeName": "node-1", "containers": list(containers), "initContainers": list(init), **extra}
    if overhead:
        s["overhead"] = overhead
    return s


def pod(name: str = "p", *, ns: str = NS, node: str = "node-1", created_by: str | None = None,
        phase: str = "Running", **shape) -> dict:
    labels = {"kubevirt.io/created-by": created_by} if created_by else {}
    s = spec(**shape) if shape else spec([box(1)])
    s["nodeName"] = node
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": s,
            "status": {"phase": phase}}


# --- Pod requests as kube-scheduler computes them ---------------------------------------


def test_W7_pod_requests_every_shape_as_resource_PodRequests_computes_it():
    assert pod_requests(spec([box(2), box(1)])) == ((H, 3),)                      # containers add
    assert pod_requests(spec([box(1, limits_only=True)])) == ((H, 1),)             # request = limit
    assert pod_requests(spec([box(1)], [box(3)])) == ((H, 3),)                     # regular init: max
    assert pod_requests(spec([box(2)], [box(1), box(2)])) == ((H, 2),)             # ... per container
    assert pod_requests(spec([box(1)], [box(1, sidecar=True)])) == ((H, 2),)       # sidecar adds
    # a regular init container runs next to the sidecars started before it
    assert pod_requests(spec([box(0)], [box(1, sidecar=True), box(2)])) == ((H, 3),)
    # ... not next to those started after it
    assert pod_requests(spec([box(0)], [box(2), box(1, sidecar=True)])) == ((H, 2),)
    assert pod_requests(spec([box(1)], [box(1, sidecar=True), box(1, sidecar=True), box(1)])) == ((H, 3),)
    assert pod_requests(spec([box(1)], overhead={H: "1", "cpu": "250m"})) == ((H, 2),)  # overhead adds
    assert pod_requests(spec([box(1)], [box(4)], overhead={H: "1"})) == ((H, 5),)  # ... to the max
    # resources per resource name, each by the same rule
    assert pod_requests(spec([box(1), box(2, res=L)], [box(3, res=L)])) == ((H, 1), (L, 3))


def test_W7_pod_requests_ignore_what_kube_scheduler_does_not_count_for_extended_resources():
    # pod-level resources carry cpu and memory only; kubevirt's own device plugins are no GPU
    assert pod_requests(spec([box(1)], resources={"requests": {H: "5"}})) == ((H, 1),)
    assert pod_requests(spec([box(1, res="devices.kubevirt.io/kvm")])) == ()
    assert pod_requests(spec([box(1)], [box(2, sidecar=False) | {"restartPolicy": "Never"}])) == ((H, 2),)
    assert pod_requests({"containers": "junk", "initContainers": [None, 3], "overhead": []}) == ()
    assert pod_requests("junk") == ()


def timeline_units(containers: list[int], init: list[tuple[bool, int]], overhead: int) -> int:
    """The oracle: kube-scheduler reserves the most the Pod holds at any moment of its life.
    Init containers run one by one; a sidecar keeps running once started (through the rest
    of initialisation and next to the containers); a regular init container ends before the
    next one starts; then every container runs next to every sidecar. The overhead always."""
    moments, running_sidecars = [], 0
    for sidecar, n in init:
        moments.append(running_sidecars + n)   # this init container starting
        if sidecar:
            running_sidecars += n
    moments.append(running_sidecars + sum(containers))
    return max(moments) + overhead


@settings(max_examples=300, deadline=None)
@given(containers=st.lists(st.integers(0, 4), max_size=4),
       init=st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=5),
       overhead=st.integers(0, 2), limits_only=st.booleans())
def test_W7_pod_requests_match_the_timeline_of_every_shape(containers, init, overhead, limits_only):
    s = spec([box(n, limits_only=limits_only) for n in containers],
             [box(n, sidecar=sc, limits_only=limits_only) for sc, n in init],
             {H: str(overhead)} if overhead else None)
    want = timeline_units(containers, init, overhead)
    note(f"want {want}")
    assert pod_requests(s) == (((H, want),) if want else ())


def test_capacity_parse_pod_use_counts_bound_live_pods_only():
    assert parse_pod_use(pod(containers=[box(2)])).requests == ((H, 2),)
    assert parse_pod_use(pod(containers=[box(1)], init=[box(1, sidecar=True)])).requests == ((H, 2),)
    assert parse_pod_use(pod(phase="Succeeded")) is None                  # ended: not counted
    assert parse_pod_use(pod(phase="Failed")) is None
    assert parse_pod_use(pod(containers=[box(0)])) is None                # no extended resource
    unbound = pod()
    del unbound["spec"]["nodeName"]
    assert parse_pod_use(unbound) is None
    assert parse_pod_use({"metadata": "junk"}) is None
    assert parse_pod_use(pod(created_by="uid-1")).created_by == "uid-1"


# --- what excuses a launcher Pod (W7) ------------------------------------------------------


def device(name: str, on: str | None = "node-1", *, vmi: str | None = "vm-1", uid: str | None = None,
           ns: str = NS, cls: str = "h100") -> GPUDevice:
    """A GPUDevice Bound on `on` (None: Pending), attached to VMI `vmi` (None: not attached),
    the attachment recording `uid` (H2) or not yet."""
    att = Attachment(vmi, NOW, "adm-1", uid) if vmi else None
    return GPUDevice(ns, name, cls, status=DeviceStatus(Phase.BOUND if on else Phase.PENDING, on,
                                                        NOW if on else None, att))


def vmis(*recs: tuple[str, str]) -> dict:
    """Live VMIs of NS by (name, uid)."""
    return {(NS, n): VMIRecord(NS, n, u, "adm-1") for n, u in recs}


def launcher(uid: str, gpus: int, *, name: str = "virt-launcher", **kw):
    return parse_pod_use(pod(name, created_by=uid, containers=[box(gpus)], **kw))


def test_W7_a_launcher_pod_is_excused_up_to_the_devices_attached_to_its_vmi_and_bound_there():
    devs = [device("gpu-0", uid="u1"), device("gpu-1", uid="u1")]
    ex = launcher_excuses("node-1", devs, RES, {})
    assert ex == {(NS, "u1"): {H: 2}}
    assert foreign_units([launcher("u1", 2)], ex) == ()
    assert foreign_units([launcher("u1", 3)], ex) == ((H, 1),)           # more than its devices
    raw = parse_pod_use(pod("raw", containers=[box(1)]))
    assert foreign_units([launcher("u1", 2), raw], ex) == ((H, 1),)


def test_W7_before_housekeeping_records_the_uid_the_live_vmi_of_the_attachments_name_is_it():
    devs = [device("gpu-0"), device("gpu-1")]  # attachedTo.uid not recorded yet
    assert attachment_uid(devs[0], vmis(("vm-1", "u1"))) == "u1"
    assert attachment_uid(devs[0], vmis(("vm-2", "u1"))) is None          # no VMI of its name
    assert attachment_uid(devs[0], {}) is None
    assert node_foreign("node-1", [launcher("u1", 2)], devs, RES, vmis(("vm-1", "u1"))) == ()
    # a recorded uid wins over the live VMI of the name (a newer incarnation excuses nothing)
    linked = [device("gpu-0", uid="u-old"), device("gpu-1", uid="u-old")]
    assert node_foreign("node-1", [launcher("u-new", 2)], linked, RES, vmis(("vm-1", "u-new"))) == ((H, 2),)
    assert node_foreign("node-1", [launcher("u-old", 2)], linked, RES, vmis(("vm-1", "u-new"))) == ()


def test_W7_nothing_but_a_bound_attached_device_of_that_incarnation_excuses():
    live = vmis(("vm-1", "u1"))
    pods = [launcher("u1", 1)]
    for what, devs in {
        "Pending device": [device("gpu-0", None, uid="u1")],
        "device Bound on another node": [device("gpu-0", "node-2", uid="u1")],
        "device not attached (held, free)": [device("gpu-0", vmi=None)],
        "device attached to another VMI": [device("gpu-0", vmi="vm-2")],
        "device of a class no longer known": [device("gpu-0", uid="u1", cls="gone")],
        "device of another resource": [device("gpu-0", uid="u1", cls="l40s")],
    }.items():
        assert node_foreign("node-1", pods, devs, RES, live) == ((H, 1),), what
    # the Pod's namespace must be the device's: a launcher label naming another tenant's VMI
    other = parse_pod_use(pod("x", ns="evil", created_by="u1", containers=[box(1)]))
    assert node_foreign("node-1", [other], [device("gpu-0", uid="u1")], RES, live) == ((H, 1),)
    assert node_foreign("node-1", [launcher("u1", 1, node="node-2")], [device("gpu-0", uid="u1")], RES,
                        live) == ()  # a Pod of another node is not this node's


def test_W7_forged_launcher_labels_hide_no_more_than_the_vmis_devices_once():
    """Attacker: Pods labelled as the launcher of a VMI with 2 Bound devices, several of them,
    asking for more: 2 units in total are excused, however the label is forged."""
    devs = [device("gpu-0", uid="u1"), device("gpu-1", uid="u1")]
    real, forged = launcher("u1", 2), launcher("u1", 4, name="forged")
    assert node_foreign("node-1", [real, forged], devs, RES, {}) == ((H, 4),)
    assert node_foreign("node-1", [forged], devs, RES, {}) == ((H, 2),)
    assert node_foreign("node-1", [launcher("nobody", 1)], devs, RES, {}) == ((H, 1),)


def test_W7_raw_gpu_vmi_with_our_annotation_added_later_excuses_nothing():
    """Issue 23, 2: a VMI admitted without the binder (raw `gpus` entries, a pin) whose
    annotation was added later has no attachment of the binder: its launcher Pod's GPUs stay
    foreign, whatever its annotations say (the functions never see them)."""
    assert node_foreign("node-1", [launcher("raw-uid", 2)], [], RES, vmis(("raw-vm", "raw-uid"))) == ((H, 2),)
    held_elsewhere = [device("gpu-0", uid="a-uid"), device("gpu-1", uid="a-uid")]
    assert node_foreign("node-1", [launcher("raw-uid", 2), launcher("a-uid", 2, name="a")],
                        held_elsewhere, RES, vmis(("raw-vm", "raw-uid"))) == ((H, 2),)


# --- the accounting as a property over random nodes -----------------------------------------


@st.composite
def node_world(draw):
    """One node: VMI incarnations (some live, some with their uid recorded), devices (Bound
    here, elsewhere or Pending; attached or not; of a known class or not), and Pods (honest
    launchers, forged labels, raw; with sidecars and init containers)."""
    uids = [f"u{i}" for i in range(draw(st.integers(0, 3)))]
    live = {u: draw(st.booleans()) for u in uids}
    devs = []
    for i in range(draw(st.integers(0, 6))):
        uid = draw(st.sampled_from([None, *uids]))
        devs.append(device(f"gpu-{i}", draw(st.sampled_from(["node-1", "node-1", "node-2", None])),
                           vmi=f"vm-{uid}" if uid else None,
                           uid=uid if uid and draw(st.booleans()) else None,
                           cls=draw(st.sampled_from(["h100", "h100", "l40s", "gone"])),
                           ns=draw(st.sampled_from([NS, NS, "other"]))))
    pods = []
    for i in range(draw(st.integers(0, 5))):
        shape = {"containers": [box(n) for n in draw(st.lists(st.integers(0, 3), max_size=2))],
                 "init": [box(n, sidecar=sc) for sc, n in
                          draw(st.lists(st.tuples(st.booleans(), st.integers(0, 2)), max_size=2))]}
        p = parse_pod_use(pod(f"p{i}", created_by=draw(st.sampled_from([None, "forged", *uids])),
                              ns=draw(st.sampled_from([NS, NS, "other"])), **shape))
        if p is not None:
            pods.append(p)
    records = {(NS, f"vm-{u}"): VMIRecord(NS, f"vm-{u}", u) for u in uids if live[u]}
    return pods, devs, records


@settings(max_examples=400, deadline=None)
@given(node_world())
def test_W7_property_used_units_never_below_what_kube_scheduler_counts_nor_the_bound_devices(world):
    """Whatever Pods, labels and attachments: per resource, the node's used units (its
    Bound devices of a known class plus foreign) are at least the units its Pods request as
    kube-scheduler counts them, and foreign never exceeds those Pods' units."""
    pods, devs, records = world
    foreign = dict(node_foreign("node-1", pods, devs, RES, records))
    for res in (H, L):
        bound = sum(1 for d in devs if d.bound_node == "node-1" and RES.get(d.class_name) == res)
        requested = sum(dict(p.requests).get(res, 0) for p in pods)
        note(f"{res}: bound {bound}, Pods {requested}, foreign {foreign.get(res, 0)}")
        assert bound + foreign.get(res, 0) >= requested
        assert 0 <= foreign.get(res, 0) <= requested


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(0, 3), st.booleans())
def test_W7_property_honest_launchers_are_wholly_excused_and_raw_pods_wholly_counted(sets, raw, linked):
    """Each VMI's launcher Pod asks for exactly its devices Bound here: only the raw Pods'
    units are foreign, whether housekeeping has recorded the uids yet or not."""
    devs, pods, records = [], [], {}
    for i, n in enumerate(sets):
        uid = f"u{i}"
        records[(NS, f"vm-{i}")] = VMIRecord(NS, f"vm-{i}", uid)
        devs += [device(f"gpu-{i}-{j}", vmi=f"vm-{i}", uid=uid if linked else None) for j in range(n)]
        pods.append(launcher(uid, n, name=f"virt-launcher-{i}"))
    if raw:
        pods.append(parse_pod_use(pod("raw", containers=[box(raw)])))
    assert node_foreign("node-1", pods, devs, RES, records) == (((H, raw),) if raw else ())
