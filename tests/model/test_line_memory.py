"""The waiting line read back after a failover (`model.line_memory`, docs/contract.md §3c P5,
*Failover keeps the published places*): a bare VMI the published summary listed, refused
again within `line.retryGrace` of the new coordinator's start, takes its published first
refusal, once, only for the same namespace and name, only for kind VMI, never earlier than
published nor later than its own refusal."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from model.line import DEFAULT_RETRY_GRACE, Identity, Line, Shape, entry
from model.line_memory import NOTHING, recall, recalled, trust_published
from model.line_status import ClassLine, VM_KIND, VMI_KIND, Shown, line_to_status, published_lines, summarize
from model.priority import Priority
from hypothesis import given, settings
from hypothesis import strategies as st

T0 = datetime(2026, 12, 6, 23, tzinfo=timezone.utc)
SPOT = Priority(100, class_name="spot")
GRACE = DEFAULT_RETRY_GRACE


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def waiting(vmi: str, seconds: float, ns: str = "t", uid: str | None = None, cls: str = "h100"):
    return entry(Identity(ns, vmi, uid), Shape((), ((cls, 1),)), SPOT, at(seconds))


def published(line: Line) -> dict[str, ClassLine]:
    """What a new leader reads back: the old leader's summary through the API's shape."""
    raw = [{"metadata": {"name": c}, "status": {"line": line_to_status(cl)}} for c, cl in summarize(line).items()]
    return published_lines(raw)


def names(line: Line) -> list[str]:
    return [e.identity.vmi for e in line]


def test_P5_a_bare_vmi_refused_again_takes_its_published_first_refusal_and_keeps_its_place():
    old = Line([waiting("b", 0), waiting("a", 5)])                       # b was refused first: ahead
    memory = recalled(published(old), at(60), GRACE)                     # a failover at 60 s
    assert memory.since == {("t", "b"): at(0), ("t", "a"): at(5)} and memory.until == at(60) + GRACE
    line, memory = recall(memory, Line([waiting("a", 61)]), at(61))      # a retries first now
    assert [(e.identity.vmi, e.first_refused) for e in line] == [("a", at(5))]
    line, memory = recall(memory, line.refused(waiting("b", 62), at(62)), at(62))
    assert names(line) == ["b", "a"]                                     # b still ahead of a
    assert line.entries[0].first_refused == at(0) and line.entries[0].last_seen == at(62)
    assert memory is NOTHING                                             # every name used


def test_P5_each_remembered_first_refusal_is_used_once():
    memory = recalled(published(Line([waiting("a", 0)])), at(60), GRACE)
    line, memory = recall(memory, Line([waiting("a", 61)]), at(61))
    assert line.entries[0].first_refused == at(0) and memory is NOTHING
    left = line.gone(Identity("t", "a"))                                 # it left (started, or gave up)
    again, memory = recall(memory, left.refused(waiting("a", 65), at(65)), at(65))
    assert again.entries[0].first_refused == at(65)                      # a new create: a new place


def test_P5_the_memory_is_bounded_in_time_after_the_start():
    memory = recalled(published(Line([waiting("a", 0)])), at(60), GRACE)
    late = at(60) + GRACE + timedelta(seconds=1)
    line, memory = recall(memory, Line([waiting("a", 71)]), late)        # refused after the grace
    assert line.entries[0].first_refused == at(71) and memory is NOTHING
    on_time = recalled(published(Line([waiting("a", 0)])), at(60), GRACE)
    line, _ = recall(on_time, Line([waiting("a", 70)]), at(60) + GRACE)  # at the deadline: still
    assert line.entries[0].first_refused == at(0)


def test_P5_only_bare_vmis_of_the_same_namespace_and_name_are_recalled():
    old = Line([waiting("a", 0), waiting("vm", 1, uid="vm-uid")])
    memory = recalled(published(old), at(60), GRACE)
    assert set(memory.since) == {("t", "a")}                             # kind VM: its status says
    line, memory = recall(memory, Line([waiting("a", 61, ns="u"), waiting("b", 61)]), at(61))
    assert {e.identity.key: e.first_refused for e in line} == {("u", "a"): at(61), ("t", "b"): at(61)}
    assert set(memory.since) == {("t", "a")}                             # still there for t/a
    as_vm, memory = recall(memory, Line([waiting("a", 62, uid="vm-uid")]), at(62))
    assert as_vm.entries[0].first_refused == at(62)                      # a VM's VMI of that name: no
    shown = Shown(1, "t", "v", VM_KIND, 100, None, 1, at(0))
    assert recalled({"h100": ClassLine("h100", 1, at(0), (shown,))}, at(60), GRACE) is NOTHING


def test_P5_a_recalled_place_is_never_earlier_than_published_nor_later_than_the_refusal():
    # the summary says a future time (the old leader's clock ahead): the refusal's own time stays
    ahead = ClassLine("h100", 1, at(90), (Shown(1, "t", "a", VMI_KIND, 100, None, 1, at(90)),))
    line, memory = recall(recalled({"h100": ahead}, at(60), GRACE), Line([waiting("a", 61)]), at(61))
    assert line.entries[0].first_refused == at(61) and memory is NOTHING
    # listed in two classes' lines with two times: the later one, never earlier than a summary says
    two = {c: ClassLine(c, 1, t, (Shown(1, "t", "a", VMI_KIND, 100, None, 1, t),))
           for c, t in (("h100", at(3)), ("l40s", at(7)))}
    assert recalled(two, at(60), GRACE).since == {("t", "a"): at(7)}
    line, _ = recall(recalled(two, at(60), GRACE), Line([waiting("a", 61)]), at(61))
    assert line.entries[0].first_refused == at(7)


def test_P5_sets_past_the_published_ones_are_not_recalled_and_nothing_changes_without_a_summary():
    memory = recalled({}, at(60), GRACE)
    assert memory is NOTHING and not memory
    line = Line([waiting("a", 61)])
    assert recall(memory, line, at(61)) == (line, NOTHING)
    same, kept = recall(recalled(published(Line([waiting("z", 0)])), at(60), GRACE), line, at(61))
    assert same is line and set(kept.since) == {("t", "z")}


def test_P5_a_previous_leaders_summary_is_trusted_only_when_its_lease_was_renewed_recently():
    lease = timedelta(seconds=15)
    assert trust_published(at(0), at(20), lease, GRACE)                  # a failover: 15 s + a retry
    assert trust_published(at(0), at(25), lease, GRACE)
    assert not trust_published(at(0), at(26), lease, GRACE)              # every replica was down
    assert not trust_published(None, at(0), lease, GRACE)                # a new Lease: no leader before
    assert trust_published(at(5), at(0), lease, GRACE)                   # its clock ahead of ours


def test_P5_the_recalled_entry_keeps_what_the_refusal_says_but_its_first_refusal():
    memory = recalled(published(Line([waiting("a", 0)])), at(60), GRACE)
    new = replace(waiting("a", 61), retried=False, attempt="review-1")
    line, _ = recall(memory, Line([new]), at(61))
    assert line.entries[0] == replace(new, first_refused=at(0))          # not yet retried: not yet real


NAMES = st.sampled_from(["a", "b", "c", "d", "e"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(published_at=st.dictionaries(NAMES, st.integers(0, 120)),
       waiting_at=st.dictionaries(NAMES, st.tuples(st.integers(0, 120), st.booleans())),
       now=st.integers(0, 200))
def test_P5_property_recall_moves_only_listed_bare_vmis_to_their_published_time(published_at, waiting_at, now):
    """Whatever the summary and the line: a listed bare VMI's first refusal becomes
    min(published, its own), every other entry is unchanged, each name is used once, and
    past the deadline nothing changes."""
    start = 60
    lines = {"h100": ClassLine("h100", max(1, len(published_at)), at(0), tuple(
        Shown(i, "t", n, VMI_KIND, 100, None, 1, at(t)) for i, (n, t) in enumerate(sorted(published_at.items()), 1)))}
    memory = recalled(lines if published_at else {}, at(start), GRACE)
    line = Line(waiting(n, t, uid="u" if vm else None) for n, (t, vm) in waiting_at.items())
    got, left = recall(memory, line, at(now))
    assert len(got) == len(line)
    for e in line:
        g = got.find(e.identity)
        assert g is not None and g.identity == e.identity and g.last_seen == e.last_seen
        p = published_at.get(e.identity.vmi)
        if p is not None and e.identity.vm_uid is None and at(now) <= at(start) + GRACE:
            assert g.first_refused == min(at(p), e.first_refused)
            assert e.identity.key not in left.since
        else:
            assert g.first_refused == e.first_refused
    if at(now) > at(start) + GRACE:
        assert left is NOTHING and got is line
