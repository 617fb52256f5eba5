"""The leader's health worker (docs/contract.md §3b HL2): notices VMIs that fail to start on
a GPU and marks a device on which several did.

The informers' events say what changed: a VMI whose phase is `Failed`, or whose launcher
Pod (label `kubevirt.io/created-by`: the VMI's uid) is `Failed`, is judged at that event by
the pure `model.health.judge_start` on the cache as it is then (so a VMI deleted after it
failed still counts, one deleted while starting does not); a failed start counts against
the targets its set was placed on (`model.health.targets_of`: the devices attached to the
VMI on its pinned node). A launcher Pod Kubernetes disrupted (`DisruptionTarget`, e.g.
kube-controller-manager's eviction for a NoExecute device taint, HL1) and then deleted is
kept, its last state, until its VMI goes: the VMI failing after its Pod is gone (virt-
controller's `PodNotExists`) is excused by it, not counted against every GPU of its set.
The evidence lives in this leader's memory (a new leader starts
with none; a mark already written stays). Rounds (`k8s.rounds.RoundLoop`: after each
failed start counted and each change of the marks, at least every `period` seconds) act
on it.

A device-mode suspect (`model.health.Evidence.suspects`) is marked once
(`model.health_mark`): a DeviceTaintRule `gpu.cozystack.io/suspect` (NoSchedule) selecting
exactly its device, so kube-scheduler's allocator and the binder's own placements (DR2, the
cache feeds every rule's taint into its devices) keep off it; where the API server does not
serve DeviceTaintRules, an entry of the ConfigMap `gpu-suspects` in the controller's
namespace, which only the binder honours (logged and said in the Events: kube-scheduler
cannot see it). Then a Warning Event `GPUSuspected` on the node and on each GPUDevice that
records the device. A count-mode suspect (a node and class) is reported the same way on the
node, never placed around. `gpu_binder_devices_suspected{class}` counts both.

A mark that disappears (an operator's `gpu-binder health clear`) lifts the suspicion: the
failed starts so far no longer count against the device. The worker never deletes a mark.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

import structlog

from k8s import errors, events
from k8s.cache import ClusterCache
from k8s.client import DEVICE_TAINT_RULES, KubeClient
from k8s.informer import Key
from k8s.rounds import RoundLoop
from model.health import (Evidence, FailedStart, HealthSettings, Suspect, Target, disrupted, judge_start,
                          targets_of)
from model.health_mark import MANAGED_BY, MARKS_CONFIGMAP, Mark, mark_entry, rule_body
from model.serialize import format_time
from model.types import ADMISSION_ANNOTATION, GROUP, VERSION

log = structlog.get_logger("gpu_binder.health")

FIELD_MANAGER = "gpu-binder-health"
HOSTNAME = "kubernetes.io/hostname"
CREATED_BY = "kubevirt.io/created-by"
NOT_SEEN = ("kube-scheduler cannot see this mark (DeviceTaintRules are not served: "
            "Kubernetes 1.36+ with the DRADeviceTaintRules gate and resource.k8s.io/v1beta2); "
            "only gpu-binder's placements avoid the device")


class Health:
    """The worker (see the module docstring). `client` is the leader's; `settings` the
    `health.*` settings; `on_suspected(per_class)` is told the suspected count per class
    after every round, `on_failed_start(class)` each failed start counted against a GPU of
    the class (the metrics); `now` the UTC clock."""

    def __init__(self, client: KubeClient, cache: ClusterCache, settings: HealthSettings, *,
                 on_suspected: Callable[[dict[str, int]], None] = lambda _: None,
                 on_failed_start: Callable[[str], None] = lambda _: None,
                 period: float = 30.0, coalesce: float = 0.2,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self._client = client.using(field_manager=FIELD_MANAGER)
        self.cache = cache
        self.settings = settings
        self._on_suspected = on_suspected
        self._on_failed_start = on_failed_start
        self._now = now
        self._loop = RoundLoop(self.round, period=period, coalesce=coalesce,
                               sources=(cache.taint_rules, cache.suspect_marks))
        self.evidence = Evidence()
        self._launchers: dict[str, dict[Key, dict]] = {}   # VMI uid -> its launcher Pods
        self._disrupted: dict[str, dict[Key, dict]] = {}   # VMI uid -> its deleted disrupted ones
        self._pod_owner: dict[Key, str] = {}
        self._vmi_uid: dict[Key, str] = {}                 # VMI key -> uid, and back
        self._vmi_key: dict[str, Key] = {}
        self._marked: dict[Target, str] = {}      # marks of suspects seen in the cache
        self._written: set[Target] = set()        # marks written, not in the cache yet
        self._reported: set[Target] = set()       # count-mode suspects told on their node
        self.rounds = self.failed_starts = self.marked = self.errors = 0

    # -- what changed ----------------------------------------------------------------------
    def _on_vmi(self, key: Key, obj: dict | None) -> None:
        old = self._vmi_uid.pop(key, None)
        if old is not None:
            self._vmi_key.pop(old, None)
        uid = str(((obj or {}).get("metadata") or {}).get("uid") or "")
        if old is not None and old != uid:
            self._disrupted.pop(old, None)
        if obj is None or not uid:
            return
        self._vmi_uid[key], self._vmi_key[uid] = uid, key
        if (obj.get("status") or {}).get("phase") == "Failed" or any(
                (p.get("status") or {}).get("phase") == "Failed"
                for p in self._launchers.get(uid, {}).values()):
            self.judge(key)

    def _on_pod(self, key: Key, obj: dict | None) -> None:
        old = self._pod_owner.pop(key, None)
        if old is not None:
            pods = self._launchers.get(old, {})
            last = pods.pop(key, None)
            if not pods:
                self._launchers.pop(old, None)
            if obj is None and last is not None and disrupted(last) and old in self._vmi_key:
                self._disrupted.setdefault(old, {})[key] = last   # until its VMI goes
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        uid = labels.get(CREATED_BY)
        if obj is None or labels.get("kubevirt.io") != "virt-launcher" or not uid:
            return
        self._pod_owner[key] = uid
        self._launchers.setdefault(uid, {})[key] = obj
        if (obj.get("status") or {}).get("phase") == "Failed" and uid in self._vmi_key:
            self.judge(self._vmi_key[uid])

    async def run(self) -> None:
        """Rounds until cancelled (see the module docstring)."""
        for key in self.cache.vmis.keys():
            self._on_vmi(key, self.cache.vmis.get(key))
        for key in self.cache.pods.keys():
            self._on_pod(key, self.cache.pods.get(key))
        self.cache.vmis.add_listener(self._on_vmi)
        self.cache.pods.add_listener(self._on_pod)
        try:
            await self._loop.run()
        finally:
            self.cache.vmis.remove_listener(self._on_vmi)
            self.cache.pods.remove_listener(self._on_pod)

    # -- a round ---------------------------------------------------------------------------
    def judge(self, key: Key) -> FailedStart | None:
        """Judge VMI `key` now, as the cache shows it and its launcher Pods at the event that
        showed a failure (so a VMI deleted after it failed still counts, and one deleted
        before does not), recording a failed start into the evidence; the failed start
        recorded, or None."""
        vmi = self.cache.vmis.get(key)
        meta = (vmi or {}).get("metadata") or {}
        if vmi is None or not (meta.get("annotations") or {}).get(ADMISSION_ANNOTATION):
            return None
        uid = str(meta.get("uid") or "")
        pods = [*self._launchers.get(uid, {}).values(), *self._disrupted.get(uid, {}).values()]
        verdict = judge_start(vmi, pods, self._now())
        if not isinstance(verdict, FailedStart):
            if verdict is not None:
                log.debug("start_failure_excused", vmi=f"{key[0]}/{key[1]}", excuse=verdict.value)
            return None
        node = ((vmi.get("spec") or {}).get("nodeSelector") or {}).get(HOSTNAME) \
            or (vmi.get("status") or {}).get("nodeName")
        devices = (self.cache.view.devices_on(node) if node
                   else tuple(self.cache.view.devices().values()))
        targets = targets_of(devices, self.cache.view.classes(), verdict)
        before = self.evidence
        self.evidence = self.evidence.record(targets, verdict)
        if self.evidence == before:
            return None
        self.failed_starts += 1
        self._loop.kick()
        for cls in sorted({t.class_name for t in targets}):
            self._on_failed_start(cls)
        log.info("failed_start", vmi=f"{key[0]}/{key[1]}", uid=verdict.uid, why=verdict.why,
                 targets=[str(t) for t in targets])
        return verdict

    async def round(self) -> None:
        """One round: notice lifted marks, mark and report the suspects, set the metric (API failures are logged and left to the next round)."""
        now = self._now()
        marks = {m.device: m for m in self.cache.suspects()}
        for target, name in list(self._marked.items()):
            if target.device not in marks:
                del self._marked[target]
                self.evidence = self.evidence.clear(target, now)
                log.info("suspicion_lifted", device=str(target), mark=name)
        self.evidence = self.evidence.prune(now, self.settings)
        suspects = self.evidence.suspects(now, self.settings)
        for s in suspects:
            t = s.target
            if t.device is None:
                if t not in self._reported:
                    self._reported.add(t)
                    await self._report(s, now, None)
            elif t.device in marks:
                self._marked.setdefault(t, marks[t.device].name)
                self._written.discard(t)
            elif t not in self._written:
                await self._mark(s, now)
        self._reported &= {s.target for s in suspects}
        per_class: dict[str, int] = {}
        for m in self.cache.suspects():
            per_class[m.class_name] = per_class.get(m.class_name, 0) + 1
        for t in self._reported:
            per_class[t.class_name] = per_class.get(t.class_name, 0) + 1
        self._on_suspected(per_class)
        self.rounds += 1

    async def _mark(self, s: Suspect, now: datetime) -> None:
        """Write the DeviceTaintRule of `s` (or, not served, its ConfigMap entry), then the
        Events."""
        body = rule_body(s, now)
        name = body["metadata"]["name"]
        kind = "DeviceTaintRule"
        served = not self.cache.taint_rules.absent
        if served:
            try:
                await self._client.create(DEVICE_TAINT_RULES, None, body)
            except errors.AlreadyExists:
                pass
            except errors.NotFound:
                served = False
            except errors.ApiError as exc:
                self.errors += 1
                log.warning("suspect_not_marked", device=str(s.target), error=str(exc))
                return
        if not served:
            kind = "ConfigMap"
            if not await self._write_entry(s, now):
                return
        self._written.add(s.target)
        self.marked += 1
        log.warning("device_suspected", device=str(s.target), node=s.target.node, mark=name,
                    kind=kind, vmis=[f"{f.namespace}/{f.vmi}" for f in s.evidence],
                    **({"note": NOT_SEEN} if kind == "ConfigMap" else {}))
        await self._report(s, now, name if kind == "DeviceTaintRule" else f"ConfigMap entry {name}")

    async def _write_entry(self, s: Suspect, now: datetime) -> bool:
        """Add `s`'s entry to the ConfigMap `gpu-suspects` (created when missing; a stale
        read is a Conflict, left to the next round). Whether it was written."""
        ns = self.cache.settings_namespace
        key, value = mark_entry(s, now)
        found = self.cache.suspect_marks.items()
        try:
            if not found:
                await self._client.create_config_map(ns, {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": MARKS_CONFIGMAP, "namespace": ns,
                                 "labels": {MANAGED_BY[0]: MANAGED_BY[1]}},
                    "data": {key: value}})
            else:
                cm = found[0]
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": dict(cm["metadata"]),
                        "data": {**(cm.get("data") or {}), key: value}}
                await self._client.replace_config_map(ns, MARKS_CONFIGMAP, body)
        except errors.ApiError as exc:
            self.errors += 1
            log.warning("suspect_not_marked", device=str(s.target), error=str(exc))
            return False
        return True

    async def _report(self, s: Suspect, now: datetime, mark: str | None) -> None:
        """The Warning Events `GPUSuspected`: on the node, and in device mode on each
        GPUDevice recording the device (best effort)."""
        t = s.target
        vmis = ", ".join(f"{f.namespace}/{f.vmi} at {format_time(f.at)} ({f.why})" for f in s.evidence)
        if t.device is None:
            what = (f"{len(s.evidence)} VMIs of class {t.class_name} failed to start on this node "
                    f"within {int(self.settings.window.total_seconds())}s (count mode: which GPU the "
                    f"device plugin gave is unknown; reported, not placed around): {vmis}")
        else:
            seen = NOT_SEEN if mark and mark.startswith("ConfigMap") else \
                "kube-scheduler and gpu-binder keep off it"
            what = (f"GPU {t.device} suspected broken: {len(s.evidence)} VMIs failed to start on "
                    f"it within {int(self.settings.window.total_seconds())}s; marked by {mark} "
                    f"(taint gpu.cozystack.io/suspect, NoSchedule: {seen}); lift it with "
                    f"`gpu-binder health clear {t.device}`. {vmis}")
        body = events.event_body({"apiVersion": "v1", "kind": "Node", "name": t.node,
                                  "namespace": "default", "uid": t.node},
                                 reason="GPUSuspected", message=what, warning=True,
                                 instance="health", when=now)
        body["involvedObject"]["namespace"] = ""
        await events.record(self._client, body, node=t.node)
        if t.device is None:
            return
        for d in self.cache.view.devices_on(t.node):
            if d.status.device == t.device:
                body = events.event_body({"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                                          "name": d.name, "namespace": d.namespace, "uid": d.uid or ""},
                                         reason="GPUSuspected", message=what, warning=True,
                                         instance="health", when=now)
                await events.record(self._client, body, device=d.name)

    def marks(self) -> tuple[Mark, ...]:
        """Every mark the cache shows (the binder's rules and ConfigMap entries)."""
        return self.cache.suspects()


__all__ = ["FIELD_MANAGER", "Health"]
