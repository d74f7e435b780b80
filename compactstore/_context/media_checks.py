"""Checking media blocks on append (the documentation **Media**): base64 that decodes, data that is
the image or document it says it is, the sources and parts each format's API accepts; and
for importers, media the provider would refuse replaced by a note."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compactstore._context.media import (
    IMAGE_MEDIA_TYPES,
    b64decode,
    data_url,
    is_media_block,
    media_blocks,
    sniff_image_type,
)
from compactstore.errors import InvalidMessageError

__all__ = ["check_media_block", "check_user_media", "note_bad_media"]


def _fail(at: str, problem: str) -> InvalidMessageError:
    return InvalidMessageError(f"{at}{problem}")


def _check_base64(data: Any, at: str, what: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise _fail(at, f"{what} needs non-empty base64 'data', got {type(data).__name__}")
    raw = b64decode(data)
    if raw is None:
        raise _fail(at, f"{what} 'data' is not valid base64 (no line breaks or spaces allowed)")
    return raw


def _check_image_bytes(raw: bytes, media_type: str, at: str) -> None:
    sniffed = sniff_image_type(raw)
    if sniffed is None:
        raise _fail(
            at,
            f"image data is not a PNG, JPEG, GIF or WebP image (declared {media_type})",
        )
    if sniffed != media_type:
        raise _fail(at, f"image data is {sniffed} but the block declares {media_type}")


def _check_source(block: dict[str, Any], at: str, allowed: dict[str, tuple[str, ...]]) -> None:
    kind = block["type"]
    source = block.get("source")
    if not isinstance(source, dict):
        raise _fail(at, f"{kind} block needs a dict 'source', got {type(source).__name__}")
    source_type = source.get("type")
    if source_type not in allowed:
        raise _fail(
            at,
            f"{kind} block source type {source_type!r} is not one of: {', '.join(allowed)}",
        )
    keys = allowed[source_type]
    for key in keys:
        if key == "media_type":
            continue
        value = source.get(key)
        if key == "content":
            if not isinstance(value, str | list):
                raise _fail(at, f"{kind} content source needs a string or list 'content'")
        elif not isinstance(value, str) or not value:
            raise _fail(at, f"{kind} {source_type} source needs a non-empty string {key!r}")
    if source_type == "base64":
        media_type = source.get("media_type")
        expected = IMAGE_MEDIA_TYPES if kind == "image" else ("application/pdf",)
        if media_type not in expected:
            raise _fail(
                at,
                f"{kind} block media_type {media_type!r} is not one of: {', '.join(expected)}",
            )
        raw = _check_base64(source.get("data"), at, f"{kind} block")
        if kind == "image":
            _check_image_bytes(raw, str(media_type), at)
    elif source_type == "text" and source.get("media_type", "text/plain") != "text/plain":
        raise _fail(at, "document text source needs media_type 'text/plain'")


_IMAGE_SOURCES: dict[str, tuple[str, ...]] = {
    "base64": ("media_type", "data"),
    "url": ("url",),
    "file": ("file_id",),
}
_DOCUMENT_SOURCES: dict[str, tuple[str, ...]] = {
    "base64": ("media_type", "data"),
    "text": ("data",),
    "content": ("content",),
    "url": ("url",),
    "file": ("file_id",),
}


def check_media_block(block: dict[str, Any], at: str = "") -> None:
    """Check a media block of any dialect as the provider would; raise InvalidMessageError
    naming the problem (a base64 payload that does not decode, an image whose bytes are
    not the declared type, a source without its data)."""
    check = _CHECKS.get(str(block.get("type")))
    if check is not None:
        check(block, at)


def _check_image(block: dict[str, Any], at: str) -> None:
    _check_source(block, at, _IMAGE_SOURCES)


def _check_document(block: dict[str, Any], at: str) -> None:
    _check_source(block, at, _DOCUMENT_SOURCES)


def _check_input_image(block: dict[str, Any], at: str) -> None:
    """A Responses ``input_image`` part."""
    url, file_id = block.get("image_url"), block.get("file_id")
    if not (isinstance(url, str) and url) and not (isinstance(file_id, str) and file_id):
        raise _fail(at, "input_image part needs a string 'image_url' or 'file_id'")
    if isinstance(url, str):
        _check_image_url(url, at, "input_image 'image_url'")
    _check_detail(block.get("detail"), at, "input_image", ("auto", "low", "high", "original"))


def _check_image_url_part(block: dict[str, Any], at: str) -> None:
    """An ``image_url`` part of an openai chat user message."""
    inner = block.get("image_url")
    url = inner.get("url") if isinstance(inner, dict) else None
    if not isinstance(inner, dict) or not isinstance(url, str) or not url:
        raise _fail(at, "image_url part needs an 'image_url' object with a string 'url'")
    _check_image_url(url, at, "image_url 'url'")
    _check_detail(inner.get("detail"), at, "image_url", ("auto", "low", "high"))


def _check_file(block: dict[str, Any], at: str) -> None:
    """A Responses ``input_file`` part, or an openai chat ``file`` part."""
    kind = block["type"]
    inner = block.get("file") if kind == "file" else block
    if not isinstance(inner, dict):
        raise _fail(at, "file part needs a 'file' object")
    given = [key for key in ("file_data", "file_id", "file_url") if inner.get(key)]
    if not given:
        raise _fail(at, f"{kind} part needs 'file_data', 'file_id' or 'file_url'")
    for key in given:
        if not isinstance(inner[key], str):
            raise _fail(at, f"{kind} {key!r} must be a string")
    file_data = inner.get("file_data")
    if isinstance(file_data, str) and file_data:
        parsed = data_url(file_data)
        _check_base64(parsed[1] if parsed else file_data, at, kind)


# The check of each media block type, in every format's dialect.
_CHECKS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "image": _check_image,
    "document": _check_document,
    "input_image": _check_input_image,
    "image_url": _check_image_url_part,
    "input_file": _check_file,
    "file": _check_file,
}


def _check_image_url(url: str, at: str, what: str) -> None:
    """An image given by URL: a data URL must hold base64 of the image type it declares."""
    if not url.startswith("data:"):
        return
    parsed = data_url(url)
    if parsed is None:
        raise _fail(at, f"{what} is a data URL without ';base64,'")
    media_type, data = parsed
    if media_type not in IMAGE_MEDIA_TYPES:
        raise _fail(
            at,
            f"{what} data URL type {media_type!r} is not one of: {', '.join(IMAGE_MEDIA_TYPES)}",
        )
    _check_image_bytes(_check_base64(data, at, what), media_type, at)


def _check_detail(detail: Any, at: str, what: str, allowed: tuple[str, ...]) -> None:
    if detail is not None and detail not in allowed:
        raise _fail(at, f"{what} 'detail' {detail!r} is not one of: {', '.join(allowed)}")


def check_user_media(message: Any, dialect: tuple[str, ...]) -> None:
    """Check the media blocks of the format's ``dialect`` at the top of a user message's
    content as the provider would (its tool results' media are checked with the results;
    a block of another dialect is the block-type check's to refuse).

    Raises:
        InvalidMessageError: naming the block and the problem.
    """
    if not isinstance(message, dict) or message.get("role") != "user":
        return
    content = message.get("content")
    if not isinstance(content, list):
        return
    for i, block in enumerate(content):
        if (
            isinstance(block, dict)
            and isinstance(block.get("type"), str)
            and block["type"] in dialect
        ):
            check_media_block(block, f"content[{i}]: ")


def note_bad_media(message: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``message`` with each media block the provider would refuse (base64 that does not
    decode, image bytes that are not the declared type) replaced by a text note saying
    why, and the problems; the message itself when there are none. For importers: a
    transcript keeps what the agent saw, and one bad image does not refuse the file."""
    problems: list[str] = []
    for block in media_blocks(message):
        try:
            check_media_block(block)
        except InvalidMessageError as exc:
            problems.append(str(exc))
    if not problems:
        return message, []
    return _replace_bad(message), problems


def _replace_bad(value: Any) -> Any:
    if isinstance(value, list):
        return [_replace_bad(item) for item in value]
    if not isinstance(value, dict):
        return value
    if is_media_block(value):
        try:
            check_media_block(value)
        except InvalidMessageError as exc:
            text_type = "input_text" if str(value.get("type")).startswith("input_") else "text"
            return {"type": text_type, "text": f"[{value.get('type')} left out: {exc}]"}
        return value
    return {
        key: _replace_bad(item) if key in ("content", "output") else item
        for key, item in value.items()
    }
