"""The informer across a kube-apiserver restart (HL1, DR2): DeviceTaintRules made while a new
kube-apiserver comes up (serving, not yet ready: the window in which the device-mode soak
saw a placement on a GPU under a NoExecute rule made 80 s earlier, bench soak 2026-12-06)
all reach the cache the binder decides on, and one deleted then is gone from it. The real
kube-apiserver and etcd; the informer lists and watches as the controller's does
(`k8s.informer.Informer`, optional and listed again every `TAINT_RELIST_S` as `ClusterCache` makes it). Waits are on named states."""

from __future__ import annotations

import threading
import time

import aiohttp
import anyio
import pytest
from kubernetes_asyncio.client import ApiException, CustomObjectsApi, ResourceV1beta2Api

from k8s.cache import TAINT_RELIST_S
from k8s.informer import Informer
from tests.e2e.conftest import unique
from tests.e2e.helpers import eventually

pytestmark = pytest.mark.anyio

RULES = ("resource.k8s.io", "v1beta2", "devicetaintrules")
MADE_DURING_START = 6


def rule(name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "no-such-node",
                                        "device": "gpu-vfio-0"},
                     "taint": {"key": "gpu.example.com/restart", "value": "x",
                               "effect": "NoSchedule"}}}


def restart_in_a_lasting_thread(cp) -> threading.Event:
    """Kill kube-apiserver and start it again from a thread that never exits (its processes
    die with the thread that forked them, `ControlPlane.restart_apiserver`); the event is
    set once /readyz answers."""
    ready = threading.Event()

    def run() -> None:
        cp.restart_apiserver()
        ready.set()
        threading.Event().wait()    # outlive the new kube-apiserver

    threading.Thread(target=run, name="apiserver-restart", daemon=True).start()
    return ready


async def made(api: CustomObjectsApi, body: dict, deadline: float) -> None:
    """`body` created, retried through the restart's connection errors and 5xx/429/403."""
    while True:
        try:
            await api.create_cluster_custom_object(*RULES, body, _request_timeout=10)
            return
        except ApiException as exc:
            if exc.status == 409:
                return
            if exc.status not in (403, 404, 429) and exc.status < 500:
                raise
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass    # no kube-apiserver listening yet, or the connection cut by the kill
        if time.monotonic() > deadline:
            raise TimeoutError(f"DeviceTaintRule {body['metadata']['name']} not created")
        await anyio.sleep(0.1)


async def test_HL1_rules_made_while_kube_apiserver_restarts_reach_the_informer(
        control_plane, admin_client):
    api = CustomObjectsApi(admin_client)
    inf = Informer("devicetaintrules", ResourceV1beta2Api(admin_client).list_device_taint_rule,
                   optional=True, relist_every=TAINT_RELIST_S)
    before = unique("before")
    await made(api, rule(before), time.monotonic() + 30)
    names = [unique("during") for _ in range(MADE_DURING_START)]
    async with anyio.create_task_group() as tg:
        await tg.start(inf.run)
        await eventually(lambda: ("", before) in inf.keys(), what="the first rule in the cache")
        ready = restart_in_a_lasting_thread(control_plane)
        deadline = time.monotonic() + 120
        for n in names:     # one after another through the start, each as soon as it is taken
            await made(api, rule(n), deadline)
        await api.delete_cluster_custom_object(*RULES, before)
        ready_at = await anyio.to_thread.run_sync(ready.wait, 120)
        assert ready_at, "kube-apiserver not ready again in 120 s"

        def follows() -> bool:
            keys = {k[1] for k in inf.keys()}
            return set(names) <= keys and before not in keys
        await eventually(follows, timeout=60, what=f"the informer holding {names}, not {before}")
        tg.cancel_scope.cancel()
    for n in names:
        await api.delete_cluster_custom_object(*RULES, n)
