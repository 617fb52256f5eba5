"""W6: malformed, oversized and unexpected AdmissionReviews never crash the webhook and
never admit a VMI that carries gpu annotations; each denial has the status of what is wrong
(400 not a review we serve, 413 over the size cap, 422 an invalid VMI, 403 a policy refusal,
503 retry), never 500 (a crash). Seeded; the seed is printed."""

from __future__ import annotations

import copy
import json
import os
import random

import anyio
import pytest

from tests.support.vmis import client_ssl, review

pytestmark = pytest.mark.anyio
COUNT = int(os.environ.get("GPU_BINDER_FUZZ_COUNT", "5000"))
JUNK = [None, 0, -1, 1.5, True, "", "x", [], {}, [1, "a"], {"a": None}, "\udcff" * 3,
        "a" * 70000]


def junk(rng: random.Random, extra: list | None = None):
    """A fresh junk value (copied: shared containers would make cycles when mutated)."""
    return copy.deepcopy(rng.choice(JUNK + (extra or [])))


def _base(rng: random.Random) -> dict:
    ann = {}
    if rng.random() < 0.8:
        ann["gpu.cozystack.io/templates"] = rng.choice(
            ["h100=1", "h100=0", "h100=-1", "=", "h100=x", "Bad_Name=1", "h100=1,h100=2",
             "a" * 5000 + "=1", ",", "h100=99999999999999999999"])
    if rng.random() < 0.6:
        ann["gpu.cozystack.io/devices"] = rng.choice(
            ["gpu-a", "", "gpu-a,gpu-a", "UPPER", "x" * 300, ",,,", "gpu-a, ", "ü"])
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": f"fz-{rng.randrange(10**6)}", "namespace": "fuzz",
                        "annotations": ann},
           "spec": {"domain": {"devices": {}}}}
    return review(f"uid-{rng.randrange(10**9)}", vmi, "fuzz")


def _mutate(rng: random.Random, doc: dict) -> dict:
    """One to three random damages: a field replaced by junk, deleted, or retyped."""
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(["top", "request", "object", "metadata", "annotations", "kind"])
        if target == "top":
            key = rng.choice(["apiVersion", "kind", "request"])
            doc[key] = junk(rng, ["admission.k8s.io/v1beta1", "Pod"])
        elif target == "request" and isinstance(doc.get("request"), dict):
            key = rng.choice(["uid", "operation", "namespace", "name", "object", "dryRun"])
            doc["request"][key] = junk(rng, ["UPDATE", "DELETE", "CONNECT"])
        elif target == "object" and isinstance(doc.get("request"), dict):
            doc["request"]["object"] = junk(rng)
        elif target == "metadata":
            obj = (doc.get("request") or {}).get("object") if isinstance(doc.get("request"), dict) else None
            if isinstance(obj, dict):
                obj["metadata"] = junk(rng, [{"annotations": junk(rng)}])
        elif target == "annotations":
            try:
                ann = doc["request"]["object"]["metadata"]["annotations"]
                ann[rng.choice(["gpu.cozystack.io/templates", "gpu.cozystack.io/devices"])] = \
                    junk(rng)
            except (KeyError, TypeError):
                pass
        elif target == "kind" and isinstance(doc.get("request"), dict):
            doc["request"]["kind"] = junk(rng, [{"group": "", "kind": "Pod"}])
    return doc


def _has_gpu_annotations(raw: bytes) -> bool:
    return b"gpu.cozystack.io/" in raw


def _encode(rng: random.Random, doc: dict) -> bytes:
    body = json.dumps(doc, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
    r = rng.random()
    if r < 0.05:
        return body[: rng.randrange(len(body))]                 # truncated
    if r < 0.10:
        return body.replace(b'"', b"\xff\xfe", 1)                # invalid UTF-8
    if r < 0.12:
        return b"[" * 10000                                      # deep nesting
    if r < 0.13:
        return b"{" + b" " * (4 * 1024 * 1024) + b"}"            # over the size cap
    return body


async def test_W6_malformed_reviews_never_crash_and_never_admit(system, fleet):
    import aiohttp

    seed = int(os.environ.get("GPU_BINDER_FUZZ_SEED", random.randrange(2**32)))
    print(f"fuzz seed: {seed} (GPU_BINDER_FUZZ_SEED={seed} to replay), {COUNT} reviews")
    rng = random.Random(seed)
    url = f"https://127.0.0.1:{system.webhook_port}/mutate-vmi"
    failures: list[str] = []
    counts = {"denied": 0, "allowed": 0}
    codes: dict[int, int] = {}
    ctx = client_ssl(system)
    bodies = [_encode(rng, _mutate(rng, _base(rng))) for _ in range(COUNT)]
    limit = anyio.CapacityLimiter(8)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async def one(i: int, raw: bytes) -> None:
            async with limit:
                async with http.post(url, data=raw, ssl=ctx,
                                     headers={"Content-Type": "application/json"}) as resp:
                    text = await resp.read()
            if resp.status != 200:
                failures.append(f"#{i}: HTTP {resp.status}")
                return
            answer = json.loads(text)["response"]
            if answer["allowed"]:
                counts["allowed"] += 1
                if _has_gpu_annotations(raw):
                    failures.append(f"#{i}: admitted a review carrying gpu annotations: "
                                    f"{raw[:300]!r}")
            else:
                counts["denied"] += 1
                assert answer["status"]["message"], f"#{i}: denial without a message"
                code = answer["status"]["code"]
                codes[code] = codes.get(code, 0) + 1
                if code not in (400, 403, 413, 422, 503):
                    failures.append(f"#{i}: denied {code} {answer['status']}: {raw[:300]!r}")
                elif len(raw) > 3 * 1024 * 1024 and code != 413:
                    failures.append(f"#{i}: oversized body denied {code}")
        async with anyio.create_task_group() as tg:
            for i, raw in enumerate(bodies):
                tg.start_soon(one, i, raw)
    print(f"answers: {counts}; denials by code: {dict(sorted(codes.items()))}")
    assert failures == [], f"seed {seed}: {failures[:5]}"
    assert counts["denied"] + counts["allowed"] == COUNT
    assert all(r.alive for r in system.replicas), "a replica died"
