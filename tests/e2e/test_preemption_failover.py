"""P4 across a leader kill, and a victim that will not die (docs/contract.md §3c P4, P6; issue
39 item 4 and "Bad input"), against the real control plane: two controller replicas with the
shipped RBAC (`--preemption-min-runtime=0`, `--preemption-nomination-ttl=60`), bare VMIs (no
KubeVirt), PriorityClasses spot (100) and on-demand (1000).

The world: node a (6 units) with two spot VMIs of 2 (2 units free), node b (2) with one; an
on-demand VMI of 6 fits only on a, by stopping the two spot VMIs there (P3). Every step is made
observable with real API machinery, never a hook in the controller:

- (a) killed between the nomination and the victims' deletion: a ValidatingAdmissionPolicy
  denies DELETE of VMIs by the controller's ServiceAccount (the shipped RBAC allows it), so
  the leader nominates and answers 503 but its deletes fail; the leader is SIGKILLed, the
  denial removed: the new leader deletes exactly the nominated victims, the retried create is
  admitted on the nominated node, the nomination is gone.
- (b) killed between the deletion and the preemptor's admission: the victims carry a finalizer
  the test added, so their deletion leaves them terminating; the leader is killed meanwhile:
  no other VMI is deleted, no victim is stopped twice (one `GPUSetPreempted` Event each), the
  nominated room is given to nobody else (a lower-priority VMI that would fit there is refused,
  before and after the victims go), and the retried preemptor is admitted on the nominated node.
- (c) a victim that will not die within the nomination's life (finalizer kept): the nomination
  expires and is deleted, its hold released (a lower-priority VMI takes the free part of the
  node), the preemptor's retry is refused plainly (no new nomination: a VMI already being
  deleted is no victim, P2), and nothing else is stopped.
- (d) P5 across the kill (issue 39 item 3): two bare VMIs of the same priority wait in the line
  for room, B refused before A; the leader is killed; the new one reads the published
  `status.line` back, and when A's client retries before B's, B is still ahead of A, both with
  their first refusals as published."""

from __future__ import annotations

import json
import signal
import time

import pytest

from model.retry_after import RETRY_STEP
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas, unique
from tests.e2e.helpers import eventually, make_pool
from model.serialize import parse_time
from model.types import GROUP, VERSION
from tests.e2e.test_preemption import (VMI_GROUP, VMI_VERSION, VMIS, create, nominations, priority_class, vmi,
                                      vmi_body)

pytestmark = pytest.mark.anyio
TTL = 60
GRACE = 45
"""The spot VMIs' `spec.terminationGracePeriodSeconds`: the preemptor's Retry-After (P4)."""
CONTROLLER = "system:serviceaccount:cozy-system:gpu-binder"
FINALIZER = "e2e.gpu-binder.test/hold"


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas whose running sets may yield at once, nominations living `TTL` seconds."""
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   FAST_CONTROLLER_ARGS + ("--preemption-min-runtime=0",
                                                           f"--preemption-nomination-ttl={TTL}"))


class World:
    """The module's world (see the module docstring), made by `world`."""

    def __init__(self, cls, nodes, spot_ns, od_ns, spot, od, placed) -> None:
        self.cls, self.nodes, self.spot_ns, self.od_ns = cls, nodes, spot_ns, od_ns
        self.spot, self.od, self.placed = spot, od, placed
        self.on_a = sorted(n for n, node in placed.items() if node == nodes["a"])
        self.on_b = sorted(n for n, node in placed.items() if node == nodes["b"])


async def world(fleet, system) -> World:
    spot, od = unique("spot"), unique("on-demand")
    await priority_class(fleet, system, spot, 100)
    await priority_class(fleet, system, od, 1000)
    _, cls, nodes, spot_ns, _ = await make_pool(fleet, {"a": 6, "b": 2}, seen_by=system)
    od_ns = unique("t")
    await fleet.tenant(od_ns)
    for name in ("s1", "s2", "s3"):
        body = vmi_body(name, cls, 2, spot)
        body["spec"]["terminationGracePeriodSeconds"] = GRACE
        status, message, _ = await create(fleet, spot_ns, body)
        assert status == 201, message
    placed = {n: (await vmi(fleet, spot_ns, n))["spec"]["nodeSelector"]["kubernetes.io/hostname"]
              for n in ("s1", "s2", "s3")}
    w = World(cls, nodes, spot_ns, od_ns, spot, od, placed)
    assert len(w.on_a) == 2 and len(w.on_b) == 1, placed
    return w


# -- observing ---------------------------------------------------------------------------


async def vmis_in(fleet, *namespaces: str) -> dict[tuple[str, str], dict]:
    """Every VMI of `namespaces` by (namespace, name)."""
    out = {}
    for ns in namespaces:
        got = await fleet.custom.list_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS)
        out.update({(ns, o["metadata"]["name"]): o for o in got["items"]})
    return out


async def my_nomination(fleet, w: World) -> dict | None:
    mine = [n for n in await nominations(fleet) if n["spec"]["preemptor"]["namespace"] == w.od_ns]
    assert len(mine) <= 1, mine
    return mine[0] if mine else None


async def events(fleet, ns: str, reason: str) -> list:
    got = await fleet.core.list_namespaced_event(ns, field_selector=f"reason={reason}")
    return got.items


async def preempted(fleet, w: World) -> list[str]:
    """The spot VMIs told they were stopped (Warning Event `GPUSetPreempted`, one per stop), sorted."""
    return sorted(e.involved_object.name for e in await events(fleet, w.spot_ns, "GPUSetPreempted"))


async def preempting_announced(fleet, w: World, times: int) -> bool:
    """The preemptor's VM was told `times` times that it waits for its victims (the Event
    `GPUSetPreempting`: once per nomination and leader, at the leader's first round)."""
    return len([e for e in await events(fleet, w.od_ns, "GPUSetPreempting")
                if e.involved_object.name == "od"]) >= times


def leader_index(system) -> int:
    leader = system.leader()
    assert leader in {"replica-0", "replica-1"}, leader
    return int(leader.split("-")[1])


def kill_leader(system) -> str:
    """SIGKILL the Lease holder; its identity."""
    old = system.leader()
    system.kill_replica(leader_index(system), signal.SIGKILL)
    return old


async def new_leader(system, old: str) -> str:
    async def other() -> str | None:
        now = system.leader()
        return now if now not in (None, old) else None
    return await eventually(other, timeout=30, what="a new leader")


async def _true(value: bool) -> bool:
    return value


def logged(system, i: int, event: str) -> bool:
    """Replica `i`'s log has a line of `event` (structlog's JSON lines)."""
    try:
        text = system.replicas[i].log_path.read_text(errors="replace")
    except OSError:
        return False
    return f'"event": "{event}"' in text or f'"event":"{event}"' in text


async def set_finalizer(fleet, ns: str, name: str, on: bool) -> None:
    ops = ([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}] if on
           else [{"op": "remove", "path": "/metadata/finalizers"}])
    await fleet.custom.patch_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS, name, ops)


async def terminating(fleet, ns: str, name: str) -> bool:
    got = await vmi(fleet, ns, name)
    return got is not None and got["metadata"].get("deletionTimestamp") is not None


async def released(fleet, w: World) -> bool:
    """No GPUDevice of the spot tenant is attached to a victim any more (H2 ran)."""
    got = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", w.spot_ns,
                                                           "gpudevices")
    return not [d for d in got["items"]
                if ((d.get("status") or {}).get("attachedTo") or {}).get("vmi") in w.on_a]


async def gone(fleet, ns: str, name: str) -> bool:
    return await vmi(fleet, ns, name) is None


async def retried_until_admitted(fleet, w: World, timeout: float) -> None:
    """The preemptor's create, retried (as client-go does on 503) until admitted."""
    async def admitted() -> bool:
        got, _, _ = await create(fleet, w.od_ns, vmi_body("od", w.cls, 6, w.od))
        return got == 201
    await eventually(admitted, timeout=timeout, interval=1.0, what="the on-demand VMI admitted")
    got = await vmi(fleet, w.od_ns, "od")
    assert got["spec"]["nodeSelector"]["kubernetes.io/hostname"] == w.nodes["a"]


async def nomination_gone(fleet, w: World, timeout: float = 30) -> None:
    async def none() -> bool:
        return await my_nomination(fleet, w) is None
    await eventually(none, timeout=timeout, what="the nomination deleted")


async def nominated(fleet, w: World) -> tuple[dict, int]:
    """Create the preemptor: 503 with Retry-After (at most the victims' grace), its
    nomination names exactly the spot VMIs on node a. The nomination's spec, the Retry-After."""
    status, message, headers = await create(fleet, w.od_ns, vmi_body("od", w.cls, 6, w.od))
    assert status == 503, message
    retry_after = int(headers.get("Retry-After", 0))
    assert "stopping 2 lower-priority VMs" in message and 1 <= retry_after <= GRACE, (message, headers)
    found = await my_nomination(fleet, w)
    assert found is not None
    spec = found["spec"]
    assert spec["node"] == w.nodes["a"] and spec["preemptor"] == {"namespace": w.od_ns, "vmi": "od",
                                                                 "priority": 1000}
    assert sorted(v["vmi"] for v in spec["victims"]) == w.on_a
    return spec, retry_after


# -- (a) the denial of the controller's deletes ----------------------------------------------


def deny_deletes(control_plane, ns: str) -> str:
    """A ValidatingAdmissionPolicy and its binding denying DELETE of VMIs in `ns` by the
    controller's ServiceAccount; their name."""
    name = unique("e2e-deny-vmi-delete")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {
                     "resourceRules": [{"apiGroups": ["kubevirt.io"], "apiVersions": ["*"],
                                        "operations": ["DELETE"], "resources": ["virtualmachineinstances"]}],
                     "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
                 "matchConditions": [{"name": "the-controller",
                                      "expression": f"request.userInfo.username == '{CONTROLLER}'"}],
                 "validations": [{"expression": "false",
                                  "message": "e2e: the controller may not delete VMIs here now"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"]}}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                  "items": [policy, binding]}))
    return name


def denied_for_controller(control_plane, ns: str, name: str) -> bool:
    """A server-side dry run of the controller deleting VMI `ns/name` is denied by the policy."""
    out = control_plane.kubectl("delete", VMIS + ".kubevirt.io", name, "-n", ns, f"--as={CONTROLLER}",
                                "--dry-run=server", check=False)
    return out.returncode != 0 and "e2e: the controller may not delete VMIs here now" in out.stderr


def allow_deletes(control_plane, name: str) -> None:
    control_plane.kubectl("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found")
    control_plane.kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found")


async def test_a_leader_killed_between_the_nomination_and_the_deletion_loses_nothing(
        system, fleet, control_plane):
    w = await world(fleet, system)
    policy = deny_deletes(control_plane, w.spot_ns)
    try:
        async def denied() -> bool:
            return denied_for_controller(control_plane, w.spot_ns, w.on_a[0])
        await eventually(denied, timeout=20, interval=0.5, what="the policy in force")
        before = await vmis_in(fleet, w.spot_ns, w.od_ns)
        spec, retry_after = await nominated(fleet, w)
        assert retry_after == RETRY_STEP  # no victim being deleted: their 45 s grace, past the step
        # the leader tried and was denied: the victims still run
        leader = leader_index(system)
        await eventually(lambda: _true(logged(system, leader, "victim_not_deleted")), timeout=30,
                         what=f"the leader's delete denied; its log:\n{system.log_tail(leader)}")
        for name in w.on_a:
            assert not await terminating(fleet, w.spot_ns, name) and await vmi(fleet, w.spot_ns, name)
        old = kill_leader(system)
    finally:
        allow_deletes(control_plane, policy)
    started = time.monotonic()
    await new_leader(system, old)
    # the new leader deletes exactly the nominated victims, once each
    for name in w.on_a:
        await eventually(lambda name=name: gone(fleet, w.spot_ns, name), timeout=30,
                         what=f"victim {name} deleted by the new leader")
    print(f"victims gone {time.monotonic() - started:.1f} s after the kill (lease 4 s)")
    after = await vmis_in(fleet, w.spot_ns, w.od_ns)
    assert set(before) - set(after) == {(w.spot_ns, n) for n in w.on_a}
    assert all(after[k]["metadata"]["uid"] == before[k]["metadata"]["uid"] for k in after)
    assert await preempted(fleet, w) == w.on_a
    # the same nomination (one per preemptor), then the retried create lands on its node
    kept = await my_nomination(fleet, w)
    assert kept is None or kept["spec"]["created"] == spec["created"]
    await retried_until_admitted(fleet, w, timeout=40)
    await nomination_gone(fleet, w)
    for name in w.on_b:
        assert await vmi(fleet, w.spot_ns, name) is not None


# -- (b) victims terminating across the kill ----------------------------------------------------


async def test_b_a_leader_killed_while_the_victims_terminate_gives_their_room_to_the_preemptor_only(
        system, fleet):
    w = await world(fleet, system)
    for name in w.on_a:
        await set_finalizer(fleet, w.spot_ns, name, True)
    try:
        before = await vmis_in(fleet, w.spot_ns, w.od_ns)
        await nominated(fleet, w)
        for name in w.on_a:
            await eventually(lambda name=name: terminating(fleet, w.spot_ns, name), timeout=20,
                             what=f"victim {name} being deleted")

        async def preempted_events() -> bool:
            return len(await events(fleet, w.spot_ns, "GPUSetPreempted")) >= len(w.on_a)
        await eventually(preempted_events, timeout=10, what="the victims' Events")
        await eventually(lambda: preempting_announced(fleet, w, 1), timeout=10, what="the preemptor told")
        old = kill_leader(system)
        await new_leader(system, old)
        # the new leader's preemption worker ran (it tells the preemptor again, once)
        await eventually(lambda: preempting_announced(fleet, w, 2), timeout=30,
                         what="the new leader's first preemption round")
        # the nominated room (2 free units and the victims') is given to nobody else
        status, message, _ = await create(fleet, w.spot_ns, vmi_body("low1", w.cls, 2, w.spot))
        assert status != 201 and await vmi(fleet, w.spot_ns, "low1") is None, message
        # nothing else was deleted, no victim stopped twice
        now = await vmis_in(fleet, w.spot_ns, w.od_ns)
        assert set(now) == set(before)
        for (ns, name), obj in now.items():
            assert obj["metadata"]["uid"] == before[(ns, name)]["metadata"]["uid"]
            assert (obj["metadata"].get("deletionTimestamp") is not None) == (name in w.on_a), name
        assert await preempted(fleet, w) == w.on_a
    finally:
        for name in w.on_a:
            if await vmi(fleet, w.spot_ns, name) is not None:
                await set_finalizer(fleet, w.spot_ns, name, False)
    for name in w.on_a:
        await eventually(lambda name=name: gone(fleet, w.spot_ns, name), timeout=20, what=f"{name} gone")
    await eventually(lambda: released(fleet, w), timeout=20, what="the victims' devices released (H2)")
    # the victims' room is free now, and still held for the preemptor
    status, message, _ = await create(fleet, w.spot_ns, vmi_body("low2", w.cls, 2, w.spot))
    assert status != 201 and await vmi(fleet, w.spot_ns, "low2") is None, message
    await retried_until_admitted(fleet, w, timeout=40)
    await nomination_gone(fleet, w)
    assert set(await vmis_in(fleet, w.spot_ns)) == {(w.spot_ns, n) for n in w.on_b}


# -- (c) a victim that will not die ---------------------------------------------------------------


async def test_c_a_victim_that_will_not_die_expires_the_nomination_and_stops_nothing_else(system, fleet):
    w = await world(fleet, system)
    for name in w.on_a:
        await set_finalizer(fleet, w.spot_ns, name, True)
    try:
        spec, _ = await nominated(fleet, w)
        for name in w.on_a:
            await eventually(lambda name=name: terminating(fleet, w.spot_ns, name), timeout=20,
                             what=f"victim {name} being deleted")
        before = await vmis_in(fleet, w.spot_ns, w.od_ns)
        # the nomination expires and is deleted: its hold released
        await nomination_gone(fleet, w, timeout=TTL + 30)
        print(f"nomination made {spec['created']}, expiring {spec['expires']}, gone by "
              f"{time.strftime('%H:%M:%S', time.gmtime())}")
        # the free part of node a goes to a lower-priority set now
        async def low_admitted() -> bool:
            got, _, _ = await create(fleet, w.spot_ns, vmi_body("low", w.cls, 2, w.spot))
            return got == 201
        await eventually(low_admitted, timeout=20, interval=1.0, what="a spot VMI on the released room")
        low = await vmi(fleet, w.spot_ns, "low")
        assert low["spec"]["nodeSelector"]["kubernetes.io/hostname"] == w.nodes["a"]
        # the preemptor's retry is refused plainly: its victims are being deleted already, no
        # other plan makes room; no new nomination, nothing stopped
        status, message, _ = await create(fleet, w.od_ns, vmi_body("od", w.cls, 6, w.od))
        assert status != 201 and "stopping" not in message, message
        assert await my_nomination(fleet, w) is None
        now = await vmis_in(fleet, w.spot_ns, w.od_ns)
        assert set(now) == set(before) | {(w.spot_ns, "low")}
        for key, obj in now.items():
            deleting = obj["metadata"].get("deletionTimestamp") is not None
            assert deleting == (key[1] in w.on_a), key
        assert await preempted(fleet, w) == w.on_a
    finally:
        for name in w.on_a:
            if await vmi(fleet, w.spot_ns, name) is not None:
                await set_finalizer(fleet, w.spot_ns, name, False)


# -- (d) the waiting line across the kill (P5) ------------------------------------------------------


async def published_line(fleet, w: World) -> dict | None:
    """The class's `status.line` (the leader's summary of its waiting line), None when absent."""
    got = await fleet.custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", w.cls)
    return (got.get("status") or {}).get("line")


async def test_d_bare_vmis_keep_their_published_places_in_the_line_across_a_leader_kill(system, fleet):
    w = await world(fleet, system)                     # 2 units free on a: a set of 4 waits

    async def refused(name: str) -> None:              # the client's create (or retry): it waits
        for _ in range(5):  # (a call kube-apiserver made to the killed replica never reached us)
            status, message, _ = await create(fleet, w.od_ns, vmi_body(name, w.cls, 4, w.spot))
            if not (status == 500 and "failed calling webhook" in message):
                break
        assert status == 503 and "the set waits in the line for room" in message, (status, message)

    def ordered(want: list[str]):
        async def probe() -> dict | None:
            for name in reversed(want):                # the last of `want` retries first
                await refused(name)                    # (every 2 s: the place is kept, 10 s grace)
            line = await published_line(fleet, w)
            return line if line and [e["name"] for e in line["entries"]] == want else None
        return probe

    await refused("b")
    await refused("a")
    before = await eventually(ordered(["b", "a"]), timeout=30, interval=2.0,
                              what="the line published: b, then a")
    since = {e["name"]: e["since"] for e in before["entries"]}
    assert parse_time(since["b"]) < parse_time(since["a"])
    assert {e["kind"] for e in before["entries"]} == {"VirtualMachineInstance"}
    old = kill_leader(system)
    await new_leader(system, old)

    async def cleared() -> bool:                       # its own line, empty until they retry
        return await published_line(fleet, w) is None
    await eventually(cleared, timeout=10, interval=0.2, what="the new leader's (empty) line published")
    await refused("a")                                 # a's client retries first, then b's
    await refused("b")
    after = await eventually(ordered(["b", "a"]), timeout=30, interval=2.0,
                             what="the new leader's line: b still ahead of a")
    assert {e["name"]: e["since"] for e in after["entries"]} == since
    i = leader_index(system)
    recalled = [x for x in system.replicas[i].log_path.read_text(errors="replace").splitlines()
                if "line_places_recalled" in x and f"{w.od_ns}/b" in x]
    assert recalled, system.log_tail(i)                # the new leader read b's place back
    for name in ("a", "b"):
        assert await vmi(fleet, w.od_ns, name) is None
