"""The soak's device-mode checks (issue 41 item 5, docs/contract.md §3b DR5/DR6, §5 H1/H2,
HL1 of the issue's design), beside `localcluster.invariants`' §7 and DR6 ones: pure functions of what one
read of the cluster gave (ResourceClaims, GPUDevices, VMIs) and of what the soak itself did
(the VMIs it deleted and when, the DeviceTaintRules it made and removed and when), each
returning `localcluster.invariants.Violation`s; plus the one read (`read_claims`) and the
DeviceTaintRule body the soak writes (`taint_rule`).

- *orphan claim*: a claim of ours (managed-by gpu-binder) whose VMI does not exist, older than
  `grace` s past both its claimed-at and the soak's delete of that VMI (housekeeping clears it
  after the attachment grace, H1); after settling, any such claim;
- *missing claim*: a VMI the soak holds as admitted (its set placed) whose claim, named in its
  `spec.resourceClaims`, is not in the API (DR5: an admitted device-mode set is its claim);
- *tainted placement*: a Bound GPUDevice whose recorded device (`status.device`) a
  DeviceTaintRule of the soak's (NoSchedule or NoExecute) selected for the whole of the
  placement's window: made more than `taint_grace` s before the window opened, removed after
  it closed (HL1, DR2: a tainted device is never placed on). The API holds no decision time,
  so each placement (a device, its record, its request, its `boundAt`) gets a window when a
  read first shows it (`placement_windows`): from its request's `requestedAt` (a move or a
  re-point, which have no request: the read before) to its `boundAt` when that is later (the
  binder stamps it after deciding), else to the read that showed it. A rule made or removed
  inside the window is *unsure*, reported beside the violations, not among them: a leader
  elected during an API outage may answer a request made 10 s earlier, after the rule went;
- *device budget*: a tenant's Bound devices of the device class over its quota (DR1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable

from localcluster.invariants import Violation

ORPHAN_CLAIM = "orphan-claim"
MISSING_CLAIM = "missing-claim"
TAINTED_PLACEMENT = "placed-on-tainted-device"
DEVICE_BUDGET_OVER = "tenant-over-device-budget"
ITEMS = {ORPHAN_CLAIM: "5.H1/H2", MISSING_CLAIM: "3b.DR5", TAINTED_PLACEMENT: "HL1",
         DEVICE_BUDGET_OVER: "3b.DR1"}
"""The contract item each kind breaks."""



@dataclass(frozen=True)
class DeviceViolation(Violation):
    """A `Violation` of one of this module's kinds (its contract item from `ITEMS`)."""

    @property
    def item(self) -> str:
        return ITEMS[self.kind]


RESOURCE = ("resource.k8s.io", "v1", "resourceclaims")
TAINT_RULES = ("resource.k8s.io", "v1beta2", "devicetaintrules")


@dataclass(frozen=True)
class Taint:
    """A DeviceTaintRule the soak made: on device `ref` (driver, pool, device), `effect`,
    made at `made` and removed at `removed` (None: still there), both aware UTC."""

    name: str
    ref: tuple[str, str, str]
    effect: str
    made: datetime
    removed: datetime | None = None


def taint_rule(name: str, ref: tuple[str, str, str], effect: str) -> dict:
    """The `resource.k8s.io/v1beta2` DeviceTaintRule `name` selecting exactly device `ref`
    (driver, pool, device) with a taint `gpu.example.com/soak` of `effect`."""
    driver, pool, device = ref
    return {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                     "taint": {"key": "gpu.example.com/soak", "value": "injected",
                               "effect": effect}}}


def _ref(status: dict) -> tuple[str, str, str] | None:
    rec = status.get("device")
    if not isinstance(rec, dict):
        return None
    return (rec.get("driver"), rec.get("pool"), rec.get("device"))


def _time(text) -> datetime | None:
    """An RFC 3339 time with a zone as aware UTC; None when absent or unreadable."""
    try:
        when = datetime.fromisoformat(text)
    except (ValueError, TypeError):
        return None
    return when.astimezone(timezone.utc) if when.tzinfo else None


def orphan_ages(claims: list[dict], vmis: list[dict],
                deleted_at: dict[tuple[str, str], datetime], now: datetime) -> list[float]:
    """For each claim of ours (of `claims`) whose VMI is not among `vmis`: the seconds since
    the later of its claimed-at and the soak's delete of that VMI (see `check_claims`).
    Pure."""
    from model.claim import parse_claim

    exists = {(v["metadata"]["namespace"], v["metadata"]["name"]) for v in vmis}
    out = []
    for obj in claims:
        c = parse_claim(obj)
        if not c.managed or not c.vmi or (c.namespace, c.vmi) in exists:
            continue
        starts = [t for t in (c.since, deleted_at.get((c.namespace, c.vmi))) if t is not None]
        out.append((now - max(starts)).total_seconds() if starts else float("inf"))
    return out


def check_claims(claims: list[dict], vmis: list[dict], settled: Iterable[tuple[str, str]],
                 deleted_at: dict[tuple[str, str], datetime], now: datetime, *,
                 grace: float, final: bool = False,
                 stopping: Iterable[tuple[str, str]] = ()) -> list[Violation]:
    """Orphan and missing claims in one read (`claims`: ResourceClaim dicts, `vmis`: VMI dicts
    of the soak's namespaces): `settled` the (namespace, name) of VMIs held as admitted across
    the read, `deleted_at` when the soak deleted each VMI it deleted, `now` the read's time,
    `grace` s (see the module). With `final` every claim of ours without its VMI is an orphan.
    A VMI being deleted in the read (a `deletionTimestamp`) or named in `stopping` (victims
    of the nominations seen: the binder deletes them, §3c P4, and housekeeping their claims
    once they are gone, between the VMIs' read and the claims') has no missing claim. Pure."""
    from model.claim import parse_claim

    out: list[Violation] = []
    exists = {(v["metadata"]["namespace"], v["metadata"]["name"]): v for v in vmis}
    present = set()
    for obj in claims:
        c = parse_claim(obj)
        present.add((c.namespace, c.name))
        if not c.managed or not c.vmi or (c.namespace, c.vmi) in exists:
            continue
        starts = [t for t in (c.since, deleted_at.get((c.namespace, c.vmi))) if t is not None]
        age = (now - max(starts)).total_seconds() if starts else float("inf")
        if final or age > grace:
            out.append(DeviceViolation(ORPHAN_CLAIM, ("ResourceClaim", c.namespace, c.name),
                                 f"claim for {c.vmi}, which does not exist ({age:.0f} s past "
                                 f"its claim or delete)"))
    stopping = set(stopping)
    for ns, name in sorted(set(settled)):
        vmi = exists.get((ns, name))
        if vmi is None:
            continue   # gone: localcluster.invariants judges that
        if (ns, name) in stopping or (vmi.get("metadata") or {}).get("deletionTimestamp"):
            continue   # being stopped: its claim goes with it
        names = [e.get("resourceClaimName") for e in vmi["spec"].get("resourceClaims") or []]
        if not names:
            out.append(DeviceViolation(MISSING_CLAIM, ("VirtualMachineInstance", ns, name),
                                 "admitted without spec.resourceClaims"))
        for claim in names:
            if (ns, claim) not in present:
                out.append(DeviceViolation(MISSING_CLAIM, ("ResourceClaim", ns, str(claim)),
                                     f"claim of admitted {name} not in the API"))
    return out


Window = tuple[datetime, datetime]
"""When a placement was decided: not before the first, not after the second (aware UTC)."""


def _placement_key(d: dict) -> tuple | None:
    """What identifies one placement of Bound GPUDevice `d`: (namespace, name, recorded device,
    request id, boundAt); None when `d` is not Bound with a record, or carries a request not
    answered Succeeded (pending or refused: nothing placed by it; the device priorities soak saw
    a held device Bound idle on a device tainted since, asked for by a set the binder then
    refused, read as a new placement there)."""
    st = d.get("status") or {}
    ref = _ref(st)
    if st.get("phase") != "Bound" or ref is None:
        return None
    br = st.get("bindRequest") or {}
    if br.get("id") and br.get("result") != "Succeeded":
        return None
    return (d["metadata"]["namespace"], d["metadata"]["name"], ref,
            (st.get("bindRequest") or {}).get("id"), st.get("boundAt"))


def placement_windows(devices: list[dict], windows: dict[tuple, Window], now: datetime,
                      previous: datetime | None) -> None:
    """Give each placement of `devices` that `windows` lacks its window (see the module), in
    place: `now` the time of this read, `previous` of the read before (None: this is the
    first). A device whose request was cleared (its VMI gone, H2) is the placement it was,
    not a new one. A request's `requestedAt` opens it (else `previous`, else `boundAt`, else `now`);
    `boundAt`, when not before the opening, closes it, else `now`. Pure but for `windows`."""
    placed = {k[:3] + k[4:] for k in windows}
    for d in devices:
        key = _placement_key(d)
        if key is None or key in windows:
            continue
        if key[3] is None and key[:3] + key[4:] in placed:
            continue    # its request cleared (the VMI gone): the same placement, no new one
        st = d["status"]
        asked = _time((st.get("bindRequest") or {}).get("requestedAt"))
        bound = _time(st.get("boundAt"))
        lo = asked or previous or bound or now
        windows[key] = (lo, bound if bound is not None and lo <= bound <= now else now)


def check_taints(devices: list[dict], taints: Iterable[Taint], windows: dict[tuple, Window],
                 *, grace: float) -> tuple[list[Violation], list[dict]]:
    """Placements on a device under one of `taints` (see the module), each judged on its
    window from `windows` (`placement_windows`; a placement without one is not judged):
    the violations, and the unsure ones as {device, record, rule, effect, window, rule's
    times} (ISO 8601). Pure."""
    by_ref: dict[tuple, list[Taint]] = {}
    for t in taints:
        by_ref.setdefault(t.ref, []).append(t)
    out: list[Violation] = []
    unsure: list[dict] = []
    for d in devices:
        key = _placement_key(d)
        if key is None or key[2] not in by_ref or key not in windows:
            continue
        lo, hi = windows[key]
        ns, name, ref = key[0], key[1], key[2]
        for t in by_ref[ref]:
            live_from = t.made + timedelta(seconds=grace)
            if live_from >= hi or (t.removed is not None and t.removed <= lo):
                continue        # the rule was not live (past its grace) in the window
            if live_from < lo and (t.removed is None or t.removed > hi):
                out.append(DeviceViolation(TAINTED_PLACEMENT, ("GPUDevice", ns, name, t.name),
                                           f"{'/'.join(ref)} placed in {lo.isoformat()} .. "
                                           f"{hi.isoformat()}, under {t.effect} rule {t.name} "
                                           f"since {t.made.isoformat()}"))
            else:
                unsure.append({"device": f"{ns}/{name}", "record": "/".join(ref),
                               "rule": t.name, "effect": t.effect,
                               "window": [lo.isoformat(), hi.isoformat()],
                               "made": t.made.isoformat(),
                               "removed": t.removed and t.removed.isoformat()})
    return out, unsure


def check_budgets(devices: list[dict], quotas: dict[str, int], cls: str) -> list[Violation]:
    """A tenant whose Bound GPUDevices of class `cls` outnumber its device budget
    (`quotas`: namespace -> the quota's hard count). Pure."""
    bound = Counter(d["metadata"]["namespace"] for d in devices
                    if (d.get("spec") or {}).get("class") == cls
                    and (d.get("status") or {}).get("phase") == "Bound")
    return [DeviceViolation(DEVICE_BUDGET_OVER, ("Namespace", "", ns, cls),
                      f"{n} Bound devices of {cls} > budget {quotas[ns]}")
            for ns, n in sorted(bound.items()) if ns in quotas and n > quotas[ns]]


async def read_claims(api, prefix: str, timeout: float = 30) -> list[dict]:
    """Every ResourceClaim in a namespace named `prefix`… (one list of all namespaces)."""
    from kubernetes_asyncio.client import CustomObjectsApi

    got = await CustomObjectsApi(api).list_cluster_custom_object(*RESOURCE,
                                                                 _request_timeout=timeout)
    return [c for c in got["items"] if c["metadata"]["namespace"].startswith(prefix)]
