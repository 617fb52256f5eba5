"""H1, H2 and H4 on the GPUDevices: a round's plan (`model.housekeeping.plan`) carried out.

Every destructive step is confirmed first with a live GET of the VMI
(`model.housekeeping.confirmed`), and for a set kept for a VirtualMachine (H4) a live GET of
the VM; clearing an attachment is a JSON Patch that `test`s the attachment as planned (its
admission id, else its `since`), and a template is deleted with uid and resourceVersion
preconditions after its attachment is cleared (the shipped policy refuses deleting an
attached device), so an action planned from a stale cache never undoes a newer admission.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Mapping

import anyio

from actors.workqueue import QueueShutDown, WorkQueue
from k8s import errors
from k8s.cache import ClusterCache
from k8s.client import GPU_DEVICES, KubeClient
from k8s.housekeeping.common import live_vm_keeps, live_vmi, log
from k8s.housekeeping.kept import KeptSets
from model.housekeeping import (Action, DeleteTemplate, KeepAttachment, LinkAttachment,
                                confirmed)
from model.housekeeping_reasons import Rule
from model.serialize import format_time
from model.types import Attachment

Key = tuple[str, str]


class DeviceWorker:
    """Carries out the device actions of a round (`carry_out`): up to `concurrency` devices
    at once, each action confirmed and written on its own device only. Keeps and releases
    of H4 are told to `kept` (its Events, the claims of released keeps). `actions_done`
    counts the actions carried out. Errors are logged per action and the action is retried
    on the next round."""

    def __init__(self, client: KubeClient, cache: ClusterCache, kept: KeptSets, *,
                 concurrency: int = 16) -> None:
        self._client = client
        self.cache = cache
        self.kept = kept
        self.concurrency = concurrency
        self.actions_done = 0
        self._now = datetime.now(timezone.utc)
        self._set_keep: Mapping[Key, timedelta | None] = {}

    async def carry_out(self, actions: list[Action], now: datetime | None = None,
                        set_keep: Mapping[Key, timedelta | None] | None = None) -> None:
        """Carry out a round's `actions` (planned at `now`; `set_keep`: each set's keep,
        `model.housekeeping.set_keeps`): a device's own in plan order, different devices
        concurrently, at most `concurrency` API calls in flight (each action is confirmed
        and written on its own device only, so their order across devices does not matter);
        returns when all are done (each call bounded by the client's timeout). The devices are
        keys of a work queue served by `concurrency` workers: a device is never worked on by
        two at once."""
        if now is not None:
            self._now = now
        self._set_keep = {} if set_keep is None else set_keep  # a Mapping worked out on lookup
        per_device: dict[Key, list[Action]] = {}
        for action in actions:
            per_device.setdefault(action.device, []).append(action)
        work: WorkQueue[Key] = WorkQueue()
        work.add_all(per_device)
        work.shutdown()  # nothing more this round: the workers end once it is empty

        async def worker() -> None:
            while True:
                try:
                    key = work.get_nowait()
                except QueueShutDown:
                    return
                try:
                    for action in per_device[key]:
                        await self._do(action)
                finally:
                    work.done(key)

        async with anyio.create_task_group() as tg:
            for _ in range(min(self.concurrency, len(per_device))):
                tg.start_soon(worker)

    def _attachment_tests(self, key: Key, att: Attachment) -> list[dict]:
        """JSON Patch tests that hold only on the attachment as planned."""
        ops = [{"op": "test", "path": "/status/attachedTo/vmi", "value": att.vmi}]
        if att.admission:  # this very attachment, not one a newer admission wrote
            ops.append({"op": "test", "path": "/status/attachedTo/admission",
                        "value": att.admission})
        else:  # written before admission ids: its `since` as the cache has it, verbatim
            raw = ((self.cache.devices.get(key) or {}).get("status") or {}).get("attachedTo")
            since = (raw or {}).get("since") or format_time(att.since)
            ops.append({"op": "test", "path": "/status/attachedTo/since", "value": since})
        return ops

    def _cached(self, key: Key) -> Attachment | None:
        """The device's attachment as the cache has it (H4 reads its keep)."""
        dev = self.cache.view.device(key)
        return dev.status.attached_to if dev is not None else None

    async def _patch(self, ns: str, name: str, ops: list[dict], what: str) -> dict:
        return await self._client.patch_status(GPU_DEVICES, ns, name, ops, what=what)

    async def _clear(self, key: Key, att: Attachment, what: str) -> dict:
        """Clear `att` on device `key` (and a bindRequest for the same VMI); the response.
        `what` names the action in errors."""
        ns, name = key
        ops = self._attachment_tests(key, att) + [{"op": "remove", "path": "/status/attachedTo"}]
        dev = self.cache.view.device(key)
        br = dev.status.bind_request if dev else None
        if br is not None and br.vmi == att.vmi:
            ops += [{"op": "test", "path": "/status/bindRequest/id", "value": br.id},
                    {"op": "remove", "path": "/status/bindRequest"}]
        return await self._patch(ns, name, ops, what)

    async def _link(self, action: LinkAttachment, what: str) -> None:
        """H2: record the VMI's uid in the attachment as planned (`LinkAttachment`: only an
        attachment without an admission id is linked since issue 40)."""
        ns, name = action.device
        att = Attachment(action.vmi, action.since, action.admission)
        await self._patch(ns, name, self._attachment_tests(action.device, att) + [
            {"op": "add", "path": "/status/attachedTo/uid", "value": action.uid}], what)
        self.actions_done += 1
        log.info("housekeeping", rule=action.rule, action="LinkAttachment",
                 namespace=ns, device=name, vmi=action.vmi, uid=action.uid)

    async def _keep(self, action: KeepAttachment, what: str) -> None:
        """H4: write `keptUntil` on the device, after live reads confirm that the VMI
        incarnation is gone and the VM exists with the recorded uid (so a live VMI's set is
        never given an end, nor a deleted VM's set kept); a `test` of the attachment as
        planned."""
        ns, name = action.device
        live = await live_vmi(self._client, ns, action.vmi)
        if not confirmed(action.vmi, action.uid, live, action.admissions):
            log.warning("H4 keep not confirmed: the VMI exists (the cache is behind)",
                        rule=Rule.H4, namespace=ns, device=name, vmi=action.vmi)
            return
        if not await live_vm_keeps(self._client, ns, action.vmi, action.owner):
            log.info("H4 keep not confirmed: the VM is gone; released next round",
                     rule=Rule.H4, namespace=ns, device=name, vm=action.vmi)
            return
        att = Attachment(action.vmi, action.since, action.admission)
        await self._patch(ns, name, self._attachment_tests(action.device, att) + [
            {"op": "test", "path": "/status/attachedTo/owner", "value": action.owner},
            {"op": "add", "path": "/status/attachedTo/keptUntil",
             "value": format_time(action.until)}], what)
        self.actions_done += 1
        dev = self.cache.view.device(action.device)
        log.info("housekeeping", rule=Rule.H4, action="KeepAttachment", namespace=ns,
                 device=name, vm=action.vmi, until=format_time(action.until))
        self.kept.note_kept(ns, action.vmi, action.owner, name,
                            dev.status.node_name if dev else None, action.until)

    async def _vm_still_keeps(self, ns: str, kept: Attachment | None) -> bool:
        """H4: whether a device's cached attachment `kept` is kept (or about to be) for a VM
        that a live read finds still there: a release planned for its VM being gone then
        waits. Raises ApiError when that cannot be told."""
        if kept is None or not kept.owner or not (
                (kept.kept_until is not None and kept.kept_until > self._now)
                or (kept.kept_until is None
                    and self._set_keep.get((ns, kept.admission or "")) is not None)):
            return False
        return await live_vm_keeps(self._client, ns, kept.vmi, kept.owner)

    async def _do(self, action: Action) -> None:
        """One action on its device (see the module); never raises but cancellation."""
        ns, name = action.device
        what = f"{type(action).__name__} {ns}/{name}"
        try:
            if isinstance(action, LinkAttachment):
                await self._link(action, what)
                return
            if isinstance(action, KeepAttachment):
                await self._keep(action, what)
                return
            await self._release(action, what)
        except Exception as exc:  # noqa: BLE001 - per action, so one device never stops a
            err = errors.translate(exc, what)  # round; retried on the next one
            if isinstance(err, (errors.NotFound, errors.Invalid, errors.Conflict)):
                log.info("housekeeping action moot", rule=action.rule,
                         action=type(action).__name__, namespace=ns, device=name,
                         reason=err.message[:200])
            else:
                log.warning("housekeeping action failed", rule=action.rule,
                            action=type(action).__name__, namespace=ns, device=name,
                            error=str(err)[:300])

    async def _release(self, action: Action, what: str) -> None:
        """H1/H2/H4: clear an attachment (`ClearAttachment`) or delete a template device
        (`DeleteTemplate`, its attachment cleared first), once the live reads agree."""
        ns, name = action.device
        if isinstance(action, DeleteTemplate):
            att = action.attached
            dev = self.cache.view.device(action.device)
            vmi = att.vmi if att else (dev.template_for if dev else None)
            uid = att.uid if att else None
        else:
            att = Attachment(action.vmi, action.since, action.admission, action.uid) \
                if action.since else None
            vmi, uid = action.vmi, action.uid
        if vmi is not None:  # never on the cache's word alone: the VMI is read live
            live = await live_vmi(self._client, ns, vmi)
            if not confirmed(vmi, uid, live, action.admissions):
                log.warning("housekeeping action not confirmed: the VMI exists (the "
                            "cache is behind)", rule=action.rule, namespace=ns,
                            device=name, vmi=vmi)
                return
        kept = self._cached(action.device)
        if await self._vm_still_keeps(ns, kept):  # H4: released for its VM gone: read live
            log.warning("housekeeping action not confirmed: the VM exists (the cache "
                        "is behind)", rule=action.rule, namespace=ns, device=name,
                        vm=kept.vmi if kept else None)
            return
        if isinstance(action, DeleteTemplate):
            raw = self.cache.devices.get(action.device) or {}
            rv = (raw.get("metadata") or {}).get("resourceVersion")
            if att is not None:  # clear first; delete only the version that cleared
                rv = ((await self._clear(action.device, att, what)).get("metadata")
                      or {}).get("resourceVersion")
            await self._client.delete(GPU_DEVICES, ns, name, uid=action.uid,
                                      resource_version=rv, what=what)
        else:
            if att is None:
                return
            await self._clear(action.device, att, what)
        self.actions_done += 1
        log.info("housekeeping", rule=action.rule, action=type(action).__name__,
                 namespace=ns, device=name, reason=action.reason.render())
        if kept is not None and kept.kept_until is not None:
            self.kept.note_released(ns, kept.vmi, kept.owner, name, kept.admission,
                                    action.reason, self._now,
                                    expired=kept.kept_until <= self._now)
