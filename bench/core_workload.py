"""`bench core`'s workload: the fleet (`Fleet`, `build_store`), the seeded request stream
(`Ask`, `request_stream`), a request's names (`request_names`) and which template devices an
answer lets go (`Lifecycle`). Pure but for filling an in-memory store."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone

from fakes.memory_store import MemoryStore
from model.types import OnCordon

GPUS = 8
TENANTS = 50
H100, L40S = "nvidia.com/H100", "nvidia.com/L40S"
CLASSES = {"h100": (H100, OnCordon.MOVE), "h100-stay": (H100, OnCordon.STAY), "l40s": (L40S, OnCordon.MOVE)}
CLASS_WEIGHTS = (("h100", 4), ("h100-stay", 1), ("l40s", 5))
ZONES = ("z0", "z1", "z2")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class Fleet:
    """`nodes` × `gpus`; `fill` = share of GPUs Bound to held devices at the start;
    `pending` more held devices left Pending; `running` = share of GPUs the template
    devices of running VMs may take before the oldest VMs stop."""

    nodes: int
    gpus: int = GPUS
    fill: float = 0.4
    pending: int = 0
    running: float = 0.3

    @property
    def capacity(self) -> int:
        """GPUs in the fleet."""
        return self.nodes * self.gpus


@dataclass(frozen=True, slots=True)
class Ask:
    """One request of the stream: tenant, class, set size, nodeSelector (frozen pairs)."""

    tenant: str
    class_name: str
    size: int
    selector: tuple[tuple[str, str], ...] = ()


def build_store(fleet: Fleet, seed: int) -> MemoryStore:
    """The fleet in a MemoryStore: nodes, classes, tenants with budgets, and held devices
    (`fill` of the GPUs Bound, on random nodes with room; `pending` more Pending)."""
    rng = random.Random(seed)
    store = MemoryStore(seed=seed, keep_history=False)  # a record per write: not the system's
    for name, (res, on_cordon) in CLASSES.items():
        store.add_class(name, res, on_cordon=on_cordon)
    names = [f"node-{i:05d}" for i in range(fleet.nodes)]
    res_of = {}
    for i, name in enumerate(names):
        res_of[name] = H100 if i % 2 == 0 else L40S
        store.add_node(name, {res_of[name]: fleet.gpus}, labels={"topology.kubernetes.io/zone": ZONES[i % 3]})
    tenants = [f"tenant-{t:02d}" for t in range(TENANTS)]
    per_res = fleet.capacity // 2
    for t in tenants:
        store.add_namespace(t)
        for res in (H100, L40S):  # twice a fair share of a resource: it seldom bites
            store.add_budget(t, res, max(8, 2 * per_res // TENANTS))
    free = {name: fleet.gpus for name in names}
    open_nodes = list(names)
    for n in range(int(fleet.capacity * fleet.fill)):
        i = rng.randrange(len(open_nodes))
        node = open_nodes[i]
        free[node] -= 1
        if free[node] == 0:
            open_nodes[i] = open_nodes[-1]
            open_nodes.pop()
        cls = "l40s" if res_of[node] == L40S else ("h100" if rng.random() < 0.8 else "h100-stay")
        store.add_device(tenants[n % TENANTS], f"held-{n:06d}", cls, node=node)
    for n in range(fleet.pending):
        store.add_device(tenants[n % TENANTS], f"idle-{n:06d}", rng.choice(list(CLASSES)))
    return store


def request_stream(n: int, seed: int) -> list[Ask]:
    """`n` seeded requests: a tenant, a class (h100 40 %, h100-stay 10 %, l40s 50 %), a set
    size uniform in 1–8, a zone nodeSelector on one request in ten."""
    rng = random.Random(seed * 7919 + 17)
    classes = [c for c, w in CLASS_WEIGHTS for _ in range(w)]
    out = []
    for _ in range(n):
        sel = ((("topology.kubernetes.io/zone", rng.choice(ZONES)),) if rng.random() < 0.1 else ())
        out.append(Ask(f"tenant-{rng.randrange(TENANTS):02d}", rng.choice(classes),
                       rng.randint(1, 8), sel))
    return out


class Lifecycle:
    """Which template devices to delete after an answer: a refused request's at once (W5);
    a Succeeded VM runs until running template GPUs exceed `limit`, then the oldest stop."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: deque[list[tuple[str, str]]] = deque()
        self.gpus = 0

    def answered(self, ok: bool, keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (namespace, name) of the template devices to delete now that a request with
        devices `keys` was answered (`ok`: Succeeded)."""
        if not ok:
            return keys
        self.running.append(keys)
        self.gpus += len(keys)
        gone: list[tuple[str, str]] = []
        while self.gpus > self.limit:
            old = self.running.popleft()
            self.gpus -= len(old)
            gone += old
        return gone


def request_names(i: int, ask: Ask) -> tuple[str, str, list[str]]:
    """Request `i`'s (request id, VMI name, its template devices' names)."""
    vmi = f"vm-{i:06d}"
    return f"r-{i:06d}", vmi, [f"{vmi}-{j}" for j in range(ask.size)]
