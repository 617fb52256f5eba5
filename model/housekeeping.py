"""Housekeeping decisions (docs/contract.md §5, H1–H2) as a pure function of the cache.

Level-based: every round judges each attachment on its own against what is known of VMIs now
(`VMIs`: the live VMIs with their uid and admission annotation, and the admissions of VMI
incarnations seen deleted), never by comparing two samples of the cache. `judge` is shared
with the webhook (W1), so both tell a VMI incarnation from an older or newer one of the same
name the same way: by its `admission` id, which the VMI carries as its
`gpu.cozystack.io/admission` annotation and which no one can change once it is admitted (W7,
the policy `gpu-binder-admitted-vmis`), or by the VMI uid an attachment records.

No uid is recorded any more for an attachment with an admission id (issue 40: one status
write less per admission; docs/contract.md H2, "No uid link"). The uid
links that earlier versions wrote (on one device of a set: `recorded_links`; version
0.1.0 on every device) are still read and still decide (case 1 of `judge`), so an upgrade
changes nothing for the sets they name. An attachment without an admission id (written
before admission ids) is still linked: only a uid can tell its incarnation. The cost: a set
whose VMI was deleted while no replica watched (no tombstone) is released once `grace` has
passed since its attachment (case 6, STALE, or KEPT for its VM under H4), not at once, as a
recorded uid allowed.

H4 (a VirtualMachine keeps its set): an attachment whose VMI incarnation went away (GONE by
case 1 or 3 of `judge`, or STALE by case 6 once its own request Succeeded: with no uid
recorded, a VMI deleted while no replica watched looks like one that never appeared) while
the VirtualMachine that owned it (`attachedTo.owner`, the VM uid the webhook recorded at
admission) still exists, with every class of the set setting
`keepSetFor`, is KEPT instead: `plan` writes `attachedTo.keptUntil` (now + the smallest
`keepSetFor` of the set's classes, one time for every device of the set) and leaves the set
Bound and attached. A kept attachment holds (W1 sees it, the budget counts it) until
`keptUntil`, or until its VM is gone (deleted, being deleted, or another uid of the name);
then it is GONE and released as H2 releases (rule H4). The state lives in status only, so a
new leader continues where the old one stopped.

`plan(devices, vmis, now, grace)` returns the actions the leader should take; the k8s
adapter confirms each destructive one with a live read of the VMI (`confirmed`) and carries
it out with a JSON Patch `test` on the attachment, so an action planned from a stale view
can never clear a newer attachment.

Verdicts and actions carry typed findings and rules (`model.housekeeping_reasons`: a `Rule`,
a `HousekeepingReason` per code, rendered once there); nothing here writes English.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Collection, Iterable, Mapping

from model.device.seam import serves_devices
from model.housekeeping_reasons import (AnotherIncarnation, CannotServe, ClassCondition,
                                        HousekeepingReason, KeepNotKnown, KeepRanOut, KeepStarts,
                                        Kept, KeptCondition, KeptVmDeleted, KeptVmDeleting,
                                        NewIncarnationInFlight, NoKubeVirt, NotPermitted,
                                        OrphanTemplate, Permitted, RefusalBeingRead,
                                        RequestRefused, Rule, ServesDevices, ServesUnits,
                                        UidRecorded, VmiDeleted, VmiExists, VmiNeverAppeared,
                                        VmiNotYetSeen, YieldedTemplate)
from model.types import Attachment, GPUClass, GPUDevice, Result, VMIKey


@dataclass(frozen=True, slots=True)
class VMIRecord:
    """A VMI that exists: its `uid` and its `gpu.cozystack.io/admission` annotation (None
    when it carries none)."""

    namespace: str
    name: str
    uid: str
    admission: str | None = None


@dataclass(frozen=True, slots=True)
class VMIs:
    """What is known about VMIs at one moment. `live` maps (namespace, name) to the VMI that
    exists; `deleted` holds (namespace, admission id) of VMI incarnations that were seen and
    then deleted (the informer's tombstones, kept for a while)."""

    live: Mapping[VMIKey, VMIRecord] = field(default_factory=dict)
    deleted: frozenset[tuple[str, str]] = frozenset()
    _uids: frozenset[tuple[str, str]] | None = field(default=None, init=False, repr=False,
                                                     compare=False)

    @property
    def uids(self) -> frozenset[tuple[str, str]]:
        """(namespace, uid) of every live VMI (derived, on first use, unless the value was
        made `with_uids`; issue 40)."""
        got = self._uids
        if got is None:
            got = frozenset((r.namespace, r.uid) for r in self.live.values() if r.uid)
            object.__setattr__(self, "_uids", got)
        return got

    @classmethod
    def with_uids(cls, live: Mapping[VMIKey, VMIRecord], deleted: frozenset[tuple[str, str]],
                  uids: frozenset[tuple[str, str]]) -> "VMIs":
        """`VMIs(live, deleted)` whose `uids` are `uids`, which must be (namespace, uid) of
        every record of `live` with a uid (not checked): for a caller that keeps them as its
        records change (the cache, which makes a new value after every VMI record change:
        deriving them walks every live VMI, a housekeeping round's largest cost that grew
        with the fleet; issue 40)."""
        out = cls(live, deleted)
        object.__setattr__(out, "_uids", uids)
        return out

    @classmethod
    def of_keys(cls, keys: Iterable[VMIKey]) -> "VMIs":
        """Live VMIs known by key only (no uid, no annotation): for callers and tests that
        have nothing more."""
        return cls({k: VMIRecord(k[0], k[1], "") for k in keys})

    def without(self, key: VMIKey) -> "VMIs":
        """This view with VMI `key` known *not* to exist (a live read said so); when the view
        still showed it, its incarnation counts as deleted. When it did not (the webhook's
        case: a new VMI's name), this very value: nothing is copied (issue 40)."""
        rec = self.live.get(key)
        if rec is None and key not in self.live:
            return self
        live = {k: v for k, v in self.live.items() if k != key}
        deleted = self.deleted
        if rec is not None and rec.admission:
            deleted = deleted | {(key[0], rec.admission)}
        return VMIs(live, deleted)


@dataclass(frozen=True, slots=True)
class VMRecord:
    """A VirtualMachine that exists (H4): its `uid`, its run strategy, and whether it is
    being deleted (`metadata.deletionTimestamp`)."""

    namespace: str
    name: str
    uid: str
    run_strategy: str = "Always"
    deleting: bool = False


VMs = Mapping[VMIKey, VMRecord]
"""The VirtualMachines that exist, by (namespace, name) (H4)."""


class State(str, Enum):
    """Where an attachment stands. LIVE: its VMI exists. PENDING: its VMI has not appeared
    yet and may still (an admission in flight, within `grace`). GONE: its VMI incarnation
    existed and is deleted, or its own request was refused (release at once, H2), or its
    keep ended (H4). STALE: its VMI never appeared within `grace` (H1). KEPT: its VMI is gone
    and its VirtualMachine keeps the set (H4, until `Verdict.until`)."""

    LIVE = "live"
    PENDING = "pending"
    GONE = "gone"
    STALE = "stale"
    KEPT = "kept"


@dataclass(frozen=True, slots=True)
class Verdict:
    """`judge`'s answer: the state, why (a typed `HousekeepingReason`, rendered at the
    edge), and for a LIVE attachment without an admission id (written before admission ids)
    that does not yet record its VMI's uid, the uid to record (`link`; never for an
    attachment with an admission id, which that id tells apart). KEPT: `until` is when
    the keep ends (recorded, or to record). `rule` names the rule a release follows (H2,
    H4; None: `plan` tells H1 from H2 by the state)."""

    state: State
    reason: HousekeepingReason
    link: str | None = None
    until: datetime | None = None
    rule: Rule | None = None

    @property
    def holds(self) -> bool:
        """True while the attachment must be respected (LIVE, PENDING or KEPT)."""
        return self.state in (State.LIVE, State.PENDING, State.KEPT)


def _judge_kept(ns: str, att: Attachment, vms: VMs | None, now: datetime) -> Verdict:
    """H4: a recorded keep (`att.kept_until` set) holds until that time, unless the
    VirtualMachine it is kept for is known gone (`vms` given: no VM of the name, another
    uid, or being deleted). Without `vms` (W1, or the VM informer behind) only the time
    decides."""
    assert att.kept_until is not None
    until = att.kept_until
    if vms is not None:
        vm = vms.get((ns, att.vmi))
        if vm is None or vm.uid != att.owner:
            return Verdict(State.GONE, KeptVmDeleted(att.vmi, att.owner), rule=Rule.H4)
        if vm.deleting:
            return Verdict(State.GONE, KeptVmDeleting(att.vmi), rule=Rule.H4)
    if now >= until:
        return Verdict(State.GONE, KeepRanOut(att.vmi, until), rule=Rule.H4)
    return Verdict(State.KEPT, Kept(att.vmi, until), until=until, rule=Rule.H4)


def _gone_or_kept(ns: str, att: Attachment, gone: Verdict, keep: timedelta | None,
                  vms: VMs | None, now: datetime,
                  yielded: Collection[VMIKey] = frozenset()) -> Verdict:
    """H4: the attachment's VMI incarnation is gone (`gone`); KEPT until now + `keep` when
    the VM that owned it (`att.owner`) exists and is not being deleted and the set keeps
    (`keep`: the smallest keepSetFor of its classes, None when one lacks it); PENDING while
    the VMs are not known (`vms` None: whether to keep cannot be told yet); else `gone`.
    Never kept for a victim of a live nomination (`yielded`, P4): its room is its
    preemptor's."""
    if not att.owner or keep is None or (ns, att.vmi) in yielded:
        return gone
    if vms is None:
        return Verdict(State.PENDING, KeepNotKnown(att.vmi))
    vm = vms.get((ns, att.vmi))
    if vm is None or vm.uid != att.owner or vm.deleting:
        return gone
    return Verdict(State.KEPT, KeepStarts(att.vmi, int(keep.total_seconds())), until=now + keep,
                   rule=Rule.H4)


def judge(device: GPUDevice, vmis: VMIs, now: datetime, grace: timedelta,
          links: Mapping[tuple[str, str], str] | None = None,
          answer_window: timedelta = timedelta(0), *, keep: timedelta | None = None,
          vms: VMs | None = None, yielded: Collection[VMIKey] = frozenset()) -> Verdict | None:
    """The state of `device`'s attachment (None when it has none), H1/H2 and W1. `links`
    (from `recorded_links`) maps (namespace, admission id) to the VMI uid that one device of
    the set records:

    1. it records a VMI uid, or another device attached by the same admission does
       (`links`; written by earlier versions, or on an attachment without an admission id):
       LIVE while a VMI with that uid exists in the namespace, else GONE (that incarnation
       was deleted; a same-name VMI is a newer one);
    2. a VMI of its name exists and is its incarnation: its admission annotation is the
       attachment's admission, or the id of the device's bind request for that VMI (the
       request a W4 take-over re-keyed the attachment after); LIVE, no `link` (the admission
       id tells the incarnation; no uid is recorded). An attachment without an admission id
       (written before admission ids) is LIVE while a VMI of its name exists, `link` = that
       VMI's uid (recorded on that very device: only a uid can tell its incarnation later);
    3. its admission is among the deleted incarnations: GONE;
    4. its own request (bindRequest id = admission) was refused: GONE, once `answer_window`
       (the webhook's bind timeout) has passed since the request was written; before that
       PENDING, since the webhook that wrote it may still be reading the binder's answer
       from the other members and clears it itself (W5): clearing it first made that
       webhook see the request withdrawn and answer a timeout instead of the refusal;
    5. a VMI of its name exists as another incarnation (another admission annotation, or
       none: W7 keeps a VMI's annotation as admission wrote it, so it is not this
       attachment's VMI): PENDING within `grace` of the attachment (an admission of a new
       incarnation in flight while the cache still shows the older one), else GONE;
    6. older than `grace`: STALE; else PENDING. With no uid recorded this is also where a
       set whose VMI was deleted while no replica watched (no tombstone) ends up: released
       after `grace`, never before, and never while a VMI carrying its admission exists
       (case 2 comes first).
    H4: a recorded keep (`keptUntil`) is judged first (`_judge_kept`: KEPT, or GONE once it
    ran out or its VM is gone); in cases 1 and 3 (the VMI incarnation is gone), and in case
    6 when the attachment's own request Succeeded (`granted`: its VMI was admitted, and may
    have existed and gone unseen), the set is
    KEPT when its VM still exists and `keep` (the set's keepSetFor) is given
    (`_gone_or_kept`), unless it yielded to a preemptor (`yielded`: (namespace, VMI) of the
    victims of nominations live now, P4). `vms`: the VirtualMachines that exist, None when
    not known (W1). `now` is timezone-aware UTC."""
    att = device.status.attached_to
    if att is None:
        return None
    ns = device.namespace
    if att.kept_until is not None:
        if (ns, att.vmi) in yielded:  # kept before this replica saw the nomination: released
            return Verdict(State.GONE, VmiDeleted(att.vmi, att.uid), rule=Rule.H2)
        return _judge_kept(ns, att, vms, now)
    uid = att.uid or (links or {}).get((ns, att.admission or ""))
    if uid:
        if (ns, uid) in vmis.uids:
            return Verdict(State.LIVE, VmiExists(att.vmi, uid))
        return _gone_or_kept(ns, att, Verdict(State.GONE, VmiDeleted(att.vmi, uid), rule=Rule.H2),
                             keep, vms, now, yielded)
    rec = vmis.live.get((ns, att.vmi))
    if rec is not None and att.admission is None:   # before admission ids: link its uid
        return Verdict(State.LIVE, VmiExists(att.vmi), rec.uid or None)
    if rec is not None and rec.admission in incarnation(device):
        return Verdict(State.LIVE, VmiExists(att.vmi))
    if att.admission and (ns, att.admission) in vmis.deleted:
        return _gone_or_kept(ns, att, Verdict(State.GONE, VmiDeleted(att.vmi), rule=Rule.H2),
                             keep, vms, now, yielded)
    br = device.status.bind_request
    if att.admission and br is not None and br.id == att.admission \
            and br.result is Result.REFUSED:
        asked = br.requested_at or att.since
        if now - asked <= answer_window:
            return Verdict(State.PENDING, RefusalBeingRead(att.vmi))
        return Verdict(State.GONE, RequestRefused(att.vmi))
    if rec is not None:
        if now - att.since <= grace:
            return Verdict(State.PENDING, NewIncarnationInFlight(att.vmi))
        return Verdict(State.GONE, AnotherIncarnation(att.vmi, rec.admission, att.admission))
    if now - att.since > grace:
        stale = Verdict(State.STALE, VmiNeverAppeared(att.vmi, int((now - att.since).total_seconds())))
        if granted(device):  # H4: its VMI may have come and gone unseen (no uid recorded)
            return _gone_or_kept(ns, att, stale, keep, vms, now, yielded)
        return stale
    return Verdict(State.PENDING, VmiNotYetSeen(att.vmi))


def granted(device: GPUDevice) -> bool:
    """Whether `device`'s attachment was admitted: it has an admission id and the device's
    bind request for the same VMI Succeeded (W3 step 4; the request stays after admission,
    W4 reads it). Such a set's VMI may have existed and been deleted while no replica
    watched: with no uid recorded that cannot be told from a VMI that never appeared, so
    H4 keeps it for its VM like a deleted incarnation's (`judge`, case 6)."""
    att = device.status.attached_to
    br = device.status.bind_request
    return (att is not None and bool(att.admission) and br is not None and br.vmi == att.vmi
            and br.result is Result.SUCCEEDED)


def incarnation(device: GPUDevice) -> frozenset[str]:
    """The admission ids a VMI incarnation holding `device`'s attachment may carry as its
    `gpu.cozystack.io/admission` annotation (W7: fixed at its admission): the attachment's
    own, and the id of the device's bind request for the same VMI name (two creates of one
    name racing: the one stored may be the request's admission, though a W4 take-over by
    the other re-keyed the attachment). Empty when the attachment has no admission id
    (written before admission ids: not told apart by id)."""
    att = device.status.attached_to
    if att is None or not att.admission:
        return frozenset()
    br = device.status.bind_request
    if br is not None and br.vmi == att.vmi and br.id:
        return frozenset({att.admission, br.id})
    return frozenset({att.admission})


@dataclass(frozen=True, slots=True)
class ClearAttachment:
    """Clear `status.attachedTo` (and a `bindRequest` for the same VMI) of `device`, provided
    it is still the attachment planned (`admission`, else `since`)."""

    device: tuple[str, str]
    vmi: str
    rule: Rule
    reason: HousekeepingReason
    since: datetime | None = field(default=None, compare=False)
    """`attachedTo.since` as planned: the executor acts only on that same attachment."""
    admission: str | None = field(default=None, compare=False)
    uid: str | None = field(default=None, compare=False)
    """The attachment's recorded VMI uid: a live VMI of the name with another uid is a newer
    incarnation and does not stop the action (`confirmed`)."""
    admissions: frozenset[str] = field(default=frozenset(), compare=False)
    """The admission ids of the attachment's incarnation (`incarnation`): a live VMI of the
    name carrying none of them is another incarnation and does not stop the action."""


@dataclass(frozen=True, slots=True)
class DeleteTemplate:
    """Delete template device `device` (uid-preconditioned by the adapter when known). When
    `attached` is the attachment planned, the adapter clears it first (the shipped policy
    refuses deleting an attached device) and deletes only that same version."""

    device: tuple[str, str]
    uid: str | None
    rule: Rule
    reason: HousekeepingReason
    attached: Attachment | None = field(default=None, compare=False)
    admissions: frozenset[str] = field(default=frozenset(), compare=False)
    """As `ClearAttachment.admissions`, for `attached`."""


@dataclass(frozen=True, slots=True)
class LinkAttachment:
    """Record `uid` (the VMI incarnation seen live) in `device`'s attachment of `vmi` (H2:
    from then on it is released as soon as that uid is gone, across leader changes). Only
    for an attachment without an admission id (written before admission ids), which nothing
    else tells apart from a newer incarnation of its name; `admission` is then None. (Up to
    issue 40, one device of every admitted set got one: the writes of those versions are
    still read, `recorded_links`.)"""

    device: tuple[str, str]
    vmi: str
    uid: str
    admission: str | None
    since: datetime = field(compare=False)
    rule: Rule = Rule.H2
    reason: HousekeepingReason = UidRecorded()


@dataclass(frozen=True, slots=True)
class KeepAttachment:
    """H4: record `until` as `keptUntil` in `device`'s attachment of `vmi` made by
    `admission` (kept for VirtualMachine `vmi` with uid `owner`). Every device of the set
    gets the same time. The adapter confirms first that the VMI incarnation is gone and
    the VM exists (live reads), and writes with a `test` of the attachment's admission."""

    device: tuple[str, str]
    vmi: str
    owner: str
    until: datetime
    admission: str | None
    since: datetime = field(compare=False)
    uid: str | None = field(default=None, compare=False)
    admissions: frozenset[str] = field(default=frozenset(), compare=False)
    rule: Rule = Rule.H4
    reason: HousekeepingReason | None = None
    """The judgement that keeps it (`KeepStarts`, or `Kept` for a keep written in part)."""


Action = ClearAttachment | DeleteTemplate | LinkAttachment | KeepAttachment


def set_keep(classes: Iterable[str], keeps: Mapping[str, timedelta | None]) -> timedelta | None:
    """H4: how long a set of devices of `classes` is kept: the smallest `keepSetFor` of
    them (`keeps`: class name → keepSetFor), None (not kept) when one of them lacks it or
    is unknown, or when there is none."""
    out: timedelta | None = None
    any_class = False
    for c in classes:
        any_class = True
        k = keeps.get(c)
        if k is None or k <= timedelta(0):
            return None
        out = k if out is None else min(out, k)
    return out if any_class else None


def set_keeps(devices: Iterable[GPUDevice], keeps: Mapping[str, timedelta | None]
              ) -> tuple[dict[tuple[str, str], timedelta | None], dict[tuple[str, str], datetime]]:
    """Per set ((namespace, admission id) of its attachments): how long it is kept
    (`set_keep` over the classes of its devices), and the `keptUntil` already recorded on a
    device of it (the earliest, so a set whose keep was written in part gets one time)."""
    classes: dict[tuple[str, str], set[str]] = {}
    until: dict[tuple[str, str], datetime] = {}
    for d in devices:
        att = d.status.attached_to
        if att is None or not att.admission:
            continue
        group = (d.namespace, att.admission)
        classes.setdefault(group, set()).add(d.class_name)
        if att.kept_until is not None:
            until[group] = min(until.get(group, att.kept_until), att.kept_until)
    return {g: set_keep(cs, keeps) for g, cs in classes.items()}, until


def plan(devices: Iterable[GPUDevice], vmis: VMIs | set[VMIKey], now: datetime,
         grace: timedelta, answer_window: timedelta = timedelta(0), *,
         keeps: Mapping[str, timedelta | None] | None = None,
         vms: VMs | None = None, yielded: Collection[VMIKey] = frozenset()) -> list[Action]:
    """Actions for H1 and H2, sorted by device key (`judge` decides each attachment).

    - GONE (H2): a held device's attachment is cleared, a template device deleted; held
      devices keep their node.
    - STALE (H1): likewise, after `grace`.
    - LIVE: nothing, but for an attachment without an admission id (written before
      admission ids) that does not record its VMI's uid yet: LinkAttachment on that device.
      An attachment with an admission id is never linked (no write per admission; the uid
      links earlier versions wrote are still read, `recorded_links`).
    - A template device with no attachment is deleted when no VMI of its name exists and it
      was created more than `grace` ago (an admission creates it just before attaching it);
      at once, when it is Bound and its VMI yielded (`yielded`, P4: a victim's re-created
      VMI attached it and was refused, and the room is its preemptor's).
    `vmis` may be a plain set of live keys (no uids known). `now` is timezone-aware UTC.
    `answer_window`: how long a refused request is left to its webhook (`judge`, case 4).
    - KEPT (H4; `keeps`: class name → keepSetFor, `vms`: the VirtualMachines that exist,
      None when not known): KeepAttachment with the set's one `keptUntil` on each device
      that does not record it yet; a kept set whose VM is gone or whose time ran out is
      GONE and released as above (rule H4). A set that yielded to a preemptor (`yielded`:
      (namespace, VMI) of the victims of nominations live now, P4) is released, not kept:
      its VM starts again (runStrategy Always) and waits for room like any set.
    """
    if not isinstance(vmis, VMIs):
        vmis = VMIs.of_keys(vmis)
    devices = sorted(devices, key=lambda d: d.key)
    links = recorded_links(devices)
    set_keep_for, recorded_until = set_keeps(devices, keeps or {})
    actions: list[Action] = []
    for d in devices:
        att = d.status.attached_to
        if att is not None:
            group = (d.namespace, att.admission or "")
            v = judge(d, vmis, now, grace, links, answer_window,
                      keep=set_keep_for.get(group), vms=vms, yielded=yielded)
            assert v is not None
            if v.state is State.KEPT:
                if att.kept_until is None and att.owner and v.until is not None:
                    until = recorded_until.setdefault(group, v.until)
                    actions.append(KeepAttachment(
                        d.key, att.vmi, att.owner, until, att.admission, att.since,
                        att.uid or links.get(group), incarnation(d), reason=v.reason))
                continue
            if v.state is State.LIVE:
                if v.link and not att.uid:  # only before admission ids (`judge`, case 2)
                    actions.append(LinkAttachment(d.key, att.vmi, v.link, att.admission,
                                                  att.since))
                continue
            if v.state is State.PENDING:
                continue
            rule = v.rule or (Rule.H2 if v.state is State.GONE else Rule.H1)
            ids = incarnation(d)
            if d.template_for is not None:
                actions.append(DeleteTemplate(d.key, d.uid, rule, v.reason, att, ids))
            else:
                actions.append(ClearAttachment(d.key, att.vmi, rule, v.reason, att.since,
                                               att.admission, att.uid, ids))
        elif d.template_for is not None:
            if (d.namespace, d.template_for) in vmis.live:
                continue
            if (d.namespace, d.template_for) in yielded and d.bound_node is not None:
                actions.append(DeleteTemplate(d.key, d.uid, Rule.H2, YieldedTemplate(d.template_for)))
                continue
            if d.created_at is not None and now - d.created_at > grace:
                age = int((now - d.created_at).total_seconds())
                actions.append(DeleteTemplate(d.key, d.uid, Rule.H1, OrphanTemplate(age)))
    return actions


def recorded_links(devices: Iterable[GPUDevice]) -> dict[tuple[str, str], str]:
    """(namespace, admission id) → the VMI uid recorded in an attachment made by that
    admission, as earlier versions wrote it (on one device of the set; version 0.1.0 on
    every device). Kept so that an upgrade judges the sets they linked as before (`judge`,
    case 1); this version records none for an admission. Attachments without an admission
    id are not grouped."""
    out: dict[tuple[str, str], str] = {}
    for d in devices:
        att = d.status.attached_to
        if att is not None and att.uid and att.admission:
            out.setdefault((d.namespace, att.admission), att.uid)
    return out


def confirmed(vmi: str, attachment_uid: str | None, live: VMIRecord | None,
              admissions: frozenset[str] = frozenset()) -> bool:
    """Whether a destructive step planned for VMI `vmi` may go ahead given the live read
    `live` of that VMI (None: the API server says it does not exist). It may when the VMI
    does not exist; when the attachment records a uid and the live VMI is another
    incarnation; or when the attachment's incarnation is known by admission id
    (`admissions`, from `incarnation`) and the live VMI carries none of them (W7: its
    annotation is the one its admission wrote, so it is another incarnation). Never when the
    VMI of that name exists and cannot be told apart (the cache was behind)."""
    if live is None:
        return True
    if attachment_uid:
        return live.uid != attachment_uid
    return bool(admissions) and live.admission not in admissions


KEPT_CONDITION = "GPUSetKept"
"""H4: the VirtualMachine `status.conditions[type]` the leader's housekeeping writes on a VM
whose set is kept for it (True, `KEPT_REASON`), removed once the keep ends. virt-controller
keeps a condition it does not know on a VM without a VMI and drops it once the VM has a VMI
(KubeVirt v1.8.3 `pkg/virt-controller/watch/vm/vm.go` `syncConditions`), so it shows while
the VM is stopped and goes when the VM starts."""
KEPT_REASON = "SetKept"


@dataclass(frozen=True, slots=True)
class KeptFor:
    """H4: the set kept for VirtualMachine `namespace/vm` (uid `owner`): its devices, the
    node(s) they are Bound on, and until when (the earliest `keptUntil` of them)."""

    namespace: str
    vm: str
    owner: str
    nodes: tuple[str, ...]
    devices: tuple[str, ...]
    until: datetime

    def condition(self) -> KeptCondition:
        """The content of the VM's `GPUSetKept` condition (rendered by the writer)."""
        return KeptCondition(self.nodes, self.devices, self.until)

    def message(self) -> str:
        """The text of the VM's `GPUSetKept` condition (`KeptCondition.render`)."""
        return self.condition().render()


def kept_for_vms(devices: Iterable[GPUDevice], now: datetime) -> dict[VMIKey, KeptFor]:
    """H4: per VirtualMachine (namespace, name) the set kept for it now: the devices whose
    attachment records an owner and a `keptUntil` still ahead of `now`. Devices kept for
    two uids of one name (a VM deleted and re-created, the old keep not yet released) are
    told apart by `owner`: the earliest keep's owner is kept, the other left out."""
    out: dict[VMIKey, KeptFor] = {}
    for d in sorted(devices, key=lambda d: d.key):
        att = d.status.attached_to
        if att is None or att.kept_until is None or not att.owner or att.kept_until <= now:
            continue
        key = (d.namespace, att.vmi)
        have = out.get(key)
        if have is not None and have.owner != att.owner:
            continue
        nodes = tuple(have.nodes) if have else ()
        if d.bound_node and d.bound_node not in nodes:
            nodes = (*nodes, d.bound_node)
        out[key] = KeptFor(d.namespace, att.vmi, att.owner, nodes,
                           (*(have.devices if have else ()), d.name),
                           min(have.until, att.kept_until) if have else att.kept_until)
    return out


READY_CONDITION = "Ready"
"""GPUClass `status.conditions[type]` saying whether the class can serve (DR1)."""


def ready_condition(cls: GPUClass) -> ClassCondition:
    """The Ready condition of GPUClass `cls` (`ClassCondition`: status, reason, and the
    message it renders): `CannotServe` (False) with the class's `problem` (both or neither of
    resourceName and deviceClassName, a DeviceClass that does not exist, a selector that does
    not compile: its VMIs are refused with that text, DR1), else True naming its mode
    (`ServesDevices`, `ServesUnits`)."""
    if cls.problem:
        return CannotServe(cls.problem)
    if serves_devices(cls):
        return ServesDevices(cls.device_class_name, cls.match_attribute)
    return ServesUnits(cls.resource_name)


KUBEVIRT_CONDITION = "KubeVirtPermitted"
"""GPUClass `status.conditions[type]` saying whether KubeVirt permits the class's resource."""


def kubevirt_condition(resource_name: str, permitted: frozenset[str] | None) -> ClassCondition:
    """The KubeVirtPermitted condition of a GPUClass with `resource_name`: `Permitted` (True)
    when KubeVirt's `permittedHostDevices` (`permitted`) lists it, `NotPermitted` (False)
    when not (the webhook then denies VMIs asking for the class, W1), `NoKubeVirt` (Unknown)
    when no KubeVirt CR exists (`permitted` None; nothing is denied for it)."""
    if permitted is None:
        return NoKubeVirt()
    if resource_name in permitted:
        return Permitted(resource_name)
    return NotPermitted(resource_name)
