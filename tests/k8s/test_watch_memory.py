"""An object that arrives by a watch event costs what the listed one it replaces cost (issue
41 item 5): its strings are the replaced version's (`k8s.informer.share_strings`), the key
listeners get is of those strings, an equal Node keeps one value, and the Pod and excuse
indexes keep the key they hold. Before, each replaced object held a second copy of its name,
namespace, uid, node name and the like, and each node a second Node value: a young replica's
heap grew by ~10 % of the blocks of every object the churn replaced once."""

from __future__ import annotations

import gc
import random
import tracemalloc

import anyio
import pytest

from bench.cache_turnover import INFORMERS, World, relist
from bench.heap_turnover import replace_all
from k8s.cache import ClusterCache
from k8s.informer import Informer, share_strings
from tests.k8s.test_informer_watch import _Lines, _Page, _Server, line, obj
from tests.timing import FAKE_TIME, eventually


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def test_share_strings_takes_the_old_versions_equal_strings_only():
    old = {"metadata": {"name": "vm-1", "resourceVersion": "7", "labels": {"a": "x"}},
           "status": {"phase": "Running", "conditions": [{"type": "Ready"}, {"type": "Paused"}],
                      "enabled": 1}}
    new = {"metadata": {"name": "".join(["vm-", "1"]), "resourceVersion": "8",
                        "labels": {"a": "".join(["x"]), "b": "y"}},
           "status": {"phase": "".join(["Run", "ning"]), "enabled": True,
                      "conditions": [{"type": "".join(["Rea", "dy"])}, {"type": "Migrating"}]}}
    assert new["metadata"]["name"] is not old["metadata"]["name"]   # two equal strings
    share_strings(new, old)
    assert new["metadata"]["name"] is old["metadata"]["name"]
    assert new["metadata"]["labels"]["a"] is old["metadata"]["labels"]["a"]
    assert new["status"]["phase"] is old["status"]["phase"]
    assert new["status"]["conditions"][0]["type"] is old["status"]["conditions"][0]["type"]
    assert new == {"metadata": {"name": "vm-1", "resourceVersion": "8",
                                "labels": {"a": "x", "b": "y"}},
                   "status": {"phase": "Running", "enabled": True,      # True stays True
                              "conditions": [{"type": "Ready"}, {"type": "Migrating"}]}}
    share_strings({"a": "x"}, None)      # nothing to share with: unchanged, no error
    share_strings(["x"], {"a": "x"})


@pytest.mark.anyio
async def test_a_watched_object_and_its_listeners_key_hold_the_listed_strings():
    listed, watched = obj("a", "1"), obj("a", "2")
    server = _Server(_Page([listed], "10"), _Lines([line("MODIFIED", watched)], hang=True))
    informer = Informer("gpudevices", server, watch_timeout=60)
    told: list[tuple[tuple[str, str], dict]] = []
    informer.add_listener(lambda key, o: told.append((key, o)))
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await eventually(lambda: informer.resource_version == "2", what="the event")
        tg.cancel_scope.cancel()
    (_, first), (key, now) = told
    assert now is informer.get(("t", "a")) and now["metadata"]["resourceVersion"] == "2"
    assert now["metadata"]["name"] is first["metadata"]["name"]
    assert now["metadata"]["namespace"] is first["metadata"]["namespace"]
    assert now["spec"]["n"] is first["spec"]["n"]
    assert key == ("t", "a") and key[1] is first["metadata"]["name"]
    assert key[0] is first["metadata"]["namespace"]


def _replaced_once(nodes: int) -> tuple[int, int, ClusterCache, World]:
    """A ClusterCache over `nodes` nodes' soak population, listed, then each object replaced
    once by a watch event of the same content: (objects, traced bytes gained, cache, world)."""
    world = World(nodes, 1)
    cache = ClusterCache(object())
    order = [(kind, key) for kind in INFORMERS for key in world.objs[kind]]
    random.Random(1).shuffle(order)
    tracemalloc.start(1)
    try:
        relist(cache, world)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        replace_all(cache, world, order, 1)
        gc.collect()
        return len(order), tracemalloc.get_traced_memory()[0] - before, cache, world
    finally:
        tracemalloc.stop()


def test_objects_replaced_by_watch_events_cost_what_the_listed_ones_did():
    """20 nodes: 302 objects (Nodes, GPUDevices, VMIs, Pods, ResourceQuotas, ...). Before:
    +379 bytes an object (+112 KiB); now what is left is the view's device index re-keyed on
    each event (a tuple per bound device), dict tables and dicts on CPython's free list,
    about 57 bytes an object here (51 at 1,000 nodes)."""
    objects, gained, cache, world = _replaced_once(20)
    assert objects == 302
    assert gained < 100 * objects, (gained, gained / objects)
    node = world.nodes[0]
    assert cache.view.node(node).labels is cache._raw_nodes[node].labels   # one Node's worth
    kept = cache._quota_budgets[("soak-t00", "gpu")][0]                   # one Budget's
    assert cache.view._budgets[("soak-t00", kept.resource_name)] is kept


@pytest.mark.anyio
async def test_a_relisted_changed_object_holds_the_strings_of_the_version_it_replaces():
    """A relist after a 410 or a restart: an object of a new resourceVersion shares its
    strings with the cached one, and the cache's and listeners' key is of those strings
    (an unchanged one is the cached object itself, as before)."""
    server = _Server(_Page([obj("a", "1"), obj("b", "1")], "10"),
                     _Page([obj("a", "2"), obj("b", "1")], "20"))
    informer = Informer("gpudevices", server)
    told: list[tuple[tuple[str, str], dict]] = []
    await informer.list_once()
    first_a, first_b = informer.get(("t", "a")), informer.get(("t", "b"))
    informer.add_listener(lambda key, o: told.append((key, o)))
    await informer.list_once()
    now_a = informer.get(("t", "a"))
    assert now_a["metadata"]["resourceVersion"] == "2" and informer.get(("t", "b")) is first_b
    assert now_a["metadata"]["name"] is first_a["metadata"]["name"]
    assert now_a["spec"]["n"] is first_a["spec"]["n"]
    keys = {key[1]: key for key, _ in told}
    assert keys["a"][1] is first_a["metadata"]["name"] and keys["b"][1] is first_b["metadata"]["name"]
    assert keys["a"][0] is first_a["metadata"]["namespace"]


def _claim(i: int, rv: int) -> dict:
    from model.claim import MANAGED_BY, MANAGED_BY_LABEL
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"vm{i:05d}-gpus", "namespace": f"t{i % 20:02d}",
                         "uid": f"{i:08d}-aaaa-bbbb-cccc-000000000000",
                         "resourceVersion": str(rv), "creationTimestamp": "2026-12-07T02:00:00Z",
                         "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                         "annotations": {"gpu.cozystack.io/claim-for": f"vm{i:05d}",
                                         "gpu.cozystack.io/admission": f"adm-vm{i:05d}"}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": 2, "allocationMode": "ExactCount"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": f"n{i % 100:04d}",
                 "device": f"gpu-vfio-{j}"} for j in range(2)]}},
                "reservedFor": [{"resource": "pods", "name": f"virt-launcher-vm{i:05d}-abcde"}]}}


def test_a_claim_replaced_by_a_watch_event_costs_what_the_listed_one_did():
    """Device mode: the DRA index keeps a claim's devices while they are equal, so the new
    parsed `Claim` takes them and its equal strings from the one held
    (`model.claim.shared_with`). 200 claims each replaced once with the same content: +655
    bytes a claim before (its devices, name, namespace, uid, ids held twice), ~0 now."""
    import orjson

    from k8s.informer import OrjsonWatch

    c = ClusterCache(object())
    watch = OrjsonWatch(return_type="object")

    def deliver(i: int, rv: int) -> None:
        event = watch.unmarshal_event(orjson.dumps({"type": "MODIFIED", "object": _claim(i, rv)}),
                                      None)
        c.claims._apply(event["type"], event["raw_object"])
    tracemalloc.start(1)
    try:
        for i in range(200):
            deliver(i, 1000 + i)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            deliver(i, 5000 + i)
        gc.collect()
        gained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert gained < 100 * 200, (gained, gained / 200)
    kept = c.claims.get(("t07", "vm00007-gpus"))["parsed"]
    assert kept.resource_version == "5007" and kept.allocated is c.dra._claims[("t07", "vm00007-gpus")]
