"""What changed between two housekeeping rounds: the keys each informer told its listeners
of (`Changes`), so that a round judges only those (`model.housekeeping_index`) instead of the
whole fleet (issue 40: a round's cost on the event loop independent of the fleet's size).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from k8s.informer import Informer, Key


class Changes:
    """Collects the keys of the objects each of `informers` (name → informer; None entries
    are skipped) added, changed or deleted while `listening()`. `take()` returns them and
    starts afresh: {name: set of (namespace, name)}, or None when nothing was listened to
    since the last `take()` began (not listening, or the listening started meanwhile: what
    changed before is not known, the caller judges everything)."""

    def __init__(self, **informers: Informer | None) -> None:
        self._informers = {n: i for n, i in informers.items() if i is not None}
        self._keys: dict[str, set[Key]] = {n: set() for n in self._informers}
        self._listening = False
        self._complete = False
        self._listeners = {n: self._listener(n) for n in self._informers}

    def _listener(self, name: str):
        keys = self._keys[name]

        def changed(key: Key, obj: dict | None) -> None:
            keys.add(key)

        return changed

    @contextmanager
    def listening(self) -> Iterator["Changes"]:
        """Listen to every informer while the block runs (the listeners removed after)."""
        for name, informer in self._informers.items():
            informer.add_listener(self._listeners[name])
        self._listening = True
        try:
            yield self
        finally:
            self._listening = False
            self._complete = False
            for name, informer in self._informers.items():
                informer.remove_listener(self._listeners[name])

    def take(self) -> dict[str, set[Key]] | None:
        """The keys changed since the last call (see the class), every informer named, empty
        sets where nothing changed."""
        out = {n: set(keys) for n, keys in self._keys.items()} if self._complete else None
        for keys in self._keys.values():
            keys.clear()
        self._complete = self._listening
        return out

    def forget(self) -> None:
        """What was collected is not to be trusted (a round skipped it): the next `take()`
        answers None."""
        for keys in self._keys.values():
            keys.clear()
        self._complete = False
