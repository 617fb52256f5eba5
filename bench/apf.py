"""The VMI-create priority level's seats, for the benchmarks that vary them (`bench floor
--seats`, `bench fairness --seats`; issue 40 item 4). The pure part: the seats
kube-apiserver gives a Limited level for its nominalConcurrencyShares, the shares that give
it a number of seats, the levels' shares from a list of PriorityLevelConfigurations and the
level's flow-control figures between two readings. The API part, thin: read the shares, set
ours and wait until the server grants the seats, read its `apiserver_flowcontrol_*` samples."""

from __future__ import annotations

import math

import anyio

from bench import floor_report as fr
from bench.common import apiserver_metrics

APF = "gpu-binder-vmi-creates"
"""The shipped FlowSchema and PriorityLevelConfiguration of VMI creates
(k8s/manifests/flowcontrol/)."""
FLOWCONTROL = ("flowcontrol.apiserver.k8s.io", "v1")
LEVELS = "prioritylevelconfigurations"
SERVER_SEATS = 600
"""kube-apiserver's concurrency limit with its defaults (--max-requests-inflight 400 +
--max-mutating-requests-inflight 200), shared by the Limited priority levels by shares."""
DEFAULT_SHARES = 30
"""A Limited level's nominalConcurrencyShares when its spec leaves it out (flowcontrol v1)."""
MERGE = "application/merge-patch+json"


def seats_given(shares: int, others: int, limit: int = SERVER_SEATS) -> int:
    """The seats kube-apiserver gives a Limited level of `shares` nominalConcurrencyShares
    when every other Limited level's shares sum to `others`: ceil(limit · shares ÷ (others
    + shares))."""
    return math.ceil(limit * shares / (others + shares))


def shares_for(seats: int, others: int, limit: int = SERVER_SEATS) -> int:
    """The smallest nominalConcurrencyShares s (>= 1) giving a level at least `seats`
    seats (`seats_given`), `others` the shares of every other Limited level. Raises
    ValueError when no share count can (seats >= limit)."""
    if seats >= limit:
        raise ValueError(f"{seats} seats: the server has {limit}")
    s = 1
    while seats_given(s, others, limit) < seats:
        s += 1
    return s


def level_shares(items: list[dict], level: str = APF) -> tuple[int, int]:
    """From the items of a PriorityLevelConfiguration list: (`level`'s
    nominalConcurrencyShares, 0 when it is absent or not Limited; the sum over every other
    Limited level, `DEFAULT_SHARES` for one that does not say)."""
    ours, others = 0, 0
    for item in items:
        spec = item.get("spec") or {}
        if spec.get("type") != "Limited":
            continue
        shares = int((spec.get("limited") or {}).get("nominalConcurrencyShares",
                                                       DEFAULT_SHARES))
        if item["metadata"]["name"] == level:
            ours = shares
        else:
            others += shares
    return ours, others


def level_figures(before: fr.Samples, after: fr.Samples, level: str = APF) -> dict | None:
    """`level`'s flow-control figures between two readings of kube-apiserver's samples
    (`fr.apf`: dispatched, rejected, waited_mean_ms and waited_p99_ms of its queue); None
    when it dispatched and rejected nothing meanwhile."""
    return fr.apf(fr.delta(before, after)).get(level)


# -- the API --------------------------------------------------------------------------------

async def plc_shares(custom) -> tuple[int, int]:
    """(our level's nominalConcurrencyShares, the sum over every other Limited level), read
    with `custom` (an admin CustomObjectsApi; raises its ApiException)."""
    got = await custom.list_cluster_custom_object(*FLOWCONTROL, LEVELS)
    return level_shares(got["items"])


async def flow_samples(admin_api) -> fr.Samples:
    """kube-apiserver's `apiserver_flowcontrol_*` samples now, read with `admin_api` (an
    admin ApiClient)."""
    text = await apiserver_metrics(admin_api)
    return fr.samples("\n".join(line for line in text.splitlines()
                                if "apiserver_flowcontrol_" in line) + "\n")


async def set_shares(custom, admin_api, shares: int, others: int,
                     timeout: float = 15.0) -> int | None:
    """Set our level's nominalConcurrencyShares to `shares` (a merge patch with `custom`);
    wait (at most `timeout` s) until kube-apiserver gives it the seats they mean
    (`seats_given`); the seats it then says (apiserver_flowcontrol_nominal_limit_seats;
    None: it does not say; another number when it had not applied them in time)."""
    await custom.patch_cluster_custom_object(
        *FLOWCONTROL, LEVELS, APF,
        {"spec": {"limited": {"nominalConcurrencyShares": shares}}}, _content_type=MERGE)
    want = seats_given(shares, others)
    seats = None
    with anyio.move_on_after(timeout):
        while seats != want:
            seats = fr.seats_of(APF, await flow_samples(admin_api))
            if seats != want:
                await anyio.sleep(0.2)  # the API server's config controller applies it
    return seats


class SeatCounts:
    """The level's seats varied for a benchmark and put back: `async with SeatCounts(custom,
    admin_api) as level:` reads the shipped shares (`plc_shares`), `await level.seats(n)`
    sets the shares that give about `n` seats (`shares_for`, `set_shares`) and returns
    (shares, the seats the server then says); on leaving, even by an exception, the shipped
    shares are set again and `restored` is (shares, the seats the server then says).
    `custom` an admin CustomObjectsApi, `admin_api` an admin ApiClient."""

    def __init__(self, custom, admin_api) -> None:
        self.custom, self.admin_api = custom, admin_api
        self.original = self.others = 0
        self.restored: tuple[int, int | None] | None = None

    async def __aenter__(self) -> "SeatCounts":
        self.original, self.others = await plc_shares(self.custom)
        return self

    async def seats(self, target: int) -> tuple[int, int | None]:
        shares = shares_for(target, self.others)
        return shares, await set_shares(self.custom, self.admin_api, shares, self.others)

    async def __aexit__(self, *exc: object) -> None:
        self.restored = (self.original, await set_shares(self.custom, self.admin_api,
                                                         self.original, self.others))
