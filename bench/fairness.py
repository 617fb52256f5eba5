"""The noisy neighbour and the lone tenant, timed (`gpu-binder bench fairness`; issues 23, 31).

Starts the whole system (`localcluster.cluster.LocalCluster`: etcd, kube-apiserver, two
controller replicas with the shipped fair-share settings, webhook registered) and a fleet of
eight 40-GPU nodes. Three measurements, every create through the real API server and the
replicas' webhooks as the tenant's own user:

1. The lone tenant's burst (issue 31): tenant C creates `BURST` one-GPU VMIs, `BURST_AT_ONCE`
   at a time, with room and budget for all, through a client that retries as client-go does
   (a 429 or 5xx answer carrying `Retry-After` is sent again after that many seconds, at
   most `RETRIES` times). The report gives its admissions per second, the share admitted,
   the answers by status and the target: all admitted, within `BURST_SLOWDOWN`× the time
   the same burst took before the work-conserving gate (`BURST_BEFORE_S`, or the
   `baseline_burst_s` given to `run`).
2. B alone: tenant B creates `B_VMIS` ordinary 1-GPU VMIs one after another.
3. B under A's flood: B creates `B_VMIS` more while tenant A, in a process of its own (tenants
   are different clients: in one process, B's create would wait for its own event loop
   sending A's creates), sends rounds of `A_FLOOD` creates at once, one round after another
   until B is done (a third race for A's whole budget, a third ask for more than it, a third
   name a class that does not exist; A's client opens its connections beforehand, so the
   flood is one of creates, not of TLS handshakes). B's client opens its connection before
   phase 2, so neither phase times a TLS handshake.

The shipped API Priority and Fairness objects (k8s/manifests/flowcontrol/) are installed: the
report names the FlowSchema and priority level that classified B's creates (from the
answers' `X-Kubernetes-PF-*-UID` headers). It gives B's p50/p99 alone and under the flood,
their ratio (target, issue 23: at most `RATIO`×, over `B_VMIS` >= 50 creates each, so a p99
is not one sample), A's answers by HTTP status (its 429s by who answered them: a webhook, or
the API server's flow control). For each of B's creates it also gives the seconds spent
inside the webhook's admission (`webhook_seconds` of the replicas' "VMI admitted" log line:
W1 on the cache, the tenant's turn, the binder, the writes) and the rest, before it (the API
server, its call to the webhook, the replica's HTTP server). The properties (B never
refused, A held to its share, the lone tenant never turned away) are tested in
tests/e2e/test_fairness.py; this file only times. Writes `fairness.json`.

With `--seats` (issue 40 item 4), phases 2 and 3 run once per seat count instead, in the
same run on the same cluster, the shipped PriorityLevelConfiguration's
nominalConcurrencyShares set to give the level about that many seats (`bench.apf`: the report
gives the shares and the seats kube-apiserver then says) and restored afterwards; each seat
count has tenants of its own (`tenants_of`: A races for a budget of its own, B's names are
its own) and the level's flow-control figures alone and under the flood (dispatched,
rejected, queue wait). The burst (phase 1) runs once, before, at the shipped seats.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import multiprocessing
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from bench import apf
from bench.common import BadArgs, Benchmark, add_out, head_sha, positive_ints, quantile
from model.types import GROUP, VERSION

if TYPE_CHECKING:  # the cluster's harness is imported when the benchmark runs
    from localcluster.cluster import LocalCluster

RES = "nvidia.com/GH100_H100"
CLS = "h100"
TENANTS = "gpu-binder:tenants"
VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"
B_VMIS = 50          # B's creates per phase: a p99 over 50 samples
A_FLOOD = 200        # A's creates per round of its flood
A_BUDGET = 4
BURST, BURST_AT_ONCE = 200, 50  # the lone tenant's burst: creates, and how many at a time
RETRIES = 10         # client-go's default (k8s.io/client-go rest.Request maxRetries)
BURST_SLOWDOWN = 1.5  # the target: the burst within 1.5x the time it took before the gate
BURST_BEFORE_S = 7.27  # the burst before the work-conserving gate: main 33e865c with the
# share unlimited (--webhook-tenant-concurrency=64), 2026-12-04, load 1.41 (docs/benchmarks.md)
APF, FLOWCONTROL = apf.APF, apf.FLOWCONTROL  # the shipped FlowSchema and priority level
FS_UID, PL_UID = "x-kubernetes-pf-flowschema-uid", "x-kubernetes-pf-prioritylevel-uid"
RATIO = 3.0  # the target: B's p99 under the flood <= RATIO x its p99 alone
NODES, NODE_GPUS = 8, 40  # room for B's 2 x 50, A's budget and C's burst of 200


def tenants_of(target: int | None) -> tuple[str, str]:
    """(A's namespace, B's namespace) of phases 2 and 3 at seat count `target`: tenant-a
    and tenant-b without --seats (None), tenant-a-sN and tenant-b-sN at N seats."""
    if target is None:
        return "tenant-a", "tenant-b"
    return f"tenant-a-s{target}", f"tenant-b-s{target}"


def nodes_needed(levels: int) -> int:
    """NODE_GPUS-GPU nodes holding C's burst and, `levels` times, B's 2 x B_VMIS and A's
    budget (VMIs never stop): NODES for one (no --seats)."""
    return math.ceil((BURST + levels * (2 * B_VMIS + A_BUDGET)) / NODE_GPUS)


def _vmi(name: str, templates: str) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "annotations": {"gpu.cozystack.io/templates": templates}},
            "spec": {"domain": {"devices": {}}}}


def _flood_body(i: int, round_: int = 0) -> dict:
    templates = (f"{CLS}={A_BUDGET}", f"{CLS}={A_BUDGET + 1}", f"no-such-{CLS}=1")[i % 3]
    return _vmi(f"a-{round_}-{i}", templates)


Outcome = tuple[int, float, float, dict]


async def _create(api, ns: str, body: dict) -> Outcome:
    """Create `body` in `ns`: (HTTP status, 201 when admitted, 0 when no answer; sent and
    answered, monotonic seconds; {"fs", "pl": the answer's flow-control UIDs, "webhook":
    True when a webhook wrote the refusal (its fair-share hint)})."""
    from kubernetes_asyncio.client import ApiException

    sent = time.monotonic()
    seen: dict = {}
    try:
        _, _, headers = await api.create_namespaced_custom_object_with_http_info(
            VMI_GROUP, VMI_VERSION, ns, VMIS, body, _request_timeout=60)
        status = 201
    except ApiException as exc:
        status, headers = exc.status, exc.headers
        seen["webhook"] = "fair share" in (exc.body or "")
        after = {k.lower(): v for k, v in (headers or {}).items()}.get("retry-after", "")
        if after.isdigit():
            seen["retry_after"] = int(after)
    except (TimeoutError, OSError):
        status, headers = 0, None
    lower = {k.lower(): v for k, v in (headers or {}).items()}
    seen.update(fs=lower.get(FS_UID), pl=lower.get(PL_UID))
    return status, sent, time.monotonic(), seen


async def _one_by_one(api, ns: str, prefix: str) -> list[Outcome]:
    return [await _create(api, ns, _vmi(f"{prefix}-{i}", f"{CLS}=1")) for i in range(B_VMIS)]


async def _user_client(lc: LocalCluster, workdir: Path, name: str, ns: str,
                       user: str | None = None):
    """A client as `user` (default: `name`) of the tenants' group, its kubeconfig
    `workdir`/`name`.kubeconfig with namespace `ns`."""
    path = lc.cp.write_user_kubeconfig(workdir / f"{name}.kubeconfig", user or name,
                                       (TENANTS,), namespace=ns)
    return await _client_of(path)


async def _client_of(path: Path):
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.config import load_kube_config

    cfg = Configuration()
    await load_kube_config(config_file=str(path), client_configuration=cfg)
    cfg.connection_pool_maxsize = A_FLOOD + B_VMIS
    return ApiClient(configuration=cfg)


async def _replicas_saw(lc: LocalCluster, marks: dict[str, int], timeout: float = 60.0) -> None:
    """Wait until every replica's informers applied the resourceVersions `marks` (informer
    -> resourceVersion), from gpu_binder_informer_resource_version. TimeoutError after
    `timeout` seconds."""
    from prometheus_client.parser import text_string_to_metric_families

    with anyio.fail_after(timeout):
        while True:
            behind = False
            for i in range(len(lc.replicas)):
                text = await anyio.to_thread.run_sync(lc.metrics, i)
                got = {s.labels.get("informer"): s.value
                       for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name == "gpu_binder_informer_resource_version"}
                behind |= any(got.get(name, -1) < rv for name, rv in marks.items())
            if not behind:
                return
            await anyio.sleep(0.05)  # poll interval of the named condition above


def _flood_child(kubeconfig: str, conn, ns: str = "tenant-a") -> None:
    """Tenant A's client, in a process of its own (as another tenant's client is): open
    A_FLOOD connections, send "ready", wait for "go", start rounds of A_FLOOD creates at
    once in namespace `ns`, one round after another, send "started" once the first is on
    its way, and after "stop" (read between rounds) the list of Outcomes of every round
    (monotonic seconds are the machine's, comparable with the parent's)."""
    anyio.run(_flood_main, kubeconfig, conn, ns)


async def _flood_main(kubeconfig: str, conn, ns: str) -> None:
    from kubernetes_asyncio.client import CustomObjectsApi

    client = await _client_of(Path(kubeconfig))
    try:
        api = CustomObjectsApi(client)
        async with anyio.create_task_group() as tg:  # A's connections, opened beforehand
            for _ in range(A_FLOOD):
                tg.start_soon(functools.partial(api.list_namespaced_custom_object,
                                                VMI_GROUP, VMI_VERSION, ns, VMIS, limit=1))
        conn.send("ready")
        await anyio.to_thread.run_sync(conn.recv)  # "go"
        flood: list[Outcome] = []

        async def one(i: int, round_: int) -> None:
            flood.append(await _create(api, ns, _flood_body(i, round_)))
        round_ = 0
        while round_ == 0 or not conn.poll():
            async with anyio.create_task_group() as tg:
                for i in range(A_FLOOD):
                    tg.start_soon(one, i, round_)
                await anyio.lowlevel.checkpoint()  # A's creates are on their way
                if round_ == 0:
                    conn.send("started")
            round_ += 1
        conn.recv()  # "stop"
        conn.send(flood)
    finally:
        await client.close()


async def _measure(lc: LocalCluster, workdir: Path, report: dict,
                   seats: tuple[int, ...] = ()) -> None:
    """The fleet, the tenants, C's burst, then phases 2 and 3: once at the shipped seats
    (their keys in `report`), or once per seat count of `seats` (`report["seats"]`)."""
    from kubernetes_asyncio.client import ApiException
    from kubernetes_asyncio.config import new_client_from_config

    admin = await new_client_from_config(config_file=str(lc.cp.admin_kubeconfig))
    try:
        from localcluster.fleet import Fleet

        fleet = Fleet(admin)
        levels: list[int | None] = list(seats) or [None]
        nodes = nodes_needed(len(levels))
        await fleet.gpu_class(CLS, RES)
        for i in range(nodes):
            await fleet.node(f"fair-node-{i}", {RES: NODE_GPUS})
        namespaces = []
        for target in levels:
            a_ns, b_ns = tenants_of(target)
            await fleet.tenant(b_ns, budgets={RES: 2 * B_VMIS}, user="user-b")
            await fleet.tenant(a_ns, budgets={RES: A_BUDGET}, user="user-a")
            namespaces += [a_ns, b_ns]
        await fleet.tenant("tenant-c", budgets={RES: BURST}, user="user-c")
        namespaces.append("tenant-c")
        quotas = [int((await fleet.core.read_namespaced_resource_quota("gpu-budget", ns))
                      .metadata.resource_version) for ns in namespaces]
        node_rvs = [int((await fleet.core.read_node(f"fair-node-{i}")).metadata.resource_version)
                    for i in range(nodes)]
        cls = await fleet.custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", CLS)
        await _replicas_saw(lc, {
            "gpuclasses": int(cls["metadata"]["resourceVersion"]),
            "namespaces": max([int((await fleet.core.read_namespace(ns)).metadata.resource_version)
                               for ns in namespaces]),
            "resourcequotas": max(quotas), "nodes": max(node_rvs)})
        uids = {}
        for plural in ("flowschemas", "prioritylevelconfigurations"):
            with contextlib.suppress(ApiException):  # not installed: the report says so
                obj = await fleet.custom.get_cluster_custom_object(*FLOWCONTROL, plural, APF)
                uids[obj["metadata"]["uid"]] = f"{plural}/{APF}"
        report["burst"] = await _burst(lc, workdir)
        if not seats:
            report.update(await _b_and_a(lc, workdir, *tenants_of(None), uids))
        else:
            report["nodes"] = nodes
            report["seats"] = await _at_seats(lc, workdir, admin, fleet.custom, seats, uids,
                                              report)
    finally:
        await admin.close()


async def _at_seats(lc: LocalCluster, workdir: Path, admin, custom, seats: tuple[int, ...],
                    uids: dict, report: dict) -> list[dict]:
    """Phases 2 and 3 at each seat count of `seats` in turn, the level's shares set for it
    (`apf.set_shares`) and restored afterwards (`report["shares_restored"]`: {shares, seats
    the server then says}): per seat count {seats_target, shares, seats (the server's),
    **`_b_and_a`'s keys with the level's flow-control figures}. `admin` is an admin ApiClient,
    `custom` a CustomObjectsApi on it."""
    out = []
    level_seats = apf.SeatCounts(custom, admin)
    try:
        async with level_seats:
            for target in seats:
                shares, granted = await level_seats.seats(target)
                level = await _b_and_a(lc, workdir, *tenants_of(target), uids,
                                       flow=functools.partial(apf.flow_samples, admin),
                                       tag=f"-s{target}")
                out.append({"seats_target": target, "shares": shares, "seats": granted, **level})
    finally:
        if level_seats.restored is not None:
            shares, granted = level_seats.restored
            report["shares_restored"] = {"shares": shares, "seats": granted}
    return out


async def _b_and_a(lc: LocalCluster, workdir: Path, a_ns: str, b_ns: str, uids: dict,
                   flow=None, tag: str = "") -> dict:
    """Phases 2 and 3, B in `b_ns` and A's flood in `a_ns` (kubeconfigs user-a`tag` and
    user-b`tag`): {b_alone, b_under_flood (`_latencies`), a_by_status, a_429_by_source,
    a_client, a_rounds, a_flood_seconds, apf (what classified B's creates)}; with `flow`
    (an async callable returning kube-apiserver's flow-control samples) also
    apf_level_alone and apf_level_under_flood (`apf.level_figures`: the VMI-create level's
    dispatched, rejected and queue wait in each phase, None when it saw nothing).
    RuntimeError when A's process says something unexpected; TimeoutError after 120 s of
    phase 3."""
    from kubernetes_asyncio.client import CustomObjectsApi

    path_a = lc.cp.write_user_kubeconfig(workdir / f"user-a{tag}.kubeconfig", "user-a",
                                         (TENANTS,), namespace=a_ns)
    client_b = await _user_client(lc, workdir, f"user-b{tag}", b_ns, user="user-b")
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_flood_child, args=(str(path_a), theirs, a_ns), daemon=True)
    readings = []
    try:
        api_b = CustomObjectsApi(client_b)
        # B's connection, opened beforehand: it is reused under the flood, so without this
        # only the first phase would time a TLS handshake
        await api_b.list_namespaced_custom_object(VMI_GROUP, VMI_VERSION, b_ns, VMIS,
                                                  limit=1)
        if flow:
            readings.append(await flow())
        alone = await _one_by_one(api_b, b_ns, "alone")
        if flow:
            readings.append(await flow())
        child.start()
        with anyio.fail_after(120):
            for step in ("ready", "started"):  # "started": A's creates go first
                said = await anyio.to_thread.run_sync(mine.recv)
                if said != step:
                    raise RuntimeError(f"tenant A's process said {said!r}, not {step!r}")
                if step == "ready":
                    mine.send("go")
            busy = await _one_by_one(api_b, b_ns, "busy")
            if flow:
                readings.append(await flow())
            mine.send("stop")  # A's process stops after its round in progress
            flood: list[Outcome] = await anyio.to_thread.run_sync(mine.recv)
    finally:
        await client_b.close()
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    got: dict = {"b_alone": _latencies(alone), "b_under_flood": _latencies(busy)}
    by_status: dict[str, int] = {}
    for status, _, _, _ in flood:
        by_status[str(status)] = by_status.get(str(status), 0) + 1
    got["a_by_status"] = dict(sorted(by_status.items()))
    got["a_429_by_source"] = {
        "webhook": sum(1 for st, _, _, seen in flood if st == 429 and seen.get("webhook")),
        "apiserver": sum(1 for st, _, _, seen in flood if st == 429 and not seen.get("webhook"))}
    got["a_client"] = "separate process"
    got["a_rounds"] = len(flood) // A_FLOOD
    got["a_flood_seconds"] = round(max(o[2] for o in flood) - min(o[1] for o in flood), 3)
    got["apf"] = {  # what classified B's creates (None: no FlowSchema of ours)
        "flow_schema": sorted({uids.get(seen["fs"]) for *_, seen in alone + busy}, key=str),
        "priority_level": sorted({uids.get(seen["pl"]) for *_, seen in alone + busy}, key=str)}
    if flow:
        got["apf_level_alone"] = apf.level_figures(readings[0], readings[1])
        got["apf_level_under_flood"] = apf.level_figures(readings[1], readings[2])
    return got


async def _retrying_create(api, ns: str, body: dict, seen: dict[int, int],
                           waits: dict[int, int]) -> int:
    """Create `body` in `ns` as client-go does: a 429 or 5xx answer carrying `Retry-After`
    is sent again after that many seconds, at most `RETRIES` times. The final status (201
    when admitted, 0 when no answer); every answer's status is counted in `seen`, every
    Retry-After (seconds) in `waits` (the API server's flow control raises its own from 1 s
    up to 32 s while it keeps dropping a level's requests: k8s.io/apiserver
    pkg/util/flowcontrol/dropped_requests_tracker.go)."""
    for attempt in range(RETRIES + 1):
        status, _, _, got = await _create(api, ns, body)
        seen[status] = seen.get(status, 0) + 1
        wait = got.get("retry_after")
        if wait is not None:
            waits[wait] = waits.get(wait, 0) + 1
        if not (status == 429 or status >= 500) or wait is None or attempt == RETRIES:
            return status
        await anyio.sleep(wait)  # as told: the client's own wait, not a synchronisation
    return status


async def _burst(lc: LocalCluster, workdir: Path) -> dict:
    """Tenant C, alone: `BURST` one-GPU creates, `BURST_AT_ONCE` at a time, retried as
    client-go retries (`_retrying_create`): {n, admitted, share_admitted, seconds (first sent
    to last answered), admissions_per_s, answers_by_status (every attempt's answer),
    retry_after_s ({seconds: answers that said so})}."""
    from kubernetes_asyncio.client import CustomObjectsApi

    client = await _user_client(lc, workdir, "user-c", "tenant-c")
    seen: dict[int, int] = {}
    waits: dict[int, int] = {}
    final: list[int] = []
    try:
        api = CustomObjectsApi(client)
        async with anyio.create_task_group() as tg:  # C's connections, opened beforehand
            for _ in range(BURST_AT_ONCE):
                tg.start_soon(functools.partial(api.list_namespaced_custom_object, VMI_GROUP,
                                                VMI_VERSION, "tenant-c", VMIS, limit=1))
        limit = anyio.CapacityLimiter(BURST_AT_ONCE)

        async def one(i: int) -> None:
            async with limit:
                final.append(await _retrying_create(api, "tenant-c",
                                                    _vmi(f"c-{i}", f"{CLS}=1"), seen, waits))
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for i in range(BURST):
                tg.start_soon(one, i)
        seconds = time.monotonic() - started
    finally:
        await client.close()
    admitted = sum(1 for st in final if st == 201)
    return {"n": BURST, "at_once": BURST_AT_ONCE, "admitted": admitted,
            "share_admitted": round(admitted / BURST, 3), "seconds": round(seconds, 3),
            "admissions_per_s": round(admitted / seconds, 1) if seconds > 0 else None,
            "answers_by_status": {str(k): v for k, v in sorted(seen.items())},
            "retry_after_s": {str(k): v for k, v in sorted(waits.items())}}


def _latencies(outs: list[Outcome]) -> dict:
    lat = [answered - sent for _, sent, answered, _ in outs]
    return {"n": len(lat), "admitted": sum(1 for s, *_ in outs if s == 201),
            "p50_s": round(quantile(lat, 0.5), 4), "p99_s": round(quantile(lat, 0.99), 4),
            "max_s": round(max(lat), 4), "each_s": [round(x, 4) for x in lat]}


def _webhook_seconds(logs: Path) -> dict[tuple[str, str], float]:
    """{(namespace, VMI name): seconds its admission spent in the webhook's `_fair_admit` (W1
    on the cache, the tenant's turn, the binder, the writes)}, from the replicas' "VMI
    admitted" log lines (`webhook_seconds`) in `logs`/controller-*.log."""
    got: dict[tuple[str, str], float] = {}
    for path in sorted(logs.glob("controller-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if '"VMI admitted"' not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "webhook_seconds" in entry and "namespace" in entry and "vmi" in entry:
                got[(entry["namespace"], entry["vmi"])] = entry["webhook_seconds"]
    return got


def finish_level(level: dict, inside: dict[tuple[str, str], float], b_ns: str) -> None:
    """Complete one measurement of B alone and under A's flood (the report's, or one seat
    count's) in place: each of B's creates' seconds in the webhook (`inside`, from
    `_webhook_seconds`; None when no log line said) and before it (`in_webhook_s`,
    `before_webhook_s`), `ratio_p99` (B's p99 under the flood ÷ alone, inf when alone is 0)
    and `target` ({target, value, met}: at most `RATIO`)."""
    for key, prefix in (("b_alone", "alone"), ("b_under_flood", "busy")):
        each = [inside.get((b_ns, f"{prefix}-{i}")) for i in range(level[key]["n"])]
        level[key]["in_webhook_s"] = each
        level[key]["before_webhook_s"] = [
            None if w is None else round(t - w, 4)
            for t, w in zip(level[key]["each_s"], each)]
    alone, under = level["b_alone"]["p99_s"], level["b_under_flood"]["p99_s"]
    ratio = under / alone if alone > 0 else float("inf")
    level["ratio_p99"] = round(ratio, 2)
    level["target"] = {"target": f"B's p99 under A's flood <= {RATIO:g} x its p99 alone",
                       "value": level["ratio_p99"], "met": ratio <= RATIO}


def run(out: Path, controller_args: tuple[str, ...] = (),
        baseline_burst_s: float | None = BURST_BEFORE_S, seats: tuple[int, ...] = ()) -> dict:
    """Run the benchmark (one run, about half a minute on 2 cores without `seats`; phases 2
    and 3 again per seat count) with the replicas' extra `controller_args` (none: the
    shipped settings); write `out`/fairness.json and return the report: `burst` (the lone
    tenant's, see `_burst`) and `burst_target` ({target, value, met}: all admitted within
    `BURST_SLOWDOWN` x `baseline_burst_s`; met None without a baseline), `b_alone` and
    `b_under_flood` ({n, admitted, p50_s, p99_s, max_s, each_s}, seconds per create),
    `ratio_p99` (under ÷ alone), `a_by_status` ({HTTP status: count}, 0 for no answer) and
    `target` ({target, value, met}). With `seats` (seat counts of the VMI-create level, each
    below `apf.SERVER_SEATS`; repeats ignored) those of B and A are instead per seat count
    in `seats` (a list of {seats_target, shares, seats (the server's), the same keys,
    apf_level_alone, apf_level_under_flood}), with `nodes` and `shares_restored`. Raises
    what LocalCluster raises when the control plane cannot start; ValueError for a seat
    count of `apf.SERVER_SEATS` or more (`apf.shares_for`)."""
    seats = tuple(dict.fromkeys(seats))
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"benchmark": "fairness", "commit": head_sha() or "unknown",
                    "started": datetime.now(UTC).isoformat(timespec="seconds"),
                    "b_vmis": B_VMIS, "a_flood": A_FLOOD, "a_budget": A_BUDGET,
                    "controller_args": list(controller_args),
                    "load_before": os.getloadavg(),
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()}}
    from localcluster.cluster import LocalCluster

    with LocalCluster(controllers=2, controller_args=controller_args,
                      log_dir=out / "logs") as lc:
        anyio.run(_measure, lc, out, report, seats)
    report["load_after"] = os.getloadavg()
    inside = _webhook_seconds(out / "logs")
    if seats:
        for level in report["seats"]:
            finish_level(level, inside, tenants_of(level["seats_target"])[1])
    else:
        finish_level(report, inside, tenants_of(None)[1])
    burst = report["burst"]
    limit = None if baseline_burst_s is None else BURST_SLOWDOWN * baseline_burst_s
    report["burst_target"] = {
        "target": f"all {BURST} of the lone tenant's burst admitted within "
                  f"{BURST_SLOWDOWN:g} x its time before the gate"
                  + (f" ({baseline_burst_s:g} s): {limit:.2f} s" if limit else " (no baseline)"),
        "value": burst["seconds"],
        "met": None if limit is None else (burst["admitted"] == BURST
                                           and burst["seconds"] <= limit)}
    (out / "fairness.json").write_text(json.dumps(report, indent=2))
    return report


def _level_lines(report: dict) -> list[str]:
    """B alone, B under A's flood (each with its slowest create), A's answers, the target."""
    lines = []
    for key, what in (("b_alone", "B alone"), ("b_under_flood", "B under A's flood")):
        r = report[key]
        lines.append(f"{what}: p50 {r['p50_s']:.3f} s, p99 {r['p99_s']:.3f} s, max "
                     f"{r['max_s']:.3f} s, {r['admitted']}/{r['n']} admitted")
        each, inside = r.get("each_s", []), r.get("in_webhook_s", [])
        slowest = max(range(len(each)), key=each.__getitem__, default=None)
        if slowest is not None and slowest < len(inside) and inside[slowest] is not None:
            lines.append(f"  slowest (create {slowest + 1}): {r['each_s'][slowest]:.3f} s, of "
                         f"which {r['in_webhook_s'][slowest]:.3f} s in the webhook's admission "
                         f"and {r['before_webhook_s'][slowest]:.3f} s before it (API server, "
                         f"the call to the webhook, its HTTP server)")
    lines.append(f"A's {report.get('a_rounds', 1)} x {report['a_flood']} creates by status: "
                 f"{report['a_by_status']} "
                 f"(answered within {report['a_flood_seconds']:.1f} s; 429s by "
                 f"{report.get('a_429_by_source')})")
    t = report["target"]
    lines.append(f"target {t['target']}: ratio {t['value']}: {'met' if t['met'] else 'NOT met'}")
    return lines


def _ms(value) -> str:
    return "-" if value is None else f"{value:g}"


def seats_line(level: dict) -> str:
    """One seat count's line: the seats asked, the shares set and the seats the server
    gave; B's p50/p99 alone and under A's flood, admitted, the ratio and its target; A's
    answers by status; the level's queue under the flood (mean wait, the bucket bound
    holding its p99, rejected)."""
    alone, busy, t = level["b_alone"], level["b_under_flood"], level["target"]
    queue = level.get("apf_level_under_flood") or {}
    return (f"{level['seats_target']} seats (shares {level['shares']}, server says "
            f"{_ms(level.get('seats'))}): B alone p50 {alone['p50_s']:.3f} s p99 "
            f"{alone['p99_s']:.3f} s ({alone['admitted']}/{alone['n']} admitted), under A's "
            f"flood p50 {busy['p50_s']:.3f} s p99 {busy['p99_s']:.3f} s ({busy['admitted']}/"
            f"{busy['n']} admitted): ratio {t['value']} {'met' if t['met'] else 'NOT met'}; "
            f"A's {level.get('a_rounds', 1)} rounds by status {level['a_by_status']}; the "
            f"level under the flood waited mean {_ms(queue.get('waited_mean_ms'))} ms, p99 <= "
            f"{_ms(queue.get('waited_p99_ms'))} ms, rejected {_ms(queue.get('rejected'))}")


def summary(report: dict) -> list[str]:
    """The report as printed lines (B's figures, A's answers, the target; with --seats one
    line per seat count instead, `seats_line`; the load, what classified B's creates, the
    burst)."""
    lines = []
    if "seats" in report:
        lines += [seats_line(level) for level in report["seats"]]
        back = report.get("shares_restored")
        if back:
            lines.append(f"the level's shares restored to {back['shares']} (server says "
                         f"{_ms(back.get('seats'))} seats)")
    else:
        lines += _level_lines(report)
    load = ", ".join(f"{x:.2f}" for x in report["load_before"])
    lines.append(f"load average before: {load}")
    classified = [report["apf"]] if "apf" in report else \
        [level["apf"] for level in report.get("seats", []) if "apf" in level]
    if classified:
        schemas = sorted({x for c in classified for x in c["flow_schema"]}, key=str)
        levels = sorted({x for c in classified for x in c["priority_level"]}, key=str)
        lines.append(f"B's creates classified by {', '.join(map(str, schemas))} "
                     f"at {', '.join(map(str, levels))}")
    if "burst" in report:
        b = report["burst"]
        lines.append(f"lone tenant's burst: {b['admitted']}/{b['n']} admitted "
                     f"({b['share_admitted']:.0%}), {b['at_once']} at a time, in "
                     f"{b['seconds']:.2f} s: {b['admissions_per_s']} admissions/s; answers "
                     f"(retries included) by status: {b['answers_by_status']}; Retry-After "
                     f"seconds told: {b.get('retry_after_s')}")
        t = report.get("burst_target")
        if t:
            met = {True: "met", False: "NOT met", None: "no baseline"}[t["met"]]
            lines.append(f"target {t['target']}: {t['value']:.2f} s: {met}")
    return lines


# -- the command line -----------------------------------------------------------------------

def seat_counts(text: str | None) -> tuple[int, ...]:
    """`--seats`' value: () without it, else its seat counts in order, repeats dropped.
    Raises BadArgs for anything but positive integers below `apf.SERVER_SEATS`."""
    if text is None:
        return ()
    values = tuple(dict.fromkeys(positive_ints(text, "--seats")))
    if max(values) >= apf.SERVER_SEATS:
        raise BadArgs(f"gpu-binder bench: --seats takes seat counts below the API server's "
                      f"{apf.SERVER_SEATS}, got {text!r}")
    return values


def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    p.add_argument("--seats", default=None, metavar="N,N,...",
                   help="seat counts of the VMI-create priority level (e.g. 5,12,25): measure "
                        "B alone and under A's flood at each in turn, in the same run, the "
                        "level's shares restored afterwards (default: none, once at the "
                        "shipped seats)")


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    print("\n".join(summary(run(out, seats=seat_counts(args.seats)))))
    print(f"report: {out}/fairness.json")
    return 0


BENCHMARK = Benchmark("fairness", "one tenant's burst of 200 creates alone, and tenant B's 50 "
                                  "creates alone and under tenant A's floods of 200, with "
                                  "--seats at each seat count of the VMI-create level (writes "
                                  "fairness.json)", _arguments, _run)
