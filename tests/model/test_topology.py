"""Device-mode choice on one node (docs/contract.md §3b: DR3 topology, DR4 buddy best fit), table
tests on an 8-GPU HGX board and a PCIe card node, and hypothesis properties over random
aligned hierarchies: a chosen set always satisfies its constraint, the choice exists exactly
when a brute-force search finds a group, buddy best fit never breaks a whole aligned block
when another placement keeps it, and the choice does not depend on input order."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import assume, event, given, note, settings
from hypothesis import strategies as st

from model.device.match import MatchAttribute
from model.device.topology import (ClassShare, Device, GroupChoice, NoGroup, choose_devices, choose_set,
                            natural_key, resolve_attribute, sizes_present)

PARTITION = "gpu.nvidia.com/partition{size}"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
BY_PARTITION = MatchAttribute(PARTITION)
BY_PCIE_ROOT = MatchAttribute(PCIE_ROOT)
PROPS = settings(max_examples=200, deadline=None, print_blob=True)


def hgx(sizes: tuple[int, ...] = (1, 2, 4, 8), gpus: int = 8) -> list[Device]:
    """An HGX-like board: GPU i (module id i+1) is in partition{n} number i // n of size n,
    numbered per size as Fabric Manager numbers them on an 8-GPU board (8: 0; 4: 1-2;
    2: 3-6; 1: 7-14)."""
    first = {8: 0, 4: 1, 2: 3, 1: 7}
    devices = []
    for i in range(gpus):
        attrs: dict[str, str | int] = {"gpu.nvidia.com/gpuModuleID": i + 1}
        for n in sizes:
            attrs[f"gpu.nvidia.com/partition{n}"] = first.get(n, 100 * n) + i // n
        devices.append(Device.of(f"gpu-{i}", attrs))
    return devices


def pcie_node() -> list[Device]:
    """Four L40S-like cards on two PCIe roots (gpu-0,1 on root A; gpu-2,3 on root B)."""
    return [Device.of(f"gpu-{i}", {PCIE_ROOT: "pci0000:00" if i < 2 else "pci0000:80"})
            for i in range(4)]


def names(*indices: int) -> set[str]:
    return {f"gpu-{i}" for i in indices}


# --- tables ---------------------------------------------------------------------------------

def test_DR3_a_pair_is_one_partition2_and_breaks_no_whole_block():
    """gpu-1 used: the free pairs are {2,3} {4,5} {6,7}; {2,3} sits in the broken {0-3}
    block, so the whole {4-7} stays free for a 4-GPU set (DR4)."""
    choice = choose_devices(hgx(), names(0, 2, 3, 4, 5, 6, 7), 2, BY_PARTITION)
    assert choice == GroupChoice(devices=("gpu-2", "gpu-3"), group=4, left_in_enclosing=(1, 5),
                                 left_in_group=0, kept=0)


def test_DR4_buddy_looks_past_the_nearest_level():
    """gpu-0 and gpu-4, gpu-5, gpu-6 used: pairs {0,1} and {6,7} each have one free GPU (a tie
    at the pair level); {6,7} sits in the more broken 4-block, so gpu-7 is taken and gpu-1's
    block {0-3} keeps three free."""
    choice = choose_devices(hgx(), names(1, 2, 3, 7), 1, BY_PARTITION)
    assert isinstance(choice, GroupChoice)
    assert choice.devices == ("gpu-7",) and choice.left_in_enclosing == (0, 0, 3)


def test_DR4_a_single_gpu_goes_to_the_broken_pair():
    """gpu-4 used: the lone free GPU of pair {4,5} is taken before any whole pair."""
    choice = choose_devices(hgx(), names(0, 1, 2, 3, 5, 6, 7), 1, BY_PARTITION)
    assert isinstance(choice, GroupChoice)
    assert choice.devices == ("gpu-5",)


def test_DR3_five_free_but_no_free_partition_of_four():
    """gpu-1, gpu-5, gpu-6 used: 5 free GPUs but both 4-blocks broken: no room for 4."""
    outcome = choose_devices(hgx(), names(0, 2, 3, 4, 7), 4, BY_PARTITION)
    assert outcome == NoGroup(attribute="gpu.nvidia.com/partition4", count=4, largest_free=3,
                              attribute_missing=False, sizes=(1, 2, 4, 8))


def test_DR3_a_size_no_partition_has_names_the_sizes_that_exist():
    outcome = choose_devices(hgx(), names(*range(8)), 3, BY_PARTITION)
    assert isinstance(outcome, NoGroup)
    assert outcome.attribute == "gpu.nvidia.com/partition3"
    assert outcome.attribute_missing is True
    assert outcome.sizes == (1, 2, 4, 8)


def test_DR3_all_eight_form_the_board_partition():
    choice = choose_devices(hgx(), names(*range(8)), 8, BY_PARTITION)
    assert isinstance(choice, GroupChoice)
    assert choice.devices == tuple(f"gpu-{i}" for i in range(8))
    assert (choice.group, choice.left_in_enclosing, choice.left_in_group) == (0, (0,), 0)


def test_DR3_unsized_attribute_pcie_root_tightest_root_first():
    """gpu-0 used: a single card goes to root A's last free card, a pair to root B."""
    one = choose_devices(pcie_node(), names(1, 2, 3), 1, BY_PCIE_ROOT)
    two = choose_devices(pcie_node(), names(1, 2, 3), 2, BY_PCIE_ROOT)
    assert isinstance(one, GroupChoice) and isinstance(two, GroupChoice)
    assert one.devices == ("gpu-1",)
    assert two.devices == ("gpu-2", "gpu-3") and two.group == "pci0000:80"
    assert choose_devices(pcie_node(), names(1, 2), 2, BY_PCIE_ROOT) == NoGroup(
        attribute=PCIE_ROOT, count=2, largest_free=1, attribute_missing=False, sizes=())


def test_DR4_the_sets_own_devices_are_kept_when_the_fit_is_equal():
    """A held member recorded on gpu-7: a pair {6,7} keeps it rather than re-pointing it."""
    choice = choose_devices(hgx(), names(2, 3, 6, 7), 2, BY_PARTITION, keep=["gpu-7"])
    assert isinstance(choice, GroupChoice)
    assert choice.devices == ("gpu-6", "gpu-7") and choice.kept == 1


def test_DR4_a_held_device_is_re_pointed_when_that_keeps_a_block_whole():
    """The set's held member sits on gpu-4 of a whole {4-7}; {0-3} is broken (gpu-0 used):
    the pair goes to {2,3} and the held member is re-pointed (kept 0), {4-7} stays whole."""
    choice = choose_devices(hgx(), names(2, 3, 4, 5, 6, 7), 2, BY_PARTITION, keep=["gpu-4"])
    assert isinstance(choice, GroupChoice)
    assert choice.devices == ("gpu-2", "gpu-3") and choice.kept == 0


def test_no_constraint_takes_natural_order():
    devices = [Device.of(f"gpu-{i}") for i in (10, 2, 1)]
    choice = choose_devices(devices, ["gpu-10", "gpu-2", "gpu-1"], 2, None)
    assert isinstance(choice, GroupChoice)
    assert choice.devices == ("gpu-1", "gpu-2") and choice.group is None


def test_devices_without_the_attribute_are_never_chosen():
    devices = hgx()[:4] + [Device.of("gpu-x")]
    outcome = choose_devices(devices, ["gpu-0", "gpu-x"], 2, BY_PARTITION)
    assert isinstance(outcome, NoGroup) and outcome.largest_free == 1


@pytest.mark.parametrize("free, keep, count, message", [
    (["gpu-9"], [], 1, "not devices of this node"),
    (["gpu-0"], ["gpu-1"], 1, "keep"),
    (["gpu-0"], [], 0, "at least one device"),
])
def test_bad_input_is_a_clear_error(free, keep, count, message):
    with pytest.raises(ValueError, match=message):
        choose_devices(hgx(), free, count, BY_PARTITION, keep=keep)


def test_resolve_and_sizes():
    assert resolve_attribute(BY_PARTITION, 4) == "gpu.nvidia.com/partition4"
    assert resolve_attribute(BY_PCIE_ROOT, 4) == PCIE_ROOT
    assert resolve_attribute(None, 2) is None
    assert sizes_present(BY_PARTITION, hgx(sizes=(2, 8))) == (2, 8)
    assert sizes_present(BY_PCIE_ROOT, pcie_node()) == ()
    assert sorted(["gpu-10", "gpu-2", "gpu-1"], key=natural_key) == ["gpu-1", "gpu-2", "gpu-10"]


def test_DR3_two_classes_never_share_a_device():
    board = hgx()
    chosen, failed = choose_set([ClassShare("a", tuple(board), 4, BY_PARTITION),
                                 ClassShare("b", tuple(board), 2, BY_PARTITION)],
                                names(*range(8)))
    assert failed is None and chosen is not None
    assert chosen["a"].devices == ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
    assert chosen["b"].devices == ("gpu-4", "gpu-5")
    none, (cls, why) = choose_set([ClassShare("a", tuple(board), 4, BY_PARTITION),
                                   ClassShare("b", tuple(board), 4, BY_PARTITION)],
                                  names(0, 1, 2, 3, 4, 5, 6))
    assert none is None and cls == "b" and why.largest_free == 3


# --- properties -----------------------------------------------------------------------------

@st.composite
def boards(draw):
    """A random aligned hierarchy: 2**k GPUs (k 1..4), partitions of every power-of-two size
    (some sizes left out), a random free set, a count, and a keep subset of the free set."""
    k = draw(st.integers(1, 4))
    gpus = 2 ** k
    all_sizes = [2 ** j for j in range(k + 1)]
    sizes = tuple(sorted(draw(st.sets(st.sampled_from(all_sizes), min_size=1))))
    board = hgx(sizes=sizes, gpus=gpus)
    free = draw(st.sets(st.sampled_from([d.name for d in board])))
    count = draw(st.sampled_from(all_sizes + [3]))
    keep = draw(st.sets(st.sampled_from(sorted(free)))) if free else set()
    return board, frozenset(free), count, frozenset(keep)


def brute_force_groups(board, free, count):
    """Every free group of `count` sharing partition{count}, by enumerating all subsets."""
    attribute = f"gpu.nvidia.com/partition{count}"
    out = []
    for combo in itertools.combinations(sorted(free), count):
        values = {next(d for d in board if d.name == n).attribute(attribute) for n in combo}
        if len(values) == 1 and None not in values:
            out.append(combo)
    return out


@PROPS
@given(boards())
def test_property_DR3_a_chosen_set_satisfies_its_constraint(case):
    board, free, count, keep = case
    outcome = choose_devices(board, free, count, BY_PARTITION, keep=keep)
    found = brute_force_groups(board, free, count)
    event("placed" if isinstance(outcome, GroupChoice) else "no group")
    if isinstance(outcome, GroupChoice):
        attribute = f"gpu.nvidia.com/partition{count}"
        assert len(set(outcome.devices)) == count
        assert set(outcome.devices) <= free
        assert {d.attribute(attribute) for d in board if d.name in outcome.devices} == {outcome.group}
        assert tuple(sorted(outcome.devices)) in found
    else:
        assert found == []


def _enclosing_whole(board, group_devices, count, free):
    """Whether the next-larger partition around `group_devices` is entirely free (None when
    the board has no larger partition)."""
    larger = [n for n in sizes_present(BY_PARTITION, board) if n > count]
    if not larger:
        return None
    attribute = f"gpu.nvidia.com/partition{larger[0]}"
    values = {d.attribute(attribute) for d in board if d.name in group_devices}
    block = [d.name for d in board if d.attribute(attribute) in values]
    return all(n in free for n in block)


@st.composite
def full_boards(draw):
    """A board with every power-of-two partition size (4, 8 or 16 GPUs), a count smaller than
    the board, and a few used GPUs: the shape in which buddy best fit has a choice to make."""
    gpus = draw(st.sampled_from([4, 8, 16]))
    sizes = tuple(2 ** j for j in range(gpus.bit_length()))
    board = hgx(sizes=sizes, gpus=gpus)
    count = draw(st.sampled_from([n for n in sizes if n < gpus]))
    used = draw(st.sets(st.sampled_from([d.name for d in board]), max_size=gpus // 2))
    return board, frozenset(d.name for d in board) - used, count


@PROPS
@given(full_boards())
def test_property_DR4_buddy_never_breaks_a_whole_block_another_placement_keeps(case):
    board, free, count = case
    outcome = choose_devices(board, free, count, BY_PARTITION)
    assume(isinstance(outcome, GroupChoice))
    candidates = brute_force_groups(board, free, count)
    chosen_whole = _enclosing_whole(board, outcome.devices, count, free)
    event(f"chosen block whole: {chosen_whole}")
    event(f"a broken-block candidate exists: {not all(_enclosing_whole(board, c, count, free) for c in candidates)}")
    if chosen_whole:
        note(f"chose {outcome.devices} breaking a whole block; candidates {candidates}")
        assert all(_enclosing_whole(board, c, count, free) for c in candidates)


@PROPS
@given(boards(), st.randoms(use_true_random=False))
def test_property_the_choice_does_not_depend_on_input_order(case, rnd: random.Random):
    board, free, count, keep = case
    first = choose_devices(board, free, count, BY_PARTITION, keep=keep)
    shuffled = list(board)
    rnd.shuffle(shuffled)
    free_list = list(free)
    rnd.shuffle(free_list)
    assert choose_devices(shuffled, free_list, count, BY_PARTITION, keep=sorted(keep)) == first


@PROPS
@given(boards(), st.integers(1, 4))
def test_property_choose_set_shares_no_device_and_each_class_is_valid(case, second):
    board, free, count, _ = case
    shares = [ClassShare("a", tuple(board), count, BY_PARTITION),
              ClassShare("b", tuple(board), second, BY_PARTITION)]
    chosen, failed = choose_set(shares, free)
    event("placed" if chosen else "refused")
    if chosen is None:
        assert failed is not None and isinstance(failed[1], NoGroup)
        return
    a, b = set(chosen["a"].devices), set(chosen["b"].devices)
    assert not a & b
    assert a | b <= free
    assert len(a) == count and len(b) == second


def test_choose_set_tries_another_order_of_the_classes_when_the_first_finds_no_group():
    """Big (2 devices of gpu-0..2, no constraint) first takes gpu-0 and gpu-1, leaving Small
    (1 device, only gpu-0) nothing; the other order places both. When no order fits, the
    first order's failure is reported."""
    from model.device.topology import ClassShare, NoGroup, choose_set
    devs = [Device.of(f"gpu-{i}") for i in range(3)]
    big = ClassShare("big", tuple(devs), 2)
    small = ClassShare("small", (devs[0],), 1)
    chosen, failed = choose_set([big, small], {"gpu-0", "gpu-1", "gpu-2"})
    assert failed is None
    assert chosen["small"].devices == ("gpu-0",) and chosen["big"].devices == ("gpu-1", "gpu-2")
    assert not set(chosen["small"].devices) & set(chosen["big"].devices)
    chosen, failed = choose_set([big, small], {"gpu-0", "gpu-1"})
    assert chosen is None and failed[0] == "small" and isinstance(failed[1], NoGroup)
