"""Stand-in of opentelemetry.context: immutable contexts, current per thread
and task (contextvars), attach returning a token detach restores."""

from __future__ import annotations

import contextvars
from typing import Any, Optional

__all__ = ["Context", "attach", "detach", "get_current", "get_value", "set_value"]


class Context(dict[str, object]):
    """As the real one: a dict, never changed once made."""

    def __setitem__(self, key: str, value: object) -> None:
        raise ValueError("a Context is immutable")


_current: contextvars.ContextVar[Context] = contextvars.ContextVar("otel_standin_context", default=Context())


def get_current() -> Context:
    return _current.get()


def get_value(key: str, context: Optional[Context] = None) -> Any:
    return (context if context is not None else get_current()).get(key)


def set_value(key: str, value: object, context: Optional[Context] = None) -> Context:
    new = dict(context if context is not None else get_current())
    new[key] = value
    return Context(new)


def attach(context: Context) -> contextvars.Token[Context]:
    return _current.set(context)


def detach(token: contextvars.Token[Context]) -> None:
    _current.reset(token)
