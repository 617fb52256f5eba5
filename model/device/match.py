"""A GPUClass's `spec.topology.matchAttribute` as a value (docs/contract.md §3b, DR3): the
qualified attribute every device of one class's share of a set must agree on, sized
(`gpu.nvidia.com/partition{size}`: `{size}` is the set's count of the class) or not
(`resource.kubernetes.io/pcieRoot`). Pure; no class without a constraint has one (None)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

SIZE_PLACEHOLDER = "{size}"
"""The placeholder in `spec.topology.matchAttribute` replaced by the set's count (DR3)."""

MODULE_ID = "gpuModuleID"
"""The attribute id (in the matchAttribute's domain) naming a GPU's module on an HGX board."""


@dataclass(frozen=True, slots=True)
class MatchAttribute:
    """The text of a matchAttribute (`text`), and what a decision and the operator's view ask
    of it: whether it is `sized`, the attribute it names for a count (`resolve`), the sizes
    the devices of a node carry (`sizes_present`), and how its groups are called (`noun`)
    and labelled by module (`module_attribute`). `str()` gives the text back."""

    text: str

    @staticmethod
    def of(text: "str | MatchAttribute | None") -> MatchAttribute | None:
        """The value of a class's matchAttribute (None: the class has no constraint); a
        MatchAttribute is returned as it is."""
        if text is None or isinstance(text, MatchAttribute):
            return text
        return MatchAttribute(text)

    @property
    def sized(self) -> bool:
        """Whether the attribute carries `{size}` (a partition per size, DR3)."""
        return SIZE_PLACEHOLDER in self.text

    def resolve(self, count: int) -> str:
        """The qualified attribute for a share of `count` devices (`{size}` replaced by it).
        Raises ValueError for a count below 1."""
        if count < 1:
            raise ValueError(f"a set takes at least one device of a class, got {count}")
        return self.text.replace(SIZE_PLACEHOLDER, str(count))

    def sizes_present(self, devices: Iterable) -> tuple[int, ...]:
        """The sizes n for which some device (a `model.device.topology.Device`: its
        `attributes` pairs) carries the attribute resolved for n, sorted; () unsized."""
        if not self.sized:
            return ()
        prefix, _, suffix = self.text.partition(SIZE_PLACEHOLDER)
        pattern = re.compile(re.escape(prefix) + r"(\d+)" + re.escape(suffix) + r"\Z")
        found = {int(m.group(1)) for device in devices for key, _ in device.attributes
                 if (m := pattern.match(key))}
        return tuple(sorted(found))

    def carried_by(self, attributes: Iterable[tuple[str, object]]) -> bool:
        """Whether a device's `attributes` (qualified name, value pairs) carry this
        attribute: for a sized one, resolved for some size (a device with only `partition1`
        carries `partition{size}`); else the attribute itself. A device that does not is in
        no group of the class whatever the set's size (HL3 `attribute-lost`)."""
        if not self.sized:
            return any(key == self.text for key, _ in attributes)
        prefix, _, suffix = self.text.partition(SIZE_PLACEHOLDER)
        return any(key.startswith(prefix) and key.endswith(suffix)
                   and key[len(prefix):len(key) - len(suffix)].isdigit()
                   and len(key) > len(prefix) + len(suffix) for key, _ in attributes)

    @property
    def noun(self) -> str:
        """What a group is called: the attribute's id without `{size}` ("partition",
        "pcieRoot")."""
        return self.text.rpartition("/")[2].replace(SIZE_PLACEHOLDER, "") or self.text

    @property
    def module_attribute(self) -> str | None:
        """`<domain>/gpuModuleID` when the attribute has a domain, else None."""
        if "/" not in self.text:
            return None
        return f"{self.text.rpartition('/')[0]}/{MODULE_ID}"

    def __str__(self) -> str:
        return self.text


__all__ = ["MODULE_ID", "SIZE_PLACEHOLDER", "MatchAttribute"]
