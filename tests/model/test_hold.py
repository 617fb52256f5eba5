"""model.hold: the one Hold and the landed rule (B3: counting reservations in flight)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import event, given, settings
from hypothesis import strategies as st

from model.hold import Hold, hold_for, outstanding
from model.types import BindRequest, DeviceStatus, GPUDevice, Phase

H, L = "nvidia.com/H100", "nvidia.com/L40S"
NS = "t"
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def dev(name: str, node: str | None = None, request: str | None = "r1") -> GPUDevice:
    br = BindRequest(request, "vm", (name,), T0) if request else None
    status = DeviceStatus(Phase.BOUND, node, T0, None, br) if node else DeviceStatus(bind_request=br)
    return GPUDevice(NS, name, "h100", None, status)


def lookup(*devices: GPUDevice):
    by_key = {d.key: d for d in devices}
    return by_key.get


def test_B3_landed_rule_bound_here_or_gone_counts_nothing_pending_takes_budget_move_does_not() -> None:
    landing = (((NS, "here"), H), ((NS, "gone"), H), ((NS, "new"), H), ((NS, "moved"), L))
    view = lookup(dev("here", "n1"), dev("new"), dev("moved", "n2"))
    left = outstanding(Hold("r1", NS, "n1", landing=landing), view)
    assert (left.request_id, left.namespace, left.node, left.landing) == ("r1", NS, "n1", landing)
    assert left.needs == ((H, 1), (L, 1))
    assert left.budget_needs == ((H, 1),)  # the move of a Bound device takes no budget slot
    assert not left.empty


def test_B3_hold_without_landing_counts_as_given() -> None:
    h = Hold("r1", NS, "n1", ((H, 2),), ((H, 1),))
    assert outstanding(h, lookup()) is h


def test_B3_after_the_writes_stopped_only_attempted_members_still_carrying_the_request_count() -> None:
    landing = (((NS, "a"), H), ((NS, "b"), H), ((NS, "c"), H))
    view = lookup(dev("a"), dev("b"), dev("c", request="other"))
    h = Hold("r1", NS, "n1", landing=landing)
    assert outstanding(h, view).needs == ((H, 3),)
    left = outstanding(h, view, attempted={(NS, "a"), (NS, "c")})
    assert left.needs == ((H, 1),) and left.budget_needs == ((H, 1),)  # a only: c was withdrawn


def test_B3_hold_for_counts_from_the_landing() -> None:
    landing = (((NS, "a"), H), ((NS, "b"), H))
    h = hold_for("r1", NS, "n1", landing, lookup(dev("a"), dev("b", "n1")))
    assert h.needs == ((H, 1),) and h.budget_needs == ((H, 1),)
    assert Hold("r1", NS, "n1").empty and Hold("r1", NS, "n1", ((H, 0),)).empty


_state = st.sampled_from(["pending", "here", "elsewhere", "gone", "withdrawn"])


@settings(max_examples=300, deadline=None)
@given(states=st.lists(st.tuples(_state, st.sampled_from([H, L]), st.booleans()), min_size=1, max_size=8),
       finished=st.booleans())
def test_B3_outstanding_counts_exactly_the_members_not_landed(states, finished) -> None:
    """Against a direct count: units = members not Bound here and not gone (and, when
    finished, attempted and still carrying the request); budget = the Pending ones among
    them; applying it twice changes nothing; landing one more member never adds."""
    devices, landing, attempted = [], [], set()
    for i, (state, res, tried) in enumerate(states):
        name = f"d{i}"
        landing.append(((NS, name), res))
        if tried:
            attempted.add((NS, name))
        if state == "gone":
            continue
        devices.append(dev(name, {"here": "n1", "elsewhere": "n2"}.get(state),
                           request="other" if state == "withdrawn" else "r1"))
    view = lookup(*devices)
    h = Hold("r1", NS, "n1", landing=tuple(landing))
    left = outstanding(h, view, attempted=attempted if finished else None)
    want: dict[str, int] = {}
    budget: dict[str, int] = {}
    for i, (state, res, tried) in enumerate(states):
        counts = state in ("pending", "elsewhere") or (state == "withdrawn" and not finished)
        if counts and (tried or not finished):
            want[res] = want.get(res, 0) + 1
            if state != "elsewhere":
                budget[res] = budget.get(res, 0) + 1
    assert dict(left.needs) == want and dict(left.budget_needs) == budget
    assert outstanding(left, view, attempted=attempted if finished else None) == left
    landed = [d for d in devices if d.bound_node != "n1"][:1]
    event(f"a member left to land: {bool(landed)}")
    if landed:
        moved = dev(landed[0].name, "n1", landed[0].status.bind_request.id)
        after = outstanding(h, lookup(*[moved if d.key == moved.key else d for d in devices]),
                            attempted=attempted if finished else None)
        assert all(n <= want.get(r, 0) for r, n in after.needs)
