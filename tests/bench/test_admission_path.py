"""`bench.admission_path`: its JSON Patch applier, and one small run of the leader replica over
the loopback API (every sample admitted, the webhook's and the binder's calls made)."""

from __future__ import annotations

import pytest

from bench.admission_path import apply_patch, measure


def test_apply_patch_tests_adds_replaces_and_removes_on_a_copy():
    doc = {"metadata": {"resourceVersion": "3"}, "status": {"a": 1, "list": [1, 2]}}
    got = apply_patch(doc, [{"op": "test", "path": "/metadata/resourceVersion", "value": "3"},
                            {"op": "add", "path": "/status/b~1c", "value": {"x": 1}},
                            {"op": "replace", "path": "/status/a", "value": 2},
                            {"op": "add", "path": "/status/list/-", "value": 3},
                            {"op": "remove", "path": "/status/list/0"}])
    assert got == {"metadata": {"resourceVersion": "3"},
                   "status": {"a": 2, "b/c": {"x": 1}, "list": [2, 3]}}
    assert doc["status"] == {"a": 1, "list": [1, 2]}
    with pytest.raises(ValueError):
        apply_patch(doc, [{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}])
    with pytest.raises(KeyError):
        apply_patch(doc, [{"op": "replace", "path": "/status/missing", "value": 1}])


@pytest.mark.parametrize("mode", ["device", "count"])
def test_a_small_run_admits_every_sample_through_the_webhook_and_the_binder(mode):
    row = measure(6, mode, 4, samples=2, settle=0.05)
    assert (row["samples"], row["admitted"]) == (2, 2)
    assert row["vmis"] == 4 and row["gpudevices"] > 0
    calls = row["calls"]
    assert calls["create gpudevices"] == 4          # one template per admission (2 warm-up)
    assert calls["get virtualmachineinstances"] == 4  # W1's live read
    assert calls["patch_status gpudevices"] >= 8     # the attachment, then the binder's answer
    if mode == "device":
        # every device of the world records its GPU, and so does each admitted template
        assert calls["create resourceclaims"] == 4 and row["records"] == row["gpudevices"] + 4
    else:
        assert "create resourceclaims" not in calls and row["records"] == 0
