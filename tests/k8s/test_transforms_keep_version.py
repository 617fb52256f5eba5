"""Every informer transform keeps `metadata.resourceVersion`: a relist reuses a cached object
whose version equals the listed one's (k8s/informer.py `_same_version`), and `_apply` skips a
watched object of the cached version, so a transform that dropped it would make every relist
transform everything again, and one that kept a stale one would hide a change."""

from __future__ import annotations

import functools

import pytest

from k8s.cache import ingest_claim, ingest_slice, slim_node, slim_tenant_object, slim_vmi, trim_pod
from k8s.informer import keep_all, slim
from k8s.vm_waiting import slim_vm


def _obj() -> dict:
    return {"apiVersion": "v1", "kind": "Thing",
            "metadata": {"name": "n", "namespace": "t", "uid": "u", "resourceVersion": "4242",
                         "managedFields": [{"manager": "x"}], "annotations": {"a": "b"}},
            "spec": {}, "status": {}}


@pytest.mark.parametrize("transform", [
    slim, keep_all, slim_tenant_object, slim_vmi, slim_node, trim_pod, slim_vm, ingest_claim,
    functools.partial(ingest_slice, parse=lambda o: None)],
    ids=["slim", "keep_all", "slim_tenant_object", "slim_vmi", "slim_node", "trim_pod",
         "slim_vm", "ingest_claim", "ingest_slice"])
def test_every_informer_transform_keeps_the_resource_version(transform):
    out = transform(_obj())
    assert out["metadata"]["resourceVersion"] == "4242"
