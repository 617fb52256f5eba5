"""The raw-resource-names policies never silently stop enforcing `rawResourceNames: denied`
when kube-apiserver loses their parameter, ConfigMap cozy-system/gpu-settings (issue 20 item
6, kubernetes#133827): the bindings say `parameterNotFoundAction: Deny`, so a request the
policies match is refused, by the policy's own rule or with kube-apiserver's "no params
found" message, and never admitted; the controller (H3) re-creates the parameter and reports
its absence (gpu_binder_policy_parameter_present, _recreated_total, Event
PolicyParameterMissing).

The module runs on a control plane of its own: kubernetes#133827 can leave kube-apiserver's
ConfigMap parameter informer stopped until the API server restarts, which would deny the
Pods and VMIs of every later module on a shared one.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from localcluster.paths import MANIFESTS
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, unique
from tests.e2e.helpers import eventually, scrape

pytestmark = pytest.mark.anyio
NS = "cozy-system"
RES = "example.com/param-gpu"
POLICY_FILE = MANIFESTS / "policies" / "raw-resource-names.yaml"
BY_POLICY = "cannot be requested directly"            # the Pod policy's own message
NO_PARAMS = "no params found for policy binding with `Deny` parameterNotFoundAction"
UNPUBLISHED = "has no resourceNames yet"                # a parameter H3 has not completed
REFUSALS = (BY_POLICY, NO_PARAMS, UNPUBLISHED)
POLICIES = ("gpu-binder-raw-pods", "gpu-binder-raw-vmis")
ROLE = "gpu-binder:controller"                        # controller/rbac.yaml, in NS


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A control plane of its own, the shipped manifests and one controller replica with
    rawResourceNames=denied and a 1 s housekeeping period; a GPUClass of RES and a tenant
    namespace. Yields (LocalCluster, tenant namespace)."""
    from localcluster.cluster import LocalCluster

    lc = LocalCluster(controllers=1,   # its own ControlPlane, stopped with it
                      controller_args=(*FAST_CONTROLLER_ARGS, "--raw-resource-names=denied"),
                      log_dir=tmp_path_factory.mktemp("param-logs"))
    lc.start()
    cp = lc.cp
    try:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": "param-class"},
            "spec": {"resourceName": RES, "onCordon": "Move"}}))
        ns = unique("tenant")
        cp.kubectl("create", "namespace", ns)
        cp.kubectl("create", "serviceaccount", "default", "-n", ns, check=False)
        yield lc, ns
    finally:
        lc.stop()


def _pod(raw: bool) -> str:
    limits = {"limits": {RES: "1"}} if raw else {}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": unique("p")},
                           "spec": {"containers": [{"name": "c", "image": "busybox",
                                                    "resources": limits}]}})


def probe(cp, ns: str, *, raw: bool) -> tuple[bool, str]:
    """A Pod created with server-side dry run (admission runs, nothing is stored): (admitted,
    kube-apiserver's message); `raw` asks for RES directly."""
    out = cp.kubectl("create", "-n", ns, "-f", "-", "--dry-run=server", check=False,
                     input=_pod(raw))
    return out.returncode == 0, out.stderr.strip()


def assert_refused(cp, ns: str, what: str) -> str:
    """The raw Pod is refused, by the policy or for want of (part of) its parameter; returns
    which of REFUSALS."""
    admitted, msg = probe(cp, ns, raw=True)
    assert not admitted, f"{what}: a Pod naming {RES} directly was admitted (policy not enforced)"
    for reason in REFUSALS:
        if reason in msg:
            return reason
    raise AssertionError((what, msg))


def refused_for(cp, ns: str, seconds: float, what: str) -> list[str]:
    """Probe the raw Pod for `seconds` (each probe refused, see assert_refused); the reasons
    seen, in order. A bounded observation window, not a synchronisation."""
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(assert_refused(cp, ns, what))
    return seen


def policies_without_settings() -> str:
    """The shipped policies and bindings (not the settings ConfigMap), as YAML."""
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text())
            if d and d["kind"] != "ConfigMap"]
    return yaml.safe_dump_all(docs)


def settings(cp) -> dict | None:
    out = cp.kubectl("get", "configmap", "gpu-settings", "-n", NS, "-o", "json", check=False)
    return json.loads(out.stdout)["data"] if out.returncode == 0 else None


def events(cp) -> list[str]:
    out = cp.kubectl("get", "events", "-n", NS, "--field-selector",
                     "reason=PolicyParameterMissing", "-o", "json")
    return [e["message"] for e in json.loads(out.stdout)["items"]]


async def metric(lc, name: str) -> float | None:
    return (await scrape(lc, 0)).get((name, ()))


async def until(fn, what: str, timeout: float = 30.0):
    async def probe_():
        return fn()
    return await eventually(probe_, timeout=timeout, interval=0.2, what=what)


WANT = {"rawResourceNames": "denied", "resourceNames": RES, "deviceClassNames": ""}


async def test_a_missing_parameter_denies_with_a_clear_message_and_H3_restores_it(cluster):
    lc, ns = cluster
    cp = lc.cp
    await until(lambda: settings(cp) == WANT, "H3 publishing the class's resource name")
    await until(lambda: BY_POLICY in probe(cp, ns, raw=True)[1], "the policy enforcing")
    assert probe(cp, ns, raw=False) == (True, "")
    assert await metric(lc, "gpu_binder_policy_parameter_present") == 1
    before = await metric(lc, "gpu_binder_policy_parameter_recreated_total")

    # hold the parameter missing: the controller's Role loses `create` on ConfigMaps (fewer
    # rights than shipped), so H3 finds it missing and cannot create it
    role = json.loads(cp.kubectl("get", "role", ROLE, "-n", NS, "-o", "json").stdout)
    role["rules"] = [r for r in role["rules"]
                     if not (r.get("resources") == ["configmaps"] and "create" in r["verbs"])]
    cp.kubectl("replace", "-f", "-", input=json.dumps(role))
    try:
        cp.kubectl("delete", "configmap", "gpu-settings", "-n", NS)

        async def reported() -> bool:
            return await metric(lc, "gpu_binder_policy_parameter_present") == 0
        try:
            await eventually(reported, timeout=20, what="the metric showing the parameter missing")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; settings {settings(cp)}\n{lc.log_tail(0, 40)}") from None
        assert any("cannot create it" in m for m in events(cp)), events(cp)
        await until(lambda: NO_PARAMS in probe(cp, ns, raw=True)[1],
                    "kube-apiserver seeing the parameter gone")
        assert set(refused_for(cp, ns, 3, "parameter missing")) == {NO_PARAMS}
        # the price of failing closed: a Pod the policy would admit is refused too, clearly
        admitted, msg = probe(cp, ns, raw=False)
        assert not admitted and NO_PARAMS in msg, msg
    finally:  # the shipped Role again
        cp.kubectl("apply", "--server-side", "--force-conflicts",
                   "--field-manager=gpu-binder-install", "-f",
                   str(MANIFESTS / "controller" / "rbac.yaml"))

    await until(lambda: settings(cp) == WANT, "H3 re-creating the parameter")

    async def restored() -> bool:
        return (await metric(lc, "gpu_binder_policy_parameter_present") == 1
                and await metric(lc, "gpu_binder_policy_parameter_recreated_total")
                == before + 1)
    await eventually(restored, timeout=20, what="the metrics showing the parameter back")
    assert any("H3 created it" in m for m in events(cp)), events(cp)
    await until(lambda: BY_POLICY in probe(cp, ns, raw=True)[1], "the policy enforcing again")
    assert probe(cp, ns, raw=False) == (True, "")


async def test_policies_and_bindings_deleted_and_recreated_never_stop_enforcing(cluster):
    """kubernetes#133827's sequences: the policies and bindings deleted and re-created with
    the parameter in place, then all three deleted and re-created in one batch. Once a
    re-created binding is in force, every raw Pod is refused; whatever kube-apiserver's
    parameter informer went through, it is never admitted."""
    lc, ns = cluster
    cp = lc.cp
    await until(lambda: settings(cp) == WANT, "H3 publishing the class's resource name")
    names = [f"validatingadmissionpolicybinding/{p}" for p in POLICIES] + \
            [f"validatingadmissionpolicy/{p}" for p in POLICIES]
    seen: list[str] = []
    for batch in (False, True):
        cp.kubectl("delete", *names, *(["configmap/gpu-settings", "-n", NS] if batch else []))
        # re-created as the shipped file would be, by an operator of rawResourceNames=denied
        docs = policies_without_settings()
        if batch:
            docs = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "gpu-settings", "namespace": NS},
                                   "data": {"rawResourceNames": "denied"}}) + "---\n" + docs
        cp.kubectl("apply", "--server-side", "--force-conflicts",
                   "--field-manager=gpu-binder-install", "-f", "-", input=docs)
        # the re-created bindings take a moment to reach admission; from the first refusal on
        # nothing naming RES passes
        await until(lambda: not probe(cp, ns, raw=True)[0], "a re-created binding in force")
        seen += refused_for(cp, ns, 4, f"re-created (batch={batch})")
        await until(lambda: settings(cp) == WANT, "H3 repairing the parameter")
        seen += refused_for(cp, ns, 2, f"after H3 (batch={batch})")
    admitted, msg = probe(cp, ns, raw=False)
    if not admitted:
        # kubernetes#133827 hit: kube-apiserver's parameter informer stays stopped; the
        # policies fail closed with the clear message until kube-apiserver restarts
        assert NO_PARAMS in msg, msg
        cp.restart_apiserver()
        await until(lambda: probe(cp, ns, raw=False)[0], "kube-apiserver restarted", 60)
    await until(lambda: BY_POLICY in probe(cp, ns, raw=True)[1], "the policy enforcing")
    assert seen, seen
    print(f"refusals after re-creation: {seen.count(BY_POLICY)} by the policy, "
          f"{seen.count(NO_PARAMS)} for want of the parameter, {seen.count(UNPUBLISHED)} "
          f"before H3 published the names; plain Pod "
          f"{'admitted' if admitted else 'refused until kube-apiserver restarted'}")


