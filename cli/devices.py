"""HL3 in the operator's tools (docs/device-mode.md, "Nothing lost silently"): `top`'s device
totals per device-mode class, adding up, with the lost devices named, and `explain`'s lines on a set's lost devices
and (HL1) its records on tainted devices.
Text only; the values are `model.lost`'s and `model.device.lost`'s."""

from __future__ import annotations

from model.explain import Explanation, Top

LOST_SHOWN = 20
"""Most lost devices `top` names (the rest are counted; `--json` lists all)."""


def device_total_lines(t: Top) -> list[str]:
    """After `top`'s tables: per device-mode class "published (+ recorded unpublished) =
    free + used + held + lost + tainted", then the lost devices, each with why; nothing in
    count mode."""
    if not t.devices:
        return []
    width = max(len(c.class_name) for c in t.devices)
    out = ["", "DEVICES (device mode; a lost device is never free: HL3)"]
    out += [f"{c.class_name:<{width}}  {c.render()}" for c in t.devices]
    if t.lost:
        out.append("LOST (the record is kept until the device returns or the set is placed again):")
        out += [f"  {x.node} {x.device} ({x.class_name}, {x.reason.value}): "
                + (", ".join(f"{ns}/{n}" for ns, n in x.records) or "not recorded")
                for x in t.lost[:LOST_SHOWN]]
        if len(t.lost) > LOST_SHOWN:
            out.append(f"  … and {len(t.lost) - LOST_SHOWN} more (--json lists all)")
        if any(x.reason.value == "attribute-lost" for x in t.lost):
            out.append("  attribute-lost: published without the class's matchAttribute "
                       "(dra-driver-nvidia-gpu#1331: unbind the GPU from vfio-pci and restart "
                       "the driver's plugin; docs/troubleshooting.md)")
    return out


def lost_lines(e: Explanation) -> list[str]:
    """`explain`: one line per lost device of the set (which, and why)."""
    return [f"lost: {x.render()}" for x in e.lost]


def tainted_lines(e: Explanation) -> list[str]:
    """`explain`: one line per record of the set on a tainted device (HL1: which, the taint
    and what put it there, and what the binder does about it)."""
    return [f"tainted: {x.render()}" for x in e.tainted]


__all__ = ["LOST_SHOWN", "device_total_lines", "lost_lines", "tainted_lines"]
