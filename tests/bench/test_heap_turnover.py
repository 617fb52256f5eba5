"""bench.heap_turnover: the model of a young replica's cache turning over (issue 41 item 5)
keeps its object count while every listed object is replaced, and the frozen start-up heap
shrinks by the objects replaced in the first pass only."""

from __future__ import annotations

from bench.heap_turnover import device, run
from k8s.informer import keep_all


def test_the_cache_turns_over_at_a_constant_object_count():
    got = run(2000, 2)
    steps = got["steps"]
    assert [s["of_cache"] for s in steps] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    counts = {s["objects"] for s in steps}
    assert max(counts) - min(counts) < 50, counts          # replaced, not added
    frozen = [s["frozen"] for s in steps]
    assert frozen[0] > frozen[1] > frozen[2] > frozen[3]    # the list's objects leave ...
    assert len(set(frozen[3:])) == 1                        # ... and none is left after one pass
    assert all(s["rss_mib"] > 0 for s in steps)


def test_a_device_is_slimmed_as_the_informer_keeps_it():
    o = keep_all(device(7, 3))
    assert "managedFields" not in o["metadata"] and o["metadata"]["name"] == "dev-7"
    assert o["metadata"]["resourceVersion"] == str(100000 + 3 * 100000 + 7)


def test_the_command_line_refuses_sizes_below_one_pass_of_four_objects(capsys):
    """A newcomer's find: --objects 0 or -5 and --passes 0 ran and exited 0."""
    import pytest

    from bench.heap_turnover import main

    for argv in (["--objects", "0"], ["--objects", "-5"], ["--passes", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "must be at least" in capsys.readouterr().err


def test_the_informers_mode_replaces_every_object_through_the_real_path():
    """`--informers`: the real ClusterCache over the soak population; each pass replaces
    every object by a same-content watch event, and the traced heap stays where the list
    left it (within 2 blocks an object: k8s.informer.share_strings)."""
    import pytest

    from bench.heap_turnover import main, run_informers

    got = run_informers(5, 2, trace=True)
    assert got["objects"] == 107
    listed = got["listed"]["traced"]["blocks"]
    gained = [p["traced"]["blocks"] - listed for p in got["passes"]]
    assert all(g < 2 * 107 for g in gained), gained        # about 6 an object before
    assert got["passes"][0]["watch_decode"]["blocks"] > 0 and got["listed"]["watch_decode"]["blocks"] == 0
    with pytest.raises(SystemExit) as exc:
        main(["--informers", "5", "--passes", "10"])
    assert exc.value.code == 2


def test_replacing_an_empty_order_changes_nothing():
    """`replace_all` with no (kind, key) to replace returns and leaves the cache as listed (it
    raised NameError: the loop's last event was deleted after a loop that never ran)."""
    from bench.cache_turnover import INFORMERS, World, relist
    from bench.heap_turnover import replace_all
    from k8s.cache import ClusterCache

    world = World(2, 1)
    cache = ClusterCache(object())
    relist(cache, world)

    def versions() -> dict:
        return {kind: {key: getattr(cache, INFORMERS[kind]).get(key)["metadata"]["resourceVersion"]
                       for key in world.objs[kind]} for kind in INFORMERS}
    before = versions()
    assert replace_all(cache, world, [], 1) is None
    assert versions() == before
    kind, key = next((k, key) for k in INFORMERS for key in world.objs[k])
    replace_all(cache, world, [(kind, key)], 1)
    after = versions()
    assert after[kind][key] != before[kind][key]             # one replaced, with a new version ...
    after[kind][key] = before[kind][key]
    assert after == before                                   # ... and only that one


def test_the_churn_mode_replaces_the_listed_vmis_oldest_first_at_constant_counts():
    """`--churn`: the soak's churn over the real ClusterCache. After one pass no listed VMI is
    left, every informer holds as many objects as it listed (each VMI replaced by one of its
    tenant, class and size: same Pod and held-device counts), the VMI tombstones count the
    deletions (none older than TOMBSTONE_TTL yet), and the watched objects' decode holds what
    the list's held for them (`k8s.informer.share_strings`: within 2 blocks an object, beside
    the keys orjson's cache of 2,048 keeps from the watch's decode)."""
    import orjson

    from bench.cache_turnover import INFORMERS, World, relist
    from bench.heap_turnover import replace_oldest, run_churn
    from k8s.cache import ClusterCache

    world = World(5, 1)
    cache = ClusterCache(object())
    relist(cache, world)
    counts = {kind: len(world.objs[kind]) for kind in INFORMERS}
    first = list(world.vmis)
    sizes = {k: len(v) for k, v in world.vmis.items()}
    events: list = []
    replace_oldest(world, events)
    assert first[0] not in world.vmis and list(world.vmis)[:-1] == first[1:]
    new = list(world.vmis)[-1]
    assert new[0] == first[0][0] and len(world.vmis[new]) == sizes[first[0]]
    assert {kind: len(world.objs[kind]) for kind in INFORMERS} == counts
    kinds = [orjson.loads(e)["type"] for _, e in events]
    gone = 2 + sizes[first[0]]     # the VMI, its Pod, its held devices: after the new one's
    assert kinds[-gone:] == ["DELETED"] * gone and "DELETED" not in kinds[:-gone]

    got = run_churn(5, 2, trace=True)
    assert got["vmis"] == 10
    assert [(q["replaced"], q["originals_left"], q["tombstones"]) for q in got["quarters"]] == [
        (2, 8, 2), (4, 6, 4), (6, 4, 6), (8, 2, 8), (10, 0, 10),
        (12, 0, 12), (14, 0, 14), (16, 0, 16), (18, 0, 18), (20, 0, 20)]
    listed = got["listed"]["list_decode"]["blocks"]
    after = got["quarters"][4]
    moved = listed - after["list_decode"]["blocks"]
    assert moved > 0 and after["watch_decode"]["blocks"] > 0
    assert abs(after["watch_decode"]["blocks"] - moved) < 2048 + 2 * 10 * 10   # VMI, Pod, devices
    assert len(got["held"]) == 3 and "vmis._cache" in got["held"][0]
