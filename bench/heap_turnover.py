"""A young replica's RSS while its informer cache turns over (issue 41 item 5): what a heap
loaded by one list and then replaced object by object, at a constant number of objects,
does to RSS.

Run `python -m bench.heap_turnover [--objects 60000] [--passes 2] [--out FILE]`. Not a
test; seeded, no cluster. It loads `objects` GPUDevice-shaped objects as an informer's list
does (pages of 500 decoded by orjson, each item slimmed by `k8s.informer.keep_all`, the
page then garbage), freezes the heap as the controller does once synced
(`actors.heap.settle_heap`), then replaces every object `passes` times, one watch event at a
time in a seeded order (each event decoded, slimmed and stored; a little short-lived garbage
beside, as the replica's logging makes). RSS, the objects the garbage collector tracks and
the frozen ones are taken every quarter of the cache.

What it showed on 2026-12-07 (`bench-results/heap-turnover.json`): with the object count
constant, RSS rises while the list's objects are being replaced (the first pass) and is flat
once none is left (the second): the soaks' young follower, started minutes before the steady
stretch, is in its first pass (docs/benchmarks.md, Soak). Bounded by the cache: not a leak.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
from datetime import datetime, timezone
from pathlib import Path

import orjson

from actors.heap import restore_heap, settle_heap
from bench.common import at_least, commit, machine, memory_mib
from k8s.informer import keep_all

PAGE = 500


def device(i: int, generation: int) -> dict:
    """A GPUDevice as the API server sends it (managedFields included), version `generation`."""
    return {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": f"dev-{i}", "namespace": f"tenant-{i % 20}",
                         "uid": f"{i:08d}-{generation:04d}-4000-8000-000000000000",
                         "resourceVersion": str(100000 + generation * 100000 + i),
                         "labels": {"gpu.cozystack.io/class": "h100", "n": str(i % 1000)},
                         "managedFields": [{"manager": "gpu-binder", "operation": "Update",
                                            "fieldsV1": {"f:status": {"f:phase": {}}}}] * 3},
            "spec": {"class": "h100"},
            "status": {"phase": "Bound", "node": f"node-{i % 1000}",
                       "attachedTo": {"vmi": f"vmi-{i}", "uid": f"{generation:036d}"},
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-12-06T00:00:00Z"}]}}


def run(objects: int, passes: int, seed: int = 1) -> dict:
    """The figures (module docstring): {"listed": {rss_mib, objects}, "steps": [{replaced
    (objects), of_cache (fraction), rss_mib, objects, frozen}]}. RSS in MiB (VmRSS)."""
    cache: dict[str, dict] = {}
    for first in range(0, objects, PAGE):
        page = orjson.loads(orjson.dumps(
            {"items": [device(i, 0) for i in range(first, min(objects, first + PAGE))]}))
        for o in page["items"]:
            cache[o["metadata"]["name"]] = keep_all(o)
        del page
    thresholds = settle_heap()
    try:
        def counted() -> int:
            return len(gc.get_objects()) + gc.get_freeze_count()

        out = {"listed": {"rss_mib": round(memory_mib_self(), 1), "objects": counted()},
               "steps": []}
        order = list(range(objects))
        random.Random(seed).shuffle(order)
        recent: list[bytes] = []
        quarter = max(1, objects // 4)
        for step, i in enumerate(order * passes):
            event = orjson.loads(orjson.dumps(
                {"type": "MODIFIED", "object": device(i, 1 + step // objects)}))
            cache[f"dev-{i}"] = keep_all(event["object"])
            recent = (recent + [orjson.dumps(event)])[-50:]
            if (step + 1) % quarter == 0:
                out["steps"].append({"replaced": step + 1,
                                     "of_cache": round((step + 1) / objects, 2),
                                     "rss_mib": round(memory_mib_self(), 1),
                                     "objects": counted(), "frozen": gc.get_freeze_count()})
        return out
    finally:
        restore_heap(thresholds)


def memory_mib_self() -> float:
    """This process's VmRSS, MiB."""
    import os
    return memory_mib(os.getpid())["VmRSS"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.heap_turnover", description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=at_least(4), default=60000,
                   help="GPUDevice-shaped objects listed, at least 4 (default: %(default)s)")
    p.add_argument("--passes", type=at_least(1), default=2,
                   help="times each object is replaced, at least 1 (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    got = run(args.objects, args.passes)
    report = {"benchmark": "heap_turnover", "commit": commit(), "machine": machine(),
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "objects": args.objects, "passes": args.passes, **got}
    print(f"listed {args.objects}: RSS {got['listed']['rss_mib']} MiB, "
          f"{got['listed']['objects']} objects")
    for s in got["steps"]:
        print(f"replaced {s['of_cache']:.2f} of the cache: RSS {s['rss_mib']} MiB, "
              f"{s['objects']} objects ({s['frozen']} frozen)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
