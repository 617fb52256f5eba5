"""Housekeeping never acts on a stale cache (issue 13 item 7, docs/contract.md §5 H2): it pauses
while an informer it reads is failing, confirms every destructive step with a live read of
the VMI, and holds across an API server outage. No uid is recorded in an attachment (issue 40):
the VMI's admission annotation names its incarnation.

A `Housekeeper` and its `ClusterCache` run in the test's event loop against the session's
real API server; this module starts no controller replicas, so nothing else housekeeps. The
faults are a watch that errors (the VMI informer's list call made to fail) and a cache
that is behind (a VMI dropped from the informer's cache), and the API server stopped 30 s.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from kubernetes_asyncio.client import ApiException

from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping import Housekeeper
from tests.e2e.helpers import eventually, make_pool

pytestmark = pytest.mark.anyio
GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"
LONG_AGO = "2026-01-01T00:00:00Z"   # an attachment far older than the grace


async def _attached(fleet, ns: str, name: str = "gpu-0") -> dict | None:
    return ((await fleet.get_device(ns, name)).get("status") or {}).get("attachedTo")


async def _running_vmi(fleet, ns: str, name: str, admission: str) -> dict:
    """A VMI as the webhook would have admitted it (no webhook is registered here)."""
    return await fleet.custom.create_namespaced_custom_object(
        "kubevirt.io", "v1", ns, "virtualmachineinstances", {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name,
                         "annotations": {"gpu.cozystack.io/admission": admission}},
            "spec": {"domain": {"devices": {}}}})


async def _pool_with_attached_device(fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 2}, devices=1)
    await fleet.set_status(tenant, "gpu-0", {
        "phase": "Bound", "nodeName": nodes["a"], "boundAt": LONG_AGO,
        "attachedTo": {"vmi": "v", "since": LONG_AGO, "admission": "a1"}},
        "gpu-binder-webhook")
    return tenant


def _keeper(admin_client, cache) -> Housekeeper:
    return Housekeeper(KubeClient(admin_client, timeout=5.0), cache, grace=timedelta(seconds=5),
                       raw_policy="allowed", period=0.3)


async def test_H2_housekeeping_pauses_while_the_vmi_watch_errors_and_confirms_with_a_live_read(
        control_plane, admin_client, fleet):
    tenant = await _pool_with_attached_device(fleet)
    cache = ClusterCache(admin_client, watch_timeout=1)
    keeper = _keeper(admin_client, cache)
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        working = cache.vmis._list_fn

        async def failing(*args, **kwargs):
            raise ApiException(status=500, reason="injected: VMI list/watch fails")
        cache.vmis._list_fn = failing      # from its next (re)watch on, every call errors
        await eventually(lambda: not cache.vmis.healthy, timeout=10, interval=0.05,
                         what="the VMI informer failing")
        await _running_vmi(fleet, tenant, "v", "a1")   # exists; the VMI cache cannot see it
        tg.start_soon(keeper.run)
        await eventually(lambda: keeper.rounds >= 10, timeout=15, interval=0.05,
                         what="ten housekeeping rounds")  # the attachment is far past the grace
        assert await _attached(fleet, tenant) is not None, \
            "housekeeping cleared the attachment of a running VMI its failing informer missed"
        assert keeper.paused_rounds > 0 and not cache.vmis.healthy
        # the watch recovers: the VMI is seen, and no uid is recorded (issue 40: its
        # admission id names its incarnation; one write less per admission) ...
        cache.vmis._list_fn = working
        key = (tenant, "v")
        await eventually(lambda: cache.vmis.healthy and key in cache.vmi_state().live,
                         timeout=15, interval=0.05, what="the VMI seen once the watch recovers")
        done = keeper.rounds
        await eventually(lambda: keeper.rounds >= done + 3, timeout=15, interval=0.05,
                         what="three rounds that see the VMI")
        seen = await _attached(fleet, tenant)
        assert seen is not None and "uid" not in seen and seen["admission"] == "a1", seen
        # ... then the cache falls behind: it loses the VMI that still exists
        cache.vmis._cache.pop(key)
        cache.vmis._tell(key, None)  # the listeners: the view and housekeeping's rounds
        done = keeper.rounds
        await eventually(lambda: keeper.rounds >= done + 3, timeout=15, interval=0.05,
                         what="three rounds on the cache that is behind")
        att = await _attached(fleet, tenant)
        assert att == seen, "housekeeping acted on a cache that was behind, without a live read"
        # a real delete is released at once (H2)
        await fleet.custom.delete_namespaced_custom_object(
            "kubevirt.io", "v1", tenant, "virtualmachineinstances", "v")

        async def released():
            return await _attached(fleet, tenant) is None
        await eventually(released, timeout=15, what="H2 release after the delete")
        tg.cancel_scope.cancel()


async def test_H2_api_server_stopped_30s_releases_nothing_and_h2_resumes_after(
        control_plane, admin_client, fleet):
    tenant = await _pool_with_attached_device(fleet)
    await _running_vmi(fleet, tenant, "v", "a1")
    cache = ClusterCache(admin_client, watch_timeout=5)
    keeper = _keeper(admin_client, cache)
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        tg.start_soon(keeper.run)
        await eventually(lambda: keeper.rounds >= 2, timeout=15, interval=0.05,
                         what="a whole round with the VMI running")
        control_plane.stop_apiserver()
        try:
            await anyio.sleep(30)  # the outage itself: six times the grace
        finally:  # in this thread: its children die with the thread that forked them
            control_plane.start_apiserver()   # (PR_SET_PDEATHSIG), so not in a worker thread

        async def synced():
            return cache.healthy()
        await eventually(synced, timeout=60, what="informers relisted after the outage")
        done = keeper.rounds
        await eventually(lambda: keeper.rounds >= done + 2, timeout=15, interval=0.05,
                         what="a whole round after the outage")
        assert keeper.paused_rounds > 0  # it paused while its informers could not follow
        assert await _attached(fleet, tenant) is not None, \
            "housekeeping released a running VMI's device across the outage"
        await fleet.custom.delete_namespaced_custom_object(
            "kubevirt.io", "v1", tenant, "virtualmachineinstances", "v")

        async def released():
            return await _attached(fleet, tenant) is None
        await eventually(released, timeout=15, what="H2 release after the outage")
        tg.cancel_scope.cancel()


async def test_H2_same_name_vmi_of_another_admission_releases_the_older_attachment(
        control_plane, admin_client, fleet):
    """A leader that never saw the delete (no tombstone) and finds the name re-created by
    another admission (its `gpu.cozystack.io/admission` differs; W7 keeps it as admitted):
    the older attachment is another incarnation's, confirmed with a live read, and released
    though no device of it records a uid. The same attachment under a VMI carrying its admission id
    is kept."""
    tenant = await _pool_with_attached_device(fleet)
    await _running_vmi(fleet, tenant, "v", "a2")   # the name, admitted afresh elsewhere
    cache = ClusterCache(admin_client, watch_timeout=5)
    keeper = _keeper(admin_client, cache)
    kept = await _pool_with_attached_device(fleet)
    await _running_vmi(fleet, kept, "v", "a1")     # the attachment's own incarnation
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        tg.start_soon(keeper.run)

        async def released():
            return await _attached(fleet, tenant) is None
        await eventually(released, timeout=15, what="H2 release of the older incarnation's")
        done = keeper.rounds
        await eventually(lambda: keeper.rounds >= done + 2, timeout=15, interval=0.05,
                         what="two more rounds")
        att = await _attached(fleet, kept)
        assert (att["vmi"], att["since"], att["admission"]) == ("v", LONG_AGO, "a1"), att
        tg.cancel_scope.cancel()
