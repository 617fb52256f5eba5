"""VMIs with KubeVirt in the loop, for the e2e tests marked `kubevirt`: the module-scoped
fixtures `system` (two replicas with a 15 s bind timeout) and `kubevirt` (the session's
KubeVirt; a test module imports both), a pool of KWOK nodes with a class KubeVirt permits,
KubeVirt's vmi-gpu example asking for template devices, creating it through the API server,
and its launcher Pod once kube-scheduler has bound it."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from localcluster.paths import KUBEVIRT_FIXTURES as FIXTURES
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas, unique
from tests.e2e.helpers import eventually

VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"


BASE_VMI = yaml.safe_load((FIXTURES / "vmi-gpu.yaml").read_text())


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """As conftest's `system`, with a bind timeout of 15 s (not 6): virt-api's webhooks and
    50 racing VMIs share two cores with everything else here."""
    args = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + ("--bind-timeout=15", "--attachment-grace=30"))


@pytest.fixture(scope="module")
def kubevirt(system, kubevirt_shared):
    """The session's KubeVirt (conftest's `kubevirt_shared`) for tests that also run this
    module's controller replicas (`system`, set up first)."""
    return kubevirt_shared


async def pool(fleet, kv, nodes: dict[str, dict], *, permit: bool = True):
    """A class of its own resource, KubeVirt permitting it (unless `permit` is False), a
    tenant, and nodes (short name -> Fleet.node keyword arguments, `units` the GPUs); waits
    until the controller's housekeeping has written the class's KubeVirtPermitted condition
    (so the webhook's cache has seen the KubeVirt CR). Returns (resource, class, {short:
    node}, tenant)."""
    res = f"{unique('gpu')}.example.com/gpu"
    cls = unique("cls")
    if permit:
        kv.set_permitted(kv.permitted + (res,))
    await fleet.gpu_class(cls, res)
    names = {}
    for short, kw in nodes.items():
        kw = dict(kw)
        names[short] = unique(short)
        await fleet.node(names[short], {res: kw.pop("units")}, **{"kwok": True, **kw})
    tenant = unique("t")
    await fleet.tenant(tenant)
    want = "True" if permit else "False"

    async def condition():
        got = await fleet.custom.get_cluster_custom_object("gpu.cozystack.io", "v1alpha1", "gpuclasses", cls)
        return [c for c in (got.get("status") or {}).get("conditions") or []
                if c["type"] == "KubeVirtPermitted" and c["status"] == want]
    await eventually(condition, timeout=30, what=f"GPUClass {cls} KubeVirtPermitted={want}")
    return res, cls, names, tenant


def vmi(name: str, cls: str, count: int, *, tolerations: list[dict] | None = None) -> dict:
    """KubeVirt's own vmi-gpu example asking for `count` template devices of `cls`."""
    v = copy.deepcopy(BASE_VMI)
    v["apiVersion"] = "kubevirt.io/v1"
    v["metadata"]["name"] = name
    v["metadata"]["annotations"] = {"gpu.cozystack.io/templates": f"{cls}={count}"}
    del v["spec"]["domain"]["devices"]["gpus"]  # the example's own P40 entry: ours replace it
    if tolerations:
        v["spec"]["tolerations"] = tolerations
    return v


async def create(fleet, ns: str, body: dict) -> tuple[dict | None, str]:
    """Create through the API server (gpu-binder's and virt-api's webhooks in the path):
    (the VMI, "") when admitted, (None, message) when denied."""
    try:
        return await fleet.custom.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS, body), ""
    except ApiException as exc:
        return None, json.loads(exc.body).get("message", "") if exc.body else str(exc)


def gpu_requests(pod: dict, res: str) -> int:
    """Units of `res` the Pod's containers request."""
    return sum(int((c.get("resources") or {}).get("requests", {}).get(res, 0))
               for c in pod["spec"].get("containers") or [])


async def launcher_pod(fleet, ns: str, uid: str) -> dict | None:
    """The one virt-launcher Pod of the VMI with `uid`; None while there is none (or more)."""
    pods = await fleet.core.list_namespaced_pod(ns, label_selector=f"kubevirt.io/created-by={uid}")
    items = [p.to_dict() for p in pods.items]
    return items[0] if len(items) == 1 else None


async def bound_launcher(fleet, ns: str, made: dict, timeout: float = 60) -> dict:
    """The VMI's one virt-launcher Pod once kube-scheduler has bound it (spec.nodeName)."""
    async def probe():
        pod = await launcher_pod(fleet, ns, made["metadata"]["uid"])
        return pod if pod and pod["spec"].get("node_name") else None
    pod = await eventually(probe, timeout=timeout, what=f"launcher Pod of {made['metadata']['name']} bound")
    pod["spec"]["nodeName"] = pod["spec"]["node_name"]
    pod["spec"]["containers"] = [{"resources": {"requests": (c.get("resources") or {}).get("requests") or {}}}
                                 for c in pod["spec"]["containers"]]
    return pod


def pin(made: dict) -> str:
    """The node an admitted VMI is pinned to (its nodeSelector's hostname)."""
    return made["spec"]["nodeSelector"]["kubernetes.io/hostname"]
