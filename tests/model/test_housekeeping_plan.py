"""H1 and H2 decisions of model.housekeeping (pure): level-based judgement of each
attachment by VMI incarnation (uid, admission id), never by two samples of the cache."""

from datetime import datetime, timedelta, timezone

from model.housekeeping import (ClearAttachment, DeleteTemplate, LinkAttachment, State,
                                VMIRecord, VMIs, confirmed, judge, plan,
                                recorded_links)
from model.housekeeping_reasons import (AnotherIncarnation, OrphanTemplate, Rule, VmiDeleted,
                                        VmiNeverAppeared)
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)


def dev(name, vmi=None, since_s=0, template_for=None, created_s=0, bound=None,
        admission=None, uid=None, request=None):
    att = Attachment(vmi, NOW - timedelta(seconds=since_s), admission, uid) if vmi else None
    status = DeviceStatus(phase=Phase.BOUND if bound else Phase.PENDING, node_name=bound,
                          attached_to=att, bind_request=request)
    return GPUDevice("t1", name, "h100", template_for=template_for, status=status,
                     uid=f"uid-{name}", created_at=NOW - timedelta(seconds=created_s))


def live(*recs: tuple[str, str, str | None], deleted=()) -> VMIs:
    return VMIs({("t1", n): VMIRecord("t1", n, u, a) for n, u, a in recs},
                frozenset(("t1", a) for a in deleted))


def test_H1_attachment_of_vmi_that_never_appeared_is_cleared_after_grace_only():
    young, old = dev("young", "vm-a", since_s=119), dev("old", "vm-b", since_s=121, bound="n1")
    assert plan([young, old], VMIs(), NOW, GRACE) == [
        ClearAttachment(("t1", "old"), "vm-b", Rule.H1, VmiNeverAppeared("vm-b", 121))]


def test_H1_template_of_missing_vmi_deleted_and_unattached_old_template_deleted():
    attached = dev("vm-x-0", "vm-x", since_s=300, template_for="vm-x", created_s=300)
    orphan = dev("vm-y-0", template_for="vm-y", created_s=500)
    fresh_orphan = dev("vm-z-0", template_for="vm-z", created_s=10)
    got = plan([orphan, attached, fresh_orphan], set(), NOW, GRACE)
    assert got == [
        DeleteTemplate(("t1", "vm-x-0"), "uid-vm-x-0", Rule.H1, VmiNeverAppeared("vm-x", 300)),
        DeleteTemplate(("t1", "vm-y-0"), "uid-vm-y-0", Rule.H1, OrphanTemplate(500)),
    ]
    assert got[0].attached == attached.status.attached_to  # cleared before it is deleted


def test_H2_deleted_incarnation_by_tombstone_released_at_once_without_two_samples():
    # the VMI was created and deleted between two rounds: only its tombstone tells
    held = dev("held", "vm-a", since_s=1, bound="n1", admission="a1")
    tmpl = dev("vm-a-0", "vm-a", since_s=1, template_for="vm-a", bound="n1", admission="a1")
    other = dev("other", "vm-b", since_s=5000, bound="n2", admission="b1", uid="u-b")
    got = plan([held, tmpl, other], live(("vm-b", "u-b", "b1"), deleted=["a1"]), NOW, GRACE)
    assert got == [
        ClearAttachment(("t1", "held"), "vm-a", Rule.H2, VmiDeleted("vm-a")),
        DeleteTemplate(("t1", "vm-a-0"), "uid-vm-a-0", Rule.H2, VmiDeleted("vm-a")),
    ]


def test_H2_recorded_uid_releases_after_a_leader_change_with_no_tombstone():
    # no replica saw the delete (all were down); the attachment's uid is enough
    held = dev("held", "vm-a", since_s=1, bound="n1", admission="a1", uid="u1")
    assert plan([held], VMIs(), NOW, GRACE) == [
        ClearAttachment(("t1", "held"), "vm-a", Rule.H2, VmiDeleted("vm-a", "u1"))]


def test_H2_newer_incarnation_of_the_name_does_not_keep_the_older_ones_devices():
    old = dev("held", "vm-a", since_s=30, bound="n1", admission="a1", uid="u1")
    v = judge(old, live(("vm-a", "u2", "a2")), NOW, GRACE)
    assert v.state is State.GONE


def test_H2_restart_race_new_admission_of_the_name_is_not_undone():
    # deleted (tombstone a1) and re-created: the attachment now carries the new admission a2
    new = dev("held", "vm-a", since_s=0, bound="n1", admission="a2")
    assert plan([new], live(deleted=["a1"]), NOW, GRACE) == []      # pending: VMI not yet seen
    # seen live: its admission id tells it, no uid link is written (issue 40)
    assert plan([new], live(("vm-a", "u2", "a2"), deleted=["a1"]), NOW, GRACE) == []
    assert judge(new, live(("vm-a", "u2", "a2"), deleted=["a1"]), NOW, GRACE).state is State.LIVE
    # the cache still shows the older incarnation: within the grace the new one is pending
    assert judge(new, live(("vm-a", "u1", "a1")), NOW, GRACE).state is State.PENDING


def test_live_vmi_protects_its_devices_however_old_and_no_uid_link_is_written():
    # issue 40: the admission id tells the incarnation; no device of the set records a uid
    d = dev("held", "vm-a", since_s=10_000, bound="n1", admission="a1")
    t = dev("vm-a-0", "vm-a", since_s=10_000, template_for="vm-a", bound="n1", admission="a1")
    assert plan([d, t], live(("vm-a", "u1", "a1")), NOW, GRACE) == []
    assert [judge(x, live(("vm-a", "u1", "a1")), NOW, GRACE).link for x in (d, t)] == [None, None]
    # a set an earlier version linked (uid on one device) is judged as before: by that uid
    linked = dev("held", "vm-a", since_s=10_000, bound="n1", admission="a1", uid="u1")
    assert plan([linked, t], live(("vm-a", "u1", "a1")), NOW, GRACE) == []


def test_H2_one_recorded_uid_releases_the_whole_set_after_a_leader_change_with_no_tombstone():
    # deleted young (within the grace) while no replica watched: the uid on one device tells
    linked = dev("held", "vm-a", since_s=1, bound="n1", admission="a1", uid="u1")
    t = dev("vm-a-0", "vm-a", since_s=1, template_for="vm-a", bound="n1", admission="a1")
    other = dev("other", "vm-b", since_s=1, bound="n1", admission="b1")  # not of that set
    got = plan([linked, t, other], VMIs(), NOW, GRACE)
    assert got == [
        ClearAttachment(("t1", "held"), "vm-a", Rule.H2, VmiDeleted("vm-a", "u1")),
        DeleteTemplate(("t1", "vm-a-0"), "uid-vm-a-0", Rule.H2, VmiDeleted("vm-a", "u1"))]


def test_H2_attachment_without_an_admission_id_is_still_linked_to_its_vmis_uid():
    # written before admission ids: only a uid can tell its incarnation later
    d = dev("held", "vm-a", since_s=10_000, bound="n1")
    assert plan([d], live(("vm-a", "u1", "a1")), NOW, GRACE) == [
        LinkAttachment(("t1", "held"), "vm-a", "u1", None, d.status.attached_to.since)]


def test_H2_version_0_1_0_uid_link_still_decides():
    # a device linked by 0.1.0: its uid is what counts, whatever the annotation says
    d = dev("held", "vm-a", since_s=10_000, bound="n1", admission="a1", uid="u1")
    assert judge(d, live(("vm-a", "u1", "other")), NOW, GRACE).state is State.LIVE
    assert judge(d, live(("vm-a", "u2", "a1")), NOW, GRACE).state is State.GONE


def test_H2_same_name_vmi_of_another_admission_is_another_incarnation_after_the_grace():
    # no tombstone (a leader change), and the name re-created with other devices or none:
    # W7 keeps an admitted VMI's annotation, so another admission id is another incarnation
    d = dev("held", "vm-a", since_s=10_000, bound="n1", admission="a1")
    tmpl = dev("vm-a-0", "vm-a", since_s=10_000, template_for="vm-a", bound="n1", admission="a1")
    got = plan([d, tmpl], live(("vm-a", "u2", "a2")), NOW, GRACE)
    why = AnotherIncarnation("vm-a", "a2", "a1")
    assert got == [ClearAttachment(("t1", "held"), "vm-a", Rule.H2, why),
                   DeleteTemplate(("t1", "vm-a-0"), "uid-vm-a-0", Rule.H2, why)]
    assert got[0].admissions == got[1].admissions == frozenset({"a1"})
    assert judge(d, live(("vm-a", "u2", None)), NOW, GRACE).state is State.GONE  # no GPUs now
    young = dev("held", "vm-a", since_s=5, bound="n1", admission="a1")
    assert judge(young, live(("vm-a", "u2", "a2")), NOW, GRACE).state is State.PENDING


def test_H2_racing_creates_of_one_name_the_stored_vmi_carries_the_requests_admission():
    # B took over A's Succeeded request (attachment re-keyed to B), but A's create was stored
    br = BindRequest("a", "vm-a", ("held",), result=Result.SUCCEEDED, node="n1")
    d = dev("held", "vm-a", since_s=10_000, bound="n1", admission="b", request=br)
    assert judge(d, live(("vm-a", "u1", "a")), NOW, GRACE).state is State.LIVE
    assert judge(d, live(("vm-a", "u1", "b")), NOW, GRACE).state is State.LIVE
    assert judge(d, live(("vm-a", "u1", "c")), NOW, GRACE).state is State.GONE


def test_refused_request_of_the_attachments_own_admission_is_gone():
    br = BindRequest("a1", "vm-a", ("held",), result=Result.REFUSED, message="no room")
    d = dev("held", "vm-a", since_s=1, admission="a1", request=br)
    assert judge(d, VMIs(), NOW, GRACE).state is State.GONE
    other = BindRequest("a0", "vm-a", ("held",), result=Result.REFUSED)
    assert judge(dev("held", "vm-a", since_s=1, admission="a1", request=other), VMIs(), NOW,
                 GRACE).state is State.PENDING


def test_H2_a_refused_request_is_left_to_its_webhook_for_the_answer_window():
    """The webhook that wrote a refused request reads the binder's answer from every member
    and clears the request itself (W5); H2 clears it only once the bind timeout has passed
    since it was written, else that webhook saw it withdrawn and answered a timeout."""
    window = timedelta(seconds=20)
    asked = NOW - timedelta(seconds=5)
    br = BindRequest("a1", "vm-a", ("held",), requested_at=asked, result=Result.REFUSED)
    d = dev("held", "vm-a", since_s=5, admission="a1", request=br)
    assert judge(d, VMIs(), NOW, GRACE, answer_window=window).state is State.PENDING
    assert plan([d], VMIs(), NOW, GRACE, answer_window=window) == []
    later = NOW + timedelta(seconds=16)
    assert judge(d, VMIs(), later, GRACE, answer_window=window).state is State.GONE
    assert [a.rule for a in plan([d], VMIs(), later, GRACE, answer_window=window)] == [Rule.H2]


def test_without_drops_a_vmi_a_live_read_says_is_gone_and_tombstones_it():
    v = live(("vm-a", "u1", "a1")).without(("t1", "vm-a"))
    assert v.live == {} and ("t1", "a1") in v.deleted


def test_H2_destructive_step_confirmed_only_when_the_live_read_agrees():
    assert confirmed("vm-a", None, None)                               # gone: go ahead
    assert not confirmed("vm-a", None, VMIRecord("t1", "vm-a", "u1"))   # exists: cache behind
    assert not confirmed("vm-a", "u1", VMIRecord("t1", "vm-a", "u1"))
    assert confirmed("vm-a", "u1", VMIRecord("t1", "vm-a", "u2"))       # a newer incarnation
    # by admission id (W7): a live VMI carrying none of the attachment's ids is another one
    ids = frozenset({"a1", "r1"})
    assert confirmed("vm-a", None, VMIRecord("t1", "vm-a", "u2", "a2"), ids)
    assert confirmed("vm-a", None, VMIRecord("t1", "vm-a", "u2", None), ids)
    assert not confirmed("vm-a", None, VMIRecord("t1", "vm-a", "u2", "a1"), ids)
    assert not confirmed("vm-a", None, VMIRecord("t1", "vm-a", "u2", "r1"), ids)
    assert not confirmed("vm-a", None, VMIRecord("t1", "vm-a", "u2", "a2"))  # no ids known
    assert not confirmed("vm-a", "u1", VMIRecord("t1", "vm-a", "u1", "a2"), ids)  # uid decides


# -- no uid link (issue 40): what a set without one is judged by ----------------------------

def granted(name, vmi="vm-a", admission="a1", since_s=0, **kw):
    """A device of a set whose request Succeeded (admitted), no uid recorded."""
    br = BindRequest(admission, vmi, ("held", f"{vmi}-0"), result=Result.SUCCEEDED, node="n1")
    return dev(name, vmi, since_s=since_s, bound="n1", admission=admission, request=br, **kw)


def carry_out_links(devices, actions):
    """The devices after the plan's LinkAttachment writes (what the executor records)."""
    uids = {a.device: a.uid for a in actions if isinstance(a, LinkAttachment)}
    out = []
    for d in devices:
        att = d.status.attached_to
        if d.key in uids:
            att = Attachment(att.vmi, att.since, att.admission, uids[d.key])
        out.append(GPUDevice(d.namespace, d.name, d.class_name, template_for=d.template_for,
                             status=DeviceStatus(phase=d.status.phase, node_name=d.status.node_name,
                                                 attached_to=att, bind_request=d.status.bind_request),
                             uid=d.uid, created_at=d.created_at))
    return out


def test_plan_emits_no_uid_link_for_a_live_admitted_vmi_one_write_less_per_admission():
    d = granted("held", since_s=1)
    t = granted("vm-a-0", since_s=1, template_for="vm-a")
    got = plan([d, t], live(("vm-a", "u1", "a1")), NOW, GRACE)
    assert got == [] and not any(isinstance(a, LinkAttachment) for a in got)
    # still linked: an attachment written before admission ids (only a uid tells it apart)
    old = dev("old", "vm-b", since_s=10_000, bound="n1")
    assert plan([old], live(("vm-b", "u9", None)), NOW, GRACE) == [
        LinkAttachment(("t1", "old"), "vm-b", "u9", None, old.status.attached_to.since)]


def test_H2_vmi_deleted_while_no_replica_watched_is_released_after_grace_not_before():
    # round 1 saw the VMI live; then every replica went away, the VMI was deleted, and the
    # new leader has no tombstone. With no uid recorded the set waits for the grace (H1)
    d = granted("held", since_s=10)
    t = granted("vm-a-0", since_s=10, template_for="vm-a")
    seen = carry_out_links([d, t], plan([d, t], live(("vm-a", "u1", "a1")), NOW, GRACE))
    assert [x.status.attached_to.uid for x in seen] == [None, None]
    assert plan(seen, VMIs(), NOW, GRACE) == []                       # within the grace
    assert judge(seen[0], VMIs(), NOW, GRACE).state is State.PENDING
    later = NOW + GRACE
    why = VmiNeverAppeared("vm-a", int((GRACE + timedelta(seconds=10)).total_seconds()))
    got = plan(seen, VMIs(), later, GRACE)
    assert got == [ClearAttachment(("t1", "held"), "vm-a", Rule.H1, why),
                   DeleteTemplate(("t1", "vm-a-0"), "uid-vm-a-0", Rule.H1, why)]
    assert got[0].admissions == frozenset({"a1"}) and got[0].uid is None  # confirmed by admission
    # the tombstone, when a replica saw the delete, still releases at once
    assert [a.rule for a in plan(seen, live(deleted=["a1"]), NOW, GRACE)] == [Rule.H2, Rule.H2]


def test_H2_never_released_while_a_vmi_with_the_attachments_admission_exists():
    d = granted("held", since_s=100_000)
    t = granted("vm-a-0", since_s=100_000, template_for="vm-a")
    for vmis in (live(("vm-a", "u1", "a1")), live(("vm-a", "u1", "a1"), deleted=["a0"])):
        assert plan([d, t], vmis, NOW, GRACE) == []
        assert judge(d, vmis, NOW, GRACE).state is State.LIVE
    # and the executor's live read refuses a release planned from a cache that missed it
    assert not confirmed("vm-a", None, VMIRecord("t1", "vm-a", "u1", "a1"), frozenset({"a1"}))


def test_H2_same_name_vmi_of_another_admission_never_keeps_the_old_set():
    # case 5: the name re-created (another admission) while no replica watched; the old set
    # was never linked: it is not LIVE for the new VMI, PENDING within the grace, then GONE
    d = granted("held", since_s=10)
    seen = carry_out_links([d], plan([d], live(("vm-a", "u1", "a1")), NOW, GRACE))
    newer = live(("vm-a", "u2", "a2"))
    assert judge(seen[0], newer, NOW, GRACE).state is State.PENDING
    v = judge(seen[0], newer, NOW + GRACE, GRACE)
    assert v.state is State.GONE and not v.holds
    assert plan(seen, newer, NOW + GRACE, GRACE) == [
        ClearAttachment(("t1", "held"), "vm-a", Rule.H2, AnotherIncarnation("vm-a", "a2", "a1"))]


def test_H2_a_set_an_earlier_version_linked_is_still_judged_by_its_uid():
    # upgrade: the uid on one device (as written before issue 40) decides for the whole set,
    # whatever the annotation, and releases at once with no tombstone
    linked = granted("held", since_s=1, uid="u1")
    t = granted("vm-a-0", since_s=1, template_for="vm-a")
    assert plan([linked, t], live(("vm-a", "u1", "a1")), NOW, GRACE) == []
    assert plan([linked, t], VMIs(), NOW, GRACE) == [
        ClearAttachment(("t1", "held"), "vm-a", Rule.H2, VmiDeleted("vm-a", "u1")),
        DeleteTemplate(("t1", "vm-a-0"), "uid-vm-a-0", Rule.H2, VmiDeleted("vm-a", "u1"))]
    links = recorded_links([linked, t])           # read for the set's other devices
    assert judge(t, live(("vm-a", "u2", "a1")), NOW, GRACE, links).state is State.GONE
