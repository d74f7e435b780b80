"""Read-only JSON values: how the context cache holds messages, and what
:meth:`compactstore.Session.context_view` hands out.

A message parsed once is shared by the cache, every engine and every caller of
``context_view()``; nothing may change it. :class:`FrozenDict` and :class:`FrozenList` are
``dict`` and ``list`` subclasses whose mutating methods raise ``TypeError``, so they serialise,
compare and validate like plain JSON values while a caller that tries to change one gets an
error instead of corrupting the store's cache or another caller's context.
``copy.copy``/``copy.deepcopy`` and :func:`thaw` give plain, mutable copies.

Only Python code is stopped: ``dict.__setitem__(message, ...)`` bypasses it on purpose.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["FrozenDict", "FrozenList", "freeze", "thaw"]

_WHY = "this message is read-only (shared by context_view()); active_context() gives copies"


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise TypeError(_WHY)


class FrozenDict(dict[str, Any]):
    """A JSON object nothing can change (see the module docstring)."""

    __slots__ = ()

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        copy: dict[str, Any] = thaw(self)
        return copy

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        return FrozenDict, (dict(self),)


class FrozenList(list[Any]):
    """A JSON array nothing can change (see the module docstring)."""

    __slots__ = ()

    __setitem__ = __delitem__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        copy: list[Any] = thaw(self)
        return copy

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:
        return FrozenList, (list(self),)


_CONTAINERS = frozenset((dict, list, FrozenDict, FrozenList))


def freeze(value: Any) -> Any:
    """A read-only deep copy of a JSON value; strings and numbers are shared, and a value
    that is frozen already is returned as it is."""
    kind = type(value)
    if kind is dict:
        return FrozenDict(
            {
                key: freeze(item) if type(item) in _CONTAINERS else item
                for key, item in value.items()
            }
        )
    if kind is list:
        return FrozenList([freeze(item) if type(item) in _CONTAINERS else item for item in value])
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of a JSON value (frozen or not): new dicts and lists, the
    same strings and numbers."""
    kind = type(value)
    if kind is dict or kind is FrozenDict:
        copy = dict.copy(value)
        for key, item in value.items():
            if type(item) in _CONTAINERS:
                copy[key] = thaw(item)
        return copy
    if kind is list or kind is FrozenList:
        return [thaw(item) if type(item) in _CONTAINERS else item for item in value]
    return value
