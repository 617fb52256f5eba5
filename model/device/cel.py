"""DRA device selectors in CEL (docs/contract.md §3b, DR1): compile a DeviceClass's or a GPUClass's
`selectors[].cel.expression` once and ask whether a device matches.

Pure (no I/O): compiling and evaluating run in-process with Google's CEL runtime
(`cel-expr-python`). The device is seen as Kubernetes' DRA selectors see it: `device.driver`,
`device.attributes[domain][id]`, `device.capacity[domain][id]` (empty here). Kubernetes'
own CEL library functions for DRA (`semver(...)`, `quantity(...)`) are not provided: an
expression using them fails to compile with a `SelectorError` naming it, so the class says so
instead of matching nothing silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

_ENV = cel.NewEnv(variables={"device": cel.Type.DYN}, extensions=[ext_strings.ExtStrings()])


class SelectorError(ValueError):
    """A selector that does not compile (syntax, an unknown function); the message quotes it."""


@dataclass(frozen=True, slots=True)
class Match:
    """A selector's verdict on one device: `matched`, and `error` (the runtime error text, e.g.
    a missing attribute) when the expression could not be evaluated: then `matched` is False,
    as Kubernetes' allocator does not hand out a device its class cannot judge."""

    matched: bool
    error: str | None = None


class Selector:
    """One compiled CEL expression. Build with `Selector.compile`; `match(device_view)` takes
    the mapping `SliceDevice.cel_view()` returns."""

    __slots__ = ("expression", "_program")

    def __init__(self, expression: str, program: Any) -> None:
        self.expression = expression
        self._program = program

    @staticmethod
    def compile(expression: str) -> "Selector":
        """Compile `expression`. Raises SelectorError when it does not compile."""
        try:
            program = _ENV.compile(expression)
        except RuntimeError as err:
            raise SelectorError(f"CEL selector {expression!r} does not compile: {err}") from None
        return Selector(expression, program)

    def match(self, device: Mapping[str, Any]) -> Match:
        """Evaluate against one device view. A non-boolean result or a runtime error is not a
        match; the error says which."""
        result = self._program.eval(data={"device": device})
        value = result.value()
        if result.type().name() == "ERROR":
            return Match(False, str(value))
        if not isinstance(value, bool):
            return Match(False, f"selector {self.expression!r} returned {value!r}, not a bool")
        return Match(value)

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


def matches_all(selectors: tuple[Selector, ...], device: Mapping[str, Any]) -> Match:
    """Whether every selector matches `device` (a DeviceClass's selectors and a class's own
    are ANDed, DR1); the first error stops and is returned."""
    for selector in selectors:
        verdict = selector.match(device)
        if not verdict.matched:
            return verdict
    return Match(True)
