"""The settings ConfigMap's data, computed purely (DESIGN.md §2 "Settings ConfigMap", H3).

`data.resourceNames` is the effective resource-name set of the GPUClasses, sorted and
comma-separated; `data.rawResourceNames` is `RAW_ALLOWED` or `RAW_DENIED`.
"""

from __future__ import annotations

from typing import Iterable

from model.types import GPUClass

RAW_ALLOWED = "allowed"
"""`data.rawResourceNames`: tenants may request the GPU resource names directly."""

RAW_DENIED = "denied"
"""`data.rawResourceNames`: the shipped policies refuse direct requests of those names."""


def resource_names(classes: Iterable[GPUClass]) -> tuple[str, ...]:
    """The effective resource-name set: every class's `resource_name`, unique, sorted."""
    return tuple(sorted({c.resource_name for c in classes}))


def format_resource_names(names: Iterable[str]) -> str:
    """`data.resourceNames` for `names`: sorted, unique, comma-separated, no spaces
    ("" for none)."""
    return ",".join(sorted(set(names)))
