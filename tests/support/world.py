"""Builders of model values for the table tests (tests/model and the tests that feed the
model's values to metrics and the command line): nodes with H100/L40S allocatable, classes,
devices (Bound or Pending, with a bind request, attached to a VMI, a VMI's template), a
snapshot from them, and the small what-if cluster with its live VMIs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from model.snapshot import Snapshot
from model.types import (
    Attachment,
    BindRequest,
    DeviceStatus,
    GPUClass,
    GPUDevice,
    LabelSelector,
    Node,
    OnCordon,
    Phase,
    Result,
)

H = "nvidia.com/H100"
L = "nvidia.com/L40S"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
NS = "tenant-a"


def node(name: str, h: int = 0, l: int = 0, *, cordoned: bool = False, **labels: str) -> Node:
    """A schedulable Node with `h` H100 and `l` L40S allocatable (a zero is not listed),
    cordoned or not, with `labels` beside `kubevirt.io/schedulable`."""
    alloc = tuple((r, n) for r, n in ((H, h), (L, l)) if n)
    labels = {"kubevirt.io/schedulable": "true", **labels}
    return Node(name, tuple(sorted(labels.items())), alloc, cordoned)


def gpu_class(name: str = "h100", res: str = H, *, stay: bool = False, selector: dict | None = None,
              tenants: LabelSelector | None = None) -> GPUClass:
    """A GPUClass of resource `res`: `Move` on cordon unless `stay`; `selector` its node
    selector, `tenants` its namespace selector."""
    return GPUClass(name, res, OnCordon.STAY if stay else OnCordon.MOVE,
                    tuple(sorted((selector or {}).items())), tenants)


def dev(name: str, on: str | None = None, cls: str = "h100", ns: str = NS, *,
        rid: str | None = None, devices: tuple[str, ...] | None = None,
        result: Result | None = None, at: datetime | None = None) -> GPUDevice:
    """A GPUDevice of class `cls` in `ns`, Bound on `on` (since NOW) or Pending; with `rid`
    it carries a bind request of VMI vm-1 for `devices` (default itself), made `at`, with
    `result`."""
    br = None
    if rid is not None:
        br = BindRequest(rid, "vm-1", devices if devices is not None else (name,), at, result=result)
    status = DeviceStatus(Phase.BOUND if on else Phase.PENDING, on, NOW if on else None, None, br)
    return GPUDevice(ns, name, cls, status=status)


def world(nodes, devices=(), classes=None, **kw) -> Snapshot:
    """A Snapshot of `nodes`, `devices` and `classes` (default: the h100 class); `kw` goes
    to `Snapshot.build` (budgets, namespaces, reservations)."""
    classes = classes if classes is not None else [gpu_class()]
    return Snapshot.build(nodes=nodes, classes=classes, devices=devices, **kw)


CLASSES = [gpu_class(), gpu_class("l40s", L), gpu_class("stay", H, stay=True)]
"""h100 and l40s (`Move`), and stay: H100 that stays on a cordoned node."""


def attached(d: GPUDevice, vmi: str = "vm-x") -> GPUDevice:
    """`d` attached to `vmi` since an hour before NOW."""
    st = d.status
    return GPUDevice(d.namespace, d.name, d.class_name, d.template_for,
                     DeviceStatus(st.phase, st.node_name, st.bound_at,
                                  Attachment(vmi, NOW - timedelta(hours=1))))


def template(name: str, vmi: str, on: str | None, cls: str = "h100", ns: str = NS) -> GPUDevice:
    """`vmi`'s template device `name` (attached to it), Bound on `on` or Pending."""
    st_ = DeviceStatus(Phase.BOUND if on else Phase.PENDING, on, NOW if on else None,
                       Attachment(vmi, NOW - timedelta(hours=1)))
    return GPUDevice(ns, name, cls, template_for=vmi, status=st_)


def what_if_cluster() -> Snapshot:
    """Three nodes; on n1 a live VMI's device and template (vm-a), an idle device of
    tenant-b and a `Stay` device of tenant-s's live VMI (vm-s): `LIVE` names the live VMIs."""
    a1 = attached(dev("a-1", on="n1"), "vm-a")
    ta = template("vm-a-h100-0", "vm-a", "n1")
    idle = dev("i-1", on="n1", ns="tenant-b")
    s1 = attached(dev("s-1", on="n1", cls="stay", ns="tenant-s"), "vm-s")
    return Snapshot.build(nodes=[node("n1", h=4, l=1), node("n2", h=2), node("n3", h=1)],
                          classes=[gpu_class(), gpu_class("stay", L, stay=True)],
                          devices=[a1, ta, idle, s1])


LIVE = {(NS, "vm-a"), ("tenant-s", "vm-s")}
