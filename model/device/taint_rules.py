"""DeviceTaintRules (`resource.k8s.io/v1beta2`, DR2): a taint put on the devices a selector
names, as the DRA allocator applies it on top of the ResourceSlices' own device taints.

A rule's `spec.deviceSelector` picks devices by `driver`, `pool` and `device` (each
optional, all given must match); an empty selector matches every device and no selector
none (the API's words). `spec.taint` is the taint (`key`, `value`, `effect`). Pure: the
cache feeds the parsed rules to the DRA index, which adds each rule's taint to the devices
it selects, so `SliceDevice.tainted` (and every placement) sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from model.device.dra import DeviceRef, DeviceTaint, SliceError

API_VERSION = "resource.k8s.io/v1beta2"
KIND = "DeviceTaintRule"
PLURAL = "devicetaintrules"


@dataclass(frozen=True, slots=True)
class TaintRule:
    """A DeviceTaintRule: its `name`, the selector's `driver`, `pool`, `device` (None: any),
    `selects` (False when the rule has no selector: it matches nothing) and its `taint`
    (whose `DeviceTaint.rule` is set to `name` on construction)."""

    name: str
    taint: DeviceTaint
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    selects: bool = True

    def __post_init__(self) -> None:
        # the taint names its rule (`DeviceTaint.rule`): the DRA index adds it to the
        # devices the rule selects, and a refusal names the rule from there
        if self.taint.rule != self.name:
            object.__setattr__(self, "taint", replace(self.taint, rule=self.name))

    def matches(self, ref: DeviceRef) -> bool:
        """Whether the rule's selector picks device `ref`."""
        return (self.selects and (self.driver is None or self.driver == ref.driver)
                and (self.pool is None or self.pool == ref.pool)
                and (self.device is None or self.device == ref.device))


def parse_taint_rule(obj: Mapping[str, Any]) -> TaintRule:
    """A DeviceTaintRule dict → TaintRule. Raises SliceError (naming the rule) when it has
    no name or its taint has no key, or when its `spec.deviceSelector` is not a mapping or
    gives `driver`, `pool` or `device` as anything but a non-empty string (the API server
    never serves such a rule; read as "any", such a field would widen the rule to devices
    it does not name, so the rule is refused whole and the caller logs it)."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    spec = obj.get("spec") or {}
    taint = spec.get("taint") or {}
    if not isinstance(name, str) or not name or not isinstance(taint, dict) or not taint.get("key"):
        raise SliceError(f"DeviceTaintRule {name or '?'}: no name or no spec.taint.key")
    sel = spec.get("deviceSelector")
    if sel is not None and not isinstance(sel, dict):
        raise SliceError(f"DeviceTaintRule {name}: spec.deviceSelector is not a mapping")

    def one(field: str) -> str | None:
        value = sel.get(field) if isinstance(sel, dict) else None
        if value is not None and (not isinstance(value, str) or not value):
            raise SliceError(f"DeviceTaintRule {name}: spec.deviceSelector.{field} is not a "
                             f"non-empty string: {value!r}")
        return value

    return TaintRule(name, DeviceTaint(str(taint["key"]), str(taint.get("value") or ""),
                                       str(taint.get("effect") or "")),
                     one("driver"), one("pool"), one("device"), selects=isinstance(sel, dict))


__all__ = ["API_VERSION", "KIND", "PLURAL", "TaintRule", "parse_taint_rule"]
