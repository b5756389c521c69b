"""Small real images built byte by byte (PNG, GIF, JPEG, WebP headers) and their data URLs."""

from __future__ import annotations

import base64
import struct
import zlib


def png(width: int = 1, height: int = 1) -> bytes:
    """A valid greyscale PNG (one IDAT of zero rows); header-only is enough above ~4k px."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (width + 1) * min(height, 64))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


def gif(width: int = 1, height: int = 1) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00;"


def jpeg(width: int = 1, height: int = 1) -> bytes:
    """SOI, an APP0 segment, then a baseline SOF0 frame header naming the size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def webp(width: int = 1, height: int = 1) -> bytes:
    """An extended (VP8X) WebP header."""
    body = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little")
    body += (height - 1).to_bytes(3, "little")
    chunk = b"VP8X" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def data_url(media_type: str, raw: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


PNG_URL = data_url("image/png", png())
