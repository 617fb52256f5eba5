"""Upgrade, rollback and mixed versions under load (issue 20, items 3 and 4).

The previous version is 0.1.0: its chart is kept as tests/fixtures/chart-0.1.0 (main at
9dfc521) and its image is built from `git archive 9dfc521` by tools/build-image.sh
(GIT_REVISION); the new version is the work tree's chart and image. Helm manages for real
everything it can on a control plane of this module's own (CRDs, RBAC, the webhook
configuration, the policies, ConfigMaps, Service, Deployment); there is no kubelet, so
localcluster.rollout runs the Deployment's pods as processes from the image the Deployment
names, with its arguments, volumes and ServiceAccount token (in-cluster configuration), and
replaces them as a rolling update would. KubeVirt is not in the loop (time budget): VMIs are
API objects admitted by the webhook, and nothing runs them.

The harness is localcluster.upgrade (this module keeps the fixtures and the tests). A churn
driver (concurrent tenants creating and deleting VMIs asking for template and held
devices, retrying what is retryable) runs while helm upgrades and rolls back. What is checked
is invariants of the contract (docs/contract.md §7), sampled while the churn runs and once it settles,
never how a version does its work:
  - every admitted VMI that exists is pinned, and each of its devices is Bound on that node,
    attached to it, its request Succeeded there (§7.3, §7.5) - else an admission is lost;
  - no device named by two existing VMIs, no node's Bound devices beyond its allocatable, no
    tenant's beyond its budget (§7.1, §7.4, §7.5) - else devices are double-booked;
  - after the churn: every request has a result, nothing attached to a VMI that does not
    exist, no template device left for one (§7.2, H1, H2);
  - a tenant sees an admission, a refusal (403), or a retryable error (connection refused,
    EOF, timeouts, 429, 503, 504) that a retry gets past; nothing else.

CRDs: helm never upgrades `crds/`. The documented path (docs/install.md, "Upgrading") is a
pre-upgrade step, `helm show crds CHART | kubectl apply --server-side --force-conflicts -f -`;
the test takes it, checks the served CRDs are the new chart's and stay so after a rollback, and
that objects written by one version are read by the other (a held device attached and bound
by 0.1.0 blocks and then serves an admission by 0.2.0, and back after the rollback).
"""

from __future__ import annotations

import subprocess
import time
import tomllib
from collections import Counter

import anyio
import pytest

from localcluster.controlplane import ControlPlane
from localcluster.upgrade import (Churn, Clients, Compat, Release, Watch,
                                  chart_crds, churn_with, crd_versions, pool, prepare,
                                  record_figures, same_versions)
from tests.e2e.conftest import REPO, TENANT_GROUP, unique
from tests.support.helm import FAST_SETTINGS, helm  # noqa: F401  (the session's helm)

OLD_REVISION = "9dfc521"            # main as 0.1.0 was released
OLD_CHART = REPO / "tests" / "fixtures" / "chart-0.1.0"
NEW_CHART = REPO / "charts" / "gpu-binder"
NEW_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
CHURN_TARGET = 200                  # VMIs created (and most deleted) per test


def _build(**env: str) -> str:
    import os

    proc = subprocess.run(["bash", str(REPO / "tools/build-image.sh")], capture_output=True,
                          text=True, timeout=1800, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """{"old": the 0.1.0 image (built from git archive of OLD_REVISION), "new": the work
    tree's}, as `repository:tag` (cached: a warm build re-uses both)."""
    return {"old": _build(GIT_REVISION=OLD_REVISION), "new": _build()}


@pytest.fixture(scope="module")
def release(images, helm, tmp_path_factory):  # noqa: F811
    """A control plane of its own with 0.1.0 installed by `helm install` of the fixture
    chart (TLS Secret and client-CA ConfigMap made as an operator makes them, the webhook
    by URL to the pods' shared loopback port), and the Deployment's two pods running from
    the 0.1.0 image. Yields a Release."""
    tmp = tmp_path_factory.mktemp("upgrade")
    cp = ControlPlane()
    rel = None
    try:
        cp.start()
        prepare(cp, tmp)
        rel = Release(cp, helm, images, tmp, settings=FAST_SETTINGS)
        rel.install(OLD_CHART, "old")
        rel.note("helm install 0.1.0")
        rel.deployment.scale_up()
        assert rel.versions() == ["0.1.0", "0.1.0"]
        yield rel
    finally:
        if rel is not None:
            rel.close()
        cp.stop()


def _assert_clean(figures: dict, watch: Watch) -> None:
    assert figures["created"] >= CHURN_TARGET
    assert figures["unexpected"] == [], figures
    assert figures["errors_while_steady"] == [], figures
    assert (figures["admissions_lost"], figures["double_booked"]) == (0, 0), watch.messages[:20]
    assert figures["admitted"] >= CHURN_TARGET // 4, figures   # the load was real
    assert figures["samples"] >= 10, figures


# -- the tests ----------------------------------------------------------------------------

@pytest.mark.anyio
async def test_upgrade_and_rollback_under_churn_lose_no_admission(release, helm,  # noqa: F811
                                                                   tmp_path):
    """Item 3: 0.1.0 installed and serving; 200+ VMIs created and deleted by 4 tenants while
    the CRDs are applied, `helm upgrade` goes to the new chart and its pods replace the old
    ones one by one (maxUnavailable 0), then `helm rollback` goes back with every pod
    stopped before the old ones start (no replica serves for a moment). §7 holds throughout
    and after; a tenant saw only admissions, refusals and retryable errors; a device bound
    and attached by 0.1.0 is read by 0.2.0 and the other way round after the rollback."""
    from localcluster.fleet import Fleet

    cp, started = release.cp, time.monotonic()
    clients = Clients()
    try:
        admin = await clients.make(cp.admin_kubeconfig)
        fleet = Fleet(admin)
        from kubernetes_asyncio.client import CustomObjectsApi

        cls, tenants, configs = await pool(fleet, tmp_path, cp, tenants=4, nodes=3, units=4,
                                            budget=3, name=unique, group=TENANT_GROUP)
        apis = {ns: CustomObjectsApi(await clients.make(configs[ns])) for ns in tenants}
        _, (cns,), cconf = await pool(fleet, tmp_path, cp, tenants=1, nodes=2, units=1,
                                       budget=1, name=unique, group=TENANT_GROUP)
        compat = Compat(CustomObjectsApi(await clients.make(cconf[cns])), cns)
        # written by 0.1.0: held-0 Bound on a node and attached to vm-x
        assert release.versions() == ["0.1.0", "0.1.0"]
        node = await compat.admitted("vm-x")
        held = await compat.device(fleet)
        assert (held["phase"], held["nodeName"], held["attachedTo"]["vmi"]) == ("Bound", node,
                                                                                "vm-x")

        churn = Churn(apis, tenants, cls, seed=20, target=CHURN_TARGET)
        watch = Watch()
        phases = {}

        async def operations() -> None:
            await churn.reached(30)
            phases["leader before"] = (await anyio.to_thread.run_sync(
                release.wait_leader, {"0.1.0"})).version
            await anyio.to_thread.run_sync(release.upgrade, NEW_CHART, "new")
            await anyio.to_thread.run_sync(release.deployment.rolling_update)
            release.note("rolled to 0.2.0")
            assert release.versions() == [NEW_VERSION, NEW_VERSION]
            phases["leader after upgrade"] = (await anyio.to_thread.run_sync(
                release.wait_leader, {NEW_VERSION})).version
            for name, shipped in chart_crds(helm, NEW_CHART, cp).items():
                served, stored = crd_versions(cp, name)
                assert same_versions(served, shipped), name
                assert stored == [v["name"] for v in shipped if v.get("storage")], name
            # 0.2.0 reads what 0.1.0 wrote: held-0 attached to the live vm-x refuses vm-y
            status, got = await compat.try_create("vm-y")
            assert 400 <= status < 500, (status, got)         # refused: held-0 is taken
            await compat.delete("vm-x")        # released by 0.2.0's housekeeping (H2)
            assert await compat.admitted("vm-y") == node   # kept its node (B4, no move)

            await churn.reached(churn.created + 60)
            await anyio.to_thread.run_sync(release.rollback, 1)
            t0 = time.monotonic()
            await anyio.to_thread.run_sync(release.deployment.recreate)
            phases["no replica (s)"] = round(time.monotonic() - t0, 1)
            release.note("recreated at 0.1.0")
            assert release.versions() == ["0.1.0", "0.1.0"]
            phases["leader after rollback"] = (await anyio.to_thread.run_sync(
                release.wait_leader, {"0.1.0"})).version
            for name, shipped in chart_crds(helm, NEW_CHART, cp).items():
                assert same_versions(crd_versions(cp, name)[0], shipped), name  # kept
            # 0.1.0 reads what 0.2.0 wrote
            status, got = await compat.try_create("vm-z")
            assert 400 <= status < 500, (status, got)         # refused: held-0 is taken
            await compat.delete("vm-y")
            assert await compat.admitted("vm-z") == node
            churn.done.set()

        await churn_with(churn, operations, admin, watch)
        history = [(h["revision"], h["chart"], h["status"]) for h in release.history()]
        assert history == [(1, "gpu-binder-0.1.0", "superseded"),
                           (2, f"gpu-binder-{NEW_VERSION}", "superseded"),
                           (3, "gpu-binder-0.1.0", "deployed")], history
        figures = record_figures("upgrade-rollback", churn, watch, release, started, phases)
        _assert_clean(figures, watch)
        # the gap: while no replica served, tenants were told to retry, and their retries won
        assert sum(churn.tally.retried.values()) > 0, figures
    finally:
        await clients.close()


@pytest.mark.anyio
async def test_mixed_versions_with_the_leader_in_either_keep_the_invariants(release,
                                                                             tmp_path):
    """Item 4: a rolling update 0.1.0 → 0.2.0 paused with one pod of each version and the
    Lease held by the 0.1.0 pod, then finished; then a rolling rollback paused with one pod
    of each and the Lease held by the 0.2.0 pod, then finished; a 200+ VMI churn across all
    of it. In each mixed phase the pods of both versions answered reviews (the Service
    stand-in spreads kube-apiserver's connections), no tenant saw an error while no pod
    was starting or stopping, and §7 holds in every sample and after the churn settles.
    (A 0.2.0 that wrote `bindRequest.devices` in a form only it reads fails here: its
    reviews wait on a 0.1.0 leader that never decides them, 503s while steady.)"""
    from localcluster.fleet import Fleet

    cp, started = release.cp, time.monotonic()
    # from the previous test's end (or a fresh release): 0.1.0 running
    if release.versions() != ["0.1.0", "0.1.0"]:
        release.rollback(1)
        release.deployment.rolling_update()
    assert release.versions() == ["0.1.0", "0.1.0"]
    clients = Clients()
    try:
        admin = await clients.make(cp.admin_kubeconfig)
        fleet = Fleet(admin)
        from kubernetes_asyncio.client import CustomObjectsApi

        cls, tenants, configs = await pool(fleet, tmp_path, cp, tenants=4, nodes=3, units=4,
                                            budget=3, name=unique, group=TENANT_GROUP)
        apis = {ns: CustomObjectsApi(await clients.make(configs[ns])) for ns in tenants}
        churn = Churn(apis, tenants, cls, seed=4, target=CHURN_TARGET)
        watch = Watch()
        mixed = {}

        async def step(keep_leader_version: str) -> None:
            """One rolling-update step that keeps the current leader: a new pod ready,
            then the outdated pod that does not lead stopped."""
            leader = await anyio.to_thread.run_sync(release.wait_leader, {keep_leader_version})
            await anyio.to_thread.run_sync(release.deployment.surge)
            other = next(p for p in release.deployment.outdated() if p.name != leader.name)
            await anyio.to_thread.run_sync(release.deployment.stop_pod, other)

        async def mixed_phase(name: str, leader_version: str, creates: int) -> None:
            assert sorted(set(release.versions())) == sorted({"0.1.0", NEW_VERSION})
            pod = release.leader_pod()
            assert pod is not None and pod.version == leader_version, release.leader()
            n, before = churn.created, await anyio.to_thread.run_sync(release.reviews)
            await churn.reached(n + creates)
            pod = release.leader_pod()
            assert pod is not None and pod.version == leader_version, release.leader()
            after = await anyio.to_thread.run_sync(release.reviews)
            by_version = Counter()
            for p in release.deployment.running:
                by_version[p.version] += after[p.name] - before.get(p.name, 0)
            # both versions' webhooks answered reviews while the leader was in one of them
            assert set(+by_version) == {"0.1.0", NEW_VERSION}, by_version
            mixed[name] = {"VMIs": churn.created - n, "reviews": dict(by_version)}
            release.note(f"mixed, leader {leader_version}: {churn.created - n} VMIs")

        async def operations() -> None:
            await churn.reached(20)
            await anyio.to_thread.run_sync(release.upgrade, NEW_CHART, "new")
            await step("0.1.0")
            await mixed_phase("leader 0.1.0", "0.1.0", 70)
            await anyio.to_thread.run_sync(release.deployment.rolling_update)
            assert release.versions() == [NEW_VERSION, NEW_VERSION]
            await anyio.to_thread.run_sync(release.rollback)
            await step(NEW_VERSION)
            await mixed_phase(f"leader {NEW_VERSION}", NEW_VERSION, 70)
            await anyio.to_thread.run_sync(release.deployment.rolling_update)
            assert release.versions() == ["0.1.0", "0.1.0"]

        await churn_with(churn, operations, admin, watch)
        figures = record_figures("mixed-versions", churn, watch, release, started, {"mixed": mixed})
        _assert_clean(figures, watch)
        assert set(mixed) == {"leader 0.1.0", f"leader {NEW_VERSION}"}
    finally:
        await clients.close()
