"""Housekeeping on the real API server (leader only): H1, H2 (GPUDevices, and the ResourceClaims
the webhook made for device-mode VMIs, DR5), the claim of an admitted device-mode VMI made
again from the record when someone deleted it (DR6, `Housekeeper.restore_claims`) and the
settings ConfigMap (H3).

Decisions come from the pure, level-based `model.housekeeping.plan` over the cache's
`vmi_state()` (live VMIs with uid and admission, tombstones of deleted incarnations); this
module carries them out with field manager `gpu-binder-housekeeping`. A round is skipped
while an informer it reads is unhealthy (its cache may be behind). Every destructive step is
confirmed first with a live GET of the VMI (`model.housekeeping.confirmed`); clearing an
attachment is a JSON Patch that `test`s the attachment as planned (its admission id, else
its `since`), and a template is deleted with uid and resourceVersion preconditions after its
attachment is cleared (the shipped policy refuses deleting an attached device), so an action
planned from a stale cache never undoes a newer admission.

H4: with the VirtualMachines (`vms`, the leader's VM informer, shared with
`k8s.vm_waiting`) and the classes' `keepSetFor`, a set whose VMI went away while its VM
exists is kept: `keptUntil` is written on each device (after a live read confirms the VMI
incarnation is gone) and a Normal Event `GPUSetKept` on the VM says until when; a kept set
is released (rule H4) once its time ran out, or once a live read confirms its VM is gone,
with an Event `GPUSetReleased` on the VM. While the VM informer is not synced, no set is
newly kept and a kept one is released only when its time ran out. While a set is kept and its
VM has no VMI, the VM carries the status condition `GPUSetKept` (True: the node, the devices,
until when; `model.housekeeping.KEPT_CONDITION`), removed once the keep ends; virt-controller
drops it itself once the VM has a VMI. It is written with a JSON Patch that `test`s the VM's
resourceVersion as cached, only the `conditions` list, as `k8s.vm_waiting` writes
`GPUSetReady`. Metrics: `kept_now` (sets kept as of the last round), `released_by` (sets
released, by cause: `vm_deleted`, `expired`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import anyio
import structlog

from actors.workqueue import QueueShutDown, WorkQueue
from k8s import errors, events
from k8s.cache import SETTINGS_NAME, ClusterCache
from k8s.client import GPU_CLASSES, GPU_DEVICES, RESOURCE_CLAIMS, VMIS, VMS, KubeClient
from k8s.informer import Informer
from k8s.rounds import RoundLoop
from model.housekeeping import (KEPT_CONDITION, KEPT_REASON, KUBEVIRT_CONDITION, READY_CONDITION, Action,
                                DeleteTemplate, KeepAttachment, LinkAttachment, VMIRecord, VMRecord,
                                confirmed, kept_for_vms, kubevirt_condition, plan, ready_condition,
                                set_keeps)
from model.vm import run_strategy
from model.admission import AdmissionPlan
from model.claim import (MANAGED_BY, MANAGED_BY_LABEL, Claim, DeleteClaim, RestoreClaim,
                         build_claim, claim_name, claim_record, members_of, missing_claims,
                         parse_claim, restorable_into, stale_claims)
from model.parse import format_time
from model.types import ADMISSION_ANNOTATION, Attachment
from model.settings import device_class_names, format_resource_names, resource_names

log = structlog.get_logger("gpu_binder.housekeeping")

FIELD_MANAGER = "gpu-binder-housekeeping"


def desired_settings(cache: ClusterCache, raw_policy: str) -> dict[str, str]:
    """H3: the settings ConfigMap's `data` for the GPUClasses in the cache: the count-mode
    resource names, the managed DeviceClasses (`deviceClassNames`, DR5: the claims policy
    refuses tenants' claims and claim templates on them under `denied`) and the policy."""
    classes = cache.view.classes().values()
    return {"resourceNames": format_resource_names(resource_names(classes)),
            "deviceClassNames": format_resource_names(device_class_names(classes)),
            "rawResourceNames": raw_policy}


class Housekeeper:
    """Runs H1–H3 every `period` seconds and whenever devices, VMIs, classes or the settings
    ConfigMap change (`coalesce` seconds after the first change of a burst; `k8s.rounds`).
    `client` makes its API calls (its timeout bounds each; writes carry field manager
    `gpu-binder-housekeeping`); `grace` is `attachmentGrace`; `answer_window` (the bind timeout)
    is how long a refused request is left to the webhook that wrote it; up to `concurrency` devices
    are worked on at once. Errors are logged per action and the action is retried on the
    next round. `rounds` counts the rounds completed (paused ones included).

    The settings ConfigMap is the parameter of the shipped ValidatingAdmissionPolicies, whose
    bindings say `parameterNotFoundAction: Deny`: while it is missing they deny every Pod,
    VMI, ResourceClaim and ResourceClaimTemplate they match (kubernetes#133827: never
    `Allow`, which silently stops enforcing `rawResourceNames: denied`). `settings_present` is what H3 last found (None before its
    first look; False while it is missing and could not be created), `settings_recreated`
    counts the times H3 found it missing and created it; an absence H3 repairs or cannot
    repair is told by a Warning Event `PolicyParameterMissing` on it (best effort)."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, grace: timedelta,
                 raw_policy: str, period: float = 5.0, concurrency: int = 16,
                 coalesce: float = 0.2, answer_window: timedelta = timedelta(0),
                 vms: Informer | None = None) -> None:
        self._client = client.using(field_manager=FIELD_MANAGER)
        self.vms = vms  # H4: the VirtualMachines (None: no set is ever kept)
        self.kept_sets = 0
        self.released_sets = 0
        self.kept_now: int | None = None  # H4: sets kept as of the last round (None: no round yet)
        self.released_by = {"vm_deleted": 0, "expired": 0}  # H4: sets released, by cause
        self.condition_writes = 0
        self._events: dict[tuple[str, str, str, str],
                           tuple[str, str, datetime | None, str, str]] = {}
        self._now = datetime.now(timezone.utc)
        self._set_keep: dict[tuple[str, str], timedelta | None] = {}
        self._released_keeps: dict[tuple[str, str], datetime] = {}
        """H4: (namespace, admission id) of kept sets this replica released -> when; their
        claims are deleted without the grace (`release_claims`). Forgotten after `grace`
        (the H1/H2 rule covers the claim then) and on a change of leader (likewise)."""
        self.cache = cache
        self.grace = grace
        self.answer_window = answer_window
        self.raw_policy = raw_policy
        self.period = period
        self.concurrency = concurrency
        self.coalesce = coalesce
        self.actions_done = 0
        self.paused_rounds = 0
        self.rounds = 0
        self.settings_present: bool | None = None
        self.settings_recreated = 0
        self._paused = False
        self.claims_period = period
        """Seconds between two lists of the claims the binder made, while no claim informer
        is in the cache (`_managed_claims`)."""
        self.claims_deleted = 0
        self.claims_restored = 0
        """DR6: claims of admitted VMIs made again from the record (`restore_claims`)."""
        self._claims_listed: float | None = None

    async def run(self) -> None:
        """Loop until cancelled: a round now, then one after every change of the devices,
        VMIs, classes, the settings ConfigMap or KubeVirt CRs (a burst of changes coalesced
        into one round `coalesce` seconds after its first) and at least every `period`."""
        await RoundLoop(self.round, period=self.period, coalesce=self.coalesce, sources=(
            self.cache.devices, self.cache.vmis, self.cache.classes, self.cache.settings,
            self.cache.kubevirts, *((self.vms,) if self.vms is not None else ()))).run()

    def vm_records(self) -> dict[tuple[str, str], VMRecord] | None:
        """H4: the VirtualMachines as the VM informer has them; None while it does not follow
        the API server (or there is none): no set is then newly kept nor released for its VM
        being gone."""
        if self.vms is None or not self.vms.healthy:
            return None
        out: dict[tuple[str, str], VMRecord] = {}
        for vm in self.vms.items():
            meta = vm.get("metadata") or {}
            ns, name = meta.get("namespace"), meta.get("name")
            if isinstance(ns, str) and isinstance(name, str):
                out[(ns, name)] = VMRecord(ns, name, str(meta.get("uid") or ""),
                                           run_strategy(vm), bool(meta.get("deletionTimestamp")))
        return out

    def keeps(self) -> dict[str, timedelta | None]:
        """H4: each GPUClass's keepSetFor (None: off)."""
        return {name: c.keep_set_for for name, c in self.cache.view.classes().items()}

    async def round(self, now: datetime | None = None) -> None:
        """One pass of H1, H2 (the binder's claims included) and H3; H1/H2 pause while the devices' or VMIs' informer is
        unhealthy (what the cache shows may be long gone or missing)."""
        now = now or datetime.now(timezone.utc)
        if not self.cache.healthy(self.cache.devices, self.cache.vmis):
            self.paused_rounds += 1
            if not self._paused:
                log.warning("housekeeping paused: an informer is not following the API "
                            "server", rule="H2", devices=self.cache.devices.healthy,
                            vmis=self.cache.vmis.healthy)
            self._paused = True
        else:
            if self._paused:
                log.info("housekeeping resumed: informers follow the API server", rule="H2")
            self._paused = False
            self._now = now
            devices = list(self.cache.view.devices().values())
            keeps = self.keeps()
            self._set_keep = set_keeps(devices, keeps)[0]
            kept = kept_for_vms(devices, now)
            self.kept_now = len(kept)
            vms = self.vm_records()
            await self._carry_out(plan(devices, self.cache.vmi_state(), now, self.grace,
                                       self.answer_window, keeps=keeps, vms=vms))
            await self._set_events(now)
            if vms is not None:
                await self._kept_conditions(kept, now)
            await self.release_claims(now)
            await self.restore_claims(now)
        if self.cache.healthy(self.cache.classes, self.cache.settings):
            await self.ensure_settings()
        if self.cache.healthy(self.cache.classes, self.cache.kubevirts):
            await self.ensure_class_conditions()
        self.rounds += 1

    async def _carry_out(self, actions: list[Action]) -> None:
        """Carry out a round's `actions`: a device's own in plan order, different devices
        concurrently, at most `concurrency` API calls in flight (each action is confirmed
        and written on its own device only, so their order across devices does not matter);
        returns when all are done (each call bounded by the client's timeout). The devices are keys
        of a work queue served by `concurrency` workers: a device is never worked on by two
        at once."""
        per_device: dict[tuple[str, str], list[Action]] = {}
        for action in actions:
            per_device.setdefault(action.device, []).append(action)
        work: WorkQueue[tuple[str, str]] = WorkQueue()
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

    async def ensure_class_conditions(self) -> None:
        """Each GPUClass's conditions, merge-patched into its status when the cache shows
        one differs: `Ready` (`model.housekeeping.ready_condition`: False with the class's
        problem, DR1) on every class, and `KubeVirtPermitted`
        (`model.housekeeping.kubevirt_condition`) on count-mode classes (a device-mode
        class's GPUs come from claims, not permittedHostDevices)."""
        permitted = self.cache.permitted_resources()
        classes = self.cache.view.classes()
        for raw in self.cache.classes.items():
            meta = raw.get("metadata") or {}
            name = meta.get("name")
            cls = classes.get(name) if isinstance(name, str) else None
            if cls is None:
                continue  # not parsed (logged by the cache)
            wanted = {READY_CONDITION: ready_condition(cls)}
            if not cls.device_mode and cls.resource_name:
                wanted[KUBEVIRT_CONDITION] = kubevirt_condition(cls.resource_name, permitted)
            conds = [c for c in (raw.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]
            gen = meta.get("generation")
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            out, changed = [], []
            for c in conds:
                if c.get("type") not in wanted:
                    out.append(c)
            for ctype, (status, reason, message) in wanted.items():
                have = next((c for c in conds if c.get("type") == ctype), None)
                if have is not None and (have.get("status"), have.get("reason"), have.get("message"),
                                         have.get("observedGeneration")) == (status, reason, message, gen):
                    out.append(have)
                    continue
                when = (have.get("lastTransitionTime") if have is not None and have.get("status") == status
                        else now)
                cond = {"type": ctype, "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": when}
                if isinstance(gen, int):
                    cond["observedGeneration"] = gen
                out.append(cond)
                changed.append((ctype, status, reason))
            if not changed:
                continue
            try:
                await self._client.patch_status(
                    GPU_CLASSES, None, name, {"status": {"conditions": out}},
                    what=f"patch GPUClass {name} status")
                for ctype, status, reason in changed:
                    log.info("GPUClass condition written", gpu_class=name, condition=ctype,
                             status=status, reason=reason)
            except errors.ApiError as err:  # retried next round
                log.warning("GPUClass condition write failed", gpu_class=name, error=str(err)[:300])

    async def _live_vmi(self, ns: str, name: str) -> VMIRecord | None:
        """The VMI as the API server has it now; None when it does not exist. Raises
        ApiError when that cannot be told."""
        try:
            raw = await self._client.get(VMIS, ns, name)
        except errors.NotFound as err:
            if err.names(name):
                return None
            raise
        meta = raw.get("metadata") or {}
        adm = (meta.get("annotations") or {}).get(ADMISSION_ANNOTATION)
        return VMIRecord(ns, name, str(meta.get("uid") or ""), adm or None)

    async def _live_vm_keeps(self, ns: str, name: str, owner: str | None) -> bool:
        """H4: whether VirtualMachine `ns/name` exists now (a live read) with uid `owner` and
        is not being deleted. Raises ApiError when that cannot be told."""
        try:
            raw = await self._client.get(VMS, ns, name)
        except errors.NotFound as err:
            if err.names(name):
                return False
            raise
        meta = raw.get("metadata") or {}
        return bool(owner) and meta.get("uid") == owner and not meta.get("deletionTimestamp")

    def _note(self, kind: str, ns: str, vmi: str, uid: str | None, device: str,
              node: str | None, until: datetime | None, reason: str, cause: str = "") -> None:
        """Remember a kept or released device of VM `ns/vmi` (uid `uid`) for this round's
        Events; `cause` of a release: `vm_deleted` or `expired`."""
        key = (kind, ns, vmi, uid or "")
        devs, nodes, _, _, _ = self._events.get(key, ("", "", None, "", ""))
        devs = f"{devs}, {device}" if devs else device
        if node and node not in nodes.split(", "):
            nodes = f"{nodes}, {node}" if nodes else node
        self._events[key] = (devs, nodes, until, reason, cause)

    async def _set_events(self, now: datetime) -> None:
        """One Event per VM whose set was kept (`GPUSetKept`, Normal: until when) or released
        (`GPUSetReleased`) this round; best effort."""
        pending, self._events = self._events, {}
        for (kind, ns, vm, uid), (devs, nodes, until, reason, cause) in sorted(pending.items()):
            if kind == "kept":
                self.kept_sets += 1
                msg = (f"GPU set of VirtualMachine {ns}/{vm} (devices {devs} on node {nodes}) "
                       f"kept until {format_time(until)} (keepSetFor): its next VMI starts "
                       "there with the same devices; deleting the VM releases them")
            else:
                self.released_sets += 1
                self.released_by[cause] = self.released_by.get(cause, 0) + 1
                msg = f"GPU set of VirtualMachine {ns}/{vm} (devices {devs}) released: {reason}"
            log.info("H4 " + kind, rule="H4", namespace=ns, vm=vm, devices=devs,
                     until=format_time(until) if until else None)
            body = events.event_body(
                {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": vm,
                 "namespace": ns, **({"uid": uid} if uid else {})},
                reason="GPUSetKept" if kind == "kept" else "GPUSetReleased", message=msg,
                warning=False, instance="housekeeping", when=now)
            await events.record(self._client, body, rule="H4", namespace=ns, name=vm)

    async def _kept_conditions(self, kept: dict, now: datetime) -> None:
        """H4: the `GPUSetKept` condition on each VM (module doc): True while a set is kept
        for it (`kept`: `model.housekeeping.kept_for_vms` of this round's devices, for this
        VM's uid) and it has no VMI, removed otherwise. A VM with a VMI is left alone
        (virt-controller keeps only the VMI's conditions on it). Written only when it
        differs from the cached VM; best effort (retried next round)."""
        live = self.cache.vmi_state().live
        for vm in self.vms.items() if self.vms is not None else ():
            meta = vm.get("metadata") or {}
            key = (meta.get("namespace"), meta.get("name"))
            if key in live or not isinstance(key[0], str) or not isinstance(key[1], str):
                continue
            status = vm.get("status") if isinstance(vm.get("status"), dict) else {}
            conds = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
            have = next((c for c in conds if c.get("type") == KEPT_CONDITION), None)
            k = kept.get(key)
            if k is not None and (k.owner != meta.get("uid") or meta.get("deletionTimestamp")):
                k = None
            if k is None and have is None:
                continue
            want = None if k is None else {
                "type": KEPT_CONDITION, "status": "True", "reason": KEPT_REASON,
                "message": k.message()[:1024],
                "lastTransitionTime": (have or {}).get("lastTransitionTime")
                if (have or {}).get("status") == "True" else format_time(now),
                "lastProbeTime": None}
            if want is not None and have is not None and all(
                    have.get(f) == want[f] for f in ("status", "reason", "message")):
                continue
            others = [c for c in conds if c.get("type") != KEPT_CONDITION]
            new = others + ([want] if want is not None else [])
            ns, name = key
            ops: list[dict] = [{"op": "test", "path": "/metadata/resourceVersion",
                                "value": meta.get("resourceVersion")},
                               {"op": "add", "path": "/status/conditions", "value": new}
                               if status else
                               {"op": "add", "path": "/status", "value": {"conditions": new}}]
            try:
                await self._client.patch_status(
                    VMS, ns, name, ops, what=f"write the {KEPT_CONDITION} condition of VM {ns}/{name}")
            except errors.ApiError as err:  # a newer VM (Conflict/Invalid: the test) or gone
                if not isinstance(err, (errors.Invalid, errors.Conflict, errors.NotFound)):
                    log.warning("VM condition not written", rule="H4", vm=f"{ns}/{name}",
                                condition=KEPT_CONDITION, error=str(err)[:300])
                continue
            self.condition_writes += 1
            log.info("VM condition written", rule="H4", vm=f"{ns}/{name}",
                     condition=KEPT_CONDITION, status="True" if want else None)

    def _attachment_tests(self, key: tuple[str, str], att: Attachment) -> list[dict]:
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

    def _kept(self, key: tuple[str, str]) -> Attachment | None:
        """The device's attachment as the cache has it (H4 reads its keep)."""
        dev = self.cache.view.device(key)
        return dev.status.attached_to if dev is not None else None

    async def _keep(self, action: KeepAttachment, what: str) -> None:
        """H4: write `keptUntil` on the device, after live reads confirm that the VMI
        incarnation is gone and the VM exists with the recorded uid (so a live VMI's set is
        never given an end, nor a deleted VM's set kept); a `test` of the attachment as
        planned."""
        ns, name = action.device
        live = await self._live_vmi(ns, action.vmi)
        if not confirmed(action.vmi, action.uid, live, action.admissions):
            log.warning("H4 keep not confirmed: the VMI exists (the cache is behind)",
                        rule="H4", namespace=ns, device=name, vmi=action.vmi)
            return
        if not await self._live_vm_keeps(ns, action.vmi, action.owner):
            log.info("H4 keep not confirmed: the VM is gone; released next round",
                     rule="H4", namespace=ns, device=name, vm=action.vmi)
            return
        att = Attachment(action.vmi, action.since, action.admission)
        await self._patch(ns, name, self._attachment_tests(action.device, att) + [
            {"op": "test", "path": "/status/attachedTo/owner", "value": action.owner},
            {"op": "add", "path": "/status/attachedTo/keptUntil",
             "value": format_time(action.until)}], what)
        self.actions_done += 1
        dev = self.cache.view.device(action.device)
        log.info("housekeeping", rule="H4", action="KeepAttachment", namespace=ns,
                 device=name, vm=action.vmi, until=format_time(action.until))
        self._note("kept", ns, action.vmi, action.owner, name,
                   dev.status.node_name if dev else None, action.until, action.reason)

    async def _patch(self, ns: str, name: str, ops: list[dict], what: str) -> dict:
        return await self._client.patch_status(GPU_DEVICES, ns, name, ops, what=what)

    async def _clear(self, key: tuple[str, str], att: Attachment, what: str) -> dict:
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

    async def _do(self, action: Action) -> None:
        ns, name = action.device
        what = f"{type(action).__name__} {ns}/{name}"
        try:
            if isinstance(action, LinkAttachment):
                att = Attachment(action.vmi, action.since, action.admission)
                await self._patch(ns, name, self._attachment_tests(action.device, att) + [
                    {"op": "add", "path": "/status/attachedTo/uid", "value": action.uid}], what)
                self.actions_done += 1
                log.info("housekeeping", rule=action.rule, action="LinkAttachment",
                         namespace=ns, device=name, vmi=action.vmi, uid=action.uid)
                return
            if isinstance(action, KeepAttachment):
                await self._keep(action, what)
                return
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
                live = await self._live_vmi(ns, vmi)
                if not confirmed(vmi, uid, live, action.admissions):
                    log.warning("housekeeping action not confirmed: the VMI exists (the "
                                "cache is behind)", rule=action.rule, namespace=ns,
                                device=name, vmi=vmi)
                    return
            kept = self._kept(action.device)
            if kept is not None and kept.owner and (
                    (kept.kept_until is not None and kept.kept_until > self._now)
                    or (kept.kept_until is None
                        and self._set_keep.get((ns, kept.admission or "")) is not None)):
                # H4: released (or not kept) for its VM being gone: the VM is read live
                if await self._live_vm_keeps(ns, kept.vmi, kept.owner):
                    log.warning("housekeeping action not confirmed: the VM exists (the cache "
                                "is behind)", rule=action.rule, namespace=ns, device=name,
                                vm=kept.vmi)
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
                     namespace=ns, device=name, reason=action.reason)
            if kept is not None and kept.kept_until is not None:
                if kept.admission:  # H4: the set's claim goes with it (`release_claims`)
                    self._released_keeps[(ns, kept.admission)] = self._now
                self._note("released", ns, kept.vmi, kept.owner, name, None, None,
                           action.reason, "expired" if kept.kept_until <= self._now
                           else "vm_deleted")
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

    # -- H1/H2 for the ResourceClaims the binder made (DR5) -----------------------------
    async def _managed_claims(self) -> list[Claim] | None:
        """The claims the binder made (label `app.kubernetes.io/managed-by: gpu-binder`):
        from the cache's claim informer when it has one (`cache.claims`, parsed at ingest;
        none: only while it is not healthy), else listed live through the client at most
        every `claims_period` seconds (None between two lists: nothing to judge this round).
        Raises ApiError."""
        informer = getattr(self.cache, "claims", None)
        if informer is not None:
            if not self.cache.healthy(informer):
                return None
            return [obj["parsed"] for obj in informer.items() if obj["parsed"].managed]
        t = anyio.current_time()
        if self._claims_listed is not None and t - self._claims_listed < self.claims_period:
            return None
        self._claims_listed = t
        return [parse_claim(raw) for raw in await self._client.list(
            RESOURCE_CLAIMS, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
            what="list ResourceClaims made by gpu-binder")]

    async def release_claims(self, now: datetime) -> None:
        """H1/H2 for the claims the binder made (DR5; `model.claim.stale_claims`): deleted
        once no VMI of their name exists, no device is attached to that name, and the grace
        since the claim was made or last confirmed has passed; each confirmed by a live read
        of the VMI first (never on the cache's word) and deleted with uid and resourceVersion
        preconditions (an admission that confirmed it since changed its version: moot).
        H4: the claim of a kept set this replica released (`_released_keeps`) is deleted
        without the grace, once the released devices are no longer attached in the cache."""
        self._released_keeps = {k: t for k, t in self._released_keeps.items()
                                if now - t <= self.grace}
        try:
            claims = await self._managed_claims()
        except errors.ApiError as err:  # retried next round
            log.warning("housekeeping cannot list claims", rule="H1", error=str(err)[:300])
            return
        if not claims:
            return
        records = [r for r in map(claim_record, claims) if r is not None]
        attached = {(d.namespace, d.status.attached_to.vmi)
                    for d in self.cache.view.devices().values() if d.status.attached_to}
        live = set(self.cache.vmi_state().live)
        for action in stale_claims(records, attached, live, now, self.grace,
                                   released=self._released_keeps):
            await self._delete_claim(action)

    async def _delete_claim(self, action: DeleteClaim) -> None:
        c = action.claim
        what = f"DeleteClaim {c.namespace}/{c.name}"
        try:
            if await self._live_vmi(c.namespace, c.vmi) is not None:
                log.warning("housekeeping action not confirmed: the VMI exists (the cache is "
                            "behind)", rule=action.rule, namespace=c.namespace, claim=c.name,
                            vmi=c.vmi)
                return
            await self._client.delete(RESOURCE_CLAIMS, c.namespace, c.name, uid=c.uid,
                                      resource_version=c.resource_version, what=what)
            self.actions_done += 1
            self.claims_deleted += 1
            log.info("housekeeping", rule=action.rule, action="DeleteClaim",
                     namespace=c.namespace, claim=c.name, vmi=c.vmi, reason=action.reason)
        except errors.ApiError as err:
            if isinstance(err, (errors.NotFound, errors.Conflict)):
                log.info("housekeeping action moot", rule=action.rule, action="DeleteClaim",
                         namespace=c.namespace, claim=c.name, reason=err.message[:200])
            else:
                log.warning("housekeeping action failed", rule=action.rule,
                            action="DeleteClaim", namespace=c.namespace, claim=c.name,
                            error=str(err)[:300])

    # -- DR6: the claim of an admitted VMI, made again from the record ------------------
    async def restore_claims(self, now: datetime) -> None:
        """DR6 (every admitted device-mode VMI has exactly one claim naming its recorded
        devices): a live VMI the binder admitted whose claim someone deleted before its
        launcher Pod took it (`model.claim.missing_claims`: nothing of the name in the claim
        informer, the set recorded whole) gets the claim made again from the record, so the
        Pod, which waits for it, is allocated exactly the recorded devices and the VMI is not
        left half-admitted. Confirmed first by a live read of the VMI: the same incarnation,
        neither being deleted nor finished, its own wiring the record's
        (`model.claim.restorable_into`); then the claim is created, without reading it first:
        AlreadyExists means one of the name is there after all, and nothing is made. Told by
        a Warning log line and a Warning Event `GPUClaimRestored` on the VMI. Skipped while the claim informer does not
        follow the API server (or there is none)."""
        informer = getattr(self.cache, "claims", None)
        if informer is None or not self.cache.healthy(informer):
            return
        device_mode = {n for n, c in self.cache.view.classes().items() if c.device_mode}
        if not device_mode:
            return
        for restore in missing_claims(self.cache.view.devices().values(),
                                      self.cache.vmi_state().live, set(informer.keys()),
                                      device_mode):
            await self._restore_claim(restore, now)

    async def _restore_claim(self, r: RestoreClaim, now: datetime) -> None:
        name = claim_name(r.vmi)
        what = f"RestoreClaim {r.namespace}/{name}"
        ctx = {"rule": "DR6", "namespace": r.namespace, "claim": name, "vmi": r.vmi}
        try:
            members = members_of(self.cache.view.snapshot(),
                                 AdmissionPlan(r.namespace, r.vmi, r.devices, (), r.node), r.node)
            if not isinstance(members, tuple):
                log.warning("claim of an admitted VMI missing; not made again: the record "
                            "does not give its devices", reason=str(members), **ctx)
                return
            try:
                raw = await self._client.get(VMIS, r.namespace, r.vmi)
            except errors.NotFound as err:
                if err.names(r.vmi):
                    return  # gone: H2 and the claim's own H1/H2 take it from here
                raise
            why = restorable_into(raw, r, members)
            if why is not None:
                log.info("claim of an admitted VMI missing; not made again", why=why, **ctx)
                return
            body = build_claim(r.namespace, r.vmi, members, r.admission, now)
            # The create is the live read of the claim: AlreadyExists proves one of the name
            # is there (the informer is behind, or it was made meanwhile), whoever made it; a
            # claim is never adopted or replaced, so nothing else needs reading to decide.
            await self._client.create(RESOURCE_CLAIMS, r.namespace, body, what=what)
        except errors.ApiError as err:
            if isinstance(err, errors.AlreadyExists):
                log.info("claim of an admitted VMI missing; not made again",
                         why="a claim of the name is there (the cache was behind)", **ctx)
                return
            log.warning("housekeeping action failed", action="RestoreClaim",
                        error=str(err)[:300], **ctx)
            return
        self.actions_done += 1
        self.claims_restored += 1
        devices = ", ".join(f"{m.device}={m.ref.device}" for m in members)
        log.warning("claim of an admitted VMI was missing; made again from the record",
                    action="RestoreClaim", node=r.node, devices=devices, admission=r.admission,
                    **ctx)
        body = events.event_body(
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": r.vmi,
             "namespace": r.namespace, "uid": r.uid},
            reason="GPUClaimRestored", warning=True, instance="housekeeping", when=now,
            message=f"ResourceClaim {r.namespace}/{name} of this VMI was deleted before its "
                    f"launcher Pod took it; made again from the binder's record (node {r.node}, "
                    f"devices {devices}). Delete the VMI to release its GPUs.")
        await events.record(self._client, body, **ctx)

    async def ensure_settings(self) -> None:
        """H3: create the settings ConfigMap, or replace its data when the cache shows drift.
        A create answered AlreadyExists means the cache was behind: it is present."""
        want = desired_settings(self.cache, self.raw_policy)
        have = self.cache.settings.get((self.cache.settings_namespace, SETTINGS_NAME))
        if have is not None and (have.get("data") or {}) == want:
            self.settings_present = True
            return
        meta = {"name": SETTINGS_NAME, "namespace": self.cache.settings_namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpu-binder"}}
        try:
            if have is None:
                await self._create_settings(meta, want)
            else:  # replace: data becomes exactly `want`, extra keys included (H3)
                self.settings_present = True
                body = dict(have)
                body["metadata"] = {**have["metadata"], "labels": {
                    **(have["metadata"].get("labels") or {}), **meta["labels"]}}
                body["data"] = want
                await self._client.replace_config_map(
                    self.cache.settings_namespace, SETTINGS_NAME, body,
                    what="apply ConfigMap gpu-settings")
            log.info("settings ConfigMap written", rule="H3", namespace=self.cache.settings_namespace,
                     drift=have is not None, **want)
        except errors.ApiError as err:  # retried next round
            log.warning("settings ConfigMap write failed", rule="H3", error=str(err)[:300])

    async def _create_settings(self, meta: dict, want: dict[str, str]) -> None:
        """Create the missing settings ConfigMap; keep `settings_present` and
        `settings_recreated` and tell an absence by an Event (see the class). Raises the
        create's error (translated) unless it is AlreadyExists."""
        try:
            await self._client.create_config_map(
                self.cache.settings_namespace,
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": want},
                what="create ConfigMap gpu-settings")
        except errors.ApiError as err:  # sorted here
            if isinstance(err, errors.AlreadyExists):
                self.settings_present = True  # the cache is behind; drift is seen next round
                return
            if self.settings_present is not False:  # once per absence
                await self._parameter_event(
                    "missing, and H3 cannot create it: the shipped policies deny every Pod, "
                    "VMI, ResourceClaim and ResourceClaimTemplate they match until it exists "
                    "(parameterNotFoundAction: Deny): "
                    f"{str(err)[:300]}")
            self.settings_present = False
            raise
        self.settings_recreated += 1
        self.settings_present = True
        await self._parameter_event(
            "was missing, and H3 created it: until then the shipped policies denied every Pod, "
            "VMI, ResourceClaim and ResourceClaimTemplate they match (parameterNotFoundAction: "
            "Deny)")

    async def _parameter_event(self, message: str) -> None:
        """A Warning Event `PolicyParameterMissing` about ConfigMap gpu-settings (the
        policies' parameter), logged as well; best effort (a failure is logged)."""
        ns = self.cache.settings_namespace
        log.warning("policy parameter missing", rule="H3", namespace=ns, name=SETTINGS_NAME,
                    message=message)
        involved = {"apiVersion": "v1", "kind": "ConfigMap", "name": SETTINGS_NAME,
                    "namespace": ns}
        body = events.event_body(
            involved, reason="PolicyParameterMissing", warning=True, instance="housekeeping",
            when=datetime.now(timezone.utc),
            message=f"ConfigMap {ns}/{SETTINGS_NAME}, the parameter of ValidatingAdmissionPolicies "
                    f"gpu-binder-raw-pods, gpu-binder-raw-vmis and gpu-binder-raw-claims, {message}")
        await events.record(self._client, body, rule="H3", namespace=ns, name=SETTINGS_NAME)
