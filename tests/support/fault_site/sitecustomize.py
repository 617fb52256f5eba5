"""A fault point for the e2e tests, loaded by a controller replica's interpreter as
`sitecustomize` when `tests.support.faults.armed` puts this directory first on its
PYTHONPATH; nothing of it is in the image or the package.

With GPU_BINDER_TEST_HANG_AFTER_CLAIM=<namespace>/<vmi>, the webhook's `ensure_claim`
(k8s.webhook.steps, docs/contract.md §3b DR5) for that VMI makes the claim as always, then writes
the file GPU_BINDER_TEST_MARK (`<pid> <namespace>/<claim>`) and never returns: the replica
stays between the claim's create and the admission's answer until the test kills it."""

import os

_TARGET = os.environ.get("GPU_BINDER_TEST_HANG_AFTER_CLAIM")

if _TARGET:
    import anyio

    from k8s.webhook import steps

    _ensure_claim = steps.ensure_claim

    async def _hang_after_claim(api, attempt, body, written):
        await _ensure_claim(api, attempt, body, written)
        if f"{attempt.namespace}/{attempt.vmi}" == _TARGET:
            mark = os.environ["GPU_BINDER_TEST_MARK"]
            with open(mark + ".tmp", "w") as f:
                f.write(f"{os.getpid()} {attempt.namespace}/{body['metadata']['name']}\n")
            os.replace(mark + ".tmp", mark)
            await anyio.sleep_forever()

    steps.ensure_claim = _hang_after_claim
