"""Micro-benchmark of a defragmentation round (docs/contract.md §3a D1-D5; in device mode with
DR2-DR4, issue 32) on a fleet of 1,000 HGX H100 boards, device mode beside its count-mode
twin, against the bound of perfect repacking.

Run `python -m bench.defrag_round [--nodes 1000] [--fill 0.5] [--attached 0.25] [--seed 1]
[--rounds 5] [--max-moves 4] [--repeat 3] [--out FILE]`. Not a test.

The fleet is `bench.device_decide.fleet`: each node publishes the slice of
`localcluster.dra_profiles.HGX_H100_8` (partitions by module id), about `--fill` of its GPUs
recorded by held devices of 20 tenants (random GPUs: partitions broken), `--attached` of them
attached to running VMs (never moved, D1) and the rest idle, 1 % allocated by foreign claims,
0.5 % tainted; one device-mode class on `gpu.nvidia.com/partition{size}`.
Its count-mode twin has the same nodes with 8 units each (the foreign and tainted GPUs as
foreign units) and the same held devices Bound on the same nodes, of a count-mode class.

Each mode runs `--rounds` rounds in turn (`model.defrag.plan_round` with `--max-moves`, its
moves applied with `apply_moves`, as the binder's rounds follow one another) and reports per
round the CPU time of planning it (best of `--repeat`), the moves (device mode: how many are
re-points) and the largest placeable set after it (size, nodes with room). The bound is what
perfect repacking reaches: the largest set one node could take with every idle held device of
the fleet gone from it (the rest of the fleet has room for them at this fill), which no
sequence of moves can pass. Count mode ignores topology, so its sizes are not partitions:
its figure says how far units alone go, not what an HGX VM gets.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import replace

from bench.common import BadArgs, Benchmark, at_least, commit, machine
from bench.device_decide import CLASS, RES, fleet
from model.defrag import apply_moves, largest_sets, movable, plan_round
from model.device.view import largest_device_set
from model.snapshot import Snapshot
from model.types import Attachment, DeviceStatus, GPUClass, GPUDevice, Node, Phase

COUNT_RES = "nvidia.com/GH100_H100_SXM5_80GB"
COUNT_CLASS = "h100-count"


def with_running(snap: Snapshot, share: float, rng: random.Random) -> Snapshot:
    """`snap` with about `share` of its held devices attached to running VMs (one VM per
    node and tenant)."""
    now = next(iter(snap.devices.values())).status.bound_at if snap.devices else None
    running = [replace(d, status=replace(d.status, attached_to=Attachment(
        f"vm-{d.bound_node}", now))) for d in snap.devices.values() if rng.random() < share]
    return snap.with_devices(running)


def count_twin(snap: Snapshot) -> Snapshot:
    """The count-mode twin of a device-mode fleet (see the module docstring)."""
    nodes = []
    for n in snap.nodes.values():
        taken = len(n.taken_devices)
        nodes.append(Node(n.name, n.labels, ((COUNT_RES, 8),), n.unschedulable,
                          foreign=((COUNT_RES, taken),) if taken else ()))
    devices = [GPUDevice(d.namespace, d.name, COUNT_CLASS, status=DeviceStatus(
        Phase.BOUND, d.bound_node, d.status.bound_at, d.status.attached_to))
        for d in snap.devices.values()]
    return Snapshot.build(nodes=nodes, classes=[GPUClass(COUNT_CLASS, COUNT_RES)], devices=devices,
                          namespaces=snap.namespaces.values())


def bound(snap: Snapshot) -> tuple[int, int]:
    """What perfect repacking reaches: per node, its figure with every idle held device on
    it gone (device mode: `largest_device_set`; count mode: its free units then); the most
    over nodes, and on how many nodes (size, nodes). No sequence of moves passes the size,
    and at that size none gives room on more nodes."""
    movable_on: dict[str, list[tuple[str, str]]] = {}
    for d in snap.devices.values():
        if movable(d, snap):
            movable_on.setdefault(d.bound_node, []).append(d.key)  # type: ignore[arg-type]
    sizes = []
    for node in snap.nodes:
        cleared = snap.without_devices(movable_on.get(node, ()))
        sizes.append(largest_device_set(cleared, node, CLASS) if CLASS in snap.classes
                     else cleared.free(node, COUNT_RES))
    top = max(sizes, default=0)
    return top, sizes.count(top)


def rounds(snap: Snapshot, n_rounds: int, max_moves: int, repeat: int) -> list[dict]:
    """`n_rounds` rounds in turn on `snap` (see the module docstring)."""
    out = []
    for i in range(n_rounds):
        times = []
        for _ in range(repeat):
            t0 = time.process_time()
            plan = plan_round(snap, max_moves=max_moves)
            times.append(time.process_time() - t0)
        snap = apply_moves(snap, plan.moves)
        (after,) = [x for x in largest_sets(snap) if x.class_name in (CLASS, COUNT_CLASS)]
        out.append({"round": i + 1, "cpu_ms": round(1e3 * min(times), 1),
                    "moves": len(plan.moves), "re_points": sum(m.repoint for m in plan.moves),
                    "largest": after.size, "nodes": after.nodes})
        if not plan.moves:
            break
    return out


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", type=at_least(1), default=1000,
                    help="HGX boards of the fleet (default: %(default)s)")
    ap.add_argument("--fill", type=float, default=0.5,
                    help="share of GPUs held at the start, 0 to 1 (default: %(default)s)")
    ap.add_argument("--attached", type=float, default=0.25,
                    help="share of the held devices attached to running VMs, 0 to 1 "
                         "(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the fleet (default: %(default)s)")
    ap.add_argument("--rounds", type=at_least(1), default=5,
                    help="rounds run in turn (default: %(default)s)")
    ap.add_argument("--max-moves", type=at_least(1), default=4,
                    help="most moves of a round (default: %(default)s)")
    ap.add_argument("--repeat", type=at_least(1), default=3,
                    help="plans of each round timed; the best (default: %(default)s)")
    ap.add_argument("--out", help="write the report as JSON here (default: none)")


def _run(a: argparse.Namespace) -> int:
    """The rounds of both modes, printed (and written to `--out`). BadArgs for a share
    outside 0..1."""
    for name, value in (("--fill", a.fill), ("--attached", a.attached)):
        if not 0 <= value <= 1:
            raise BadArgs(f"python -m bench.defrag_round: {name} must be between 0 and 1, "
                          f"got {value}")
    rng = random.Random(a.seed)
    device = with_running(fleet(a.nodes, a.fill, rng), a.attached, rng)
    count = count_twin(device)
    load = os.getloadavg()
    report = {"benchmark": "defrag_round", "commit": commit(), "machine": machine(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "load_before": [round(x, 2) for x in load],
              "params": {k: v for k, v in vars(a).items() if k != "out"}, "modes": {}}
    for mode, snap in (("device", device), ("count", count)):
        (before,) = [x for x in largest_sets(snap) if x.class_name in (CLASS, COUNT_CLASS)]
        idle = sum(1 for d in snap.devices.values() if movable(d, snap))
        got = rounds(snap, a.rounds, a.max_moves, a.repeat)
        report["modes"][mode] = {"idle_held": idle, "before": [before.size, before.nodes],
                                 "bound": bound(snap), "rounds": got}
        size, nodes = report["modes"][mode]["bound"]
        print(f"{mode}: {idle} idle held; largest before {before.size} on {before.nodes} nodes; "
              f"perfect repacking: {size} on {nodes} nodes")
        for r in got:
            print(f"  round {r['round']}: {r['cpu_ms']} ms, {r['moves']} moves "
                  f"({r['re_points']} re-points) -> largest {r['largest']} on {r['nodes']} nodes")
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")

    return 0


BENCHMARK = Benchmark("defrag_round", "a defragmentation round on 1,000 HGX boards, device "
                                      "mode beside its count-mode twin, against perfect "
                                      "repacking", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
