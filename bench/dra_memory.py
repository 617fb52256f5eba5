"""What the cache keeps for the ResourceSlices of a fleet of HGX boards (issue 32: a replica
under 350 MiB at 1,000 HGX nodes, 8,000 devices in slices).

Run `python -m bench.dra_memory [--nodes 1000] [--out FILE]`. Not a test. A
`k8s.cache.ClusterCache` whose informers never run gets, as its watches would deliver them,
NVIDIA's DeviceClass, two device-mode GPUClasses (`vfio`: every device of the DeviceClass;
`h100`: a selector on `productName`) and one Ready node per board; then, with tracemalloc
on, one `hgx-h100-8` ResourceSlice per node (`localcluster.dra_profiles`), each decoded from
its JSON bytes inside the measured stretch as the watch decodes it. `kept` is what stays
allocated once the decoded objects are garbage: the informer's copy, the DRA index and the
Node values' device-mode fields. Then every slice comes again with a new resourceVersion
(a relist) and `after_relist` is measured the same way: it must not grow. Prints the
figures and the source lines holding the most.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

import orjson

from bench.common import Benchmark, commit, machine
from k8s.cache import ClusterCache
from localcluster.dra_profiles import DEVICE_CLASS, DRIVER, HGX_H100_8, device_class, resource_slice

MIB = 2 ** 20
H100_ONLY = f"device.attributes['{DRIVER}'].productName.startsWith('GH100')"


def _node(name: str) -> dict:
    return {"metadata": {"name": name, "resourceVersion": "1",
                         "labels": {"kubevirt.io/schedulable": "true"}},
            "spec": {}, "status": {"allocatable": {"cpu": "64"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def _class(name: str, *selectors: str) -> dict:
    spec: dict = {"deviceClassName": DEVICE_CLASS}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"metadata": {"name": name, "generation": 1, "resourceVersion": "1"}, "spec": spec}


def _deliver(cache: ClusterCache, payloads: list[bytes]) -> None:
    """Each slice as one watch event: decoded from its bytes, then the informer's ingest
    (`Informer._apply`: transform, cache, listeners)."""
    for payload in payloads:
        cache.slices._apply("MODIFIED", orjson.loads(payload))


def _payloads(nodes: int, version: int) -> list[bytes]:
    out = []
    for i in range(nodes):
        obj = resource_slice(f"hgx-{i:04d}", HGX_H100_8)
        obj["metadata"]["resourceVersion"] = str(version * 100_000 + i)
        out.append(orjson.dumps(obj))
    return out


def measure(nodes: int = 1000, top: int = 8) -> dict:
    """The figures for `nodes` boards (module docstring): bytes kept after the first
    delivery and after a relist, per slice, the slices' JSON size, and the `top` source
    lines holding the most after the first delivery. Raises AssertionError when a node's
    Node value does not carry its 8 devices under both classes."""
    cache = ClusterCache(object())  # the API client is only stored: no informer runs
    cache.device_classes._apply("ADDED", {**device_class(), "metadata": {
        "name": DEVICE_CLASS, "resourceVersion": "1"}})
    cache.classes._apply("ADDED", _class("vfio"))
    cache.classes._apply("ADDED", _class("h100", H100_ONLY))
    for i in range(nodes):
        cache.nodes._apply("ADDED", _node(f"hgx-{i:04d}"))
    first, again = _payloads(nodes, 1), _payloads(nodes, 2)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _deliver(cache, first)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
        lines = tracemalloc.take_snapshot().statistics("lineno")[:top]
        _deliver(cache, again)
        gc.collect()
        after_relist = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    for i in (0, nodes - 1):
        node = cache.view.node(f"hgx-{i:04d}")
        assert len(node.devices_of("vfio")) == len(node.devices_of("h100")) == 8, node
    return {"nodes": nodes, "devices": 8 * nodes,
            "slices_json_bytes": sum(len(p) for p in first),
            "kept_bytes": kept, "kept_mib": round(kept / MIB, 2),
            "bytes_per_slice": round(kept / nodes),
            "after_relist_bytes": after_relist, "after_relist_mib": round(after_relist / MIB, 2),
            "top_lines": [{"where": str(s.traceback[0]), "bytes": s.size, "count": s.count}
                          for s in lines]}


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", type=int, default=1000,
                    help="HGX boards, one slice each (default: %(default)s)")
    ap.add_argument("--out", type=Path, help="also write the figures to this JSON file "
                    "(default: none)")


def _run(args: argparse.Namespace) -> int:
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report = {"benchmark": "dra_memory", "commit": commit(), "started": started,
              "machine": machine(), **measure(args.nodes)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{report['nodes']} hgx-h100-8 slices ({report['devices']} devices, "
          f"{report['slices_json_bytes'] / MIB:.1f} MiB of JSON): kept {report['kept_mib']} MiB "
          f"({report['bytes_per_slice']} B a slice), after a relist {report['after_relist_mib']} MiB")
    for line in report["top_lines"]:
        print(f"  {line['bytes'] / 1024:8.0f} KiB {line['count']:7d}  {line['where']}")
    return 0


BENCHMARK = Benchmark("dra_memory", "what the cache keeps for the ResourceSlices of a fleet "
                                    "of HGX boards", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
