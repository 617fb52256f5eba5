"""`gpu-binder health` with a kubeconfig that may not read one source of marks (HL2,
cli/health.py): a 403 on listing DeviceTaintRules or on getting the ConfigMap `gpu-suspects`
prints one line naming the missing right (verb, resource, namespace) and the suspects of the
other source (exit 0); 403 on both exits 1; any other failure still exits 2. The API is a
stub at this level: kubernetes_asyncio's two API classes and its client factory, answering
as an API server does (a Status body), so `k8s.errors.translate` reads the real shape."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import kubernetes_asyncio.client as k8s_client
import kubernetes_asyncio.config as k8s_config
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from cli.main import main
from model.device.dra import DeviceRef
from model.health import Evidence, FailedStart, HealthSettings, Target
from model.health_mark import mark_entry, rule_body

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=timezone.utc)
RULE_REF = DeviceRef("gpu.nvidia.com", "hgx-node-01", "gpu-vfio-3")
MARK_REF = DeviceRef("gpu.nvidia.com", "hgx-node-02", "gpu-vfio-5")
NS = "cozy-system"

def suspect(ref: DeviceRef):
    ev = Evidence()
    for i, name in enumerate("abc"):
        ev = ev.record([Target(ref.pool, "hgx-h100", ref)],
                       FailedStart("t", f"vm-{name}", f"u-{name}", T0 + timedelta(minutes=i), "VMI Failed"))
    return ev.suspects(T0 + timedelta(minutes=3), HealthSettings())[0]


def status(code: int, reason: str, message: str) -> ApiException:
    exc = ApiException(status=code, reason=reason)
    exc.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "message": message, "reason": reason, "code": code})
    return exc


FORBIDDEN_RULES = status(403, "Forbidden", 'devicetaintrules.resource.k8s.io is forbidden: User "bob" '
                         'cannot list resource "devicetaintrules" in API group "resource.k8s.io" at the cluster scope')
FORBIDDEN_CM = status(403, "Forbidden", 'configmaps "gpu-suspects" is forbidden: User "bob" cannot get '
                      'resource "configmaps" in API group "" in the namespace "cozy-system"')


class Api:
    """The ApiClient `new_client_from_config` returns: what `_marks` calls on it."""

    def __init__(self):
        self.closed = False

    def sanitize_for_serialization(self, obj):
        return obj

    async def close(self):
        self.closed = True


@pytest.fixture
def server(monkeypatch):
    """`answers["rules"]`/`answers["cm"]`: the list of rules or the ConfigMap, or the
    ApiException the server answers with."""
    answers: dict = {}
    api = Api()

    class CustomObjectsApi:
        def __init__(self, client):
            assert client is api

        async def list_cluster_custom_object(self, group, version, plural, **kw):
            assert (group, version, plural) == ("resource.k8s.io", "v1beta2", "devicetaintrules")
            got = answers["rules"]
            if isinstance(got, Exception):
                raise got
            return {"items": got}

    class CoreV1Api:
        def __init__(self, client):
            assert client is api

        async def read_namespaced_config_map(self, name, namespace):
            assert (name, namespace) == ("gpu-suspects", NS)
            got = answers["cm"]
            if isinstance(got, Exception):
                raise got
            return got

    async def new_client_from_config(config_file=None, **kw):
        return api

    monkeypatch.setattr(k8s_client, "CustomObjectsApi", CustomObjectsApi)
    monkeypatch.setattr(k8s_client, "CoreV1Api", CoreV1Api)
    monkeypatch.setattr(k8s_config, "new_client_from_config", new_client_from_config)
    answers["api"] = api
    return answers


def rules() -> list[dict]:
    return [rule_body(suspect(RULE_REF), T0)]


def configmap() -> dict:
    key, value = mark_entry(suspect(MARK_REF), T0)
    return {"metadata": {"name": "gpu-suspects", "namespace": NS}, "data": {key: value}}


def run(capsys, kubeconfig, *extra):
    code = main(["health", "--kubeconfig", kubeconfig, "--settings-namespace", NS, *extra])
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


def test_no_right_to_list_rules_says_which_and_shows_the_configmaps_marks(capsys, kubeconfig, server):
    server.update(rules=FORBIDDEN_RULES, cm=configmap())
    code, out, err = run(capsys, kubeconfig)
    assert code == 0
    assert err == ["gpu-binder health: no right to list devicetaintrules.resource.k8s.io cluster-wide "
                   "with this kubeconfig: suspects marked by DeviceTaintRules are not shown"]
    assert out.startswith("gpu.nvidia.com/hgx-node-02/gpu-vfio-5  node hgx-node-02")
    assert server["api"].closed


def test_no_right_to_get_the_configmap_says_which_and_shows_the_rules(capsys, kubeconfig, server):
    server.update(rules=rules(), cm=FORBIDDEN_CM)
    code, out, err = run(capsys, kubeconfig, "--json")
    assert code == 0
    assert err == ["gpu-binder health: no right to get configmaps in namespace cozy-system "
                   "(gpu-suspects) with this kubeconfig: suspects marked there (where "
                   "DeviceTaintRules are not served) are not shown"]
    (s,) = json.loads(out)
    assert s["device"]["device"] == "gpu-vfio-3" and s["mark"]["kind"] == "DeviceTaintRule"


def test_no_right_to_read_either_exits_1_naming_both(capsys, kubeconfig, server):
    server.update(rules=FORBIDDEN_RULES, cm=FORBIDDEN_CM)
    code, out, err = run(capsys, kubeconfig)
    assert code == 1 and out == ""
    assert len(err) == 2
    assert "no right to list devicetaintrules.resource.k8s.io cluster-wide" in err[0]
    assert "no right to get configmaps in namespace cozy-system (gpu-suspects)" in err[1]
    code, out, _ = run(capsys, kubeconfig, "--json")
    assert code == 1 and json.loads(out)["error"].startswith("nothing could be read: no right to list")


def test_both_readable_shows_both_and_says_nothing_on_stderr(capsys, kubeconfig, server):
    server.update(rules=rules(), cm=configmap())
    code, out, err = run(capsys, kubeconfig)
    assert code == 0 and err == []
    assert "hgx-node-01/gpu-vfio-3" in out and "hgx-node-02/gpu-vfio-5" in out


def test_rules_not_served_and_no_configmap_is_nothing_suspected(capsys, kubeconfig, server):
    server.update(rules=status(404, "NotFound", "the server could not find the requested resource"),
                  cm=status(404, "NotFound", 'configmaps "gpu-suspects" not found'))
    code, out, err = run(capsys, kubeconfig)
    assert (code, err) == (0, []) and "no suspected GPUs" in out


def test_another_failure_still_stops_the_command_with_exit_2(capsys, kubeconfig, server):
    server.update(rules=status(500, "InternalError", "etcdserver: request timed out"), cm=configmap())
    code, _, err = run(capsys, kubeconfig)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("gpu-binder health: cannot read the suspects: ")


def test_clear_with_one_source_forbidden_lifts_what_it_can_read(capsys, kubeconfig, server, monkeypatch):
    import cli.health as health
    cleared = []

    async def clear(api, mark, rules_, cm, namespace, user, context):
        cleared.append((mark.kind, mark.device.device, user))

    monkeypatch.setattr(health, "_clear", clear)
    server.update(rules=rules(), cm=FORBIDDEN_CM)
    code, out, err = run(capsys, kubeconfig, "clear", "hgx-node-01/gpu-vfio-3")
    assert code == 0 and cleared == [("DeviceTaintRule", "gpu-vfio-3", "alice")]  # the kubeconfig's user (tests/cli/conftest.py)
    assert len(err) == 1 and "no right to get configmaps" in err[0]
