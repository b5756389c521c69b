"""Structured output: the JSON Schema an answer must follow, OpenAI's strict-mode rules for it,
its fingerprint, and the check of an answer against it. Pure (jsonschema-rs computes; the
rules refuse every reference it could fetch).

An ask names its format as OpenAI's chat completions do:
`{"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`. The schema is
checked before the ask is accepted (`schema_problem`, a JSON pointer to what is wrong), with
the rules OpenAI applies in strict mode, so that every provider can be held to it: the root is
an object; every object says `additionalProperties: false` and requires all its properties;
only the keywords below; nesting, size and enum limits; `$ref` only to `#` or `#/$defs/<name>`,
recursion only through an object or an array (a chain of references and anyOf that comes back
to itself describes no value).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import jsonschema_rs
from pydantic import BaseModel, ConfigDict, Field

# OpenAI's documented limits for strict schemas.
MAX_NESTING = 10  # objects and arrays inside one another
MAX_PROPERTIES = 5000
MAX_NAME_AND_VALUE_CHARS = 120_000  # property and definition names, enum and const strings
MAX_ENUM_VALUES = 1000
LARGE_ENUM = 250  # one enum with more values than this ...
LARGE_ENUM_CHARS = 15_000  # ... holds at most this many characters of strings
# Ours: schemas inside one another however they are nested (anyOf, $defs), and in all.
MAX_DEPTH = 64
MAX_SUBSCHEMAS = 10_000

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
# Keywords a strict schema may hold, by what they apply to.
_ANY = frozenset({"type", "description", "title", "enum", "const", "anyOf", "$ref"})
_OBJECT = frozenset({"properties", "required", "additionalProperties"})
_ARRAY = frozenset({"items", "minItems", "maxItems"})
_STRING = frozenset({"pattern", "format"})
_NUMBER = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
KEYWORDS = _ANY | _OBJECT | _ARRAY | _STRING | _NUMBER | {"$defs"}
_BESIDE_REF = frozenset({"$ref", "description", "title"})


class JsonSchemaSpec(BaseModel):
    """A named JSON Schema the answer must follow."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = Field(
        description="The format's name (letters, digits, _ and -; up to 64)."
    )
    description: Annotated[str, Field(max_length=10_000)] | None = Field(
        default=None, description="What the answer is, for the model."
    )
    schema_: dict[str, Any] = Field(
        alias="schema",
        description="A JSON Schema under OpenAI's strict-mode rules: an object at the root, "
        "additionalProperties false and every property required in each object.",
    )
    strict: Literal[True] = Field(
        default=True, description="Always true: answers are held to the schema."
    )


class ResponseFormat(BaseModel):
    """`{"type": "json_schema", "json_schema": {name, schema, strict}}`: the answer is JSON that
    follows the schema."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec

    @property
    def name(self) -> str:
        return self.json_schema.name

    @property
    def schema_(self) -> dict[str, Any]:
        return self.json_schema.schema_

    def as_json(self) -> dict[str, Any]:
        """The stored and sent form (what `ResponseFormat.model_validate` reads back)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def mark(self) -> dict[str, str]:
        """What an answer written to this format carries: its name and schema's fingerprint."""
        return {"name": self.name, "schema_sha256": fingerprint(self.schema_)}


def fingerprint(schema: Mapping[str, Any]) -> str:
    """The sha256 of the schema's canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class SchemaProblem:
    pointer: str  # JSON pointer into the schema ("" is its root)
    message: str


class _Refused(Exception):
    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(message)
        self.problem = SchemaProblem(pointer, message)


def schema_problem(schema: Any) -> SchemaProblem | None:
    """What makes `schema` unfit for strict structured output (the first thing found), None
    if nothing."""
    try:
        _Walk(schema).check()
    except _Refused as refused:
        return refused.problem
    try:
        jsonschema_rs.Draft202012Validator(schema)
    except jsonschema_rs.ValidationError as error:  # e.g. a pattern that is no regex
        where = _pointer(list(error.instance_path))
        return SchemaProblem(where, f"not a valid JSON Schema: {error.message}")
    return None


def answer_problem(schema: Mapping[str, Any], text: str) -> str | None:
    """Why `text` is not an answer that follows `schema` (one checked by schema_problem),
    None if it is one."""
    try:
        value = json.loads(text)
    except ValueError as error:
        return f"the answer is not JSON: {error}"
    validator = jsonschema_rs.Draft202012Validator(dict(schema))
    found = next(iter(validator.iter_errors(value)), None)
    if found is None:
        return None
    return f"at {_pointer(list(found.instance_path)) or '/'}: {found.message}"


def _pointer(parts: list[str | int]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _child(pointer: str, *parts: str | int) -> str:
    return pointer + _pointer(list(parts))


class _Walk:
    """One pass over a schema, counting what the limits count."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.defs: dict[str, Any] = {}
        self.properties = 0
        self.chars = 0
        self.enum_values = 0
        self.subschemas = 0

    def check(self) -> None:
        root = self.schema
        if not isinstance(root, dict):
            raise _Refused("", "the schema must be a JSON object")
        if root.get("type") != "object" or "anyOf" in root or "$ref" in root:
            raise _Refused("", 'the root must be {"type": "object", ...} (not anyOf, not $ref)')
        defs = root.get("$defs", {})
        if not isinstance(defs, dict):
            raise _Refused("/$defs", "$defs must be an object of schemas")
        self.defs = defs
        for name, sub in defs.items():
            self._count_chars(name, _child("/$defs", name))
            self._node(sub, _child("/$defs", name), nesting=0, depth=1)
        self._node(root, "", nesting=0, depth=0)
        self._no_reference_loop()

    def _count_chars(self, text: str, pointer: str) -> None:
        self.chars += len(text)
        if self.chars > MAX_NAME_AND_VALUE_CHARS:
            raise _Refused(
                pointer,
                f"property and definition names, enum and const strings exceed "
                f"{MAX_NAME_AND_VALUE_CHARS} characters in all",
            )

    def _node(self, node: Any, pointer: str, nesting: int, depth: int) -> None:
        self.subschemas += 1
        if self.subschemas > MAX_SUBSCHEMAS:
            raise _Refused(pointer, f"the schema holds more than {MAX_SUBSCHEMAS} schemas")
        if depth > MAX_DEPTH:
            raise _Refused(pointer, f"schemas nested more than {MAX_DEPTH} deep")
        if not isinstance(node, dict):
            raise _Refused(pointer, "a schema must be a JSON object")
        for key in node:
            if key not in KEYWORDS:
                raise _Refused(_child(pointer, key), f"{key!r} is not supported in strict mode")
        if "$defs" in node and pointer != "":
            raise _Refused(_child(pointer, "$defs"), "$defs is allowed at the root only")
        if "$ref" in node:
            self._ref(node, pointer)
            return
        if "anyOf" in node:
            self._any_of(node, pointer, nesting, depth)
            return
        types = self._types(node, pointer)
        self._values(node, pointer)
        if "object" in types:
            self._object(node, pointer, nesting + 1, depth)
        elif _OBJECT & node.keys():
            key = sorted(_OBJECT & node.keys())[0]
            raise _Refused(_child(pointer, key), f"{key} applies to objects only")
        if "array" in types:
            self._array(node, pointer, nesting + 1, depth)
        elif _ARRAY & node.keys():
            key = sorted(_ARRAY & node.keys())[0]
            raise _Refused(_child(pointer, key), f"{key} applies to arrays only")
        self._scalars(node, pointer, types)

    def _ref(self, node: dict[str, Any], pointer: str) -> None:
        extra = sorted(node.keys() - _BESIDE_REF)
        if extra:
            raise _Refused(_child(pointer, extra[0]), "$ref takes only description and title")
        target = node["$ref"]
        if target == "#":
            return
        if not isinstance(target, str) or not target.startswith("#/$defs/"):
            raise _Refused(
                _child(pointer, "$ref"), '$ref must be "#" or "#/$defs/<name>" (no other document)'
            )
        if target.removeprefix("#/$defs/") not in self.defs:
            raise _Refused(_child(pointer, "$ref"), f"$ref {target!r}: no such definition")

    def _any_of(self, node: dict[str, Any], pointer: str, nesting: int, depth: int) -> None:
        extra = sorted(node.keys() - {"anyOf", "description", "title"})
        if extra:
            raise _Refused(_child(pointer, extra[0]), "anyOf takes only description and title")
        options = node["anyOf"]
        if not isinstance(options, list) or not options:
            raise _Refused(_child(pointer, "anyOf"), "anyOf must be a non-empty list of schemas")
        for i, option in enumerate(options):
            self._node(option, _child(pointer, "anyOf", i), nesting, depth + 1)

    def _types(self, node: dict[str, Any], pointer: str) -> set[str]:
        given = node.get("type")
        if given is None:
            if "enum" in node or "const" in node:
                return set()
            raise _Refused(pointer, "every schema needs a type (or enum, const, anyOf, $ref)")
        listed = given if isinstance(given, list) else [given]
        if not listed or any(not isinstance(t, str) or t not in TYPES for t in listed):
            raise _Refused(
                _child(pointer, "type"), f"type must be one of {sorted(TYPES)} or a list of them"
            )
        if len(set(listed)) != len(listed):
            raise _Refused(_child(pointer, "type"), "type lists a type twice")
        return set(listed)

    def _values(self, node: dict[str, Any], pointer: str) -> None:
        if "enum" in node:
            values = node["enum"]
            where = _child(pointer, "enum")
            if not isinstance(values, list) or not values:
                raise _Refused(where, "enum must be a non-empty list")
            if any(isinstance(v, dict | list) for v in values):
                raise _Refused(where, "enum values must be strings, numbers, booleans or null")
            self.enum_values += len(values)
            if self.enum_values > MAX_ENUM_VALUES:
                raise _Refused(where, f"more than {MAX_ENUM_VALUES} enum values in all")
            texts = [v for v in values if isinstance(v, str)]
            if len(values) > LARGE_ENUM and sum(map(len, texts)) > LARGE_ENUM_CHARS:
                raise _Refused(
                    where,
                    f"an enum of more than {LARGE_ENUM} values holds at most "
                    f"{LARGE_ENUM_CHARS} characters",
                )
            for text in texts:
                self._count_chars(text, where)
        if "const" in node:
            value = node["const"]
            if isinstance(value, dict | list):
                raise _Refused(_child(pointer, "const"), "const must be a scalar")
            if isinstance(value, str):
                self._count_chars(value, _child(pointer, "const"))
        for key in ("description", "title"):
            if key in node and not isinstance(node[key], str):
                raise _Refused(_child(pointer, key), f"{key} must be a string")

    def _object(self, node: dict[str, Any], pointer: str, nesting: int, depth: int) -> None:
        if nesting > MAX_NESTING:
            raise _Refused(pointer, f"objects and arrays nested more than {MAX_NESTING} deep")
        if node.get("additionalProperties") is not False:
            raise _Refused(
                _child(pointer, "additionalProperties"),
                "every object must set additionalProperties: false",
            )
        properties = node.get("properties", {})
        if not isinstance(properties, dict):
            raise _Refused(_child(pointer, "properties"), "properties must be an object")
        required = node.get("required", [])
        if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
            raise _Refused(_child(pointer, "required"), "required must be a list of names")
        missing = [name for name in properties if name not in required]
        if missing:
            raise _Refused(
                _child(pointer, "required"),
                f"every property must be required; {missing[0]!r} is not "
                '(make it optional with "type": [..., "null"])',
            )
        if len(set(required)) != len(required) or set(required) - properties.keys():
            raise _Refused(
                _child(pointer, "required"), "required must list each property once, no other"
            )
        self.properties += len(properties)
        if self.properties > MAX_PROPERTIES:
            raise _Refused(
                _child(pointer, "properties"), f"more than {MAX_PROPERTIES} properties in all"
            )
        for name, sub in properties.items():
            where = _child(pointer, "properties", name)
            self._count_chars(name, where)
            self._node(sub, where, nesting, depth + 1)

    def _array(self, node: dict[str, Any], pointer: str, nesting: int, depth: int) -> None:
        if nesting > MAX_NESTING:
            raise _Refused(pointer, f"objects and arrays nested more than {MAX_NESTING} deep")
        if "items" not in node:
            raise _Refused(pointer, "an array must say its items' schema")
        for key in ("minItems", "maxItems"):
            if key in node and not _count(node[key]):
                raise _Refused(_child(pointer, key), f"{key} must be a non-negative integer")
        self._node(node["items"], _child(pointer, "items"), nesting, depth + 1)

    def _scalars(self, node: dict[str, Any], pointer: str, types: set[str]) -> None:
        if _STRING & node.keys() and types and "string" not in types:
            raise _Refused(pointer, "pattern and format apply to strings only")
        if "pattern" in node and not isinstance(node["pattern"], str):
            raise _Refused(_child(pointer, "pattern"), "pattern must be a string")
        if "format" in node and node["format"] not in STRING_FORMATS:
            raise _Refused(
                _child(pointer, "format"), f"format must be one of {sorted(STRING_FORMATS)}"
            )
        numeric = _NUMBER & node.keys()
        if numeric and types and not types & {"number", "integer"}:
            raise _Refused(pointer, f"{sorted(numeric)[0]} applies to numbers only")
        for key in sorted(numeric):
            value = node[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _Refused(_child(pointer, key), f"{key} must be a number")
            if key == "multipleOf" and value <= 0:
                raise _Refused(_child(pointer, key), "multipleOf must be above 0")

    def _no_reference_loop(self) -> None:
        """A definition that reaches itself through $ref and anyOf alone, with no object or
        array on the way, describes no value."""
        for name in self.defs:
            seen: set[str] = set()
            todo = list(_passed_through(self.defs[name]))
            while todo:
                target = todo.pop()
                if target == name:
                    raise _Refused(
                        _child("/$defs", name), f"$defs/{name} refers to itself with no value"
                    )
                if target not in seen and target in self.defs:
                    seen.add(target)
                    todo.extend(_passed_through(self.defs[target]))


def _passed_through(node: Any) -> Iterator[str]:
    """The definitions a schema stands for without an object or array around them."""
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        yield ref.removeprefix("#/$defs/")
    for option in node.get("anyOf", []) if isinstance(node.get("anyOf"), list) else []:
        yield from _passed_through(option)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
