"""Defragmentation in device mode end to end (docs/contract.md §3a D1-D5 with §3b DR2-DR4): two
controller replicas running a round every second beside kube-scheduler, the
resourceclaim-controller, KubeVirt (`GPUsWithDRA`) and KWOK, on HGX nodes publishing
`localcluster.dra_profiles`' hgx-h100-8 slices.

Each test's idle held devices get their records honestly: VMIs naming them are admitted (the
binder records the exact GPUs, DR2), then deleted (H2 clears the attachments and deletes the
claims; the records stay). Their class is `Stay` until the test wants a round (D1: a round
never touches them), then `Move`:
- on one node, a held device is *re-pointed* to another GPU of its node so a Fabric Manager
  partition of 4 is whole again (DR4; Event `GPUDeviceRepointed`), and the 4-GPU VMI refused
  before is admitted there;
- across two nodes, a held device is *moved* to the other node's GPU (Event `GPUDeviceMoved`,
  `status.device`'s pool the new node) so a node is whole for an 8-GPU VMI, a running VM's
  record and launcher Pod staying where they are; a VMI naming the moved device then gets
  exactly the moved record in its claim's allocation.
"""

from __future__ import annotations

import pytest

from localcluster.dra_profiles import DEVICE_CLASS, DRIVER
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas
from tests.e2e.helpers import counter_total, device_rv, eventually, replicas_saw
from tests.e2e.test_defrag_kubevirt import GROUP, MOVES, VERSION
from tests.e2e.test_device_mode import (  # noqa: F401 (dra: a fixture)
    BIND_TIMEOUT, GRACE, check_admitted_set, devices_of, dra, recorded, world)
from tests.e2e.test_dra_kubevirt import RESOURCE
from tests.support.kubevirt_vmis import (  # noqa: F401 (kubevirt: a fixture)
    bound_launcher, create, kubevirt, pin, vmi)

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
DEVICES = "gpu.cozystack.io/devices"


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas as test_device_mode's (bind timeout and attachment grace), with a
    defragmentation round every second of at most 4 moves (test_defrag_kubevirt's)."""
    args = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + (f"--bind-timeout={BIND_TIMEOUT}", f"--attachment-grace={GRACE}",
                                           "--defrag-interval=1", "--defrag-max-moves=4"))


def naming(name: str, cls: str, held: list[str], templates: int = 0, node: str | None = None) -> dict:
    """A VMI asking for the held devices `held` and `templates` template devices of `cls`,
    pinned by its own nodeSelector to `node` when given."""
    body = vmi(name, cls, templates)
    if not templates:
        del body["metadata"]["annotations"]["gpu.cozystack.io/templates"]
    if held:
        body["metadata"]["annotations"][DEVICES] = ",".join(held)
    if node is not None:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


async def devices(fleet, ns: str) -> dict[str, dict]:
    """The tenant's GPUDevices by name (their status)."""
    got = await fleet.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpudevices")
    return {d["metadata"]["name"]: d.get("status") or {} for d in got["items"]}


async def held_devices(fleet, dra, ns: str, cls: str, names: list[str]) -> None:
    """Held devices `names` of `cls` in `ns`, seen by every replica."""
    for name in names:
        await fleet.device(ns, name, cls)
    await replicas_saw(dra, {"gpudevices": max([int(await device_rv(fleet, ns, n)) for n in names])},
                       what=f"held devices {names}")


async def delete_and_release(fleet, ns: str, made: list[dict], held: list[str]) -> dict[str, dict]:
    """Delete the VMIs `made` and wait until housekeeping released their sets (H2: the held
    devices `held` no longer attached, the template devices deleted, the VMIs' claims deleted
    once the grace passed, DR5). Returns the tenant's GPUDevices' status by name."""
    claims = {c["resourceClaimName"] for m in made for c in m["spec"]["resourceClaims"]}
    templates = {g["name"] for m in made for g in m["spec"]["domain"]["devices"]["gpus"]} - set(held)
    for m in made:
        await fleet.custom.delete_namespaced_custom_object("kubevirt.io", "v1", ns,
                                                           "virtualmachineinstances", m["metadata"]["name"])

    async def released():
        got = await fleet.custom.list_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims")
        if claims & {c["metadata"]["name"] for c in got["items"]}:
            return None
        devs = await devices(fleet, ns)
        if templates & set(devs) or any(devs[n].get("attachedTo") for n in held):
            return None
        return devs
    devs = await eventually(released, timeout=GRACE + 45, interval=0.5,
                            what=f"the sets of {sorted(m['metadata']['name'] for m in made)} released "
                                 "and their claims deleted")
    assert all(devs[n]["phase"] == "Bound" and devs[n].get("bindRequest") is None for n in held), devs
    return devs


async def switch_to_move(fleet, cls: str) -> None:
    """The class's `onCordon` from Stay to Move: its idle held devices become movable (D1)."""
    await fleet.custom.patch_cluster_custom_object(
        GROUP, VERSION, "gpuclasses", cls, {"spec": {"onCordon": "Move"}},
        _content_type="application/merge-patch+json")


async def events(fleet, ns: str, reason: str) -> dict[str, list[str]]:
    """The tenant's Events of `reason`: GPUDevice name -> messages."""
    got = await fleet.core.list_namespaced_event(ns, field_selector=f"reason={reason}")
    out: dict[str, list[str]] = {}
    for e in got.items:
        assert e.involved_object.kind == "GPUDevice" and e.type == "Normal", e
        out.setdefault(e.involved_object.name, []).append(e.message)
    return out


async def one_record_each(fleet, node: str) -> None:
    """DR2: no two GPUDevices (any tenant) record one GPU of `node`."""
    got = await fleet.custom.list_cluster_custom_object(GROUP, VERSION, "gpudevices")
    names = [d["status"]["device"]["device"] for d in got["items"]
             if ((d.get("status") or {}).get("device") or {}).get("pool") == node]
    assert len(names) == len(set(names)), sorted(names)


def partition4(node: str, device: str) -> int:
    """The id of the Fabric Manager partition of 4 holding `node`'s GPU `device`."""
    [d] = devices_of(node, [device])
    return dict(d.attributes)[f"{DRIVER}/partition4"]


async def test_D1_DR4_a_round_re_points_an_idle_held_device_so_a_refused_4_gpu_vmi_is_admitted(dra, fleet):
    """One HGX node. held-a joins one template in a partition of 2, held-b three templates in
    the other partition of 4; both VMIs go: the held devices stay recording a GPU in each
    partition of 4, so 6 GPUs are free and no partition of 4 is. A 4-GPU VMI is refused while
    the class is Stay; once it is Move, a round re-points one held device within the node
    (a status write of `status.device`, Event GPUDeviceRepointed) and the same VMI is admitted
    there, its claim allocated exactly as recorded."""
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}}, on_cordon="Stay")
    node = nodes["hgx"]
    await held_devices(fleet, dra, tenant, cls, ["held-a", "held-b"])
    admitted = []
    for body, size in ((naming("vm-pair", cls, ["held-a"], 1), 2),
                       (naming("vm-quad", cls, ["held-b"], 3), 4)):
        made, why = await create(fleet, tenant, body)
        assert made is not None, why
        assert pin(made) == node and len(await recorded(fleet, tenant, made)) == size
        admitted.append(made)
    before = await delete_and_release(fleet, tenant, admitted, ["held-a", "held-b"])
    assert sorted(before) == ["held-a", "held-b"], before
    record = {n: s["device"]["device"] for n, s in before.items()}
    assert partition4(node, record["held-a"]) != partition4(node, record["held-b"]), record

    refused, why = await create(fleet, tenant, vmi("vm-4", cls, 4))
    assert refused is None
    assert f"{node}: no 4 free {cls} devices share {DRIVER}/partition4: 6 free, the largest group has 3" \
        in why, why
    moves0 = await counter_total(dra, MOVES)
    await switch_to_move(fleet, cls)

    repointed = await eventually(lambda: events(fleet, tenant, "GPUDeviceRepointed"), timeout=30,
                                 what="a round re-pointed a held device (GPUDeviceRepointed)")
    after = await devices(fleet, tenant)
    assert {n: s["nodeName"] for n, s in after.items()} == {"held-a": node, "held-b": node}
    now = {n: s["device"]["device"] for n, s in after.items()}
    assert {n for n in now if now[n] != record[n]} == set(repointed), (record, now, repointed)
    for name, messages in repointed.items():
        assert after[name]["device"] == {"driver": DRIVER, "pool": node, "device": now[name]}
        assert after[name]["boundAt"] == before[name]["boundAt"]        # a record write only
        assert any(f"re-pointed {tenant}/{name} ({cls}) on {node} from {record[name]} to {now[name]}"
                   in m and "grows from 2 to 4" in m for m in messages), messages
    assert partition4(node, now["held-a"]) == partition4(node, now["held-b"]), now
    await one_record_each(fleet, node)
    assert not await events(fleet, tenant, "GPUDeviceMoved")

    async def counted() -> bool:
        return await counter_total(dra, MOVES) >= moves0 + len(repointed)
    await eventually(counted, what="the re-points counted in gpu_binder_defrag_moves_total")

    made, why = await create(fleet, tenant, vmi("vm-4", cls, 4))
    assert made is not None, why
    assert pin(made) == node
    got = await check_admitted_set(fleet, tenant, made, 4)
    assert not set(got) & set(now.values()), (got, now)
    await one_record_each(fleet, node)


async def test_D1_D2_DR2_a_round_moves_an_idle_held_device_to_another_node_never_a_running_vm(dra, fleet):
    """Two HGX nodes: a running VM on b (one GPU), held-x's record on a (its VMI went), so
    neither node has a free partition of 8 and an 8-GPU VMI is refused while the class is
    Stay. With Move a round moves held-x to b (nodeName, boundAt and `status.device` whose pool
    is b; Event GPUDeviceMoved); the 8-GPU VMI is then admitted on a, the running VM's record
    and launcher Pod unchanged on b. A VMI naming held-x starts on b with its claim allocated
    exactly the moved record."""
    cls, nodes, tenant, _ = await world(fleet, dra, {"a": {}, "b": {}}, on_cordon="Stay")
    a, b = nodes["a"], nodes["b"]
    await held_devices(fleet, dra, tenant, cls, ["held-x"])
    running, why = await create(fleet, tenant, naming("running", cls, [], 1, node=b))
    assert running is not None, why
    running_record = await check_admitted_set(fleet, tenant, running, 1)
    running_pod = await bound_launcher(fleet, tenant, running)
    made, why = await create(fleet, tenant, naming("vm-held", cls, ["held-x"], node=a))
    assert made is not None, why
    assert pin(made) == a
    [running_dev] = [g["name"] for g in running["spec"]["domain"]["devices"]["gpus"]]
    before = await delete_and_release(fleet, tenant, [made], ["held-x"])
    assert sorted(before) == sorted(["held-x", running_dev]), before
    assert (before["held-x"]["nodeName"], before["held-x"]["device"]["pool"]) == (a, a)

    refused, why = await create(fleet, tenant, vmi("vm-8", cls, 8))
    assert refused is None
    for n in (a, b):
        assert f"{n}: needs 8 × {DEVICE_CLASS} devices, has 7 free" in why, why
    moves0 = await counter_total(dra, MOVES)
    await switch_to_move(fleet, cls)

    moved = await eventually(lambda: events(fleet, tenant, "GPUDeviceMoved"), timeout=30,
                             what="a round moved held-x (GPUDeviceMoved)")
    assert list(moved) == ["held-x"], moved
    after = await devices(fleet, tenant)
    x = after["held-x"]
    assert x["nodeName"] == b and x["device"]["pool"] == b and x["device"]["driver"] == DRIVER, x
    assert x["boundAt"] >= before["held-x"]["boundAt"]
    assert any(f"moved {tenant}/held-x ({cls}) from {a} ({before['held-x']['device']['device']}) "
               f"to {b} ({x['device']['device']})" in m and "grows from 4 to 8" in m
               for m in moved["held-x"]), moved
    kept = ("nodeName", "boundAt", "device", "attachedTo")
    assert [after[running_dev].get(k) for k in kept] == [before[running_dev].get(k) for k in kept]
    assert not await events(fleet, tenant, "GPUDeviceRepointed")
    await one_record_each(fleet, b)

    async def counted() -> bool:
        return await counter_total(dra, MOVES) >= moves0 + 1
    await eventually(counted, what="the move counted in gpu_binder_defrag_moves_total")

    made, why = await create(fleet, tenant, vmi("vm-8", cls, 8))
    assert made is not None, why
    assert pin(made) == a
    await check_admitted_set(fleet, tenant, made, 8)
    pod = await bound_launcher(fleet, tenant, running)
    assert (pod["metadata"]["uid"], pod["spec"]["nodeName"]) == (running_pod["metadata"]["uid"], b)
    assert await recorded(fleet, tenant, running) == running_record

    # the moved device starts a VM on b: its launcher Pod gets exactly the moved record (DR6)
    made, why = await create(fleet, tenant, naming("vm-moved", cls, ["held-x"]))
    assert made is not None, why
    assert pin(made) == b
    assert await check_admitted_set(fleet, tenant, made, 1) == [x["device"]["device"]]
    await one_record_each(fleet, b)
