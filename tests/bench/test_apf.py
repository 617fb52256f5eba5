"""The VMI-create level's seats (bench/apf.py), shared by `bench floor` and `bench fairness`:
the seats kube-apiserver gives a level for its shares, the shares read from a list of
PriorityLevelConfigurations as the server holds them, and the level's flow-control figures
between two readings of its /metrics, on real values; the thin API part (and bench
fairness's seat counts, the shipped shares restored after them) against a fake API server."""

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


class FakeServer:
    """kube-apiserver as the benchmarks' clients see it: a CustomObjectsApi
    (`list_cluster_custom_object`, `patch_cluster_custom_object`) over the levels of
    `levels()`, and an admin ApiClient (`call_api("/metrics")`) whose
    apiserver_flowcontrol_nominal_limit_seats follows our level's shares at once."""

    def __init__(self) -> None:
        self.items = levels()
        self.patches: list[dict] = []

    async def list_cluster_custom_object(self, group, version, plural):
        assert (group, version, plural) == (*apf.FLOWCONTROL, apf.LEVELS)
        return {"items": self.items}

    async def patch_cluster_custom_object(self, group, version, plural, name, body,
                                          _content_type=None):
        assert (name, _content_type) == (apf.APF, apf.MERGE)
        self.patches.append(body)
        ours = next(i for i in self.items if i["metadata"]["name"] == name)
        ours["spec"]["limited"].update(body["spec"]["limited"])
        return ours

    async def call_api(self, path, method, auth_settings=None, _preload_content=True):
        assert (path, method) == ("/metrics", "GET")
        ours, others = apf.level_shares(self.items)
        text = ("# TYPE apiserver_flowcontrol_nominal_limit_seats gauge\n"
                f'apiserver_flowcontrol_nominal_limit_seats{{priority_level="{apf.APF}"}} '
                f"{apf.seats_given(ours, others)}\n"
                'apiserver_flowcontrol_nominal_limit_seats{priority_level="exempt"} 0\n'
                "# TYPE process_open_fds gauge\nprocess_open_fds 50\n")

        class Resp:
            async def read(self) -> bytes:
                return text.encode()

            def release(self) -> None:
                pass
        return Resp()


@pytest.mark.anyio
async def test_set_shares_patches_the_level_and_says_the_seats_the_server_then_gives():
    server = FakeServer()
    assert await apf.plc_shares(server) == (2, 245)
    assert await apf.set_shares(server, server, 11, 245) == 26
    assert server.patches == [{"spec": {"limited": {"nominalConcurrencyShares": 11}}}]
    assert await apf.plc_shares(server) == (11, 245)
    assert fr.seats_of(apf.APF, await apf.flow_samples(server)) == 26
    assert await apf.set_shares(server, server, 2, 245) == 5


@pytest.mark.anyio
async def test_bench_fairness_restores_the_shipped_shares_after_its_seat_counts(monkeypatch):
    from bench import fairness

    server = FakeServer()
    seen: list[tuple[str, str, int]] = []

    async def b_and_a(lc, workdir, a_ns, b_ns, uids, flow=None, tag=""):
        got = fr.seats_of(apf.APF, await flow())
        seen.append((a_ns, b_ns, got))
        if got == 26:
            raise RuntimeError("tenant A's process said 'x', not 'ready'")
        return {"b_alone": {}, "apf_level_alone": None}
    monkeypatch.setattr(fairness, "_b_and_a", b_and_a)
    report: dict = {}
    got = await fairness._at_seats(None, None, server, server, (5, 12), {}, report)
    assert got == [{"seats_target": 5, "shares": 2, "seats": 5, "b_alone": {},
                    "apf_level_alone": None},
                   {"seats_target": 12, "shares": 5, "seats": 12, "b_alone": {},
                    "apf_level_alone": None}]
    assert seen == [("tenant-a-s5", "tenant-b-s5", 5), ("tenant-a-s12", "tenant-b-s12", 12)]
    assert report == {"shares_restored": {"shares": 2, "seats": 5}}
    with pytest.raises(RuntimeError):                     # a seat count that fails ...
        await fairness._at_seats(None, None, server, server, (25,), {}, report)
    assert report == {"shares_restored": {"shares": 2, "seats": 5}}  # ... restores them too
    assert await apf.plc_shares(server) == (2, 245)
