"""The upgrade harness (used by tests/e2e/test_upgrade.py): a Helm
release whose Deployment's pods run as processes (`Release`, on `localcluster.rollout`),
tenants creating and deleting VMIs while it is upgraded or rolled back (`Churn`), the
invariants of docs/contract.md §7 sampled meanwhile and after settling (`Watch`, `churn_with`), and
objects one version wrote read by the other (`Compat`, the CRD comparisons).

What the tests assert stays in the test module; this module measures and records. Nothing
here imports the tests: the test session's helm, settings and name maker come in as
arguments.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

import anyio
import yaml

from localcluster import invariants
from localcluster.controlplane import ControlPlane
from localcluster.invariants import KV
from localcluster.metrics_text import parse_metrics
from localcluster.paths import TESTING_MANIFESTS
from localcluster.rollout import Deployment, Kubelet, Pod, Service

T = TypeVar("T")

NS, RELEASE = "cozy-system", "gpu-binder"
RETRYABLE = ("connection refused", "EOF", "connection reset", "broken pipe",
             "server closed idle connection", "use of closed network connection",
             "deadline exceeded", "timeout", "Timeout", "i/o timeout", "no route to host")
"""Words of a "failed calling webhook" 500 that make it retryable (a transport failure)."""

# (Go's "use of closed network connection": the API server's client wrote a request on a
# connection its reader had just seen closed by the peer, the harness's Service)
TRANSPORT = ("EOF", "connection reset", "broken pipe", "server closed idle connection",
             "use of closed network connection")
SAME_NAME = "a concurrent create of the same name"
"""W4/W5's retryable answer to a create of a name whose earlier try is still in flight: the
churn's own retry after a transport error, not an outage of a steady replica."""


async def until(probe: Callable[[], Awaitable[T]], *, timeout: float, interval: float,
                what: str) -> T:
    """The first truthy value of `probe()`, called every `interval` s (wall time: a real API
    server). TimeoutError naming `what` and the last value seen after `timeout` s."""
    last: object = None
    with anyio.move_on_after(timeout):
        while True:
            last = await probe()
            if last:
                return last  # type: ignore[return-value]
            await anyio.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout:g} s; last: {last!r}")


# -- the release --------------------------------------------------------------------------

def values(image: str, webhook_url: str, ca: bytes, settings: dict) -> str:
    """The chart values (YAML) of a release running `image` (`repository:tag`, never
    pulled) with `settings`, its webhook called by URL with the CA `ca` (PEM)."""
    repo, tag = image.rsplit(":", 1)
    return yaml.safe_dump({
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "settings": settings,
        "webhook": {"url": webhook_url,
                    "certificate": {"source": "secret", "caBundle": base64.b64encode(ca).decode()}}})


def prepare(cp: ControlPlane, tmp: Path) -> None:
    """What is on a control plane before the chart is installed: the testing manifests
    (localcluster.paths.TESTING_MANIFESTS) and KubeVirt's CRDs, then, as an operator makes
    them, the namespace `NS`, the webhook's TLS Secret (a server certificate for 127.0.0.1
    from `cp`'s CA, its files written into `tmp`) and the client-CA ConfigMap. Raises what
    `cp.kubectl` raises when a step fails."""
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


class Release:
    """The helm release `RELEASE` in `NS` on `cp` and its Deployment's pods
    (localcluster.rollout), the webhook served on `cp.webhook_port`. `helm` runs helm
    (`helm.run(*args, kubeconfig=...)` returning a CompletedProcess), `images` maps a
    version key ("old", "new") to its image, `settings` are the chart's `settings` values,
    `tmp` a directory of its own. `timeline` records what was done when (monotonic s)."""

    def __init__(self, cp: ControlPlane, helm, images: dict[str, str], tmp: Path, *,
                 settings: dict) -> None:
        self.cp, self.helm, self.images, self.tmp = cp, helm, images, tmp
        self.settings = settings
        self.url = f"https://127.0.0.1:{cp.webhook_port}/mutate-vmi"
        self.service = Service(cp.webhook_port)
        self.kubelet = Kubelet(cp, tmp / "pods")
        self.deployment = Deployment(self.kubelet, self.service, NS, RELEASE)
        self.timeline: list[tuple[float, str]] = []

    def note(self, what: str) -> None:
        """Record `what` in the timeline, now."""
        self.timeline.append((round(time.monotonic(), 1), what))

    def helm_run(self, *args: str) -> str:
        """helm's stdout; raises what `helm.run` raises when helm fails."""
        return self.helm.run(*args, kubeconfig=self.cp.admin_kubeconfig).stdout

    def values_file(self, which: str) -> Path:
        """A values file for the image `images[which]` (KeyError for an unknown key)."""
        path = self.tmp / f"values-{which}.yaml"
        path.write_text(values(self.images[which], self.url, self.cp.ca.cert_pem, self.settings))
        return path

    def apply_crds(self, chart: Path) -> None:
        """The documented pre-upgrade step (docs/install.md, "Upgrading")."""
        crds = self.helm_run("show", "crds", str(chart))
        self.cp.kubectl("apply", "--server-side", "--force-conflicts",
                        "--field-manager=gpu-binder-crds", "-f", "-", input=crds)
        self.note(f"CRDs of {chart.name} applied")

    def install(self, chart: Path, which: str) -> None:
        """`helm install` of `chart` with the image `images[which]`."""
        self.helm_run("install", RELEASE, str(chart), f"--namespace={NS}",
                      f"--values={self.values_file(which)}")

    def upgrade(self, chart: Path, which: str) -> None:
        """The CRDs of `chart` applied, then `helm upgrade` to it with `images[which]`."""
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
        """`helm history` as JSON: [{revision, chart, status, ...}], oldest first."""
        return json.loads(self.helm_run("history", RELEASE, f"--namespace={NS}",
                                        "--output=json"))

    def leader(self) -> str | None:
        """The Lease's holder, None when there is no Lease or no holder."""
        out = self.cp.kubectl("get", "lease", "gpu-binder", "-n", NS, "-o",
                              "jsonpath={.spec.holderIdentity}", check=False)
        return (out.stdout.strip() or None) if out.returncode == 0 else None

    def leader_pod(self) -> Pod | None:
        """The running pod holding the Lease, None when none does."""
        name = self.leader()
        return next((p for p in self.deployment.running if p.name == name), None)

    def wait_leader(self, versions: set[str], timeout: float = 30) -> Pod:
        """Wait (blocking, polling every 0.2 s) until a running pod of one of `versions`
        holds the Lease; returns it. TimeoutError naming the Lease and the running pods
        after `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = self.leader_pod()
            if pod is not None and pod.version in versions:
                return pod
            time.sleep(0.2)
        raise TimeoutError(f"no leader of {versions} in {timeout} s: lease {self.leader()}, "
                             f"running {[(p.name, p.version) for p in self.deployment.running]}")

    def versions(self) -> list[str]:
        """The running pods' versions, sorted."""
        return sorted(p.version for p in self.deployment.running)

    def reviews(self) -> dict[str, float]:
        """{pod name: admission reviews it answered} of the running pods (the documented
        metric gpu_binder_admission_seconds' count)."""
        return {p.name: sum(v for (name, _), v in parse_metrics(p.metrics()).items()
                            if name == "gpu_binder_admission_seconds_count")
                for p in self.deployment.running}

    def close(self) -> None:
        """Stop every pod, the working containers and the Service stand-in."""
        self.deployment.stop()
        self.kubelet.close()
        self.service.close()


def crd_versions(cp: ControlPlane, name: str) -> tuple[list, list]:
    """CRD `name`'s (spec.versions, status.storedVersions) as the API server serves them."""
    crd = json.loads(cp.kubectl("get", "crd", name, "-o", "json").stdout)
    return crd["spec"]["versions"], crd["status"]["storedVersions"]


def chart_crds(helm, chart: Path, cp: ControlPlane) -> dict[str, list]:
    """{CRD name: spec.versions} of the CRDs `chart` ships (`helm show crds`)."""
    out = helm.run("show", "crds", str(chart), kubeconfig=cp.admin_kubeconfig).stdout
    return {d["metadata"]["name"]: d["spec"]["versions"] for d in yaml.safe_load_all(out) if d}


def same_versions(served: list, shipped: list) -> bool:
    """The CRD's versions as served equal the chart's (the API server adds defaults only
    where the chart left them out, so compare the chart's keys). Pure."""
    def sub(want, got) -> bool:
        if isinstance(want, dict):
            return isinstance(got, dict) and all(k in got and sub(v, got[k]) for k, v in want.items())
        if isinstance(want, list):
            return isinstance(got, list) and len(want) == len(got) and all(
                sub(w, g) for w, g in zip(want, got))
        return want == got
    return sub(shipped, served)


# -- the churn driver ---------------------------------------------------------------------

@dataclass
class Tally:
    """What the tenants saw."""

    admitted: int = 0
    refused: Counter = field(default_factory=Counter)          # first words of the reason
    retried: Counter = field(default_factory=Counter)          # retryable error kinds
    unexpected: list[str] = field(default_factory=list)
    deleted: int = 0


WAITS_IN_LINE = "the set waits in the line for room"
"""The words the webhook adds to a bare VMI's refusal for room when it waits in the line
(`model.reasons.WaitsInLine`, a 503 with Retry-After): an answer, not an error."""


def refusal_key(message: str) -> str:
    """A refusal's words without its names and numbers (a key to count refusals by). Pure."""
    text = message.split("denied the request:", 1)[-1]
    words = [w for w in text.split() if not re.search(r"[\d/]", w)]
    return " ".join(words[:8])


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


def classify(status: int | None, message: str) -> str | None:
    """The retryable kind of a failed create, or None when it is not retryable. Pure."""
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
    after a refusal, and asks for 1-2 template devices and sometimes its held device.
    `api` maps each tenant namespace to a CustomObjectsApi as that tenant."""

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
        """Wait until the churn has created `n` VMIs; TimeoutError after `timeout` s."""
        async def probe() -> bool:
            return self.created >= n
        await until(probe, timeout=timeout, interval=0.1,
                    what=f"{n} VMIs created by the churn")

    async def _create(self, ns: str, body: dict) -> str:
        """'admitted' | 'refused' | 'failed'; retries retryable errors (60 s at most)."""
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
                    self.tally.refused[refusal_key(message)] += 1
                    return "refused"
                if exc.status == 503 and "denied the request" in message and WAITS_IN_LINE in message:
                    # the webhook's answer, not an outage: refused for room, the bare VMI
                    # waits in the line (P5) while its client retries; this churn gives up
                    # (its place then lapses after line.retryGrace) and deletes its oldest
                    self.tally.refused[refusal_key(message)] += 1
                    return "refused"
                kind = classify(exc.status, message)
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
        """Every tenant's loop, until `target` is reached and `done` is set."""
        async with anyio.create_task_group() as tg:
            for ns in self.tenants:
                tg.start_soon(self._tenant, ns)


# -- invariants (localcluster.invariants: docs/contract.md §7) -------------------------------------

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
        """Count one sample and its violations."""
        self.samples += 1
        for v in violations:
            (self.lost if v.kind in invariants.LOST_KINDS else self.double).add(v.key)
            self.messages.append(f"§{v.item} {v.kind} {'/'.join(map(str, v.obj))}: {v.message}")


async def sample_while(churn: Churn, admin, watch: Watch, stop: anyio.Event) -> None:
    """Check the invariants about every second until `stop` (the VMIs held as admitted
    across the whole read as settled)."""
    while not stop.is_set():
        before = {k for k in churn.live}
        snap = await invariants.snapshot(admin)
        watch.add(invariants.check(snap, settled=before & set(churn.live)))
        with anyio.move_on_after(1):
            await stop.wait()


async def settle_and_check(churn: Churn, admin, watch: Watch):
    """After the churn: wait until housekeeping has cleared what deleted or never-created
    VMIs left (`invariants.leftovers` empty), then check every existing VMI, and that every
    VMI held as admitted still exists (§7). Returns the last snapshot; TimeoutError listing
    what was left after 45 s."""
    left: list = []

    async def settled():
        snap = await invariants.snapshot(admin)
        left[:] = invariants.leftovers(snap)
        return None if left else snap
    try:
        snap = await until(settled, timeout=45, interval=0.5,
                           what="housekeeping cleared what gone VMIs left")
    except TimeoutError:
        raise TimeoutError(f"left after 45 s: {[v.to_dict() for v in left[:20]]}") from None
    watch.add(invariants.check(snap, settled=set(churn.live), final=True))
    return snap


async def churn_with(churn: Churn, operations: Callable[[], Awaitable[None]], admin,
                     watch: Watch) -> None:
    """Run `operations()` and the churn together, sampling the invariants while the churn
    runs: the churn ends (done) when the operations end, the sampling when the churn does;
    then settle and check (`settle_and_check`). What `operations` raises propagates."""
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


async def pool(fleet, tmp: Path, cp: ControlPlane, *, tenants: int, nodes: int, units: int,
               budget: int, name: Callable[[str], str], group: str):
    """A class of its own resource, `nodes` nodes of `units`, `tenants` tenants with
    `budget` and one held device `held-0` each, every name from `name(prefix)` (unique to
    the run), each tenant's user in `group`; returns (class, [tenant ns], {ns: kubeconfig})."""
    res = f"{name('gpu')}.example.com/gpu"
    cls = name("cls")
    await fleet.gpu_class(cls, res)
    for _ in range(nodes):
        await fleet.node(name("node"), {res: units})
    names, configs = [], {}
    for _ in range(tenants):
        ns, user = name("t"), name("user")
        await fleet.tenant(ns, budgets={res: budget}, user=user)
        await fleet.device(ns, "held-0", cls)
        names.append(ns)
        configs[ns] = cp.write_user_kubeconfig(tmp / f"{ns}.kubeconfig", user, (group,),
                                               namespace=ns)
    return cls, names, configs


class Clients:
    """kubernetes_asyncio clients (admin and per tenant), closed together."""

    def __init__(self) -> None:
        self.made = []

    async def make(self, path: Path):
        """An ApiClient of the kubeconfig at `path`."""
        from kubernetes_asyncio.config import new_client_from_config

        client = await new_client_from_config(config_file=str(path))
        self.made.append(client)
        return client

    async def close(self) -> None:
        """Close every client made."""
        for c in self.made:
            await c.close()


def record_figures(name: str, churn: Churn, watch: Watch, release: Release, started: float,
            extra: dict) -> dict:
    """The run's figures (created, admitted, refused by reason, retried by kind, errors
    while every replica was steady, violations, the release's timeline since `started`),
    printed as one `UPGRADE-FIGURES` line and written to figures-`name`.json in the
    release's directory."""
    out = {"test": name, "created": churn.created, "admitted": churn.tally.admitted,
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
    print("UPGRADE-FIGURES " + json.dumps(out))
    (release.tmp / f"figures-{name}.json").write_text(json.dumps(out, indent=1))
    return out


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
        """(201, the VMI) or (the API's status, its body's first 400 characters)."""
        from kubernetes_asyncio.client import ApiException

        try:
            return 201, await self.api.create_namespaced_custom_object(
                *KV[:2], self.ns, KV[2], self._body(name), _request_timeout=40)
        except ApiException as exc:
            return exc.status, str(exc.body)[:400]

    async def admitted(self, name: str) -> str:
        """Create `name` until admitted (a refusal while housekeeping has not yet released
        the device is retried, 30 s at most); returns its pinned node. AssertionError on an
        answer other than 201, 403, 500 or 503; TimeoutError after 30 s."""
        async def probe():
            status, got = await self.try_create(name)
            if status == 201:
                return got["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            if status not in (403, 500, 503):
                raise AssertionError(f"{name}: unexpected answer {status}: {got}")
            return None
        return await until(probe, timeout=30, interval=0.5, what=f"{name} admitted")

    async def delete(self, name: str) -> None:
        """Delete VMI `name`; ApiException as the API answers (404 included)."""
        await self.api.delete_namespaced_custom_object(*KV[:2], self.ns, KV[2], name)

    async def device(self, fleet) -> dict:
        """`held-0`'s status."""
        return (await fleet.get_device(self.ns, "held-0"))["status"]
