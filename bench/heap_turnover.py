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

`--informers NODES [--trace]` drives the real code path instead: a `k8s.cache.ClusterCache`
lists `bench.cache_turnover`'s soak population of NODES nodes through its informers (their
list pages, transforms and listeners), the heap is frozen, then every object is replaced
`passes` times by a MODIFIED watch event of the same content (a new resourceVersion of the
same length) through `OrjsonWatch.unmarshal_event` and `Informer._apply`, in a seeded order.
Each pass reports RSS or, with `--trace`, tracemalloc's figures: all traced bytes, and those
still alive that the watch's decode (`OrjsonWatch.unmarshal_event`) and the list's
(`k8s.errors.read_json`) allocated. An object costs the same however it arrived when the
traced total stays where the list left it (issue 41 item 5: a watched object held ~10 %
more blocks than the listed one it replaced, until `k8s.informer.share_strings`). On
2026-12-07 (`bench-results/heap-turnover-informers.json`, 1,000 nodes, 13,042 objects): traced
54.69 MiB listed, 59.47 after the first pass and 59.48 after the second on main `483bd0b`
(RSS 165.4 -> 167.9 -> 167.9), 55.35 and 55.37 with the strings shared (RSS 165.1 flat).

`--churn NODES [--trace]` is the soak's churn instead: the same listed population, then its
VMIs replaced oldest first (`bench soak`'s deletion order), each by a new VMI of the same
tenant, class and size (the new one's ADDED and MODIFIED events, then DELETED ones for the
old VMI, its Pod and its held devices), 2 a simulated second (the VMI tombstones' clock), so every
cache's object count stays the same. Each quarter of the live set reports the originals left,
the tombstones and RSS (or, with `--trace`, the traced figures as above); each pass's end the
bytes each map of the cache holds (`held_by_map`). On 2026-12-07
(`bench-results/heap-turnover-churn.json`: 1,000 nodes, 2,000 VMIs, traced): 54.85 MiB
listed, 59.53 once the 2,000 listed VMIs were replaced (2.4 KiB a VMI), 59.71 after the next
2,000. The objects a watch decoded cost what the listed ones did: the decode held 41.93 MiB
listed and 13.35 (list) + 28.55 (watch) = 41.90 after the first pass. Of the first pass's
growth the cache's maps hold 2.65 MiB: their hash tables, which the list built compact and
which churn (deletes, then inserts of new keys) grows once to their steady size
(_excuse_of +406 KiB, the devices' informer +397, view._on_node +381, the VMIs' informer
+323, view._devices +288, _pods_on +182, ...), and the VMI tombstones filling to
TOMBSTONE_TTL x the delete rate (1,201, +379 KiB); the rest lies outside the cache's maps
(the bench's own World among it). The second pass: +0.18 MiB, per-node sets' high-water
marks (_pods_on, view._on_node). Issue 41 item 5: a replica grows by a bounded amount during
its first turnover of the VMIs it listed (up to live VMIs / delete rate after its start,
1,000 s in the soak), and is flat after.
bounded amount, flat after.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

import orjson

from actors.heap import restore_heap, settle_heap
from bench.cache_turnover import INFORMERS, World, relist
from bench.common import at_least, commit, machine, memory_mib
from k8s.cache import ClusterCache
from k8s.informer import OrjsonWatch, keep_all

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


def same_content_event(world: World, kind: str, key: tuple[str, str], version: int) -> bytes:
    """A MODIFIED watch line carrying `world`'s object `key` of `kind` as listed, with a new
    resourceVersion of the same length (its first digit moved on by `version`, 1-9)."""
    build, args, rv = world.objs[kind][key]
    obj = world.build((build, args, rv))
    obj["metadata"]["resourceVersion"] = str((int(rv[0]) + version) % 10) + rv[1:]
    return orjson.dumps({"type": "MODIFIED", "object": obj})


def replace_all(cache: ClusterCache, world: World, order: list[tuple[str, tuple[str, str]]],
                version: int) -> None:
    """Every (kind, key) of `order` replaced once in `cache` by `same_content_event`, through
    the informers' watch path (`OrjsonWatch.unmarshal_event`, `Informer._apply`: the
    transform, the cache, the listeners). An empty `order` replaces nothing. No event
    outlives the call (the caller's sample after it sees only what the cache keeps)."""
    watch = OrjsonWatch(return_type="object")
    for kind, key in order:
        event = watch.unmarshal_event(same_content_event(world, kind, key, version), None)
        getattr(cache, INFORMERS[kind])._apply(event["type"], event["raw_object"])


def _traced(snapshot: tracemalloc.Snapshot) -> dict:
    """All traced bytes (MiB) and blocks, and those the watch's and the list's decode made."""
    import k8s.errors
    import k8s.informer

    def at(module, name: str) -> tracemalloc.Filter:
        return tracemalloc.Filter(True, module.__file__, _line_of(module, name))

    def total(snap: tracemalloc.Snapshot) -> dict:
        stats = snap.statistics("filename")
        return {"mib": round(sum(s.size for s in stats) / 2**20, 2),
                "blocks": sum(s.count for s in stats)}
    return {"traced": total(snapshot),
            "watch_decode": total(snapshot.filter_traces([at(k8s.informer, "js = orjson.loads(data)")])),
            "list_decode": total(snapshot.filter_traces([at(k8s.errors, "doc = orjson.loads(body)")]))}


def _line_of(module, text: str) -> int:
    """The line number of the first line of `module`'s source holding `text`."""
    with open(module.__file__) as f:
        for n, line in enumerate(f, 1):
            if text in line:
                return n
    raise LookupError(f"{module.__name__}: no line holds {text!r}")


def _sample(trace: bool) -> dict:
    """After a full collection: {"rss_mib"} and, with `trace`, tracemalloc's figures
    (`_traced`) as `run_informers` and `run_churn` report them."""
    gc.collect()
    out: dict = {"rss_mib": round(memory_mib_self(), 1)}
    if trace:
        out.update(_traced(tracemalloc.take_snapshot()))
    return out


def run_informers(nodes: int, passes: int, *, seed: int = 1, trace: bool = False) -> dict:
    """The real path's figures (module docstring): {"objects", "listed": {rss_mib[, traced,
    watch_decode, list_decode]}, "passes": [the same after each pass]}; traced figures as
    {"mib", "blocks"}. `passes` 1-9."""
    if not 1 <= passes <= 9:
        raise ValueError("passes: 1-9 (a resourceVersion of the same length per pass)")
    world = World(nodes, seed)
    cache = ClusterCache(object())
    if trace:
        tracemalloc.start(1)
    try:
        relist(cache, world)
        thresholds = settle_heap()
        try:
            order = [(kind, key) for kind in INFORMERS for key in world.objs[kind]]
            random.Random(seed).shuffle(order)
            got: dict = {"objects": len(order), "listed": _sample(trace), "passes": []}
            for p in range(1, passes + 1):
                replace_all(cache, world, order, p)
                got["passes"].append(_sample(trace))
            return got
        finally:
            restore_heap(thresholds)
    finally:
        if trace:
            tracemalloc.stop()


def held_by_map(cache: ClusterCache) -> dict[str, int]:
    """Bytes (`sys.getsizeof`, summed over what each reaches) held by each container
    attribute of `cache`, of its view and of its informers (`devices._cache`), each object
    counted once: under the first map (in attribute order) that reaches it. Modules, types,
    functions and frames are not followed."""
    seen: set[int] = {id(cache)}
    out: dict[str, int] = {}
    skip = ("module", "function", "builtin_function_or_method", "method", "code", "frame",
            "cell", "type")

    def attrs(o) -> dict:
        d = dict(getattr(o, "__dict__", None) or {})
        for name in getattr(type(o), "__slots__", ()) or ():
            if hasattr(o, name):
                d[name] = getattr(o, name)
        return d

    roots = []
    for k, v in attrs(cache).items():
        if type(v).__module__.split(".")[0] in ("k8s", "actors", "model"):
            roots += [(f"{k}.{k2}", v2) for k2, v2 in attrs(v).items()]
        else:
            roots.append((k, v))
    for name, root in roots:
        if id(root) in seen or type(root).__name__ in skip:
            continue
        seen.add(id(root))
        todo, total = [root], 0
        while todo:
            o = todo.pop()
            if type(o).__name__ in skip:
                continue
            total += sys.getsizeof(o)
            if isinstance(o, (str, bytes, int, float, bool, type(None))):
                continue
            if isinstance(o, dict):
                kids = [x for kv in o.items() for x in kv]
            elif isinstance(o, (list, tuple, set, frozenset)):
                kids = list(o)
            else:
                kids = list(attrs(o).values())
            for c in kids:
                if id(c) not in seen:
                    seen.add(id(c))
                    todo.append(c)
        out[name] = out.get(name, 0) + total
    return out


def replace_oldest(world: World, events: list) -> None:
    """`world`'s oldest VMI replaced by a new one of its tenant, class and size (the new one's
    events first, as the soak's creates and deletes interleave), `events` appended."""
    key = next(iter(world.vmis))
    _, args, _ = world.objs["virtualmachineinstances"][key]
    ns, _, cls, size = args[:4]
    world.new_vmi(events, like=(ns, cls, size))
    world.delete_vmi(events, key)


def run_churn(nodes: int, passes: int, *, seed: int = 1, trace: bool = False,
              rate: float = 2.0) -> dict:
    """The churn's figures (module docstring): {"vmis", "listed": sample, "quarters":
    [sample + {replaced, originals_left, tombstones}], "held": [{map: bytes}, listed then
    after each pass]}; a sample is {rss_mib[, traced, watch_decode, list_decode]} as in
    `run_informers`. `rate` replacements a simulated second. `passes` >= 1."""
    import k8s.cache as cache_module
    from types import SimpleNamespace
    import time as real_time

    if passes < 1:
        raise ValueError("passes: at least 1")
    clock = [0.0]
    saved = cache_module.time
    cache_module.time = SimpleNamespace(monotonic=lambda: clock[0], time=real_time.time)
    world = World(nodes, seed)
    cache = ClusterCache(object())
    if trace:
        tracemalloc.start(1)
    try:
        relist(cache, world)
        cache.view.snapshot()   # built once, as the first admission or scrape does
        thresholds = settle_heap()
        try:
            informers = {kind: getattr(cache, attr) for kind, attr in INFORMERS.items()}
            watch = OrjsonWatch(return_type="object")
            originals = set(world.vmis)
            live = len(originals)
            quarter = max(1, live // 4)
            out: dict = {"vmis": live, "listed": _sample(trace), "quarters": [],
                         "held": [held_by_map(cache)]}
            for i in range(1, passes * live + 1):
                clock[0] = i / rate
                events: list = []
                replace_oldest(world, events)
                for kind, line in events:
                    ev = watch.unmarshal_event(line, None)
                    informers[kind]._apply(ev["type"], ev["raw_object"])
                del events
                if i % 20 == 0:
                    cache.view.snapshot()
                if i % quarter == 0:
                    out["quarters"].append({"replaced": i,
                                            "originals_left": len(originals & world.vmis.keys()),
                                            "tombstones": len(cache._tombstones), **_sample(trace)})
                if i % live == 0:
                    out["held"].append(held_by_map(cache))
            return out
        finally:
            restore_heap(thresholds)
    finally:
        cache_module.time = saved
        if trace:
            tracemalloc.stop()


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
    p.add_argument("--informers", type=at_least(1), default=None, metavar="NODES",
                   help="the real ClusterCache over a soak population of NODES nodes, each object "
                        "replaced by watch events of the same content (--objects unused)")
    p.add_argument("--churn", type=at_least(1), default=None, metavar="NODES",
                   help="the real ClusterCache over a soak population of NODES nodes, its VMIs "
                        "replaced oldest first by new ones of the same tenant, class and size")
    p.add_argument("--trace", action="store_true",
                   help="with --informers or --churn: tracemalloc's figures (RSS is not judged "
                        "with tracing)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.informers is not None:
        return _main_informers(p, args)
    if args.churn is not None:
        return _main_churn(args)
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


def _main_informers(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.passes > 9:
        p.error("--passes: at most 9 with --informers")
    load_before = list(os.getloadavg())
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    got = run_informers(args.informers, args.passes, trace=args.trace)
    report = {"benchmark": "heap_turnover", "mode": "informers", "commit": commit(),
              "machine": machine(), "started": started, "load_before": load_before,
              "load_after": list(os.getloadavg()), "nodes": args.informers,
              "passes": args.passes, "trace": args.trace, "objects": got["objects"],
              "listed": got["listed"], "after_pass": got["passes"]}
    print(f"listed {got['objects']} objects ({args.informers} nodes): {json.dumps(got['listed'])}")
    for n, s in enumerate(got["passes"], 1):
        print(f"pass {n}, every object replaced: {json.dumps(s)}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


def _main_churn(args: argparse.Namespace) -> int:
    load_before = list(os.getloadavg())
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    got = run_churn(args.churn, args.passes, trace=args.trace)
    report = {"benchmark": "heap_turnover", "mode": "churn", "commit": commit(),
              "machine": machine(), "started": started, "load_before": load_before,
              "load_after": list(os.getloadavg()), "nodes": args.churn, "passes": args.passes,
              "trace": args.trace, **got}
    print(f"listed {got['vmis']} VMIs ({args.churn} nodes): {json.dumps(got['listed'])}")
    for q in got["quarters"]:
        print(json.dumps(q))
    for n, (before, after) in enumerate(zip(got["held"], got["held"][1:]), 1):
        grew = sorted(((after.get(k, 0) - before.get(k, 0), k) for k in after), reverse=True)
        print(f"pass {n}: the maps grew {sum(g for g, _ in grew) / 1024:.1f} KiB: "
              + ", ".join(f"{k} {g / 1024:+.1f}" for g, k in grew[:8] if g))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
