"""The operator's tools against the real API server (issue 15): `explain`, `what-if`, `top`
read the cluster with the operator's kubeconfig, and each verdict is then checked against
what an actual admission does — the VMI created through the tenant's own kubeconfig, with
the webhook and the binder of the `system` fixture's two replicas in the path."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes_asyncio.client import ApiException, CustomObjectsApi

from cli.tools import explain_vmi, read_cluster, render_explain
from model.explain import top
from model.line import DEFAULT_RETRY_GRACE, RETRY_AFTER
from model.reasons import BudgetExhausted, Code, NoRoom, SetNeeds
from model.what_if import what_if
from tests.e2e import helpers
from tests.e2e.helpers import eventually
from tests.support.tools import Pool, make_pool, run_tool, vmi

pytestmark = pytest.mark.anyio
VMIS = ("kubevirt.io", "v1")


async def admit(tenant_client, pool: Pool, body: dict) -> tuple[bool, str]:
    """Create the VMI as the tenant (webhook in the path): (admitted, pinned node or the
    denial message)."""
    api = CustomObjectsApi(await tenant_client(pool.kubeconfig))
    try:
        made = await api.create_namespaced_custom_object(*VMIS, pool.tenant,
                                                         "virtualmachineinstances", body)
    except ApiException as exc:
        return False, json.loads(exc.body).get("message", "") if exc.body else str(exc)
    return True, made["spec"]["nodeSelector"]["kubernetes.io/hostname"]


async def delete_and_release(fleet, pool: Pool, name: str) -> None:
    """Delete the VMI and wait until housekeeping released its devices (H2)."""
    await fleet.custom.delete_namespaced_custom_object(*VMIS, pool.tenant,
                                                       "virtualmachineinstances", name)

    async def released():
        got = await fleet.custom.list_namespaced_custom_object(
            "gpu.cozystack.io", "v1alpha1", pool.tenant, "gpudevices")
        return all("attachedTo" not in (d.get("status") or {}) for d in got["items"])
    await eventually(released, timeout=15, what="H2 release")


async def cluster(control_plane):
    return await read_cluster(str(control_plane.admin_kubeconfig))


# --- explain ------------------------------------------------------------------------------


async def test_B4_explain_says_fits_on_node_and_admission_pins_it_there(
        system, fleet, control_plane, tenant_client, tmp_path):
    pool = await make_pool(system, fleet, control_plane, tmp_path, {"a": 4, "b": 2})
    body = vmi("vm-1", pool.tenant, templates=f"{pool.cls}=2")
    manifest = tmp_path / "vm-1.yaml"
    manifest.write_text(yaml.safe_dump(body))
    e = explain_vmi(await cluster(control_plane), body, grace=8, now=_now())
    assert e.admitted and e.rule == "B1" and e.node == pool.nodes["b"]  # tightest fit (B4)
    by = {v.node: v for v in e.nodes}
    assert by[pool.nodes["a"]].fits and not by[pool.nodes["a"]].chosen
    assert by[pool.nodes["b"]].chosen
    # the same answer from the console script and from the kubectl plugin
    for plugin in (False, True):
        out = run_tool(control_plane, "explain", "-f", str(manifest), plugin=plugin)
        assert out.returncode == 0, out.stderr
        assert f"verdict: admitted on {pool.nodes['b']} (B1): bind vm-1-{pool.cls}-0, " \
               f"vm-1-{pool.cls}-1" in out.stdout
    ok, node = await admit(tenant_client, pool, body)
    assert ok, node
    assert node == e.node
    # explained again once admitted: already placed there (B6)
    e2 = explain_vmi(await cluster(control_plane), body, grace=8, now=_now())
    assert (e2.admitted, e2.node, e2.rule, e2.moves) == (True, node, "B6", ())
    out = run_tool(control_plane, "explain", f"{pool.tenant}/vm-1", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["admitted"], got["node"], got["rule"]) == (True, node, "B6")
    out = run_tool(control_plane, "explain", f"{pool.tenant}/no-such-vmi")
    assert (out.returncode, out.stderr) == (2, f"gpu-binder explain: no VMI or VirtualMachine "
                                               f"{pool.tenant}/no-such-vmi found (use -f FILE "
                                               "for one not created yet)\n")


async def test_W1_explain_says_budget_and_admission_is_denied_with_that_message(
        system, fleet, control_plane, tenant_client, tmp_path):
    pool = await make_pool(system, fleet, control_plane, tmp_path, {"a": 4}, budget=1)
    body = vmi("vm-b", pool.tenant, templates=f"{pool.cls}=2")
    e = explain_vmi(await cluster(control_plane), body, grace=8, now=_now())
    assert not e.admitted
    assert e.budget_short == ((pool.res, 1),)
    assert e.set_problems == (BudgetExhausted(pool.tenant, pool.res, bound=0, budget=1, adds=2),)
    ok, msg = await admit(tenant_client, pool, body)
    assert not ok
    assert msg.endswith(e.message), (msg, e.message)
    assert e.reason.code is Code.BUDGET_EXHAUSTED
    # the tenant's own kubeconfig may not list the cluster: a clear error, nothing else
    out = run_tool(control_plane, "top", "--kubeconfig", str(pool.kubeconfig))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("gpu-binder top: cannot read the cluster: list ")
    assert " 403 " in out.stderr, out.stderr


async def test_B1_explain_refused_for_room_names_each_node_and_the_change(
        system, fleet, control_plane, tenant_client, tmp_path):
    pool = await make_pool(system, fleet, control_plane, tmp_path, {"a": 2, "b": 1}, held=1)
    # held-0 is placed on a by a first VMI, which is then deleted: idle on a
    ok, node = await admit(tenant_client, pool, vmi("warm", pool.tenant, devices="held-0",
                                                    selector={"kubernetes.io/hostname":
                                                              pool.nodes["a"]}))
    assert ok and node == pool.nodes["a"], node
    await delete_and_release(fleet, pool, "warm")
    # a VMI wants 2 new devices: a has 1 free (held-0 idle there), b 1
    body = vmi("vm-2", pool.tenant, templates=f"{pool.cls}=2")
    e = explain_vmi(await cluster(control_plane), body, grace=8, now=_now())
    assert not e.admitted
    by = {v.node: v.reasons for v in e.nodes}
    assert by[pool.nodes["a"]] == (NoRoom(pool.res, needs=2, free=1),)
    assert by[pool.nodes["b"]] == (NoRoom(pool.res, needs=2, free=1),)
    first = e.shortfalls[0]  # moving idle held-0 away from a would do it
    assert (first.node, first.missing, first.idle, first.short) == (
        pool.nodes["a"], ((pool.res, 1),), (((pool.tenant, "held-0"), pool.nodes["b"]),), ())
    text = render_explain(e)
    assert f"{pool.nodes['a']} (1 × {pool.res} missing): move idle {pool.tenant}/held-0 to " \
           f"{pool.nodes['b']}" in text
    ok, msg = await admit(tenant_client, pool, body)
    assert not ok
    # explain's words are W1's; the bare VMI refused for room waits in the line (P5): the
    # webhook's answer is those words, then the line's (503 with Retry-After)
    assert msg.endswith(f"denied the request: {e.message}; the set waits in the line for room: retry "
                        f"after {RETRY_AFTER} s (its place is kept while the create is retried, lost "
                        f"after {int(DEFAULT_RETRY_GRACE.total_seconds())} s without one)"), (msg, e.message)
    # the change explain named, made: held-0 moved to b (by a VMI pinned there), released
    ok, node = await admit(tenant_client, pool, vmi("mover", pool.tenant, devices="held-0",
                                                    selector={"kubernetes.io/hostname":
                                                              pool.nodes["b"]}))
    assert ok and node == pool.nodes["b"], node
    await delete_and_release(fleet, pool, "mover")
    e = explain_vmi(await cluster(control_plane), body, grace=8, now=_now())
    assert e.admitted and e.node == pool.nodes["a"]
    ok, node = await admit(tenant_client, pool, body)
    assert ok and node == pool.nodes["a"], node


# --- what-if ------------------------------------------------------------------------------


async def test_B5_what_if_cordon_says_moves_to_and_readmission_does(
        system, fleet, control_plane, tenant_client, tmp_path):
    pool = await make_pool(system, fleet, control_plane, tmp_path, {"a": 2, "b": 3}, held=2)
    ok, node = await admit(tenant_client, pool, vmi("vm-w", pool.tenant,
                                                    devices="held-0,held-1"))
    assert ok and node == pool.nodes["a"], node  # tightest fit
    c = await cluster(control_plane)
    w = what_if(c.snapshot, "cordon", [pool.nodes["a"]], live_vmis=c.live_vmis, now=_now())
    [o] = [o for o in w.outcomes if o.set.namespace == pool.tenant]
    assert (o.set.vmi, o.set.running, o.action, o.rule, o.node) == (
        "vm-w", True, "move", "B1", pool.nodes["b"])
    assert not o.stranded
    out = run_tool(control_plane, "what-if", "cordon", pool.nodes["a"], "--json", plugin=True)
    assert out.returncode == 0, out.stderr
    got = [x for x in json.loads(out.stdout)["outcomes"] if x["set"]["namespace"] == pool.tenant]
    assert [(x["action"], x["node"], x["rule"]) for x in got] == [("move", pool.nodes["b"], "B1")]
    # now for real: cordon, the VMI restarts (deleted, created again) and lands on b
    await fleet.cordon(pool.nodes["a"])
    await delete_and_release(fleet, pool, "vm-w")
    await helpers.replicas_saw(system, {"nodes": await helpers.node_rv(fleet, pool.nodes["a"])},
                               what="the cordon")
    ok, node = await admit(tenant_client, pool, vmi("vm-w", pool.tenant,
                                                    devices="held-0,held-1"))
    assert ok and node == o.node, node
    devs = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1",
                                                            pool.tenant, "gpudevices")
    assert {d["status"]["nodeName"] for d in devs["items"]} == {pool.nodes["b"]}


async def test_B5b_what_if_drain_says_stay_and_stranded_and_readmission_waits_there(
        system, fleet, control_plane, tenant_client, tmp_path):
    pool = await make_pool(system, fleet, control_plane, tmp_path, {"a": 2, "b": 2}, held=1,
                           on_cordon="Stay")
    ok, node = await admit(tenant_client, pool, vmi("vm-s", pool.tenant, devices="held-0"))
    assert ok and node == pool.nodes["a"], node
    out = run_tool(control_plane, "what-if", "drain", pool.nodes["a"])
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if f"{pool.tenant}/vm-s" in x)
    assert line == (f"  {pool.tenant}/vm-s (running) on {pool.nodes['a']} [held-0]: stays on "
                    f"{pool.nodes['a']} (B5b); the VMI waits for the cordon to lift  STRANDED")
    assert f"{pool.tenant}/vm-s" in next(x for x in out.stdout.splitlines()
                                          if x.startswith("evicted: "))
    assert f"{pool.tenant}/vm-s" in next(x for x in out.stdout.splitlines()
                                          if x.startswith("stranded: "))
    # now for real: cordon, the VMI stops and is created again: kept on a, waiting (B5b)
    await fleet.cordon(pool.nodes["a"])
    await delete_and_release(fleet, pool, "vm-s")
    await helpers.replicas_saw(system, {"nodes": await helpers.node_rv(fleet, pool.nodes["a"])},
                               what="the cordon")
    c = await cluster(control_plane)
    w = what_if(c.snapshot, "drain", [pool.nodes["a"]], live_vmis=c.live_vmis, now=_now())
    [o] = [o for o in w.outcomes if o.set.namespace == pool.tenant]
    assert (o.set.vmi, o.action, o.rule, o.node) == (None, "stay", "B5b", pool.nodes["a"])
    ok, node = await admit(tenant_client, pool, vmi("vm-s", pool.tenant, devices="held-0"))
    assert ok and node == pool.nodes["a"], node


# --- top ----------------------------------------------------------------------------------


async def test_top_largest_placeable_set_is_what_admission_places_and_metrics_agree(
        system, fleet, control_plane, tenant_client, tmp_path):
    pool = await make_pool(system, fleet, control_plane, tmp_path, {"a": 3, "b": 2}, held=1,
                           budget=10)
    ok, node = await admit(tenant_client, pool, vmi("vm-t", pool.tenant, devices="held-0",
                                                    templates=f"{pool.cls}=1"))
    assert ok and node == pool.nodes["b"], node  # tightest fit: b has 2
    c = await cluster(control_plane)
    t = top(c.snapshot, c.live_vmis)
    [fig] = [x for x in t.classes if x.class_name == pool.cls]
    assert (fig.bound, fig.attached, fig.awaiting, fig.idle, fig.free, fig.largest) == (
        2, 2, 0, 0, 3, 3)
    assert [(n.node, n.bound, n.free, n.largest) for n in fig.nodes] == [
        (pool.nodes["a"], 0, 3, 3), (pool.nodes["b"], 2, 0, 0)]
    [budget] = [x for x in t.tenants if x.namespace == pool.tenant]
    assert (budget.resource, budget.used, budget.hard) == (pool.res, 2, 10)
    out = run_tool(control_plane, "top")
    assert out.returncode == 0, out.stderr
    # the class total's columns: BOUND ATTACHED AWAITING IDLE FREE LARGEST
    assert any(line.split() == [pool.cls, "=", "all", f"({pool.res})", "2", "2", "0", "0", "3", "3"]
               for line in out.stdout.splitlines()), out.stdout

    # every replica exports the same figures (computed from its own cache)
    def figure(text: str, name: str) -> float | None:
        for line in text.splitlines():
            if line.startswith(f'{name}{{class="{pool.cls}"'):
                return float(line.rsplit(" ", 1)[1])
        return None

    async def exported():
        texts = [system.metrics(i) for i in range(2)]
        return all(figure(x, "gpu_binder_class_largest_placeable_set") == 3
                   and figure(x, "gpu_binder_class_bound_devices") == 2 for x in texts)
    await eventually(exported, timeout=30, what="fleet metrics on both replicas")  # 10 s reuse
    # largest 3: a set of 4 is refused, a set of 3 is admitted (on a)
    ok, msg = await admit(tenant_client, pool, vmi("vm-4", pool.tenant, templates=f"{pool.cls}=4"))
    assert not ok and SetNeeds(pool.cls, pool.res, needs=4, most_free=3).render() in msg, msg
    ok, node = await admit(tenant_client, pool, vmi("vm-3", pool.tenant, templates=f"{pool.cls}=3"))
    assert ok and node == pool.nodes["a"], node


def _now():
    from datetime import datetime, timezone
    return datetime.now(timezone.utc)
