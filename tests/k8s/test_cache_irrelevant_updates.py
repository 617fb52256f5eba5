"""`ClusterCache` under informer events that change nothing it derives (issue 40 item 3:
nothing grows with the fleet): a GPUClass status write (its conditions, its waiting line)
refreshes no node, and a VMI's status or spec update keeps the `vmi_state` value (and the
uids derived from it) that housekeeping and the webhook read, instead of copying every live
VMI again. What the events do change still comes through."""

from __future__ import annotations

from k8s.cache import ClusterCache
from tests.k8s.test_cache_foreign import (CLASS, H, NS, admitted, deliver, event, foreign,
                                          node_obj, stamped, vmi_obj)


def counting_refreshes(c: ClusterCache) -> list[str]:
    """The names of the nodes `c` refreshes from now on (each refresh recomputes a node's
    foreign units and device-mode fields)."""
    seen: list[str] = []
    refresh = c._refresh_node

    def counted(name: str) -> None:
        seen.append(name)
        refresh(name)
    c._refresh_node = counted  # type: ignore[method-assign]
    return seen


def test_a_gpuclass_status_write_refreshes_no_node():
    c = cache_with_nodes(5)
    seen = counting_refreshes(c)
    for status in ({"conditions": [{"type": "Ready", "status": "True", "reason": "Ok"}]},
                   {"line": {"length": 2}}, {"line": None}):
        event(c.classes, stamped({**CLASS, "status": status}))
    assert seen == []
    assert foreign(c) == {}


def test_a_gpuclass_naming_another_resource_still_refreshes_the_excusing_nodes():
    c = cache_with_nodes(1)
    seen = counting_refreshes(c)
    event(c.classes, stamped({"metadata": {"name": "h100"}, "spec": {"resourceName": "other/gpu"}}))
    assert seen == ["node-1"]
    assert foreign(c) == {H: 2}  # its devices now excuse units of another resource
    event(c.classes, stamped(CLASS))
    assert foreign(c) == {}


def cache_with_nodes(n: int) -> ClusterCache:
    """vm-1 admitted on node-1 (2 devices, its launcher Pod), and `n` - 1 more nodes."""
    c = ClusterCache(object())
    admitted(c)
    for i in range(2, n + 1):
        deliver(c, node_obj(f"node-{i}"))
    return c


def test_a_vmi_status_update_keeps_the_vmi_state_value():
    c = ClusterCache(object())
    event(c.vmis, stamped(vmi_obj()))
    before = c.vmi_state()
    uids = before.uids
    running = {**vmi_obj(), "status": {"phase": "Running", "nodeName": "node-1"}}
    event(c.vmis, stamped(running))
    assert c.vmi_state() is before and c.vmi_state().uids is uids
    assert set(before.live) == {(NS, "vm-1")} and before.deleted == frozenset()


def test_a_new_incarnation_or_a_deletion_still_changes_the_vmi_state():
    c = ClusterCache(object())
    event(c.vmis, stamped(vmi_obj()))
    first = c.vmi_state()
    event(c.vmis, stamped(vmi_obj(uid="uid-2")))  # same name, another incarnation
    second = c.vmi_state()
    assert second is not first
    assert second.live[(NS, "vm-1")].uid == "uid-2"
    assert second.deleted == frozenset({(NS, "adm-1")})
    assert second.uids == frozenset({(NS, "uid-2")})
    event(c.vmis, None, (NS, "vm-1"))
    gone = c.vmi_state()
    assert gone.live == {} and gone.uids == frozenset()
    assert gone.deleted == frozenset({(NS, "adm-1")})
    event(c.vmis, None, (NS, "vm-1"))  # deleted again (a relist): nothing changes
    assert c.vmi_state() is gone


def test_the_vmi_states_uids_are_kept_with_the_records_not_derived_from_every_vmi():
    """`vmi_state().uids` come with the value, copied from the set the cache keeps as VMI
    records change (deriving them walked every live VMI after each admission's new VMI: a
    housekeeping round's cost that grew with the fleet); over random creates, new
    incarnations, VMIs without a uid, deletions and repeated deletions they are exactly the
    live records' (namespace, uid)."""
    import random

    c = ClusterCache(object())
    rng = random.Random(5)
    for step in range(400):
        name = f"vm-{rng.randrange(12)}"
        pick = rng.random()
        if pick < 0.25:
            event(c.vmis, None, (NS, name))
        else:
            uid = "" if pick < 0.35 else f"uid-{name}-{rng.randrange(3)}"
            event(c.vmis, stamped(vmi_obj(name, uid)))
        state = c.vmi_state()
        assert state._uids is not None, step   # made with the value, not on first use
        assert state.uids == frozenset((r.namespace, r.uid) for r in state.live.values()
                                       if r.uid), step
