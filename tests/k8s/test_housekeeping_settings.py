"""H3's handling of a missing settings ConfigMap (`k8s.housekeeping.Housekeeper.ensure_settings`),
the parameter of the shipped ValidatingAdmissionPolicies whose bindings deny while it is
missing (kubernetes#133827): what it records (`settings_present`, `settings_recreated`) and
the Warning Events it writes. The API calls go to a `fakes.kube_client.ScriptedClient`; tests/e2e/
test_manifests.py runs the whole story against a real API server."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.housekeeping import FIELD_MANAGER, Housekeeper

pytestmark = pytest.mark.anyio
NS = "cozy-system"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _error(status: int, reason: str) -> errors.ApiError:
    """What `KubeClient.create_config_map` raises for a refused create."""
    cls = errors.AlreadyExists if reason == "AlreadyExists" else errors.Forbidden
    return cls("create ConfigMap gpu-settings", status, f"{reason} here", reason=reason)


def _keeper(client: ScriptedClient, settings: dict) -> Housekeeper:
    cache = SimpleNamespace(settings=settings, settings_namespace=NS,
                            view=SimpleNamespace(classes=lambda: {}))
    return Housekeeper(client, cache, grace=timedelta(minutes=2),  # type: ignore[arg-type]
                       raw_policy="denied")


async def test_H3_a_missing_parameter_that_cannot_be_created_reads_absent_and_is_told_once():
    client = ScriptedClient()
    client.script("create_config_map", _error(403, "Forbidden"), _error(403, "Forbidden"))
    keeper = _keeper(client, {})
    await keeper.ensure_settings()
    await keeper.ensure_settings()
    assert (keeper.settings.settings_present, keeper.settings.settings_recreated) == (False, 0)
    assert len(client.of("create_config_map")) == 2                     # both refused
    events = [body for _, body in client.of("create_event")]
    assert [e["reason"] for e in events] == ["PolicyParameterMissing"]  # once per absence
    event = events[0]
    assert (event["type"], event["involvedObject"]["kind"], event["involvedObject"]["name"],
            event["metadata"]["namespace"]) == ("Warning", "ConfigMap", "gpu-settings", NS)
    assert "cannot create it" in event["message"] and "Forbidden" in event["message"]
    # every policy whose binding reads it (parameterNotFoundAction: Deny) is named
    assert ("ValidatingAdmissionPolicies gpu-binder-raw-pods, gpu-binder-raw-vmis and "
            "gpu-binder-raw-claims," in event["message"])
    assert "every Pod, VMI, ResourceClaim and ResourceClaimTemplate" in event["message"]
    await keeper.ensure_settings()                    # the third create succeeds
    assert (keeper.settings.settings_present, keeper.settings.settings_recreated) == (True, 1)
    third = client.calls[-2]                          # the create, then its Event
    assert (third.method, third.field_manager, third.args[1]["data"]) == (
        "create_config_map", FIELD_MANAGER, {"resourceNames": "", "deviceClassNames": "", "rawResourceNames": "denied"})
    events = [body for _, body in client.of("create_event")]
    assert len(events) == 2 and "H3 created it" in events[1]["message"]


async def test_H3_already_exists_means_the_cache_was_behind_not_missing():
    client = ScriptedClient()
    client.script("create_config_map", _error(409, "AlreadyExists"))
    keeper = _keeper(client, {})
    await keeper.ensure_settings()
    assert (keeper.settings.settings_present, keeper.settings.settings_recreated) == (True, 0)
    assert [c.method for c in client.calls] == ["create_config_map"]    # no Event


async def test_H3_a_present_parameter_reads_present_without_any_call():
    client = ScriptedClient()
    keeper = _keeper(client, {(NS, "gpu-settings"): {
        "data": {"resourceNames": "", "deviceClassNames": "", "rawResourceNames": "denied"}}})
    await keeper.ensure_settings()
    assert (keeper.settings.settings_present, client.calls) == (True, [])
