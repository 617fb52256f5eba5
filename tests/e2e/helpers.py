"""Small helpers for e2e tests: bounded polling, named conditions on the controller replicas
(their informers have applied a write; the leader is idle; housekeeping rounds have passed:
read from their /metrics), a pool of capacity of its own per test, and writing bind requests
as the webhook would (attachedTo + bindRequest), through the API server."""

from __future__ import annotations

import time
from typing import Awaitable, Callable, Mapping, TypeVar

import anyio

from model.types import GROUP, VERSION
from tests import timing

T = TypeVar("T")
WEBHOOK_MANAGER = "gpu-binder-webhook"


def until_sync(fn: Callable[[], T], timeout: float = 20.0) -> T:
    """The first truthy value of the blocking probe `fn()` within `timeout` seconds (polled
    every 0.3 s), else its last value: for kubectl-driven checks of policies, whose params
    reach the API server's admission informers after a moment."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


async def eventually(probe: Callable[[], Awaitable[T]], *, timeout: float = 20.0,
                     interval: float = 0.2, what: str = "condition") -> T:
    """`tests.timing.eventually` with the e2e defaults (a real API server on wall time:
    20 s, polled every 0.2 s): the first truthy value of `probe()`; AssertionError with the
    last value seen after `timeout` seconds."""
    return await timing.eventually(probe, timeout, what, interval)


# -- named conditions on the replicas (from their /metrics) -------------------------------


async def scrape(system, i: int) -> dict[tuple[str, tuple], float]:
    """Replica `i`'s metrics as {(sample name, sorted label items): value}."""
    from localcluster.metrics_text import parse_metrics

    return parse_metrics(await anyio.to_thread.run_sync(system.metrics, i))


def _running(system) -> list[int]:
    return [i for i, r in enumerate(system.replicas) if r.alive]


async def replicas_saw(system, marks: Mapping[str, str | int], *, timeout: float = 20.0,
                       what: str = "the write") -> None:
    """Wait until every running replica's informers have applied the resourceVersions of
    `marks` (informer name, e.g. "gpudevices", -> the resourceVersion of a write to that
    kind, or any later one): the writes are in their caches and their listeners (the
    binder's view, housekeeping's triggers) have been told. AssertionError after `timeout`."""
    want = {name: int(rv) for name, rv in marks.items()}

    async def all_saw() -> bool:
        for i in _running(system):
            got = await scrape(system, i)
            for name, rv in want.items():
                if got.get(("gpu_binder_informer_resource_version", (("informer", name),)),
                           -1) < rv:
                    return False
        return True
    await eventually(all_saw, timeout=timeout, interval=0.05,
                     what=f"every replica's informers saw {what} ({want})")


async def leader_index(system, *, timeout: float = 20.0) -> int:
    """The index of the replica that leads (its gpu_binder_leader is 1)."""
    async def find() -> int | None:
        for i in _running(system):
            if (await scrape(system, i)).get(("gpu_binder_leader", ())) == 1:
                return i + 1  # truthy
        return None
    return await eventually(find, timeout=timeout, interval=0.05, what="a leader") - 1


async def leader_idle(system, *, timeout: float = 20.0) -> None:
    """Wait until the leader's binder has nothing to do: no message queued in any actor, no
    request or reservation in flight."""
    async def idle() -> bool:
        got = await scrape(system, await leader_index(system))
        return all(got.get((name, ())) == 0 for name in (
            "gpu_binder_mailbox_depth", "gpu_binder_requests_in_flight",
            "gpu_binder_reservations_in_flight"))
    await eventually(idle, timeout=timeout, interval=0.05, what="the leader's binder idle")


async def quiet_after(system, marks: Mapping[str, str | int], *, what: str = "the write") -> None:
    """The negative-check barrier: every replica has applied `marks` (see `replicas_saw`)
    and then the leader's binder is idle, so whatever it would do about those writes is
    done; assert "nothing changed" after this."""
    await replicas_saw(system, marks, what=what)
    await leader_idle(system)


async def counter_total(system, name: str) -> float:
    """Counter `name` (a sample without labels, e.g. "gpu_binder_defrag_moves_total")
    summed over the running replicas: what the replicas did since they started, whichever
    led. A test reads it before and after its own action and checks the difference, not
    the total, which earlier tests on the same replicas may have filled."""
    total = 0.0
    for i in _running(system):
        total += (await scrape(system, i)).get((name, ()), 0.0)
    return total


async def housekeeping_rounds(system, n: int = 2, *, timeout: float = 30.0) -> None:
    """Wait until the leader has completed `n` more housekeeping rounds than now (H1-H3):
    with n >= 2, at least one whole round began after this call."""
    async def rounds() -> tuple[int, float]:
        i = await leader_index(system)
        return i, (await scrape(system, i)).get(("gpu_binder_housekeeping_rounds_total", ()), 0)
    leader, start = await rounds()

    async def passed() -> bool:
        i, now = await rounds()
        return i != leader or now >= start + n  # a new leader starts its own rounds afresh
    await eventually(passed, timeout=timeout, interval=0.1,
                     what=f"{n} housekeeping rounds after round {start:.0f}")


async def node_rv(fleet, name: str) -> str:
    return (await fleet.core.read_node(name)).metadata.resource_version


async def namespace_rv(fleet, name: str) -> str:
    return (await fleet.core.read_namespace(name)).metadata.resource_version


async def class_rv(fleet, name: str) -> str:
    return (await fleet.custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", name)
            )["metadata"]["resourceVersion"]


async def device_rv(fleet, namespace: str, name: str) -> str:
    return (await fleet.get_device(namespace, name))["metadata"]["resourceVersion"]


async def make_pool(fleet, nodes: dict[str, int], *, resource: str | None = None,
                    budget: int | None = None, devices: int = 0, prefix: str = "gpu",
                    on_cordon: str = "Move", seen_by=None, user: str | None = None):
    """A pool no other test shares: a class of its own resource name (`resource`, else a
    fresh one), nodes advertising it (`nodes`: short name -> units), a tenant (with
    `budget` of that resource when given, and `user` bound to its roles when given), and
    `devices` held devices named `<prefix>-<i>`; with `seen_by` (a LocalCluster), waits
    until every replica's informers have all of it (`replicas_saw`). Returns (resource,
    class, {short: node name}, tenant, device names)."""
    from tests.e2e.conftest import unique

    res = resource or f"{unique('gpu')}.example.com/gpu"
    cls = unique("cls")
    await fleet.gpu_class(cls, res, on_cordon=on_cordon)
    names = {}
    for short, units in nodes.items():
        names[short] = unique(short)
        await fleet.node(names[short], {res: units})
    tenant = unique("t")
    await fleet.tenant(tenant, budgets={res: budget} if budget is not None else None, user=user)
    devs = [f"{prefix}-{i}" for i in range(devices)]
    for d in devs:
        await fleet.device(tenant, d, cls)
    if seen_by is not None:
        marks = {"gpuclasses": await class_rv(fleet, cls),
                 "namespaces": await namespace_rv(fleet, tenant)}
        rvs = [int(await node_rv(fleet, n)) for n in names.values()]
        if rvs:
            marks["nodes"] = max(rvs)
        if budget is not None:
            marks["resourcequotas"] = (await fleet.core.read_namespaced_resource_quota(
                "gpu-budget", tenant)).metadata.resource_version
        if devs:
            marks["gpudevices"] = max([int(await device_rv(fleet, tenant, d)) for d in devs])
        await replicas_saw(seen_by, marks, what=f"the pool of {cls}")
    return res, cls, names, tenant, devs


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


async def request(fleet, namespace: str, request_id: str, vmi: str, devices: list[str],
                  node_selector: dict[str, str] | None = None) -> None:
    """Write attachedTo and one bindRequest on every device (W3 steps 2-3)."""
    # a merge patch merges into an older bindRequest: null the binder's fields explicitly
    br = {"id": request_id, "vmi": vmi, "devices": devices, "requestedAt": stamp(),
          "result": None, "message": None, "node": None, "nodeSelector": None}
    if node_selector:
        br["nodeSelector"] = node_selector
    for d in devices:
        await fleet.set_status(namespace, d, {"attachedTo": {"vmi": vmi, "since": stamp()},
                                              "bindRequest": br}, WEBHOOK_MANAGER)


async def results(fleet, namespace: str, devices: list[str]) -> list[dict]:
    """The devices' statuses once every one has a bindRequest.result, else []."""
    got = [(await fleet.get_device(namespace, d)).get("status") or {} for d in devices]
    if all((s.get("bindRequest") or {}).get("result") for s in got):
        return got
    return []
