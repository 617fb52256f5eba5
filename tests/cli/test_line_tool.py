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
