"""Errors of the actor runtime and of the status writer port.

Two families. `ActorError` is raised by the runtime (`actors.runtime`): a mailbox that is
full, an actor that stopped, an `ask` that timed out, an actor killed on purpose.
`WriteError` is what a `StatusWriter` (`actors.ports`) raises; the Kubernetes adapter
translates API errors into these so no client exception ever reaches an actor:

| adapter sees                                   | raises               | pipeline does    |
|------------------------------------------------|----------------------|------------------|
| 409 Conflict (stale resourceVersion)           | `WriteConflict`      | retries (bounded)|
| 5xx, 429, timeouts, connection errors          | `TransientWriteError`| retries (bounded)|
| device's `bindRequest.id` is not the request's | `RequestWithdrawn`   | stops the request|
| 404 on the device                              | `NotFound`           | stops the request|
"""

from __future__ import annotations

from model.types import DeviceKey


class ActorError(Exception):
    """Base of the runtime's errors."""


class ActorStopped(ActorError):
    """The actor is stopped for good, or it crashed (or was killed) while it held your
    message. When it crashed, `__cause__` is the crash. A message that got this error from
    `ask` may or may not have been acted on."""


class AskTimeout(ActorError, TimeoutError):
    """`ask` got no reply within its timeout. The message may still be delivered and acted
    on later; the reply is dropped."""


class MailboxFull(ActorError):
    """`tell_nowait` found the mailbox full; nothing was delivered."""


class ActorKilled(ActorError):
    """Raised out of an actor's run when it was killed (`ActorCell.kill`): a crash, for
    the supervisor's restart accounting, not a clean shutdown."""


class StartTimeout(ActorError):
    """An actor did not report started within its start timeout (a crash, not a hang)."""


class WriteError(Exception):
    """Base of the status writer's errors. `key` is the device (namespace, name)."""

    def __init__(self, message: str, *, key: DeviceKey | None = None) -> None:
        super().__init__(message)
        self.key = key


class WriteConflict(WriteError):
    """The object changed under the write (optimistic concurrency). Retry the whole
    read-modify-write."""


class TransientWriteError(WriteError):
    """The write may or may not have been applied (timeout, 5xx, 429, lost connection).
    Every StatusWriter method is idempotent, so retrying is safe."""


class RequestWithdrawn(WriteError):
    """The device no longer carries the request: `status.bindRequest` is gone or has
    another id. Never retried: the request is over for this device."""


class NotFound(WriteError):
    """The device does not exist (deleted). Never retried."""


RETRYABLE_WRITE_ERRORS: tuple[type[WriteError], ...] = (WriteConflict, TransientWriteError)
"""The write errors the coordinator retries (with bounded exponential jitter)."""
