"""Small real documents (PDFs written by pypdf, UTF-8 text) and their data URLs and parts."""

from __future__ import annotations

import base64
import io
from typing import Any

from pypdf import PdfWriter


def pdf(pages: int = 1) -> bytes:
    """A valid PDF of `pages` blank Letter pages."""
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 792)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypted_pdf() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(612, 792)
    writer.encrypt("secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def document_url(media_type: str, raw: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


def document(media_type: str, raw: bytes, filename: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "document", "url": document_url(media_type, raw)}
    return part if filename is None else {**part, "filename": filename}


PDF_PART = document("application/pdf", pdf(2), "report.pdf")
TEXT_PART = document("text/plain", b"Quarterly notes: revenue up 4%.", "notes.txt")
