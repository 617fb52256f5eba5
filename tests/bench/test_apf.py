"""The VMI-create level's seats (bench/apf.py), shared by `bench floor` and `bench fairness`:
the seats kube-apiserver gives a level for its shares, the shares read from a list of
PriorityLevelConfigurations as the server holds them, and the level's flow-control figures
between two readings of its /metrics; real values, no API server."""

from __future__ import annotations

import pytest

from bench import apf, floor_report as fr

BUILT_IN = {"global-default": 20, "leader-election": 10, "node-high": 40, "system": 30,
            "workload-high": 40, "workload-low": 100, "catch-all": 5}
"""kube-apiserver's built-in Limited levels and their nominalConcurrencyShares: 245."""


def levels(ours: int | None = 2, **extra: dict) -> list[dict]:
    """A PriorityLevelConfiguration list's items: the built-in levels, `exempt`, ours with
    `ours` shares (None: not installed) and `extra` levels by name → spec."""
    items = [{"metadata": {"name": "exempt"}, "spec": {"type": "Exempt", "exempt": {}}}]
    items += [{"metadata": {"name": name},
               "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": shares,
                                                       "lendablePercent": 0}}}
              for name, shares in BUILT_IN.items()]
    if ours is not None:
        items.append({"metadata": {"name": apf.APF},
                      "spec": {"type": "Limited",
                               "limited": {"nominalConcurrencyShares": ours,
                                           "lendablePercent": 0,
                                           "limitResponse": {"type": "Queue"}}}})
    items += [{"metadata": {"name": name}, "spec": spec} for name, spec in extra.items()]
    return items


def test_the_shipped_level_and_the_others_shares_from_the_servers_list():
    assert apf.level_shares(levels()) == (2, 245)
    # a Limited level that does not say has flowcontrol v1's default of 30 shares
    assert apf.level_shares(levels(7, mine={"type": "Limited", "limited": {}})) == (7, 275)
    assert apf.level_shares(levels(None)) == (0, 245)


@pytest.mark.parametrize("target, shares, seats", [(5, 2, 5), (12, 5, 12), (25, 11, 26)])
def test_the_issues_seat_counts_and_what_the_server_then_gives(target, shares, seats):
    # the shipped 2 shares are the 5 seats; 25 cannot be had exactly: the server gives 26
    assert apf.shares_for(target, 245) == shares
    assert apf.seats_given(shares, 245) == seats
    assert apf.seats_given(shares - 1, 245) < target


def test_shares_for_a_level_on_a_server_with_more_seats():
    # --max-requests-inflight 800 + --max-mutating-requests-inflight 400
    assert apf.shares_for(25, 245, limit=1200) == 6
    assert apf.seats_given(6, 245, limit=1200) == 29
    with pytest.raises(ValueError):
        apf.shares_for(1200, 245, limit=1200)


WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"
LABELS = f'flow_schema="{apf.APF}",priority_level="{apf.APF}"'


def flow(dispatched: int, rejected: int, queued: tuple[int, int, int], wait_sum: float) -> str:
    """kube-apiserver's flow-control lines for our level: dispatched, rejected, and the
    dispatched requests' waits as (under 5 ms, under 100 ms, under 1 s) counts."""
    under = [queued[0], queued[0] + queued[1], sum(queued)]
    lines = ["# TYPE apiserver_flowcontrol_dispatched_requests_total counter",
             f"apiserver_flowcontrol_dispatched_requests_total{{{LABELS}}} {dispatched}",
             "# TYPE apiserver_flowcontrol_rejected_requests_total counter",
             f'apiserver_flowcontrol_rejected_requests_total{{{LABELS},reason="time-out"}} '
             f"{rejected}", f"# TYPE {WAIT} histogram"]
    for le, n in zip(("0.005", "0.1", "1.0", "+Inf"), [*under, under[-1]]):
        lines.append(f'{WAIT}_bucket{{execute="true",{LABELS},le="{le}"}} {n}')
    lines += [f'{WAIT}_sum{{execute="true",{LABELS}}} {wait_sum}',
              f'{WAIT}_count{{execute="true",{LABELS}}} {under[-1]}']
    return "\n".join(lines) + "\n"


def test_the_levels_queue_between_two_readings():
    before = fr.samples(flow(50, 0, (50, 0, 0), 0.05))
    # B's 50 creates under A's flood: 290 more dispatched (100 waited under 5 ms, 150 under
    # 100 ms, 40 up to 1 s), 12 rejected
    after = fr.samples(flow(340, 12, (150, 150, 40), 0.05 + 14.5))
    assert apf.level_figures(before, after) == {
        "dispatched": 290, "rejected": 12, "waited_mean_ms": 50.0, "waited_p99_ms": 1000.0}
    assert apf.level_figures(before, before) is None
    assert apf.level_figures(before, after, level="workload-low") is None
