"""The Helm chart charts/gpu-binder (issue 15): `helm lint`, `helm template` with several
value sets applied with server-side dry run to the test API server, the chart kept equal to
the kustomize base k8s/manifests, the restricted Pod Security profile, and one real
`helm install` that admits a VMI created by a tenant.

helm is built from its pinned Go module by tools/build-helm.sh (with the Certificate and
Issuer CRDs of the pinned cert-manager release, applied here so the chart's cert-manager
objects are checked against cert-manager's real schema; no cert-manager controller runs, so
no certificate is issued and no caBundle is injected in these tests).
"""

from __future__ import annotations

import base64
import copy
import difflib
import json
import time

import pytest
import yaml

from localcluster.paths import MANIFESTS, TESTING_MANIFESTS
from tests.e2e.conftest import TENANT_GROUP, unique
from tests.e2e.helpers import class_rv, eventually, namespace_rv, node_rv, replicas_saw
from tests.support.helm import CHART, FAST_SETTINGS, NS, RELEASE, Helm, helm  # noqa: F401 (helm: a fixture)

DRY_RUN = ("apply", "--server-side", "--dry-run=server", "--force-conflicts",
           "--field-manager=gpu-binder-helm-tests", "-f", "-")

# What only the chart has (by default) and only the kustomize base has, as (kind, name).
CHART_ONLY = {("ConfigMap", "gpu-binder-config"), ("PodDisruptionBudget", "gpu-binder"),
              ("Certificate", "gpu-binder-webhook"), ("Issuer", "gpu-binder-selfsigned")}
KUSTOMIZE_ONLY = {("Namespace", NS)}   # the chart uses the release namespace (--create-namespace)


@pytest.fixture(scope="module")
def cluster(control_plane, helm):
    """The session's API server with the release namespace and cert-manager's CRDs."""
    cp = control_plane
    cp.kubectl("apply", "--server-side", "--field-manager=gpu-binder-install",
               "-f", str(MANIFESTS / "controller" / "namespace.yaml"))
    cp.kubectl("apply", "--server-side", "--field-manager=gpu-binder-helm-tests",
               "-f", str(helm.cert_manager_crds))
    crds = ("certificates.cert-manager.io", "issuers.cert-manager.io",
            "clusterissuers.cert-manager.io")
    # (`kubectl wait --for=condition` errors out while a CRD has no status conditions yet)
    deadline = time.monotonic() + 60
    while True:
        items = json.loads(cp.kubectl("get", "crd", *crds, "-o", "json").stdout)["items"]
        got = [c["status"] for i in items
               for c in (i.get("status") or {}).get("conditions") or []
               if c["type"] == "Established"]
        if got == ["True"] * len(crds):
            return cp
        assert time.monotonic() < deadline, f"cert-manager CRDs not Established in 60 s: {got}"
        time.sleep(0.2)


def by_kind(objs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def controller_config(objs: list[dict]) -> dict:
    return yaml.safe_load(by_kind(objs)[("ConfigMap", "gpu-binder-config")]["data"]["config.yaml"])


def ca_bundle(cp) -> str:
    return base64.b64encode(cp.ca.cert_pem).decode()


# -- lint and templates -------------------------------------------------------------------

VALUE_SETS = {
    "defaults": {},
    "cert-manager-cluster-issuer": {"webhook": {"certificate": {"certManager": {
        "issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca"}}}}},
    "provided-secret": {"webhook": {"certificate": {"source": "secret", "secretName": "my-tls",
                                                    "caBundle": "Q0EgUEVN"}}},
    "raw-resource-names-denied": {"rawResourceNames": "denied"},
    "replicas-3": {"replicas": 3, "resources": {"requests": {"cpu": "200m", "memory": "256Mi"},
                                                "limits": {"memory": "1Gi"}}},
}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict_passes(helm, name, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUE_SETS[name]))
    out = helm.run("lint", str(CHART), "--strict", f"--values={values}")
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout, out.stdout


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_template_applies_with_server_side_dry_run(cluster, helm, name):
    values = VALUE_SETS[name]
    if name == "provided-secret":
        values = copy.deepcopy(values)
        values["webhook"]["certificate"]["caBundle"] = ca_bundle(cluster)
    rendered = helm.template(values).stdout
    out = cluster.kubectl(*DRY_RUN, input=rendered)
    applied = sorted(line.split(" ")[0] for line in out.stdout.splitlines())
    objs = [d for d in yaml.safe_load_all(rendered) if d]
    assert len(applied) == len(objs), out.stdout
    assert all(line.endswith("serverside-applied (server dry run)")
               for line in out.stdout.splitlines()), out.stdout
    got = by_kind(objs)
    kinds = {k for k, _ in got}
    deploy = got[("Deployment", "gpu-binder")]
    hook = got[("MutatingWebhookConfiguration", "gpu-binder")]["webhooks"][0]
    annotations = got[("MutatingWebhookConfiguration", "gpu-binder")]["metadata"].get(
        "annotations", {})
    cert = got.get(("Certificate", "gpu-binder-webhook"))
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert hook["clientConfig"]["service"] == {"name": "gpu-binder", "namespace": NS,
                                               "path": "/mutate-vmi", "port": 443}
    assert got[("PodDisruptionBudget", "gpu-binder")]["spec"]["maxUnavailable"] == 1
    if name == "defaults":
        assert {"Certificate", "Issuer"} <= kinds
        assert annotations == {"cert-manager.io/inject-ca-from": f"{NS}/gpu-binder-webhook"}
        assert "caBundle" not in hook["clientConfig"]
        assert cert["spec"]["dnsNames"] == [f"gpu-binder.{NS}.svc",
                                            f"gpu-binder.{NS}.svc.cluster.local"]
        assert cert["spec"]["secretName"] == "gpu-binder-webhook-tls"
        assert cert["spec"]["issuerRef"] == {"name": "gpu-binder-selfsigned", "kind": "Issuer",
                                             "group": "cert-manager.io"}
        assert got[("Issuer", "gpu-binder-selfsigned")]["spec"] == {"selfSigned": {}}
        assert volumes["tls"]["secret"]["secretName"] == "gpu-binder-webhook-tls"
        assert deploy["spec"]["replicas"] == 2
        assert controller_config(objs)["raw_resource_names"] == "allowed"
    elif name == "cert-manager-cluster-issuer":
        assert "Issuer" not in kinds
        assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                             "group": "cert-manager.io"}
        assert annotations == {"cert-manager.io/inject-ca-from": f"{NS}/gpu-binder-webhook"}
    elif name == "provided-secret":
        assert not {"Certificate", "Issuer"} & kinds
        assert annotations == {}
        assert hook["clientConfig"]["caBundle"] == ca_bundle(cluster)
        assert volumes["tls"]["secret"]["secretName"] == "my-tls"
    elif name == "raw-resource-names-denied":
        assert controller_config(objs)["raw_resource_names"] == "denied"
        assert {k for k, n in got if k.startswith("ValidatingAdmissionPolicy")} == {
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
        assert sorted(n for k, n in got if k == "ValidatingAdmissionPolicy") == [
            "gpu-binder-admitted-vmis", "gpu-binder-attached-devices", "gpu-binder-raw-claims",
            "gpu-binder-raw-pods", "gpu-binder-raw-vmis"]
    elif name == "replicas-3":
        assert deploy["spec"]["replicas"] == 3
        assert deploy["spec"]["template"]["spec"]["containers"][0]["resources"] == {
            "requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def test_template_in_another_namespace_names_it_everywhere(cluster, helm):
    ns = unique("gpu-system")
    cluster.kubectl("create", "namespace", ns)
    try:
        rendered = helm.template({"namespace": {"create": True}}, namespace=ns).stdout
        assert NS not in rendered
        objs = [d for d in yaml.safe_load_all(rendered) if d]
        got = by_kind(objs)
        assert got[("Namespace", ns)]["metadata"]["name"] == ns
        assert {b["spec"]["paramRef"]["namespace"] for (k, _), b in got.items()
                if k == "ValidatingAdmissionPolicyBinding" and "paramRef" in b["spec"]} == {ns}
        config = controller_config(objs)
        assert (config["settings_namespace"], config["lease_namespace"]) == (ns, ns)
        hook = got[("MutatingWebhookConfiguration", "gpu-binder")]["webhooks"][0]
        system = ["kube-system", "kube-public", "kube-node-lease", ns]
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == system
        assert [b["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"]
                for (k, n), b in got.items()
                if k == "ValidatingAdmissionPolicyBinding" and n.startswith("gpu-binder-raw-")] \
            == [system, system, system]
        assert got[("NetworkPolicy", "gpu-binder")]["metadata"]["namespace"] == ns
        out = cluster.kubectl(*DRY_RUN, input=rendered)
        assert len(out.stdout.splitlines()) == len(objs), out.stdout
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.mark.parametrize(("values", "named"), [
    ({"rawResourceNames": "maybe"}, "rawResourceNames"),
    ({"settings": {"bindTimeout": 23}}, "bindTimeout"),
    ({"webhook": {"timeoutSeconds": 15}}, "settings.bindTimeout (20 s) must be at least 3 s below"
                                          " webhook.timeoutSeconds (15 s)"),
    ({"settings": {"renewDeadline": 20}}, "leaseDuration (10) > renewDeadline (20)"),
    ({"settings": {"bindTimeout": 10, "attachmentGrace": 5}}, "settings.bindTimeout must be "
                                                              "shorter than settings.attachmentGrace"),
    ({"settings": {"webhookPort": 1}}, "webhookPort"),
    ({"webhook": {"certificate": {"source": "secret"}}}, "webhook.certificate.caBundle is required"),
    ({"webhook": {"certificate": {"source": "vault"}}}, "source"),
])
def test_bad_values_are_refused_naming_the_value(helm, values, named):
    proc = helm.template(values, check=False)
    assert proc.returncode != 0
    assert named in proc.stderr, proc.stderr


def test_chart_settings_are_accepted_by_the_controller(helm, tmp_path):
    """The rendered config file and the Deployment's flags go through the controller's own
    config loader and argument parser (k8s/config.py, cli/main.py)."""
    from cli.main import build_parser
    from k8s.config import load

    settings = {"attachmentGrace": 90, "bindTimeout": 12.5, "leaseName": "gb",
                "leaseDuration": 20, "renewDeadline": 12, "retryPeriod": 3,
                "housekeepingPeriod": 7, "leaderElection": False, "writeAttempts": 2,
                "prepareTTL": 12, "maxRestartSeconds": 30}
    objs = helm.objects({"settings": settings, "rawResourceNames": "denied"})
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(by_kind(objs)[("ConfigMap", "gpu-binder-config")]["data"]["config.yaml"])
    for f in ("tls.crt", "tls.key"):
        (tmp_path / f).write_text("x")
    (tmp_path / "ca.crt").write_text("x")
    cfg = load(str(cfg_file), env={}, flags={"webhook_cert": str(tmp_path / "tls.crt"),
                                             "webhook_key": str(tmp_path / "tls.key"),
                                             "webhook_client_ca": str(tmp_path / "ca.crt")})
    assert (cfg.attachment_grace, cfg.bind_timeout, cfg.lease_name, cfg.lease_duration,
            cfg.renew_deadline, cfg.retry_period, cfg.housekeeping_period,
            cfg.leader_election, cfg.raw_resource_names, cfg.settings_namespace,
            cfg.lease_namespace, cfg.write_attempts, cfg.prepare_ttl,
            cfg.max_restart_seconds) == (90.0, 12.5, "gb", 20.0, 12.0, 3.0, 7.0, False,
                                         "denied", NS, NS, 2, 12.0, 30.0)
    container = by_kind(objs)[("Deployment", "gpu-binder")]["spec"]["template"]["spec"][
        "containers"][0]
    args = build_parser().parse_args(container["args"])
    assert (args.config, args.webhook_cert, args.webhook_key, args.webhook_client_ca) == (
        "/etc/gpu-binder/config.yaml", "/tls/tls.crt", "/tls/tls.key", "/client-ca/ca.crt")
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/gpu-binder", "/tls", "/client-ca"} <= mounts


# -- the chart and the kustomize base stay equal ------------------------------------------

def _strip(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("labels", None)
    obj["metadata"].pop("annotations", None)
    return obj


def _subset_diff(want, got, path: str = "") -> list[str]:
    """Where `want` (kustomize) is not contained in `got` (chart): dicts by key, lists of
    named dicts by name, other lists by containment."""
    if isinstance(want, dict) and isinstance(got, dict):
        return [d for k, v in want.items()
                for d in ([f"{path}.{k}: missing"] if k not in got
                          else _subset_diff(v, got[k], f"{path}.{k}"))]
    if isinstance(want, list) and isinstance(got, list):
        if all(isinstance(x, dict) and "name" in x for x in want + got):
            named = {x["name"]: x for x in got}
            return [d for x in want for d in
                    ([f"{path}[{x['name']}]: missing"] if x["name"] not in named
                     else _subset_diff(x, named[x["name"]], f"{path}[{x['name']}]"))]
        return [f"{path}: {x!r} missing" for x in want if x not in got]
    return [] if want == got else [f"{path}: kustomize {want!r}, chart {got!r}"]


def _diff(a: dict, b: dict) -> str:
    return "\n".join(difflib.unified_diff(yaml.safe_dump(a).splitlines(),
                                          yaml.safe_dump(b).splitlines(),
                                          "kustomize", "chart", lineterm=""))


def test_chart_defaults_equal_the_kustomize_base(control_plane, helm):
    """Every object of `kubectl kustomize k8s/manifests` is in the chart's default render
    with the same content and at least its labels (RBAC rules, webhook rules and
    failurePolicy/sideEffects/timeoutSeconds, policies and bindings, CRDs, Service, the
    dashboard ConfigMap); the Deployment's kustomize fields are all in the chart's (which
    adds --config, the restricted securityContext, /tmp)."""
    kust = by_kind([d for d in yaml.safe_load_all(
        control_plane.kubectl("kustomize", str(MANIFESTS)).stdout) if d])
    chart = by_kind(helm.objects())
    assert set(chart) - CHART_ONLY == set(kust) - KUSTOMIZE_ONLY, (
        f"only in the chart: {sorted(set(chart) - CHART_ONLY - set(kust))}; "
        f"only in k8s/manifests: {sorted(set(kust) - KUSTOMIZE_ONLY - set(chart))}")
    for key in sorted(set(kust) - KUSTOMIZE_ONLY):
        labels = chart[key]["metadata"].get("labels") or {}
        assert (kust[key]["metadata"].get("labels") or {}).items() <= labels.items(), key
        want, got = _strip(kust[key]), _strip(chart[key])
        if key[0] == "Deployment":
            missing = _subset_diff(want, got)
            assert not missing, f"{key}: the chart lacks kustomize's {missing}"
        else:
            assert got == want, f"{key} differs:\n{_diff(want, got)}"
    # (the CRD, dashboard and policy files are generated: tests/cli/test_chart_sync.py)


# -- restricted Pod Security profile -------------------------------------------------------

@pytest.mark.parametrize("source", ["chart", "kustomize"])
def test_pod_passes_the_restricted_pod_security_profile(cluster, helm, source):
    """The Deployment's Pod template (the chart's default render, or `kubectl kustomize
    k8s/manifests`), created as a Pod (server dry run) in a namespace that enforces the
    `restricted` Pod Security Standard, is admitted; the same Pod without the seccomp
    profile is refused, so the profile is really enforced there."""
    objects = helm.objects() if source == "chart" else [
        d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(MANIFESTS)).stdout) if d]
    ns = unique("restricted")
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                        "pod-security.kubernetes.io/enforce-version=latest")
        template = by_kind(objects)[("Deployment", "gpu-binder")]["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "gpu-binder-probe", "namespace": ns,
                            "labels": template["metadata"]["labels"]},
               "spec": template["spec"]}
        out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod))
        assert out.stdout.strip() == "pod/gpu-binder-probe created (server dry run)", out.stderr
        loose = copy.deepcopy(pod)
        del loose["spec"]["securityContext"]["seccompProfile"]
        del loose["spec"]["containers"][0]["securityContext"]["seccompProfile"]
        bad = cluster.kubectl("create", "--dry-run=server", "-f", "-",
                              input=yaml.safe_dump(loose), check=False)
        assert bad.returncode != 0 and 'violates PodSecurity "restricted:latest"' in bad.stderr
        assert "seccompProfile" in bad.stderr, bad.stderr
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


# -- one real install ----------------------------------------------------------------------

@pytest.mark.anyio
async def test_helm_install_then_tenant_vmi_is_admitted_and_raw_pod_refused(helm, tmp_path):
    """`helm install --create-namespace` of the chart into an empty API server of its own,
    with rawResourceNames=denied and the webhook pointed by URL at two loopback replicas.
    The replicas run as subprocesses (there is no kubelet to run the Deployment) with a token
    of the chart's ServiceAccount and the chart's config file read back from its ConfigMap.
    A tenant's VMI asking for a template device is admitted, pinned and Bound (W3); a raw Pod
    naming the class's resource in the tenant namespace is refused by the chart's policy,
    with the parameters the controller published (H3); `helm uninstall` removes the release.

    (Its own API server, not the session's: the session's already holds the kustomize
    objects, and a ValidatingAdmissionPolicy deleted and re-created with its binding in one
    batch, as an uninstall followed by later tests' applies does, is left without its params
    by kube-apiserver (kubernetes/kubernetes#133827): later policy tests would fail.)"""
    from kubernetes_asyncio.config import new_client_from_config

    from localcluster.controlplane import ControlPlane
    from localcluster.fleet import Fleet
    from localcluster.cluster import LocalCluster

    cp = ControlPlane()
    config = tmp_path / "config.yaml"
    lc = LocalCluster(controllers=2, control_plane=cp, log_dir=tmp_path / "logs",
                      controller_args=(f"--config={config}",), install=False,
                      kubeconfig=tmp_path / "sa.kubeconfig")
    client = None
    try:
        cp.start()
        # KubeVirt's own CRDs (localcluster.kubevirt) and the tenant's VMI editor role
        from localcluster.kubevirt import install_crds

        cp.kubectl("apply", "--server-side", "-f", str(TESTING_MANIFESTS))
        install_crds(cp)
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump({
            "rawResourceNames": "denied", "settings": FAST_SETTINGS,
            "webhook": {"url": lc.webhook_url,
                        "certificate": {"source": "secret", "caBundle": ca_bundle(cp)}}}))
        helm.run("install", RELEASE, str(CHART), f"--namespace={NS}", "--create-namespace",
                 f"--values={values}", kubeconfig=cp.admin_kubeconfig)
        status = json.loads(helm.run("status", RELEASE, f"--namespace={NS}", "--output=json",
                                     kubeconfig=cp.admin_kubeconfig).stdout)
        assert (status["info"]["status"], status["version"]) == ("deployed", 1)
        hook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", "gpu-binder",
                                     "-o", "json").stdout)
        assert hook["webhooks"][0]["clientConfig"]["url"] == lc.webhook_url
        config.write_text(cp.kubectl("get", "configmap", "gpu-binder-config", "-n", NS, "-o",
                                     r"jsonpath={.data.config\.yaml}").stdout)
        cp.write_service_account_kubeconfig(lc.kubeconfig, NS, "gpu-binder")
        lc.start()
        lease = json.loads(cp.kubectl("get", "lease", "gpu-binder", "-n", NS, "-o",
                                      "json").stdout)
        assert lease["spec"]["leaseDurationSeconds"] == 4           # the chart's settings

        client = await new_client_from_config(config_file=str(cp.admin_kubeconfig))
        fleet = Fleet(client)
        res, cls, node = "nvidia.com/GH100_H100", "h100", "gpu-node-0"
        await fleet.gpu_class(cls, res)
        await fleet.node(node, {res: 2})
        tenant, user = "tenant-a", "user-a"
        await fleet.tenant(tenant, user=user)
        await replicas_saw(lc, {"gpuclasses": await class_rv(fleet, cls),
                                "nodes": await node_rv(fleet, node),
                                "namespaces": await namespace_rv(fleet, tenant)},
                           what="the class, the node and the tenant")
        kubeconfig = cp.write_user_kubeconfig(tmp_path / "tenant.kubeconfig", user,
                                              (TENANT_GROUP,), namespace=tenant)
        vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
               "metadata": {"name": "vmi-helm",
                            "annotations": {"gpu.cozystack.io/templates": f"{cls}=1"}},
               "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}}}
        out = cp.kubectl("create", "-f", "-", kubeconfig=kubeconfig, input=yaml.safe_dump(vmi))
        assert out.stdout.strip() == "virtualmachineinstance.kubevirt.io/vmi-helm created"
        got = json.loads(cp.kubectl("get", "vmi", "vmi-helm", "-n", tenant, "-o", "json").stdout)
        assert got["spec"]["nodeSelector"] == {"kubernetes.io/hostname": node}
        assert got["spec"]["domain"]["devices"]["gpus"] == [
            {"name": f"vmi-helm-{cls}-0", "deviceName": res}]
        dev = await fleet.get_device(tenant, f"vmi-helm-{cls}-0")
        assert (dev["status"]["phase"], dev["status"]["nodeName"],
                dev["status"]["attachedTo"]["vmi"]) == ("Bound", node, "vmi-helm")
        # W7: the chart's policy keeps the admitted VMI's annotations as admission wrote them
        strip = cp.kubectl("annotate", "vmi", "vmi-helm", "-n", tenant,
                           "gpu.cozystack.io/templates-", kubeconfig=kubeconfig, check=False)
        assert strip.returncode != 0 and "ValidatingAdmissionPolicy 'gpu-binder-admitted-vmis'" \
            in strip.stderr and "cannot be added, changed or removed" in strip.stderr, strip.stderr

        def pod(i: int) -> str:
            return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                   "metadata": {"name": f"raw-{i}"},
                                   "spec": {"containers": [{"name": "c", "image": "busybox",
                                                            "resources": {"limits": {res: "1"}}}]}})
        tries = iter(range(1000))

        async def probe():
            # the leader publishes gpu-settings within a housekeeping period (1 s)
            got = cp.kubectl("create", "-n", tenant, "-f", "-", input=pod(next(tries)),
                             check=False)
            assert got.returncode != 0 or "created" in got.stdout, got.stderr
            return got.stderr if got.returncode != 0 else None
        err = await eventually(probe, timeout=20, interval=0.5, what="raw Pod refused")
        assert "ValidatingAdmissionPolicy 'gpu-binder-raw-pods'" in err, err
        assert f"GPU resources ({res}) cannot be requested directly" in err, err

        lc.stop()
        helm.run("uninstall", RELEASE, f"--namespace={NS}", kubeconfig=cp.admin_kubeconfig)
        gone = cp.kubectl("get", "mutatingwebhookconfiguration", "gpu-binder", check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
        # CRDs in the chart's crds/ outlive the release (Helm never deletes them)
        assert cp.kubectl("get", "crd", "gpudevices.gpu.cozystack.io", "-o", "name").stdout \
            .strip() == "customresourcedefinition.apiextensions.k8s.io/gpudevices.gpu.cozystack.io"
    finally:
        lc.stop()
        if client is not None:
            await client.close()
        cp.stop()
