"""explain's P5 line (`cli.tools.line_lines`): the waiting line is the leader's, in its memory,
so the CLI says which lines a create refused for room would wait in and where the leader
says the position; a line given to `model.explain.explain` is shown as its place."""

from __future__ import annotations

from datetime import timedelta

from cli.tools import line_lines, render_explain, waits_in_line
from model.explain import explain
from model.line import Identity, Line, Shape, entry
from model.parse import VMIAsk
from model.priority import Priority
from model.snapshot import Snapshot
from tests.support.world import CLASSES, NOW, NS, dev, node


def _full() -> Snapshot:
    return Snapshot.build(nodes=[node("n1", h=2)], classes=CLASSES,
                          devices=[dev("o1", on="n1", ns="other"), dev("o2", on="n1", ns="other")])


def test_P5_a_set_refused_for_room_is_said_to_wait_in_the_line_of_its_class():
    e = explain(_full(), NS, "vm-2", VMIAsk((), (("h100", 2),)), live_vmis=set(), now=NOW,
                grace=timedelta(minutes=2))
    assert not e.admitted and waits_in_line(e, ("h100",)) == ("h100",)
    lines = line_lines(e, ("h100",))
    assert lines[0] == ("line: refused for room only: a create now waits in the line of class h100 "
                        "(P5; higher priority first, then first refused first)")
    assert "the line is the leader's, in its memory" in lines[1]
    assert lines[0] in render_explain(e, classes=("h100",)).splitlines()


def test_P5_no_line_for_an_admitted_set_or_a_refusal_room_would_not_cure():
    snap = Snapshot.build(nodes=[node("n1", h=2)], classes=CLASSES)
    admitted = explain(snap, NS, "vm-1", VMIAsk((), (("h100", 1),)), live_vmis=set(), now=NOW,
                       grace=timedelta(minutes=2))
    assert admitted.admitted and line_lines(admitted, ("h100",)) == []
    too_big = explain(snap, NS, "vm-9", VMIAsk((), (("h100", 9),)), live_vmis=set(), now=NOW,
                      grace=timedelta(minutes=2))
    assert not too_big.admitted and line_lines(too_big, ("h100",)) == []  # no node has 9


def test_P5_a_line_given_to_explain_shows_the_place_in_it():
    ahead = entry(Identity("t9", "big"), Shape((), (("h100", 2),)), Priority(1000, class_name="on-demand"),
                  NOW)
    me = entry(Identity(NS, "vm-2"), Shape((), (("h100", 2),)), Priority(), NOW + timedelta(seconds=5))
    e = explain(_full(), NS, "vm-2", VMIAsk((), (("h100", 2),)), live_vmis=set(), now=NOW,
                grace=timedelta(minutes=2), line=Line([ahead, me]))
    (text,) = line_lines(e)
    assert text.startswith("line: ") and "position 2 of 2 in the line of class h100, behind t9/big" in text


# --- the line as the leader publishes it (GPUClass status.line, model.line_status) ------------

def _published(*entries):
    from model.line_status import line_to_status, summarize
    return [{"metadata": {"name": c}, "status": {"line": line_to_status(s)}}
            for c, s in summarize(Line(entries)).items()]


def test_P5_explain_gives_the_place_and_the_sets_ahead_from_the_published_line():
    import dataclasses

    from cli.tools import published_lines
    from model.line_status import place_in
    ahead = entry(Identity("t9", "big"), Shape((), (("h100", 2),)), Priority(1000, class_name="on-demand"),
                  NOW)
    me = entry(Identity(NS, "vm-2", "vm-uid"), Shape((), (("h100", 2),)), Priority(), NOW + timedelta(seconds=5))
    lines = published_lines([{"metadata": {"name": "l40s"}}, *_published(ahead, me)])
    assert sorted(lines) == ["h100"]
    e = explain(_full(), NS, "vm-2", VMIAsk((), (("h100", 2),)), live_vmis=set(), now=NOW,
                grace=timedelta(minutes=2))
    published = place_in(lines, NS, "vm-2", ("h100",))
    e = dataclasses.replace(e, line=published.place)
    text = render_explain(e, classes=("h100",), published=published).splitlines()
    (line,) = [x for x in text if x.startswith("line: ")]
    assert "waits for room: position 2 of 2 in the line of class h100, behind t9/big (priority 1000" in line


def test_P5_explain_of_a_set_beyond_the_published_entries_says_so_with_the_length():
    from cli.tools import published_lines
    from model.line_status import SHOWN, place_in
    many = [entry(Identity("t9", f"vm-{i:02}"), Shape((), (("h100", 2),)), Priority(), NOW + timedelta(seconds=i))
            for i in range(SHOWN + 4)]
    lines = published_lines(_published(*many))
    e = explain(_full(), NS, "vm-late", VMIAsk((), (("h100", 2),)), live_vmis=set(), now=NOW,
                grace=timedelta(minutes=2))
    got = line_lines(e, ("h100",), place_in(lines, NS, "vm-late", ("h100",)))
    assert got[0].startswith("line: refused for room only")
    assert got[1] == (f"  not among the first {SHOWN} of the {SHOWN + 4} sets waiting in the line of class "
                      f"h100 (the status lists the first {SHOWN}): further back, or not waiting")
    few = published_lines(_published(*many[:3]))
    assert line_lines(e, ("h100",), place_in(few, NS, "vm-late", ("h100",)))[1] == (
        "  the line of class h100: 3 waiting (GPUClass status.line), this set not among them")


def test_P5_top_shows_each_class_line_head_first_with_its_length():
    from cli.tools import published_lines, render_top, to_jsonable
    from model.explain import top
    big = entry(Identity("t9", "big", "uid"), Shape((), (("h100", 8),)), Priority(1000, class_name="on-demand"),
                NOW + timedelta(minutes=1))
    small = entry(Identity("t1", "small"), Shape((), (("h100", 1),)), Priority(), NOW)
    lines = published_lines(_published(small, big))
    text = render_top(top(_full(), set()), lines).splitlines()
    i = next(n for n, x in enumerate(text) if x.startswith("LINE "))
    assert text[i].split() == ["LINE", "POS", "SET", "KIND", "PRIORITY", "GPUS", "WAITING", "SINCE", "RESERVED"]
    assert text[i + 1].split() == ["h100", "1", "t9/big", "VM", "1000", "on-demand", "8", "2026-01-02T03:05:05Z"]
    assert text[i + 2].split() == ["h100", "2", "t1/small", "VMI", "0", "1", "2026-01-02T03:04:05Z"]
    assert "LINE h100: 2 waiting, the longest since 2026-01-02T03:04:05Z" in text
    assert "LINE" not in render_top(top(_full(), set()))
    assert to_jsonable(lines["h100"])["length"] == 2
