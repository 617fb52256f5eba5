"""The one table of boards by look (`Boards`): a node's devices of a class become a
`DeviceSet` whose `Board` (the layouts a decision works out, `model.device.topology`) is
shared with every other node whose devices look the same, so 1,000 identical HGX boards work
out each layout once. Owned by whoever builds Nodes (the DRA index, `k8s.dra_index`; the
benchmarks that build fleets by hand), never module-level state (docs/contract.md §3b DR3)."""

from __future__ import annotations

from model.device.dra import DeviceSet, SliceDevice
from model.device.topology import Board, Device


class Boards:
    """Boards by the topology view of their devices (`SliceDevice.as_device`: name and
    attributes, in order). At most `limit` are kept; past it the table starts over (a Node
    keeps its own board, so nothing is lost but sharing). Raises ValueError for a limit below 1."""

    __slots__ = ("limit", "_by_view")

    def __init__(self, limit: int = 4_096) -> None:
        if limit < 1:
            raise ValueError(f"a table of boards keeps at least 1, not {limit}")
        self.limit = limit
        self._by_view: dict[tuple[Device, ...], Board] = {}

    def __len__(self) -> int:
        return len(self._by_view)

    def device_set(self, devices: tuple[SliceDevice, ...]) -> DeviceSet:
        """`devices` (a node's of one class, sorted by ref) as a Node keeps them, with the
        board of the devices that look the same."""
        view = tuple(d.as_device() for d in devices)
        board = self._by_view.get(view)
        if board is None:
            if len(self._by_view) >= self.limit:
                self._by_view.clear()
            board = self._by_view[view] = Board(view)
        return DeviceSet(devices, board)
