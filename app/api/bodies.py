"""JSON request bodies hold Unicode text: a lone surrogate is refused where the body is parsed.

JSON may escape any UTF-16 code unit, so `"\\ud800"` is valid JSON that decodes to a string no
UTF-8 can encode: Postgres cannot store it, tokenizers and provider SDKs cannot send it. Typed
fields would refuse it one way, free-form JSON (tool outputs, tool results) another, and the
first code to encode it a third (a 500). Every route of the API uses `JSONRoute`, whose body
parser refuses such a body at once with 422 `invalid_unicode` naming where the surrogate is:
before authentication, like malformed JSON, and before anything is read or written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

# A JSON escape of a surrogate code unit (U+D800..U+DFFF). The decoder pairs a high and a low
# one into one character, so a body without such an escape never holds a lone surrogate (raw
# surrogate bytes are invalid UTF-8, which the decoder refuses as malformed JSON already).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class InvalidUnicode(HTTPException):
    """A body holding a lone surrogate; `loc` is its path, as in validation errors."""

    def __init__(self, loc: list[str | int], character: str, index: int) -> None:
        # A key on the path may be the culprit: it is shown escaped (a backslash, "ud800").
        self.loc = [
            p.encode("utf-8", "backslashreplace").decode() if isinstance(p, str) else p for p in loc
        ]
        where = ".".join(str(p) for p in self.loc)
        self.reason = (
            f"text must be valid Unicode: it holds a lone surrogate (U+{ord(character):04X}) "
            f"at character {index}"
        )
        super().__init__(422, f"invalid request at {where}: {self.reason}")


def lone_surrogate(value: Any) -> tuple[list[str | int], str, int] | None:
    """Where the first lone surrogate in decoded JSON is: (path, the surrogate, its index in
    the string), the path ending at the key when it is in a key; None when there is none."""
    todo: list[tuple[list[str | int], Any]] = [([], value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return path, item[exc.start], exc.start
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                todo.append(([*path, key], child))
                todo.append(([*path, key], key))  # a key is checked before its value
        elif isinstance(item, list):
            todo.extend(([*path, i], child) for i, child in reversed(list(enumerate(item))))
    return None


class _CheckedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            data = await super().json()
            if _SURROGATE_ESCAPE.search(body) and (found := lone_surrogate(data)) is not None:
                path, character, index = found
                raise InvalidUnicode(["body", *path], character, index)
        return self._json


class JSONRoute(APIRoute):
    """An API route whose JSON body is refused (422 invalid_unicode) when it holds text that
    is not Unicode."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            return await handler(_CheckedRequest(request.scope, request.receive))

        return checked
