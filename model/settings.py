"""The settings ConfigMap's data, computed purely (docs/contract.md §2 "Settings ConfigMap", H3).

`data.resourceNames` is the effective resource-name set of the GPUClasses, sorted and
comma-separated; `data.rawResourceNames` is `RAW_ALLOWED` or `RAW_DENIED`.
"""

from __future__ import annotations

from typing import Iterable

from model.device.seam import device_classes
from model.types import GPUClass, dra_resource_name

RAW_ALLOWED = "allowed"
"""`data.rawResourceNames`: tenants may request the GPU resource names directly."""

RAW_DENIED = "denied"
"""`data.rawResourceNames`: the shipped policies refuse direct requests of those names."""


def resource_names(classes: Iterable[GPUClass]) -> tuple[str, ...]:
    """The effective resource-name set: every count-mode class's `resource_name`, unique,
    sorted (device-mode classes name DeviceClasses, not extended resources: DR1). A class
    that cannot serve because it names both (`problem`) still names an extended resource
    the operator manages: it is kept in the set, so the raw-resource policy goes on
    refusing tenants' direct requests of it while the class is mended."""
    classes = list(classes)
    device = device_classes(classes)
    return tuple(sorted({c.resource_name for c in classes if c.resource_name and (
        c.name not in device or c.resource_name != dra_resource_name(c.device_class_name))}))


def device_class_names(classes: Iterable[GPUClass]) -> tuple[str, ...]:
    """The managed DeviceClasses: every device-mode class's `device_class_name`, unique,
    sorted (`data.deviceClassNames`; under `rawResourceNames: denied` tenants may not claim
    them themselves, DR5)."""
    return tuple(sorted({c.device_class_name for c in classes if c.device_class_name}))


def format_resource_names(names: Iterable[str]) -> str:
    """`data.resourceNames` for `names`: sorted, unique, comma-separated, no spaces
    ("" for none)."""
    return ",".join(sorted(set(names)))
