"""What an informer event that changes no placement costs the leader replica, by fleet size
(issue 40 item 3: nothing grows with the fleet; at 1,000 KWOK nodes the leader's loop also
handles the fleet's own traffic).

Run `python -m bench.event_cost [--nodes 100,1000] [--mode device] [--events 20]
[--window 0.35] [--out FILE]`. Not a test, no API server: `bench.admission_path`'s leader
replica (the cache and every leader part on one loop, over its loopback API) on its world
at `--nodes` nodes × 8 GPUs with 2 bare VMIs per node (`bench scale`'s population: sets of
1/2/4/8 GPUs, a quarter on held devices, each Bound, attached, and in device mode recording
its GPU with its ResourceClaim allocated). Then, per kind, `--events` events delivered to
the cache's informer as a watch would, each changing nothing the binder places by:

- `node-heartbeat`: a Node's Ready condition with a new `lastHeartbeatTime` (KWOK's
  heartbeat stage, every 10–20 minutes per node: about one a second at 1,000 nodes);
- `slice-republish`: a node's ResourceSlice published again unchanged (a DRA driver's
  restart or resync);
- `device-resync`: a Bound GPUDevice delivered again with nothing changed but its
  resourceVersion;
- `vmi-status`: a running VMI's status with a new condition (virt-controller's and
  virt-handler's updates);
- `claim-resync`: an allocated ResourceClaim delivered again;
- `class-status`: the GPUClass's status written (a condition, the waiting line: the leader's
  own writes);

and `none` (no event: the loop's own idle work, the baseline). Per kind: the CPU time of
the informer's listeners (ms, `time.process_time`: the event's synchronous work in the
cache, the view and the leader's listeners) and the CPU time from the event to `--window`
seconds later (ms: that work plus the rounds it kicks, coalesced 0.2 s), medians over the
events. The figures are CPU time on a shared machine: the report records
`os.getloadavg()` before and after.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from datetime import datetime, timezone
import anyio

from bench.common import (Benchmark, at_least, file_path, finite_at_least, ints_at_least,
                          modes, rows_report)

KINDS = ("none", "node-heartbeat", "slice-republish", "device-resync", "vmi-status",
         "claim-resync", "class-status")


class _Events:
    """The events of each kind (module doc), delivered into the replica's cache."""

    def __init__(self, rep) -> None:
        c = self.cache = rep.world.cache
        self.mode = rep.mode
        self.rv = 50_000_000
        self.nodes = sorted(k[1] for k in c.nodes.keys())
        self.devices = sorted((d for d in c.devices.items()
                               if (d.get("status") or {}).get("phase") == "Bound"),
                              key=lambda d: (d["metadata"]["namespace"], d["metadata"]["name"]))
        self.vmis = sorted(c.vmis.items(), key=lambda v: (v["metadata"]["namespace"],
                                                          v["metadata"]["name"]))
        self.claims = list(c.claims.items())

    def _rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _again(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._rv()
        return obj

    def deliver(self, kind: str, i: int) -> None:
        """The `i`-th event of `kind` (none when the world has no such object)."""
        c = self.cache
        if kind == "node-heartbeat":
            name = self.nodes[(7 * i) % len(self.nodes)]
            obj = self._again(c.nodes.get(("", name)))
            for cond in obj["status"].get("conditions") or []:
                cond["lastHeartbeatTime"] = f"2026-12-07T{i // 60 % 24:02d}:{i % 60:02d}:00Z"
            c.nodes._apply("MODIFIED", obj)
        elif kind == "slice-republish" and self.mode == "device":
            from localcluster.dra_profiles import HGX_H100_8, resource_slice

            name = self.nodes[(7 * i) % len(self.nodes)]
            c.slices._apply("MODIFIED", {**resource_slice(name, HGX_H100_8), "metadata": {
                "name": f"{name}-gpu", "resourceVersion": self._rv()}})
        elif kind == "device-resync" and self.devices:
            c.devices._apply("MODIFIED", self._again(self.devices[(7 * i) % len(self.devices)]))
        elif kind == "vmi-status" and self.vmis:
            vmi = self.vmis[(7 * i) % len(self.vmis)]
            key = (vmi["metadata"]["namespace"], vmi["metadata"]["name"])
            obj = self._again(c.vmis.get(key))
            obj.setdefault("status", {})["conditions"] = [
                {"type": "Ready", "status": "True", "lastProbeTime": f"t{i}"}]
            c.vmis._apply("MODIFIED", obj)
        elif kind == "claim-resync" and self.claims:
            c.claims._apply("MODIFIED", self._again(self.claims[(7 * i) % len(self.claims)]))
        elif kind == "class-status":
            obj = self._again(c.classes.items()[0])
            obj.setdefault("status", {})["line"] = {"length": i % 3, "oldestSeconds": i}
            c.classes._apply("MODIFIED", obj)


async def _costs(rep, kinds: tuple[str, ...], events: int, window: float) -> dict[str, dict]:
    out: dict[str, dict] = {}
    async with anyio.create_task_group() as tg:
        await rep.start_leader(tg)
        await anyio.sleep(max(window, 1.0) + 1.0)  # the first rounds (each judges everything)
        gen = _Events(rep)
        for kind in kinds:
            sync, total = [], []
            for i in range(events):
                c0 = time.process_time()
                gen.deliver(kind, i)
                sync.append(time.process_time() - c0)
                await anyio.sleep(window)
                total.append(time.process_time() - c0)
            out[kind] = {"sync_ms_p50": round(1e3 * statistics.median(sync), 3),
                         "window_ms_p50": round(1e3 * statistics.median(total), 3),
                         "window_ms_mean": round(1e3 * statistics.fmean(total), 3)}
        tg.cancel_scope.cancel()
    return out


def measure(nodes: int, mode: str, events: int, window: float,
            kinds: tuple[str, ...] = KINDS) -> dict:
    """One size: the population's counts and per kind the medians (module doc)."""
    from actors.heap import restore_heap, settle_heap
    from bench.admission_path import Replica

    rep = Replica(nodes, mode, 2 * nodes, vms=False)
    heap = settle_heap()  # as the controller does once its cache has synced
    try:
        got = anyio.run(_costs, rep, kinds, events, window)
    finally:
        restore_heap(heap)
    return {"nodes": nodes, "mode": mode, **rep.counts, "events": events, "window_s": window,
            "kinds": got}


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", default="100,1000", help="fleet sizes, comma-separated, each at "
                    "least 1 (default: %(default)s)")
    ap.add_argument("--modes", default="device", help="count and/or device, comma-separated "
                    "(default: %(default)s)")
    ap.add_argument("--events", type=at_least(1), default=20, help="events per kind "
                    "(default: %(default)s)")
    ap.add_argument("--window", type=finite_at_least(0.25), default=0.35, help="seconds of CPU "
                    "time counted after each event (at least 0.25: the rounds it kicks run "
                    "0.2 s after; default: %(default)s)")
    ap.add_argument("--out", type=file_path, help="also write the figures to this JSON file")


def _run(args: argparse.Namespace) -> int:
    from bench.admission_path import _quiet

    point_modes = modes(args.modes)
    sizes = ints_at_least(args.nodes, "--nodes", 1)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    _quiet()
    rows = []
    for mode in point_modes:
        for nodes in sizes:
            row = measure(nodes, mode, args.events, args.window)
            row["load_after"] = [round(x, 2) for x in os.getloadavg()]
            rows.append(row)
            print(f"{mode} {nodes} nodes, {row['gpudevices']} GPUDevices, {row['vmis']} VMIs "
                  f"(load {row['load_after']}): " + "; ".join(
                      f"{k} {v['sync_ms_p50']} / {v['window_ms_p50']} ms"
                      for k, v in row["kinds"].items()), flush=True)
    rows_report("event_cost", started, load_before, rows, args.out)
    return 0


BENCHMARK = Benchmark("event_cost", "what an informer event that changes no placement costs "
                                    "the leader replica, by fleet size (no API server)",
                      _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
