"""A stand-in for `k8s.client.KubeClient` (as client-go's fake clientset stands beside the
real one): every call is recorded and answered from a script, so the adapters (the status
writer, housekeeping, VM waiting, the webhook's steps) are built through their own
constructors in unit tests. No API server; no kubernetes_asyncio.
"""

from __future__ import annotations

import copy
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.lowlevel import checkpoint

from k8s.client import Resource


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded call: the client `method`'s name, its positional `args` (the
    `Resource` of a custom-resource call included) and the `field_manager` it carried."""

    method: str
    args: tuple
    field_manager: str


class ScriptedClient:
    """The methods of `k8s.client.KubeClient`, recorded in `calls` (shared by every copy
    made with `using`). Each call first sleeps `latency` seconds (loop time), then takes
    the next scripted answer of its method (`script`): an exception is raised (script
    `k8s.errors` types, as the real client raises), any other value returned. With none
    scripted, a read returns {}, a write the body it was given, `delete` and
    `create_event` None."""

    def __init__(self, *, timeout: float = 5.0, field_manager: str = "test",
                 latency: float = 0.0) -> None:
        self.timeout = timeout
        self.field_manager = field_manager
        self.latency = latency
        self.calls: list[Call] = []
        self._script: dict[str, deque[Any]] = defaultdict(deque)

    def script(self, method: str, *answers: Any) -> None:
        """Queue `answers` (values or exceptions) for the next calls of `method`."""
        self._script[method].extend(answers)

    def using(self, *, field_manager: str | None = None,
              timeout: float | None = None) -> "ScriptedClient":
        """A copy sharing `calls` and the script, as `KubeClient.using`."""
        other = copy.copy(self)
        other.field_manager = field_manager or self.field_manager
        other.timeout = self.timeout if timeout is None else timeout
        return other

    def of(self, method: str) -> list[tuple]:
        """The arguments of every recorded call of `method`, in order."""
        return [c.args for c in self.calls if c.method == method]

    async def _answer(self, method: str, args: tuple, default: Any) -> Any:
        self.calls.append(Call(method, args, self.field_manager))
        if self.latency:
            await anyio.sleep(self.latency)
        else:
            await checkpoint()
        if self._script[method]:
            got = self._script[method].popleft()
            if isinstance(got, BaseException):
                raise got
            return got
        return default

    async def get(self, res: Resource, ns: str | None, name: str) -> dict:
        return await self._answer("get", (res, ns, name), {})

    async def get_status(self, res: Resource, ns: str, name: str) -> dict:
        return await self._answer("get_status", (res, ns, name), {})

    async def patch_status(self, res: Resource, ns: str | None, name: str,
                           body: list[dict] | dict, *, what: str | None = None) -> dict:
        return await self._answer("patch_status", (res, ns, name, body), {})

    async def create(self, res: Resource, ns: str, body: dict, *,
                     what: str | None = None) -> dict:
        return await self._answer("create", (res, ns, body), body)

    async def patch(self, res: Resource, ns: str, name: str, body: list[dict], *,
                    what: str | None = None) -> dict:
        return await self._answer("patch", (res, ns, name, body), {})

    async def replace(self, res: Resource, ns: str | None, name: str, body: dict, *,
                      what: str | None = None) -> dict:
        return await self._answer("replace", (res, ns, name, body), body)

    async def delete(self, res: Resource, ns: str, name: str, *, uid: str | None = None,
                     resource_version: str | None = None, what: str | None = None) -> None:
        return await self._answer("delete", (res, ns, name, uid, resource_version), None)

    async def create_event(self, ns: str, body: dict) -> None:
        return await self._answer("create_event", (ns, body), None)

    async def create_config_map(self, ns: str, body: dict, *, what: str | None = None) -> dict:
        return await self._answer("create_config_map", (ns, body), body)

    async def replace_config_map(self, ns: str, name: str, body: dict, *,
                                 what: str | None = None) -> dict:
        return await self._answer("replace_config_map", (ns, name, body), body)

    def lister(self, res: Resource):
        """A list call that is never served (the informers of unit tests are fed by hand)."""
        async def list_fn(**_: Any) -> Any:
            raise NotImplementedError(f"ScriptedClient does not list {res.plural}")
        return list_fn
