"""H3's handling of a missing settings ConfigMap (`k8s.housekeeping.Housekeeper.ensure_settings`),
the parameter of the shipped ValidatingAdmissionPolicies whose bindings deny while it is
missing (kubernetes#133827): what it records (`settings_present`, `settings_recreated`) and
the Warning Events it writes. The API calls are replaced by a recorder; tests/e2e/
test_manifests.py runs the whole story against a real API server."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from k8s.housekeeping import Housekeeper

pytestmark = pytest.mark.anyio
NS = "cozy-system"


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Core:
    """CoreV1Api's two calls H3 makes for a missing ConfigMap; `fail` are the statuses the
    next creates answer (then success)."""

    def __init__(self, *fail: tuple[int, str]) -> None:
        self.fail = list(fail)
        self.created: list[dict] = []
        self.events: list[dict] = []

    async def create_namespaced_config_map(self, ns, body, **kw):
        if self.fail:
            status, reason = self.fail.pop(0)
            raise _api_exception(status, reason)
        self.created.append(body)
        return body

    async def create_namespaced_event(self, ns, body, **kw):
        self.events.append(body)


def _api_exception(status: int, reason: str) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "reason": reason, "message": f"{reason} here"})
    return exc


def _keeper(core: _Core, settings: dict) -> Housekeeper:
    keeper = Housekeeper.__new__(Housekeeper)   # no API client: `_core` is the recorder
    keeper._core = core
    keeper.cache = SimpleNamespace(settings=settings, settings_namespace=NS,
                                   view=SimpleNamespace(classes=lambda: {}))
    keeper.raw_policy = "denied"
    keeper.timeout = 1.0
    keeper.settings_present = None
    keeper.settings_recreated = 0
    return keeper


async def test_H3_a_missing_parameter_that_cannot_be_created_reads_absent_and_is_told_once():
    core = _Core((403, "Forbidden"), (403, "Forbidden"))
    keeper = _keeper(core, {})
    await keeper.ensure_settings()
    await keeper.ensure_settings()
    assert (keeper.settings_present, keeper.settings_recreated, core.created) == (False, 0, [])
    assert [e["reason"] for e in core.events] == ["PolicyParameterMissing"]  # once per absence
    event = core.events[0]
    assert (event["type"], event["involvedObject"]["kind"], event["involvedObject"]["name"],
            event["metadata"]["namespace"]) == ("Warning", "ConfigMap", "gpu-settings", NS)
    assert "cannot create it" in event["message"] and "Forbidden" in event["message"]
    await keeper.ensure_settings()                    # the third create succeeds
    assert (keeper.settings_present, keeper.settings_recreated) == (True, 1)
    assert [c["data"] for c in core.created] == [{"resourceNames": "",
                                                  "rawResourceNames": "denied"}]
    assert len(core.events) == 2 and "H3 created it" in core.events[1]["message"]


async def test_H3_already_exists_means_the_cache_was_behind_not_missing():
    core = _Core((409, "AlreadyExists"))
    keeper = _keeper(core, {})
    await keeper.ensure_settings()
    assert (keeper.settings_present, keeper.settings_recreated, core.events) == (True, 0, [])


async def test_H3_a_present_parameter_reads_present_without_any_call():
    core = _Core()
    keeper = _keeper(core, {(NS, "gpu-settings"): {
        "data": {"resourceNames": "", "rawResourceNames": "denied"}}})
    await keeper.ensure_settings()
    assert (keeper.settings_present, core.created, core.events) == (True, [], [])
