"""The waiting line as the API shows it (`model.line_status`, docs/contract.md §3c P5): each
class's summary (length, oldest wait, the first `SHOWN` sets with positions and
reservations), its `status.line` shape and back, and what explain reads from it (the place,
the sets ahead, a set further back than the summary lists)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from model.line import Identity, Line, Shape, entry
from model.line_status import (SHOWN, VM_KIND, VMI_KIND, Beyond, ClassLine, line_to_status,
                               parse_line_status, place_in, summarize)
from model.priority import Priority

T0 = datetime(2026, 12, 4, 10, tzinfo=timezone.utc)
ON_DEMAND = Priority(1000, class_name="on-demand")
SPOT = Priority(0, class_name="spot")


def waiting(vmi: str, n: int = 1, cls: str = "h100", *, at: int = 0, priority: Priority = SPOT,
            uid: str | None = None, held=()):
    return entry(Identity("t", vmi, uid), Shape(tuple(held), ((cls, n),) if n else ()), priority,
                 T0 + timedelta(minutes=at))


def test_P5_a_summary_per_class_in_line_order_with_positions_gpus_kinds_and_reservations():
    line = Line([waiting("spot-1", 1, at=0), waiting("big", 8, at=5, priority=ON_DEMAND, uid="vm-uid"),
                 waiting("both", 1, "l40s", at=1, held=(("kept-0", "h100"),))])
    got = summarize(line, {Identity("t", "big", "vm-uid"): "n3"})
    assert sorted(got) == ["h100", "l40s"]
    h = got["h100"]
    assert (h.length, h.oldest) == (3, T0)                        # the oldest is not the head
    assert [(s.position, s.name, s.kind, s.priority, s.gpus, s.reserved) for s in h.shown] == [
        (1, "big", VM_KIND, 1000, 8, "n3"), (2, "spot-1", VMI_KIND, 0, 1, None),
        (3, "both", VMI_KIND, 0, 2, None)]
    assert [(s.position, s.name) for s in got["l40s"].shown] == [(1, "both")]
    assert summarize(Line()) == {}


def test_P5_the_summary_lists_at_most_SHOWN_sets_and_counts_them_all():
    line = Line([waiting(f"vm-{i:02}", at=i) for i in range(SHOWN + 5)])
    (h,) = summarize(line).values()
    assert h.length == SHOWN + 5 and len(h.shown) == SHOWN
    assert h.shown[-1].position == SHOWN


def test_P5_status_line_round_trips_and_a_malformed_one_reads_as_none():
    line = Line([waiting("a", 2, at=0, priority=ON_DEMAND), waiting("b", 1, at=1, uid="u")])
    (h,) = summarize(line, {Identity("t", "a"): "n1"}).values()
    raw = line_to_status(h)
    assert raw == {"length": 2, "oldestSince": "2026-12-04T10:00:00Z", "entries": [
        {"position": 1, "namespace": "t", "name": "a", "kind": VMI_KIND, "priority": 1000, "gpus": 2,
         "since": "2026-12-04T10:00:00Z", "priorityClassName": "on-demand", "reservedNode": "n1"},
        {"position": 2, "namespace": "t", "name": "b", "kind": VM_KIND, "priority": 0, "gpus": 1,
         "since": "2026-12-04T10:01:00Z", "priorityClassName": "spot"}]}
    assert parse_line_status("h100", raw) == h
    for bad in (None, "x", {}, {"length": 0, "oldestSince": "2026-12-04T10:00:00Z"},
                {"length": 2, "oldestSince": "yesterday"}, {"length": "2"}):
        assert parse_line_status("h100", bad) is None
    half = dict(raw, entries=[{"position": "1"}, raw["entries"][1]])
    assert [s.name for s in parse_line_status("h100", half).shown] == ["b"]


def test_P5_explain_reads_the_place_and_the_sets_ahead_from_the_published_lines():
    line = Line([waiting("big", 8, at=5, priority=ON_DEMAND), waiting("s1", 1, at=0),
                 waiting("me", 1, at=2), waiting("other", 1, "l40s", at=0)])
    lines = summarize(line, {Identity("t", "me"): "n2"})
    got = place_in(lines, "t", "me", ("h100", "l40s", "a100"))
    assert got.place is not None and got.place.reserved == "n2"
    (h,) = got.place.lines
    assert (h.class_name, h.position, h.length, [w.vmi for w in h.ahead], h.more) == (
        "h100", 3, 3, ["big", "s1"], 0)
    assert got.beyond == (Beyond("l40s", 1, 1),) and got.empty == ("a100",)
    assert "position 3 of 3 in the line of class h100, behind t/big (priority 1000 on-demand" in \
        got.place.render()


def test_P5_a_set_further_back_than_the_summary_lists_is_said_so_with_the_length():
    line = Line([waiting(f"vm-{i:02}", at=i) for i in range(SHOWN + 3)])
    got = place_in(summarize(line), "t", f"vm-{SHOWN + 1:02}", ("h100",))
    assert got.place is None
    assert got.beyond == (Beyond("h100", SHOWN + 3, SHOWN),)
    assert got.beyond[0].render().startswith(f"not among the first {SHOWN} of the {SHOWN + 3} sets "
                                             "waiting in the line of class h100")
    assert place_in({}, "t", "x", ("h100",)).empty == ("h100",)


def test_P5_explain_names_at_most_MAX_AHEAD_SHOWN_sets_ahead_and_counts_the_rest():
    from model.line import MAX_AHEAD_SHOWN
    line = Line([waiting(f"vm-{i:02}", at=i) for i in range(15)])
    got = place_in(summarize(line), "t", "vm-14", ("h100",))
    (h,) = got.place.lines
    assert (h.position, len(h.ahead), h.more) == (15, MAX_AHEAD_SHOWN, 14 - MAX_AHEAD_SHOWN)
    assert isinstance(summarize(line)["h100"], ClassLine)
