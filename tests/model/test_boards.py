"""`model.device.boards.Boards`: nodes whose devices look the same share one board (its
layouts worked out once); the table is bounded and starts over past its limit."""

import pytest

from localcluster.dra_profiles import HGX_H100_8, L40S_4, resource_slice
from model.device.boards import Boards
from model.device.dra import parse_resource_slice
from model.device.match import MatchAttribute


def devices(node: str, profile=HGX_H100_8):
    return tuple(sorted(parse_resource_slice(resource_slice(node, profile)).devices, key=lambda d: d.ref))


def test_equal_boards_share_one_and_their_layouts():
    boards = Boards()
    one, two = boards.device_set(devices("hgx-1")), boards.device_set(devices("hgx-2"))
    assert one != two and one.board is two.board and len(boards) == 1
    match = MatchAttribute.of("gpu.nvidia.com/partition{size}")
    assert one.board.layout(match, 4) is two.board.layout(match, 4)
    other = boards.device_set(devices("l40s-1", L40S_4))
    assert other.board is not one.board and len(boards) == 2


def test_past_its_limit_the_table_starts_over_and_each_set_keeps_its_board():
    boards = Boards(limit=1)
    one = boards.device_set(devices("hgx-1"))
    other = boards.device_set(devices("l40s-1", L40S_4))
    assert len(boards) == 1 and one.board is not other.board
    again = boards.device_set(devices("hgx-2"))
    assert again.board is not one.board          # forgotten: made anew, not shared
    assert one.board.devices == again.board.devices


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Boards(limit=0)
