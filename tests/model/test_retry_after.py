"""The preemptor's Retry-After from its victims' grace (docs/contract.md §3c P4, "The answer";
model/retry_after.py): the slowest victim still there, KubeVirt's default 30 s for an unset
grace, what is left of a grace once the deletion started, at least one round, at most
`RETRY_STEP` (the preemptor asks again soon after its room frees), never past the nomination's remaining life; another incarnation of a
victim's name, or a victim gone, waits for nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from model.nomination import Nomination, Victim
from model.retry_after import (KUBEVIRT_DEFAULT_GRACE, RETRY_STEP, ROUND, VictimWait,
                               preemptor_retry_after, victim_wait)
from model.serialize import format_time

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
A = Victim("t", "a", "adm-a", "uid-a", 100, NOW - timedelta(hours=1))
B = Victim("t", "b", None, None, 0, NOW - timedelta(hours=2))


def nomination(*victims: Victim, ttl: float = 600, retry: int = 30) -> Nomination:
    return Nomination("p", "vm-9", 1000, "n1", (("nvidia.com/H100", 4),), (), tuple(victims),
                      NOW, NOW + timedelta(seconds=ttl), retry)


def vmi(name: str, uid: str, admission: str | None = None, grace: object = None,
        deleting: datetime | str | None = None) -> dict:
    meta: dict = {"name": name, "namespace": "t", "uid": uid}
    if admission is not None:
        meta["annotations"] = {"gpu.cozystack.io/admission": admission}
    if deleting is not None:
        meta["deletionTimestamp"] = deleting if isinstance(deleting, str) else format_time(deleting)
    spec = {} if grace is None else {"terminationGracePeriodSeconds": grace}
    return {"metadata": meta, "spec": spec}


def lookup(*objs: dict):
    by = {("t", o["metadata"]["name"]): o for o in objs}
    return lambda ns, name: by.get((ns, name))


def test_an_unset_grace_is_kubevirts_default_30_s():
    assert KUBEVIRT_DEFAULT_GRACE == 30
    assert victim_wait(A, vmi("a", "uid-a", "adm-a")).left(NOW) == 30
    # a 30 s bound: the answer is the step, the preemptor asks again while the victim stops
    assert preemptor_retry_after(nomination(A), NOW, lookup(vmi("a", "uid-a", "adm-a"))) == RETRY_STEP == 5


def test_the_slowest_victim_still_there_sets_the_wait_up_to_the_step():
    short = lookup(vmi("a", "uid-a", "adm-a", grace=3), vmi("b", "uid-b", grace=4))
    assert preemptor_retry_after(nomination(A, B), NOW, short) == 4
    long = lookup(vmi("a", "uid-a", "adm-a", grace=45), vmi("b", "uid-b", grace=90))
    assert preemptor_retry_after(nomination(A, B), NOW, long) == RETRY_STEP


def test_a_victim_being_deleted_waits_what_is_left_of_its_grace():
    since = NOW - timedelta(seconds=77)
    assert victim_wait(A, vmi("a", "uid-a", "adm-a", grace=80, deleting=since)).left(NOW) == 3
    assert preemptor_retry_after(nomination(A), NOW,
                                 lookup(vmi("a", "uid-a", "adm-a", grace=80, deleting=since))) == 3
    # past its grace (a finalizer holds it): the floor, one round
    late = NOW - timedelta(seconds=500)
    assert preemptor_retry_after(nomination(A), NOW,
                                 lookup(vmi("a", "uid-a", "adm-a", grace=80, deleting=late))) == ROUND


def test_victims_gone_or_recreated_wait_for_nothing_but_one_round():
    assert preemptor_retry_after(nomination(A, B), NOW, lookup()) == ROUND
    # another uid, another admission: another incarnation of the name, not the victim
    other = lookup(vmi("a", "uid-a2", "adm-a", grace=120), vmi("x", "uid-x", grace=120))
    assert preemptor_retry_after(nomination(A), NOW, other) == ROUND
    assert preemptor_retry_after(nomination(A), NOW, lookup(vmi("a", "uid-a", "adm-a2", grace=120))) == ROUND


def test_capped_and_never_past_the_nominations_life():
    long = lookup(vmi("a", "uid-a", "adm-a", grace=3600))
    assert preemptor_retry_after(nomination(A, ttl=7200), NOW, long) == RETRY_STEP
    # 3.2 s left: rounded up; expired: 1 s (the next answer is not a nomination's)
    assert preemptor_retry_after(nomination(A, ttl=120), NOW + timedelta(seconds=116.8), long) == 4
    assert preemptor_retry_after(nomination(A, ttl=120), NOW + timedelta(seconds=500), long) == 1
    assert preemptor_retry_after(nomination(A, ttl=2), NOW, lookup()) == 2


def test_a_nomination_without_victims_answers_its_recorded_retry_after():
    assert preemptor_retry_after(nomination(retry=3), NOW, lookup()) == 3
    assert preemptor_retry_after(nomination(retry=12), NOW, lookup()) == RETRY_STEP
    assert preemptor_retry_after(nomination(retry=12, ttl=2), NOW, lookup()) == 2


@pytest.mark.parametrize("grace", [-1, "30", 2.5, True])
def test_a_grace_that_is_no_whole_number_of_seconds_is_the_default(grace):
    assert victim_wait(A, vmi("a", "uid-a", "adm-a", grace=grace)) == VictimWait(None, None)


def test_victim_wait_reads_the_cached_vmi():
    since = NOW - timedelta(seconds=5)
    assert victim_wait(A, None) is None
    assert victim_wait(A, vmi("a", "uid-a", "adm-a", grace=0, deleting=since)) == VictimWait(0, since)
    assert victim_wait(B, vmi("b", "anything", grace=7)) == VictimWait(7, None)  # nothing recorded: by name
    # a deletionTimestamp that does not parse: being deleted since long ago (no wait left)
    bad = victim_wait(B, vmi("b", "u", grace=60, deleting="yesterday"))
    assert bad is not None and bad.left(NOW) == 0.0
    assert VictimWait(60, None).left(NOW) == 60.0 and VictimWait(None, None).left(NOW) == 30.0
    assert replace(VictimWait(60, since)).left(NOW) == 55.0
