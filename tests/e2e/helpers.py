"""Small helpers for e2e tests: bounded polling, a pool of capacity of its own per test, and
writing bind requests as the webhook would (attachedTo + bindRequest), through the API
server."""

from __future__ import annotations

import time
from typing import Awaitable, Callable, TypeVar

import anyio

from tests import timing

T = TypeVar("T")
WEBHOOK_MANAGER = "gpu-binder-webhook"


async def eventually(probe: Callable[[], Awaitable[T]], *, timeout: float = 20.0,
                     interval: float = 0.2, what: str = "condition") -> T:
    """`tests.timing.eventually` with the e2e defaults (a real API server on wall time:
    20 s, polled every 0.2 s): the first truthy value of `probe()`; AssertionError with the
    last value seen after `timeout` seconds."""
    return await timing.eventually(probe, timeout, what, interval)


async def make_pool(fleet, nodes: dict[str, int], *, resource: str | None = None,
                    budget: int | None = None, devices: int = 0, prefix: str = "gpu",
                    on_cordon: str = "Move", settle: float = 0.0, user: str | None = None):
    """A pool no other test shares: a class of its own resource name (`resource`, else a
    fresh one), nodes advertising it (`nodes`: short name -> units), a tenant (with
    `budget` of that resource when given, and `user` bound to its roles when given), and
    `devices` held devices named `<prefix>-<i>`; then waits `settle` seconds for the
    informers to see them. Returns (resource, class, {short: node name}, tenant, device
    names)."""
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
    if settle:
        await anyio.sleep(settle)
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
