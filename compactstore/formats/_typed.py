"""The strict walk of SDK request ``TypedDict`` types, and projecting SDK objects onto them.

Format-blind: it takes a type annotation, never a format name
(:mod:`compactstore.formats.sdk_types` is the public face, by format).
"""

from __future__ import annotations

import collections.abc
import functools
import types
import typing
from typing import Any

from typing_extensions import is_typeddict

__all__ = ["pydantic_problems", "strict_problems", "to_request"]

_LIST_ORIGINS = (
    list,
    tuple,
    collections.abc.Iterable,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
)
_MAPPING_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_WRAPPERS = {"Required", "NotRequired", "ReadOnly"}
# Keys whose Literal value tells the members of a union apart, tried in this order.
_DISCRIMINATORS = ("type", "role")


def to_request(item_type: Any, value: Any) -> Any:
    """``value`` with every SDK pydantic object in it turned into a request dict, projected
    onto ``item_type`` (None: dumped whole, for a format with no SDK type); the same object
    when it holds none (see :func:`compactstore.formats.sdk_types.to_request`)."""
    if not _has_object(value):
        return value
    if item_type is None:
        return _dump_all(value)
    return _project(item_type, value, strict=False)


# -- pydantic's own check --------------------------------------------------------------------


@functools.cache
def _type_adapter(item_type: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(list[item_type])


def pydantic_problems(item_type: Any, items: list[Any]) -> list[str]:
    from pydantic import ValidationError

    try:
        _consume(_type_adapter(item_type).validate_python(items))
    except ValidationError as exc:
        return [
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
            for error in exc.errors()[:3]
        ]
    return []


def _consume(value: Any) -> None:
    """Walk a validated value: the SDK types use Iterable fields, validated only when read."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, str | bytes | int | float | bool) or item is None:
            continue
        else:
            try:
                stack.extend(list(item))
            except TypeError:
                continue


# -- the strict walk -------------------------------------------------------------------------


def strict_problems(annotation: Any, value: Any, path: str = "") -> list[str]:
    """What in ``value`` the type ``annotation`` does not declare or allow.

    Checks dict keys against ``TypedDict`` annotations (undeclared keys, missing Required
    keys), ``None`` against ``Optional``, ``Literal`` values, the JSON kinds of leaves, and
    recurses through unions, lists and mappings. Union members that are pydantic models (the
    SDKs' response objects) accept only instances of themselves.
    """
    problems: list[str] = []
    _walk(annotation, value, path, problems)
    return problems


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated or (
            origin is not None and getattr(origin, "_name", None) in _WRAPPERS
        ):
            annotation = typing.get_args(annotation)[0]
        elif type(annotation).__name__ == "TypeAliasType":
            annotation = getattr(annotation, "__value__", Any)
        else:
            return annotation


def _members(annotation: Any) -> tuple[Any, ...] | None:
    """The members of a union (None when the annotation is no union)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return tuple(_unwrap(a) for a in typing.get_args(annotation))
    return None


@functools.cache
def _typed_dict_keys(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A TypedDict's declared keys with their types, and its Required keys."""
    hints = typing.get_type_hints(cls, include_extras=True)
    total = getattr(cls, "__total__", True)
    required: set[str] = set()
    for key, hint in hints.items():
        marker = getattr(typing.get_origin(hint), "_name", None)
        if marker == "Required" or (total and marker != "NotRequired"):
            required.add(key)
    required |= set(getattr(cls, "__required_keys__", ()))
    return {key: _unwrap(hint) for key, hint in hints.items()}, frozenset(required)


def _is_typed_dict(annotation: Any) -> bool:
    return isinstance(annotation, type) and is_typeddict(annotation)


def _kind(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _walk(annotation: Any, value: Any, path: str, problems: list[str]) -> None:
    annotation = _unwrap(annotation)
    at = f"{path}: " if path else ""
    if annotation is Any or annotation is object:
        return
    members = _members(annotation)
    if members is not None:
        _walk_union(members, value, path, problems)
    elif annotation is type(None) or annotation is None:
        if value is not None:
            problems.append(f"{at}expected null, got {_kind(value)}")
    elif value is None:
        problems.append(f"{at}null is not allowed here")
    elif typing.get_origin(annotation) is typing.Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed or type(value) not in {type(a) for a in allowed}:
            problems.append(f"{at}{value!r} is not one of {', '.join(map(repr, allowed))}")
    elif _is_typed_dict(annotation):
        _walk_typed_dict(annotation, value, path, problems)
    else:
        _walk_container(annotation, value, path, problems)


def _walk_container(annotation: Any, value: Any, path: str, problems: list[str]) -> None:
    """A list, a mapping, or a leaf type."""
    at = f"{path}: " if path else ""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in _LIST_ORIGINS:
        if not isinstance(value, list | tuple):
            problems.append(f"{at}expected a list, got {_kind(value)}")
            return
        item_type = args[0] if args else Any
        for index, item in enumerate(value):
            _walk(item_type, item, f"{path}[{index}]", problems)
    elif origin in _MAPPING_ORIGINS:
        if not isinstance(value, dict):
            problems.append(f"{at}expected an object, got {_kind(value)}")
            return
        value_type = args[1] if len(args) == 2 else Any
        for key, item in value.items():
            _walk(value_type, item, f"{path}.{key}" if path else str(key), problems)
    else:
        _walk_leaf(annotation, value, at, problems)


def _walk_leaf(annotation: Any, value: Any, at: str, problems: list[str]) -> None:
    if annotation is bool:
        ok = isinstance(value, bool)
    elif annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif annotation is str:
        ok = isinstance(value, str)
    elif annotation in (dict, list):
        ok = isinstance(value, annotation)
    elif isinstance(annotation, type):
        # A pydantic model (the SDKs' response objects) or bytes-like file content.
        ok = isinstance(value, annotation)
    else:  # a type this walk does not know (a TypeVar, a protocol): pydantic judged it
        return
    if not ok:
        name = getattr(annotation, "__name__", str(annotation))
        problems.append(f"{at}expected {name}, got {_kind(value)}")


@functools.cache
def _literals(annotation: Any, key: str) -> tuple[Any, ...] | None:
    """The values a TypedDict's ``key`` may take (None: no such key, or not a Literal).
    Cached: a discriminated union asks it of every member for every value it checks."""
    if not _is_typed_dict(annotation):
        return None
    keys, _ = _typed_dict_keys(annotation)
    hint = keys.get(key)
    if hint is None:
        return None
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return None


def _walk_union(members: tuple[Any, ...], value: Any, path: str, problems: list[str]) -> None:
    at = f"{path}: " if path else ""
    if value is None:
        if not any(m is type(None) or m is None for m in members):
            problems.append(f"{at}null is not allowed here")
        return
    candidates = _discriminated(
        [m for m in members if m is not type(None) and m is not None], value, at, problems
    )
    if candidates is None:
        return
    shaped = [m for m in candidates if _same_shape(m, value)]
    best: list[str] | None = None
    for member in shaped or candidates:
        found: list[str] = []
        _walk(member, value, path, found)
        if not found:
            return
        if best is None or len(found) < len(best):
            best = found
    problems.extend(best or [f"{at}no type of the union accepts {_kind(value)}"])


def _discriminated(
    candidates: list[Any], value: Any, at: str, problems: list[str]
) -> list[Any] | None:
    """The members of a discriminated union a value may be: those whose ``type`` (or
    ``role``) Literal holds the value's, else the untagged ones; None (a problem recorded)
    when no member can be. All the candidates when the union is not discriminated."""
    if not isinstance(value, dict):
        return candidates
    for key in _DISCRIMINATORS:
        tag = value.get(key)
        tagged = [m for m in candidates if _literals(m, key) is not None]
        if not isinstance(tag, str) or not tagged:
            continue
        matching = [m for m in tagged if tag in (_literals(m, key) or ())]
        if matching:
            return matching
        untagged = [m for m in candidates if _is_typed_dict(m) and m not in tagged]
        if untagged:
            return untagged
        known = sorted({str(t) for m in tagged for t in _literals(m, key) or ()})
        problems.append(f"{at}unknown {key} {tag!r} (expected one of: {', '.join(known)})")
        return None
    return candidates


def _same_shape(annotation: Any, value: Any) -> bool:
    """Whether a value is the JSON kind (object, list, scalar) a union member describes."""
    origin = typing.get_origin(annotation)
    if isinstance(value, dict):
        return _is_typed_dict(annotation) or origin in _MAPPING_ORIGINS or annotation is dict
    if isinstance(value, list | tuple):
        return origin in _LIST_ORIGINS or annotation is list
    return not (_is_typed_dict(annotation) or origin in _MAPPING_ORIGINS or origin in _LIST_ORIGINS)


def _walk_typed_dict(cls: type, value: Any, path: str, problems: list[str]) -> None:
    at = f"{path}: " if path else ""
    if not isinstance(value, dict):
        problems.append(f"{at}expected an object ({cls.__name__}), got {_kind(value)}")
        return
    keys, required = _typed_dict_keys(cls)
    for key in value:
        if key not in keys:
            problems.append(
                f"{at}undeclared key {key!r} ({cls.__name__} declares: {', '.join(keys)})"
            )
    for key in sorted(required - set(value)):
        problems.append(f"{at}missing required key {key!r} ({cls.__name__})")
    for key, item in value.items():
        if key in keys:
            _walk(keys[key], item, f"{path}.{key}" if path else str(key), problems)


# -- SDK objects to request dicts ------------------------------------------------------------


def _has_object(value: Any) -> bool:
    from pydantic import BaseModel

    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, BaseModel):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _dump_all(value: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return _dump(value)
    if isinstance(value, dict):
        return {key: _dump_all(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_dump_all(item) for item in value]
    return value


def _project(annotation: Any, value: Any, *, strict: bool) -> Any:
    """``value`` shaped by ``annotation``: objects dumped; under ``strict`` (inside a dumped
    object) only the declared keys of each TypedDict are kept."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return _project(annotation, _dump(value), strict=True)
    if not (strict or _has_object(value)):
        return value
    annotation = _unwrap(annotation)
    members = _members(annotation)
    if members is not None:
        return _project_union(members, value, strict=strict)
    if _is_typed_dict(annotation) and isinstance(value, dict):
        return _project_typed_dict(annotation, value, strict=strict)
    origin = typing.get_origin(annotation)
    if origin in _LIST_ORIGINS and isinstance(value, list | tuple):
        args = typing.get_args(annotation)
        item_type = args[0] if args else Any
        return [_project(item_type, item, strict=strict) for item in value]
    if origin in _MAPPING_ORIGINS and isinstance(value, dict):
        args = typing.get_args(annotation)
        value_type = args[1] if len(args) == 2 else Any
        return {key: _project(value_type, item, strict=strict) for key, item in value.items()}
    return _dump_all(value)


def _project_typed_dict(cls: type, value: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    keys, required = _typed_dict_keys(cls)
    shaped: dict[str, Any] = {}
    for key, item in value.items():
        if key in keys:
            if item is None and strict and key not in required and _no_none(keys[key]):
                continue  # an output's null where the request type takes no null: absent
            shaped[key] = _project(keys[key], item, strict=strict)
        elif not strict:
            shaped[key] = _dump_all(item)
    return shaped


def _no_none(annotation: Any) -> bool:
    """Whether a type refuses ``None``."""
    found: list[str] = []
    _walk(annotation, None, "", found)
    return bool(found)


def _project_union(members: tuple[Any, ...], value: Any, *, strict: bool) -> Any:
    """Project onto the union member that fits best: the fewest strict problems, then the
    most keys kept."""
    candidates = [m for m in members if m is not type(None) and m is not None]
    shaped = [m for m in candidates if _same_shape(m, value)]
    if isinstance(value, dict):
        for key in _DISCRIMINATORS:
            if isinstance(value.get(key), str):
                tagged = [m for m in shaped if value[key] in (_literals(m, key) or ())]
                if tagged:
                    shaped = tagged
    best: tuple[int, int] | None = None
    chosen: Any = _dump_all(value)
    for member in shaped or candidates:
        projected = _project(member, value, strict=strict)
        score = (
            len(strict_problems(member, projected)),
            -len(projected) if isinstance(projected, dict) else 0,
        )
        if best is None or score < best:
            best, chosen = score, projected
    return chosen
