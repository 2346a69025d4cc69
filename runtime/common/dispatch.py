"""A table from RPC method names to handlers: the whole of a process's RPC surface in one place."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

C = TypeVar("C")  # what a handler gets besides its arguments: the link the call came on
A = TypeVar("A")  # a typed message a handler takes instead of the arguments' document

Handler = Callable[[C, dict[str, Any]], Any | Awaitable[Any]]


class UnknownMethod(LookupError):
    """No handler is registered under the called name; the caller turns it into its protocol's error."""

    def __init__(self, method: str) -> None:
        super().__init__(f"unknown method {method!r}")
        self.method = method


class BadArguments(ValueError):
    """A call's arguments do not fit its method (a field missing or of the wrong type); the caller turns it
    into its protocol's error."""


def decoded(decode: Callable[[dict[str, Any]], A], handler: Callable[[C, A], Any]) -> Handler[C]:
    """A handler of a typed message: `decode` turns the arguments into it first (raising BadArguments)."""
    def handle(context: C, args: dict[str, Any]) -> Any:
        return handler(context, decode(args))
    return handle


def typed_handlers(pairs: Iterable[tuple[Any, Callable[[C, Any], Any]]]) -> dict[str, Handler[C]]:
    """`method -> handler` from (message type, handler) pairs: each type names its RPC `method` and decodes its
    arguments (`from_wire`, raising BadArguments); a method registered twice is a programming error."""
    table: dict[str, Handler[C]] = {}
    for kind, handler in pairs:
        if kind.method in table:
            raise ValueError(f"RPC method {kind.method!r} registered twice")
        table[kind.method] = decoded(kind.from_wire, handler)
    return table


class HandlerTable(Generic[C]):
    """`method name -> handler(context, args)`; a handler may return its result or an awaitable of it. A typed
    reply (runtime/graph/replies.py) is sent as its `to_wire()` document."""

    def __init__(self, handlers: Mapping[str, Handler[C]]) -> None:
        self._handlers = dict(handlers)

    def __contains__(self, method: object) -> bool:
        return method in self._handlers

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._handlers))

    async def dispatch(self, context: C, method: str, args: dict[str, Any]) -> Any:
        handler = self._handlers.get(method)
        if handler is None:
            raise UnknownMethod(method)
        result = handler(context, args)
        if inspect.isawaitable(result):
            result = await result
        to_wire = getattr(result, "to_wire", None)
        return to_wire() if to_wire is not None else result
