"""The health benchmark's workload: what it runs (`HealthSpec`) and its seeded schedule
(`Op`, `schedule`): the VMs (runStrategy Always) the injections land on, the VMI churn around
them, and the injections (NoExecute and NoSchedule taints, broken devices, attribute loss).
Pure: the same spec gives the same schedule (`bench.soak.schedule_digest` names it)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.scale.workload import ScaleSpec
from bench.soak.workload import SIZES

INJECTIONS = ("noexecute", "noschedule", "lose", "broken")
"""The injected kinds: a NoExecute DeviceTaintRule on a GPU of a running VM (the VM must run
again elsewhere), a NoSchedule one (no new placement there), a published device losing the
class's topology attribute (HL3, dra-driver-nvidia-gpu#1331), a broken device on which
`failed_starts` different VMIs fail to start (HL2)."""


@dataclass(frozen=True)
class HealthSpec:
    """What the health benchmark runs, device mode (HGX H100 boards on KWOK).

    - the population: `bench.scale.populate`'s device-mode fleet of `nodes` boards with
      `background` VMIs running (None: one per two nodes) over `tenants` tenants (None:
      nodes // 25, at least 2), no problem nodes, no idle held devices (`scale_spec()`);
    - `vms` VMs (None: nodes // 5, at least the injections that need one), runStrategy
      Always, created in the first `vm_within` s of the run, sizes from `SIZES`; the
      NoExecute, NoSchedule and attribute-loss injections each take one of them still
      untouched (`Op.pick` chooses which);
    - a VMI churn: creates at `vmi_rate` /s, each deleted `vmi_life` s (uniform in the
      bounds) later unless the run ended;
    - the injections from `inject_from` s: `broken` sequences every `broken_every` s (each
      `failed_starts` VMIs naming one held device fail to start in turn), the others spread
      uniformly up to `inject_until` s before the end of the run (room for the restart);
    - `minutes` of run, everything named `prefix`…."""

    nodes: int = 100
    minutes: float = 4.0
    seed: int = 1
    tenants: int | None = None
    background: int | None = None
    vms: int | None = None
    vm_within: float = 45.0
    vmi_rate: float = 0.25
    vmi_life: tuple[float, float] = (20.0, 60.0)
    noexecute: int = 8
    noschedule: int = 4
    lose: int = 2
    broken: int = 3
    failed_starts: int = 3
    inject_from: float = 60.0
    inject_until: float = 60.0
    broken_every: float = 20.0
    prefix: str = "hl-"

    @property
    def seconds(self) -> float:
        """The run's length in seconds."""
        return self.minutes * 60

    @property
    def n_tenants(self) -> int:
        """Tenants: `tenants`, or nodes // 25, at least 2."""
        return self.tenants or max(2, self.nodes // 25)

    @property
    def picks(self) -> int:
        """Injections that each take one VM."""
        return self.noexecute + self.noschedule + self.lose

    @property
    def n_vms(self) -> int:
        """VMs made: `vms`, or nodes // 5, at least `picks` + 2."""
        return self.vms or max(self.picks + 2, self.nodes // 5)

    @property
    def cls(self) -> str:
        """The device-mode GPUClass (`scale_spec()`'s one class)."""
        return f"{self.prefix}hgx"

    def tenant(self, i: int) -> str:
        """Tenant `i`'s namespace (`bench.scale.populate`'s names)."""
        return f"{self.prefix}t{i:02d}"

    def scale_spec(self) -> ScaleSpec:
        """The population (`bench.scale.populate`): device mode at `nodes`, `background`
        VMIs, no cordoned, tainted or not-Ready nodes, no idle held devices."""
        return ScaleSpec(prefix=self.prefix, seed=self.seed, mode="device").scaled(
            self.nodes, vmis=self.background or max(1, self.nodes // 2), tenants=self.n_tenants,
            cordoned=0, tainted=0, not_ready=0, devices=0)


@dataclass(frozen=True)
class Op:
    """One scheduled operation, `at` s into the run: `kind` "vm" (create VM `name` of
    `size` GPUs, tenant `tenant`), "create"/"delete" (the churn's VMI `name`), or one of
    INJECTIONS; `pick` in [0, 1) chooses the VM an injection takes among those eligible then,
    and the GPU within its set; `name` of a broken sequence is its held device."""

    at: float
    kind: str
    name: str = ""
    tenant: int = -1
    size: int = 0
    pick: float = 0.0


def schedule(spec: HealthSpec) -> list[Op]:
    """The run's operations, sorted by time (a pure function of `spec`). ValueError when the
    injections do not fit: fewer VMs than injections needing one, or no room between
    `inject_from` and the end less `inject_until`."""
    last = spec.seconds - spec.inject_until
    if last <= spec.inject_from:
        raise ValueError(f"no room for injections: from {spec.inject_from:g} s to "
                         f"{last:g} s of a {spec.seconds:g} s run")
    if spec.n_vms < spec.picks:
        raise ValueError(f"{spec.n_vms} VMs for {spec.picks} injections that each take one")
    rng = random.Random(spec.seed)
    sizes, weights = zip(*SIZES)
    ops: list[Op] = []
    for k in range(spec.n_vms):
        ops.append(Op(round(rng.uniform(0, spec.vm_within), 1), "vm", f"{spec.prefix}vm{k:03d}",
                      k % spec.n_tenants, rng.choices(sizes, weights)[0]))
    t, k = 0.0, 0
    while spec.vmi_rate > 0:
        t += rng.expovariate(spec.vmi_rate)
        if t >= spec.seconds:
            break
        name = f"{spec.prefix}c{k:04d}"
        ops.append(Op(round(t, 1), "create", name, rng.randrange(spec.n_tenants),
                      rng.choices(sizes, weights)[0]))
        gone = t + rng.uniform(*spec.vmi_life)
        if gone < spec.seconds:
            ops.append(Op(round(gone, 1), "delete", name))
        k += 1
    for b in range(spec.broken):
        ops.append(Op(spec.inject_from + b * spec.broken_every, "broken",
                      f"{spec.prefix}broken{b}", b % spec.n_tenants))
    kinds = ["noexecute"] * spec.noexecute + ["noschedule"] * spec.noschedule + ["lose"] * spec.lose
    rng.shuffle(kinds)
    times = sorted(round(rng.uniform(spec.inject_from, last), 1) for _ in kinds)
    ops += [Op(at, kind, pick=round(rng.random(), 6)) for at, kind in zip(times, kinds)]
    return sorted(ops, key=lambda o: (o.at, o.kind, o.name))


def pick(eligible: list[str], p: float) -> str | None:
    """The element of `eligible` (in the order given) that `p` in [0, 1) chooses, None when
    it is empty."""
    return eligible[min(len(eligible) - 1, int(p * len(eligible)))] if eligible else None
