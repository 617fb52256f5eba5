"""`model.device.records.NodeMemo`: a derived snapshot's memo drops the entries of the nodes
that changed and keeps every other node's (what makes a node change cost a copy of the outer
maps on a 1,000-board fleet, not a pass over the entries); a planner's copy may trim and
fill without changing the original."""

from __future__ import annotations

from model.device.records import NodeMemo
from model.reasons import NoDeviceGroup


def _filled() -> NodeMemo:
    memo = NodeMemo()
    for node in ("n1", "n2", "n3"):
        memo.put_group(node, "hgx", 2, NoDeviceGroup("hgx", None, 2, 0, 0))
        memo.put_sizes(node, "hgx", (1, 2))
    memo.put_group("n1", "hgx", 4, NoDeviceGroup("hgx", None, 4, 1, 0))
    return memo


def test_without_drops_only_the_named_nodes_and_leaves_the_original():
    memo = _filled()
    after = memo.without(["n2", "gone-node"])
    assert after.group("n2", "hgx", 2) is None and after.sizes("n2", "hgx") is None
    assert after.group("n1", "hgx", 4) == NoDeviceGroup("hgx", None, 4, 1, 0)
    assert after.sizes("n3", "hgx") == (1, 2)
    assert memo.group("n2", "hgx", 2) == NoDeviceGroup("hgx", None, 2, 0, 0)      # the original keeps it
    assert after.group("n1", "hgx", 8) is None                          # never worked out


def test_a_copy_trimmed_and_refilled_for_a_changed_node_leaves_the_originals_answer():
    memo = _filled()
    planner = memo.copy().without(["n1"])
    planner.put_group("n1", "hgx", 2, NoDeviceGroup("hgx", None, 2, 7, 0))   # the planner's n1 changed
    planner.put_sizes("n1", "hgx", 0)
    assert memo.group("n1", "hgx", 2) == NoDeviceGroup("hgx", None, 2, 0, 0)
    assert memo.sizes("n1", "hgx") == (1, 2)
    # a copy shares no map: what its reader fills (a worker thread's `top`) is its own
    planner.put_group("n3", "hgx", 1, NoDeviceGroup("hgx", None, 1, 0, 0))
    assert memo.group("n3", "hgx", 1) is None
    # a derived memo shares the unchanged nodes' maps: an entry is true of both
    derived = memo.without(["n1"])
    derived.put_group("n3", "hgx", 8, NoDeviceGroup("hgx", None, 8, 0, 0))
    assert memo.group("n3", "hgx", 8) == NoDeviceGroup("hgx", None, 8, 0, 0)


def test_a_copy_copies_no_per_node_map_until_it_fills_one_issue_40():
    """A planner's batch copies the memo (`Reserving`): copy-on-write, so a batch costs no map
    copy per node (the old copy made one per node, growing with the fleet's records)."""
    memo = _filled()
    copied = memo.copy()
    assert all(copied.groups[n] is memo.groups[n] for n in memo.groups)      # shared, not copied
    assert all(copied.largest[n] is memo.largest[n] for n in memo.largest)
    copied.put_group("n2", "hgx", 8, NoDeviceGroup("hgx", None, 8, 2, 0))   # its first fill of n2
    copied.put_sizes("n2", "hgx", 0)
    assert copied.groups["n2"] is not memo.groups["n2"] and copied.largest["n2"] is not memo.largest["n2"]
    assert memo.group("n2", "hgx", 8) is None and memo.sizes("n2", "hgx") == (1, 2)
    assert copied.group("n2", "hgx", 2) == memo.group("n2", "hgx", 2)        # the rest carried over
    assert [n for n in memo.groups if copied.groups[n] is not memo.groups[n]] == ["n2"]
    # a memo derived from the copy does not fill the maps the copy shares either
    derived = copied.without(["n1"])
    derived.put_group("n3", "hgx", 8, NoDeviceGroup("hgx", None, 8, 3, 0))
    assert memo.group("n3", "hgx", 8) is None and copied.group("n3", "hgx", 8) is None
