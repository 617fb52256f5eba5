"""The restart race (issue 13 item 3) with its interleaving pinned (issue 14): a tenant
deletes a VMI and re-creates it while the cache still shows the deleted incarnation's set
as admitted, and housekeeping's H2 release of that incarnation races the new admission.

The webhook (`VMIAdmission`), a `ClusterCache` and a `Housekeeper` run in the test's event
loop against the session's real API server; this module starts no controller replicas, so
nothing else housekeeps or binds, and the one housekeeping round runs exactly between the
writes it raced with in `test_attacks.py`'s fifty-round race (found there from the logs):

1. the cache still shows `gpu-0` and the template attached to the deleted incarnation
   (admission OLD) with its Succeeded request on one node, so the re-create (admission NEW)
   takes the set over (W4): a compare-and-set per device re-keying the attachment to NEW,
   no new request;
2. the template's take-over lands; then housekeeping's H2 clears `gpu-0` (attachment and
   request of the deleted incarnation), so `gpu-0`'s take-over fails its test and the
   admission goes afresh (W3);
3. the template now carries NEW's attachment beside OLD's request. With W3 (2) and (3) in
   one write per device, that member must still get NEW's request: skipping it as "a retry
   of this very write" left the request on `gpu-0` alone, partial, never acted on by the
   binder, and the re-create timed out.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import anyio
import pytest

from k8s.webhook.admission import VMIAdmission
from k8s.webhook.review import decode_request
from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping import Housekeeper
from model.requests import find_requests
from model.serialize import format_time
from model.types import ADMISSION_ANNOTATION, TEMPLATE_FOR_LABEL
from tests.e2e.helpers import eventually, make_pool

pytestmark = pytest.mark.anyio
GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"
VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"
GRACE = timedelta(seconds=8)


async def _admitted_then_deleted(fleet, old: str):
    """A pool whose VMI `rr` (admission `old`) was admitted on its node and then deleted:
    `gpu-0` and the template `rr-<class>-0` Bound there, attached to `rr` by `old`, with
    `old`'s Succeeded request, as the binder and the webhook left them."""
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 4}, devices=1)
    template = f"rr-{cls}-0"
    await fleet.custom.create_namespaced_custom_object(GROUP, VERSION, tenant, "gpudevices", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
        "metadata": {"name": template, "labels": {TEMPLATE_FOR_LABEL: "rr"}},
        "spec": {"class": cls}})
    now = format_time(datetime.now(timezone.utc))
    for name in ("gpu-0", template):
        await fleet.set_status(tenant, name, {
            "phase": "Bound", "nodeName": nodes["a"], "boundAt": now,
            "attachedTo": {"vmi": "rr", "since": now, "admission": old},
            "bindRequest": {"id": old, "vmi": "rr", "devices": ["gpu-0", template],
                            "requestedAt": now, "node": nodes["a"], "result": "Succeeded",
                            "message": f"placed {tenant}/rr request {old} on {nodes['a']}"}},
            "gpu-binder-webhook")
    await fleet.custom.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS, {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "rr", "annotations": {ADMISSION_ANNOTATION: old}},
        "spec": {"domain": {"devices": {}}}})
    return cls, nodes["a"], tenant, template


async def test_W3_W4_recreate_whose_take_over_loses_a_member_to_H2_puts_its_request_on_every_member(
        admin_client, fleet):
    old = uuid.uuid4().hex
    cls, node, tenant, template = await _admitted_then_deleted(fleet, old)
    cache = ClusterCache(admin_client, watch_timeout=5)
    webhook = VMIAdmission(KubeClient(admin_client), cache, bind_timeout=4, grace=GRACE)
    real_patch = webhook.api.patch_status
    template_taken_over = anyio.Event()
    raced: list[str] = []
    # the writes of the round that landed on this test's devices (the round is cluster-wide:
    # other tests' leftovers are its too). Counted per write, not by `actions_done` around
    # `_do`: a round's devices are worked on concurrently, so another device's action done
    # meanwhile made a refused one (the template's DeleteTemplate planned from the cache
    # that has not seen its take-over yet, its `test` failing: "moot") look done
    ours: list[str] = []

    class CountedClient(KubeClient):
        async def patch_status(self, res, ns, name, body, **kw) -> dict:
            out = await super().patch_status(res, ns, name, body, **kw)  # raises when refused
            if ns == tenant:
                ours.append(name)
            return out
    keeper = Housekeeper(CountedClient(admin_client, timeout=5.0), cache, grace=GRACE,
                         raw_policy="allowed")

    async def racing_patch(ns: str, name: str, ops: list[dict]) -> None:
        """The webhook's JSON Patch writes, with housekeeping's round between the W4
        take-over of the template (landed) and that of `gpu-0` (not yet sent)."""
        take_over = any(op["op"] == "replace" and op["path"] == "/status/attachedTo"
                        for op in ops)
        if take_over and name == "gpu-0":
            with anyio.fail_after(10):
                await template_taken_over.wait()
            await keeper.round()          # H2: the deleted incarnation's gpu-0 is released
            raced.append(f"housekeeping round done on: {', '.join(ours)}")
        await real_patch(ns, name, ops)
        if take_over and name == template:
            template_taken_over.set()
    webhook.api.patch_status = racing_patch  # type: ignore[method-assign]

    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "rr", "namespace": tenant,
                        "annotations": {"gpu.cozystack.io/devices": "gpu-0",
                                        "gpu.cozystack.io/templates": f"{cls}=1"}},
           "spec": {"domain": {"devices": {}}}}
    review = {"uid": "u1", "kind": {"group": "kubevirt.io", "version": "v1",
                                    "kind": "VirtualMachineInstance"},
              "namespace": tenant, "name": "rr", "operation": "CREATE", "object": vmi}
    answer: dict = {}
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)

        async def seen_deleted():  # the cache saw the incarnation and its deletion
            return (tenant, old) in cache.vmi_state().deleted
        await fleet.custom.delete_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant,
                                                           VMIS, "rr")
        await eventually(seen_deleted, timeout=10, what="tombstone of the deleted VMI")
        dev = cache.view.device((tenant, template))
        assert dev is not None and dev.status.attached_to.admission == old

        async def admit() -> None:
            answer.update(await webhook.handle(decode_request(review)))
        tg.start_soon(admit)

        async def new_request():
            got = {n: (await fleet.get_device(tenant, n)).get("status") or {}
                   for n in ("gpu-0", template)}
            ids = {(st.get("bindRequest") or {}).get("id") for st in got.values()}
            new = (got["gpu-0"].get("bindRequest") or {}).get("id")
            return got if new not in (None, old) and ids == {new} else None
        try:
            got = await eventually(new_request, timeout=3.5,
                                   what="the re-create's request on every member")
        except AssertionError:
            got = {n: (await fleet.get_device(tenant, n)).get("status") for n in
                   ("gpu-0", template)}
            raise AssertionError(f"the re-create's request is not on every member: {got}")
        # the race happened: the round cleared gpu-0, once, between the two take-overs, and
        # wrote nothing on the template (its DeleteTemplate, planned while the cache still
        # showed OLD's attachment, is refused by its `test` on the admission: NEW's stays)
        assert raced == ["housekeeping round done on: gpu-0"], (raced, ours)
        new = got["gpu-0"]["bindRequest"]["id"]
        for name, st in got.items():   # one admission: its attachment and its request
            assert st["attachedTo"]["admission"] == new, (name, st)
            assert st["bindRequest"]["devices"] == ["gpu-0", template], (name, st)
            assert "result" not in st["bindRequest"], (name, st)

        async def complete_in_cache():  # what the binder acts on: a complete request
            complete, partial = find_requests(
                d for d in cache.view.devices().values() if d.namespace == tenant)
            return [r.id for r in complete] == [new] and not partial
        await eventually(complete_in_cache, timeout=3,
                         what="the request complete as the binder groups it")

        async def answered():
            return bool(answer)
        await eventually(answered, timeout=15, what="the webhook's answer")
        tg.cancel_scope.cancel()
    # no binder runs here: the webhook times out, cleans up what it wrote (W5), denies
    assert answer["allowed"] is False
    assert f"not bound within 4 s (request {new})" in answer["status"]["message"]
    assert answer["status"]["code"] == 503   # retryable: the binder did not answer in time
    for name in ("gpu-0", template):
        st = (await fleet.get_device(tenant, name)).get("status") or {}
        assert "attachedTo" not in st and "bindRequest" not in st, (name, st)
