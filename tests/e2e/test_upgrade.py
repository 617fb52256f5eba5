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

A churn driver (concurrent tenants creating and deleting VMIs asking for template and held
devices, retrying what is retryable) runs while helm upgrades and rolls back. What is checked
is invariants of the contract (DESIGN §7), sampled while the churn runs and once it settles,
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

import asyncio
import base64
import json
import random
import re
import subprocess
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
import yaml

from localcluster.controlplane import ControlPlane
from localcluster.paths import TESTING_MANIFESTS
from localcluster.rollout import Deployment, Kubelet, Service
from tests.e2e.conftest import REPO, TENANT_GROUP, unique
from tests.e2e.helpers import eventually
from tests.support.helm import FAST_SETTINGS, helm  # noqa: F401  (the session's helm)

OLD_REVISION = "9dfc521"            # main as 0.1.0 was released
OLD_CHART = REPO / "tests" / "fixtures" / "chart-0.1.0"
NEW_CHART = REPO / "charts" / "gpu-binder"
NS, RELEASE = "cozy-system", "gpu-binder"
NEW_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
KV = ("kubevirt.io", "v1", "virtualmachineinstances")
CHURN_TARGET = 200                  # VMIs created (and most deleted) per test
RETRYABLE = ("connection refused", "EOF", "connection reset", "broken pipe",
             "server closed idle connection", "use of closed network connection",
             "deadline exceeded", "timeout", "Timeout", "i/o timeout", "no route to host")


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


def _values(image: str, webhook_url: str, ca: bytes) -> str:
    repo, tag = image.rsplit(":", 1)
    return yaml.safe_dump({
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "settings": FAST_SETTINGS,
        "webhook": {"url": webhook_url,
                    "certificate": {"source": "secret", "caBundle": base64.b64encode(ca).decode()}}})


class Release:
    """The helm release and its Deployment's pods (localcluster.rollout) on `cp`."""

    def __init__(self, cp: ControlPlane, helm, images: dict[str, str], tmp: Path) -> None:
        self.cp, self.helm, self.images, self.tmp = cp, helm, images, tmp
        self.url = f"https://127.0.0.1:{cp.webhook_port}/mutate-vmi"
        self.service = Service(cp.webhook_port)
        self.kubelet = Kubelet(cp, tmp / "pods")
        self.deployment = Deployment(self.kubelet, self.service, NS, RELEASE)
        self.timeline: list[tuple[float, str]] = []

    def note(self, what: str) -> None:
        self.timeline.append((round(time.monotonic(), 1), what))

    def helm_run(self, *args: str) -> str:
        return self.helm.run(*args, kubeconfig=self.cp.admin_kubeconfig).stdout

    def values_file(self, which: str) -> Path:
        path = self.tmp / f"values-{which}.yaml"
        path.write_text(_values(self.images[which], self.url, self.cp.ca.cert_pem))
        return path

    def apply_crds(self, chart: Path) -> None:
        """The documented pre-upgrade step (docs/install.md, "Upgrading")."""
        crds = self.helm_run("show", "crds", str(chart))
        self.cp.kubectl("apply", "--server-side", "--force-conflicts",
                        "--field-manager=gpu-binder-crds", "-f", "-", input=crds)
        self.note(f"CRDs of {chart.name} applied")

    def upgrade(self, chart: Path, which: str) -> None:
        self.apply_crds(chart)
        self.helm_run("upgrade", RELEASE, str(chart), f"--namespace={NS}",
                      f"--values={self.values_file(which)}")
        self.note(f"helm upgrade to {chart.name}")

    def rollback(self, revision: int | None = None) -> None:
        """`helm rollback` to `revision` (None: the one before the current)."""
        self.helm_run("rollback", RELEASE, *([str(revision)] if revision else []),
                      f"--namespace={NS}")
        self.note(f"helm rollback to {revision or 'the previous revision'}")

    def history(self) -> list[dict]:
        return json.loads(self.helm_run("history", RELEASE, f"--namespace={NS}",
                                        "--output=json"))

    def leader(self) -> str | None:
        out = self.cp.kubectl("get", "lease", "gpu-binder", "-n", NS, "-o",
                              "jsonpath={.spec.holderIdentity}", check=False)
        return (out.stdout.strip() or None) if out.returncode == 0 else None

    def leader_pod(self):
        name = self.leader()
        return next((p for p in self.deployment.running if p.name == name), None)

    def wait_leader(self, versions: set[str], timeout: float = 30) -> object:
        """Wait until a running pod of one of `versions` holds the Lease; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = self.leader_pod()
            if pod is not None and pod.version in versions:
                return pod
            time.sleep(0.2)
        raise AssertionError(f"no leader of {versions} in {timeout} s: lease {self.leader()}, "
                             f"running {[(p.name, p.version) for p in self.deployment.running]}")

    def versions(self) -> list[str]:
        return sorted(p.version for p in self.deployment.running)

    def reviews(self) -> dict[str, float]:
        """{pod name: admission reviews it answered} of the running pods (the documented
        metric gpu_binder_admission_seconds' count)."""
        from prometheus_client.parser import text_string_to_metric_families

        return {p.name: sum(x.value for f in text_string_to_metric_families(p.metrics())
                            for x in f.samples if x.name == "gpu_binder_admission_seconds_count")
                for p in self.deployment.running}


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
        from localcluster.kubevirt import install_crds

        cp.kubectl("apply", "--server-side", "-f", str(TESTING_MANIFESTS))
        install_crds(cp)
        cp.kubectl("create", "namespace", NS)
        pair = cp.ca.issue_server(["127.0.0.1", "localhost"])
        (tmp / "tls.crt").write_bytes(pair.cert_pem)
        (tmp / "tls.key").write_bytes(pair.key_pem)
        cp.kubectl("create", "secret", "tls", "gpu-binder-webhook-tls", "-n", NS,
                   f"--cert={tmp / 'tls.crt'}", f"--key={tmp / 'tls.key'}")
        cp.kubectl("create", "configmap", "gpu-binder-webhook-client-ca", "-n", NS,
                   f"--from-file=ca.crt={cp.webhook_client_ca_file}")
        rel = Release(cp, helm, images, tmp)
        rel.helm_run("install", RELEASE, str(OLD_CHART), f"--namespace={NS}",
                     f"--values={rel.values_file('old')}")
        rel.note("helm install 0.1.0")
        rel.deployment.scale_up()
        assert rel.versions() == ["0.1.0", "0.1.0"]
        yield rel
    finally:
        if rel is not None:
            rel.deployment.stop()
            rel.kubelet.close()
            rel.service.close()
        cp.stop()


# -- the churn driver ---------------------------------------------------------------------

@dataclass
class Tally:
    """What the tenants saw."""

    admitted: int = 0
    refused: Counter = field(default_factory=Counter)          # first words of the reason
    retried: Counter = field(default_factory=Counter)          # retryable error kinds
    unexpected: list[str] = field(default_factory=list)
    deleted: int = 0


def _reason(message: str) -> str:
    """A refusal's words without its names and numbers (a key to count refusals by)."""
    text = message.split("denied the request:", 1)[-1]
    words = [w for w in text.split() if not re.search(r"[\d/]", w)]
    return " ".join(words[:8])


# (Go's "use of closed network connection": the API server's client wrote a request on a
# connection its reader had just seen closed by the peer, the harness's Service)
TRANSPORT = ("EOF", "connection reset", "broken pipe", "server closed idle connection",
             "use of closed network connection")
SAME_NAME = "a concurrent create of the same name"
"""W4/W5's retryable answer to a create of a name whose earlier try is still in flight: the
churn's own retry after a transport error, not an outage of a steady replica."""


def outside(errors: list[tuple[float, float, str, str]], pods, forced: list[float], *,
            after: float = 2.0) -> list:
    """The retryable errors whose try overlapped no span in which a pod was starting or
    stopping (Pod.windows, widened by `after` s): errors while every running replica was
    steady and ready, which a tenant must never see. A connection error (EOF, reset, broken pipe) during
    which the harness's Service closed a connection (`forced`) is the harness's, not a
    replica's, and is left out, as is SAME_NAME (the churn's own retry meeting its earlier try);
    a replica's other answers (503, 504, 429, timeouts) never are."""
    spans = [w for p in pods for w in p.windows(after=after)]
    return [(round(b, 1), round(e, 1), k, m) for b, e, k, m in errors
            if not any(b <= hi and e >= lo for lo, hi in spans)
            and not (k in TRANSPORT and any(b - 0.1 <= c <= e for c in forced))
            and SAME_NAME not in m]


def _classify(status: int | None, message: str) -> str | None:
    """The retryable kind of a failed create, or None when it is not retryable."""
    if status in (429, 503, 504):
        return str(status)
    if status == 500 and "failed calling webhook" in message:
        # The API server quotes the webhook's URL, whose query is "?timeout=25s": match the
        # error after it, or every transport error would read as a timeout.
        cause = re.sub(r'"https?://[^"]*"', "", message)
        return next((k for k in RETRYABLE if k in cause), None)
    return None


class Churn:
    """Tenants creating and deleting VMIs through the API server until `target` VMIs were
    created and `done` is set. Each tenant keeps at most `live_cap` VMIs, deletes its oldest
    after a refusal, and asks for 1-2 template devices and sometimes its held device."""

    def __init__(self, api, tenants: list[str], cls: str, *, seed: int, target: int,
                 live_cap: int = 2) -> None:
        self.api, self.tenants, self.cls = api, tenants, cls
        self.rng = random.Random(seed)
        self.target, self.live_cap = target, live_cap
        self.done = anyio.Event()
        self.created = 0
        self.tally = Tally()
        self.live: dict[tuple[str, str], str] = {}      # (ns, vmi) -> pinned node
        self.admitted: set[tuple[str, str]] = set()
        self.errors: list[tuple[float, float, str, str]] = []  # (began, ended, kind, message)

    async def reached(self, n: int, timeout: float = 120) -> None:
        await eventually(self._at(n), timeout=timeout, interval=0.1,
                         what=f"{n} VMIs created by the churn")

    def _at(self, n: int):
        async def probe() -> bool:
            return self.created >= n
        return probe

    async def _create(self, ns: str, body: dict) -> str:
        """'admitted' | 'refused'; retries retryable errors (60 s at most)."""
        from kubernetes_asyncio.client import ApiException

        api = self.api[ns]
        deadline = time.monotonic() + 60
        while True:
            began = time.monotonic()
            try:
                obj = await api.create_namespaced_custom_object(*KV[:2], ns, KV[2], body,
                                                                _request_timeout=40)
                self.live[(ns, body["metadata"]["name"])] = \
                    obj["spec"]["nodeSelector"]["kubernetes.io/hostname"]
                return "admitted"
            except ApiException as exc:
                message = exc.body if isinstance(exc.body, str) else str(exc.body)
                try:
                    message = json.loads(message).get("message", message)
                except ValueError:
                    pass
                if exc.status == 409:  # an earlier try was admitted after all
                    obj = await api.get_namespaced_custom_object(*KV[:2], ns, KV[2],
                                                                 body["metadata"]["name"])
                    self.live[(ns, body["metadata"]["name"])] = \
                        obj["spec"]["nodeSelector"]["kubernetes.io/hostname"]
                    return "admitted"
                if exc.status == 403 and "denied the request" in message:
                    self.tally.refused[_reason(message)] += 1
                    return "refused"
                kind = _classify(exc.status, message)
                detail = message[:240]
                if kind is None:
                    self.tally.unexpected.append(f"{exc.status}: {message[:300]}")
                    return "failed"
            except (asyncio.TimeoutError, OSError) as exc:   # aiohttp's errors are OSErrors
                kind, detail = f"client {type(exc).__name__}", repr(exc)[:240]
            self.tally.retried[kind] += 1
            self.errors.append((began, time.monotonic(), kind, detail))
            if time.monotonic() > deadline:
                self.tally.unexpected.append(f"still failing after 60 s: {kind}")
                return "failed"
            await anyio.sleep(0.3)

    async def _delete(self, ns: str, name: str) -> None:
        from kubernetes_asyncio.client import ApiException

        self.live.pop((ns, name), None)
        try:
            await self.api[ns].delete_namespaced_custom_object(*KV[:2], ns, KV[2], name,
                                                               _request_timeout=30)
            self.tally.deleted += 1
        except ApiException as exc:
            if exc.status != 404:
                self.tally.unexpected.append(f"delete {ns}/{name}: {exc.status}")

    async def _tenant(self, ns: str) -> None:
        mine: list[str] = []
        i = 0
        while not (self.created >= self.target and self.done.is_set()):
            i += 1
            name = f"vm-{i}"
            annotations = {"gpu.cozystack.io/templates": f"{self.cls}={self.rng.choice([1, 1, 2])}"}
            held_free = not any(self.live.get((ns, m)) and m.endswith("-h") for m in mine)
            if held_free and self.rng.random() < 0.3:
                name += "-h"
                annotations["gpu.cozystack.io/devices"] = "held-0"
            body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "metadata": {"name": name, "annotations": annotations},
                    "spec": {"domain": {"devices": {},
                                        "resources": {"requests": {"memory": "64Mi"}}}}}
            self.created += 1
            outcome = await self._create(ns, body)
            if outcome == "admitted":
                self.tally.admitted += 1
                self.admitted.add((ns, name))
                mine.append(name)
            if mine and (len(mine) > self.live_cap or outcome != "admitted"):
                await self._delete(ns, mine.pop(0))
            await anyio.sleep(0.2)   # a tenant's pace; the churn lasts as long as the upgrade

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for ns in self.tenants:
                tg.start_soon(self._tenant, ns)


# -- invariants (localcluster.invariants: DESIGN §7) -------------------------------------

@dataclass
class Watch:
    """Invariant violations seen by the samples (localcluster.invariants.Violation keys),
    split as the figures count them: `lost` (an admission's devices not where its answer
    said), `double` (a device named twice, a node over allocatable, a tenant over budget,
    housekeeping leftovers after settling)."""

    lost: set = field(default_factory=set)
    double: set = field(default_factory=set)
    messages: list[str] = field(default_factory=list)
    samples: int = 0

    def add(self, violations) -> None:
        from localcluster.invariants import LOST_KINDS

        self.samples += 1
        for v in violations:
            (self.lost if v.kind in LOST_KINDS else self.double).add(v.key)
            self.messages.append(f"§{v.item} {v.kind} {'/'.join(map(str, v.obj))}: {v.message}")


async def sample_while(churn: Churn, admin, watch: Watch, stop: anyio.Event) -> None:
    """Check the invariants about every second until `stop` (the VMIs held as admitted
    across the whole read as settled)."""
    from localcluster import invariants

    while not stop.is_set():
        before = {k for k in churn.live}
        snap = await invariants.snapshot(admin)
        watch.add(invariants.check(snap, settled=before & set(churn.live)))
        with anyio.move_on_after(1):
            await stop.wait()


async def settle_and_check(churn: Churn, admin, watch: Watch):
    """After the churn: wait until housekeeping has cleared what deleted or never-created
    VMIs left (`invariants.leftovers` empty), then check every existing VMI, and that every
    VMI held as admitted still exists (§7). Returns the last snapshot."""
    from localcluster import invariants

    left: list = []

    async def settled():
        snap = await invariants.snapshot(admin)
        left[:] = invariants.leftovers(snap)
        return None if left else snap
    try:
        snap = await eventually(settled, timeout=45, interval=0.5,
                                what="housekeeping cleared what gone VMIs left")
    except AssertionError:
        raise AssertionError(f"left after 45 s: {[v.to_dict() for v in left[:20]]}") from None
    watch.add(invariants.check(snap, settled=set(churn.live), final=True))
    return snap


async def churn_with(churn: Churn, operations, admin, watch: Watch) -> None:
    """Run `operations()` and the churn together, sampling the invariants while the churn
    runs: the churn ends (done) when the operations end, the sampling when the churn does;
    then settle and check (`settle_and_check`)."""
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        async def ops_then_stop():
            try:
                await operations()
            finally:
                churn.done.set()
        tg.start_soon(ops_then_stop)

        async def churn_then_stop():
            try:
                await churn.run()
            finally:
                stop.set()
        tg.start_soon(churn_then_stop)
        tg.start_soon(sample_while, churn, admin, watch, stop)
    await settle_and_check(churn, admin, watch)


async def _pool(fleet, tmp: Path, cp: ControlPlane, *, tenants: int, nodes: int,
                units: int, budget: int):
    """A class of its own resource, `nodes` nodes of `units`, `tenants` tenants with
    `budget` and one held device `held-0` each; returns (class, [tenant ns], {ns: kubeconfig})."""
    res = f"{unique('gpu')}.example.com/gpu"
    cls = unique("cls")
    await fleet.gpu_class(cls, res)
    for _ in range(nodes):
        await fleet.node(unique("node"), {res: units})
    names, configs = [], {}
    for _ in range(tenants):
        ns, user = unique("t"), unique("user")
        await fleet.tenant(ns, budgets={res: budget}, user=user)
        await fleet.device(ns, "held-0", cls)
        names.append(ns)
        configs[ns] = cp.write_user_kubeconfig(tmp / f"{ns}.kubeconfig", user, (TENANT_GROUP,),
                                               namespace=ns)
    return cls, names, configs


class Clients:
    """kubernetes_asyncio clients (admin and per tenant), closed together."""

    def __init__(self) -> None:
        self.made = []

    async def make(self, path: Path):
        from kubernetes_asyncio.config import new_client_from_config

        client = await new_client_from_config(config_file=str(path))
        self.made.append(client)
        return client

    async def close(self) -> None:
        for c in self.made:
            await c.close()


def _report(name: str, churn: Churn, watch: Watch, release: Release, started: float,
            extra: dict) -> dict:
    figures = {"test": name, "created": churn.created, "admitted": churn.tally.admitted,
               "refused": sum(churn.tally.refused.values()),
               "refusal_reasons": dict(churn.tally.refused),
               "retried": dict(churn.tally.retried), "deleted": churn.tally.deleted,
               "unexpected": churn.tally.unexpected[:10],
               "errors_while_steady": outside(churn.errors, release.deployment.pods,
                                              release.service.forced),
               "service_closes": len(release.service.forced),
               "admissions_lost": len(watch.lost), "double_booked": len(watch.double),
               "samples": watch.samples, "seconds": round(time.monotonic() - started, 1),
               "timeline": [(round(t - started, 1), w) for t, w in release.timeline
                            if t >= started], **extra}
    print("UPGRADE-FIGURES " + json.dumps(figures))
    (release.tmp / f"figures-{name}.json").write_text(json.dumps(figures, indent=1))
    return figures


def _assert_clean(figures: dict, watch: Watch) -> None:
    assert figures["created"] >= CHURN_TARGET
    assert figures["unexpected"] == [], figures
    assert figures["errors_while_steady"] == [], figures
    assert (figures["admissions_lost"], figures["double_booked"]) == (0, 0), watch.messages[:20]
    assert figures["admitted"] >= CHURN_TARGET // 4, figures   # the load was real
    assert figures["samples"] >= 10, figures


# -- objects across versions (the CRD path) ----------------------------------------------

class Compat:
    """Tenant `ns` with held device `held-0` of a class on two nodes: VMIs asking for it
    are admitted by one version and read, blocked and released by the other."""

    def __init__(self, api, ns: str) -> None:
        self.api, self.ns = api, ns

    def _body(self, name: str) -> dict:
        return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "annotations": {"gpu.cozystack.io/devices": "held-0"}},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}

    async def try_create(self, name: str) -> tuple[int, dict | str]:
        from kubernetes_asyncio.client import ApiException

        try:
            return 201, await self.api.create_namespaced_custom_object(
                *KV[:2], self.ns, KV[2], self._body(name), _request_timeout=40)
        except ApiException as exc:
            return exc.status, str(exc.body)[:400]

    async def admitted(self, name: str) -> str:
        """Create `name` until admitted (a refusal while housekeeping has not yet released
        the device is retried, 30 s at most); returns its pinned node."""
        async def probe():
            status, got = await self.try_create(name)
            if status == 201:
                return got["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            assert status in (403, 500, 503), (status, got)
            return None
        return await eventually(probe, timeout=30, interval=0.5, what=f"{name} admitted")

    async def delete(self, name: str) -> None:
        await self.api.delete_namespaced_custom_object(*KV[:2], self.ns, KV[2], name)

    async def device(self, fleet) -> dict:
        return (await fleet.get_device(self.ns, "held-0"))["status"]


def _crd_versions(cp: ControlPlane, name: str) -> tuple[list, list]:
    crd = json.loads(cp.kubectl("get", "crd", name, "-o", "json").stdout)
    return crd["spec"]["versions"], crd["status"]["storedVersions"]


def _chart_crds(helm_, chart: Path, cp) -> dict[str, list]:  # noqa: F811
    out = helm_.run("show", "crds", str(chart), kubeconfig=cp.admin_kubeconfig).stdout
    return {d["metadata"]["name"]: d["spec"]["versions"] for d in yaml.safe_load_all(out) if d}


def _same_versions(served: list, shipped: list) -> bool:
    """The CRD's versions as served equal the chart's (the API server adds defaults only
    where the chart left them out, so compare the chart's keys)."""
    def sub(want, got) -> bool:
        if isinstance(want, dict):
            return isinstance(got, dict) and all(k in got and sub(v, got[k]) for k, v in want.items())
        if isinstance(want, list):
            return isinstance(got, list) and len(want) == len(got) and all(
                sub(w, g) for w, g in zip(want, got))
        return want == got
    return sub(shipped, served)


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

        cls, tenants, configs = await _pool(fleet, tmp_path, cp, tenants=4, nodes=3, units=4,
                                            budget=3)
        apis = {ns: CustomObjectsApi(await clients.make(configs[ns])) for ns in tenants}
        _, (cns,), cconf = await _pool(fleet, tmp_path, cp, tenants=1, nodes=2, units=1,
                                       budget=1)
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
            for name, shipped in _chart_crds(helm, NEW_CHART, cp).items():
                served, stored = _crd_versions(cp, name)
                assert _same_versions(served, shipped), name
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
            for name, shipped in _chart_crds(helm, NEW_CHART, cp).items():
                assert _same_versions(_crd_versions(cp, name)[0], shipped), name  # kept
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
        figures = _report("upgrade-rollback", churn, watch, release, started, phases)
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

        cls, tenants, configs = await _pool(fleet, tmp_path, cp, tenants=4, nodes=3, units=4,
                                            budget=3)
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
        figures = _report("mixed-versions", churn, watch, release, started, {"mixed": mixed})
        _assert_clean(figures, watch)
        assert set(mixed) == {"leader 0.1.0", f"leader {NEW_VERSION}"}
    finally:
        await clients.close()
