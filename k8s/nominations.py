"""The Kubernetes side of `actors.ports.NominationWriter` (docs/contract.md §3c P4): GPUNomination
objects in the controller's namespace, created before the refusal that announces them and
deleted by the leader's preemption worker (`k8s/preemption.py`). API errors become the
actors' write errors here, so nothing of `k8s` leaks inward.
"""

from __future__ import annotations

from actors.errors import RequestWithdrawn, TransientWriteError
from k8s import errors
from k8s.client import KubeClient, Resource
from model.nomination import GROUP, KIND, PLURAL, VERSION, Nomination, nomination_body, parse_nomination
from model.parse import ParseError

GPU_NOMINATIONS = Resource(GROUP, VERSION, PLURAL, KIND)


class ApiNominations:
    """`NominationWriter` on the API server: nominations in `namespace` (the controller's),
    through `client` (the leader's, whose calls end before its Lease)."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self._client = client
        self.namespace = namespace

    async def put(self, nomination: Nomination) -> None:
        """Create the object; one already there with the same content is success, one with
        another (an older nomination of the same preemptor) is deleted (uid precondition)
        and created again. One made later than `nomination` (`created`) is never replaced:
        `RequestWithdrawn`, `nomination`'s decision is superseded (a write held up by an API
        restart landed 30 s late in the device priorities soak and replaced the preemptor's
        newer nomination with its older one, on room another set had started on meanwhile).
        Raises `TransientWriteError` for any API failure (a retry is safe: the next try finds
        what this one wrote)."""
        body = nomination_body(nomination, self.namespace)
        try:
            try:
                await self._client.create(GPU_NOMINATIONS, self.namespace, body)
                return
            except errors.AlreadyExists:
                pass
            found = await self._client.get(GPU_NOMINATIONS, self.namespace, nomination.name)
            try:
                there = parse_nomination(found)
            except ParseError:
                there = None  # a malformed one of ours: replaced
            if there == nomination:
                return
            if there is not None and there.created > nomination.created:
                raise RequestWithdrawn(f"nomination {nomination.name}: a later one (made "
                                       f"{there.created.isoformat()}) is recorded")
            uid = (found.get("metadata") or {}).get("uid")
            await self._client.delete(GPU_NOMINATIONS, self.namespace, nomination.name, uid=uid)
            await self._client.create(GPU_NOMINATIONS, self.namespace, body)
        except errors.ApiError as exc:
            raise TransientWriteError(f"nomination {nomination.name}: {exc}") from exc

    async def delete(self, name: str) -> None:
        """Delete nomination `name` (gone already: success). Raises `TransientWriteError`."""
        try:
            await self._client.delete(GPU_NOMINATIONS, self.namespace, name)
        except errors.NotFound:
            return
        except errors.ApiError as exc:
            raise TransientWriteError(f"delete nomination {name}: {exc}") from exc


__all__ = ["ApiNominations", "GPU_NOMINATIONS"]
