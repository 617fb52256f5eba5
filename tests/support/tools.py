"""For the e2e tests of the operator's tools: a pool with a tenant user of its own (and its
kubeconfig), minimal VMI bodies with gpu annotations, and the installed console script run
against the test's control plane (directly, or as the `kubectl gpu` plugin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e import helpers
from tests.e2e.conftest import TENANT_GROUP, unique

BIN = Path(sys.executable).parent


class Pool:
    """A class of its own resource, nodes advertising it, and a tenant with a user of its
    own (tenant and VMI-editor roles), `held` held devices and an optional budget."""

    def __init__(self, res, cls, nodes, tenant, kubeconfig, held):
        self.res, self.cls, self.nodes, self.tenant = res, cls, nodes, tenant
        self.kubeconfig, self.held = kubeconfig, held


async def make_pool(system, fleet, control_plane, tmp_path, nodes: dict[str, int], *,
                    held: int = 0, budget: int | None = None, on_cordon: str = "Move") -> Pool:
    """`helpers.make_pool` with a tenant user of its own (and its kubeconfig) and `held`
    held devices named `held-<i>`, once `system`'s replicas have it all."""
    tenant_user = f"user-{unique('t')}"
    res, cls, names, tenant, devs = await helpers.make_pool(
        fleet, nodes, budget=budget, devices=held, prefix="held", on_cordon=on_cordon,
        seen_by=system, user=tenant_user)
    kubeconfig = control_plane.write_user_kubeconfig(tmp_path / f"{tenant}.kubeconfig", tenant_user,
                                                     (TENANT_GROUP,), namespace=tenant)
    return Pool(res, cls, names, tenant, kubeconfig, devs)


def vmi(name: str, ns: str, *, templates: str | None = None, devices: str | None = None,
        selector: dict | None = None) -> dict:
    """A minimal VMI `name` in `ns` with the gpu annotations given and a nodeSelector."""
    ann = {}
    if templates:
        ann["gpu.cozystack.io/templates"] = templates
    if devices:
        ann["gpu.cozystack.io/devices"] = devices
    spec: dict = {"domain": {"devices": {}, "resources": {"requests": {"memory": "64M"}}}}
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": ns, "annotations": ann}, "spec": spec}


def run_tool(control_plane, *args: str, plugin: bool = False) -> subprocess.CompletedProcess:
    """The installed console script; with `plugin`, through real `kubectl gpu …` discovery
    (kubectl finds `kubectl-gpu` on PATH)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(control_plane.admin_kubeconfig)}
    cmd = ([str(control_plane.binaries.kubectl), "gpu", *args] if plugin
           else [str(BIN / "gpu-binder"), *args])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
