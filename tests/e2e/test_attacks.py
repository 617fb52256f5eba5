"""Hostile tenants against admission and housekeeping (issue 13), through the real API server
with the shipped webhook configuration and policies and two controller replicas.

Items 2 (same-name re-create), 3 (restart race), 4 (deleting in-use devices), 6 (H2
level-based) and 8 (dry run) of the issue; then 1 (forged AdmissionReviews: W6 caller
authentication), 11 (failure isolation: matchConditions, serving certificate rotation), 10
(least privilege: the replicas on the shipped ServiceAccount) and 9 (bounded memory); each
test names the rule it protects. Item 5 (raw GPU bypasses) is in test_manifests.py, beside
the policy tests (no controller there to overwrite the settings ConfigMap).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import ssl
import time
import uuid
from datetime import datetime, timezone

import anyio
import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from model.line import DEFAULT_RETRY_GRACE, RETRY_AFTER
from model.reasons import (CannotPlace, DeviceBeingDeleted, NodeProblems, NoEligibleNode, NoRoom,
                           SetNeeds, WaitsInLine)
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, unique
from tests.e2e.helpers import (
    class_rv,
    device_rv,
    eventually,
    housekeeping_rounds,
    make_pool,
    namespace_rv,
    replicas_saw,
)
from tests.support.vmis import annotated, client_ssl, create, create_denied, fixture, review
from tests.support.vmis import devices as device_items


def _no_room(ns: str, vmi: str, cls: str, res: str, node: str, needs: int, free: int,
             largest: int | None = None) -> CannotPlace:
    """W1's denial of a set of `needs` new units of `cls` when its one node has `free`
    (`largest`: its allocatable, when smaller than the set: it says no node has that many)."""
    return CannotPlace(ns, vmi, (SetNeeds(cls, res, needs, free, largest,
                                          needs if largest is not None else 0),
                                 NoEligibleNode((NodeProblems(node, (NoRoom(res, needs, free),)),))))


def _in_line(refusal) -> str:
    """The webhook's words for a bare VMI refused for room at W1 that now waits in the line
    (P5, `--line-bare-vmis` on by default): W1's refusal, then the line's, with the default
    Retry-After and `line.retryGrace`."""
    return WaitsInLine(refusal, RETRY_AFTER, int(DEFAULT_RETRY_GRACE.total_seconds())).render()


pytestmark = pytest.mark.anyio
GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"
VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"
GRACE = 8.0  # --attachment-grace of FAST_CONTROLLER_ARGS


def vmi_body(name: str, *, templates: str | None = None, devices: str | None = None,
             node_selector: dict[str, str] | None = None) -> dict:
    ann = {}
    if templates:
        ann["gpu.cozystack.io/templates"] = templates
    if devices:
        ann["gpu.cozystack.io/devices"] = devices
    spec: dict = {"domain": {"devices": {}}}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "annotations": ann}, "spec": spec}


async def get_vmi(fleet, ns: str, name: str) -> dict | None:
    try:
        return await fleet.custom.get_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns,
                                                               VMIS, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def delete_vmi(fleet, ns: str, name: str) -> None:
    await fleet.custom.delete_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS, name)


async def devices(fleet, ns: str) -> dict[str, dict]:
    got = await fleet.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpudevices")
    return {d["metadata"]["name"]: d for d in got["items"]}


def pinned(vmi: dict) -> str:
    return vmi["spec"]["nodeSelector"]["kubernetes.io/hostname"]


async def assert_vmi_holds_its_set(fleet, ns: str, name: str) -> None:
    """Invariant 5 for one running VMI: every device its spec names exists, is attached to it
    (by the admission its annotation names), and is Bound on the node it is pinned to."""
    vmi = await get_vmi(fleet, ns, name)
    assert vmi is not None, f"VMI {name} does not exist"
    node = pinned(vmi)
    names = [g["name"] for g in vmi["spec"]["domain"]["devices"]["gpus"]]
    have = await devices(fleet, ns)
    admission = (vmi["metadata"].get("annotations") or {}).get("gpu.cozystack.io/admission")
    for n in names:
        assert n in have, f"device {n} of running VMI {name} is gone"
        st = have[n].get("status") or {}
        att = st.get("attachedTo") or {}
        assert att.get("vmi") == name, f"device {n} of running VMI {name} is attached to {att}"
        if admission is not None:
            # The incarnation's ids (model.housekeeping.incarnation): the attachment's
            # admission, or the id of the device's bind request for that VMI — two creates of
            # one name racing, the one stored may carry the request's id while a W4 take-over
            # by the other re-keyed the attachment.
            br = st.get("bindRequest") or {}
            ids = {att.get("admission")} | ({br.get("id")} if br.get("vmi") == name else set())
            assert admission in ids, (n, att, br, admission)
        assert (st.get("phase"), st.get("nodeName")) == ("Bound", node), (n, st)


# -- item 2: same-name re-create ----------------------------------------------------------

async def test_W1_create_of_a_live_vmi_name_neither_moves_nor_strips_its_devices(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 2, "b": 2}, devices=1,
                                                    seen_by=system)
    first = vmi_body("vm", devices="gpu-0",
                     node_selector={"kubernetes.io/hostname": nodes["a"]})
    ok, spec = await create(fleet, tenant, first)
    assert ok, spec
    before = (await devices(fleet, tenant))["gpu-0"]["status"]
    assert before["nodeName"] == nodes["a"]
    # the same name again with a larger set (no W4 short cut), asking for node b: the
    # binder would move the running VM's device there ...
    ok, msg = await create(fleet, tenant, vmi_body(
        "vm", devices="gpu-0", templates=f"{cls}=1",
        node_selector={"kubernetes.io/hostname": nodes["b"]}))
    assert not ok
    # ... and once more with a selector no node matches (the binder refuses; W5 clean-up)
    ok2, msg2 = await create(fleet, tenant, vmi_body(
        "vm", devices="gpu-0", templates=f"{cls}=1", node_selector={"zone": "nowhere"}))
    assert not ok2
    print("denials:", msg, "|", msg2)
    after = (await devices(fleet, tenant))["gpu-0"]["status"]
    assert after["nodeName"] == nodes["a"], "the running VMI's device was moved"
    assert after.get("attachedTo", {}).get("vmi") == "vm", "the running VMI's device was stripped"
    assert after["bindRequest"]["id"] == before["bindRequest"]["id"]
    assert "already exists" in msg and "already exists" in msg2
    await assert_vmi_holds_its_set(fleet, tenant, "vm")


async def test_W3_concurrent_creates_of_one_new_name_leave_the_winner_its_whole_set(
        system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 8}, devices=3, seen_by=system)
    for i in range(3):
        name = f"dup-{i}"
        body = vmi_body(name, devices=f"gpu-{i}", templates=f"{cls}=1")
        got: list[tuple[bool, str]] = []

        async def one() -> None:
            got.append(await create(fleet, tenant, body))
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
        print(name, [(ok, m[:90]) for ok, m in got])
        assert sum(ok for ok, _ in got) <= 1
        vmi = await get_vmi(fleet, tenant, name)
        await housekeeping_rounds(system, 2)  # the losers cleaned up as they were denied
        if vmi is None:   # every create denied: nothing may stay attached to the name
            have = await devices(fleet, tenant)
            assert not [n for n, d in have.items()
                        if (d.get("status") or {}).get("attachedTo", {}).get("vmi") == name]
            continue
        await assert_vmi_holds_its_set(fleet, tenant, name)


# -- item 3: restart race -------------------------------------------------------------------

async def test_H2_restart_race_delete_and_recreate_fifty_times_never_undoes_the_new_admission(
        system, fleet):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 4}, devices=1, seen_by=system)
    body = vmi_body("rr", devices="gpu-0", templates=f"{cls}=1")
    ok, spec = await create(fleet, tenant, body)
    assert ok, spec
    for round_ in range(50):
        await delete_vmi(fleet, tenant, "rr")
        await anyio.sleep(rnd.uniform(0.05, 0.3))  # the race: a seeded gap before re-creating
        ok, msg = await create(fleet, tenant, body)
        assert ok, f"round {round_}: re-create denied: {msg}"
        try:
            await assert_vmi_holds_its_set(fleet, tenant, "rr")
        except AssertionError as exc:
            raise AssertionError(f"round {round_}: {exc}") from None
    await housekeeping_rounds(system, 3)  # after the last re-create
    await assert_vmi_holds_its_set(fleet, tenant, "rr")
    have = await devices(fleet, tenant)
    assert sorted(have) == ["gpu-0", f"rr-{cls}-0"]


# -- item 4: deleting in-use devices ------------------------------------------------------

async def test_B3_tenant_cannot_delete_attached_devices_so_no_second_tenant_lands_on_a_full_node(
        system, fleet, control_plane, tmp_path):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"full": 2}, devices=1, seen_by=system)
    ok, spec = await create(fleet, tenant, vmi_body("vm", devices="gpu-0", templates=f"{cls}=1"))
    assert ok, spec  # both units of the only node are in use by the running VM
    user = unique("user")
    await fleet.rbac.create_namespaced_role_binding(tenant, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "gpu-tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "gpu-binder:tenant"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]})
    kc = control_plane.write_user_kubeconfig(tmp_path / "a.kubeconfig", user,
                                             ("gpu-binder:tenants",), namespace=tenant)
    out = control_plane.kubectl("delete", "gpudevices", "--all", "-n", tenant, kubeconfig=kc,
                                check=False)
    print(out.stdout, out.stderr)
    one = control_plane.kubectl("delete", "gpudevice", "gpu-0", "-n", tenant, kubeconfig=kc,
                                check=False)
    assert one.returncode != 0 and "is attached to VMI vm" in one.stderr, one.stderr
    left = await devices(fleet, tenant)
    assert sorted(left) == ["gpu-0", f"vm-{cls}-0"], "an attached device was deleted"
    assert all(d["metadata"].get("deletionTimestamp") is None for d in left.values())
    # a second tenant entitled to the class: the node is full, so its VMI is refused
    other = unique("t")
    await fleet.tenant(other)
    await replicas_saw(system, {"namespaces": await namespace_rv(fleet, other)}, what=other)
    ok, msg = await create(fleet, other, vmi_body("intruder", templates=f"{cls}=1"))
    assert not ok, f"second tenant's VMI admitted onto the full node: {msg}"
    # refused for room, the bare VMI waits in the line (P5): 503 with W1's words, then the line's
    assert msg.endswith(_in_line(_no_room(other, "intruder", cls, res, nodes["full"], 1, 0))), msg
    await assert_vmi_holds_its_set(fleet, tenant, "vm")
    # once the VM is gone, its devices are released and may be deleted
    await delete_vmi(fleet, tenant, "vm")

    async def released():
        return "attachedTo" not in ((await devices(fleet, tenant))["gpu-0"].get("status") or {})
    await eventually(released, timeout=15, what="H2 release")
    control_plane.kubectl("delete", "gpudevice", "gpu-0", "-n", tenant, kubeconfig=kc)


async def test_B3_a_bound_device_kept_terminating_by_a_tenant_finalizer_still_uses_its_unit(
        system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"one": 1}, devices=1, seen_by=system)
    ok, spec = await create(fleet, tenant, vmi_body("warm", devices="gpu-0"))
    assert ok, spec
    await delete_vmi(fleet, tenant, "warm")

    async def released():
        st = (await devices(fleet, tenant))["gpu-0"].get("status") or {}
        return "attachedTo" not in st and st
    st = await eventually(released, timeout=15, what="H2 release")
    assert st["phase"] == "Bound"            # idle, but still holding the node's one unit
    # the tenant's own finalizer keeps the deleted device around, Bound
    await fleet.custom.patch_namespaced_custom_object(
        GROUP, VERSION, tenant, "gpudevices", "gpu-0",
        {"metadata": {"finalizers": ["example.com/keep"]}},
        _content_type="application/merge-patch+json")
    await fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, tenant, "gpudevices",
                                                       "gpu-0")
    try:
        await replicas_saw(system, {"gpudevices": await device_rv(fleet, tenant, "gpu-0")},
                           what="the deletion of gpu-0")
        ok, msg = await create(fleet, tenant, vmi_body("reuse", devices="gpu-0"))
        assert not ok and msg.endswith(DeviceBeingDeleted("gpu-0").render()), msg
        other = unique("t")
        await fleet.tenant(other)
        await replicas_saw(system, {"namespaces": await namespace_rv(fleet, other)}, what=other)
        ok, msg = await create(fleet, other, vmi_body("intruder", templates=f"{cls}=1"))
        # the unit still counts as used
        assert not ok and msg.endswith(_in_line(_no_room(other, "intruder", cls, res, nodes["one"], 1, 0))), msg
    finally:
        await fleet.custom.patch_namespaced_custom_object(
            GROUP, VERSION, tenant, "gpudevices", "gpu-0", {"metadata": {"finalizers": None}},
            _content_type="application/merge-patch+json")


# -- item 6: H2 level-based ---------------------------------------------------------------

async def _released(fleet, ns: str, held: list[str], templates: list[str]):
    have = await devices(fleet, ns)
    if any(t in have for t in templates):
        return None
    if any("attachedTo" in (have[h].get("status") or {}) for h in held):
        return None
    return have


async def test_H2_vmi_deleted_within_a_round_of_its_admission_is_released_at_once(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 4}, devices=1, seen_by=system)
    ok, spec = await create(fleet, tenant, vmi_body("quick", devices="gpu-0",
                                                    templates=f"{cls}=1"))
    assert ok, spec
    await delete_vmi(fleet, tenant, "quick")   # before any housekeeping round saw it
    started = time.monotonic()
    have = await eventually(lambda: _released(fleet, tenant, ["gpu-0"], [f"quick-{cls}-0"]),
                            timeout=20, what="H2 release")
    took = time.monotonic() - started
    print(f"released {took:.1f} s after the delete (grace {GRACE:.0f} s)")
    assert took < GRACE - 2, "released by H1's grace, not by H2"
    assert have["gpu-0"]["status"]["phase"] == "Bound"   # a held device keeps its node


async def test_H2_vmi_deleted_while_no_replica_runs_is_released_once_one_leads(system, fleet):
    """H2 across a gap in which no replica ran: the VMI's deletion made no tombstone, and no
    uid is linked (docs/contract.md, "No uid link"), so the set is released once a replica
    leads and its attachment is older than `attachmentGrace` (judge's case 6, confirmed by a
    live read), and no later than a round after that."""
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 4}, devices=1, seen_by=system)
    ok, spec = await create(fleet, tenant, vmi_body("failover", devices="gpu-0",
                                                    templates=f"{cls}=1"))
    assert ok, spec
    await housekeeping_rounds(system, 2)  # a whole round has seen the VMI running
    grace = 20
    since = datetime.fromisoformat(
        (await devices(fleet, tenant))["gpu-0"]["status"]["attachedTo"]["since"]
        .replace("Z", "+00:00"))
    long_grace = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith("--attachment-grace")
                       ) + (f"--attachment-grace={grace}",)
    normal = system.controller_args
    try:
        for i in (0, 1):
            system.kill_replica(i, signal.SIGKILL)
        await delete_vmi(fleet, tenant, "failover")   # no replica runs
        system.controller_args = long_grace
        for i in (0, 1):
            system.start_replica(i)
        for i in (0, 1):
            system.wait_ready(i)
        left = (since.timestamp() + grace) - datetime.now(timezone.utc).timestamp()
        started = time.monotonic()
        await eventually(lambda: _released(fleet, tenant, ["gpu-0"], [f"failover-{cls}-0"]),
                         timeout=max(0.0, left) + 30, what="H2 release after the failover")
        print(f"released {time.monotonic() - started:.1f} s after both replicas were ready, "
              f"{left:.1f} s of the grace left then")
    finally:
        system.controller_args = normal
        for i in (0, 1):
            system.kill_replica(i, signal.SIGTERM)
            system.start_replica(i)
        for i in (0, 1):
            system.wait_ready(i)


# -- item 8: dry run ----------------------------------------------------------------------

async def test_W2_denied_dry_run_writes_nothing_not_even_an_event(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 1}, devices=1, seen_by=system)
    vmi = vmi_body("dry-denied", devices="gpu-0", templates=f"{cls}=1")   # 2 needed, 1 unit
    out = system.cp.kubectl("create", "--dry-run=server", "-n", tenant, "-f", "-",
                            input=yaml.safe_dump(vmi), check=False)
    assert out.returncode != 0, out.stderr
    assert _no_room(tenant, "dry-denied", cls, res, nodes["a"], 2, 1, largest=1).render() in out.stderr, out.stderr
    # the webhook writes a denial's Event before it answers: the answer is the barrier
    events = system.cp.kubectl("get", "events", "-n", tenant, "-o", "json").stdout
    assert json.loads(events)["items"] == [], "a dry-run denial wrote an Event"
    have = await devices(fleet, tenant)
    assert list(have) == ["gpu-0"] and have["gpu-0"].get("status") is None
    # ... as the same denial for real shows, at once
    out = system.cp.kubectl("create", "-n", tenant, "-f", "-", input=yaml.safe_dump(vmi),
                            check=False)
    assert out.returncode != 0, out.stderr
    assert _no_room(tenant, "dry-denied", cls, res, nodes["a"], 2, 1, largest=1).render() in out.stderr, out.stderr
    events = json.loads(system.cp.kubectl("get", "events", "-n", tenant, "-o", "json").stdout)
    assert [e["involvedObject"]["name"] for e in events["items"]] == ["dry-denied"], events


# -- W6: only the API server may call the webhook ----------------------------------------

async def _events(fleet, ns: str) -> list[dict]:
    return (await fleet.core.list_namespaced_event(ns)).items


def _caller_ssl(system, caller: str, tmp_path) -> ssl.SSLContext:
    """A TLS client that trusts the webhook's serving CA and presents `caller`'s identity:
    none, a client certificate of a CA of its own, or a tenant's real cluster client
    certificate (signed by the cluster CA the API server trusts for users)."""
    from localcluster.pki import CertificateAuthority

    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=system.cp.ca.cert_pem.decode())
    pair = None
    if caller == "other-ca":
        pair = CertificateAuthority("attacker-ca").issue_client("kube-apiserver-webhook-client")
    elif caller == "tenant-cert":
        pair = system.cp.ca.issue_client("user-attacker", ("gpu-binder:tenants",))
    if pair is not None:
        cert, key = tmp_path / "caller.crt", tmp_path / "caller.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


@pytest.mark.parametrize("caller", ["no-cert", "other-ca", "tenant-cert"])
async def test_W6_forged_review_for_another_tenant_writes_nothing(system, fleet, caller,
                                                                  tmp_path):
    """An attacker who reaches the webhook port POSTs a review for the victim's namespace:
    templates that would eat its budget, its held device with a nodeSelector that would move
    it. Without the API server's client certificate the TLS handshake fails: no template,
    no attachment, no bind request, no Event. The API server's own call still admits."""
    import aiohttp

    res, cls, nodes, victim, held = await make_pool(fleet, {"a": 4, "b": 4}, budget=4,
                                                    devices=1, prefix="held", seen_by=system)
    vmi = annotated(fixture("vmi-fedora.yaml"), "forged", templates=f"{cls}=2",
                    devices=held[0])
    vmi["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes["b"]}
    url = f"https://127.0.0.1:{system.webhook_port}/mutate-vmi"
    answers = []
    for dry_run in (True, False):   # a dry run would reveal devices and budgets
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
                async with http.post(url, json=review(f"forged-{uuid.uuid4().hex[:6]}", vmi,
                                                       victim, dryRun=dry_run),
                                     ssl=_caller_ssl(system, caller, tmp_path)) as resp:
                    answers.append((resp.status, (await resp.json()).get("response")))
        except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
            answers.append(("refused", type(exc).__name__))
    after = await device_items(fleet, victim)
    assert [d["metadata"]["name"] for d in after] == held, after
    assert (after[0].get("status") or {}).get("attachedTo") is None, after[0]["status"]
    assert (after[0].get("status") or {}).get("bindRequest") is None, after[0]["status"]
    assert await _events(fleet, victim) == []
    assert [a[0] for a in answers] == ["refused", "refused"], answers
    # the API server itself still gets through
    ok, msg = await create(fleet, victim, annotated(fixture("vmi-fedora.yaml"), "real",
                                                    templates=f"{cls}=1"))
    assert ok, msg


async def test_W6_review_from_the_api_servers_client_certificate_is_answered(system, fleet):
    """The certificate the API server presents (its AdmissionConfiguration's kubeconfig) is
    the one the webhook trusts: a review signed in with it gets an answer."""
    import aiohttp

    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 1}, seen_by=system)
    vmi = annotated(fixture("vmi-fedora.yaml"), "dry", templates=f"{cls}=1")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"https://127.0.0.1:{system.webhook_port}/mutate-vmi",
                             json=review("uid-api", vmi, tenant, dryRun=True),
                             ssl=client_ssl(system)) as resp:
            body = await resp.json()
    assert body["response"]["uid"] == "uid-api" and body["response"]["allowed"] is True
    assert await device_items(fleet, tenant) == []      # a dry run writes nothing (W2)


async def _post_as_api_server(system, body: bytes, content_type: str) -> tuple[int, dict]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.post(f"https://127.0.0.1:{system.webhook_port}/mutate-vmi", data=body,
                             headers={"Content-Type": content_type},
                             ssl=client_ssl(system)) as resp:
            return resp.status, (await resp.json())["response"]


async def test_W6_attacker_style_reviews_are_denied_with_the_status_that_fits(system, fleet):
    """What a caller holding the API server's client certificate (a misconfigured or
    compromised path) could send for the victim's namespace: each is answered (HTTP 200, an
    AdmissionReview) with a denial whose code says what is wrong, the uid echoed when it
    could be read, and nothing is written: no template, attachment, request or Event."""
    res, cls, nodes, victim, held = await make_pool(fleet, {"a": 4}, budget=4, devices=1,
                                                    prefix="held", seen_by=system)
    vmi = annotated(fixture("vmi-fedora.yaml"), "forged", templates=f"{cls}=2",
                    devices=held[0])

    def body(uid: str, **over) -> bytes:
        return json.dumps(review(uid, vmi, victim, **over)).encode()
    oversized = json.loads(body("u-big"))
    oversized["request"]["object"]["metadata"]["annotations"]["padding"] = "x" * (4 << 20)
    pod = {"metadata": {"name": "forged", "annotations": {
        "gpu.cozystack.io/templates": f"{cls}=2"}}, "spec": {"containers": []}}
    forged_admission = annotated(fixture("vmi-fedora.yaml"), "forged", templates=f"{cls}=1")
    forged_admission["metadata"]["annotations"]["gpu.cozystack.io/admission"] = "a" * 32
    cases = [  # (what, body, content type, uid answered, code, reason)
        ("oversized body", json.dumps(oversized).encode(), "application/json", "", 413,
         "RequestEntityTooLarge"),
        ("wrong content type", body("u-ctype"), "application/x-www-form-urlencoded", "", 415,
         "UnsupportedMediaType"),
        ("not JSON", b'{"request": {"uid": "u-json"', "application/json", "", 400,
         "BadRequest"),
        ("a review for another kind", body("u-pod", kind={"group": "", "version": "v1",
                                                          "kind": "Pod"}, object=pod),
         "application/json", "u-pod", 400, "BadRequest"),
        ("an UPDATE", body("u-update", operation="UPDATE"), "application/json", "u-update",
         400, "BadRequest"),
        ("a forged dryRun", body("u-dry", dryRun="false"), "application/json", "u-dry", 400,
         "BadRequest"),
        ("a forged admission annotation", json.dumps(review("u-adm", forged_admission,
                                                             victim)).encode(),
         "application/json", "u-adm", 422, "Invalid"),
    ]
    got = []
    for what, raw, ctype, *_ in cases:
        status, resp = await _post_as_api_server(system, raw, ctype)
        got.append((what, status, resp["uid"], resp["allowed"], resp["status"]["code"],
                    resp["status"]["reason"]))
        assert resp["status"]["message"], (what, resp)
    assert got == [(what, 200, uid, False, code, reason)
                   for what, _, _, uid, code, reason in cases]
    after = await device_items(fleet, victim)
    assert [d["metadata"]["name"] for d in after] == held, after
    assert after[0].get("status") is None, after[0]["status"]
    assert await _events(fleet, victim) == []
    # through the API server, the tenant's client sees the webhook's code and reason
    code, reason, msg = await create_denied(fleet, victim, forged_admission)
    assert (code, reason) == (422, "Invalid") and "gpu.cozystack.io/admission" in msg, msg


# -- failure isolation -------------------------------------------------------------------

async def test_outage_blocks_only_vmis_with_gpu_annotations(system, fleet):
    """With every replica stopped, a VMI that asks for no GPU is created (matchConditions:
    it is never sent to the webhook); one with gpu annotations is refused (failurePolicy
    Fail)."""
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 1}, seen_by=system)
    for i in range(len(system.replicas)):
        system.kill_replica(i, signal.SIGKILL)
    plain = fixture("vmi-fedora.yaml")
    plain["apiVersion"] = "kubevirt.io/v1"
    ok, msg = await create(fleet, tenant, plain)
    assert ok, msg
    ok, msg = await create(fleet, tenant, annotated(fixture("vmi-fedora.yaml"), "wants-gpu",
                                                    templates=f"{cls}=1"))
    assert not ok and "failed calling webhook" in msg, msg
    assert await device_items(fleet, tenant) == []


def _served_certificate(system) -> bytes:
    """DER of the certificate one new TLS connection to the webhook port is served."""
    ctx = client_ssl(system)
    with socket.create_connection(("127.0.0.1", system.webhook_port), timeout=5) as sock:
        with ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


async def test_serving_certificate_rotation_is_served_without_restart(system, fleet):
    """cert-manager rotates the Secret's files (written aside, then renamed into place):
    every replica serves the new certificate on new connections, with no restart, and the
    API server (same CA in caBundle) keeps admitting."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    pids = [r.proc.pid for r in system.replicas]
    before = await anyio.to_thread.run_sync(_served_certificate, system)
    fresh = system.cp.ca.issue_server(["127.0.0.1", "localhost"])
    d = system.webhook_dir
    for name, data in (("tls.key", fresh.key_pem), ("tls.crt", fresh.cert_pem)):
        (d / f".{name}.new").write_bytes(data)
        os.replace(d / f".{name}.new", d / name)
    want = x509.load_pem_x509_certificate(fresh.cert_pem).public_bytes(Encoding.DER)
    assert want != before

    async def all_new() -> bool:
        seen = [await anyio.to_thread.run_sync(_served_certificate, system) for _ in range(8)]
        return all(s == want for s in seen)
    await eventually(all_new, timeout=15, what="the rotated certificate served")
    assert [r.proc.pid for r in system.replicas] == pids and all(r.alive for r in system.replicas)
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 1}, seen_by=system)
    ok, msg = await create(fleet, tenant, annotated(fixture("vmi-fedora.yaml"), "after-rotation",
                                                    templates=f"{cls}=1"))
    assert ok, msg
    print(f"served certificate sha256 {hashlib.sha256(before).hexdigest()[:16]} -> "
          f"{hashlib.sha256(want).hexdigest()[:16]}")


# -- least privilege ---------------------------------------------------------------------

SA_USER = "system:serviceaccount:cozy-system:gpu-binder"


def _can(system, *args: str) -> bool:
    out = system.cp.kubectl("auth", "can-i", *args, kubeconfig=system.kubeconfig, check=False)
    return out.stdout.strip() == "yes"


async def test_least_privilege_replicas_run_a_full_cycle_on_the_shipped_service_account(
        system, fleet):
    """Every replica authenticates as the shipped ServiceAccount (TokenRequest), not as
    admin: admission (templates, attachments, bind requests, an Event), binding, H2 clean-up
    and H3 settings all work on controller/rbac.yaml alone, no call is forbidden, and the
    account cannot do what it need not."""
    who = system.cp.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}",
                            kubeconfig=system.kubeconfig).stdout.strip()
    assert who == SA_USER
    for i in range(len(system.replicas)):
        assert f"--kubeconfig={system.kubeconfig}" in system.replicas[i].proc.args
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 1}, seen_by=system)
    ok, msg = await create(fleet, tenant, annotated(fixture("vmi-fedora.yaml"), "fits",
                                                    templates=f"{cls}=1"))
    assert ok, msg
    ok, msg = await create(fleet, tenant, annotated(fixture("vmi-fedora.yaml"), "too-big",
                                                    templates=f"{cls}=2"))
    assert not ok
    events = await _events(fleet, tenant)
    assert [e.reason for e in events] == ["GPUSetRefused"]

    async def settings_name_the_class() -> bool:
        cm = await fleet.core.read_namespaced_config_map("gpu-settings", "cozy-system")
        return res in (cm.data or {}).get("resourceNames", "").split(",")
    await eventually(settings_name_the_class, timeout=20, what="H3 settings with the class")
    await fleet.custom.delete_namespaced_custom_object("kubevirt.io", "v1", tenant,
                                                       "virtualmachineinstances", "fits")

    async def released() -> bool:
        return await device_items(fleet, tenant) == []
    await eventually(released, timeout=40, what="H2: the deleted VMI's template removed")
    for i in range(len(system.replicas)):
        log = system.replicas[i].log_path.read_text(errors="replace")
        assert '"status":403' not in log and "forbidden" not in log.lower(), \
            system.log_tail(i)
    assert not _can(system, "get", "secrets", "-A")
    assert not _can(system, "update", "leases/someone-else", "-n", "cozy-system")
    assert not _can(system, "update", "configmaps/other", "-n", "cozy-system")
    assert not _can(system, "create", "gpuclasses")                    # the admin's
    assert not _can(system, "create", "virtualmachineinstances", "-n", tenant)
    assert not _can(system, "delete", "namespaces")
    assert _can(system, "update", "leases/gpu-binder", "-n", "cozy-system")


# -- bounded memory ----------------------------------------------------------------------

def _rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def test_bounded_memory_2000_devices_with_100_kib_annotations(tmp_path):
    """A tenant fills 2,000 GPUDevices with 100 KiB annotations (200 MiB through the
    replica's watch, then once more through a relist page by page): the replica keeps only
    what it reads and stays far inside the Deployment's 512 Mi limit. On a control plane of
    its own, so the 200 MiB leave with it instead of slowing every later test's lists; one
    replica (each replica's informers are the same code)."""
    from kubernetes_asyncio.client import CustomObjectsApi
    from kubernetes_asyncio.config import new_client_from_config

    from localcluster.fleet import Fleet
    from localcluster.cluster import LocalCluster

    lc = LocalCluster(controllers=1, controller_args=FAST_CONTROLLER_ARGS,
                      log_dir=tmp_path / "logs")
    client = None
    try:
        lc.start()
        client = await new_client_from_config(config_file=str(lc.cp.admin_kubeconfig))
        fleet = Fleet(client)
        cls, tenant = unique("cls"), unique("t")
        await fleet.gpu_class(cls, f"{unique('gpu')}.example.com/gpu")
        await fleet.tenant(tenant)
        await replicas_saw(lc, {"gpuclasses": await class_rv(fleet, cls),
                                "namespaces": await namespace_rv(fleet, tenant)}, what="the pool")
        before = _rss_mib(lc.replicas[0].proc.pid)
        custom = CustomObjectsApi(client)
        filler = "x" * (100 * 1024)
        limit = anyio.CapacityLimiter(12)

        async def one(i: int) -> None:
            async with limit:
                await custom.create_namespaced_custom_object(
                    "gpu.cozystack.io", "v1alpha1", tenant, "gpudevices", {
                        "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
                        "metadata": {"name": f"fat-{i}",
                                     "annotations": {"tenant/filler": filler},
                                     "labels": {f"l{j}": "v" * 63 for j in range(20)}},
                        "spec": {"class": cls}})
        async with anyio.create_task_group() as tg:
            for i in range(2000):
                tg.start_soon(one, i)

        async def cached() -> bool:   # the replica's informer saw them all
            text = lc.metrics(0)
            return _gauge(text, 'gpu_binder_cache_objects{informer="gpudevices"}') >= 2000
        await eventually(cached, timeout=120, interval=1, what="2,000 devices in the cache")
        watched = _rss_mib(lc.replicas[0].proc.pid)
        # a relist too: restart the replica, which lists the 2,000 page by page
        lc.kill_replica(0, signal.SIGTERM)
        lc.start_replica(0)
        lc.wait_ready(0, timeout=120)
        await eventually(cached, timeout=60, interval=1, what="2,000 devices relisted")
        relisted = _rss_mib(lc.replicas[0].proc.pid)
        print(f"replica RSS MiB: {before:.0f} before, {watched:.0f} after 2,000 × 100 KiB "
              f"watched, {relisted:.0f} after a fresh relist of them")
        assert watched - before < 100 and watched < 200, (before, watched)
        assert relisted < 200, relisted
    finally:
        if client is not None:
            await client.close()
        lc.stop()


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not exported")
