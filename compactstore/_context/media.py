"""Images and documents in messages (the documentation **Media**): what a media block is, what it
costs, and the text that stands for it once it left the context (how it is checked on
append: :mod:`compactstore._context.media_checks`).

A media block is a content block that carries an image or a document, in the dialect of its
format: ``image``/``document`` (anthropic), ``input_image``/``input_file`` (responses),
``image_url``/``file`` parts (openai chat user messages). Its size is read from the data
itself: image dimensions from the PNG, JPEG, GIF or WebP header (parsed here, no imaging
library), PDF pages from the page objects. Token figures live in
:mod:`compactstore._context.tokens`.

Pure functions: no I/O, no clock. Base64 is decoded only to read a header or count pages,
never handed on as text.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from compactstore._context.frozen import thaw
from compactstore._context.tokens import (
    PDF_BYTES_PER_PAGE,
    document_tokens,
    estimate_tokens,
    image_tokens,
)

__all__ = [
    "GENERATED_IMAGE",
    "IMAGE_MEDIA_TYPES",
    "MEDIA_BLOCK_TYPES",
    "USER_MEDIA",
    "Media",
    "blob_text",
    "decoded_single_media",
    "describe",
    "has_media",
    "image_size",
    "is_media_block",
    "media_blocks",
    "media_markers",
    "media_note",
    "media_tokens",
    "pdf_pages",
    "shown_text",
    "sniff_image_type",
    "user_media",
    "user_media_note",
    "without_media",
    "without_user_media",
]

# Block types that carry media, in every format's dialect.
MEDIA_BLOCK_TYPES = frozenset(
    {"image", "document", "input_image", "input_file", "image_url", "file"}
)
IMAGE_MEDIA_TYPES = ("image/gif", "image/jpeg", "image/png", "image/webp")
# A Responses item of the hosted image generation tool: its ``result`` is the image, base64.
GENERATED_IMAGE = "image_generation_call"

# The tool-use id a blob holding a user message's media is stored under (the blob table
# keys blobs by the result they came from; a user message answers no call).
USER_MEDIA = ""

_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)((?:;[^;,]*)*?);base64,(.*)", re.DOTALL)
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


@dataclass(frozen=True, slots=True)
class Media:
    """One media block, as far as its data tells."""

    kind: Literal["image", "document"]
    media_type: str | None  # None when the block only references the data (URL, file id)
    width: int | None = None
    height: int | None = None
    pages: int | None = None
    size: int | None = None  # decoded bytes of inline data
    text_tokens: int | None = None  # a plain-text document: the estimate of its text

    @property
    def tokens(self) -> int:
        """What the block costs in the context."""
        if self.kind == "image":
            return image_tokens(self.width, self.height)
        if self.text_tokens is not None:
            return self.text_tokens
        return document_tokens(self.page_count)

    @property
    def page_count(self) -> int:
        """Pages a document counts as: read from a PDF, else one per started
        PDF_BYTES_PER_PAGE of inline data, else one (a reference to the data)."""
        if self.pages:
            return self.pages
        if self.size:
            return max(1, math.ceil(self.size / PDF_BYTES_PER_PAGE))
        return 1

    def marker(self) -> str:
        """What stands for it where a message is shown as text (``compactstore show``, the
        report): ``[image png 1000×800, 80 kB]``, ``[document pdf, 3 pages, 120 kB]``,
        ``[image by reference]``."""
        parts: list[str] = [self.kind]
        if self.media_type:
            parts.append(
                "text" if self.media_type == "text/plain" else self.media_type.split("/")[-1]
            )
        elif self.text_tokens is None:
            parts.append("by reference")
        head = " ".join(parts)
        if self.kind == "image" and self.width and self.height:
            head += f" {self.width}×{self.height}"
        details = []
        if self.kind == "document" and self.text_tokens is None and (self.pages or self.size):
            details.append(f"{self.page_count} page{'s' if self.page_count != 1 else ''}")
        if self.size is not None:
            details.append(f"{self.size / 1000:,.0f} kB" if self.size >= 1000 else f"{self.size} B")
        return f"[{', '.join([head, *details])}]"

    def label(self) -> str:
        """A short description: ``image/png 1024x768``, ``application/pdf, 3 pages``."""
        shown = self.media_type or f"{self.kind} by reference"
        if self.kind == "image":
            if self.width and self.height:
                return f"{shown} {self.width}x{self.height}"
            return shown
        if self.text_tokens is not None:
            return shown
        return f"{shown}, {self.page_count} page{'s' if self.page_count != 1 else ''}"


# -- reading data ---------------------------------------------------------------------------


def b64decode(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a ``data:...;base64,`` URL."""
    found = _DATA_URL.fullmatch(url)
    return None if found is None else (found.group(1).lower(), found.group(3))


def sniff_image_type(data: bytes) -> str | None:
    """The media type an image's first bytes say (PNG, JPEG, GIF, WebP), else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) read from a PNG, JPEG, GIF or WebP header; None when unreadable."""
    try:
        kind = sniff_image_type(data)
        if kind == "image/png" and data[12:16] == b"IHDR":
            width, height = struct.unpack(">II", data[16:24])
        elif kind == "image/gif":
            width, height = struct.unpack("<HH", data[6:10])
        elif kind == "image/webp":
            return _webp_size(data)
        elif kind == "image/jpeg":
            return _jpeg_size(data)
        else:
            return None
    except struct.error:
        return None
    return (width, height) if width > 0 and height > 0 else None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        width, height = width & 0x3FFF, height & 0x3FFF
    elif chunk == b"VP8L" and data[20:21] == b"\x2f":
        b0, b1, b2, b3 = data[21:25]
        width = 1 + (b0 | (b1 & 0x3F) << 8)
        height = 1 + (b1 >> 6 | b2 << 2 | (b3 & 0x0F) << 10)
    elif chunk == b"VP8X":
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
    else:
        return None
    return (width, height) if width > 0 and height > 0 else None


# JPEG start-of-frame markers (baseline, progressive, lossless...): not DHT, JPG, DAC.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    index = 2
    while index + 4 <= len(data):
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if marker == 0xDA:  # start of scan: no frame header came before the image data
            return None
        if marker == 0x01 or 0xD0 <= marker <= 0xD9:  # no length: TEM, RSTn, SOI, EOI
            index += 2
            continue
        (length,) = struct.unpack(">H", data[index + 2 : index + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return (width, height) if width > 0 and height > 0 else None
        index += 2 + length
    return None


def pdf_pages(data: bytes) -> int | None:
    """Pages of a PDF, counted by its page objects; None when none can be seen (a PDF whose
    objects are all in compressed object streams)."""
    if not data.startswith(b"%PDF"):
        return None
    pages = len(_PDF_PAGE.findall(data))
    return pages or None


# -- media blocks -----------------------------------------------------------------------------


def _image(media_type: str | None, data: str | None) -> Media:
    if data is None:
        return Media("image", media_type)
    raw = b64decode(data)
    size = image_size(raw) if raw is not None else None
    return Media(
        "image",
        media_type,
        width=size[0] if size else None,
        height=size[1] if size else None,
        size=None if raw is None else len(raw),
    )


def _document(media_type: str | None, data: str | None) -> Media:
    if data is None:
        return Media("document", media_type)
    raw = b64decode(data)
    if raw is None:
        return Media("document", media_type)
    return Media("document", media_type, pages=pdf_pages(raw), size=len(raw))


def _inline(value: Any) -> tuple[str | None, str | None]:
    """(media type, base64 data) of a data URL or bare base64 value; (None, None) else."""
    if not isinstance(value, str):
        return None, None
    parsed = data_url(value)
    if parsed is not None:
        return parsed
    return (None, value) if not value.startswith(("http://", "https://")) else (None, None)


def describe(block: Any) -> Media | None:
    """The media a content block carries (or a Responses ``image_generation_call`` item, whose
    ``result`` is the generated image's base64), or None for a block that carries none."""
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind == GENERATED_IMAGE:
        return _generated_image(block)
    if kind not in MEDIA_BLOCK_TYPES:
        return None
    if kind in ("image", "document"):
        return _sourced(kind, block.get("source"))
    if kind == "input_image":
        media_type, data = _inline(block.get("image_url"))
        return _image(media_type, data if media_type else None)
    if kind == "image_url":
        url = block.get("image_url")
        media_type, data = _inline(url.get("url") if isinstance(url, dict) else None)
        return _image(media_type, data if media_type else None)
    inner = block.get("file") if kind == "file" else block
    media_type, data = _inline(inner.get("file_data") if isinstance(inner, dict) else None)
    return _document(media_type or _media_type_of(inner), data)


def _sourced(kind: str, source: Any) -> Media:
    """An Anthropic ``image`` or ``document`` block, by its ``source``."""
    source = source if isinstance(source, dict) else {}
    media_type = source.get("media_type") if isinstance(source.get("media_type"), str) else None
    data = source.get("data")
    source_type = source.get("type")
    if kind == "image":
        return _image(media_type, data if source_type == "base64" else None)
    if source_type == "base64":
        return _document(media_type, data if isinstance(data, str) else None)
    if source_type == "text" and isinstance(data, str):
        return Media("document", "text/plain", text_tokens=estimate_tokens(data))
    if source_type == "content":
        return Media("document", None, text_tokens=_content_tokens(source.get("content")))
    return Media("document", None)


def _generated_image(item: dict[str, Any]) -> Media | None:
    result = item.get("result")
    if not isinstance(result, str) or not result:
        return None  # not generated (yet): nothing but the item's JSON
    raw = b64decode(result)
    media = _image(sniff_image_type(raw) if raw is not None else None, result)
    return media


def _media_type_of(inner: Any) -> str | None:
    name = inner.get("filename") if isinstance(inner, dict) else None
    if isinstance(name, str) and name.lower().endswith(".pdf"):
        return "application/pdf"
    return None


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return estimate_tokens(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for block in content:
        media = describe(block)
        if media is not None:
            total += media.tokens
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            total += estimate_tokens(block["text"])
    return total


def is_media_block(value: Any) -> bool:
    """Whether ``value`` is a media block (any JSON value: a malformed one is not)."""
    kind = value.get("type") if isinstance(value, dict) else None
    return isinstance(kind, str) and kind in MEDIA_BLOCK_TYPES


def media_blocks(value: Any) -> Iterator[dict[str, Any]]:
    """The media blocks in a message or content value, in order: in content lists, the
    contents of tool results (anthropic) and the outputs of items (responses)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            if is_media_block(item):
                yield item
                continue
            for key in ("output", "content"):
                child = item.get(key)
                if isinstance(child, list):
                    stack.append(child)


def has_media(value: Any) -> bool:
    """Whether a message or content value carries any media block."""
    return next(media_blocks(value), None) is not None


def media_tokens(message: Any) -> int:
    """Tokens of every media block in a message (its text is counted as text elsewhere),
    or of the image a Responses ``image_generation_call`` item holds."""
    if isinstance(message, dict) and message.get("type") == GENERATED_IMAGE:
        generated = _generated_image(message)
        return 0 if generated is None else generated.tokens
    total = 0
    for block in media_blocks(message):
        media = describe(block)
        if media is not None:
            total += media.tokens
    return total


def media_markers(message: Any) -> list[str]:
    """A marker per image or document in a message (its tool results' included), or for the
    image of a Responses ``image_generation_call`` item, in order: what a text view shows
    instead of nothing or base64."""
    if isinstance(message, dict) and message.get("type") == GENERATED_IMAGE:
        generated = _generated_image(message)
        return [] if generated is None else [generated.marker()]
    return [m.marker() for m in (describe(b) for b in media_blocks(message)) if m is not None]


def shown_text(text: str, message: Any) -> str:
    """A message's text for a text view, after a marker per image or document (first, so a
    preview cut to a width keeps them)."""
    return "\n".join(part for part in (*media_markers(message), text) if part)


def without_media(value: Any) -> Any:
    """A copy of a message with every media block replaced by a text block saying what it
    was (``[image left out: image/png 1024x768]``), in the block's own dialect: no base64
    reaches a summarizer."""
    if isinstance(value, list):
        return [without_media(item) for item in value]
    if not isinstance(value, dict):
        return value
    media = describe(value)
    if media is not None and value.get("type") == GENERATED_IMAGE:
        return {**value, "result": f"[image left out: {media.label()}]"}
    if media is not None:
        text_type = "input_text" if str(value.get("type")).startswith("input_") else "text"
        return {"type": text_type, "text": f"[{media.kind} left out: {media.label()}]"}
    return {
        key: without_media(item) if key in ("content", "output") else item
        for key, item in value.items()
    }


def media_note(blocks: Any, *, tool_name: str, blob_id: int, limit: int) -> str:
    """The text that stands for a tool result with media once it is persisted: what the
    media were and the blob holding them, then the result's own text (clipped), at most
    ``limit`` characters."""
    found = [m for m in (describe(b) for b in media_blocks(blocks)) if m is not None]
    what = "; ".join(media.label() for media in found) or "media"
    header = (
        f"[Tool result media persisted: {len(found)} block{'s' if len(found) != 1 else ''} "
        f"({what}), tool {tool_name}, blob {blob_id}; the model no longer sees "
        f"{'them' if len(found) != 1 else 'it'}]"
    )
    texts = [
        block["text"]
        for block in (blocks if isinstance(blocks, list) else [])
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    ]
    text = "\n".join(t for t in texts if t)
    if len(header) >= limit:
        return header[: limit - 2] + "…]"
    room = limit - len(header) - 1
    if text and room > 1:
        clipped = text if len(text) <= room else text[: room - 1] + "…"
        return f"{header}\n{clipped}"
    return header


def user_media(message: Any) -> list[dict[str, Any]]:
    """The media blocks at the top of a user message's content (an image the user gave),
    in order; not those inside its tool results, which are the results' own."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if is_media_block(b)]


def user_media_note(blocks: Any, *, blob_id: int) -> str:
    """The text that stands for a user message's media once it is persisted."""
    found = [m for m in (describe(b) for b in media_blocks(blocks)) if m is not None]
    what = "; ".join(media.label() for media in found) or "media"
    return (
        f"[User message media persisted: {len(found)} block{'s' if len(found) != 1 else ''} "
        f"({what}), blob {blob_id}; the model no longer sees {'them' if len(found) != 1 else 'it'}]"
    )


def without_user_media(message: Any, note: str) -> dict[str, Any]:
    """A copy of a user message whose top-level media blocks are gone, the first replaced
    by a text block holding ``note`` (in the block's dialect); its text stays as it was."""
    content: list[Any] = []
    noted = False
    for block in message["content"]:
        if is_media_block(block):
            if not noted:
                text_type = "input_text" if str(block.get("type")).startswith("input_") else "text"
                content.append({"type": text_type, "text": note})
                noted = True
            continue
        content.append(block)
    copy: dict[str, Any] = thaw({**message, "content": content})
    return copy


def _media_json(content: str) -> list[Any] | None:
    """The blocks of a blob that holds a result with media (the JSON of its blocks)."""
    if not content.startswith("["):
        return None
    try:
        blocks = json.loads(content)
    except ValueError:
        return None
    return blocks if isinstance(blocks, list) and has_media(blocks) else None


def blob_text(content: str) -> str:
    """A blob as text a model can read: for a result with media, its text blocks and a
    line per image or document (``[image: image/png 1000x800; not shown as text]``);
    any other blob as it is."""
    blocks = _media_json(content)
    if blocks is None:
        return content
    lines: list[str] = []
    for block in blocks:
        media = describe(block)
        if media is not None:
            lines.append(f"[{media.kind}: {media.label()}; not shown as text]")
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            lines.append(block["text"])
    return "\n".join(lines)


def decoded_single_media(content: str) -> tuple[str, bytes] | None:
    """(media type, bytes) when a blob's content is the JSON of exactly one media block
    with inline base64 data (one image, or one PDF); None for anything else."""
    blocks = _media_json(content)
    if blocks is None or len(blocks) != 1:
        return None
    block = blocks[0]
    kind = block.get("type")
    media_type: str | None
    data: str | None
    if kind in ("image", "document"):
        source = block.get("source")
        if not isinstance(source, dict) or source.get("type") != "base64":
            return None
        media_type, data = source.get("media_type"), source.get("data")
    elif kind == "input_image":
        media_type, data = _inline(block.get("image_url"))
    elif kind == "image_url":
        url = block.get("image_url")
        media_type, data = _inline(url.get("url") if isinstance(url, dict) else None)
    else:
        inner = block.get("file") if kind == "file" else block
        media_type, data = _inline(inner.get("file_data") if isinstance(inner, dict) else None)
        media_type = media_type or _media_type_of(inner)
    if not isinstance(data, str) or not isinstance(media_type, str):
        return None
    raw = b64decode(data)
    return None if raw is None else (media_type, raw)
