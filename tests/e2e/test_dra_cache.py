"""`ClusterCache`'s view of Dynamic Resource Allocation against the real kube-apiserver
(docs/contract.md §3b, DR1, DR2), the cache reading as the controller's ServiceAccount with the
shipped RBAC (k8s/manifests/controller/rbac.yaml): the profiles' slices for two nodes, a
claim allocated through the status subresource as kube-scheduler writes it, a Bound
GPUDevice's record, a device taint, a pool replaced by a new generation, the slices
deleted; class problems and the Ready condition the leader writes. Each step waits on the
named state of the cache (no fixed sleeps). A tenant with the usual namespace rights on
claims cannot write an allocation, so nothing it does takes a device."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta, timezone

import anyio
import orjson
import pytest
import yaml

from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping import Housekeeper
from localcluster.dra_profiles import (DEVICE_CLASS, DRIVER, HGX_H100_8, L40S_4, device_class,
                                       resource_slice)
from localcluster.paths import MANIFESTS
from model.device.dra import DeviceRef
from model.serialize import device_status_to_dict
from model.types import DeviceStatus, Phase, dra_resource_name
from tests.e2e.conftest import unique
from tests.e2e.helpers import eventually

pytestmark = pytest.mark.anyio

KEY = dra_resource_name(DEVICE_CLASS)
H100_ONLY = f"device.attributes['{DRIVER}'].productName == '{HGX_H100_8.product}'"


async def kubectl(cp, *args: str, **kw):
    return await anyio.to_thread.run_sync(functools.partial(cp.kubectl, *args, **kw))


async def apply(cp, *docs: dict) -> None:
    await kubectl(cp, "apply", "--server-side", "--field-manager=gpu-binder-tests", "-f", "-",
                  input=yaml.safe_dump_all(docs))


@pytest.fixture(scope="module")
def controller_kubeconfig(control_plane, tmp_path_factory):
    """A kubeconfig of ServiceAccount cozy-system/gpu-binder bound to the shipped RBAC."""
    control_plane.kubectl("apply", "--server-side", "--field-manager=gpu-binder-install",
                          "-f", str(MANIFESTS / "controller" / "namespace.yaml"),
                          "-f", str(MANIFESTS / "controller" / "rbac.yaml"))
    return control_plane.write_service_account_kubeconfig(
        tmp_path_factory.mktemp("sa") / "controller.kubeconfig", "cozy-system", "gpu-binder")


@pytest.fixture
async def controller_client(controller_kubeconfig):
    from kubernetes_asyncio.config import new_client_from_config

    client = await new_client_from_config(config_file=str(controller_kubeconfig))
    try:
        yield client
    finally:
        await client.close()


def node_doc(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
            "labels": {"kubevirt.io/schedulable": "true"}}}


def class_doc(name: str, dc: str = DEVICE_CLASS, selectors: tuple[str, ...] = ()) -> dict:
    spec: dict = {"deviceClassName": dc}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": name}, "spec": spec}


def claim_doc(ns: str, name: str, count: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": f"gpu-{i}", "exactly": {
                "deviceClassName": DEVICE_CLASS, "count": 1}} for i in range(count)]}}}


def allocation(node: str, devices: list[str]) -> dict:
    """`status.allocation` as kube-scheduler writes it for `devices` of `node`'s pool."""
    return {"devices": {"results": [{"request": f"gpu-{i}", "driver": DRIVER, "pool": node,
                                     "device": d} for i, d in enumerate(devices)]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


def names(devices) -> set[str]:
    return {d.ref.device for d in devices}


def view_of(cache: ClusterCache, node: str, cls: str):
    """(class devices' names, taken, allocatable, foreign) of `node`, None while unseen."""
    n = cache.view.node(node)
    if n is None:
        return None
    return (names(n.devices_of(cls)), set(n.taken_devices), n.allocatable_of(KEY),
            dict(n.foreign).get(KEY, 0))


async def reaches(cache, node: str, cls: str, want: tuple, what: str) -> None:
    async def probe():
        return view_of(cache, node, cls) == want
    try:
        await eventually(probe, timeout=20, what=what)
    except AssertionError:
        raise AssertionError(f"{what}: {view_of(cache, node, cls)} != {want}") from None


async def test_DR1_DR2_the_cache_follows_slices_claims_records_taints_and_generations(
        control_plane, controller_client):
    cp = control_plane
    hgx, pcie, ns = unique("dra-hgx"), unique("dra-pcie"), unique("dra")
    h100, vfio = unique("h100"), unique("vfio")
    slices = [f"{hgx}-{DRIVER}", f"{pcie}-{DRIVER}", f"{hgx}-gen2"]
    await kubectl(cp, "create", "namespace", ns)
    await apply(cp, device_class(), node_doc(hgx), node_doc(pcie),
                class_doc(h100, selectors=(H100_ONLY,)), class_doc(vfio))
    cache = ClusterCache(controller_client, watch_timeout=30)
    all8 = {f"gpu-vfio-{i}" for i in range(8)}
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(cache.run)
            assert not cache.slices.absent and cache.healthy()
            # two nodes publish their slices
            await apply(cp, resource_slice(hgx, HGX_H100_8), resource_slice(pcie, L40S_4))
            await reaches(cache, hgx, h100, (all8, set(), 8, 0), "the HGX node's 8 GPUs")
            await reaches(cache, pcie, vfio, ({f"gpu-vfio-{i}" for i in range(4)}, set(), 4, 0),
                          "the PCIe node's 4 GPUs")
            assert names(cache.view.node(pcie).devices_of(h100)) == set()
            # a claim allocated by kube-scheduler (status subresource): 2 devices taken, foreign
            await apply(cp, claim_doc(ns, "foreign", 2))
            await kubectl(cp, "patch", "resourceclaim", "foreign", "-n", ns,
                          "--subresource=status", "--type=merge", "-p",
                          orjson.dumps({"status": {"allocation": allocation(
                              hgx, ["gpu-vfio-0", "gpu-vfio-1"])}}).decode())
            taken = {"gpu-vfio-0", "gpu-vfio-1"}
            await reaches(cache, hgx, h100, (all8, taken, 8, 2), "the claim's 2 devices taken")
            # a Bound GPUDevice records gpu-vfio-1: taken, but no longer foreign
            dev = {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
                   "metadata": {"name": "held", "namespace": ns}, "spec": {"class": h100}}
            await apply(cp, dev)
            status = device_status_to_dict(DeviceStatus(
                Phase.BOUND, hgx, datetime.now(timezone.utc),
                device=DeviceRef(DRIVER, hgx, "gpu-vfio-1")))
            await kubectl(cp, "patch", "gpudevice", "held", "-n", ns, "--subresource=status",
                          "--type=merge", "-p", orjson.dumps({"status": status}).decode())
            await reaches(cache, hgx, h100, (all8, taken, 8, 1), "the record excusing gpu-vfio-1")
            # a NoExecute device taint takes gpu-vfio-7
            tainted = resource_slice(hgx, HGX_H100_8)
            tainted["spec"]["devices"][7]["taints"] = [
                {"key": "example.com/unhealthy", "value": "xid-79", "effect": "NoExecute"}]
            await apply(cp, tainted)
            taken |= {"gpu-vfio-7"}
            await reaches(cache, hgx, h100, (all8, taken, 8, 2), "the tainted device taken")
            # the driver restarts: generation 2 (a new slice) has 6 GPUs; the old one goes
            gen2 = resource_slice(hgx, HGX_H100_8, generation=2)
            gen2["metadata"]["name"] = f"{hgx}-gen2"
            gen2["spec"]["devices"] = gen2["spec"]["devices"][:6]
            await apply(cp, gen2)
            six = {f"gpu-vfio-{i}" for i in range(6)}
            await reaches(cache, hgx, h100, (six, {"gpu-vfio-0", "gpu-vfio-1"}, 6, 1),
                          "generation 2 replacing generation 1")
            await kubectl(cp, "delete", "resourceslice", f"{hgx}-{DRIVER}")
            await eventually(lambda: cache.slices.get(("", f"{hgx}-{DRIVER}")) is None,
                             what="the old slice's deletion seen")
            assert view_of(cache, hgx, h100) == (six, {"gpu-vfio-0", "gpu-vfio-1"}, 6, 1)
            # every slice deleted: no devices (the Bound record is lost capacity)
            await kubectl(cp, "delete", "resourceslice", f"{hgx}-gen2", f"{pcie}-{DRIVER}")
            await reaches(cache, hgx, h100, (set(), set(), 0, 0), "the HGX node's slices gone")
            await reaches(cache, pcie, vfio, (set(), set(), 0, 0), "the PCIe node's slices gone")
            node = cache.view.node(hgx)
            assert (node.class_devices, node.taken_devices) == ((), frozenset())
            tg.cancel_scope.cancel()
    finally:
        await kubectl(cp, "delete", "resourceslice", *slices, "--ignore-not-found", check=False)
        await kubectl(cp, "delete", "node", hgx, pcie, "--ignore-not-found", check=False)
        await kubectl(cp, "delete", "gpuclass", h100, vfio, "--ignore-not-found", check=False)
        await kubectl(cp, "delete", "resourceclaims,gpudevices", "--all", "-n", ns,
                      "--ignore-not-found", "--wait=false", check=False)


async def test_DR1_class_problems_and_the_Ready_condition_written_with_the_shipped_rbac(
        control_plane, controller_client):
    cp = control_plane
    typo, bad, good = unique("typo"), unique("badcel"), unique("good")
    missing = unique("missing.example.com")
    await apply(cp, device_class(), class_doc(typo, dc=missing),
                class_doc(bad, selectors=("device.attributes[",)), class_doc(good))
    cache = ClusterCache(controller_client, watch_timeout=30)
    keeper = Housekeeper(KubeClient(controller_client), cache, grace=timedelta(minutes=2),
                         raw_policy="allowed")

    async def ready(name: str):
        got = orjson.loads((await kubectl(cp, "get", "gpuclass", name, "-o", "json")).stdout)
        return next((c for c in (got.get("status") or {}).get("conditions") or []
                     if c["type"] == "Ready"), None)

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(cache.run)
            problems = {n: cache.view.classes()[n].problem for n in (typo, bad, good)}
            assert problems[typo] == f"DeviceClass {missing} does not exist"
            assert "does not compile" in problems[bad] and problems[good] is None
            await keeper.ensure_class_conditions()
            conds = {n: await ready(n) for n in (typo, bad, good)}
            assert (conds[typo]["status"], conds[typo]["reason"], conds[typo]["message"]) == (
                "False", "CannotServe", problems[typo])
            assert (conds[bad]["status"], conds[bad]["reason"], conds[bad]["message"]) == (
                "False", "CannotServe", problems[bad])
            assert (conds[good]["status"], conds[good]["reason"]) == ("True", "DeviceMode")
            # the DeviceClass appears: the class serves, and the leader says so
            dc = device_class()
            dc["metadata"]["name"] = missing
            await apply(cp, dc)
            await eventually(lambda: cache.view.classes()[typo].problem is None,
                             what="the class serving once its DeviceClass exists")
            await keeper.ensure_class_conditions()
            assert (await ready(typo))["status"] == "True"
            tg.cancel_scope.cancel()
    finally:
        await kubectl(cp, "delete", "gpuclass", typo, bad, good, "--ignore-not-found", check=False)
        await kubectl(cp, "delete", "deviceclass", missing, "--ignore-not-found", check=False)


async def test_DR2_a_tenant_cannot_write_a_claims_allocation(control_plane, make_tenant,
                                                            controller_client):
    """The attacker has what a namespace's `edit` role gives on claims (create, update,
    patch, delete) and tries to allocate a device to its claim: through the status
    subresource (forbidden), in the body of a create and of an update (the API server drops
    status there). No device is taken."""
    cp = control_plane
    tenant = make_tenant()
    node = unique("dra-victim")
    await kubectl(cp, "create", "role", "claims-edit", "-n", tenant.namespace,
                  "--verb=get,list,watch,create,update,patch,delete",
                  "--resource=resourceclaims.resource.k8s.io")
    await kubectl(cp, "create", "rolebinding", "claims-edit", "-n", tenant.namespace,
                  "--role=claims-edit", f"--user={tenant.user}")
    await apply(cp, device_class(), node_doc(node), resource_slice(node, HGX_H100_8))
    as_tenant = functools.partial(kubectl, cp, kubeconfig=tenant.kubeconfig, check=False)
    forged = {**claim_doc(tenant.namespace, "mine", 1),
              "status": {"allocation": allocation(node, ["gpu-vfio-3"])}}
    try:
        out = await as_tenant("create", "-f", "-", input=yaml.safe_dump(forged))
        assert out.returncode == 0, out.stderr
        patch = orjson.dumps({"status": {"allocation": allocation(node, ["gpu-vfio-3"])}}).decode()
        out = await as_tenant("patch", "resourceclaim", "mine", "-n", tenant.namespace,
                              "--subresource=status", "--type=merge", "-p", patch)
        assert out.returncode != 0 and "forbidden" in out.stderr.lower(), out.stderr
        assert "resourceclaims/status" in out.stderr
        out = await as_tenant("replace", "-f", "-", input=yaml.safe_dump({
            **forged, "metadata": {**forged["metadata"], "labels": {"edited": "by-tenant"}}}))
        assert out.returncode == 0, out.stderr
        got = orjson.loads((await kubectl(cp, "get", "resourceclaim", "mine", "-n",
                                          tenant.namespace, "-o", "json")).stdout)
        assert got["metadata"]["labels"] == {"edited": "by-tenant"} and "allocation" not in (got.get("status") or {})
        cache = ClusterCache(controller_client, watch_timeout=30)
        async with anyio.create_task_group() as tg:
            await tg.start(cache.run)
            n = cache.view.node(node)
            assert n is not None and n.taken_devices == frozenset()
            assert cache.claims.get((tenant.namespace, "mine")) is not None
            tg.cancel_scope.cancel()
    finally:
        await kubectl(cp, "delete", "resourceslice", f"{node}-{DRIVER}", "--ignore-not-found",
                      check=False)
        await kubectl(cp, "delete", "node", node, "--ignore-not-found", check=False)
        await kubectl(cp, "delete", "resourceclaims", "--all", "-n", tenant.namespace,
                      "--ignore-not-found", "--wait=false", check=False)


async def test_HL3_a_lost_device_is_told_on_its_node_and_record_with_the_shipped_rbac(
        control_plane, controller_client):
    """HL3 on a real API server, as the controller's ServiceAccount: a recorded GPU
    republished without its partitions (dra-driver-nvidia-gpu#1331) is lost
    (attribute-lost) and never free; the leader's worker writes one Warning GPUDeviceLost on
    the GPUDevice and one on the Node; the GPU leaving the slice is a new loss (left-slices),
    told again; the GPU back with its attributes is lost no more, its record untouched."""
    from k8s.housekeeping.lost import LostDevices
    from localcluster.dra_profiles import PARTITION_ATTRIBUTE
    from model.device.lost import LossReason
    from model.lost import lost_devices

    cp = control_plane
    hgx, ns, cls = unique("hl3-hgx"), unique("hl3"), unique("hgx")
    await kubectl(cp, "create", "namespace", ns)
    klass = class_doc(cls)
    klass["spec"]["topology"] = {"matchAttribute": PARTITION_ATTRIBUTE}
    await apply(cp, device_class(), node_doc(hgx), klass)
    dev = {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
           "metadata": {"name": "held", "namespace": ns}, "spec": {"class": cls}}
    await apply(cp, dev, resource_slice(hgx, HGX_H100_8))
    recorded = DeviceRef(DRIVER, hgx, "gpu-vfio-3")
    status = device_status_to_dict(DeviceStatus(Phase.BOUND, hgx, datetime.now(timezone.utc),
                                                device=recorded))
    await kubectl(cp, "patch", "gpudevice", "held", "-n", ns, "--subresource=status",
                  "--type=merge", "-p", orjson.dumps({"status": status}).decode())
    cache = ClusterCache(controller_client, watch_timeout=30)
    worker = LostDevices(KubeClient(controller_client), cache)

    def losses():
        return [(x.device, x.reason, x.records) for x in lost_devices(cache.view.snapshot())
                if x.node == hgx]

    async def events_of(namespace: str, name: str) -> list[tuple[str, str]]:
        got = orjson.loads((await kubectl(
            cp, "get", "events", "-n", namespace, "-o", "json", "--field-selector",
            f"involvedObject.name={name},reason=GPUDeviceLost")).stdout)
        return sorted((e["type"], e["message"].split(" is lost: ")[1][:24]) for e in got["items"])

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(cache.run)
            await eventually(lambda: cache.view.device((ns, "held")) is not None
                             and cache.view.node(hgx) is not None
                             and len(cache.view.node(hgx).devices_of(cls)) == 8,
                             what="the node's 8 GPUs and the record")
            assert losses() == []
            bare = resource_slice(hgx, HGX_H100_8)
            attrs = bare["spec"]["devices"][3]["attributes"]
            for key in [k for k in attrs if k.startswith("partition") or k == "gpuModuleID"]:
                del attrs[key]
            await apply(cp, bare)
            want = [("gpu-vfio-3", LossReason.ATTRIBUTE_LOST, ((ns, "held"),))]
            await eventually(lambda: losses() == want, what="gpu-vfio-3 lost its partitions")
            assert "gpu-vfio-3" not in cache.view.snapshot().free_devices(hgx, cls)
            now = datetime.now(timezone.utc)
            await worker.tell(now)
            await worker.tell(now)  # told once
            assert await events_of(ns, "held") == [("Warning", "published without gpu.nv")]
            assert await events_of("default", hgx) == [("Warning", "published without gpu.nv")]
            gone = resource_slice(hgx, HGX_H100_8)
            del gone["spec"]["devices"][3]
            await apply(cp, gone)
            want = [("gpu-vfio-3", LossReason.LEFT_SLICES, ((ns, "held"),))]
            await eventually(lambda: losses() == want, what="gpu-vfio-3 left the slice")
            await worker.tell(datetime.now(timezone.utc))
            assert await events_of(ns, "held") == [("Warning", "no longer published for "),
                                                   ("Warning", "published without gpu.nv")]
            await apply(cp, resource_slice(hgx, HGX_H100_8))
            await eventually(lambda: losses() == [], what="gpu-vfio-3 back")
            await worker.tell(datetime.now(timezone.utc))
            assert worker.lost_now == 0
            held = cache.view.device((ns, "held"))
            assert held.status.device == recorded and held.bound_node == hgx  # never touched
            tg.cancel_scope.cancel()
    finally:
        await kubectl(cp, "delete", "resourceslice", f"{hgx}-{DRIVER}", "--ignore-not-found",
                      check=False)
        await kubectl(cp, "delete", "node", hgx, "--ignore-not-found", check=False)
        await kubectl(cp, "delete", "gpuclass", cls, "--ignore-not-found", check=False)
        await kubectl(cp, "delete", "gpudevices", "--all", "-n", ns, "--ignore-not-found",
                      "--wait=false", check=False)
