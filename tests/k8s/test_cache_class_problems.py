"""DR1: `ClusterCache` logs "GPUClass cannot serve" once per problem, and only once the
DeviceClasses are read (before that every device-mode class "names a DeviceClass that does
not exist"). Read means listed, even when the list is empty or the cluster does not serve
the DRA API (an optional informer reads that as empty): whichever of the GPUClass and
DeviceClass lists comes first, a class naming a DeviceClass that does not exist is logged."""

from __future__ import annotations

import orjson
import pytest

from localcluster.dra_profiles import DEVICE_CLASS, device_class
from tests.support.logs import captured_logs
from tests.k8s.test_cache_foreign import cache, event, stamped

pytestmark = pytest.mark.anyio
HGX = {"metadata": {"name": "hgx"}, "spec": {"deviceClassName": DEVICE_CLASS}}
MISSING = f"DeviceClass {DEVICE_CLASS} does not exist"


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Resp:
    """The raw (`_preload_content=False`) answer of one list call."""

    def __init__(self, items: list[dict]) -> None:
        self.status, self.reason = 200, "OK"
        self._body = orjson.dumps({"items": items, "metadata": {"resourceVersion": "7"}})

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


def lists(informer, *answers: list[dict]) -> None:
    """Make `informer`'s next list calls answer `answers`, one list of items each."""
    pending = list(answers)

    async def list_fn(**_: object) -> _Resp:
        return _Resp(pending.pop(0))

    informer._list_fn = list_fn


def warnings(logs: list[dict]) -> list[tuple[str, str]]:
    return [(e["gpu_class"], e["problem"]) for e in logs if e["event"] == "GPUClass cannot serve"]


async def test_DR1_an_empty_deviceclass_list_read_after_the_gpuclasses_logs_the_problem_once():
    c = cache()
    lists(c.classes, [HGX])
    lists(c.device_classes, [], [])
    with captured_logs() as logs:
        await c.classes.list_once()
        assert c.view.classes()["hgx"].problem == MISSING
        assert warnings(logs) == []                       # the DeviceClasses are not read yet
        await c.device_classes.list_once()                # read: none at all
        assert warnings(logs) == [("hgx", MISSING)]
        await c.device_classes.list_once()                # a relist, empty again
        event(c.classes, stamped({**HGX, "spec": {**HGX["spec"], "selectors": []}}))
    assert warnings(logs) == [("hgx", MISSING)]           # once per problem


async def test_DR1_an_empty_deviceclass_list_read_before_the_gpuclasses_logs_the_problem_once():
    c = cache()
    lists(c.device_classes, [])
    lists(c.classes, [HGX])
    with captured_logs() as logs:
        await c.device_classes.list_once()
        await c.classes.list_once()
    assert warnings(logs) == [("hgx", MISSING)]


async def test_DR1_a_cluster_without_the_dra_api_reads_as_no_deviceclass_and_logs_the_problem():
    c = cache()
    lists(c.classes, [HGX])
    with captured_logs() as logs:
        await c.classes.list_once()
        c.device_classes._not_served()                   # the optional informer's 404
    assert warnings(logs) == [("hgx", MISSING)]


async def test_DR1_a_problem_that_goes_and_comes_back_is_logged_again_and_a_served_class_never():
    c = cache()
    lists(c.classes, [HGX])
    lists(c.device_classes, [stamped(device_class())])
    with captured_logs() as logs:
        await c.classes.list_once()
        await c.device_classes.list_once()
        assert c.view.classes()["hgx"].problem is None and warnings(logs) == []
        event(c.device_classes, None, ("", DEVICE_CLASS))
        event(c.device_classes, stamped(device_class()))
        event(c.device_classes, None, ("", DEVICE_CLASS))
    assert warnings(logs) == [("hgx", MISSING), ("hgx", MISSING)]
