"""The VMI admission webhook's steps on the real API server (DESIGN.md §4, W1–W6).

`VMIAdmission.handle(request)` is the pure-ish handler behind `k8s.webhook.transport`: it judges with
`model.admission.check` (W1, no writes), stops on a dry run (W2), then (W3) creates the
template devices, writes `attachedTo` and the one `bindRequest` on every device in a single
optimistic write per device (steps 2 and 3 together: the request is complete only once
every member carries it), and waits on the informer — never polling the API — for the
binder's results. It admits with a JSONPatch pinning the VMI, or cleans up what it wrote and denies
(W5). Repeated calls are idempotent (W4). Writes use field manager `gpu-binder-webhook`.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable, Sequence

import anyio
import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from k8s import errors
from k8s.cache import ClusterCache
from k8s.webhook.transport import allow, deny, patch_response
from k8s.webhook.waiter import ResultWaiter
from model.admission import (AdmissionPlan, Refusal, already_admitted, attachment_is_live,
                             check, effective_resources, node_selector_of, same_name_conflict,
                             unknown_annotations, unpermitted_gpu_entries, vmi_patch)
from model.housekeeping import VMIs
from model.parse import (ParseError, format_time, parse_gpu_device, parse_tolerations, parse_vmi_request,
                         tolerations_to_list)
from model.types import GROUP, TEMPLATE_FOR_LABEL, VERSION, Result


log = structlog.get_logger("gpu_binder.admission")

FIELD_MANAGER = "gpu-binder-webhook"
JSON_PATCH = "application/json-patch+json"


class Denied(Exception):
    """A step found a reason to refuse; `message` is shown to the user."""


class VMIAdmission:
    """Handles VMI CREATE AdmissionReviews. `bind_timeout` (seconds) bounds the wait for
    the binder; `grace` is `attachmentGrace`; `clock` returns aware UTC time."""

    def __init__(self, api: ApiClient, cache: ClusterCache, *, bind_timeout: float,
                 grace: timedelta, clock: Callable[[], datetime] | None = None,
                 timeout: float = 5.0) -> None:
        self.custom = CustomObjectsApi(api)
        self.core = CoreV1Api(api)
        self.cache = cache
        self.bind_timeout = bind_timeout
        self.grace = grace
        self.now = clock or (lambda: datetime.now(timezone.utc))
        self.timeout = timeout
        self.waiter = ResultWaiter(cache)
        self.admitted = 0
        self.denied = 0
        self.draining = False
        self._inflight: set[anyio.CancelScope] = set()

    async def drain(self, timeout: float = 5.0) -> None:
        """Shutdown: refuse new reviews, cancel the ones in flight (each cleans up what it
        wrote, under a shield, and answers with a denial), and wait for them, bounded."""
        self.draining = True
        for scope in list(self._inflight):
            scope.cancel()
        with anyio.move_on_after(timeout):
            while self._inflight:
                await anyio.sleep(0.02)

    # -- entry -------------------------------------------------------------------------
    @staticmethod
    def _refuse(req: dict, message: str, code: int, reason: str) -> dict:
        """W1/W6: deny before any judgement or write (bad kind or operation, malformed
        object or annotations, unknown annotation, no name), logged as one JSON line naming
        the request (uid) and, when known, the VMI, as every later denial is."""
        obj = req.get("object") if isinstance(req.get("object"), dict) else {}
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        ns, name = req.get("namespace") or meta.get("namespace"), meta.get("name") or req.get("name")
        log.info("VMI denied", uid=str(req.get("uid"))[:64],
                 namespace=ns if isinstance(ns, str) else None,
                 vmi=name if isinstance(name, str) else None, code=code, reason=message[:300])
        return deny(req["uid"], message, code, reason)

    async def handle(self, req: dict) -> dict:
        """AdmissionRequest dict → AdmissionResponse dict. Never raises for bad input."""
        uid = req["uid"]
        kind = req.get("kind") if isinstance(req.get("kind"), dict) else {}
        if (kind.get("group"), kind.get("kind")) != ("kubevirt.io", "VirtualMachineInstance"):
            return self._refuse(req, f"gpu-binder admits only kubevirt.io VirtualMachineInstances, got "
                             f"{kind.get('group')!r}/{kind.get('kind')!r}", 400, "BadRequest")
        if req.get("operation") != "CREATE":
            return self._refuse(req, f"gpu-binder handles CREATE only, got {req.get('operation')!r}",
                        400, "BadRequest")
        obj = req.get("object")
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            return self._refuse(req, "request.object.metadata must be an object", 400, "BadRequest")
        annotations = meta.get("annotations")
        if annotations is not None and not (
                isinstance(annotations, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items())):
            return self._refuse(req, "metadata.annotations must map strings to strings", 400, "BadRequest")
        namespace = req.get("namespace") or meta.get("namespace")
        name = meta.get("name") or req.get("name")
        unknown = unknown_annotations(annotations)
        if unknown is not None:
            return self._refuse(req, unknown.message, 422, "Invalid")
        try:
            ask = parse_vmi_request(annotations)
        except ParseError as exc:
            return self._refuse(req, f"invalid GPU annotations on VMI {namespace}/{name}: {exc.field}: "
                             f"{exc.problem}", 422, "Invalid")
        if ask is None:
            return allow(uid)
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        try:
            tolerations = parse_tolerations(spec.get("tolerations"))
        except ParseError as exc:
            return self._refuse(req, f"invalid VMI {namespace}/{name}: {exc.field}: {exc.problem}", 422, "Invalid")
        if not isinstance(namespace, str) or not namespace or not isinstance(name, str) or not name:
            return self._refuse(req, "a VMI asking for GPUs needs metadata.name and a namespace "
                             "(generateName is not supported)", 422, "Invalid")
        if self.draining:
            return deny(uid, "gpu-binder replica is shutting down; retry", 503,
                        "ServiceUnavailable")
        scope = anyio.CancelScope()
        self._inflight.add(scope)
        bound = structlog.contextvars.bound_contextvars(namespace=namespace, vmi=name)
        try:
            with bound, scope:
                try:
                    resp = await self._admit(uid, namespace, name, obj, ask,
                                             bool(req.get("dryRun")), tolerations)
                except Denied as exc:
                    self.denied += 1
                    log.info("VMI denied", reason=str(exc)[:500], dry_run=bool(req.get("dryRun")))
                    if not req.get("dryRun"):  # W2: a dry run writes nothing, Events included
                        await self._event(namespace, name, str(exc))
                    return deny(uid, str(exc))
        finally:
            self._inflight.discard(scope)
        if scope.cancelled_caught:  # drained: what this call wrote was cleaned up
            self.denied += 1
            return deny(uid, "gpu-binder replica shut down while admitting; retry", 503,
                        "ServiceUnavailable")
        self.admitted += 1
        return resp

    # -- steps -------------------------------------------------------------------------
    async def _admit(self, uid: str, ns: str, vmi: str, obj: dict, ask, dry_run: bool,
                     tolerations: tuple = ()) -> dict:
        deadline = anyio.current_time() + self.bind_timeout  # steps 1-4 share bindTimeout
        # a live read first: the API server refuses a duplicate name only after admission, so
        # a create of a live name must be denied here, before any write could move, re-pin or
        # strip that VMI's devices
        if await self._vmi_exists(ns, vmi):
            raise Denied(f"VMI {ns}/{vmi} already exists; delete it first or choose another name")
        vmis = self.cache.vmi_state().without((ns, vmi))
        snap = self.cache.view.snapshot()
        now = self.now()
        selector = node_selector_of(obj, self.cache.launcher_defaults())  # B3: the launcher's
        permitted = self.cache.permitted_resources()
        plan = check(snap, ns, vmi, ask, vmis, now, self.grace,
                     node_selector=selector, tolerations=tolerations, permitted=permitted)
        if isinstance(plan, Refusal):
            raise Denied(plan.message)
        kept = unpermitted_gpu_entries(obj, effective_resources(snap), permitted)
        if kept is not None:
            raise Denied(kept.message)
        admission = uuid.uuid4().hex  # unique to this call: keys its attachments and clean-up
        node = already_admitted(snap, plan)
        took_over = False
        if node is not None and not dry_run:  # W4: same set, already Succeeded on one node
            if await self._take_over(ns, vmi, plan, snap, admission, now):
                log.info("VMI already admitted; no new request", node=node, admission=admission)
                return self._admit_response(uid, obj, plan, node, admission)
            took_over = True  # maybe in part; a device changed meanwhile: admit afresh
            snap = self.cache.view.snapshot()
        elif node is not None:
            return allow(uid, "dry run: GPU devices were checked but not reserved")
        conflict = same_name_conflict(snap, plan, vmis, now, self.grace, admission)
        if conflict is not None:
            if took_over:
                await self._clean_up(ns, vmi, admission, list(plan.devices), [])
            raise Denied(conflict.message)
        if dry_run:  # W2
            return allow(uid, "dry run: GPU devices were checked but not reserved")
        # what this call may have written, recorded *before* each write is awaited, so a
        # cancellation after the server applied it still cleans it up (W5)
        created: list[str] = []   # template devices this call creates
        attached: list[str] = []
        request_id = admission
        try:
            # W3 (1)-(3) in order; within a step the set's devices go concurrently (bounded).
            # Every template is created (AlreadyExists: found in place), never skipped on the
            # cache's word: housekeeping may just have deleted an older incarnation's.
            created.extend(name for name, _ in plan.templates)
            classes = dict(plan.templates)

            async def create(item: tuple[str, str]) -> None:            # W3 (1)
                if not await self._create_template(ns, vmi, item[0], item[1]):
                    created.remove(item[0])  # it existed: a retry of ours made it (W4)
            await _each(create, list(plan.templates))
            body = {"id": request_id, "vmi": vmi, "devices": list(plan.devices),
                    "requestedAt": format_time(self.now())}
            if selector:
                body["nodeSelector"] = dict(selector)
            if tolerations:  # B3: the binder judges taints against the VMI's own tolerations
                body["tolerations"] = tolerations_to_list(tolerations)
            attached.extend(plan.devices)
            # W3 (2) and (3) in one optimistic write per device: the request is complete
            # (acted on by the binder) only once every member carries it
            await _each(lambda name: self._attach(ns, vmi, name, now, admission, vmis,
                                                  classes.get(name), created, body),
                        plan.devices)
            devs = await self.waiter.wait(ns, request_id, plan.devices,
                                          max(0.5, deadline - anyio.current_time()))
        except BaseException as exc:
            await self._clean_up(ns, vmi, admission, attached, created)
            if isinstance(exc, Denied | errors.ApiError):
                raise Denied(str(exc)) from exc
            raise
        if devs is None:                                                # W5 timeout
            await self._clean_up(ns, vmi, admission, attached, created)
            raise Denied(f"GPU set of VMI {ns}/{vmi} was not bound within "
                         f"{self.bind_timeout:.0f} s (request {request_id}); try again")
        nodes = {d.status.bind_request.node for d in devs}
        if all(d.status.bind_request.result is Result.SUCCEEDED for d in devs) and len(nodes) == 1:
            node = nodes.pop()
            log.info("VMI admitted", node=node, request_id=request_id, devices=list(plan.devices))
            return self._admit_response(uid, obj, plan, node, admission)
        message = next((d.status.bind_request.message for d in devs
                        if d.status.bind_request.result is Result.REFUSED), None)
        await self._clean_up(ns, vmi, admission, attached, created)
        raise Denied(message or f"GPU set of VMI {ns}/{vmi} was refused by the binder")

    async def _vmi_exists(self, ns: str, vmi: str) -> bool:
        """Whether the API server has VMI `ns/vmi` now (a live read, not the cache). Raises
        Denied when it cannot tell (fail closed)."""
        try:
            await self.custom.get_namespaced_custom_object(
                "kubevirt.io", "v1", ns, "virtualmachineinstances", vmi,
                _request_timeout=self.timeout)
            return True
        except Exception as exc:  # noqa: BLE001
            err = errors.translate(exc, f"read VMI {ns}/{vmi}")
            if isinstance(err, errors.NotFound) and errors.names_object(exc, vmi):
                return False
            raise Denied(f"cannot confirm that VMI {ns}/{vmi} does not exist yet: "
                         f"{err.message[:200]}; retry") from exc

    async def _take_over(self, ns: str, vmi: str, plan: AdmissionPlan, snap, admission: str,
                         now: datetime) -> bool:
        """W4: every device already carries a Succeeded request for this VMI name on one
        node; re-key each attachment to this admission (compare-and-set on the request and
        the attachment as read), so housekeeping judging an older incarnation of the name
        cannot clear it afterwards. No new request, nothing moves. False (and whatever was
        re-keyed left to this admission's VMI or to housekeeping) when a device changed."""
        async def one(name: str) -> None:
            dev = snap.device(ns, name)
            att, br = dev.status.attached_to, dev.status.bind_request
            ops: list[dict[str, Any]] = [
                {"op": "test", "path": "/status/bindRequest/id", "value": br.id},
                {"op": "test", "path": "/status/attachedTo/vmi", "value": vmi}]
            if att.admission:  # the attachment as read, not one written since
                ops.append({"op": "test", "path": "/status/attachedTo/admission",
                            "value": att.admission})
            else:
                ops.append({"op": "test", "path": "/status/attachedTo/since",
                            "value": format_time(att.since)})
            ops.append({"op": "replace", "path": "/status/attachedTo", "value": {
                "vmi": vmi, "since": format_time(now), "admission": admission}})
            await self._json_patch(ns, name, ops)
        try:
            await _each(one, plan.devices)
            return True
        except (Denied, errors.ApiError) as exc:
            log.info("W4 take-over failed; admitting afresh", error=str(exc)[:200])
            return False

    def _admit_response(self, uid: str, obj: dict, plan: AdmissionPlan, node: str,
                        admission: str) -> dict:
        snap = self.cache.view.snapshot()
        pairs = []
        for name in plan.devices:
            dev = snap.device(plan.namespace, name)
            cls = snap.classes.get(dev.class_name) if dev else None
            if cls is None:
                raise Denied(f"GPU device {name} or its class disappeared during admission")
            pairs.append((name, cls.resource_name))
        return patch_response(uid, vmi_patch(obj, pairs, node, effective_resources(snap),
                                             admission))

    async def _create_template(self, ns: str, vmi: str, name: str, class_name: str) -> bool:
        """Create template device `name`; False when it already existed (a retry of ours)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                "metadata": {"name": name, "namespace": ns,
                             "labels": {TEMPLATE_FOR_LABEL: vmi}},
                "spec": {"class": class_name}}
        try:
            made = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "gpudevices", body, field_manager=FIELD_MANAGER,
                _request_timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001
            err = errors.translate(exc, f"create template GPUDevice {ns}/{name}")
            if isinstance(err, errors.AlreadyExists):
                return False  # a retry of ours made it: found in place (W4)
            raise err from exc
        await self._wait_cached(ns, name)
        return bool(made)

    async def _wait_cached(self, ns: str, name: str, timeout: float = 5.0) -> None:
        with anyio.move_on_after(timeout):
            while self.cache.view.device((ns, name)) is None:
                await anyio.sleep(0.02)

    async def _attach(self, ns: str, vmi: str, name: str, now: datetime, admission: str,
                      vmis: VMIs, template_class: str | None, created: list[str],
                      request: dict) -> None:
        """W3 (2) and (3) in one write: `attachedTo` {vmi, since, admission} and the
        `bindRequest` `request` (its id is `admission`), with optimistic concurrency (a JSON
        Patch testing the resourceVersion just read), judged on the object just read: an
        attachment that still holds (`judge`: its VMI exists or may still appear) refuses;
        one of a deleted incarnation, a refused request or past the grace is taken over.
        The device is left as it is only when it carries both this admission's attachment
        and its request (a retry of this write); this admission's attachment beside another
        request (a W4 take-over that re-keyed it before another member changed) gets the
        request. A template device deleted meanwhile (housekeeping releasing an older
        incarnation of the name) is re-created. Raises Denied, or errors.ApiError."""
        refused: tuple[str, str] | None = None  # (version, why) of a write the server refused
        for _ in range(5):
            raw = await self._get(ns, name)
            if raw is not None and refused is not None \
                    and refused[0] == raw["metadata"]["resourceVersion"]:
                # unchanged since: not the version test but the write itself was refused
                raise Denied(f"GPU device {name}: the API server refused the attachment: "
                             f"{refused[1][:300]}")
            if raw is None and template_class is not None:
                if await self._create_template(ns, vmi, name, template_class) \
                        and name not in created:
                    created.append(name)
                continue
            if raw is None:
                raise Denied(f"GPU device {name} was deleted during admission")
            try:  # judge the object just read, never the (possibly older) cache
                dev = parse_gpu_device(raw)
            except ParseError as exc:
                raise Denied(f"GPU device {name} is malformed: {exc}") from exc
            if dev.deleting:
                raise Denied(f"GPU device {name} is being deleted")
            att = dev.status.attached_to
            br = dev.status.bind_request
            if att is not None and att.admission == admission:
                if br is not None and br.id == request["id"]:
                    return  # a retry of this very write: attachment and request went together
                # this admission's attachment without its request: W4's take-over re-keyed
                # it (another member changed, so the admission went afresh); the request
                # must still go on, or it stays partial (no member acts on it) until timeout
            elif att is not None and attachment_is_live(dev, vmis, self.now(), self.grace):
                if att.vmi == vmi:
                    raise Denied(f"GPU device {name} is being attached by another admission "
                                 f"of VMI {ns}/{vmi}; retry once it has finished")
                raise Denied(f"GPU device {name} is attached to VMI {att.vmi}")
            attachment = {"vmi": vmi, "since": format_time(now), "admission": admission}
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                          "value": raw["metadata"]["resourceVersion"]}]
            if isinstance(raw.get("status"), dict):  # `add` replaces: no older field stays
                ops += [{"op": "add", "path": "/status/attachedTo", "value": attachment},
                        {"op": "add", "path": "/status/bindRequest", "value": request}]
            else:  # a new template device has no status yet (as read, version tested)
                ops.append({"op": "add", "path": "/status",
                            "value": {"attachedTo": attachment, "bindRequest": request}})
            try:
                await self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, "gpudevices", name, ops, _content_type=JSON_PATCH,
                    field_manager=FIELD_MANAGER, _request_timeout=self.timeout)
                return
            except Exception as exc:  # noqa: BLE001
                err = errors.translate(exc, f"attach GPUDevice {ns}/{name}")
                if isinstance(err, errors.Invalid):  # the version test failed, or the write
                    refused = (raw["metadata"]["resourceVersion"], err.message)
                    continue  # re-read and re-judge
                if isinstance(err, errors.Conflict | errors.NotFound):
                    continue  # re-read and re-judge
                raise err from exc
        raise Denied(f"GPU device {name} kept changing while attaching it; try again")

    async def _json_patch(self, ns: str, name: str, ops: list[dict]) -> None:
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, "gpudevices", name, ops, _content_type=JSON_PATCH,
                field_manager=FIELD_MANAGER, _request_timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001
            err = errors.translate(exc, f"patch GPUDevice {ns}/{name}")
            if isinstance(err, errors.Invalid):
                raise Denied(f"GPU device {name} changed meanwhile (another admission took it, "
                             "or housekeeping released it)") from exc
            raise err from exc

    async def _get(self, ns: str, name: str) -> dict | None:
        """The device as the API server has it now; None when it does not exist."""
        try:
            return await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, ns, "gpudevices", name, _request_timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001
            err = errors.translate(exc, f"read GPUDevice {ns}/{name}")
            if isinstance(err, errors.NotFound):
                return None
            raise err from exc

    async def _clean_up(self, ns: str, vmi: str, request_id: str, attached: list[str],
                        created: list[str]) -> None:
        """W5: clear what this call wrote — only attachments carrying this call's admission
        id (`request_id`), never another admission's of the same VMI name — judged on fresh
        reads (the cache may be behind) and shielded from cancellation, each call bounded.
        A template this call created is deleted unless another admission has attached it
        since. When the binder has already recorded its decision for this request
        (`bindRequest.node` on a member: the binder writes node, placement and result of a
        member in one write, so some members may carry it while others have nothing yet),
        nothing is touched: the binder finishes the placement (B7) and housekeeping clears
        the attachments and the request once the VMI has not appeared (H1)."""
        with anyio.CancelScope(shield=True):
            fresh: dict[str, dict | None] = {}
            for name in attached:
                try:
                    with anyio.fail_after(self.timeout + 1):
                        fresh[name] = await self._get(ns, name)
                except Exception as exc:  # noqa: BLE001 - judge it unknown: leave it to H1
                    log.warning("clean-up read failed", device=name, error=repr(exc)[:200])
                    return

            def request_of(raw: dict | None) -> dict:
                br = ((raw or {}).get("status") or {}).get("bindRequest") or {}
                return br if br.get("id") == request_id else {}

            if any(request_of(r).get("node") for r in fresh.values()):
                log.info("request already decided; left for the binder (B7)",
                         request_id=request_id)
                return
            for name, raw in fresh.items():
                att = ((raw or {}).get("status") or {}).get("attachedTo") or {}
                if raw is None or att.get("admission") != request_id:
                    continue
                ops: list[dict[str, Any]] = [
                    {"op": "test", "path": "/status/attachedTo/admission", "value": request_id},
                    {"op": "remove", "path": "/status/attachedTo"}]
                if request_of(raw):
                    ops += [{"op": "test", "path": "/status/bindRequest/id",
                             "value": request_id},
                            {"op": "remove", "path": "/status/bindRequest"}]
                try:
                    with anyio.fail_after(self.timeout + 1):
                        await self._json_patch(ns, name, ops)
                except (Denied, errors.NotFound) as exc:  # changed or gone since the read
                    log.info("clean-up of attachment moot: the device changed since it was "
                             "read", device=name, request_id=request_id, reason=str(exc)[:200])
                except Exception as exc:  # noqa: BLE001 - housekeeping (H1) retries later
                    log.warning("clean-up of attachment failed", device=name,
                                request_id=request_id, error=repr(exc)[:200])
            for name in created:
                try:
                    with anyio.fail_after(self.timeout + 1):
                        raw = await self._get(ns, name)
                        labels = ((raw or {}).get("metadata") or {}).get("labels") or {}
                        if raw is None or labels.get(TEMPLATE_FOR_LABEL) != vmi:
                            continue
                        if ((raw.get("status") or {}).get("attachedTo") or {}):
                            continue  # another admission of the name attached it meanwhile
                        await self.custom.delete_namespaced_custom_object(
                            GROUP, VERSION, ns, "gpudevices", name,
                            body={"preconditions": {
                                "uid": raw["metadata"]["uid"],
                                "resourceVersion": raw["metadata"]["resourceVersion"]}},
                            _request_timeout=self.timeout)
                except Exception as exc:  # noqa: BLE001
                    log.warning("clean-up of template failed", device=name,
                                error=repr(exc)[:200])

    async def _event(self, ns: str, vmi: str, message: str) -> None:
        """A Warning Event about the refused VMI, so `kubectl get events` shows why."""
        now = format_time(self.now())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{vmi}.", "namespace": ns},
                "involvedObject": {"apiVersion": "kubevirt.io/v1",
                                   "kind": "VirtualMachineInstance", "name": vmi, "namespace": ns},
                "reason": "GPUSetRefused", "message": message[:1024], "type": "Warning",
                "source": {"component": "gpu-binder"}, "firstTimestamp": now,
                "lastTimestamp": now, "count": 1, "reportingComponent": "gpu-binder",
                "reportingInstance": "webhook"}
        try:
            with anyio.fail_after(self.timeout):
                await self.core.create_namespaced_event(ns, body, _request_timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - an Event is best effort
            log.warning("event not recorded", error=repr(exc)[:200])


STEP_PARALLEL = 8
"""Devices of one set written at once in a step of W3 (templates, attachments, requests)."""


async def _each(fn: Callable[[Any], Awaitable[None]], items: Sequence[Any]) -> None:
    """`await fn(item)` for every item, at most `STEP_PARALLEL` at once. The first failure
    cancels the others and is raised as it is, a `Denied` before an `errors.ApiError`
    before anything else (what was written meanwhile is recorded by the caller for W5)."""
    if len(items) <= 1:
        for item in items:
            await fn(item)
        return
    limiter = anyio.CapacityLimiter(STEP_PARALLEL)

    async def one(item: Any) -> None:
        async with limiter:
            await fn(item)

    try:
        async with anyio.create_task_group() as tg:
            for item in items:
                tg.start_soon(one, item)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        for kind in (Denied, errors.ApiError, Exception):
            first = next((e for e in leaves if isinstance(e, kind)), None)
            if first is not None:
                raise first from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
