"""The pure AdmissionReview decoder and the status table (k8s/webhook/review.py; W1, W6).

Examples: what each kind of bad review is denied as; a property: whatever the bytes, `decode`
returns a typed result and never raises, and only a well-formed VMI CREATE review with a
boolean (or absent) dryRun is a Review."""

from __future__ import annotations

import copy

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from k8s.webhook.review import (RETRYABLE, STATUS, Category, Denial, Rejected, Review, decode,
                                decode_request)
from model import reasons
from model.parse import VMIAsk
from model.types import Toleration

DEVICES, TEMPLATES = "gpu.cozystack.io/devices", "gpu.cozystack.io/templates"


def review(**request) -> dict:
    req = {"uid": "u-1", "kind": {"group": "kubevirt.io", "version": "v1",
                                  "kind": "VirtualMachineInstance"},
           "operation": "CREATE", "namespace": "tenant-a", "name": "vm",
           "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                      "metadata": {"name": "vm", "namespace": "tenant-a",
                                   "annotations": {TEMPLATES: "h100=2", DEVICES: "gpu-a"}},
                      "spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}},
           "dryRun": False, "userInfo": {"username": "alice", "groups": ["tenants", 7]}}
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def raw(doc) -> bytes:
    return orjson.dumps(doc)


def test_W1_a_vmi_create_review_decodes_to_what_it_asks_for() -> None:
    got = decode(raw(review()))
    assert got == Review(uid="u-1", operation="CREATE", namespace="tenant-a", name="vm",
                         object=review()["request"]["object"], dry_run=False, user="alice",
                         groups=("tenants",), ask=VMIAsk(("gpu-a",), (("h100", 2),)),
                         tolerations=(Toleration("gpu", "Exists", "", ""),))


def test_W1_a_vmi_without_gpu_annotations_is_a_review_with_no_ask_and_needs_no_name() -> None:
    obj = {"metadata": {"generateName": "vm-", "annotations": {"other": "x"}},
           "spec": {"tolerations": "not read"}}
    got = decode(raw(review(object=obj, name=None, namespace=None)))
    assert isinstance(got, Review)
    assert (got.ask, got.tolerations, got.name, got.namespace) == (None, (), "", "")


def test_W2_dry_run_is_read_as_sent_and_absent_means_false() -> None:
    assert decode(raw(review(dryRun=True))).dry_run is True
    doc = review()
    del doc["request"]["dryRun"]
    assert decode(raw(doc)).dry_run is False


def _without_metadata(doc: dict) -> dict:
    doc["request"]["object"] = {"spec": {}}
    return doc


def _annotations(value) -> object:
    def damage(doc: dict) -> dict:
        doc["request"]["object"]["metadata"]["annotations"] = value
        return doc
    return damage


def _set(key: str, value) -> object:
    def damage(doc: dict) -> dict:
        doc["request"][key] = value
        return doc
    return damage


def _top(key: str, value) -> object:
    def damage(doc: dict) -> dict:
        doc[key] = value
        return doc
    return damage


def _no_name(doc: dict) -> dict:
    doc["request"]["name"] = ""
    doc["request"]["object"]["metadata"]["name"] = None
    return doc


@pytest.mark.parametrize(("damage", "category", "fragment"), [
    (_top("apiVersion", "admission.k8s.io/v1beta1"), Category.MALFORMED, "expected an admission.k8s.io/v1"),
    (_top("kind", "Pod"), Category.MALFORMED, "expected an admission.k8s.io/v1"),
    (_top("request", [1]), Category.MALFORMED, "with a string uid is required"),
    (_set("uid", 12), Category.MALFORMED, "with a string uid is required"),
    (_set("kind", {"group": "", "kind": "Pod"}), Category.MALFORMED, "got ''/'Pod'"),
    (_set("operation", "UPDATE"), Category.MALFORMED, "CREATE only, got 'UPDATE'"),
    (_set("dryRun", "false"), Category.MALFORMED, "dryRun must be a boolean, got str"),
    (_set("dryRun", 0), Category.MALFORMED, "dryRun must be a boolean, got int"),
    (_set("object", "vm"), Category.MALFORMED, "request.object must be an object"),
    (_without_metadata, Category.INVALID, "request.object.metadata must be an object"),
    (_annotations({"a": 1}), Category.INVALID, "must map strings to strings"),
    (_annotations(["x"]), Category.INVALID, "must map strings to strings"),
    (_annotations({"gpu.cozystack.io/tempaltes": "h100=1"}), Category.INVALID,
     "unknown annotation gpu.cozystack.io/tempaltes"),
    (_annotations({"gpu.cozystack.io/admission": "forged"}), Category.INVALID,
     "annotation gpu.cozystack.io/admission is written by gpu-binder when it admits a VMI"),
    (_annotations({TEMPLATES: "h100=x"}), Category.INVALID,
     "invalid GPU annotations on VMI tenant-a/vm: metadata.annotations[gpu.cozystack.io/templates]"),
    (_annotations({DEVICES: "gpu-a,gpu-a"}), Category.INVALID, "listed twice"),
    (_no_name, Category.INVALID, "needs metadata.name and a namespace"),
])
def test_W6_each_bad_review_is_denied_as_what_it_is(damage, category, fragment) -> None:
    got = decode(raw(damage(copy.deepcopy(review()))))
    assert isinstance(got, Rejected), got
    assert got.denial.category is category
    assert fragment in got.denial.message, got.denial.message
    if category is Category.INVALID:
        assert (got.uid, got.namespace) == ("u-1", "tenant-a")  # named in the log line


def test_W6_malformed_tolerations_of_a_vmi_asking_for_gpus_are_invalid() -> None:
    doc = review()
    doc["request"]["object"]["spec"]["tolerations"] = [{"operator": "Maybe"}]
    got = decode(raw(doc))
    assert isinstance(got, Rejected) and got.denial.category is Category.INVALID
    assert got.denial.message.startswith("invalid VMI tenant-a/vm: spec.tolerations[0].operator")


@pytest.mark.parametrize(("body", "fragment"), [
    (b"", "not valid JSON"), (b"{", "not valid JSON"), (b"\xff\xfe", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"), (b"null", "must be a JSON object"),
    (b"[" * 10000, "not valid JSON"),
])
def test_W6_a_body_that_is_not_a_review_is_malformed_with_no_uid(body, fragment) -> None:
    got = decode(body)
    assert isinstance(got, Rejected) and got.denial.category is Category.MALFORMED
    assert got.uid == "" and fragment in got.denial.message


def test_decode_request_is_decode_of_the_request_object() -> None:
    assert decode_request(review()["request"]) == decode(raw(review()))


# -- the status table -------------------------------------------------------------------

@pytest.mark.parametrize(("category", "code", "reason", "retryable"), [
    (Category.POLICY, 403, "Forbidden", False),
    (Category.INVALID, 422, "Invalid", False),
    (Category.MALFORMED, 400, "BadRequest", False),
    (Category.UNAVAILABLE, 503, "ServiceUnavailable", True),
    (Category.THROTTLED, 429, "TooManyRequests", True),
    (Category.TOO_LARGE, 413, "RequestEntityTooLarge", False),
    (Category.MEDIA_TYPE, 415, "UnsupportedMediaType", False),
    (Category.INTERNAL, 500, "InternalError", False),
])
def test_each_category_has_the_status_that_fits(category, code, reason, retryable) -> None:
    denial = Denial(category, "why " * 3000)
    want = {"code": code, "reason": reason, "message": ("why " * 3000)[:8192]}
    if retryable:  # issue 31: the API server answers with Retry-After, client-go retries
        want["details"] = {"retryAfterSeconds": 1}
    assert denial.status() == want
    assert (denial.code, denial.retryable) == (code, retryable)
    if retryable:
        assert Denial(category, "why", retry_after=3).status()["details"] == {
            "retryAfterSeconds": 3}


def test_the_table_covers_every_category_and_every_code_has_a_status() -> None:
    assert set(STATUS) == set(Category) and RETRYABLE <= set(Category)
    assert Category is reasons.Category  # one type for model reasons and webhook denials
    assert {code.category for code in reasons.Code} <= set(STATUS)


# -- property: never raises, always typed -----------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=4),
    max_leaves=12)
PATHS = [("apiVersion",), ("kind",), ("request",), ("request", "uid"), ("request", "kind"),
         ("request", "operation"), ("request", "namespace"), ("request", "name"),
         ("request", "dryRun"), ("request", "userInfo"), ("request", "object"),
         ("request", "object", "metadata"), ("request", "object", "spec"),
         ("request", "object", "metadata", "name"),
         ("request", "object", "metadata", "annotations"),
         ("request", "object", "metadata", "annotations", TEMPLATES),
         ("request", "object", "metadata", "annotations", DEVICES),
         ("request", "object", "spec", "tolerations")]


@st.composite
def damaged_reviews(draw) -> bytes:
    doc = review()
    for path in draw(st.lists(st.sampled_from(PATHS), max_size=3)):
        node = doc
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[path[-1]] = draw(json_values | st.sampled_from(
                ["CREATE", "UPDATE", "h100=1", "gpu-a", "kubevirt.io", "false"]))
    body = orjson.dumps(doc)
    if draw(st.integers(0, 3)):  # three in four whole, so that some stay well formed
        return body
    return body[:draw(st.integers(0, len(body)))]


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(damaged_reviews(), st.binary(max_size=200),
                 json_values.map(orjson.dumps)))
def test_W6_decode_never_raises_and_only_a_well_formed_vmi_create_is_a_review(body) -> None:
    got = decode(body)
    assert isinstance(got, Review | Rejected)
    event("rejected" if isinstance(got, Rejected)
          else f"a review {'with' if got.ask is not None else 'without'} gpu annotations")
    if isinstance(got, Rejected):
        assert got.denial.message and got.denial.code >= 400
        assert isinstance(got.uid, str)
        return
    doc = orjson.loads(body)
    req = doc["request"]
    assert got.uid == req["uid"] and got.uid
    assert got.operation == "CREATE" and req["kind"]["kind"] == "VirtualMachineInstance"
    assert req.get("dryRun") in (None, True, False) and got.dry_run is bool(req.get("dryRun"))
    annotations = req["object"]["metadata"].get("annotations") or {}
    asks = DEVICES in annotations or TEMPLATES in annotations
    assert (got.ask is not None) == asks
    if asks:
        assert got.namespace and got.name


@pytest.mark.parametrize("code", [reasons.Code.BEHIND_IN_LINE, reasons.Code.NODE_RESERVED])
def test_P5_a_set_held_back_by_the_waiting_line_is_answered_503_with_retry_after(code) -> None:
    """P5: the binder's line refusals (`behind_in_line`, `node_reserved`, read back from
    `bindRequest.code`) are unavailable: 503 ServiceUnavailable carrying
    `details.retryAfterSeconds` (the API server's Retry-After), as 429s do, so a bare VMI's
    client retries by itself and keeps its place in the line."""
    from k8s.webhook.review import reason_denial

    denial = reason_denial(reasons.BinderRefused("t1", "vm", "refused …; wait", code))
    assert (denial.code, denial.retryable) == (503, True)
    assert denial.status() == {"code": 503, "reason": "ServiceUnavailable", "message": "refused …; wait",
                               "details": {"retryAfterSeconds": 1}}
